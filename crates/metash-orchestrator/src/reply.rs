//! Reading the JSON an agent put in `AgentResponse.data`. Models wrap JSON in prose or in a
//! ```` ```json ```` fence more often than not, so this accepts, in order: the whole text, the last
//! fenced block, the outermost `{...}` (or `[...]`) span. And writing the `files` of an API
//! executor's reply into its worktree (`apply_files`), which is metash's own write of what a
//! model said: it never names `.git`/`.meta` (in any spelling), never leaves the worktree and
//! never follows a symbolic link.

use std::path::{Component, Path};

use serde_json::Value;

/// The JSON value in `data`, or why there is none.
///
/// # Errors
/// A message quoting the start of `data`, for the agent's next prompt.
pub fn extract_json(data: &str) -> Result<Value, String> {
    let text = data.trim();
    if let Ok(v) = serde_json::from_str(text) {
        return Ok(v);
    }
    if let Some(v) = last_fence(text).and_then(|f| serde_json::from_str(f.trim()).ok()) {
        return Ok(v);
    }
    for (open, close) in [('{', '}'), ('[', ']')] {
        if let (Some(start), Some(end)) = (text.find(open), text.rfind(close)) {
            if start < end {
                if let Ok(v) = serde_json::from_str(&text[start..=end]) {
                    return Ok(v);
                }
            }
        }
    }
    let preview: String = text.chars().take(120).collect();
    Err(format!(
        "the reply holds no JSON (it starts with {preview:?})"
    ))
}

/// The body of the last ```` ``` ```` fenced block (any info string).
fn last_fence(text: &str) -> Option<&str> {
    let start = text.rfind("```")?;
    let before = &text[..start];
    let open = before.rfind("```")?;
    let body = &text[open + 3..start];
    // Drop the info string (`json`, `JSON`, ...) on the opening line.
    let body = match body.find('\n') {
        Some(nl) if !body[..nl].trim_start().starts_with(['{', '[']) => &body[nl + 1..],
        _ => body,
    };
    Some(body)
}

/// Writes the `files` of a JSON reply (`[{path, content}]`) into the worktree, for executors that
/// cannot write themselves (plain API model roles). A path must be relative, stay inside the
/// worktree, and name no `.git` or `.meta` in any component and any spelling a file system reads
/// as one (`.META`, `.met\u{200c}a`: `git::guard::reserved_in`).
pub fn apply_files(wt: &Path, data: &str) -> Result<(), String> {
    let Ok(Value::Object(map)) = extract_json(data) else {
        return Ok(());
    };
    let Some(files) = map.get("files").and_then(Value::as_array) else {
        return Ok(());
    };
    for f in files {
        let (Some(path), Some(content)) = (
            f.get("path").and_then(Value::as_str),
            f.get("content").and_then(Value::as_str),
        ) else {
            return Err("each entry of `files` needs a string `path` and `content`".into());
        };
        let rel = Path::new(path);
        let ok = !path.is_empty()
            && rel.components().all(|c| matches!(c, Component::Normal(_)))
            && crate::git::guard::reserved_in(path).is_none();
        if !ok {
            return Err(format!(
                "file path `{path}` must be relative, inside the worktree, outside .git and .meta"
            ));
        }
        write_beneath(wt, rel, content.as_bytes()).map_err(|e| format!("{path}: {e}"))?;
    }
    Ok(())
}

/// Writes `content` at `rel` beneath `wt`, opening each directory from the one before it with
/// `O_NOFOLLOW` (`openat`), creating the missing ones: a symbolic link anywhere on the way (one
/// committed by an earlier task, or swapped in by a process the agent left running) stops the
/// write instead of carrying it into `.meta/` or out of the project. A path that is not a
/// regular file at the end (a FIFO that would block the host) is refused too.
#[cfg(unix)]
fn write_beneath(wt: &Path, rel: &Path, content: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::fd::AsRawFd;
    let names: Vec<&std::ffi::OsStr> = rel
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n),
            _ => None,
        })
        .collect();
    let Some((last, dirs)) = names.split_last() else {
        return Err(std::io::Error::other("an empty path"));
    };
    let mut dir = open_at(
        libc::AT_FDCWD,
        wt.as_os_str(),
        libc::O_RDONLY | libc::O_DIRECTORY,
    )?;
    for name in dirs {
        let flags = libc::O_RDONLY | libc::O_DIRECTORY;
        dir = match open_at(dir.as_raw_fd(), name, flags) {
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                let c = c_name(name)?;
                // SAFETY: a valid directory fd and a NUL-terminated name.
                if unsafe { libc::mkdirat(dir.as_raw_fd(), c.as_ptr(), 0o777) } != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                open_at(dir.as_raw_fd(), name, flags)?
            }
            other => other.map_err(|e| no_link(name, e))?,
        };
    }
    let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_NONBLOCK;
    let file =
        std::fs::File::from(open_at(dir.as_raw_fd(), last, flags).map_err(|e| no_link(last, e))?);
    if !file.metadata()?.is_file() {
        return Err(std::io::Error::other(format!(
            "{} is not a regular file",
            last.to_string_lossy()
        )));
    }
    (&file).write_all(content)
}

/// Elsewhere: no `openat` walk; each component is looked at before the write (racy, but no
/// agent of metash's runs beside the host there).
#[cfg(not(unix))]
fn write_beneath(wt: &Path, rel: &Path, content: &[u8]) -> std::io::Result<()> {
    let mut at = wt.to_path_buf();
    for part in rel.components() {
        at.push(part);
        if std::fs::symlink_metadata(&at).is_ok_and(|m| m.file_type().is_symlink()) {
            return Err(std::io::Error::other(format!(
                "{} is a symbolic link; metash writes no file through one",
                at.display()
            )));
        }
    }
    if let Some(parent) = at.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(&at, content)
}

#[cfg(unix)]
fn c_name(name: &std::ffi::OsStr) -> std::io::Result<std::ffi::CString> {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(name.as_bytes()).map_err(std::io::Error::other)
}

/// `openat(dir, name, flags | O_NOFOLLOW | O_CLOEXEC)`.
#[cfg(unix)]
fn open_at(
    dir: std::os::fd::RawFd,
    name: &std::ffi::OsStr,
    flags: libc::c_int,
) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    let c = c_name(name)?;
    let flags = flags | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    let mode: libc::c_uint = 0o666;
    // SAFETY: a NUL-terminated name; `dir` is AT_FDCWD or an fd this function returned.
    let fd = unsafe { libc::openat(dir, c.as_ptr(), flags, mode) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh fd nobody else owns.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

/// An `openat` that met a symbolic link (`ELOOP`) or a non-directory says so.
#[cfg(unix)]
fn no_link(name: &std::ffi::OsStr, e: std::io::Error) -> std::io::Error {
    match e.raw_os_error() {
        Some(libc::ELOOP) | Some(libc::ENOTDIR) => std::io::Error::other(format!(
            "{} is a symbolic link or not a directory; metash writes no file through one",
            name.to_string_lossy()
        )),
        _ => e,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A model executor's `files` reply cannot write through a symlink in the worktree (into
    /// `.meta/` two levels up, or anywhere), nor name `..`, `.git` or `.meta` in any spelling.
    #[cfg(unix)]
    #[test]
    fn files_are_never_written_through_a_link_or_out_of_the_worktree() {
        let project = tempfile::tempdir().unwrap();
        let meta = project.path().join(".meta");
        let wt = meta.join("worktrees/t1");
        std::fs::create_dir_all(wt.join("sub")).unwrap();
        std::fs::write(meta.join("consent.json"), "{}").unwrap();
        std::os::unix::fs::symlink("../..", wt.join("up")).unwrap();
        std::os::unix::fs::symlink("../../consent.json", wt.join("grants")).unwrap();
        std::os::unix::fs::symlink("../../..", wt.join("sub/deep")).unwrap();
        let reply = |path: &str| {
            serde_json::json!({"files": [{"path": path, "content": "forged"}]}).to_string()
        };
        for bad in [
            "up/consent.json",
            "grants",
            "sub/deep/.meta/consent.json",
            "sub/deep/x",
            "../../consent.json",
            ".meta/x",
            ".META/policy.toml",
            "src/.Meta/x",
            ".met\u{200c}a/x",
            ".git/config",
            ".GIT/config",
            "/etc/x",
        ] {
            let err = apply_files(&wt, &reply(bad)).unwrap_err();
            assert!(
                err.contains(bad.trim_start_matches('/')) || err.contains("link"),
                "{bad}: {err}"
            );
        }
        assert_eq!(
            std::fs::read_to_string(meta.join("consent.json")).unwrap(),
            "{}"
        );
        assert!(!project.path().join("x").exists());
        apply_files(&wt, &reply("src/new/file.txt")).unwrap();
        assert_eq!(
            std::fs::read_to_string(wt.join("src/new/file.txt")).unwrap(),
            "forged"
        );
        // A FIFO where the file goes is refused, not waited on.
        let fifo = std::ffi::CString::new(wt.join("pipe").to_string_lossy().as_bytes()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
        let err = apply_files(&wt, &reply("pipe")).unwrap_err();
        assert!(err.contains("pipe"), "{err}");
    }

    #[test]
    fn plain_fenced_and_embedded() {
        assert_eq!(extract_json(r#"{"a":1}"#).unwrap()["a"], 1);
        assert_eq!(
            extract_json("Here is the plan:\n```json\n{\"a\":2}\n```\nDone.").unwrap()["a"],
            2
        );
        assert_eq!(
            extract_json("sure! {\"a\":3} hope it helps").unwrap()["a"],
            3
        );
        assert!(extract_json("no json here").is_err());
    }
}
