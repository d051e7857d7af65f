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
    replace(path, bytes, Sync::Full)
}

/// Replaces the session view, a cache of the log: a temp file and a rename, no fsync at all.
///
/// Why that is enough: the update's `state_update` event was fsynced to the log before this call,
/// and the log is the truth. A killed process leaves the old view or the new one (the page cache
/// outlives the process, and the rename is atomic). A power cut can additionally leave the old
/// view (the rename was lost; the next open folds the missing events back in) or, on filesystems
/// without ext4's rename-over flush, a new name whose bytes never reached the disk (empty or
/// zero-filled): [`crate::session::is_torn`] recognises those and the next open rebuilds the
/// view from the log, keeping the torn bytes beside it. Two fsyncs less per update than
/// [`write_atomic`], which is what lets `update_state` run at disk speed.
///
/// # Errors
/// As [`write_atomic`].
pub fn write_view(path: &Path, bytes: &[u8]) -> Result<()> {
    replace(path, bytes, Sync::None)
}

/// How much of a replacement is made durable before it returns.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Sync {
    /// Neither the bytes nor the rename (a cache the log can rebuild).
    None,
    /// The bytes and the rename (fsync of the file, then of its directory).
    Full,
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

fn replace(path: &Path, bytes: &[u8], sync: Sync) -> Result<()> {
    let dir = path.parent().unwrap_or_else(|| Path::new("."));
    let tmp = temp_beside(path);
    let result = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .at(&tmp)?;
        #[cfg(target_os = "linux")]
        if sync == Sync::None {
            // Blocks reserved up front: ext4 then has no delayed allocation to force when the
            // rename replaces the old file (`auto_da_alloc`), which made the rename as slow as an
            // fsync. Where fallocate is unsupported, the write just allocates as usual.
            let _ = rustix::fs::fallocate(
                &f,
                rustix::fs::FallocateFlags::empty(),
                0,
                bytes.len() as u64,
            );
        }
        f.write_all(bytes).at(&tmp)?;
        if sync == Sync::Full {
            f.sync_data().at(&tmp)?;
        }
        drop(f);
        std::fs::rename(&tmp, path).at(path)?;
        if sync == Sync::Full {
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

/// What identifies one version of a file that is only ever replaced whole (by
/// [`write_atomic`]'s rename): a reader that keeps what it parsed under a stamp can skip reading
/// it again while the stamp is unchanged. Each replacement is a new inode with a new change
/// time, in nanoseconds, so two versions never share a stamp in practice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    len: u64,
    modified: Option<std::time::SystemTime>,
    #[cfg(unix)]
    inode: (u64, u64, i64, i64),
}

/// `path`'s [`Stamp`] now; `None` when it cannot be read (absent or unreadable), which a caller
/// treats as "read it again".
#[must_use]
pub fn stamp(path: &Path) -> Option<Stamp> {
    let m = std::fs::metadata(path).ok()?;
    #[cfg(unix)]
    let inode = {
        use std::os::unix::fs::MetadataExt;
        (m.dev(), m.ino(), m.ctime(), m.ctime_nsec())
    };
    Some(Stamp {
        len: m.len(),
        modified: m.modified().ok(),
        #[cfg(unix)]
        inode,
    })
}
