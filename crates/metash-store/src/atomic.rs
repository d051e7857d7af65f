//! Whole-file replacement that a crash at any instant leaves either old or new.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;

use crate::error::{IoContext, Result};

/// Writes `bytes` to `path` atomically: a temp file in the same directory, fsync, rename over the
/// target, fsync of the directory (so the rename itself survives a power cut).
///
/// # Errors
/// Any I/O failure (a full disk is [`crate::StoreError::DiskFull`]); the temp file is removed and
/// the target is untouched.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path.parent().unwrap_or_else(|| Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(
        ".{name}.tmp.{}.{}",
        std::process::id(),
        uuid::Uuid::new_v4().simple()
    ));
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
        sync_dir(dir)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// fsync of a directory, making creations and renames in it durable.
pub fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir).and_then(|d| d.sync_all()).at(dir)
}
