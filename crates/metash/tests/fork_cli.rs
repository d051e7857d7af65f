#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Issue 36 item 3 through the binary: `metash fork --at SEQ` from the middle of a recorded run
//! of the example project (WASM planner, executor, verifier; no model), run from inside the
//! project with relative paths as people run it. The fork's log starts with the original's first
//! SEQ records byte for byte, its checkout is where the project's branch was at SEQ, its grants
//! are the log's, and `metash run` there completes the project; the original's `.meta/`, refs and
//! log are byte-identical throughout and its log verifies. A SEQ of 0 or past the log's end is
//! refused naming it, and nothing is written.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_metash");

/// `metash ARGS` run in `dir`, without `-C`.
fn here(dir: &Path, args: &[&str]) -> Output {
    Command::new(BIN)
        .current_dir(dir)
        .args(args)
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn ok(dir: &Path, args: &[&str]) -> String {
    let out = here(dir, args);
    assert!(
        out.status.success(),
        "metash {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["-c", "user.name=t", "-c", "user.email=t@localhost"])
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {out:?}");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// The example project in `dir/p`, set up and granted from inside it, run to completion
/// (the planner's question answered `french`).
fn completed_example(dir: &Path) -> PathBuf {
    let ws = dir.join("p");
    std::fs::create_dir_all(&ws).unwrap();
    git(&ws, &["init", "-q"]);
    git(
        &ws,
        &["commit", "-q", "--allow-empty", "-m", "empty project"],
    );
    std::fs::write(dir.join("vision.md"), metash_testkit::greetings::context()).unwrap();
    ok(&ws, &["init", "--context", "../vision.md"]);
    metash_testkit::greetings::copy_into(&ws);
    for (agent, cap) in [
        ("executor", "files.read"),
        ("executor", "files.write"),
        ("verifier", "files.read"),
    ] {
        ok(&ws, &["consent", "grant", agent, cap]);
    }
    assert_eq!(
        here(&ws, &["run"]).status.code(),
        Some(4),
        "the planner asks"
    );
    ok(&ws, &["run", "--answer", "french"]);
    ws
}

/// Every file under `dir` (path -> bytes), symbolic links as their targets.
fn tree(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let (p, t) = (e.path(), e.file_type().unwrap());
            if t.is_dir() {
                todo.push(p);
            } else if t.is_symlink() {
                let target = std::fs::read_link(&p).unwrap();
                out.insert(p, target.to_string_lossy().as_bytes().to_vec());
            } else {
                let bytes = std::fs::read(&p).unwrap();
                out.insert(p, bytes);
            }
        }
    }
    out
}

/// What must never change in the original: its `.meta/`, its refs, its checkout's HEAD.
fn snapshot(ws: &Path) -> (BTreeMap<PathBuf, Vec<u8>>, String, String) {
    (
        tree(&ws.join(".meta")),
        git(ws, &["for-each-ref", "--format=%(refname) %(objectname)"]),
        git(ws, &["rev-parse", "HEAD"]),
    )
}

fn records(ws: &Path) -> Vec<Value> {
    std::fs::read_to_string(ws.join(".meta/events.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The first update of a `variables.metash.<entry>.<id>` key to something other than `null`:
/// its record's seq, the task's id and the value.
fn first_set(records: &[Value], entry: &str) -> (u64, String, Value) {
    let prefix = format!("variables.metash.{entry}.");
    records
        .iter()
        .filter(|r| r["kind"] == "state_update")
        .find_map(|r| {
            let updates = r["data"]["updates"].as_array()?;
            updates.iter().find_map(|u| {
                let id = u["key"].as_str()?.strip_prefix(&prefix)?;
                let seq = r["seq"].as_u64()?;
                (!u["value"].is_null()).then(|| (seq, id.to_string(), u["value"].clone()))
            })
        })
        .unwrap_or_else(|| panic!("no {entry} was set"))
}

/// The ids of the tasks complete in a `session_init` record's session.
fn complete_tasks(init: &Value) -> Vec<String> {
    assert_eq!(init["kind"], "session_init", "{init}");
    init["data"]["plan"]["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["status"] == "complete")
        .map(|t| t["id"].as_str().unwrap().to_string())
        .collect()
}

/// Executor spawns for task `id` among `records`.
fn executor_turns(records: &[Value], id: &str) -> usize {
    records
        .iter()
        .filter(|r| r["kind"] == "spawn" && r["agent"] == "executor" && r["data"]["task_id"] == id)
        .count()
}

#[test]
fn a_fork_from_the_middle_of_a_run_completes_and_leaves_the_original_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let ws = completed_example(dir.path());
    let original = records(&ws);
    // The first task landing: `merged.<id>` is the commit the project's branch was at after it.
    let (at, landed, landed_at) = first_set(&original, "merged");
    let landed_at = landed_at.as_str().unwrap().to_string();
    assert!(at < original.len() as u64 - 1, "the landing is mid-run");
    let before = snapshot(&ws);

    // From inside the project, into a directory named relative to it.
    let shown = ok(&ws, &["fork", "--at", &at.to_string(), "--into", "../f"]);
    let fork = dir.path().join("f");
    let plain = fork.canonicalize().unwrap();
    assert!(
        shown.contains(&format!("metash -C {} run", plain.display())),
        "{shown}"
    );
    assert_eq!(snapshot(&ws), before, "the fork wrote into the original");
    assert!(ok(&ws, &["log", "verify"]).contains(&original.len().to_string()));

    // The log: the original's first `at` records byte for byte, then the fork record.
    let text = std::fs::read_to_string(ws.join(".meta/events.jsonl")).unwrap();
    let forked = std::fs::read_to_string(fork.join(".meta/events.jsonl")).unwrap();
    let n: usize = text.lines().take(at as usize).map(|l| l.len() + 1).sum();
    assert_eq!(&forked[..n], &text[..n]);
    let fork_records = records(&fork);
    let mark = &fork_records[at as usize];
    assert_eq!(mark["kind"], "fork", "{mark}");
    assert_eq!(mark["data"]["origin"]["seq"], at);
    assert_eq!(
        mark["data"]["origin"]["hash"],
        original[at as usize - 1]["hash"]
    );
    assert_ne!(mark["data"]["session_id"], original[0]["data"]["sessionId"]);

    // The checkout is where the project's branch was after the first landing; the grants are
    // the three the log holds.
    assert_eq!(git(&fork, &["rev-parse", "HEAD"]), landed_at);
    // No grant changed after SEQ here: the fork's grants are the original's document exactly.
    let consent = |ws: &Path| -> Value {
        serde_json::from_slice(&std::fs::read(ws.join(".meta/consent.json")).unwrap()).unwrap()
    };
    assert_eq!(
        consent(&fork)["data"]["grants"].as_array().unwrap().len(),
        3
    );
    assert_eq!(consent(&fork), consent(&ws));

    // Its git trust was recorded when it was made.
    assert!(fork.join(".meta/git-trust.json").is_file());
    assert!(records(&fork).iter().any(|r| r["kind"] == "git_trust"));

    // It continues live from there, to the end.
    let out = here(&fork, &["run"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains("had no record yet"), "{stderr}");
    assert!(stderr.contains("the project is complete"), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(fork.join("bye.txt"))
            .unwrap()
            .trim(),
        "Au revoir !"
    );
    for f in ["hello.txt", "README.md", "shout.txt"] {
        assert!(fork.join(f).is_file(), "{f} is not in the fork's checkout");
        assert!(
            !git(&fork, &["log", "--oneline", "--", f]).is_empty(),
            "{f} committed"
        );
    }
    let after_fork = &records(&fork)[at as usize..];
    assert_eq!(
        executor_turns(after_fork, &landed),
        0,
        "{landed} landed before the fork"
    );
    // Tasks complete but not landed at SEQ land from the branches the fork recreated, unrun.
    let complete = complete_tasks(&after_fork[1]);
    assert!(complete.len() > 1, "{complete:?}");
    for id in &complete {
        assert_eq!(
            executor_turns(after_fork, id),
            0,
            "{id} was complete at the fork"
        );
    }
    assert!(
        executor_turns(after_fork, "shout") >= 1,
        "phase 2 ran in the fork"
    );
    ok(&fork, &["log", "verify"]);
    let status: Value = serde_json::from_str(&ok(&fork, &["--json", "status"])).unwrap();
    assert_eq!(status["halt"]["reason"], "complete", "{status}");

    // The original is still exactly as it was, and its log verifies.
    assert_eq!(
        snapshot(&ws),
        before,
        "the fork's run wrote into the original"
    );
    ok(&ws, &["log", "verify"]);
}

/// Forked while the first task's executor was running (default directory, beside the
/// project): that task is retried in the fork, on a branch at its recorded base, and the fork
/// completes; the original is untouched.
#[test]
fn a_fork_while_a_task_runs_retries_it_in_the_fork_and_completes() {
    let dir = tempfile::tempdir().unwrap();
    let ws = completed_example(dir.path());
    let original = records(&ws);
    let (at, running, _) = first_set(&original, "running");
    let before = snapshot(&ws);
    let out: Value =
        serde_json::from_str(&ok(&ws, &["--json", "fork", "--at", &at.to_string()])).unwrap();
    let fork = dir.path().join(format!("p-fork-{at}"));
    assert_eq!(
        out["fork"].as_str().map(PathBuf::from),
        Some(fork.clone()),
        "{out}"
    );
    assert_eq!(
        out["main_from"].as_str().map(|s| s.starts_with("branched")),
        Some(true)
    );
    let base = out["branches"][&running].as_str().unwrap().to_string();
    assert_eq!(
        git(&fork, &["rev-parse", &format!("metash/task/{running}")]),
        base
    );
    assert_eq!(
        git(&fork, &["rev-parse", "HEAD"]),
        base,
        "a free task branches at HEAD"
    );
    ok(&fork, &["run"]);
    let after_fork = &records(&fork)[at as usize..];
    assert!(
        executor_turns(after_fork, &running) >= 1,
        "{running} ran again in the fork"
    );
    for f in ["hello.txt", "bye.txt", "README.md", "shout.txt"] {
        assert!(
            !git(&fork, &["log", "--oneline", "--", f]).is_empty(),
            "{f} committed"
        );
    }
    assert_eq!(snapshot(&ws), before, "the fork wrote into the original");
    ok(&ws, &["log", "verify"]);
}

#[test]
fn a_seq_of_zero_or_past_the_end_is_refused_naming_it_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("p");
    std::fs::create_dir_all(&ws).unwrap();
    git(&ws, &["init", "-q"]);
    git(
        &ws,
        &["commit", "-q", "--allow-empty", "-m", "empty project"],
    );
    ok(&ws, &["init"]);
    ok(&ws, &["state", "set", "variables.x", "1"]);
    let last = records(&ws).len() as u64;
    let listing = || {
        std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect::<Vec<_>>()
    };
    let (before, entries) = (snapshot(&ws), listing());
    for (at, says) in [
        (0, "seq 0 is not a record".to_string()),
        (last + 1, format!("its last record is {last}")),
    ] {
        let out = here(&ws, &["fork", "--at", &at.to_string()]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains(&format!("--at {at}")), "{stderr}");
        assert!(stderr.contains(&says), "{stderr}");
        assert_eq!(listing(), entries, "a directory was made");
        assert_eq!(snapshot(&ws), before, "the original was written");
    }
    // Into the project itself: refused too.
    let out = here(&ws, &["fork", "--at", "1", "--into", "inside"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("inside the project"));
    assert!(!ws.join("inside").exists());
    assert_eq!(snapshot(&ws), before);
}

/// A project that never ran, with a grant revoked and one given again: forked at its last
/// record, the fork's grants are the original's document exactly (revocations folded as
/// `metash consent` writes them), and its checkout is the commit checked out (no task recorded
/// one).
#[test]
fn grants_and_revocations_fold_into_the_forks_grants() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("p");
    std::fs::create_dir_all(&ws).unwrap();
    git(&ws, &["init", "-q"]);
    git(
        &ws,
        &["commit", "-q", "--allow-empty", "-m", "empty project"],
    );
    std::fs::write(
        dir.path().join("vision.md"),
        metash_testkit::greetings::context(),
    )
    .unwrap();
    ok(&ws, &["init", "--context", "../vision.md"]);
    metash_testkit::greetings::copy_into(&ws);
    for args in [
        ["grant", "executor", "files.read"],
        ["grant", "executor", "files.write"],
        ["revoke", "executor", "files.write"],
        ["grant", "verifier", "files.read"],
        ["revoke", "verifier", "files.read"],
        ["grant", "verifier", "files.read"],
        ["revoke", "executor", "files.read"],
    ] {
        ok(&ws, &[&["consent"][..], &args[..]].concat());
    }
    let last = records(&ws).len();
    let out: Value = serde_json::from_str(&ok(
        &ws,
        &[
            "--json",
            "fork",
            "--at",
            &last.to_string(),
            "--into",
            "../g",
        ],
    ))
    .unwrap();
    let fork = dir.path().join("g");
    let consent = |ws: &Path| -> Value {
        serde_json::from_slice(&std::fs::read(ws.join(".meta/consent.json")).unwrap()).unwrap()
    };
    let grants = consent(&ws);
    assert!(
        grants.to_string().contains("revoked_at"),
        "a revocation is in the original's grants: {grants}"
    );
    // The same, but for when a revocation happened: the record's time, a moment after the
    // document's (which the record does not hold).
    let revoked = |mut doc: Value| {
        for g in doc["data"]["grants"].as_array_mut().unwrap() {
            if let Some(at) = g.get_mut("revoked_at") {
                *at = Value::Bool(true);
            }
        }
        doc
    };
    assert_eq!(revoked(consent(&fork)), revoked(grants.clone()));
    assert_eq!(
        out["main"].as_str().unwrap(),
        git(&ws, &["rev-parse", "HEAD"])
    );
    assert!(out["branches"].as_object().unwrap().is_empty(), "{out}");
    ok(&fork, &["log", "verify"]);
}
