//! The UI in a real Chromium (Debian's `chromium`, headless) driven by Playwright's core library
//! (`tests/browser/ui.mjs`; both installed by scripts/setup). This test owns the project and the
//! server; the script drives the page and, at each step, asks this test to change the project:
//! an agent's output streams into its card as text, a checkpoint appears without a reload and is
//! answered from the page (delivered to the next spawn once), a grant is revoked from the ledger.
//! Screenshots of each view go to `target/ui-screenshots` (`docs/ui/` holds the committed ones).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use metash_protocol::host::CheckpointTag;
use metash_protocol::{CheckpointReason, CheckpointSignal, LogKind};
use metash_store::Store;
use serde_json::json;

mod common;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Chromium and the driver, or why not.
fn prerequisites() -> Result<(PathBuf, PathBuf), String> {
    let tools = repo().join(".tools");
    if !tools
        .join("node_modules/playwright-core/package.json")
        .is_file()
    {
        return Err("playwright-core is not installed under .tools (run scripts/setup)".into());
    }
    let chromium = ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .ok_or("Debian's chromium is not installed (run scripts/setup)")?;
    Command::new("node")
        .arg("--version")
        .output()
        .map_err(|e| format!("node: {e}"))?;
    Ok((tools, chromium))
}

fn agent_manifest(root: &Path, name: &str, cap: &str) {
    let dir = root.join(".meta/agents").join(name);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("manifest.toml"),
        format!(
            "schema_version = \"0.1\"\nname = \"{name}\"\nversion = \"0.1.0\"\nentry = \"a.wasm\"\n\
             sandbox = \"wasm\"\ncapabilities = [\"{cap}\"]\n"
        ),
    )
    .unwrap();
}

/// What this test does at each of the script's steps.
fn act(store: &Store, root: &Path, step: &str) {
    match step {
        "agent-output" => {
            store
                .update_state(
                    "plan",
                    json!({"currentTaskIdx": 1, "tasks": [
                        {"id": "schema", "title": "Database schema", "status": "complete",
                         "commits": ["3f2a9c1d0e"]},
                        {"id": "api", "title": "REST endpoints", "status": "pending",
                         "dependencies": ["schema"]},
                        {"id": "ui", "title": "Sign-in page", "status": "pending",
                         "dependencies": ["schema"]},
                        {"id": "e2e", "title": "End-to-end tests", "status": "pending",
                         "dependencies": ["api", "ui"]}]}),
                )
                .unwrap();
            store
                .append(
                    LogKind::AgentEvent,
                    Some("writer"),
                    json!({"type": "output", "agent_id": "writer", "chunk_id": "c:0",
                           "content_type": "text/plain",
                           "data": "hello <script>alert(1)</script>\n"}),
                )
                .unwrap();
        }
        "checkpoint" => {
            let signal = CheckpointSignal {
                kind: CheckpointTag::Checkpoint,
                reason: CheckpointReason::DecisionRequired,
                message: "Which language?".into(),
                options: vec!["french".into(), "german".into()],
                resume_id: None,
            };
            metash_host::checkpoint::raise(store, "planner", &signal).unwrap();
        }
        "answered" => {
            let got = metash_host::checkpoint::take_resume(store, "planner").unwrap();
            assert_eq!(got.map(|r| r.user_input), Some("german".into()));
            assert_eq!(
                metash_host::checkpoint::take_resume(store, "planner").unwrap(),
                None,
                "delivered once"
            );
        }
        "consent" => {
            let q = metash_policy::ConsentQuestion::new(
                "fetcher",
                "network:api.example.com".parse().unwrap(),
                "fetch the docs",
                Some(120),
            );
            metash_host::asks::post(store, &q, std::time::Duration::from_secs(60)).unwrap();
        }
        "consent-answered" => {
            assert!(metash_host::asks::pending(store).unwrap().is_empty());
            let replied = common::replies(store);
            assert_eq!(replied.len(), 1, "answered once");
            assert_eq!(replied[0].data["answer"], "allow_once");
        }
        "grant" => {
            agent_manifest(root, "fetcher", "network:api.example.com");
            let registry =
                metash_policy::Registry::discover(&metash_policy::AgentDirs::new(root, None));
            metash_policy::Policy::new(store.clone(), registry)
                .grant(
                    "fetcher",
                    &"network:api.example.com".parse().unwrap(),
                    600,
                    false,
                    "test",
                )
                .unwrap();
        }
        "revoked" => {
            let doc = metash_policy::consent::load(store).unwrap();
            assert!(
                doc.grants.iter().all(|g| g.revoked_at.is_some()),
                "{:?}",
                doc.grants
            );
        }
        other => panic!("unknown step {other}"),
    }
}

#[test]
fn the_ui_in_chromium_streams_answers_and_revokes() {
    let (tools, chromium) = match prerequisites() {
        Ok(p) => p,
        Err(why) => return metash_testkit::skip("browser test", &why),
    };
    let common::Served {
        dir: _dir,
        root,
        rt,
        served,
    } = common::serve_new_project();
    let store = Store::open(&root).unwrap();
    let shots = repo().join("target/ui-screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    let mut node = Command::new("node")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser/ui.mjs"))
        .args([&tools, Path::new(&served.url), &shots, &chromium])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut to_node = node.stdin.take().unwrap();
    let from_node = BufReader::new(node.stdout.take().unwrap());
    let mut steps = Vec::new();
    let mut done = false;
    for line in from_node.lines() {
        let line = line.unwrap();
        if let Some(step) = line.strip_prefix("step ") {
            act(&store, &root, step);
            steps.push(step.to_string());
            writeln!(to_node, "ok").unwrap();
        } else if line == "done" {
            done = true;
        }
    }
    let status = node.wait().unwrap();
    rt.block_on(served.stop());
    assert!(
        status.success() && done,
        "the browser script failed after {steps:?}"
    );
    assert_eq!(
        steps,
        [
            "agent-output",
            "checkpoint",
            "answered",
            "consent",
            "consent-answered",
            "grant",
            "revoked"
        ]
    );
    for view in ["run", "checkpoint", "consent", "ledger"] {
        assert!(shots.join(format!("{view}.png")).is_file(), "{view}.png");
    }
}
