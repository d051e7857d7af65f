//! Whole-file replacement that a crash at any instant leaves either old or new.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::error::{IoContext, Result};

/// Writes `bytes` to `path` atomically: a temp file in the same directory, fsync, rename over the
/// target, fsync of the directory (so the rename itself survives a power cut).
///
/// # Errors
/// Any I/O failure (a full disk is [`crate::StoreError::DiskFull`]); the temp file is removed and
/// the target is untouched.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    replace(path, bytes, true)
}

/// [`write_atomic`] without the directory fsync, for a file the log can rebuild (the session
/// view): the new file's bytes are durable before the rename, so a crash leaves the old file or
/// the new one, never a torn one; if the rename itself is lost, the old view is still there and
/// the next open folds the missing events back in from the log. One fsync less per update.
///
/// # Errors
/// As [`write_atomic`].
pub fn write_view(path: &Path, bytes: &[u8]) -> Result<()> {
    replace(path, bytes, false)
}

fn temp_beside(path: &Path) -> PathBuf {
    let dir = path.parent().unwrap_or_else(|| Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    dir.join(format!(
        ".{name}.tmp.{}.{}",
        std::process::id(),
        uuid::Uuid::new_v4().simple()
    ))
}

fn replace(path: &Path, bytes: &[u8], sync_rename: bool) -> Result<()> {
    let dir = path.parent().unwrap_or_else(|| Path::new("."));
    let tmp = temp_beside(path);
    let result = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .at(&tmp)?;
        f.write_all(bytes).at(&tmp)?;
        f.sync_data().at(&tmp)?;
        drop(f);
        std::fs::rename(&tmp, path).at(path)?;
        if sync_rename {
            sync_dir(dir)?;
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// [`write_atomic`] for files written with the same bytes again and again (materialized configs,
/// transcripts): creates the parent directories, and leaves a file that already holds these bytes
/// untouched, so a concurrent reader and the mtime see no change. Returns whether it wrote.
///
/// # Errors
/// As [`write_atomic`]; also when a parent directory cannot be created.
pub fn write_atomic_if_changed(path: &Path, bytes: &[u8]) -> Result<bool> {
    if std::fs::read(path).ok().as_deref() == Some(bytes) {
        return Ok(false);
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).at(dir)?;
    }
    write_atomic(path, bytes).map(|()| true)
}

/// fsync of a directory, making creations and renames in it durable.
pub fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir).and_then(|d| d.sync_all()).at(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_once_creates_parents_and_skips_identical_bytes() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| crate::StoreError::Rejected(e.to_string()))?;
        let path = dir.path().join("a/b/c.json");
        assert!(write_atomic_if_changed(&path, b"one")?);
        assert!(!write_atomic_if_changed(&path, b"one")?);
        assert!(write_atomic_if_changed(&path, b"two")?);
        assert_eq!(std::fs::read(&path).ok().as_deref(), Some(&b"two"[..]));
        // No temp file is left behind.
        let names: Vec<_> = std::fs::read_dir(dir.path().join("a/b"))
            .map(|rd| rd.flatten().map(|e| e.file_name()).collect())
            .unwrap_or_default();
        assert_eq!(names.len(), 1);
        Ok(())
    }
}
