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

use metash_protocol::LogKind;
use metash_store::Store;
use serde_json::json;

#[path = "browser/agents.rs"]
mod agents;
mod common;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
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
            let signal = common::checkpoint("Which language?", &["french", "german"]);
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

/// Runs `script` (under `tests/browser/`) against `served`, doing `act(step)` at each of its
/// steps; the steps it went through. Fails when the script fails.
fn drive(
    script: &str,
    served: &metash_ui::Served,
    tools: &Path,
    chromium: &Path,
    mut act: impl FnMut(&str),
) -> Vec<String> {
    let shots = repo().join("target/ui-screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    let mut node = Command::new("node")
        .arg(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/browser")
                .join(script),
        )
        .args([tools, Path::new(&served.url), &shots, chromium])
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
            act(step);
            steps.push(step.to_string());
            writeln!(to_node, "ok").unwrap();
        } else if line == "done" {
            done = true;
        }
    }
    let status = node.wait().unwrap();
    assert!(status.success() && done, "{script} failed after {steps:?}");
    steps
}

/// The project's log on stderr when the test fails: what the agents and the host did.
struct Dump(Store);

impl Drop for Dump {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for r in self.0.log().read_all().unwrap_or_default() {
                eprintln!("log {} {} {:?} {}", r.seq, r.kind, r.agent, r.data);
            }
        }
    }
}

fn shot(view: &str) -> PathBuf {
    repo()
        .join("target/ui-screenshots")
        .join(format!("{view}.png"))
}

#[test]
fn the_ui_in_chromium_streams_answers_and_revokes() {
    let (tools, chromium) = match common::browser_tools() {
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
    let steps = drive("ui.mjs", &served, &tools, &chromium, |step| {
        act(&store, &root, step)
    });
    rt.block_on(served.stop());
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
        assert!(shot(view).is_file(), "{view}.png");
    }
}

/// Real native agents under the sandbox, answered from the page: a question granted and the
/// agent goes on (its chart previewed, as it now holds `media.preview`), a second denied and the
/// agent told; a `files.read` grant revoked in the ledger view stops the agent's next read; an
/// agent without `media.preview` gets no preview; a task's diff shown and commented on; and a
/// flood of output streamed through reconnects (each stream lasts 1 s here) with nothing missed
/// and nothing twice.
#[test]
fn native_agents_answered_from_chromium_previews_diffs_and_reconnects() {
    let (tools, chromium) = match common::browser_tools() {
        Ok(p) => p,
        Err(why) => return metash_testkit::skip("browser agents test", &why),
    };
    let abi = metash_runtime::native::isolate::landlock_abi();
    if abi < 4 {
        return metash_testkit::skip(
            "browser agents test",
            &format!("Landlock ABI {abi} < 4: native agents cannot be sandboxed here"),
        );
    }
    let showcase = metash_testkit::build_example("showcase", None).unwrap();
    let common::Served {
        dir: _dir,
        root,
        rt,
        served,
    } = common::serve_new_project_with(&metash_ui::UiOptions {
        stream_seconds: Some(1),
        ..metash_ui::UiOptions::default()
    });
    let store = Store::open(&root).unwrap();
    let _dump = Dump(store.clone());
    let mut steps = agents::Steps {
        root: root.clone(),
        store: store.clone(),
        showcase,
        running: None,
    };
    let steps = drive("agents.mjs", &served, &tools, &chromium, |step| {
        steps.act(step)
    });
    rt.block_on(served.stop());
    assert_eq!(
        steps,
        [
            "painter",
            "painter-done",
            "sketcher",
            "sketcher-done",
            "diff",
            "commented",
            "flood"
        ]
    );
    for view in ["cards", "diff"] {
        assert!(shot(view).is_file(), "{view}.png");
    }
}

/// `metash ui --under DIR`: the index in Chromium, and the way into the project that waits.
#[test]
fn the_projects_index_in_chromium() {
    let (tools, chromium) = match common::browser_tools() {
        Ok(p) => p,
        Err(why) => return metash_testkit::skip("browser index test", &why),
    };
    let (_dir, top, _) = common::two_projects();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let served = rt
        .block_on(metash_ui::serve_under(
            &top,
            &metash_ui::UiOptions::default(),
        ))
        .unwrap();
    let steps = drive("index.mjs", &served, &tools, &chromium, |step| {
        panic!("no steps expected: {step}")
    });
    rt.block_on(served.stop());
    assert!(steps.is_empty());
    assert!(shot("projects").is_file());
}

/// `metash run`'s loop on the project at `root`, on a thread, with its own host.
fn run_loop(
    root: &Path,
    policy: &Path,
    options: metash_orchestrator::RunOptions,
) -> std::thread::JoinHandle<metash_orchestrator::RunOutcome> {
    let (root, policy) = (root.to_path_buf(), policy.to_path_buf());
    std::thread::spawn(move || {
        let host = metash_host::Host::open(
            &root,
            metash_host::HostOptions {
                terminal: metash_host::Terminal::Silent,
                policy_file: Some(policy),
                ..metash_host::HostOptions::default()
            },
        )
        .unwrap();
        let mut orch = metash_orchestrator::Orchestrator::new(&host, &host).unwrap();
        orch.run(&options).unwrap()
    })
}

/// The example project (`examples/greetings`, its WASM agents) under the loop `metash run` runs,
/// watched and answered in Chromium: the planner's checkpoint answered from the page reaches the
/// planner's next spawn once; the plan fills the graph and the agents' cards stream while phase 1
/// is executed, verified and merged.
#[test]
fn the_example_project_runs_while_chromium_watches_and_answers() {
    let (tools, chromium) = match common::browser_tools() {
        Ok(p) => p,
        Err(why) => return metash_testkit::skip("browser example test", &why),
    };
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    common::git(&root, &["init", "-q"]);
    common::git(
        &root,
        &["commit", "-q", "--allow-empty", "-m", "empty project"],
    );
    Store::init(&root, Some(&metash_testkit::greetings::context())).unwrap();
    let policy = metash_testkit::greetings::copy_into(&root);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let served = rt
        .block_on(metash_ui::serve(&root, &metash_ui::UiOptions::default()))
        .unwrap();
    let run = |options| run_loop(&root, &policy, options);
    let mut running = None;
    let steps = drive(
        "example.mjs",
        &served,
        &tools,
        &chromium,
        |step| match step {
            "run" => {
                let outcome = run(metash_orchestrator::RunOptions::default())
                    .join()
                    .unwrap();
                assert!(
                    matches!(outcome, metash_orchestrator::RunOutcome::Checkpoint(_)),
                    "{outcome:?}"
                );
            }
            "answered" => {
                running = Some(run(metash_orchestrator::RunOptions {
                    max_phases: Some(1),
                    ..metash_orchestrator::RunOptions::default()
                }));
            }
            "phase-done" => {
                let outcome = running.take().unwrap().join().unwrap();
                assert_eq!(
                    outcome,
                    metash_orchestrator::RunOutcome::PhaseLimit {
                        phases_completed: 1
                    }
                );
            }
            other => panic!("unknown step {other}"),
        },
    );
    rt.block_on(served.stop());
    assert_eq!(steps, ["run", "answered", "phase-done"]);
    // The page's answer reached the planner's next spawn, once.
    let records = Store::open(&root).unwrap().log().read_all().unwrap();
    let resumed: Vec<_> = records
        .iter()
        .filter(|r| r.kind == LogKind::Spawn && !r.data["resume_data"].is_null())
        .collect();
    assert_eq!(resumed.len(), 1, "{resumed:?}");
    assert_eq!(resumed[0].agent.as_deref(), Some("planner"));
    assert_eq!(resumed[0].data["resume_data"]["user_input"], "french");
    assert_eq!(
        common::git(&root, &["show", "HEAD:hello.txt"]),
        "Bonjour, le monde !"
    );
    assert!(shot("example").is_file());
}
