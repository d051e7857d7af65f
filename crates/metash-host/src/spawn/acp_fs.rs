//! `fs/read_text_file` and `fs/write_text_file` of an ACP agent, done by metash outside the
//! sandbox, so held to what the sandbox would allow the agent itself, and less: only files
//! beneath the spawn's worktree; never through `..` or a symlink (each name is opened without
//! following links, beneath the worktree's descriptor: [`super::artifact::open_beneath`] for
//! reads, a `O_NOFOLLOW` walk for writes), never in `.git` or `.meta`, never a write for a spawn
//! that may only read the project; at most [`MAX_BYTES`] either way.

use std::io::{Read, Write};
use std::path::{Component, Path, PathBuf};

/// The largest file read or written for an agent (its tools see files, not disk images).
pub(crate) const MAX_BYTES: u64 = 16 << 20;

/// Names never reached through the file methods, wherever they are in the worktree: git's
/// metadata (the host's git runs there after the turn) and metash's state.
const PROTECTED: &[&str] = &[".git", ".meta"];

/// The worktree an agent's file requests are held to.
pub(crate) struct Files {
    /// Canonical.
    pub root: PathBuf,
    /// A planner's spawn (the project read-only): writes are refused.
    pub read_only: bool,
    /// The host's hidden directories (`.meta`), absolute: refused where they lie inside the
    /// root (a task worktree itself lies inside `.meta/worktrees/`).
    pub hidden: Vec<PathBuf>,
}

impl Files {
    /// `path` (absolute, as ACP requires) as plain names beneath the root.
    ///
    /// # Errors
    /// Why it is refused: relative, `..`, outside the worktree, `.git` or `.meta`, hidden.
    pub fn relative(&self, path: &str) -> Result<PathBuf, String> {
        let p = Path::new(path);
        if !p.is_absolute() {
            return Err(format!("{path}: ACP paths are absolute"));
        }
        if p.components().any(|c| matches!(c, Component::ParentDir)) {
            return Err(format!("{path}: `..` is refused"));
        }
        let rel = p.strip_prefix(&self.root).map_err(|_| {
            format!(
                "{path} is outside the worktree {} (metash refused it)",
                self.root.display()
            )
        })?;
        let rel: PathBuf = rel
            .components()
            .filter(|c| !matches!(c, Component::CurDir))
            .collect();
        if rel.as_os_str().is_empty() {
            return Err(format!("{path} is the worktree itself, not a file"));
        }
        if rel
            .components()
            .any(|c| PROTECTED.iter().any(|n| c.as_os_str() == *n))
            || self
                .hidden
                .iter()
                .any(|h| h.starts_with(&self.root) && p.starts_with(h))
        {
            return Err(format!("{path}: metash's and git's metadata are refused"));
        }
        Ok(rel)
    }

    /// The text of `path`.
    ///
    /// # Errors
    /// Refused (see [`Files::relative`]), a symlink on the way, not a regular file, larger than
    /// [`MAX_BYTES`], not UTF-8, or unreadable.
    pub fn read(&self, path: &str) -> Result<String, String> {
        let rel = self.relative(path)?;
        let file = super::artifact::open_beneath(&self.root, &rel)
            .map_err(|e| format!("{path}: {e} (symlinks are not followed)"))?;
        let meta = file.metadata().map_err(|e| format!("{path}: {e}"))?;
        if !meta.is_file() {
            return Err(format!("{path} is not a regular file"));
        }
        if meta.len() > MAX_BYTES {
            return Err(format!("{path} is larger than {MAX_BYTES} bytes"));
        }
        let mut text = String::new();
        file.take(MAX_BYTES + 1)
            .read_to_string(&mut text)
            .map_err(|e| format!("{path}: {e}"))?;
        Ok(text)
    }

    /// Writes `content` to `path`, making missing directories on the way.
    ///
    /// # Errors
    /// Refused (see [`Files::relative`]), a read-only spawn, a symlink on the way, larger than
    /// [`MAX_BYTES`], or unwritable.
    pub fn write(&self, path: &str, content: &str) -> Result<(), String> {
        if self.read_only {
            return Err(format!(
                "{path}: this spawn may read the project but not write it"
            ));
        }
        let rel = self.relative(path)?;
        if content.len() as u64 > MAX_BYTES {
            return Err(format!("{path}: more than {MAX_BYTES} bytes"));
        }
        let mut file = beneath::create(&self.root, &rel).map_err(|e| format!("{path}: {e}"))?;
        file.write_all(content.as_bytes())
            .and_then(|()| file.sync_data())
            .map_err(|e| format!("{path}: {e}"))
    }
}

#[cfg(unix)]
mod beneath {
    use std::ffi::CString;
    use std::fs::File;
    use std::os::fd::{AsRawFd, FromRawFd};
    use std::os::unix::ffi::OsStrExt;
    use std::path::Path;

    const DIR_FLAGS: libc::c_int =
        libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NOFOLLOW | libc::O_DIRECTORY;
    const FILE_FLAGS: libc::c_int = libc::O_WRONLY
        | libc::O_CREAT
        | libc::O_TRUNC
        | libc::O_CLOEXEC
        | libc::O_NOFOLLOW
        | libc::O_NONBLOCK
        | libc::O_NOCTTY;

    fn name(n: &[u8]) -> std::io::Result<CString> {
        CString::new(n).map_err(|_| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, "a NUL byte in the path")
        })
    }

    fn owned(fd: libc::c_int) -> std::io::Result<File> {
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned by the kernel for us and is owned by nobody else.
        Ok(unsafe { File::from_raw_fd(fd) })
    }

    /// Opens (or creates) `rel` for writing beneath `root`: one `openat` per name relative to
    /// the directory before it, none following a symlink; a missing directory is made with
    /// `mkdirat`. The file must be a regular one (a FIFO or device planted there is refused).
    pub(super) fn create(root: &Path, rel: &Path) -> std::io::Result<File> {
        let names: Vec<&[u8]> = rel.components().map(|c| c.as_os_str().as_bytes()).collect();
        let Some((last, dirs)) = names.split_last() else {
            return Err(std::io::ErrorKind::InvalidInput.into());
        };
        let mut dir = File::open(root)?;
        for d in dirs {
            let c = name(d)?;
            // SAFETY: a valid directory descriptor and a NUL-terminated name, for each call.
            let fd = unsafe { libc::openat(dir.as_raw_fd(), c.as_ptr(), DIR_FLAGS) };
            dir = match owned(fd) {
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                    // SAFETY: as above; 0o755 is the mode of a new directory.
                    if unsafe { libc::mkdirat(dir.as_raw_fd(), c.as_ptr(), 0o755) } != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    // SAFETY: as above.
                    owned(unsafe { libc::openat(dir.as_raw_fd(), c.as_ptr(), DIR_FLAGS) })?
                }
                other => other?,
            };
        }
        let c = name(last)?;
        // SAFETY: as above; 0o644 is the mode of a new file.
        let fd = unsafe { libc::openat(dir.as_raw_fd(), c.as_ptr(), FILE_FLAGS, 0o644) };
        let file = owned(fd)?;
        if !file.metadata()?.is_file() {
            return Err(std::io::Error::other("not a regular file"));
        }
        Ok(file)
    }
}

#[cfg(not(unix))]
mod beneath {
    pub(super) fn create(
        _: &std::path::Path,
        _: &std::path::Path,
    ) -> std::io::Result<std::fs::File> {
        Err(std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            "ACP file writes are made on unix only (without following symlinks)",
        ))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn files() -> (tempfile::TempDir, tempfile::TempDir, Files) {
        let ws = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), "SECRET").unwrap();
        let root = ws.path().canonicalize().unwrap();
        std::fs::create_dir_all(root.join(".git")).unwrap();
        std::fs::create_dir_all(root.join(".meta")).unwrap();
        std::os::unix::fs::symlink(outside.path(), root.join("out")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret"), root.join("s")).unwrap();
        let f = Files {
            root: root.clone(),
            read_only: false,
            hidden: vec![root.join(".meta")],
        };
        (ws, outside, f)
    }

    #[test]
    fn inside_reads_and_writes_work() {
        let (_w, _o, f) = files();
        let p = f.root.join("src/new/a.txt");
        f.write(&p.display().to_string(), "hi\n").unwrap();
        assert_eq!(f.read(&p.display().to_string()).unwrap(), "hi\n");
    }

    #[test]
    fn escapes_are_refused() {
        let (_w, o, f) = files();
        let r = |p: PathBuf| p.display().to_string();
        for bad in [
            r(o.path().join("secret")),
            r(f.root.join("out/secret")),
            r(f.root.join("s")),
            format!("{}/../secret", f.root.display()),
            r(f.root.join(".git/config")),
            r(f.root.join(".meta/session.json")),
            "relative.txt".to_string(),
        ] {
            assert!(f.read(&bad).is_err(), "read {bad}");
            assert!(f.write(&bad, "x").is_err(), "write {bad}");
        }
        assert_eq!(
            std::fs::read_to_string(o.path().join("secret")).unwrap(),
            "SECRET"
        );
        assert!(!o.path().join("x").exists());
        let ro = Files {
            read_only: true,
            ..f
        };
        assert!(ro.write(&r(ro.root.join("a")), "x").is_err());
    }
}
