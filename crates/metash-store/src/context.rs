//! `.meta/context.md`: the project's vision, what every agent and run reads. Its hash is
//! recorded at init and checked by every later open, so an edit made behind metash's back is
//! noticed before anything acts on it; the owner changes it on purpose with
//! [`crate::Store::set_context`] (`metash context edit|set`), recorded in the log.

use sha2::{Digest, Sha256};

/// The template `metash init` writes when no context file is given: the seed's sections.
pub const TEMPLATE: &str = "# Project: <name>

## Vision

<What is being built, for whom, and why.>

## Tech Stack

- Language:
- Storage:
- UI:

## Architecture Constraints

1.  **<Constraint>**: <what it rules in or out>.

## Current Phase Focus

Phase 1: <the first milestone>.
";

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// `.meta/.gitignore`, written by `init`: metash's runtime state (the log, locks, the session
/// view, KV, artifacts, caches, worktrees, grants) stays out of git; what a person writes and may
/// share (the context, the config, the policy, project agents, prompts) can be committed.
pub(crate) const GITIGNORE: &str =
    "# metash: runtime state is not for git; what you write here can be committed.
*
!.gitignore
!context.md
!config.toml
!policy.toml
!agents/
!agents/**
!prompts/
!prompts/**
";

/// Writes [`GITIGNORE`] into `meta` unless the project has its own.
pub(crate) fn write_gitignore(meta: &std::path::Path) -> crate::Result<()> {
    let ignore = meta.join(".gitignore");
    if ignore.exists() {
        return Ok(());
    }
    crate::atomic::write_atomic(&ignore, GITIGNORE.as_bytes())
}

/// The run lock's file in `.meta/`: held by `metash run` and `metash rollback` for their whole
/// duration (the orchestrator takes it); the context is never changed under a run.
pub const RUN_LOCK: &str = "run.lock";

/// Placeholders of [`TEMPLATE`] that a context written by its owner no longer holds: a run on a
/// context that still has them would plan from nothing.
const PLACEHOLDERS: &[&str] = &[
    "<name>",
    "<What is being built, for whom, and why.>",
    "<Constraint>",
    "<the first milestone>",
];

/// The template's placeholders still in `text`, in the template's order.
pub fn placeholders_in(text: &str) -> Vec<&'static str> {
    PLACEHOLDERS
        .iter()
        .copied()
        .filter(|p| text.contains(p))
        .collect()
}

/// What a context change did: the hashes before and after and a unified line diff.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ContextChange {
    pub old_sha256: String,
    pub new_sha256: String,
    pub diff: String,
}

/// The longest files diffed line by line (the table is `old × new` lines); past it the log
/// records the hashes and says the diff was left out.
const MAX_DIFF_LINES: usize = 4_000;

/// A unified-style line diff of `old` to `new` (` `, `-`, `+` prefixes, no hunks: a context file
/// is short, and the log keeps every line).
pub fn line_diff(old: &str, new: &str) -> String {
    let (a, b): (Vec<&str>, Vec<&str>) = (old.lines().collect(), new.lines().collect());
    if a.len() > MAX_DIFF_LINES || b.len() > MAX_DIFF_LINES {
        return format!(
            "(no diff: {} and {} lines, more than {MAX_DIFF_LINES})\n",
            a.len(),
            b.len()
        );
    }
    // lcs[i][j]: the longest common subsequence of a[i..] and b[j..].
    let mut lcs = vec![vec![0u32; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i][j] = if a[i] == b[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    let (mut i, mut j, mut out) = (0, 0, String::new());
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            out.push_str(&format!(" {}\n", a[i]));
            (i, j) = (i + 1, j + 1);
        } else if j < b.len() && (i == a.len() || lcs[i][j + 1] >= lcs[i + 1][j]) {
            out.push_str(&format!("+{}\n", b[j]));
            j += 1;
        } else {
            out.push_str(&format!("-{}\n", a[i]));
            i += 1;
        }
    }
    out
}

impl crate::Store {
    /// Installs `new` as the project's context: the owner's explicit change (`metash context
    /// set|edit`), never an agent's (no agent reaches `.meta/`). Refused while a run holds the
    /// run lock, and when context.md was changed behind metash's back (that change is still an
    /// error to restore, not something to build on). The change is logged (`context_changed`:
    /// both hashes and the diff) in the same lock as the file and store.json are written, so the
    /// planner's next request can say what changed.
    ///
    /// # Errors
    /// [`crate::StoreError::Busy`] while a run is in progress, [`crate::StoreError::ContextChanged`],
    /// a store on a server (not supported yet), I/O errors.
    pub fn set_context(&self, new: &str) -> crate::Result<ContextChange> {
        if self.pg.is_some() {
            return Err(crate::StoreError::Rejected(
                "changing the context of a project whose store is on PostgreSQL is not supported \
                 yet"
                .into(),
            ));
        }
        let run_lock = self.meta.join(RUN_LOCK);
        let _run =
            crate::lock::acquire(&run_lock, std::time::Duration::ZERO).map_err(|e| {
                match e {
            crate::StoreError::LockTimeout { .. } => crate::StoreError::Busy(
                "a run is in progress (it holds .meta/run.lock): change the context after it stops"
                    .into(),
            ),
            other => other,
        }
            })?;
        let _guard = self.lock()?;
        self.check_context()?;
        let path = self.context_path();
        let old = std::fs::read_to_string(&path).map_err(|e| crate::StoreError::io(&path, e))?;
        let change = ContextChange {
            old_sha256: sha256_hex(old.as_bytes()),
            new_sha256: sha256_hex(new.as_bytes()),
            diff: line_diff(&old, new),
        };
        if change.old_sha256 == change.new_sha256 {
            return Ok(change);
        }
        // The log first: a crash after it leaves context.md and store.json old, and the next
        // open sees the old context (the event says what was meant; nothing acted on it).
        self.append_locked(&[crate::NewEvent::new(
            metash_protocol::LogKind::ContextChanged,
            None,
            serde_json::to_value(&change).unwrap_or_default(),
        )])?;
        // Then store.json names the new hash as coming, the file is replaced, and store.json takes
        // it: killed at any point, the next open finds context.md old or new and a hash that
        // matches it (`check_context` finishes a change whose file was written).
        self.write_context_shas(&change.old_sha256, Some(&change.new_sha256))?;
        crate::atomic::write_atomic(&path, new.as_bytes())?;
        self.write_context_shas(&change.new_sha256, None)?;
        Ok(change)
    }

    /// Rewrites store.json's context hashes (the rest kept).
    pub(crate) fn write_context_shas(&self, sha: &str, next: Option<&str>) -> crate::Result<()> {
        let path = self.meta.join("store.json");
        let mut meta: crate::StoreMeta = serde_json::from_value(
            self.read_raw_json(&path)?
                .unwrap_or(serde_json::Value::Null),
        )
        .map_err(|e| crate::StoreError::BadFile {
            path: path.clone(),
            line: 1,
            message: e.to_string(),
        })?;
        meta.context_sha256 = sha.to_string();
        meta.context_next_sha256 = next.map(str::to_string);
        self.write_raw_json(&path, &meta)
    }
}
