//! A project agent's own package inside the hidden state directory: `.meta/agents/<id>/` lies in
//! `.meta/`, which the mask covers with an empty tmpfs, so the agent's own entry would vanish with
//! the rest (exec fails: "permission denied"). An agent's package is what it runs from, as for an
//! agent installed under the user's config directory: it alone is brought back into view, read
//! only, at its own path. Nothing else of `.meta/` is there: the covering tmpfs holds only the
//! directories on the way to the package (mode 111: they can be walked through, not listed), and
//! the whole covering mount, the package's bind included, is read-only.
//!
//! The covering tmpfs is made writable first (the mount points must be made), the package's mount
//! is cloned before it is covered (afterwards its path leads into the tmpfs), then everything is
//! made read-only; any step that fails stops the start (fail closed).

use std::ffi::CString;
use std::io;
use std::path::Path;

use super::{check, cstr, Mask};
use crate::error::{Result, RuntimeError};

/// `OPEN_TREE_CLONE` (linux/mount.h): a detached copy of the mount tree at the path.
const OPEN_TREE_CLONE: libc::c_uint = 1;
/// `AT_RECURSIVE` (linux/fcntl.h): with everything mounted under it.
const AT_RECURSIVE: libc::c_uint = 0x8000;
/// `MOVE_MOUNT_F_EMPTY_PATH` (linux/mount.h): the source is the descriptor itself.
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;

/// One package to bring back inside one covered directory, prepared in the parent.
#[derive(Debug)]
pub(super) struct Exposure {
    /// The covered (hidden) directory.
    pub(super) hidden: CString,
    /// The package directory: cloned before the cover, mounted back at the same path after.
    package: CString,
    /// The directories to make in the tmpfs on the way to the package, parents first (the
    /// package itself last: its mount point).
    dirs: Vec<CString>,
}

impl Mask {
    /// Brings `package` (the agent's own directory, canonical) back into view, read-only, when
    /// the agent's `entry` (canonical) lies in a directory this mask hides. Refuses (fail closed)
    /// an entry hidden by the mask that is not inside such a package: the package must lie
    /// strictly inside the hidden directory and hold neither a hidden directory nor the
    /// workspace (the runtime's Landlock rules grant it on the same terms).
    ///
    /// # Errors
    /// [`RuntimeError::SandboxSetup`] naming the entry and why it cannot be shown.
    pub fn with_own_package(
        mut self,
        entry: &Path,
        package: Option<&Path>,
        workspace: &Path,
    ) -> Result<Self> {
        let Some(hidden) = self.shown.iter().find(|h| entry.starts_with(h)).cloned() else {
            return Ok(self);
        };
        let refuse = |why: &str| {
            Err(RuntimeError::SandboxSetup(format!(
                "the agent's entry {} lies inside {}, metash's own state, which is hidden from \
                 it: {why}",
                entry.display(),
                hidden.display()
            )))
        };
        let Some(pkg) = package.filter(|p| entry.starts_with(p)) else {
            return refuse("only an entry inside its own package directory can be shown");
        };
        if pkg == hidden || !pkg.starts_with(&hidden) {
            return refuse("its package directory is not a directory of its own in there");
        }
        if self.shown.iter().any(|h| h.starts_with(pkg)) || workspace.starts_with(pkg) {
            return refuse("its package directory holds metash's state or the workspace");
        }
        let mut dirs = Vec::new();
        let mut at = hidden.clone();
        for part in pkg.strip_prefix(&hidden).unwrap_or(pkg).components() {
            at.push(part);
            dirs.push(cstr(&at)?);
        }
        self.expose.push(Exposure {
            hidden: cstr(&hidden)?,
            package: cstr(pkg)?,
            dirs,
        });
        self.exposed.push(pkg.to_path_buf());
        Ok(self)
    }
}

impl Exposure {
    /// Covers the hidden directory with a tmpfs holding only the way to the package, mounts the
    /// package back there and makes the whole cover read-only.
    ///
    /// # Safety
    /// Only in the child between fork and exec, in its own mount namespace, with the
    /// capabilities to mount.
    pub(super) unsafe fn apply(&self) -> io::Result<()> {
        // SAFETY (whole block): raw syscalls on NUL-terminated data prepared in the parent.
        unsafe {
            let tree = libc::syscall(
                libc::SYS_open_tree,
                libc::AT_FDCWD,
                self.package.as_ptr(),
                OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint | AT_RECURSIVE,
            );
            check(tree, "show the agent's package: clone its mount")?;
            let tree = tree as libc::c_int;
            let shown = self.cover_and_move(tree);
            libc::close(tree);
            shown?;
            if !super::super::mounts::read_only(&self.hidden) {
                check(-1, "show the agent's package: make the cover read-only")?;
            }
        }
        Ok(())
    }

    /// The writable cover, the way to the package in it (mode 111), and the package's clone
    /// moved onto its mount point.
    ///
    /// # Safety
    /// As [`Exposure::apply`].
    unsafe fn cover_and_move(&self, tree: libc::c_int) -> io::Result<()> {
        // SAFETY (whole block): as above.
        unsafe {
            check(
                libc::c_long::from(libc::mount(
                    c"metash-covered".as_ptr(),
                    self.hidden.as_ptr(),
                    c"tmpfs".as_ptr(),
                    libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                    c"size=16k,mode=700".as_ptr().cast(),
                )),
                "show the agent's package: cover the state directory",
            )?;
            for d in &self.dirs {
                check(
                    libc::c_long::from(libc::mkdir(d.as_ptr(), 0o700)),
                    "show the agent's package: make its mount point",
                )?;
            }
            // Walked through, never listed; the package's own mount point goes under its bind.
            for d in self.dirs.iter().chain(std::iter::once(&self.hidden)) {
                check(
                    libc::c_long::from(libc::chmod(d.as_ptr(), 0o111)),
                    "show the agent's package: close the way to it",
                )?;
            }
            let target = self.dirs.last().unwrap_or(&self.hidden);
            check(
                libc::syscall(
                    libc::SYS_move_mount,
                    tree,
                    c"".as_ptr(),
                    libc::AT_FDCWD,
                    target.as_ptr(),
                    MOVE_MOUNT_F_EMPTY_PATH,
                ),
                "show the agent's package: mount it back",
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn hiding(h: &Path) -> Mask {
        Mask {
            shown: vec![h.to_path_buf()],
            ..Mask::empty()
        }
    }

    /// Only an entry inside a package of its own, strictly inside the hidden directory and
    /// holding neither it nor the workspace, is shown; everything else is refused.
    #[test]
    fn only_an_own_package_inside_the_hidden_directory_is_shown() {
        let meta = PathBuf::from("/p/.meta");
        let pkg = meta.join("agents/a");
        let entry = pkg.join("bin/agent");
        let ws = Path::new("/p");
        let m = hiding(&meta)
            .with_own_package(&entry, Some(&pkg), ws)
            .expect("shown");
        assert_eq!(m.exposed, vec![pkg.clone()]);
        let dirs: Vec<_> = m.expose[0].dirs.iter().map(|d| d.to_owned()).collect();
        assert_eq!(
            dirs,
            [
                c"/p/.meta/agents".to_owned(),
                c"/p/.meta/agents/a".to_owned()
            ]
        );
        // Outside the hidden directory: nothing to do.
        let m = hiding(&meta)
            .with_own_package(Path::new("/opt/agent"), None, ws)
            .expect("nothing hidden");
        assert!(m.exposed.is_empty() && m.expose.is_empty());
        for (entry, pkg, ws) in [
            (entry.clone(), None, ws),
            (meta.join("agents/b/agent"), Some(pkg.as_path()), ws),
            (meta.join("agent"), Some(meta.as_path()), ws),
            (entry.clone(), Some(pkg.as_path()), pkg.as_path()),
        ] {
            let err = hiding(&meta).with_own_package(&entry, pkg, ws);
            assert!(err.is_err(), "{entry:?} {pkg:?} {ws:?}");
        }
    }
}
