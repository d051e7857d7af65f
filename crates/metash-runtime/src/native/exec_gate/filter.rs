//! The notify filter: a classic-BPF program that hands the exec syscalls to the supervisor and
//! allows everything else (the EPERM filter decides those), and the check that this kernel can
//! run it.

use std::io;

const BPF_LD_W_ABS: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
const BPF_JEQ_K: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
const BPF_RET_K: u16 = (libc::BPF_RET | libc::BPF_K) as u16;
/// Offsets in `struct seccomp_data`.
const NR_OFFSET: u32 = 0;
const ARCH_OFFSET: u32 = 4;

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 62 | 0x8000_0000 | 0x4000_0000;
/// `execve`, `execveat`, and their x32 numbers (the x32 ABI shares the x86_64 audit arch, so a
/// filter that only knew the native numbers could be walked around where x32 is enabled).
#[cfg(target_arch = "x86_64")]
pub(super) const EXEC_NRS: &[u32] = &[
    libc::SYS_execve as u32,
    libc::SYS_execveat as u32,
    0x4000_0000 | 520,
    0x4000_0000 | 545,
];
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 183 | 0x8000_0000 | 0x4000_0000;
#[cfg(target_arch = "aarch64")]
pub(super) const EXEC_NRS: &[u32] = &[libc::SYS_execve as u32, libc::SYS_execveat as u32];

/// `execveat` in the x32 ABI (its `execve` needs no special case: both take the path first).
#[cfg(target_arch = "x86_64")]
pub(super) const EXECVEAT_X32: i64 = 0x4000_0000 | 545;
#[cfg(not(target_arch = "x86_64"))]
pub(super) const EXECVEAT_X32: i64 = -1;

fn stmt(code: u16, k: u32) -> libc::sock_filter {
    libc::sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

/// The notify filter: kill on a foreign architecture (as the EPERM filter does), notify on the
/// exec syscalls, allow everything else (the EPERM filter decides those).
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
pub(super) fn notify_program() -> Vec<libc::sock_filter> {
    let n = EXEC_NRS.len();
    let mut p = vec![
        stmt(BPF_LD_W_ABS, ARCH_OFFSET),
        libc::sock_filter {
            code: BPF_JEQ_K,
            jt: 1,
            jf: 0,
            k: AUDIT_ARCH,
        },
        stmt(BPF_RET_K, libc::SECCOMP_RET_KILL_PROCESS),
        stmt(BPF_LD_W_ABS, NR_OFFSET),
    ];
    for (i, &nr) in EXEC_NRS.iter().enumerate() {
        // Jump over the remaining comparisons and the ALLOW to the USER_NOTIF return.
        p.push(libc::sock_filter {
            code: BPF_JEQ_K,
            jt: (n - i) as u8,
            jf: 0,
            k: nr,
        });
    }
    p.push(stmt(BPF_RET_K, libc::SECCOMP_RET_ALLOW));
    p.push(stmt(BPF_RET_K, libc::SECCOMP_RET_USER_NOTIF));
    p
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
pub(super) fn notify_program() -> Vec<libc::sock_filter> {
    Vec::new()
}

/// `(major, minor)` of the running kernel.
fn kernel_version() -> Option<(u32, u32)> {
    // SAFETY: uname fills a zeroed, caller-owned struct.
    let mut uts: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: `uts` is a valid, writable utsname.
    if unsafe { libc::uname(&mut uts) } != 0 {
        return None;
    }
    let release: String = uts
        .release
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8 as char)
        .collect();
    let mut it = release.split(|c: char| !c.is_ascii_digit());
    let major = it.next()?.parse().ok()?;
    let minor = it.next()?.parse().ok()?;
    Some((major, minor))
}

/// Whether this machine can gate execs: seccomp user notification (Linux 5.0) with
/// `SECCOMP_USER_NOTIF_FLAG_CONTINUE` (5.5), on x86_64 or aarch64. The error says what is missing;
/// the tests print it when they skip.
///
/// # Errors
/// The missing feature.
pub fn available() -> std::result::Result<(), String> {
    if notify_program().is_empty() {
        return Err(format!(
            "no exec filter for architecture {}",
            std::env::consts::ARCH
        ));
    }
    let action: u32 = libc::SECCOMP_RET_USER_NOTIF;
    // SAFETY: SECCOMP_GET_ACTION_AVAIL only reads the u32 it is given.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_GET_ACTION_AVAIL,
            0u32,
            &action as *const u32,
        )
    };
    if rc != 0 {
        return Err(format!(
            "the kernel has no seccomp user notification (SECCOMP_RET_USER_NOTIF, Linux 5.0+): {}",
            io::Error::last_os_error()
        ));
    }
    match kernel_version() {
        Some(v) if v >= (5, 5) => Ok(()),
        Some((a, b)) => Err(format!(
            "Linux {a}.{b} has no SECCOMP_USER_NOTIF_FLAG_CONTINUE (5.5+)"
        )),
        None => Err("cannot read the kernel version (uname)".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Run the classic-BPF subset the notify filter uses on one `seccomp_data`.
    fn eval(prog: &[libc::sock_filter], nr: u32, arch: u32) -> u32 {
        let (mut acc, mut pc) = (0u32, 0usize);
        loop {
            let ins = prog[pc];
            pc += 1;
            match ins.code {
                BPF_LD_W_ABS => acc = if ins.k == ARCH_OFFSET { arch } else { nr },
                BPF_JEQ_K => {
                    pc += if acc == ins.k {
                        ins.jt as usize
                    } else {
                        ins.jf as usize
                    }
                }
                BPF_RET_K => return ins.k,
                other => panic!("unexpected opcode {other:#x}"),
            }
        }
    }

    #[test]
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    fn notify_filter_traps_exec_only() {
        let p = notify_program();
        for &nr in EXEC_NRS {
            assert_eq!(eval(&p, nr, AUDIT_ARCH), libc::SECCOMP_RET_USER_NOTIF);
        }
        for nr in [
            libc::SYS_read,
            libc::SYS_openat,
            libc::SYS_clone,
            libc::SYS_exit,
        ] {
            assert_eq!(eval(&p, nr as u32, AUDIT_ARCH), libc::SECCOMP_RET_ALLOW);
        }
        assert_eq!(
            eval(&p, libc::SYS_execve as u32, 0x4000_0003),
            libc::SECCOMP_RET_KILL_PROCESS
        );
    }
}
