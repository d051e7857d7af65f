//! Atomic, deterministic file writes: materialized configs and transcripts must never be seen
//! half-written by a harness process or a concurrent reader.

use std::fs;
use std::io::Write;
use std::path::Path;

use crate::error::{HarnessError, Result};

/// Writes `bytes` to `path` through a temp file in the same directory, fsync, rename, fsync of the
/// directory. Creates parent directories. Skips the write when the file already holds these bytes,
/// so repeated materialization does not touch mtimes.
///
/// # Errors
/// `Io` when the directory cannot be created or the file written.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    if fs::read(path).ok().as_deref() == Some(bytes) {
        return Ok(());
    }
    let dir = path
        .parent()
        .ok_or_else(|| HarnessError::InvalidRequest(format!("no parent: {}", path.display())))?;
    fs::create_dir_all(dir)
        .map_err(|e| HarnessError::io(format!("create {}", dir.display()), e))?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.{}.tmp", uuid::Uuid::new_v4().simple()));
    let write = || -> std::io::Result<()> {
        let mut f = fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        fs::rename(&tmp, path)?;
        if let Ok(d) = fs::File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(())
    };
    write().map_err(|e| {
        let _ = fs::remove_file(&tmp);
        HarnessError::io(format!("write {}", path.display()), e)
    })
}

/// Creates a directory and its parents.
///
/// # Errors
/// `Io` on failure.
pub fn ensure_dir(path: &Path) -> Result<()> {
    fs::create_dir_all(path).map_err(|e| HarnessError::io(format!("create {}", path.display()), e))
}
