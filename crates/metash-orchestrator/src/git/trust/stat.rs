//! A cheap fingerprint of the files the executable configuration was read from: their `stat`
//! (device, inode, size, mode, modification and change times), so the check before each git
//! operation costs a few `stat` calls, and the files are read again only when one of them changed.
//!
//! A file changed again within the file system's timestamp granularity of the fingerprint can
//! keep its size, inode and times (git calls this "racily clean"): a fingerprint holding a file
//! changed less than [`RACY`] before it was taken is never trusted, and the next check reads the
//! files again.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How recent a change must be for its timestamps not to prove that nothing changed since: well
/// above the coarse clock tick (1 to 10 ms) local file systems stamp files with.
const RACY: Duration = Duration::from_millis(100);

/// What `stat` says of a path, or `None` for a path that does not exist.
#[derive(Debug, Clone, PartialEq, Eq)]
struct StatKey {
    dev: u64,
    ino: u64,
    size: u64,
    mode: u32,
    /// Nanoseconds since the epoch.
    mtime: i128,
    ctime: i128,
}

/// The fingerprint: each path looked at (a file, or a directory whose entries were listed) with
/// its stat when it was read.
#[derive(Debug, Default)]
pub(crate) struct Watch {
    entries: Vec<(PathBuf, Option<StatKey>)>,
    racy: bool,
}

impl Watch {
    /// Records `path` as it is now. Call before reading it: a change after this call is then
    /// seen by the next check.
    pub(crate) fn add(&mut self, path: &Path) {
        let key = stat(path);
        if key.as_ref().is_some_and(recent) {
            self.racy = true;
        }
        self.entries.push((path.to_path_buf(), key));
    }

    /// Whether every path is as it was recorded (and the record can be relied on).
    pub(crate) fn unchanged(&self) -> bool {
        !self.racy && self.entries.iter().all(|(p, k)| stat(p) == *k)
    }
}

fn nanos(t: SystemTime) -> i128 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_nanos() as i128,
        Err(e) => -(e.duration().as_nanos() as i128),
    }
}

/// Changed less than [`RACY`] ago (or in the future).
fn recent(k: &StatKey) -> bool {
    let now = nanos(SystemTime::now());
    k.mtime.max(k.ctime) >= now - RACY.as_nanos() as i128
}

#[cfg(unix)]
fn stat(path: &Path) -> Option<StatKey> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    let ns = |s: i64, n: i64| i128::from(s) * 1_000_000_000 + i128::from(n);
    Some(StatKey {
        dev: m.dev(),
        ino: m.ino(),
        size: m.size(),
        mode: m.mode(),
        mtime: ns(m.mtime(), m.mtime_nsec()),
        ctime: ns(m.ctime(), m.ctime_nsec()),
    })
}

/// Elsewhere: size, read-only bit and modification time.
#[cfg(not(unix))]
fn stat(path: &Path) -> Option<StatKey> {
    let m = std::fs::metadata(path).ok()?;
    let mtime = m.modified().map(nanos).unwrap_or_default();
    Some(StatKey {
        dev: 0,
        ino: 0,
        size: m.len(),
        mode: u32::from(m.permissions().readonly()),
        mtime,
        ctime: mtime,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_file_is_racy_and_a_created_one_is_seen() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("config");
        let mut w = Watch::default();
        w.add(&f);
        assert!(w.unchanged(), "an absent file stays absent");
        std::fs::write(&f, "x").unwrap();
        assert!(!w.unchanged(), "its creation is seen");
        let mut w = Watch::default();
        w.add(&f);
        assert!(!w.unchanged(), "written just now: racy, never trusted");
    }
}
