#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `metash replay` (issue 36, docs/replay.md): a real `metash run` of a one-task plan with one
//! CLI (pi, Codex, Claude Code) as planner, executor and verifier against a loopback model records
//! every turn; with the roles then pointing at a dead port, the model answering nothing useful
//! (and asserted never asked again) and no key in the environment, `metash replay a` runs the
//! executor's turn again from its tape in a fresh worktree and finds the task's tree identical
//! (Codex's and Claude Code's run-varying request fields masked), charging nothing to the run
//! budget and writing no tape (the live run was charged). With the executor role's model
//! changed in the config, or the recorded prompt changed, the replay stops at the first model
//! request, names it and exits non-zero. `--verify` replays the verifier's turn too and finds the
//! recorded verdict; without the verifier's tape it is refused, saying so.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use metash_testkit::anthropic::ModelServer;
use metash_testkit::cli::Cli;

const KEY: &str = "sk-replay-cli-real-key-0123456789";
const CONTEXT: &str = "# Replay\n\nA project whose one task is replayed.\n\n\
                       ## Current phase\n\nWrite a.txt.\n";
const PLAN: &str = r#"{"tasks": [{"id": "a", "title": "Write a.txt", "dependencies": []}]}"#;

fn metash(ws: &Path, args: &[&str], key: bool) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_metash"));
    cmd.arg("-C").arg(ws).args(args).stdin(Stdio::null());
    if key {
        cmd.env("METASH_TEST_CLI_KEY", KEY);
    } else {
        cmd.env_remove("METASH_TEST_CLI_KEY");
    }
    cmd.output().unwrap()
}

fn text(out: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args(["-c", "user.name=t", "-c", "user.email=t@example.com"])
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {}", text(&out));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The scripted model: the planner plans task `a`; its executor writes `a.txt` with one shell
/// call, then reports; the verifier passes. After `stopped`, every request is answered with
/// an error text (a replay must not ask).
fn model(cli: Cli, stopped: Arc<AtomicBool>) -> ModelServer {
    ModelServer::start(move |c| {
        let body = c.text();
        let pi = cli;
        if stopped.load(Ordering::SeqCst) {
            return pi.text("the model was asked after it stopped");
        }
        if body.contains("You are the planner") {
            let plan = if body.contains("Current State: Phase 1 ") {
                PLAN
            } else {
                r#"{"tasks": [], "done": true}"#
            };
            return pi.text(plan);
        }
        if body.contains("You are the verifier") {
            return pi.text(r#"{"pass": true, "findings": []}"#);
        }
        match pi.results(&body) {
            0 => pi.shell(1, &body, "printf 'replayed %s\\n' a > a.txt"),
            _ => pi.text("wrote a.txt"),
        }
    })
}

/// Why a CLI role cannot run here (its sandbox needs Landlock), if it cannot.
fn sandbox_unavailable() -> Option<String> {
    // SAFETY: the VERSION query of landlock_create_ruleset reads nothing.
    let abi = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            1u32,
        )
    };
    (abi < 1).then(|| "Landlock is not available in this kernel".to_string())
}

fn project(cli: Cli, tools: &Path, base: &str) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    let ws = d.path();
    git(ws, &["init", "-q"]);
    std::fs::write(ws.join("README.md"), "replay me\n").unwrap();
    git(ws, &["add", "README.md"]);
    git(ws, &["commit", "-q", "-m", "first"]);
    let out = metash(ws, &["init"], true);
    assert!(out.status.success(), "{}", text(&out));
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), CONTEXT).unwrap();
    let out = metash(
        ws,
        &["context", "set", &file.path().to_string_lossy()],
        true,
    );
    assert!(out.status.success(), "{}", text(&out));
    std::os::unix::fs::symlink(tools, ws.join(".tools")).unwrap();
    std::fs::write(ws.join(".git/info/exclude"), ".tools\n").unwrap();
    let mut config = String::from("[orchestrator]\nmax_gap_retries = 1\n");
    for role in ["planner", "executor", "verifier"] {
        config.push_str(&cli.role(role, base));
    }
    std::fs::write(ws.join(".meta/config.toml"), config).unwrap();
    d
}

/// A project whose one task `a` ran with `cli` as every role against a loopback model, then the
/// model stopped: the roles point at a port nobody listens on, and the loopback server (which
/// cannot be shut down) answers nothing useful and must not be asked again.
struct Recorded {
    dir: tempfile::TempDir,
    server: ModelServer,
    /// POSTs the model got while it was up.
    asked: usize,
    /// The dead base URL the roles now point at.
    dead: String,
}

impl Recorded {
    fn ws(&self) -> &Path {
        self.dir.path()
    }

    /// `metash replay a` with `args`, no key in the environment; asserts the model was not asked.
    fn replay(&self, args: &[&str]) -> (Output, String) {
        let out = metash(
            self.ws(),
            &[&["replay", "a"][..], args, &YES].concat(),
            false,
        );
        let shown = text(&out);
        assert_eq!(
            self.server.posts().len(),
            self.asked,
            "the model was asked: {shown}"
        );
        (out, shown)
    }
}

/// Whether the replay's verdict line says `identical` (a shown request body may hold the word).
fn said_identical(shown: &str) -> bool {
    shown.lines().any(|l| l == "identical")
}

const YES: [&str; 3] = ["--yes-to", "native", "--non-interactive"];

/// Runs task `a` with `cli` (None: skipped, the CLI or the sandbox missing), then stops the model.
fn recorded(cli: Cli, test: &str) -> Option<Recorded> {
    let tools = cli.installed(test)?;
    if let Some(why) = sandbox_unavailable() {
        metash_testkit::skip(test, &why);
        return None;
    }
    let stopped = Arc::new(AtomicBool::new(false));
    let server = model(cli, Arc::clone(&stopped));
    let dir = project(cli, &tools, &server.base);
    let ws = dir.path();
    let run = metash(ws, &[&["run"][..], &YES].concat(), true);
    assert!(run.status.success(), "{}", text(&run));
    assert_eq!(
        std::fs::read_to_string(ws.join("a.txt")).unwrap(),
        "replayed a\n"
    );
    stopped.store(true, Ordering::SeqCst);
    let asked = server.posts().len();
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let config = std::fs::read_to_string(ws.join(".meta/config.toml")).unwrap();
    std::fs::write(
        ws.join(".meta/config.toml"),
        config.replace(&server.base, &dead),
    )
    .unwrap();
    Some(Recorded {
        dir,
        server,
        asked,
        dead,
    })
}

/// The run budget's total as `metash status --json` shows it (`.meta/budget.json`).
fn budget(r: &Recorded) -> serde_json::Value {
    let out = metash(r.ws(), &["--json", "status"], false);
    assert!(out.status.success(), "{}", text(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["budget"].clone()
}

/// The log's records of `kind`.
fn records(r: &Recorded, kind: &str) -> Vec<serde_json::Value> {
    let log = std::fs::read_to_string(r.ws().join(".meta/events.jsonl")).unwrap();
    log.lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["kind"] == kind)
        .collect()
}

/// The number of tapes `metash tape list` shows.
fn tapes(r: &Recorded) -> usize {
    let out = metash(r.ws(), &["--json", "tape", "list"], false);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v.as_array().map_or(0, Vec::len)
}

/// With no key and the model stopped, `metash replay a` finds the task's tree identical, and
/// `--verify` the recorded verdict. The replays charge nothing to the run budget and write no
/// tape, though the replayed turn reports the recorded usage (the live turn was charged it).
fn replays_identical(r: &Recorded) {
    let (budget_before, tapes_before) = (budget(r), tapes(r));
    let charged = |agent: &str| {
        records(r, "budget_charge")
            .iter()
            .filter(|c| c["agent"] == agent)
            .count()
    };
    // The control: the live executor turn was charged its usage.
    assert!(charged("executor") >= 1, "{budget_before}");
    assert!(
        budget_before["tokens_used"].as_u64().unwrap() > 0,
        "{budget_before}"
    );
    let charges_before = records(r, "budget_charge").len();
    let (out, shown) = r.replay(&[]);
    assert!(out.status.success(), "{shown}");
    assert!(said_identical(&shown), "{shown}");
    let wt = r.ws().join(".meta/worktrees/replay-a-1");
    assert_eq!(
        std::fs::read_to_string(wt.join("a.txt")).unwrap(),
        "replayed a\n"
    );
    let json = metash(
        r.ws(),
        &[&["--json", "replay", "a"][..], &YES].concat(),
        false,
    );
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(v["identical"], true, "{}", text(&json));
    assert_eq!(v["served"], v["recorded"], "{v}");
    let (out, shown) = r.replay(&["--verify"]);
    assert!(out.status.success(), "{shown}");
    assert!(shown.contains("the verdict is the recorded one"), "{shown}");
    // Three replays of the executor's turn and one of the verifier's: each reported the
    // recorded usage as replayed, none was charged, none was taped.
    let ends: Vec<_> = records(r, "spawn_end")
        .into_iter()
        .filter(|e| e["data"]["replayed"] == true)
        .collect();
    assert_eq!(ends.len(), 4, "{ends:?}");
    assert!(
        ends.iter()
            .all(|e| e["data"]["tokens_used"].as_u64() > Some(0)),
        "{ends:?}"
    );
    assert_eq!(records(r, "budget_charge").len(), charges_before);
    assert_eq!(budget(r), budget_before);
    assert_eq!(tapes(r), tapes_before);
}

/// The executor's latest tape of task `a` (its id), and the place of its first POST, the turn's
/// first model request (Claude Code 2.1.197 first sends a `HEAD /`, a reachability check naming
/// no model; newer releases do not).
fn executor_tape(r: &Recorded) -> (String, u64) {
    let json = metash(r.ws(), &["--json", "tape", "list"], false);
    let list: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    let list = list.as_array().cloned().unwrap_or_default();
    let id = list
        .iter()
        .rfind(|t| t["agent"] == "executor" && t["task"] == "a")
        .unwrap_or_else(|| panic!("no executor tape: {list:?}"))["id"]
        .as_str()
        .unwrap()
        .to_string();
    let show = metash(r.ws(), &["--json", "tape", "show", &id], false);
    let tape: serde_json::Value = serde_json::from_slice(&show.stdout).unwrap();
    let first = tape["exchanges"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["method"] == "POST")
        .unwrap_or_else(|| panic!("no POST: {tape}"))["seq"]
        .as_u64()
        .unwrap();
    (id, first)
}

/// The executor role's model changed in the config: the replay stops at the turn's first model
/// request, showing both model names, and exits non-zero.
fn a_changed_model_stops_at_the_first_model_request(cli: Cli, r: &Recorded) {
    let model = match cli {
        Cli::Claude => "claude-sonnet-4-5",
        Cli::Codex => "gpt-5.1-codex",
        Cli::Pi => "test-model",
    };
    let (_, first) = executor_tape(r);
    let config = std::fs::read_to_string(r.ws().join(".meta/config.toml")).unwrap();
    let executor = cli.role("executor", &r.dead);
    let changed = executor.replace(model, "another-model");
    assert_ne!(changed, executor);
    std::fs::write(
        r.ws().join(".meta/config.toml"),
        config.replace(&executor, &changed),
    )
    .unwrap();
    let (out, shown) = r.replay(&[]);
    assert!(!out.status.success(), "{shown}");
    let stopped = format!("the replay stopped at request {first}:");
    assert!(shown.contains(&stopped), "{shown}");
    assert!(
        shown.contains("another-model") && shown.contains(model),
        "{shown}"
    );
    assert!(!said_identical(&shown), "{shown}");
    std::fs::write(r.ws().join(".meta/config.toml"), config).unwrap();
}

/// The recorded prompt changed (the tape's `spawn.user_message`): with the run-varying fields
/// masked, the replay still stops at the first model request, showing both prompts.
fn a_changed_prompt_stops_at_the_first_model_request(r: &Recorded) {
    let (id, first) = executor_tape(r);
    let path = r.ws().join(format!(".meta/tapes/{id}.json"));
    let original = std::fs::read_to_string(&path).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&original).unwrap();
    let message = v["spawn"]["user_message"].as_str().unwrap().to_string();
    v["spawn"]["user_message"] = format!("{message}\nAlso write b.txt.").into();
    std::fs::write(&path, serde_json::to_vec(&v).unwrap()).unwrap();
    let (out, shown) = r.replay(&[]);
    std::fs::write(&path, original).unwrap();
    assert!(!out.status.success(), "{shown}");
    let stopped = format!("the replay stopped at request {first}:");
    assert!(shown.contains(&stopped), "{shown}");
    assert!(
        shown.contains("with the run-varying fields masked"),
        "{shown}"
    );
    let replayed = shown.split("--- replayed:").nth(1).unwrap_or_default();
    assert!(replayed.contains("Also write b.txt."), "{shown}");
    assert!(!said_identical(&shown), "{shown}");
}

#[test]
fn a_recorded_task_replays_to_the_identical_tree_with_the_model_stopped() {
    let test = "a_recorded_task_replays_to_the_identical_tree_with_the_model_stopped";
    let Some(r) = recorded(Cli::Pi, test) else {
        return;
    };
    replays_identical(&r);
    a_changed_model_stops_at_the_first_model_request(Cli::Pi, &r);
}

#[test]
fn a_recorded_codex_task_replays_to_the_identical_tree() {
    let test = "a_recorded_codex_task_replays_to_the_identical_tree";
    let Some(r) = recorded(Cli::Codex, test) else {
        return;
    };
    replays_identical(&r);
    a_changed_model_stops_at_the_first_model_request(Cli::Codex, &r);
    a_changed_prompt_stops_at_the_first_model_request(&r);
}

#[test]
fn a_recorded_claude_code_task_replays_to_the_identical_tree() {
    let test = "a_recorded_claude_code_task_replays_to_the_identical_tree";
    let Some(r) = recorded(Cli::Claude, test) else {
        return;
    };
    replays_identical(&r);
    a_changed_model_stops_at_the_first_model_request(Cli::Claude, &r);
    a_changed_prompt_stops_at_the_first_model_request(&r);
}

/// `--verify`: after the executor's turn, the verifier's recorded turn of the attempt is replayed
/// against the replayed tree (the model stopped, no key) and its verdict is the recorded one.
/// Without the verifier's tape, `--verify` is refused before anything runs, saying why.
#[test]
fn replay_verify_replays_the_verifiers_turn_and_compares_the_verdict() {
    let test = "replay_verify_replays_the_verifiers_turn_and_compares_the_verdict";
    let Some(r) = recorded(Cli::Pi, test) else {
        return;
    };
    let (out, shown) = r.replay(&["--verify"]);
    assert!(out.status.success(), "{shown}");
    assert!(said_identical(&shown), "{shown}");
    assert!(shown.contains("verifier: replayed tape"), "{shown}");
    assert!(shown.contains("recorded verdict: pass"), "{shown}");
    assert!(shown.contains("replayed verdict: pass"), "{shown}");
    assert!(shown.contains("the verdict is the recorded one"), "{shown}");
    let json = metash(
        r.ws(),
        &[&["--json", "replay", "a", "--verify"][..], &YES].concat(),
        false,
    );
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(v["verify"]["same"], true, "{v}");
    let turn = &v["verify"]["turn"];
    assert!(turn["tape"].as_str().unwrap().contains("-verifier-"), "{v}");
    assert_eq!(turn["served"], turn["recorded"], "{v}");
    assert_eq!(v["verify"]["replayed_verdict"]["pass"], true, "{v}");
    assert_eq!(r.server.posts().len(), r.asked, "the model was asked");

    // The verifier's tape removed: --verify says so and replays nothing.
    let list = metash(r.ws(), &["--json", "tape", "list"], false);
    let list: serde_json::Value = serde_json::from_slice(&list.stdout).unwrap();
    let verifier = list
        .as_array()
        .unwrap()
        .iter()
        .rfind(|t| t["agent"] == "verifier" && t["task"] == "a")
        .unwrap_or_else(|| panic!("no verifier tape: {list}"))["id"]
        .as_str()
        .unwrap()
        .to_string();
    std::fs::remove_file(r.ws().join(format!(".meta/tapes/{verifier}.json"))).unwrap();
    let (out, shown) = r.replay(&["--verify"]);
    assert!(!out.status.success(), "{shown}");
    assert!(
        shown.contains(&format!("the verifier's tape {verifier} for task a")),
        "{shown}"
    );
    assert!(!shown.contains("replayed tape"), "{shown}");
    // Without --verify the executor's replay still works.
    let (out, shown) = r.replay(&[]);
    assert!(out.status.success() && said_identical(&shown), "{shown}");
}
