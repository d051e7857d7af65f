//! The example project (`examples/greetings`) for real: its WASM planner, executor and verifier
//! (built from `crates/metash-example-agents`) spawned by the host, from `metash init` to completed
//! phases, including the planner's checkpoint answered through `RunOptions::answer` (what
//! `metash run --answer` does).

use std::path::{Path, PathBuf};

use metash_host::{Host, HostOptions, Terminal};
use metash_orchestrator::{Orchestrator, RunOptions, RunOutcome};
use serde_json::Value;

use super::common::{commits_of, complete, git, phase_limit, statuses};

/// What `examples/greetings/run.sh` does before `metash run`.
pub(super) fn example_project() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path();
    git(p, &["init", "-q"]);
    git(p, &["commit", "-q", "--allow-empty", "-m", "empty project"]);
    metash_store::Store::init(p, Some(&metash_testkit::greetings::context())).unwrap();
    let policy = metash_testkit::greetings::copy_into(p);
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
