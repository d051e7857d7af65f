//! A WASM agent's files, made revocable (seed 002 §2). wasmtime-wasi opens a preopen once and
//! resolves every guest path beneath that descriptor, so nothing can be taken out of the
//! directory it names. So on Linux each grant is first bound, at its guest path (`/workspace`,
//! `/workspace/src`, `/tmp/out`), under an empty directory in a mount namespace metash holds (see
//! [`crate::native::mountns`]), read-only unless the grant writes, and the preopen is that bind.
//! A revocation makes the bind read-only (which the open descriptor feels too) or covers every
//! entry in it, and the guest's next open finds that. The guest sees the same preopens, in the
//! same order, as without the view. The host's state inside a grant (`.meta/`) is covered by an
//! empty read-only mount there, and the project's `.git` inside a writable grant is bound on
//! itself read-only, so a WASM agent can be given a project root as a native one can.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Result, RuntimeError};
use crate::native::mountns::{Bind, Holder};
use crate::spec::{AgentSpec, Category, PathAccess};

use super::GUEST_WORKSPACE;

static NONCE: AtomicU64 = AtomicU64::new(0);

/// The holder and its directory, removed on drop (it holds only empty mount points).
#[derive(Debug)]
pub struct View {
    pub holder: Holder,
    /// The guest paths kept read-only (`/workspace/.git`), for the start report.
    pub protected: Vec<PathBuf>,
}

impl View {
    /// The view of `spec`'s file grants; `None` when it has none or mount namespaces are not
    /// available here (then the grants are preopened one by one and cannot be withdrawn mid-run;
    /// the start report says which).
    ///
    /// # Errors
    /// A namespace or mount step refused, named.
    pub fn create(spec: &AgentSpec) -> Result<Option<Self>> {
        if !spec.has_files() || !crate::native::mountns::available() {
            return Ok(None);
        }
        let mut binds = Vec::new();
        let root = std::env::temp_dir().join(format!(
            "metash-wasm-view-{}-{}",
            std::process::id(),
            NONCE.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&root)
            .map_err(|e| RuntimeError::SandboxSetup(format!("{}: {e}", root.display())))?;
        let write_ws = spec.has(Category::FilesWrite);
        if write_ws || spec.has(Category::FilesRead) {
            binds.push(Bind {
                source: spec.workspace.clone(),
                target: root.join(GUEST_WORKSPACE.trim_start_matches('/')),
                write: write_ws,
            });
        }
        // Directories only, as with per-grant preopens (a file grant is reported as skipped).
        for p in spec.split_paths().0.into_iter().filter(|p| p.path.is_dir()) {
            let guest = p.guest_path(&spec.workspace, GUEST_WORKSPACE);
            binds.push(Bind {
                source: p.path.clone(),
                target: root.join(guest.trim_start_matches('/')),
                write: p.write,
            });
        }
        binds.sort_by_key(|b| b.target.components().count());
        for b in &binds {
            std::fs::create_dir_all(&b.target)
                .map_err(|e| RuntimeError::SandboxSetup(format!("{}: {e}", b.target.display())))?;
        }
        let shielded = shield(spec, &mut binds);
        let (hide, protect) = match shielded {
            Ok(s) => s,
            Err(e) => {
                remove_empty_dirs(&root);
                return Err(e);
            }
        };
        let guest = |p: &PathBuf| Path::new("/").join(p.strip_prefix(&root).unwrap_or(p));
        let protected = protect.iter().map(guest).collect();
        match Holder::create(&root, &binds, &hide, &protect) {
            Ok(holder) => Ok(Some(Self { holder, protected })),
            Err(e) => {
                remove_empty_dirs(&root);
                Err(e)
            }
        }
    }

    /// Where the guest's `/` is, for a withdrawal.
    pub fn root(&self) -> &Path {
        &self.holder.root
    }

    /// The view's root, to join a guest path to for its preopen.
    pub fn preopen_path(&self) -> PathBuf {
        self.holder.preopen_path()
    }
}

/// Where the view must cover the host's state (`.meta/` of a project root, as for a native
/// agent) and keep `.git` read-only (inside a writable grant): paths under the view's root. A
/// writable grant that lies inside a protected path is bound read-only instead.
fn shield(spec: &AgentSpec, binds: &mut [Bind]) -> Result<(Vec<PathBuf>, Vec<PathBuf>)> {
    let sources: Vec<Option<PathBuf>> = binds
        .iter()
        .map(|b| std::fs::canonicalize(&b.source).ok())
        .collect();
    // Where a host path appears in the view: under every bind that holds it.
    let in_view = |p: &Path, only_writable: bool| -> Vec<PathBuf> {
        binds
            .iter()
            .zip(&sources)
            .filter(|(b, _)| b.write || !only_writable)
            .filter_map(|(b, s)| Some(b.target.join(p.strip_prefix(s.as_ref()?).ok()?)))
            .collect()
    };
    let hidden: Vec<PathBuf> = spec
        .hidden
        .iter()
        .filter_map(|h| std::fs::canonicalize(h).ok())
        .filter(|h| !in_view(h, false).is_empty())
        .collect();
    let granted: Vec<PathAccess> = binds
        .iter()
        .zip(&sources)
        .filter_map(|(b, s)| {
            Some(PathAccess {
                path: s.clone()?,
                write: b.write,
            })
        })
        .collect();
    let protected = crate::native::mask::protected_in_reach(&spec.protected, &granted, &hidden)?;
    let hide = hidden.iter().flat_map(|h| in_view(h, false)).collect();
    let mut protect: Vec<PathBuf> = protected.iter().flat_map(|p| in_view(p, true)).collect();
    protect.sort();
    protect.dedup();
    for (b, s) in binds.iter_mut().zip(&sources) {
        if s.as_ref()
            .is_some_and(|s| protected.iter().any(|p| s.starts_with(p)))
        {
            b.write = false;
        }
    }
    Ok((hide, protect))
}

impl Drop for View {
    fn drop(&mut self) {
        remove_empty_dirs(&self.holder.root);
    }
}

/// Removes `dir` and its subdirectories, which are all empty here (mount points seen from the
/// host's namespace): `remove_dir` only, so nothing with content is ever deleted.
fn remove_empty_dirs(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_empty_dirs(&e.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}
