//! What this machine's kernel offers the native sandbox, asked the way the sandbox itself asks, so
//! `metash doctor` reports what a spawn would really get (not what a config file claims).

use serde::Serialize;

/// Which cgroup hierarchy the quotas would use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Cgroups {
    /// The unified hierarchy (`/sys/fs/cgroup/cgroup.controllers`).
    V2,
    /// Per-controller hierarchies (`/sys/fs/cgroup/memory`, `pids`, `cpu`).
    V1,
    None,
}

/// The kernel features the native sandbox builds on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostSupport {
    /// 0 without Landlock; the sandbox needs 4 or more (TCP port rules).
    pub landlock_abi: i64,
    /// `Ok` when the exec gate (seccomp user notification) can run; the reason otherwise.
    pub seccomp_user_notif: Result<(), String>,
    pub cgroups: Cgroups,
    /// Whether this process may write there (create per-agent groups with quotas).
    pub cgroups_writable: bool,
    /// Whether a child can make a user namespace with its own mount namespace (what masking
    /// metash's state directory needs when metash does not run as root).
    pub user_namespaces: Result<(), String>,
}

/// Asks the kernel. Cheap (one short-lived child for the namespace check). Off Linux, says that
/// none of it is there.
#[cfg(not(target_os = "linux"))]
pub fn probe() -> HostSupport {
    let no = || Err(format!("not available on {}", std::env::consts::OS));
    HostSupport {
        landlock_abi: 0,
        seccomp_user_notif: no(),
        cgroups: Cgroups::None,
        cgroups_writable: false,
        user_namespaces: no(),
    }
}

/// Asks the kernel. Cheap (one short-lived child for the namespace check).
#[cfg(target_os = "linux")]
pub fn probe() -> HostSupport {
    let (cgroups, root) = if std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
        (Cgroups::V2, "/sys/fs/cgroup")
    } else if std::path::Path::new("/sys/fs/cgroup/memory").is_dir() {
        (Cgroups::V1, "/sys/fs/cgroup/memory")
    } else {
        (Cgroups::None, "/sys/fs/cgroup")
    };
    HostSupport {
        landlock_abi: super::privs::landlock_abi(),
        seccomp_user_notif: super::exec_gate::available(),
        cgroups,
        cgroups_writable: cgroups != Cgroups::None && writable(root),
        user_namespaces: user_namespaces(),
    }
}

#[cfg(target_os = "linux")]
fn writable(dir: &str) -> bool {
    let Ok(c) = std::ffi::CString::new(dir) else {
        return false;
    };
    // SAFETY: access(2) reads the NUL-terminated path only.
    unsafe { libc::access(c.as_ptr(), libc::W_OK) == 0 }
}

/// Starts `/bin/true` in a new user and mount namespace: the spawn fails if the kernel (or a
/// sysctl such as `kernel.unprivileged_userns_clone=0`) refuses.
#[cfg(target_os = "linux")]
pub(crate) fn user_namespaces() -> Result<(), String> {
    use std::os::unix::process::CommandExt;
    use std::process::{Command, Stdio};
    let mut cmd = Command::new("/bin/true");
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: unshare(2) is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            if libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    match cmd.status() {
        Ok(s) if s.success() => Ok(()),
        Ok(s) => Err(format!("the probe exited with {s}")),
        Err(e) => Err(format!("unshare(CLONE_NEWUSER|CLONE_NEWNS): {e}")),
    }
}
