//! Issue 32 item 5: a spawn its consent refused (native execution nobody granted) halts the run at
//! once with `consent_refused`, saying what grants it; nothing is retried. The next run, with the
//! grant there, takes the session up again without `--retry`.

use std::sync::atomic::{AtomicBool, Ordering};

use metash_host::{SpawnRequest, Spawner};
use metash_orchestrator::{Orchestrator, RunOptions, RunOutcome};
use metash_protocol::AgentResponse;

use super::common::{Project, Sim};

const GRANT: &str = "metash consent grant ROLE native --sensitive --duration-s 86400";

/// The example agents, except that `refused` is refused its native consent while `refusing`.
struct Refusing<'a> {
    sim: &'a Sim,
    refused: &'static str,
    refusing: AtomicBool,
    asked: std::sync::Mutex<Vec<String>>,
}

impl Spawner for Refusing<'_> {
    fn spawn_agent(&self, req: &SpawnRequest) -> metash_host::Result<AgentResponse> {
        self.asked.lock().unwrap().push(req.agent_name.clone());
        if req.agent_name == self.refused && self.refusing.load(Ordering::SeqCst) {
            return Err(metash_host::HostError::ConsentRefused {
                agent: req.agent_name.clone(),
                capability: "native".into(),
                grant_command: GRANT.replace("ROLE", &req.agent_name),
                message: format!(
                    "native execution of the role `{}` is not allowed: no one to ask. Allow it \
                     with `metash run --yes-to native` or `{}`",
                    req.agent_name,
                    GRANT.replace("ROLE", &req.agent_name)
                ),
            });
        }
        self.sim.spawn_agent(req)
    }
}

impl Refusing<'_> {
    fn times(&self, agent: &str) -> usize {
        self.asked
            .lock()
            .unwrap()
            .iter()
            .filter(|a| *a == agent)
            .count()
    }
}

fn run(p: &Project, spawner: &Refusing<'_>) -> RunOutcome {
    let host = p.host();
    let mut orch = Orchestrator::new(&host, spawner).unwrap();
    orch.run(&RunOptions::default()).unwrap()
}

/// The planner's refusal halts the run after one spawn, not after `max_plan_attempts`.
#[test]
fn a_refused_planner_halts_at_once() {
    let p = Project::new("max_plan_attempts = 3");
    p.decide("english");
    let sim = Sim::new(&p);
    let spawner = Refusing {
        sim: &sim,
        refused: "planner",
        refusing: AtomicBool::new(true),
        asked: Default::default(),
    };
    let RunOutcome::Halted(h) = run(&p, &spawner) else {
        panic!("the run must halt");
    };
    assert_eq!(h.reason, "consent_refused");
    assert!(
        h.message.contains(&GRANT.replace("ROLE", "planner")),
        "{}",
        h.message
    );
    assert!(
        h.message.contains("metash run --yes-to native"),
        "{}",
        h.message
    );
    assert_eq!(spawner.times("planner"), 1, "asked once, never retried");
    let state = p.state();
    assert_eq!(state["status"], "halted");
    assert_eq!(
        state["variables"]["metash"]["halt"]["reason"],
        "consent_refused"
    );
    let rejected = &state["variables"]["metash"]["planAttempts"];
    assert_eq!(
        rejected.as_u64().unwrap_or(0),
        0,
        "no plan was counted rejected"
    );
}

/// An executor's refusal mid-phase halts the run with no further attempt at the task; once the
/// consent is there, the next run (no `--retry`) recovers the task and completes the project.
#[test]
fn a_refused_executor_halts_and_the_next_run_takes_it_up() {
    let p = Project::new("jobs = 1\nmax_task_attempts = 3");
    p.decide("english");
    let sim = Sim::new(&p);
    let spawner = Refusing {
        sim: &sim,
        refused: "executor",
        refusing: AtomicBool::new(true),
        asked: Default::default(),
    };
    let RunOutcome::Halted(h) = run(&p, &spawner) else {
        panic!("the run must halt");
    };
    assert_eq!(h.reason, "consent_refused", "{h:?}");
    assert_eq!(
        spawner.times("executor"),
        1,
        "one attempt, not max_task_attempts"
    );
    assert_eq!(spawner.times("verifier"), 0);
    // Granted now: the next plain run goes on from where it stopped.
    spawner.refusing.store(false, Ordering::SeqCst);
    let RunOutcome::Complete { phases_completed } = run(&p, &spawner) else {
        panic!("the next run completes");
    };
    assert!(phases_completed >= 1);
    assert!(spawner.times("executor") > 1 && spawner.times("verifier") > 0);
}
