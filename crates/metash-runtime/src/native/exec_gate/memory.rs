//! Reading what an exec asks for (its path and argv) from the target's memory, bounded, with the
//! notification re-checked around every read so nothing read belongs to a recycled pid.

use std::fs::File;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::filter::EXECVEAT_X32;
use super::id_valid;

/// Bounds on what is read from the agent's memory per exec: the gate sees at most this much.
const MAX_PATH: usize = 4096;
const MAX_ARGS: usize = 256;
const MAX_ARG: usize = 4096;
const MAX_ARGV_BYTES: usize = 64 * 1024;
const PAGE: u64 = 4096;

/// An exec as the gate sees it.
pub(super) struct Exec {
    pub program: String,
    pub argv: Vec<String>,
    /// The path as the agent gave it resolved to an absolute path the host could check.
    pub resolved: Option<PathBuf>,
}

pub(super) enum Read {
    Exec(Exec),
    /// The target is gone or the notification no longer valid: nothing to answer.
    Gone,
    /// Its memory could not be read: refused (fail-closed).
    Unreadable(String),
}

/// Read the exec's path and argv from the target's memory, checking (seccomp_unotify(2)) that the
/// notification is still valid after opening `/proc/<pid>/mem` (the pid was not recycled) and after
/// reading (what was read belongs to this request).
pub(super) fn read_exec(fd: &OwnedFd, req: &libc::seccomp_notif) -> Read {
    let pid = req.pid;
    let mem = match File::open(format!("/proc/{pid}/mem")) {
        Ok(m) => m,
        Err(e) => {
            return if id_valid(fd, req.id) {
                Read::Unreadable(format!("/proc/{pid}/mem: {e}"))
            } else {
                Read::Gone
            }
        }
    };
    if !id_valid(fd, req.id) {
        return Read::Gone;
    }
    let args = req.data.args;
    let nr = req.data.nr as i64;
    let (dirfd, path_ptr, argv_ptr, empty_path_ok) =
        if nr == libc::SYS_execveat || nr == EXECVEAT_X32 {
            (
                args[0] as i32,
                args[1],
                args[2],
                args[4] & libc::AT_EMPTY_PATH as u64 != 0,
            )
        } else {
            (libc::AT_FDCWD, args[0], args[1], false)
        };
    let path = match read_cstr(&mem, path_ptr, MAX_PATH) {
        Ok((s, false)) => s,
        Ok((_, true)) => return Read::Unreadable("path longer than PATH_MAX".into()),
        Err(e) => return Read::Unreadable(format!("path: {e}")),
    };
    let argv = read_argv(&mem, argv_ptr);
    if !id_valid(fd, req.id) {
        return Read::Gone;
    }
    let base = |fd: i32| -> Option<PathBuf> {
        let link = if fd == libc::AT_FDCWD {
            format!("/proc/{pid}/cwd")
        } else {
            format!("/proc/{pid}/fd/{fd}")
        };
        std::fs::read_link(link).ok()
    };
    let (program, resolved) = if path.starts_with('/') {
        (path.clone(), Some(PathBuf::from(&path)))
    } else if path.is_empty() && empty_path_ok {
        // fexecve: the program is whatever the fd points to.
        let p = base(dirfd).map(|p| p.display().to_string());
        (p.unwrap_or_else(|| format!("<fd {dirfd}>")), None)
    } else {
        match base(dirfd) {
            Some(b) => {
                let full = b.join(&path);
                (full.display().to_string(), Some(full))
            }
            None => (path.clone(), None),
        }
    };
    Read::Exec(Exec {
        program,
        argv,
        resolved: resolved.filter(|p| Path::is_absolute(p)),
    })
}

/// A NUL-terminated string at `addr`, at most `max` bytes; `true` when it was cut. Reads page by
/// page so a string that ends just before an unmapped page is still read.
fn read_cstr(mem: &File, addr: u64, max: usize) -> io::Result<(String, bool)> {
    let mut out = Vec::new();
    let mut at = addr;
    while out.len() < max {
        let chunk = ((PAGE - at % PAGE) as usize).min(max - out.len());
        let mut buf = vec![0u8; chunk];
        let n = mem.read_at(&mut buf, at)?;
        if n == 0 {
            return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
        }
        if let Some(end) = buf[..n].iter().position(|&b| b == 0) {
            out.extend_from_slice(&buf[..end]);
            return Ok((String::from_utf8_lossy(&out).into_owned(), false));
        }
        out.extend_from_slice(&buf[..n]);
        at += n as u64;
    }
    Ok((String::from_utf8_lossy(&out).into_owned(), true))
}

/// The argv array, best effort and bounded: what cannot be read is marked, not guessed.
fn read_argv(mem: &File, addr: u64) -> Vec<String> {
    let mut argv = Vec::new();
    if addr == 0 {
        return argv;
    }
    let mut total = 0usize;
    for i in 0..MAX_ARGS {
        let mut word = [0u8; 8];
        match mem.read_at(&mut word, addr + 8 * i as u64) {
            Ok(8) => {}
            _ => {
                argv.push("<unreadable>".into());
                return argv;
            }
        }
        let ptr = u64::from_ne_bytes(word);
        if ptr == 0 {
            return argv;
        }
        let room = MAX_ARG.min(MAX_ARGV_BYTES.saturating_sub(total));
        if room == 0 {
            argv.push("<truncated>".into());
            return argv;
        }
        match read_cstr(mem, ptr, room) {
            Ok((s, cut)) => {
                total += s.len();
                argv.push(if cut { format!("{s}<truncated>") } else { s });
            }
            Err(_) => {
                argv.push("<unreadable>".into());
                return argv;
            }
        }
    }
    argv.push("<truncated>".into());
    argv
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_strings_across_pages() {
        let f = tempfile::tempfile().unwrap();
        let mut data = vec![b'a'; 5000];
        data.push(0);
        f.write_all_at(&data, 0).unwrap();
        // Starts mid-page, ends on the next one.
        let (s, cut) = read_cstr(&f, 100, 8192).unwrap();
        assert_eq!((s.len(), cut), (4900, false));
        let (s, cut) = read_cstr(&f, 0, MAX_PATH).unwrap();
        assert_eq!((s.len(), cut), (MAX_PATH, true));
        let (s, cut) = read_cstr(&f, 0, 10).unwrap();
        assert_eq!((s.as_str(), cut), ("aaaaaaaaaa", true));
    }
}
