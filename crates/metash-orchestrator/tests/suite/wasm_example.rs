//! The example project (`examples/greetings`) for real: its WASM planner, executor and verifier
//! (built from `crates/metash-example-agents`) spawned by the host, from `metash init` to completed
//! phases, including the planner's checkpoint answered through `RunOptions::answer` (what
//! `metash run --answer` does).

use std::path::{Path, PathBuf};
use std::process::Command;

use metash_host::{Host, HostOptions, Terminal};
use metash_orchestrator::{Orchestrator, RunOptions, RunOutcome};
use serde_json::Value;

use super::common::{commits_of, complete, git, phase_limit, statuses};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Builds the example agents for wasm32-wasip1 (a no-op when they are fresh) and returns their
/// directory.
fn wasm_agents() -> PathBuf {
    let root = repo_root();
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let dir = target.join("wasm32-wasip1").join("release");
    if fresh(&dir, &root) {
        return dir; // no need to wait for the build lock other cargo processes hold
    }
    let status = Command::new(env!("CARGO"))
        .args([
            "build",
            "-q",
            "--release",
            "-p",
            "metash-example-agents",
            "--target",
            "wasm32-wasip1",
        ])
        .current_dir(&root)
        .status()
        .unwrap();
    assert!(
        status.success(),
        "building the example agents for wasm32-wasip1 (rustup target add wasm32-wasip1)"
    );
    dir
}

/// The three modules exist and are newer than every source file they are built from.
fn fresh(dir: &Path, root: &Path) -> bool {
    fn newest(path: &Path) -> std::time::SystemTime {
        let mut t = std::time::UNIX_EPOCH;
        for e in std::fs::read_dir(path).into_iter().flatten().flatten() {
            let p = e.path();
            let m = if p.is_dir() {
                newest(&p)
            } else {
                e.metadata().and_then(|m| m.modified()).unwrap_or(t)
            };
            t = t.max(m);
        }
        t
    }
    let sources = [
        "crates/metash-example-agents",
        "crates/metash-agent",
        "crates/metash-protocol",
    ]
    .iter()
    .map(|c| newest(&root.join(c)))
    .max()
    .unwrap_or(std::time::UNIX_EPOCH);
    ["planner", "executor", "verifier"].iter().all(|a| {
        std::fs::metadata(dir.join(format!("{a}.wasm")))
            .and_then(|m| m.modified())
            .is_ok_and(|t| t > sources)
    })
}

/// What `examples/greetings/run.sh` does before `metash run`.
pub(super) fn example_project() -> (tempfile::TempDir, PathBuf) {
    let wasm = wasm_agents();
    let example = repo_root().join("examples/greetings");
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path();
    git(p, &["init", "-q"]);
    git(p, &["commit", "-q", "--allow-empty", "-m", "empty project"]);
    let context = std::fs::read_to_string(example.join("context.md")).unwrap();
    metash_store::Store::init(p, Some(&context)).unwrap();
    std::fs::copy(example.join("config.toml"), p.join(".meta/config.toml")).unwrap();
    for agent in ["planner", "executor", "verifier"] {
        let d = p.join(".meta/agents").join(agent);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::copy(
            example.join("agents").join(agent).join("manifest.toml"),
            d.join("manifest.toml"),
        )
        .unwrap();
        std::fs::copy(
            wasm.join(format!("{agent}.wasm")),
            d.join(format!("{agent}.wasm")),
        )
        .unwrap();
    }
    // Consent, non-interactively: the executor may read and write its worktree, the verifier read.
    let policy = dir.path().join("policy.toml");
    std::fs::write(
        &policy,
        "schema_version = \"0.1\"\n\
         [[allow]]\nagent = \"executor\"\ncapability = \"files.write\"\nduration_s = 3600\n\
         [[allow]]\nagent = \"executor\"\ncapability = \"files.read\"\nduration_s = 3600\n\
         [[allow]]\nagent = \"verifier\"\ncapability = \"files.read\"\nduration_s = 3600\n",
    )
    .unwrap();
    (dir, policy)
}

pub(super) fn host(p: &Path, policy: &Path) -> Host {
    Host::open(
        p,
        HostOptions {
            terminal: Terminal::Silent,
            policy_file: Some(policy.to_path_buf()),
            ..HostOptions::default()
        },
    )
    .unwrap()
}

#[test]
fn example_project_runs_from_init_to_completion_with_wasm_agents() {
    let (dir, policy) = example_project();
    let p = dir.path();
    {
        let h = host(p, &policy);
        let mut orch = Orchestrator::new(&h, &h).unwrap();
        let RunOutcome::Checkpoint(cp) = orch.run(&RunOptions::default()).unwrap() else {
            panic!("the planner asks which language first");
        };
        assert_eq!(
            cp.signal.options,
            vec!["english".to_string(), "french".to_string()]
        );
    }
    let h = host(p, &policy);
    let mut orch = Orchestrator::new(&h, &h).unwrap();
    let outcome = orch
        .run(&RunOptions {
            answer: Some("french".into()),
            max_phases: Some(1),
            ..RunOptions::default()
        })
        .unwrap();
    assert_eq!(outcome, phase_limit(1));

    let state: Value = h.store().get("").unwrap();
    let st = statuses(&state);
    assert_eq!(
        st,
        vec![
            ("hello".to_string(), "complete".to_string()),
            ("bye".to_string(), "complete".to_string()),
            ("readme".to_string(), "complete".to_string())
        ]
    );
    assert_eq!(state["status"], "planning");
    assert_eq!(state["currentPhase"], 2);
    assert_eq!(commits_of(&state, "hello").len(), 1);
    assert_eq!(commits_of(&state, "bye").len(), 2, "a gap, then the fix");
    let show = |f: &str| git(p, &["show", &format!("HEAD:{f}")]);
    assert_eq!(show("hello.txt"), "Bonjour, le monde !");
    assert_eq!(show("bye.txt"), "Au revoir !");
    assert!(show("README.md").contains("Bonjour, le monde !"));

    // The log: spawns of each role through the host, the checkpoint, the answer delivered once
    // to the planner's next spawn, and the gap.
    let records = h.store().log().read_all().unwrap();
    let spawns: Vec<&metash_protocol::LogRecord> =
        records.iter().filter(|r| r.kind == "spawn").collect();
    for role in ["planner", "executor", "verifier"] {
        assert!(
            spawns.iter().any(|r| r.agent.as_deref() == Some(role)),
            "{role} spawned"
        );
    }
    let resumed: Vec<_> = spawns
        .iter()
        .filter(|r| !r.data["resume_data"].is_null())
        .collect();
    assert_eq!(resumed.len(), 1);
    assert_eq!(resumed[0].agent.as_deref(), Some("planner"));
    assert_eq!(resumed[0].data["resume_data"]["user_input"], "french");
    assert!(records
        .iter()
        .any(|r| r.kind == "state_update" && r.data.to_string().contains("\"gapCount\"")));
    // Then the rest: phase 2 and completion.
    let outcome = orch.run(&RunOptions::default()).unwrap();
    assert_eq!(outcome, complete(1));
    assert_eq!(show("shout.txt"), "BONJOUR, LE MONDE !");
}
