//! Reading an interactive CLI's continuation key from its own state, for a control plane that
//! hosts the CLI in a terminal and so never parses its output (seed 003: the key belongs to the
//! CP session, typed by provider). Claude Code's key is fixed up front (`--session-id`); Codex and
//! pi name their conversations themselves, in session files under the isolated home metash gave
//! them (`aspHome`), so the key is the newest such file's id.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use metash_protocol::HarnessFrontend;

/// A new conversation's key for a frontend that takes it up front (Claude Code's
/// `--session-id`, a UUID), so the control plane knows it before the CLI runs; `None` for the
/// CLIs that name their conversations themselves (read back with [`observed_key`]).
pub fn key_up_front(frontend: HarnessFrontend) -> Option<String> {
    matches!(
        frontend,
        HarnessFrontend::ClaudeCode | HarnessFrontend::AgentSdk
    )
    .then(|| uuid::Uuid::new_v4().to_string())
}

/// The key of the newest conversation `frontend` recorded under `asp_home` (laid out as
/// [`crate::materialize`] lays it out with `isolated_home`), among files changed at or after
/// `since`. `None` until the CLI has written one (Codex and pi write it at the first prompt), and
/// always for a frontend whose key is assigned up front or lives elsewhere.
pub fn observed_key(
    frontend: HarnessFrontend,
    asp_home: &Path,
    since: SystemTime,
) -> Option<String> {
    match frontend {
        HarnessFrontend::CodexCli => {
            let dir = asp_home.join("codex").join("home").join("sessions");
            let file = newest(&dir, since, |n| {
                n.starts_with("rollout-") && n.ends_with(".jsonl")
            })?;
            codex_thread_id(&file)
        }
        HarnessFrontend::PiSdk => {
            let dir = asp_home.join("pi").join("agent").join("sessions");
            let file = newest(&dir, since, |n| n.contains('_') && n.ends_with(".jsonl"))?;
            pi_session_id(&file)
        }
        HarnessFrontend::ClaudeCode | HarnessFrontend::AgentSdk => {
            let dir = asp_home
                .join("claude")
                .join("home")
                .join(".claude")
                .join("projects");
            let file = newest(&dir, since, |n| n.ends_with(".jsonl"))?;
            let stem = file.file_stem()?.to_string_lossy().into_owned();
            uuid::Uuid::parse_str(&stem).ok().map(|_| stem)
        }
        _ => None,
    }
}

/// Codex's thread id: `session_meta.payload.id` on the rollout's first line, else the uuid that
/// ends its name (`rollout-<time>-<uuid>.jsonl`).
fn codex_thread_id(file: &Path) -> Option<String> {
    let first = std::fs::read_to_string(file)
        .ok()
        .and_then(|t| t.lines().next().map(str::to_string));
    if let Some(v) = first.and_then(|l| serde_json::from_str::<serde_json::Value>(&l).ok()) {
        if let Some(id) = v["payload"]["id"].as_str() {
            return Some(id.to_string());
        }
    }
    let name = file.file_name()?.to_string_lossy().into_owned();
    let stem = name.strip_suffix(".jsonl")?;
    let tail = stem.get(stem.len().checked_sub(36)?..)?;
    uuid::Uuid::parse_str(tail).ok().map(|_| tail.to_string())
}

/// pi's session id: what follows the last `_` of `<timestamp>_<id>.jsonl` (how
/// [`crate::frontend`]'s pi resume finds the file again).
fn pi_session_id(file: &Path) -> Option<String> {
    let name = file.file_name()?.to_string_lossy().into_owned();
    let stem = name.strip_suffix(".jsonl")?;
    let id = stem.rsplit_once('_')?.1;
    (!id.is_empty()).then(|| id.to_string())
}

/// The most recently modified file under `root` (any depth) whose name `matches`, changed at or
/// after `since`.
fn newest(root: &Path, since: SystemTime, matches: impl Fn(&str) -> bool) -> Option<PathBuf> {
    let mut best: Option<(SystemTime, PathBuf)> = None;
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            let Ok(meta) = e.metadata() else { continue };
            if meta.is_dir() {
                stack.push(p);
                continue;
            }
            let named = p.file_name().is_some_and(|n| matches(&n.to_string_lossy()));
            let Ok(mtime) = meta.modified() else { continue };
            if named && mtime >= since && best.as_ref().is_none_or(|(t, _)| mtime > *t) {
                best = Some((mtime, p));
            }
        }
    }
    best.map(|(_, p)| p)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn codex_and_pi_keys_are_read_from_their_session_files() {
        let asp = tempfile::tempdir().unwrap();
        let t0 = SystemTime::UNIX_EPOCH;
        assert_eq!(
            observed_key(HarnessFrontend::CodexCli, asp.path(), t0),
            None
        );
        let day = asp.path().join("codex/home/sessions/2026/11/27");
        std::fs::create_dir_all(&day).unwrap();
        let id = "0199a000-0000-7000-8000-00000000abcd";
        std::fs::write(
            day.join(format!("rollout-2026-11-27T05-00-00-{id}.jsonl")),
            format!("{{\"type\":\"session_meta\",\"payload\":{{\"id\":\"{id}\"}}}}\n"),
        )
        .unwrap();
        assert_eq!(
            observed_key(HarnessFrontend::CodexCli, asp.path(), t0).as_deref(),
            Some(id)
        );
        let pi = asp.path().join("pi/agent/sessions/--w--");
        std::fs::create_dir_all(&pi).unwrap();
        std::fs::write(pi.join("2026-11-27T05-00-00-000Z_abc-123.jsonl"), "{}\n").unwrap();
        assert_eq!(
            observed_key(HarnessFrontend::PiSdk, asp.path(), t0).as_deref(),
            Some("abc-123")
        );
        // Files older than the session's start are another conversation's.
        let later = SystemTime::now() + std::time::Duration::from_secs(3600);
        assert_eq!(
            observed_key(HarnessFrontend::PiSdk, asp.path(), later),
            None
        );
    }

    #[test]
    fn a_codex_rollout_without_meta_gives_the_uuid_of_its_name() {
        let d = tempfile::tempdir().unwrap();
        let id = "0199a000-0000-7000-8000-00000000abcd";
        let f = d
            .path()
            .join(format!("rollout-2026-11-27T05-00-00-{id}.jsonl"));
        std::fs::write(&f, "not json\n").unwrap();
        assert_eq!(codex_thread_id(&f).as_deref(), Some(id));
    }
}
