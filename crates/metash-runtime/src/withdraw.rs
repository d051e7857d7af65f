//! Taking a file grant back from an agent while it runs (seed 002 §2: consent is revocable at any
//! time, and a revocation takes effect on the next use). The host calls [`Withdrawer::withdraw`]
//! with each capability that ended; how the path is taken away is in
//! [`crate::native::mountns`]. Only Linux has the mount namespaces this needs: elsewhere no
//! agent has a withdrawer, and the host says so in the log.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::Result;
#[cfg(target_os = "linux")]
use crate::spec::AgentSpec;
use crate::spec::{Category, PathAccess};

#[cfg(target_os = "linux")]
pub use crate::native::mountns::Withdraw;

/// What a withdrawal takes away (off Linux, for the API only).
#[cfg(not(target_os = "linux"))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Withdraw {
    Write,
    All,
}

/// Where the agent's granted paths are mounted.
#[derive(Debug, Clone)]
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
enum View {
    /// A native agent sees the host's paths.
    Native,
    /// A WASM agent's paths are bound under the holder's root at their guest paths.
    Wasm { root: PathBuf },
}

/// Takes file grants back from one running agent. Cheap to clone; valid while the agent runs.
#[derive(Clone)]
pub struct Withdrawer {
    #[cfg(target_os = "linux")]
    ns: Arc<crate::native::mountns::MountNs>,
    #[cfg(not(target_os = "linux"))]
    _ns: Arc<()>,
    view: View,
    workspace: PathBuf,
    paths: Vec<PathAccess>,
    /// Whether the whole workspace is granted (a scope inside it can be withdrawn too).
    whole_workspace: bool,
}

impl std::fmt::Debug for Withdrawer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Withdrawer")
            .field("view", &self.view)
            .finish()
    }
}

impl Withdrawer {
    #[cfg(target_os = "linux")]
    pub(crate) fn native(ns: Arc<crate::native::mountns::MountNs>, spec: &AgentSpec) -> Self {
        Self {
            ns,
            view: View::Native,
            workspace: absolute(&spec.workspace),
            paths: spec.paths.clone(),
            whole_workspace: spec.has(Category::FilesRead) || spec.has(Category::FilesWrite),
        }
    }

    #[cfg(target_os = "linux")]
    pub(crate) fn wasm(
        ns: Arc<crate::native::mountns::MountNs>,
        root: &Path,
        spec: &AgentSpec,
    ) -> Self {
        Self {
            ns,
            view: View::Wasm {
                root: root.to_path_buf(),
            },
            workspace: absolute(&spec.workspace),
            paths: spec.paths.clone(),
            whole_workspace: spec.has(Category::FilesRead) || spec.has(Category::FilesWrite),
        }
    }

    /// Takes back what `capability` gave when it gave files (`files.write` → the workspace
    /// becomes read-only; `files.read` → it becomes unreadable; `files.read:src` → `src` does):
    /// the path as the host names it. `None` when the capability gave no path this agent holds.
    ///
    /// # Errors
    /// [`crate::RuntimeError::Withdrawal`]: the kernel refused a mount step (named).
    pub fn withdraw(&self, capability: &str) -> Option<Result<PathBuf>> {
        let (path, what, own_mount) = withdrawal(
            &self.workspace,
            &self.paths,
            self.whole_workspace,
            capability,
        )?;
        let at = match &self.view {
            View::Native => path.clone(),
            View::Wasm { root } => root.join(self.guest_path(&path).trim_start_matches('/')),
        };
        // The mount steps say "sandbox setup"; here the agent runs already.
        let applied = self
            .apply(&at, &path, what, own_mount)
            .map_err(|e| match e {
                crate::RuntimeError::SandboxSetup(why) => crate::RuntimeError::Withdrawal(why),
                other => other,
            });
        Some(applied.map(|()| path))
    }

    fn guest_path(&self, path: &Path) -> String {
        PathAccess {
            path: path.to_path_buf(),
            write: false,
        }
        .guest_path(&self.workspace, crate::wasm::GUEST_WORKSPACE)
    }

    #[cfg(target_os = "linux")]
    fn apply(&self, at: &Path, source: &Path, what: Withdraw, own_mount: bool) -> Result<()> {
        self.ns.withdraw(at, source, what, own_mount)
    }

    #[cfg(not(target_os = "linux"))]
    fn apply(&self, _at: &Path, _source: &Path, _what: Withdraw, _own: bool) -> Result<()> {
        Err(crate::RuntimeError::SandboxSetup(
            "withdrawing a path needs Linux mount namespaces".into(),
        ))
    }
}

/// `p` absolute, so a withdrawal names the same place however the spec named it (a relative
/// workspace would be resolved against the withdrawal process's directory, not the agent's).
#[cfg(target_os = "linux")]
fn absolute(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}

/// The path `capability` gave, what ending it takes away, and whether the path is a mount of its
/// own (a scoped grant, or the workspace); `None` for a capability that gave no path (network,
/// memory…) or a scope the agent cannot reach. A scope inside a granted workspace (a narrow
/// revocation under a broad grant) is withdrawn where it lies.
fn withdrawal(
    workspace: &Path,
    paths: &[PathAccess],
    whole_workspace: bool,
    capability: &str,
) -> Option<(PathBuf, Withdraw, bool)> {
    let (category, scope) = match capability.split_once(':') {
        Some((c, s)) => (c, Some(s)),
        None => (capability, None),
    };
    let what = if category == Category::FilesWrite.as_str() {
        Withdraw::Write
    } else if category == Category::FilesRead.as_str() {
        Withdraw::All
    } else {
        return None;
    };
    let Some(scope) = scope else {
        return whole_workspace.then(|| (workspace.to_path_buf(), what, true));
    };
    let p = Path::new(scope);
    let path = if p.is_absolute() {
        p.to_path_buf()
    } else {
        workspace.join(p)
    };
    if paths.iter().any(|a| a.path == path) {
        return Some((path, what, true));
    }
    (whole_workspace && path.starts_with(workspace) && path.exists()).then_some((path, what, false))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capabilities_map_to_the_paths_they_gave() {
        let ws = Path::new("/w");
        let paths = vec![
            PathAccess {
                path: "/w/src".into(),
                write: false,
            },
            PathAccess {
                path: "/tmp/out".into(),
                write: true,
            },
        ];
        let w = |c: &str| withdrawal(ws, &paths, true, c);
        assert_eq!(w("files.write"), Some(("/w".into(), Withdraw::Write, true)));
        assert_eq!(w("files.read"), Some(("/w".into(), Withdraw::All, true)));
        assert_eq!(
            w("files.read:src"),
            Some(("/w/src".into(), Withdraw::All, true))
        );
        assert_eq!(
            w("files.write:/tmp/out"),
            Some(("/tmp/out".into(), Withdraw::Write, true))
        );
        assert_eq!(w("files.read:docs"), None, "not there");
        assert_eq!(w("files.read:/etc"), None, "outside, and not given");
        assert_eq!(w("network"), None);
        assert_eq!(w("memory"), None);
        let scoped_only = |c: &str| withdrawal(ws, &paths, false, c);
        assert_eq!(scoped_only("files.read"), None, "no workspace grant");
    }
}
