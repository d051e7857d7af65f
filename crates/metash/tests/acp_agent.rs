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
    let script = repo().join("crates/metash/tests/support/acp_client.mjs");
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
    assert_eq!(s["modes"]["currentModeId"], "run", "{s}");

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
