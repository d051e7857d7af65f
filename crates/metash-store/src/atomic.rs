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
    prepare(path, bytes)?.commit(true)
}

/// A temp file holding the new content, already fsynced, not yet renamed into place. Dropping it
/// without [`Prepared::commit`] removes it. Splitting the two halves lets the store fsync the new
/// session.json while the log append's fsync is in flight.
#[derive(Debug)]
pub struct Prepared {
    tmp: PathBuf,
    target: PathBuf,
    done: bool,
}

/// First half of [`write_atomic`]: write and fsync a temp file beside `path`.
pub fn prepare(path: &Path, bytes: &[u8]) -> Result<Prepared> {
    let dir = parent(path);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let prepared = Prepared {
        tmp: dir.join(format!(
            ".{name}.tmp.{}.{}",
            std::process::id(),
            uuid::Uuid::new_v4().simple()
        )),
        target: path.to_path_buf(),
        done: false,
    };
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&prepared.tmp)
        .at(&prepared.tmp)?;
    f.write_all(bytes).at(&prepared.tmp)?;
    f.sync_data().at(&prepared.tmp)?;
    Ok(prepared)
}

impl Prepared {
    /// Second half: rename into place, and with `sync_directory` make the rename durable.
    pub fn commit(mut self, sync_directory: bool) -> Result<()> {
        std::fs::rename(&self.tmp, &self.target).at(&self.target)?;
        self.done = true;
        if sync_directory {
            sync_dir(parent(&self.target))?;
        }
        Ok(())
    }
}

impl Drop for Prepared {
    fn drop(&mut self) {
        if !self.done {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

fn parent(path: &Path) -> &Path {
    path.parent().unwrap_or_else(|| Path::new("."))
}

/// fsync of a directory, making creations and renames in it durable.
pub fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir).and_then(|d| d.sync_all()).at(dir)
}
