//! Atomic, deterministic file writes: materialized configs and transcripts must never be seen
//! half-written by a harness process or a concurrent reader.

use std::fs;
use std::path::{Path, PathBuf};

use metash_store::StoreError;

use crate::error::{HarnessError, Result};

/// Writes `bytes` to `path` with the store's atomic write (temp file, fsync, rename, directory
/// fsync), creating parent directories and skipping a file that already holds these bytes, so
/// repeated materialization does not touch mtimes.
///
/// # Errors
/// `Io` when the directory cannot be created or the file written.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    metash_store::atomic::write_atomic_if_changed(path, bytes)
        .map(drop)
        .map_err(|e| {
            let context = format!("write {}", path.display());
            match e {
                StoreError::Io { source, .. } => HarnessError::io(context, source),
                other => HarnessError::io(context, std::io::Error::other(other.to_string())),
            }
        })
}

/// Creates a directory and its parents.
///
/// # Errors
/// `Io` on failure.
pub fn ensure_dir(path: &Path) -> Result<()> {
    fs::create_dir_all(path).map_err(|e| HarnessError::io(format!("create {}", path.display()), e))
}

/// The first file under `root` (any depth, unreadable directories skipped) whose name `matches`:
/// how a CLI's session is found from its id in the CLI's own dated directory tree.
pub fn find_file(root: &Path, matches: impl Fn(&str) -> bool) -> Option<PathBuf> {
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(rd) = fs::read_dir(&dir) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.file_name().is_some_and(|n| matches(&n.to_string_lossy())) {
                return Some(p);
            }
        }
    }
    None
}
