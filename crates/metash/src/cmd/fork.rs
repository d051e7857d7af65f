//! `metash fork --at SEQ [--into DIR]` (issue 36 item 3, docs/replay.md "Fork"): a new session
//! whose state, plan and grants are the log's up to record SEQ, in a project of its own: a git
//! clone of the project with its checked-out branch at the commit it was at when SEQ was written,
//! the task branches of that moment, and a `.meta/` whose log is the original's first SEQ records
//! then a `fork` record. `metash run` there continues live from that point.
//!
//! Why a clone and not a worktree of the same repository: a clone has branches of its own (the
//! orchestrator's `metash/task/<id>` names cannot collide with the original's, which may still be
//! running), its own `.git` (which the orchestrator's git trust and worktree code expect), and
//! nothing is written into the original's `.git` (a linked worktree writes its admin directory
//! there). A local clone links git's object files rather than copying them, and takes every
//! object, so a task commit no branch names any more is there too.
//!
//! The original is only read: its log through [`metash_store::fork::read_prefix`], its
//! repository by `git clone`; its `.meta/` and refs are never written.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};

use anyhow::{bail, Context, Result};
use clap::Subcommand;
use metash_orchestrator::git::{trust, Git};
use metash_orchestrator::{branch_of, Book};
use metash_policy::consent::{ConsentDoc, Grant};
use metash_policy::Capability;
use metash_protocol::{sanitize_line, LogKind, LogRecord, SessionState};
use metash_store::fork::{self, ForkSpec, Prefix};
use serde_json::{json, Value};

use super::Ctx;

#[derive(Debug, Subcommand)]
pub enum ForkCommand {
    /// Start a new session from this one's log up to record SEQ, in a clone of the project at
    /// the commit its branch was at then; `metash run` there continues live. The original is
    /// only read.
    Fork {
        /// The record to fork at (`metash log tail` shows each record's seq): the fork's state,
        /// plan and grants are the log's up to and including it.
        #[arg(long, value_name = "SEQ")]
        at: u64,
        /// Where the fork goes (absent or empty); default `<project>-fork-<SEQ>` beside the
        /// project. A relative path is taken from the current directory.
        #[arg(long, value_name = "DIR")]
        into: Option<PathBuf>,
    },
}

/// Where the fork's checkout starts and why, and the task branches it gets.
#[derive(Debug)]
struct GitPlan {
    /// The commit; `None`: the original's checked-out commit now (nothing recorded says more).
    main: Option<String>,
    /// What recorded it, for people and the `fork` record.
    main_from: String,
    /// `task id -> commit` for every task whose branch metash had made and not yet landed.
    branches: BTreeMap<String, String>,
}

pub fn run(cmd: ForkCommand, ctx: &Ctx) -> Result<ExitCode> {
    let ForkCommand::Fork { at, into } = cmd;
    let origin = ctx
        .workspace
        .canonicalize()
        .with_context(|| format!("the project {}", ctx.workspace.display()))?;
    let prefix = fork::read_prefix(&origin, at).with_context(|| format!("--at {at}"))?;
    let state = prefix
        .state()
        .with_context(|| format!("--at {at}: the session at that record"))?;
    let into = target(&origin, at, into)?;
    let plan = git_plan(&origin, &prefix, &state)?;
    let existed = into.exists();
    let made = make(&origin, &into, &prefix, state.clone(), &plan);
    let (session_id, main) = match made {
        Ok(v) => v,
        Err(e) => {
            // Leave nothing half made: the directory is ours only if we created it.
            if existed {
                remove_contents(&into);
            } else {
                let _ = std::fs::remove_dir_all(&into);
            }
            return Err(e);
        }
    };
    let out = json!({
        "fork": into, "session_id": session_id, "origin": origin,
        "origin_session_id": state.session_id, "seq": at, "hash": prefix.hash(),
        "main": main, "main_from": plan.main_from, "branches": plan.branches,
    });
    print(ctx, &out);
    Ok(ExitCode::SUCCESS)
}

/// The fork's directory: `into` (from the current directory) or `<project>-fork-<SEQ>` beside
/// the project (`-2`, `-3`... when taken). It must be absent or empty, and outside the project.
fn target(origin: &Path, at: u64, into: Option<PathBuf>) -> Result<PathBuf> {
    let dir = match into {
        Some(d) => std::path::absolute(&d).with_context(|| format!("--into {}", d.display()))?,
        None => {
            let parent = origin.parent().unwrap_or(origin);
            let name = origin
                .file_name()
                .map_or("project".into(), |n| n.to_string_lossy().into_owned());
            let base = format!("{name}-fork-{at}");
            (1..1000)
                .map(|i| match i {
                    1 => parent.join(&base),
                    n => parent.join(format!("{base}-{n}")),
                })
                .find(|p| !p.exists())
                .context("no free directory name beside the project: give --into DIR")?
        }
    };
    // The parent as the file system names it (no `..`, no link), so the check below sees where
    // the fork really goes and the path printed is plain.
    let (Some(parent), Some(name)) = (dir.parent(), dir.file_name()) else {
        bail!("--into {}: not a directory a fork can go to", dir.display());
    };
    let Ok(parent) = parent.canonicalize() else {
        bail!(
            "--into {}: its parent directory does not exist",
            dir.display()
        );
    };
    let resolved = parent.join(name);
    if resolved.starts_with(origin) {
        bail!(
            "--into {}: inside the project; a fork is a project of its own, beside it",
            dir.display()
        );
    }
    if resolved.exists() {
        let empty = std::fs::read_dir(&resolved).map(|mut d| d.next().is_none());
        if !matches!(empty, Ok(true)) {
            bail!(
                "--into {}: exists and is not an empty directory",
                dir.display()
            );
        }
    }
    Ok(resolved)
}

/// The clone, its checkout and branches, then the fork's `.meta/` and grants, then its git
/// trust record. Returns the new session id and the commit the checkout is at.
fn make(
    origin: &Path,
    into: &Path,
    prefix: &Prefix,
    state: SessionState,
    plan: &GitPlan,
) -> Result<(String, String)> {
    clone(origin, into)?;
    let git = Git::new(into);
    let main = match &plan.main {
        Some(sha) => present(&git, into, sha, &plan.main_from)?,
        None => git.head(into)?,
    };
    git.run(into, &["reset", "--hard", "-q", &main])?;
    for (id, sha) in &plan.branches {
        let sha = present(&git, into, sha, &format!("task {id}'s recorded branch"))?;
        git.run(into, &["branch", "-f", &branch_of(id), &sha])?;
    }
    let context_path = origin.join(".meta").join("context.md");
    let context = std::fs::read_to_string(&context_path)
        .with_context(|| format!("reading {}", context_path.display()))?;
    let data = json!({
        "origin": {
            "workspace": origin, "session_id": state.session_id,
            "seq": prefix.seq(), "hash": prefix.hash(),
        },
        "main": main, "main_from": plan.main_from, "branches": plan.branches,
    });
    let spec = ForkSpec {
        state,
        context,
        data,
    };
    let (store, session_id) = fork::create(into, &origin.join(".meta"), prefix, spec)?;
    let grants = serde_json::to_value(grants_at(&prefix.records))?;
    fork::write_view(&store, metash_policy::consent::CONSENT_DOC, &grants)?;
    // As `metash init` does: the clone's executable git configuration (git's defaults, no
    // hooks) recorded as trusted, and said in the fork's log.
    if let Some(snap) = trust::record_if_absent(into)? {
        let listed = trust::Snapshot::default().changes_to(&snap);
        store.append(
            LogKind::GitTrust,
            None,
            trust::event("recorded", &listed, "fork"),
        )?;
    }
    Ok((session_id, main))
}

/// The full id of `sha` in the fork's repository, or why it is missing.
fn present(git: &Git, dir: &Path, sha: &str, what: &str) -> Result<String> {
    // Only a commit id: never a revision expression or anything git could read as an option.
    if !(sha.len() == 40 || sha.len() == 64) || !sha.bytes().all(|b| b.is_ascii_hexdigit()) {
        bail!(
            "the log records `{}` as {}: not a commit id",
            sanitize_line(sha),
            sanitize_line(what)
        );
    }
    git.resolve(dir, sha)?.with_context(|| {
        format!(
            "commit {} ({}) is not in the project's repository any more; it cannot be forked at \
             that record",
            sanitize_line(sha),
            sanitize_line(what)
        )
    })
}

/// `git clone --no-checkout` of the project into `into`, with the same guards as every git
/// metash runs (no hooks, no fs monitor, no prompt). Reads the original's `.git` only.
fn clone(origin: &Path, into: &Path) -> Result<()> {
    let out = Command::new("git")
        .args([
            "-c",
            "core.hooksPath=/dev/null",
            "-c",
            "core.fsmonitor=false",
        ])
        .args(["clone", "--quiet", "--no-checkout", "--"])
        .arg(origin)
        .arg(into)
        .env("GIT_TERMINAL_PROMPT", "0")
        .stdin(Stdio::null())
        .output()
        .context("cannot run git (is git installed?)")?;
    if !out.status.success() {
        bail!(
            "git clone {} {}: {}",
            origin.display(),
            into.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Removes what a failed fork wrote into a directory that was empty before.
fn remove_contents(dir: &Path) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = entry.path();
        let _ = if p.is_dir() && !p.is_symlink() {
            std::fs::remove_dir_all(&p)
        } else {
            std::fs::remove_file(&p)
        };
    }
}

/// Where the project's branch was at the fork point, from what the log recorded, and the task
/// branches to make. The last of these, in log order, says where the branch was: a task landing
/// (`merged.<id>`, the branch's commit after the merge), a task brought up to date
/// (`queue.<id>.main`), a task without dependencies branching (`branches.<id>.base`, made at the
/// branch's commit). With none up to SEQ, the first after it (the branch had not moved by
/// metash since); with none at all, the commit checked out now.
fn git_plan(origin: &Path, prefix: &Prefix, state: &SessionState) -> Result<GitPlan> {
    let whole = fork::read_whole(origin)?;
    let free = free_tasks(&whole.state().unwrap_or_else(|_| state.clone()), state);
    let found = prefix
        .records
        .iter()
        .rev()
        .find_map(|r| evidence(r, &free).pop())
        .or_else(|| {
            let after = whole.records.get(prefix.records.len()..).unwrap_or(&[]);
            after
                .iter()
                .find_map(|r| evidence(r, &free).into_iter().find(|e| e.2 != "landed"))
        });
    let (main, main_from) = match found {
        Some((sha, id, how, seq)) => (Some(sha), format!("{how} (task {id}, record {seq})")),
        None => (
            None,
            "the project's checked-out commit (no task recorded one)".into(),
        ),
    };
    let book = Book::of(state);
    let branches = book
        .branches
        .iter()
        .filter(|(id, _)| book.merged_at(id).is_none())
        .filter_map(|(id, rec)| {
            let rec = rec.as_ref()?;
            let tip = rec.tips.last().unwrap_or(&rec.base);
            Some((id.clone(), tip.clone()))
        })
        .collect();
    Ok(GitPlan {
        main,
        main_from,
        branches,
    })
}

/// Ids of the tasks with no dependencies in either session (a task's dependencies never change).
fn free_tasks(whole: &SessionState, at: &SessionState) -> Vec<String> {
    [whole, at]
        .iter()
        .filter_map(|s| s.plan.as_ref())
        .flat_map(|p| p.tasks.iter())
        .filter(|t| t.dependencies.is_empty())
        .map(|t| t.id.clone())
        .collect()
}

/// `(commit, task, how, seq)` for each update of `rec` that says where the project's branch
/// was, in the record's order.
fn evidence(rec: &LogRecord, free: &[String]) -> Vec<(String, String, &'static str, u64)> {
    if rec.kind != LogKind::StateUpdate {
        return Vec::new();
    }
    let single = [rec.data.clone()];
    let updates = rec
        .data
        .get("updates")
        .and_then(Value::as_array)
        .map_or(&single[..], Vec::as_slice);
    let mut out = Vec::new();
    for u in updates {
        let (Some(key), Some(value)) = (u.get("key").and_then(Value::as_str), u.get("value"))
        else {
            continue;
        };
        let Some(rest) = key.strip_prefix("variables.metash.") else {
            continue;
        };
        let Some((entry, id)) = rest.split_once('.') else {
            continue;
        };
        let (sha, how) = match entry {
            "merged" => (value.as_str(), "landed"),
            "queue" => (value.get("main").and_then(Value::as_str), "updated"),
            "branches" if free.iter().any(|f| f == id) && being_made(value) => {
                (value.get("base").and_then(Value::as_str), "branched")
            }
            _ => (None, ""),
        };
        if let Some(sha) = sha.filter(|s| !s.is_empty()) {
            out.push((sha.to_string(), id.to_string(), how, rec.seq));
        }
    }
    out
}

/// Whether a branch record is that of a branch being made (`BranchRecord::at`: its only tip is
/// its base), not one a later update moved on from an older base.
fn being_made(record: &Value) -> bool {
    let base = record.get("base");
    match record.get("tips").and_then(Value::as_array) {
        Some(tips) => tips.is_empty() || (tips.len() == 1 && tips.first() == base),
        None => true,
    }
}

/// The consent grants as the `consent_grant` and `consent_revoke` records in `records` left
/// them: what `.meta/consent.json` held after the last of them (metash_policy::consent writes
/// the same document, record by record). Expiry is judged at use, as always.
fn grants_at(records: &[LogRecord]) -> ConsentDoc {
    let mut doc = ConsentDoc {
        version: 1,
        ..ConsentDoc::default()
    };
    for rec in records {
        let Some(agent) = rec.agent.as_deref() else {
            continue;
        };
        let Some(cap) = rec
            .data
            .get("capability")
            .and_then(|c| serde_json::from_value::<Capability>(c.clone()).ok())
        else {
            continue;
        };
        let str_of = |k: &str| rec.data.get(k).and_then(Value::as_str).unwrap_or_default();
        match rec.kind {
            LogKind::ConsentGrant => {
                let expires_at = str_of("expires_at").to_string();
                let duration_s = rec
                    .data
                    .get("duration_s")
                    .and_then(Value::as_u64)
                    .unwrap_or(0);
                doc.fold_grant(Grant {
                    agent: agent.to_string(),
                    capability: cap,
                    granted_at: granted_at(&expires_at, duration_s).unwrap_or(rec.ts.clone()),
                    expires_at,
                    duration_s,
                    sensitive: rec.data.get("sensitive").and_then(Value::as_bool) == Some(true),
                    source: str_of("source").to_string(),
                    revoked_at: None,
                    seq: 0,
                });
            }
            LogKind::ConsentRevoke => {
                doc.fold_revoke(agent, &cap, &rec.ts, str_of("source"));
            }
            _ => {}
        }
    }
    doc
}

/// When a grant was made: its expiry less its duration, exactly as `metash_policy::consent`
/// computed the expiry (the record's own time is a moment later).
fn granted_at(expires_at: &str, duration_s: u64) -> Option<String> {
    let expires = metash_policy::clock::parse_rfc3339(expires_at)?;
    let duration = chrono::Duration::try_seconds(i64::try_from(duration_s).ok()?)?;
    Some(metash_policy::clock::rfc3339(
        expires.checked_sub_signed(duration)?,
    ))
}

fn print(ctx: &Ctx, out: &Value) {
    if ctx.json {
        println!("{out}");
        return;
    }
    let s = |k: &str| out[k].as_str().map(sanitize_line).unwrap_or_default();
    println!(
        "forked {} at record {} into {}",
        s("origin"),
        out["seq"],
        s("fork")
    );
    println!(
        "  session   {} (from {})",
        s("session_id"),
        s("origin_session_id")
    );
    println!("  checkout  {} ({})", s("main"), s("main_from"));
    if let Some(b) = out["branches"].as_object() {
        for (id, sha) in b {
            let sha = sha.as_str().unwrap_or_default();
            println!(
                "  branch    {} at {}",
                sanitize_line(&branch_of(id)),
                sanitize_line(sha)
            );
        }
    }
    println!("continue with: metash -C {} run", s("fork"));
}
