//! The whole loop with the example agents in-process: checkpoint, answer, plan, parallel
//! execution, a verification gap and its fix, merges, two phases, completion; the gap limit; and
//! rollback.

use metash_orchestrator::{Orchestrator, RunOptions, RunOutcome};

use super::common::{commits_of, complete, git, phase_limit, statuses, Project, Sim};

fn run(p: &Project, sim: &Sim, options: RunOptions) -> RunOutcome {
    let host = p.host();
    let mut orch = Orchestrator::new(&host, sim).unwrap();
    orch.run(&options).unwrap()
}

#[test]
fn checkpoint_answer_then_two_phases_to_completion() {
    let p = Project::new("jobs = 2");
    let sim = Sim::new(&p);
    let RunOutcome::Checkpoint(cp) = run(&p, &sim, RunOptions::default()) else {
        panic!("the planner asks first");
    };
    assert_eq!(cp.id, "greeting-language");
    assert_eq!(p.state()["pendingCheckpoint"]["id"], "greeting-language");
    // Running again without an answer stops at the same checkpoint, spawning nothing.
    let before = sim.spawned().len();
    assert!(matches!(
        run(&p, &sim, RunOptions::default()),
        RunOutcome::Checkpoint(_)
    ));
    assert_eq!(sim.spawned().len(), before);

    let outcome = run(
        &p,
        &sim,
        RunOptions {
            answer: Some("2".into()), // option number 2: french
            ..RunOptions::default()
        },
    );
    assert_eq!(outcome, complete(2));

    // The answer reached the planner's next spawn, once.
    let spawns = sim.spawned();
    let with_resume: Vec<_> = spawns.iter().filter(|s| s.resume.is_some()).collect();
    assert_eq!(with_resume.len(), 1);
    assert_eq!(with_resume[0].agent, "planner");
    assert_eq!(
        with_resume[0].resume.as_ref().unwrap()["user_input"],
        "french"
    );

    let state = p.state();
    assert_eq!(state["status"], "halted");
    assert_eq!(state["variables"]["metash"]["halt"]["reason"], "complete");
    assert_eq!(state["currentPhase"], 3);
    assert_eq!(
        state["gapCount"], 0,
        "gapCount resets when a phase completes"
    );
    assert!(statuses(&state).iter().all(|(_, s)| s == "complete"));
    // bye failed its first verification: two commits; hello one; shout one.
    assert_eq!(commits_of(&state, "hello").len(), 1);
    assert_eq!(commits_of(&state, "bye").len(), 2);
    assert_eq!(commits_of(&state, "shout").len(), 1);
    for id in ["hello", "bye", "readme", "shout"] {
        for c in commits_of(&state, id) {
            // Every recorded commit is in the project's history.
            git(p.path(), &["merge-base", "--is-ancestor", &c, "HEAD"]);
        }
    }
    assert_eq!(p.file_at_head("hello.txt"), "Bonjour, le monde !");
    assert_eq!(p.file_at_head("bye.txt"), "Au revoir !");
    assert!(p.file_at_head("README.md").contains("Au revoir !"));
    assert_eq!(p.file_at_head("shout.txt"), "BONJOUR, LE MONDE !");
    // The verifier's findings went to the executor's next attempt at bye.
    let retry = spawns
        .iter()
        .filter(|s| s.agent == "executor" && s.task.as_deref() == Some("bye"))
        .nth(1)
        .unwrap();
    assert!(
        retry.user_message.contains("must end with '!'"),
        "{}",
        retry.user_message
    );

    log_tells_the_story(&p);
    // Decisions are kept for later prompts.
    assert_eq!(
        state["variables"]["metash"]["decisions"][0]["answer"],
        "french"
    );
}

/// The log tells the story: the status transitions and the gap; worktrees and task branches are
/// gone once merged.
fn log_tells_the_story(p: &Project) {
    let updates = p.state_updates();
    let statuses_seen: Vec<String> = updates
        .iter()
        .filter(|(_, k, _)| k == "status")
        .map(|(_, _, v)| v.as_str().unwrap().to_string())
        .collect();
    for s in ["executing", "verifying", "planning", "halted"] {
        assert!(statuses_seen.contains(&s.to_string()), "{statuses_seen:?}");
    }
    assert!(updates.iter().any(|(_, k, v)| k == "gapCount" && v == 1));
    assert!(git(p.path(), &["branch", "--list", "metash/*"]).is_empty());
}

#[test]
fn gap_limit_halts_with_a_report_and_retry_resets() {
    let p = Project::new("max_gap_retries = 3");
    p.decide("english");
    let mut sim = Sim::new(&p);
    sim.verifier_fails = vec!["hello".into()];
    let RunOutcome::Halted(h) = run(&p, &sim, RunOptions::default()) else {
        panic!("halts");
    };
    assert_eq!(h.reason, "gap_limit");
    assert_eq!(h.failed.len(), 1);
    assert_eq!(h.failed[0].id, "hello");
    assert!(h.failed[0].why[0].contains("never good enough"));
    assert!(h.message.contains("hello"), "{}", h.message);
    let state = p.state();
    assert_eq!(state["status"], "halted");
    // Round 1: hello and (the example's first draft of) bye fail; round 2: hello fails again.
    assert_eq!(state["gapCount"], 3);
    // hello was executed twice (first try plus one retry), then the phase halted.
    let hello_runs = sim
        .spawned()
        .iter()
        .filter(|s| s.agent == "executor" && s.task.as_deref() == Some("hello"))
        .count();
    assert_eq!(hello_runs, 2);
    // readme depends on hello: it was never judged on hello's rejected work.
    assert_eq!(
        super::common::statuses(&state)
            .iter()
            .find(|(i, _)| i == "readme")
            .unwrap()
            .1,
        "pending"
    );
    // A halted session stays halted...
    assert!(matches!(
        run(&p, &sim, RunOptions::default()),
        RunOutcome::Halted(_)
    ));
    // ...until retried (here with a verifier that now passes).
    let sim2 = Sim::new(&p);
    let outcome = run(
        &p,
        &sim2,
        RunOptions {
            retry: true,
            max_phases: Some(1),
            ..RunOptions::default()
        },
    );
    assert_eq!(outcome, phase_limit(1));
    assert_eq!(p.state()["gapCount"], 0);
}

#[test]
fn rollback_reverts_a_task_and_its_dependents_then_run_redoes_them() {
    let p = Project::new("");
    p.decide("english");
    let sim = Sim::new(&p);
    assert_eq!(run(&p, &sim, RunOptions::default()), complete(2));
    let host = p.host();
    let orch = Orchestrator::new(&host, &sim).unwrap();
    let plan = orch.rollback_plan("hello").unwrap();
    let mut deps = plan.dependents.clone();
    deps.sort();
    assert_eq!(deps, vec!["readme".to_string(), "shout".to_string()]);
    // Without consent to roll back the dependents, nothing happens.
    assert!(orch.rollback(&plan, false).is_err());
    assert_eq!(p.file_at_head("hello.txt"), "Hello, world!");

    let done = orch.rollback(&plan, true).unwrap();
    assert_eq!(done.len(), 3);
    assert_eq!(done.last().unwrap().task, "hello", "dependents first");
    let head_files = git(p.path(), &["ls-tree", "--name-only", "HEAD"]);
    assert!(!head_files.contains("hello.txt"), "{head_files}");
    assert!(!head_files.contains("shout.txt"));
    assert!(head_files.contains("bye.txt"), "bye is not a dependent");
    let state = p.state();
    let st = statuses(&state);
    for (id, s) in &st {
        let want = if id == "bye" { "complete" } else { "pending" };
        assert_eq!(s, want, "{id}");
    }
    assert_eq!(state["status"], "planning");
    assert_eq!(state["currentPhase"], 1);
    assert!(commits_of(&state, "hello").is_empty());
    drop(orch);
    drop(host);

    // The next run redoes the rolled-back tasks without asking the planner again.
    let sim2 = Sim::new(&p);
    assert_eq!(run(&p, &sim2, RunOptions::default()), complete(2));
    assert_eq!(p.file_at_head("hello.txt"), "Hello, world!");
    assert_eq!(p.file_at_head("shout.txt"), "HELLO, WORLD!");
    let planner_calls = sim2
        .spawned()
        .iter()
        .filter(|s| s.agent == "planner")
        .count();
    assert_eq!(planner_calls, 1, "only to find phase 3 empty");
}

#[test]
fn a_timed_out_task_is_reset_to_its_last_commit_and_retried() {
    let p = Project::new("");
    p.decide("english");
    let mut sim = Sim::new(&p);
    sim.timeout_first = vec!["hello".into()];
    let outcome = run(
        &p,
        &sim,
        RunOptions {
            max_phases: Some(1),
            ..RunOptions::default()
        },
    );
    assert_eq!(outcome, phase_limit(1));
    let state = p.state();
    // One commit: the timed-out attempt's half-written files were thrown away, not committed.
    assert_eq!(commits_of(&state, "hello").len(), 1);
    assert_eq!(p.file_at_head("hello.txt"), "Hello, world!");
    let files = git(p.path(), &["ls-tree", "-r", "--name-only", "HEAD"]);
    assert!(!files.contains("half-written.txt"), "{files}");
    // The log shows the failure, then the success.
    let hello_status: Vec<String> = p
        .state_updates()
        .into_iter()
        .filter(|(_, k, _)| k == "plan.tasks.hello.status")
        .map(|(_, _, v)| v.as_str().unwrap().to_string())
        .collect();
    assert_eq!(&hello_status[..2], ["failed", "complete"]);
    let retry = sim
        .spawned()
        .into_iter()
        .filter(|s| s.agent == "executor" && s.task.as_deref() == Some("hello"))
        .nth(1)
        .unwrap();
    assert!(
        retry
            .user_message
            .contains("## Your previous attempt failed\n\nexecutor timeout: partial output"),
        "{}",
        retry.user_message
    );
    // A failure of the executor is not a verifier finding.
    assert!(!retry.user_message.contains("fix these findings"));
}

/// A task whose executor changed nothing is not "complete" by default: it fails verification
/// without the verifier being asked, unless the planner said it expects no change.
#[test]
fn a_task_that_changed_nothing_fails_unless_it_expects_no_change() {
    let p = Project::new("max_gap_retries = 2");
    p.decide("english");
    let mut sim = Sim::new(&p);
    sim.planner_script.lock().unwrap().push_back(
        r#"{"tasks": [{"id": "look", "title": "check the greeting", "expects_change": false},
                      {"id": "lazy", "title": "write lazy.txt"}]}"#
            .into(),
    );
    sim.idle = vec!["look".into(), "lazy".into()];
    sim.verifier_passes = vec!["look".into(), "lazy".into()];
    let RunOutcome::Halted(h) = run(&p, &sim, RunOptions::default()) else {
        panic!("halts");
    };
    assert_eq!(h.reason, "gap_limit");
    assert_eq!(h.failed.len(), 1, "{h:?}");
    assert_eq!(h.failed[0].id, "lazy");
    assert!(
        h.failed[0].why[0].contains("changed nothing"),
        "{:?}",
        h.failed[0].why
    );
    let spawns = sim.spawned();
    let verified = |id: &str| {
        spawns
            .iter()
            .filter(|s| s.agent == "verifier" && s.task.as_deref() == Some(id))
            .count()
    };
    assert_eq!(
        verified("lazy"),
        0,
        "the verifier is not asked about no work"
    );
    assert_eq!(
        verified("look"),
        1,
        "a task expecting no change is judged as usual"
    );
    let state = p.state();
    assert_eq!(state["variables"]["metash"]["verified"]["look"], true);
    assert_eq!(state["variables"]["metash"]["noChange"]["look"], true);
    assert_eq!(state["gapCount"], 2);
}

/// A person's line comments on a task's diff (`metash ui`) go back to its agent: one made while
/// the executor works sends the completed task back at verification (its findings, a gap); one
/// made while the task waits for its next attempt reaches that attempt; one made while the
/// verifier works is not hidden by a pass. Each is delivered once.
#[test]
fn review_comments_reach_the_executor_once() {
    let p = Project::new("max_gap_retries = 5");
    p.decide("english");
    let mut sim = Sim::new(&p);
    let during = |agent: &str, t: &str, on: &str, text: &str| {
        (
            agent.to_string(),
            t.to_string(),
            on.to_string(),
            text.to_string(),
        )
    };
    sim.review_during = vec![
        during("executor", "hello", "hello", "say hello to the team"),
        // hello was sent back by then: its next attempt takes this.
        during("verifier", "bye", "hello", "and keep it short"),
        // During hello's own (second) verification: the pass does not hide it.
        during("verifier", "hello", "hello", "no exclamation mark"),
    ];
    assert_eq!(run(&p, &sim, RunOptions::default()), complete(2));
    let store = p.store();
    let comments = metash_orchestrator::review::of_task(&store, "hello").unwrap();
    assert_eq!(comments.len(), 3, "{comments:?}");
    let to: Vec<_> = comments.iter().map(|c| c.delivered_to.as_deref()).collect();
    assert_eq!(
        to,
        [Some("verification"), Some("executor"), Some("verification")]
    );
    let hello: Vec<_> = sim
        .spawned()
        .into_iter()
        .filter(|s| s.agent == "executor" && s.task.as_deref() == Some("hello"))
        .collect();
    assert_eq!(hello.len(), 3, "sent back twice by the review");
    assert!(!hello[0].user_message.contains("review comment"));
    for said in [
        "review comment on hello.txt:1: say hello to the team",
        "review comment on hello.txt:1: and keep it short",
    ] {
        assert!(
            hello[1].user_message.contains(said),
            "{}",
            hello[1].user_message
        );
        let listed = format!("- {said}\n");
        assert_eq!(
            hello[1].user_message.matches(&listed).count(),
            1,
            "once: {said}"
        );
    }
    let third = "review comment on hello.txt:1: no exclamation mark";
    assert!(!hello[1].user_message.contains(third));
    assert!(
        hello[2].user_message.contains(third),
        "{}",
        hello[2].user_message
    );
    assert!(p
        .state_updates()
        .iter()
        .any(|(_, k, v)| k == "gapCount" && v == 2));
}

/// A checkpoint answered by another client (`metash ui`, `metash resume --answer`, JSON-RPC: the
/// host's `checkpoint::answer`, not `run --answer`) is recorded by the next run as a decision,
/// exactly as `--answer` records it: the executors write French.
#[test]
fn a_checkpoint_answered_elsewhere_becomes_a_decision() {
    let p = Project::new("jobs = 2");
    let sim = Sim::new(&p);
    let RunOutcome::Checkpoint(cp) = run(&p, &sim, RunOptions::default()) else {
        panic!("the planner asks first");
    };
    metash_host::checkpoint::answer(&p.store(), Some(&cp.id), "french").unwrap();
    assert_eq!(run(&p, &sim, RunOptions::default()), complete(2));
    let state = p.state();
    let decisions = &state["variables"]["metash"]["decisions"];
    assert_eq!(decisions.as_array().unwrap().len(), 1, "{decisions}");
    assert_eq!(decisions[0]["answer"], "french");
    assert_eq!(decisions[0]["id"], cp.id.as_str());
    assert_eq!(p.file_at_head("hello.txt"), "Bonjour, le monde !");
}
