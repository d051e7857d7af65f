//! The store lock: an exclusive file lock on `.meta/lock` (`flock(2)` on Unix, `LockFileEx` on
//! Windows, through std's `File::lock`), with a timeout.
//!
//! flock is released by the kernel when its holder dies, so a crashed writer never leaves a stale
//! lock behind. Linux has no timed flock, so a contended acquisition waits in a helper thread doing
//! the blocking call: the kernel then hands the lock over the moment it is released, which polling
//! cannot match under contention. The holder writes its pid into the file for error messages only.

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::error::{IoContext, Result, StoreError};

/// Held while a read-modify-write is in progress; dropping it releases the lock.
#[derive(Debug)]
pub struct LockGuard {
    file: File,
}

#[cfg(unix)]
impl std::os::fd::AsRawFd for LockGuard {
    /// The locked file: a child process given this fd (without close-on-exec) holds the lock with
    /// the holder, so if the holder is killed, the lock stays taken until that child exits too.
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        std::os::fd::AsRawFd::as_raw_fd(&self.file)
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        let _ = self.file.unlock();
    }
}

/// Takes the exclusive lock on `path`, waiting at most `timeout`.
///
/// # Errors
/// [`StoreError::LockTimeout`] naming the holder's pid when known; I/O errors opening the file.
pub fn acquire(path: &Path, timeout: Duration) -> Result<LockGuard> {
    let start = Instant::now();
    loop {
        let file = open(path)?;
        let file = match file.try_lock() {
            Ok(()) => file,
            Err(std::fs::TryLockError::Error(e)) => return Err(StoreError::io(path, e)),
            Err(std::fs::TryLockError::WouldBlock) => {
                let left = timeout.saturating_sub(start.elapsed());
                // With no time left, no waiter: one started anyway would take the lock the
                // moment it is released, so the holder's next try right after its release could
                // find it taken. A short second look instead.
                let got = if left.is_zero() {
                    look_again(file)
                } else {
                    wait_in_thread(file, left)
                };
                match got {
                    Some(f) => f,
                    None => return Err(timeout_error(path, start)),
                }
            }
        };
        // Someone may have replaced the file between our open and our flock; a lock on an
        // unlinked inode protects nothing, so take it again on the current file.
        if same_inode(path, &file)? {
            let mut guard = LockGuard { file };
            write_pid(&mut guard.file);
            return Ok(guard);
        }
        if start.elapsed() >= timeout {
            return Err(timeout_error(path, start));
        }
    }
}

fn open(path: &Path) -> Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .at(path)
}

/// How long a try with no time left looks again before it reports the lock held: far longer than
/// a waiter whose caller gave up holds it (microseconds, unless it is preempted in between on a
/// loaded machine), short enough that a person asking while a run holds it notices nothing.
const ORPHAN_WINDOW: Duration = Duration::from_millis(50);

/// A waiter whose caller gave up ([`wait_in_thread`]) is still blocked in the kernel; at the
/// release it takes the lock and drops it at once. A try in that instant would report a holder
/// that is already gone, so a try with no time left looks again for [`ORPHAN_WINDOW`].
fn look_again(file: File) -> Option<File> {
    let until = Instant::now() + ORPHAN_WINDOW;
    while Instant::now() < until {
        std::thread::sleep(Duration::from_micros(500));
        if file.try_lock().is_ok() {
            return Some(file);
        }
    }
    None
}

/// Blocks in a thread so the caller can give up; if the thread wins after the caller left, it
/// drops the file, which releases the lock at once.
fn wait_in_thread(file: File, timeout: Duration) -> Option<File> {
    let (tx, rx) = mpsc::sync_channel(1);
    std::thread::spawn(move || {
        if file.lock().is_ok() {
            let _ = tx.send(file);
        }
    });
    rx.recv_timeout(timeout).ok()
}

fn same_inode(path: &Path, file: &File) -> Result<bool> {
    let on_disk = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(StoreError::io(path, e)),
    };
    let ours = file.metadata().at(path)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        Ok(on_disk.ino() == ours.ino() && on_disk.dev() == ours.dev())
    }
    // Windows does not let an open file be replaced or unlinked under its holder.
    #[cfg(not(unix))]
    {
        let _ = (on_disk, ours);
        Ok(true)
    }
}

/// The pid padded to a fixed width and written in place: the file never changes length, so
/// taking the lock frees and allocates no blocks (a truncate per lock cost as much as an fsync).
fn write_pid(file: &mut File) {
    let pid = format!("{:<10}\n", std::process::id());
    #[cfg(unix)]
    let _ = std::os::unix::fs::FileExt::write_all_at(file, pid.as_bytes(), 0);
    #[cfg(windows)]
    let _ = std::os::windows::fs::FileExt::seek_write(file, pid.as_bytes(), 0);
}

fn timeout_error(path: &Path, start: Instant) -> StoreError {
    let holder = std::fs::File::open(path)
        .ok()
        .and_then(|mut f| {
            let mut s = String::new();
            f.read_to_string(&mut s).ok()?;
            s.trim().parse::<u32>().ok()
        })
        .map(|pid| format!(" (held by pid {pid})"))
        .unwrap_or_default();
    StoreError::LockTimeout {
        path: PathBuf::from(path),
        waited_ms: start.elapsed().as_millis() as u64,
        holder,
    }
}
