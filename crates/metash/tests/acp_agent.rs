#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Issue 34 item 2: `metash acp`, metash as an editor's ACP agent, driven by a real ACP client
//! library: the official TypeScript SDK (`@agentclientprotocol/sdk`, pinned in scripts/setup),
//! through tests/support/acp_client.mjs, over the example project's whole run (WASM planner,
//! executor and verifier: no model, no key).
//!
//! - `an_editor_runs_the_example_project`: plan entries streamed with their statuses, the
//!   checkpoint answered through `session/request_permission`, one consent question denied and the
//!   others granted (the ledger says the editor answered), the context read through the editor's
//!   `fs/read_text_file` (its "unsaved" line reached the project), spawns and merges as tool calls,
//!   the verifier's finding as text, files committed, `end_turn`; a `cwd` that is no project is a
//!   JSON-RPC error.
//! - `session_cancel_stops_the_run_cleanly`: `session/cancel` as the first executor starts: the
//!   prompt ends `cancelled`, nothing is merged or half-merged, and the next prompt takes the run
//!   up and completes it.
//! - `a_halted_run_ends_the_prompt_with_refusal`: every consent question denied: the executor's
//!   tasks fail until the run halts; the prompt ends `refusal` with the halt's reason as text.
//! - `turn_mode_prompts_land_as_tasks` (tests/support/acp_turn_client.mjs): `turn` is offered with
//!   `run` and is the default, `session/set_mode` switches and refuses an unknown mode; two prompts
//!   in one session each become a task (`turn-1`, `turn-2`) that the executor writes, the verifier
//!   passes and the merge queue lands: each file committed on the project's branch, `end_turn`, no
//!   planner spawned.
//! - `turn_mode_cancel_leaves_the_checkout_clean`: `session/cancel` as the turn's executor starts:
//!   `cancelled`, nothing committed, the task withdrawn (no branch, no worktree), and the next
//!   prompt in the session lands.
//! - `a_turn_that_cannot_land_is_refused_and_withdrawn`: every consent question denied: the run
//!   halts, the prompt ends `refusal`, and the task is out of the plan with its branch.
//! - `a_turn_first_answers_the_checkpoint_that_waits`: a `run`-mode prompt leaves the planner's
//!   checkpoint for later; a `turn`-mode prompt asks it again, the answer lands what it held up
//!   (phase 1, the verifier's finding on `bye` streamed), then the prompt's own task lands.
//!
//! Skipped with the reason when Node, the SDK or the WASM target is missing; under CI that fails.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_metash");
const UNSAVED: &str = "Unsaved in the editor: greet politely.";
const EDITOR: &str = "editor (metash acp)";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.stdin(Stdio::null()).output().unwrap();
    assert!(out.status.success(), "{cmd:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn git(ws: &Path, args: &[&str]) -> String {
    run(Command::new("git").arg("-C").arg(ws).args(args))
}

/// The SDK and Node, and the example's WASM agents (built as examples/greetings/run.sh builds
/// them), or why not.
fn prerequisites() -> Result<PathBuf, String> {
    let tools = repo().join(".tools");
    let sdk = tools.join("node_modules/@agentclientprotocol/sdk/package.json");
    if !sdk.exists() {
        return Err(format!("{} is missing (run scripts/setup)", sdk.display()));
    }
    if Command::new("node").arg("--version").output().is_err() {
        return Err("node is not installed (run scripts/setup)".into());
    }
    let built = Command::new(env!("CARGO"))
        .args(["build", "-q", "--release", "-p", "metash-example-agents"])
        .args(["--target", "wasm32-wasip1"])
        .current_dir(repo())
        .status()
        .map_err(|e| format!("cargo: {e}"))?;
    if !built.success() {
        return Err("the example agents did not build for wasm32-wasip1".into());
    }
    Ok(tools)
}

/// The example project as examples/greetings/run.sh makes it, but for the executor's grants:
/// those are asked (the project's config does not wait for clients: `metash acp` makes its runs
/// wait for the editor).
fn example_project(dir: &Path) -> PathBuf {
    let ws = dir.join("greetings");
    let example = repo().join("examples/greetings");
    std::fs::create_dir_all(&ws).unwrap();
    git(&ws, &["init", "-q"]);
    git(
        &ws,
        &[
            "-c",
            "user.name=metash",
            "-c",
            "user.email=metash@localhost",
        ]
        .iter()
        .chain(&["commit", "-q", "--allow-empty", "-m", "empty project"])
        .copied()
        .collect::<Vec<_>>(),
    );
    let context = example.join("context.md");
    run(Command::new(BIN)
        .arg("-C")
        .arg(&ws)
        .args(["init", "--context"])
        .arg(&context));
    std::fs::copy(example.join("config.toml"), ws.join(".meta/config.toml")).unwrap();
    let wasm = repo().join("target/wasm32-wasip1/release");
    for agent in ["planner", "executor", "verifier"] {
        let to = ws.join(".meta/agents").join(agent);
        std::fs::create_dir_all(&to).unwrap();
        std::fs::copy(
            example.join("agents").join(agent).join("manifest.toml"),
            to.join("manifest.toml"),
        )
        .unwrap();
        std::fs::copy(
            wasm.join(format!("{agent}.wasm")),
            to.join(format!("{agent}.wasm")),
        )
        .unwrap();
    }
    run(Command::new(BIN)
        .arg("-C")
        .arg(&ws)
        .args(["consent", "grant", "verifier", "files.read"]));
    ws
}

/// Runs the SDK's client script; its summary.
fn client(tools: &Path, scenario: &str, ws: &Path, not_project: Option<&Path>) -> Value {
    client_script("acp_client.mjs", tools, scenario, ws, not_project)
}

/// Runs `script` (in tests/support) with the SDK; its summary.
fn client_script(
    script: &str,
    tools: &Path,
    scenario: &str,
    ws: &Path,
    not_project: Option<&Path>,
) -> Value {
    let script = repo().join("crates/metash/tests/support").join(script);
    let mut cmd = Command::new("node");
    cmd.arg(script).arg(tools).arg(BIN).arg(scenario).arg(ws);
    if let Some(p) = not_project {
        cmd.arg(p);
    }
    let out = cmd
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

fn strings<'a>(v: &'a Value, key: &str) -> Vec<&'a str> {
    v[key]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect()
}

/// The files of the example, committed on the project's branch, and nothing left uncommitted.
fn assert_committed(ws: &Path) {
    let files = git(ws, &["ls-files"]);
    for f in ["hello.txt", "bye.txt", "README.md", "shout.txt"] {
        assert!(files.lines().any(|l| l == f), "{f} not committed: {files}");
    }
    assert_eq!(
        git(ws, &["status", "--porcelain", "--untracked-files=no"]),
        ""
    );
}

#[test]
fn an_editor_runs_the_example_project() {
    let tools = match prerequisites() {
        Ok(t) => t,
        Err(why) => return metash_testkit::skip("metash acp with the ACP SDK", &why),
    };
    let dir = tempfile::tempdir().unwrap();
    let ws = example_project(dir.path());
    let s = client(&tools, "run", &ws, Some(dir.path()));

    assert_eq!(s["initialize"]["protocolVersion"], 1, "{s}");
    assert_eq!(s["notProjectError"]["code"], -32000, "{s}");
    assert!(s["notProjectError"]["message"]
        .as_str()
        .unwrap()
        .contains("not a metash project"));
    assert_eq!(s["modes"]["currentModeId"], "turn", "{s}");

    let plans = s["plans"].as_array().unwrap();
    let statuses = |p: &Value| -> Vec<String> {
        p.as_array()
            .unwrap()
            .iter()
            .map(|e| e["status"].as_str().unwrap().to_string())
            .collect()
    };
    assert!(
        plans
            .iter()
            .any(|p| statuses(p).iter().any(|x| x == "in_progress")),
        "{s}"
    );
    let last = plans.last().expect("plan entries were streamed");
    assert_eq!(last.as_array().unwrap().len(), 4, "{last}");
    assert!(statuses(last).iter().all(|x| x == "completed"), "{last}");

    let perms = s["permissions"].as_array().unwrap();
    let checkpoint = perms
        .iter()
        .find(|p| p["checkpoint"] == true)
        .expect("a checkpoint was asked");
    assert_eq!(checkpoint["chosen"], "answer-1", "{checkpoint}");
    assert!(
        checkpoint["options"]
            .to_string()
            .contains("allow_once:french"),
        "{checkpoint}"
    );
    let consent: Vec<&Value> = perms.iter().filter(|p| p["checkpoint"] == false).collect();
    assert_eq!(
        consent.first().map(|p| &p["chosen"]),
        Some(&"deny".into()),
        "{s}"
    );
    assert!(consent.iter().any(|p| p["chosen"] == "allow_always"), "{s}");

    let log = std::fs::read_to_string(ws.join(".meta/events.jsonl")).unwrap();
    let replied = |answer: &str| {
        log.lines().any(|l| {
            let r: Value = serde_json::from_str(l).unwrap();
            r["kind"] == "consent_replied"
                && r["data"]["by"] == EDITOR
                && r["data"]["answer"] == answer
        })
    };
    assert!(
        replied("deny") && replied("allow_for"),
        "the ledger has the editor's answers"
    );

    let context = ws.join(".meta/context.md");
    assert_eq!(strings(&s, "fsReads"), [context.to_str().unwrap()]);
    assert!(std::fs::read_to_string(&context).unwrap().contains(UNSAVED));

    let calls = s["toolCalls"].as_array().unwrap();
    let titled = |t: &str| {
        calls
            .iter()
            .any(|c| c["title"].as_str().unwrap().starts_with(t))
    };
    assert!(
        titled("executor: task hello") && titled("verifier: task bye"),
        "{s}"
    );
    for task in ["hello", "bye", "readme", "shout"] {
        assert!(titled(&format!("merge task {task} ")), "{task}: {s}");
    }
    let texts = strings(&s, "texts").concat();
    assert!(texts.contains("verifier finding on task bye"), "{texts}");
    assert!(texts.contains("The project is complete."), "{texts}");
    assert_eq!(
        s["stopReasons"].as_array().unwrap().last(),
        Some(&"end_turn".into()),
        "{s}"
    );
    assert_committed(&ws);
}

#[test]
fn session_cancel_stops_the_run_cleanly() {
    let tools = match prerequisites() {
        Ok(t) => t,
        Err(why) => return metash_testkit::skip("metash acp cancel with the ACP SDK", &why),
    };
    let dir = tempfile::tempdir().unwrap();
    let ws = example_project(dir.path());
    let s = client(&tools, "cancel", &ws, None);

    assert_eq!(strings(&s, "stopReasons"), ["cancelled", "end_turn"], "{s}");
    // Cancelled as the first executor started: nothing merged, nothing half-merged.
    let after = &s["afterCancel"];
    assert_eq!(after["commits"], 1, "{after}");
    assert_eq!(after["tracked"], "", "{after}");
    assert_eq!(after["merging"], false, "{after}");
    let texts = strings(&s, "texts").concat();
    let (before, _) = texts
        .split_once("The project is complete.")
        .expect("the second prompt completes");
    assert!(before.contains("task hello: executing"), "{texts}");
    assert_committed(&ws);
}

#[test]
fn a_halted_run_ends_the_prompt_with_refusal() {
    let tools = match prerequisites() {
        Ok(t) => t,
        Err(why) => return metash_testkit::skip("metash acp refusal with the ACP SDK", &why),
    };
    let dir = tempfile::tempdir().unwrap();
    let ws = example_project(dir.path());
    let s = client(&tools, "refuse", &ws, None);

    assert_eq!(strings(&s, "stopReasons"), ["refusal"], "{s}");
    let perms = s["permissions"].as_array().unwrap();
    let consent: Vec<&Value> = perms.iter().filter(|p| p["checkpoint"] == false).collect();
    assert!(!consent.is_empty(), "{s}");
    assert!(consent.iter().all(|p| p["chosen"] == "deny"), "{s}");
    let texts = strings(&s, "texts").concat();
    assert!(texts.contains("The run halted (task_failed)"), "{texts}");
    assert_eq!(git(&ws, &["rev-list", "--count", "HEAD"]).trim(), "1");
}

/// The prompts of tests/support/acp_turn_client.mjs, in order.
const PROMPTS: [&str; 2] = [
    "Write a note that greets the reader.",
    "Add a second note, a farewell.",
];

fn turn_client(tools: &Path, scenario: &str, ws: &Path) -> Value {
    client_script("acp_turn_client.mjs", tools, scenario, ws, None)
}

/// The file a turn's task wrote (the example executor writes `tasks/<id>.txt` with the task's
/// title, which is the prompt), as committed on the project's branch.
fn committed(ws: &Path, id: &str) -> String {
    git(ws, &["show", &format!("HEAD:tasks/{id}.txt")])
        .trim()
        .to_string()
}

fn titled<'a>(s: &'a Value, prefix: &str) -> Vec<&'a Value> {
    s["toolCalls"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["title"].as_str().unwrap().starts_with(prefix))
        .collect()
}

/// The tasks `metash status` lists.
fn task_ids(ws: &Path) -> Vec<String> {
    let out = run(Command::new(BIN)
        .arg("-C")
        .arg(ws)
        .args(["--json", "status"]));
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    v["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn turn_mode_prompts_land_as_tasks() {
    let tools = match prerequisites() {
        Ok(t) => t,
        Err(why) => return metash_testkit::skip("metash acp turn mode with the ACP SDK", &why),
    };
    let dir = tempfile::tempdir().unwrap();
    let ws = example_project(dir.path());
    let s = turn_client(&tools, "turns", &ws);

    assert_eq!(s["modes"]["currentModeId"], "turn", "{s}");
    let offered: Vec<&str> = s["modes"]["availableModes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(offered, ["turn", "run"], "{s}");
    assert_eq!(strings(&s, "setModes"), ["run", "turn"], "{s}");
    assert_eq!(s["badModeError"]["code"], -32602, "{s}");

    assert_eq!(strings(&s, "stopReasons"), ["end_turn", "end_turn"], "{s}");
    let checkouts = s["checkouts"].as_array().unwrap();
    for (i, c) in checkouts.iter().enumerate() {
        let files = strings(c, "files");
        for id in (1..=i + 1).map(|n| format!("tasks/turn-{n}.txt")) {
            assert!(files.contains(&id.as_str()), "{id} after prompt {i}: {c}");
        }
        assert_eq!(c["tracked"], "", "{c}");
        assert_eq!(c["merging"], false, "{c}");
    }
    assert!(
        checkouts[1]["commits"].as_u64() > checkouts[0]["commits"].as_u64(),
        "{s}"
    );
    assert_eq!(committed(&ws, "turn-1"), PROMPTS[0]);
    assert_eq!(committed(&ws, "turn-2"), PROMPTS[1]);

    // Each ran through the task path: executor, verifier (completed), merge; no planner.
    for id in ["turn-1", "turn-2"] {
        assert_eq!(titled(&s, &format!("executor: task {id}")).len(), 1, "{s}");
        let verifier = titled(&s, &format!("verifier: task {id}"));
        assert_eq!(verifier.len(), 1, "{s}");
        let call = verifier[0]["toolCallId"].clone();
        assert!(
            s["toolUpdates"]
                .as_array()
                .unwrap()
                .iter()
                .any(|u| u["toolCallId"] == call && u["status"] == "completed"),
            "the verifier's call completed: {s}"
        );
        assert_eq!(titled(&s, &format!("merge task {id} ")).len(), 1, "{s}");
    }
    assert!(titled(&s, "planner").is_empty(), "{s}");
    let texts = strings(&s, "texts").concat();
    assert!(texts.contains("Task turn-1 landed"), "{texts}");
    assert!(texts.contains("Task turn-2 landed"), "{texts}");
    let last = s["plans"].as_array().unwrap().last().unwrap().to_string();
    assert!(last.contains("turn-2: Add a second note"), "{last}");
    assert_committed_turns(&ws);
}

/// Nothing uncommitted in the checkout, and no task branch or worktree left.
fn assert_committed_turns(ws: &Path) {
    assert_eq!(
        git(ws, &["status", "--porcelain", "--untracked-files=no"]),
        ""
    );
    assert_eq!(git(ws, &["branch", "--list", "metash/task/*"]), "");
    let worktrees = git(ws, &["worktree", "list", "--porcelain"]);
    assert_eq!(
        worktrees
            .lines()
            .filter(|l| l.starts_with("worktree "))
            .count(),
        1,
        "{worktrees}"
    );
}

#[test]
fn turn_mode_cancel_leaves_the_checkout_clean() {
    let tools = match prerequisites() {
        Ok(t) => t,
        Err(why) => return metash_testkit::skip("metash acp turn cancel with the ACP SDK", &why),
    };
    let dir = tempfile::tempdir().unwrap();
    let ws = example_project(dir.path());
    let s = turn_client(&tools, "cancel", &ws);

    assert_eq!(strings(&s, "stopReasons"), ["cancelled", "end_turn"], "{s}");
    // The executor had started when the cancel came.
    assert!(!titled(&s, "executor: task turn-1").is_empty(), "{s}");
    let after = &s["checkouts"][0];
    assert_eq!(after["commits"], 1, "{after}");
    assert_eq!(after["tracked"], "", "{after}");
    assert_eq!(after["merging"], false, "{after}");
    assert_eq!(after["branches"], serde_json::json!([]), "{after}");
    assert_eq!(after["worktrees"], 1, "{after}");
    let texts = strings(&s, "texts").concat();
    assert!(texts.contains("Task turn-1 was withdrawn"), "{texts}");
    // The next prompt in the session lands (as turn-1 again: the cancelled one is gone).
    assert_eq!(committed(&ws, "turn-1"), PROMPTS[1]);
    assert_eq!(task_ids(&ws), ["turn-1"]);
    assert_committed_turns(&ws);
}

#[test]
fn a_turn_that_cannot_land_is_refused_and_withdrawn() {
    let tools = match prerequisites() {
        Ok(t) => t,
        Err(why) => return metash_testkit::skip("metash acp turn refusal with the ACP SDK", &why),
    };
    let dir = tempfile::tempdir().unwrap();
    let ws = example_project(dir.path());
    let s = turn_client(&tools, "refuse", &ws);

    assert_eq!(strings(&s, "stopReasons"), ["refusal"], "{s}");
    let perms = s["permissions"].as_array().unwrap();
    assert!(!perms.is_empty(), "{s}");
    assert!(perms.iter().all(|p| p["chosen"] == "deny"), "{s}");
    let texts = strings(&s, "texts").concat();
    assert!(texts.contains("The run halted ("), "{texts}");
    assert!(texts.contains("Task turn-1 was withdrawn"), "{texts}");
    let after = &s["checkouts"][0];
    assert_eq!(after["commits"], 1, "{after}");
    assert_eq!(after["branches"], serde_json::json!([]), "{after}");
    assert_eq!(after["worktrees"], 1, "{after}");
    assert!(task_ids(&ws).is_empty());
}

#[test]
fn a_turn_first_answers_the_checkpoint_that_waits() {
    let tools = match prerequisites() {
        Ok(t) => t,
        Err(why) => {
            return metash_testkit::skip("metash acp turn checkpoint with the ACP SDK", &why)
        }
    };
    let dir = tempfile::tempdir().unwrap();
    let ws = example_project(dir.path());
    let s = turn_client(&tools, "waiting", &ws);

    assert_eq!(strings(&s, "stopReasons"), ["end_turn", "end_turn"], "{s}");
    let asked: Vec<&Value> = s["permissions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["checkpoint"] == true)
        .collect();
    assert_eq!(asked.len(), 2, "{s}");
    assert_eq!(asked[0]["chosen"], "later", "{s}");
    assert_eq!(asked[1]["chosen"], "answer-1", "french: {s}");
    // After the run-mode prompt nothing had landed; the turn landed phase 1, then its task.
    assert_eq!(s["checkouts"][0]["commits"], 1, "{s}");
    let files = strings(&s["checkouts"][1], "files");
    for f in ["hello.txt", "bye.txt", "README.md", "tasks/turn-1.txt"] {
        assert!(files.contains(&f), "{f}: {s}");
    }
    assert_eq!(committed(&ws, "turn-1"), PROMPTS[0]);
    assert!(git(&ws, &["show", "HEAD:hello.txt"]).contains("Bonjour"));
    let at = usize::try_from(s["textsBeforeTurn"].as_u64().unwrap()).unwrap();
    let turn_texts = strings(&s, "texts")[at..].concat();
    assert!(turn_texts.contains("A checkpoint waits"), "{turn_texts}");
    assert!(
        turn_texts.contains("verifier finding on task bye"),
        "{turn_texts}"
    );
    assert!(turn_texts.contains("Task turn-1 landed"), "{turn_texts}");
    assert_committed_turns(&ws);
}
