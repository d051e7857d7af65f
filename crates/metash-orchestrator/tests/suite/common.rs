//! A temp git project with `.meta/`, and `Sim`: the example agents run in-process as a `Spawner`,
//! with knobs (sleeps, scripted planner replies, a verifier that always fails) and a record of
//! every spawn.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use metash_example_agents::Reply;
use metash_host::{Host, HostOptions, SpawnRequest, Spawner};
use metash_orchestrator::RunOutcome;
use metash_protocol::{AgentResponse, AgentStatus, CheckpointSignal, ResponseMetadata};
use metash_store::Store;
use serde_json::{json, Value};

pub const CONTEXT: &str = "# Project: Greetings\n\n## Current Phase Focus\n\nPhase 1: greetings.\n";

pub struct Project {
    pub dir: tempfile::TempDir,
}

pub fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args([
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@localhost",
            "-c",
            "commit.gpgsign=false",
        ])
        .args(args)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

impl Project {
    /// `git init`, an empty first commit, `metash init` with `CONTEXT`, and `[orchestrator]`
    /// holding `config`.
    pub fn new(config: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        git(dir.path(), &["init", "-q"]);
        git(
            dir.path(),
            &["commit", "-q", "--allow-empty", "-m", "empty"],
        );
        Store::init(dir.path(), Some(CONTEXT)).unwrap();
        std::fs::write(
            dir.path().join(".meta/config.toml"),
            format!("[orchestrator]\n{config}\n"),
        )
        .unwrap();
        Self { dir }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn host(&self) -> Host {
        Host::open(self.path(), HostOptions::silent()).unwrap()
    }

    pub fn store(&self) -> Store {
        Store::open(self.path()).unwrap()
    }

    /// Records the planner's language decision up front, so no checkpoint is raised.
    pub fn decide(&self, language: &str) {
        self.store()
            .update_state(
                "variables.metash.decisions",
                json!([{"id": metash_example_agents::LANGUAGE_QUESTION,
                        "question": "Which language should the greetings use?", "answer": language}]),
            )
            .unwrap();
    }

    pub fn state(&self) -> Value {
        self.store().get("").unwrap()
    }

    pub fn file_at_head(&self, name: &str) -> String {
        git(self.path(), &["show", &format!("HEAD:{name}")])
    }

    /// Every `state_update` of the log, as `(ts, key, value)` (multi-key events flattened).
    pub fn state_updates(&self) -> Vec<(String, String, Value)> {
        let mut out = Vec::new();
        for r in self.store().log().read_all().unwrap() {
            if r.kind != "state_update" {
                continue;
            }
            if let Some(k) = r.data.get("key").and_then(Value::as_str) {
                out.push((r.ts.clone(), k.to_string(), r.data["value"].clone()));
            }
            for u in r
                .data
                .get("updates")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                out.push((
                    r.ts.clone(),
                    u["key"].as_str().unwrap_or_default().to_string(),
                    u["value"].clone(),
                ));
            }
        }
        out
    }
}

/// One recorded spawn.
#[derive(Debug, Clone)]
pub struct Spawned {
    pub agent: String,
    pub task: Option<String>,
    pub user_message: String,
    pub resume: Option<Value>,
    pub workdir: Option<PathBuf>,
    pub start: Instant,
    pub end: Instant,
}

/// The example agents in-process.
pub struct Sim {
    store: Store,
    pub executor_sleep: Duration,
    pub planner_script: Mutex<VecDeque<String>>,
    pub verifier_fails: Vec<String>,
    /// Every executor writes `shared.txt` (holding its task id) and every verdict passes: parallel
    /// tasks that conflict.
    pub same_file: bool,
    /// Asked to resolve a merge-queue conflict, the executor says it did and changes nothing
    /// (the markers stay): a resolution that fails. Otherwise it keeps both sides.
    pub resolver_fails: bool,
    /// The first executor attempt at these tasks leaves a half-written file and times out.
    pub timeout_first: Vec<String>,
    /// The executor reports success on these tasks and changes nothing.
    pub idle: Vec<String>,
    /// The verifier passes these tasks whatever their files.
    pub verifier_passes: Vec<String>,
    /// `(agent, during, task, text)`: during that agent's first spawn for task `during`, a
    /// person comments on line 1 of `<task>.txt` (as from `metash ui`'s diff card).
    pub review_during: Vec<(String, String, String, String)>,
    /// The executors of these tasks, before they end, wait until each of them has started (at
    /// most 20 s): tasks the loop runs at once are seen to overlap however slow the machine is,
    /// and tasks it runs one after the other are not (the first gives up waiting).
    pub meet: Vec<String>,
    /// The tasks of `meet` whose executor has started.
    met: (Mutex<Vec<String>>, Condvar),
    pub spawns: Mutex<Vec<Spawned>>,
}

impl Sim {
    pub fn new(project: &Project) -> Self {
        Self::with_store(project.store())
    }

    /// For a child process that has only the project's host.
    pub fn new_at(host: &Host) -> Self {
        Self::with_store(Store::open(&host.workspace()).unwrap())
    }

    fn with_store(store: Store) -> Self {
        Self {
            store,
            executor_sleep: Duration::ZERO,
            planner_script: Mutex::new(VecDeque::new()),
            verifier_fails: vec![],
            same_file: false,
            resolver_fails: false,
            timeout_first: vec![],
            idle: vec![],
            verifier_passes: vec![],
            review_during: vec![],
            meet: vec![],
            met: (Mutex::new(vec![]), Condvar::new()),
            spawns: Mutex::new(vec![]),
        }
    }

    pub fn spawned(&self) -> Vec<Spawned> {
        self.spawns.lock().unwrap().clone()
    }
}

/// An example agent's reply as the host returns it.
fn to_response(reply: Reply) -> AgentResponse {
    match reply {
        Reply::Output(s) => response(AgentStatus::Success, s),
        Reply::Error(e) => response(AgentStatus::Error, e),
        Reply::Checkpoint {
            reason,
            message,
            options,
            resume_id,
        } => response(
            AgentStatus::Checkpoint,
            serde_json::to_string(&CheckpointSignal {
                kind: Default::default(),
                reason,
                message,
                options,
                resume_id,
            })
            .unwrap(),
        ),
    }
}

fn response(status: AgentStatus, data: String) -> AgentResponse {
    AgentResponse {
        status,
        data,
        metadata: ResponseMetadata::default(),
    }
}

impl Spawner for Sim {
    fn spawn_agent(&self, req: &SpawnRequest) -> metash_host::Result<AgentResponse> {
        let start = Instant::now();
        // As the host does: the answered checkpoint goes to this spawn, once.
        let resume = metash_host::checkpoint::take_resume(&self.store, &req.agent_name)?
            .map(|r| serde_json::to_value(r).unwrap());
        self.review_now(req);
        let ws: PathBuf = req
            .workdir
            .clone()
            .unwrap_or_else(|| self.store.workspace().to_path_buf());
        let resolving = metash_example_agents::request(&req.user_message)
            .as_ref()
            .and_then(metash_example_agents::resolve_request);
        let reply = match req.agent_name.as_str() {
            "executor" if resolving.is_some() => match (&resolving, self.resolver_fails) {
                (Some(files), false) => metash_example_agents::resolve_conflicts(&ws, files),
                _ => Reply::Output("{\"summary\": \"resolved (not really)\"}".into()),
            },
            "planner" => match self.planner_script.lock().unwrap().pop_front() {
                Some(text) => Reply::Output(text),
                None => metash_example_agents::planner(&req.user_message, resume.as_ref()),
            },
            "executor" if self.same_file => {
                let id = req.task_id.clone().unwrap_or_default();
                std::fs::write(ws.join("shared.txt"), format!("{id}\n")).unwrap();
                Reply::Output("{\"summary\": \"wrote shared.txt\"}".into())
            }
            "verifier" if self.same_file => Reply::Output("{\"pass\": true}".into()),
            "executor"
                if req
                    .task_id
                    .as_ref()
                    .is_some_and(|t| self.timeout_first.contains(t))
                    && !self
                        .spawns
                        .lock()
                        .unwrap()
                        .iter()
                        .any(|s| s.task == req.task_id && s.agent == "executor") =>
            {
                std::fs::write(ws.join("half-written.txt"), "partial").unwrap();
                std::fs::write(ws.join("hello.txt"), "Hel").unwrap();
                let out = response(AgentStatus::Timeout, "partial output".into());
                self.record(req, resume, start);
                return Ok(out);
            }
            "executor" if req.task_id.as_ref().is_some_and(|t| self.idle.contains(t)) => {
                Reply::Output("{\"summary\": \"all done (nothing written)\"}".into())
            }
            "executor" => {
                self.meet_the_others(req);
                std::thread::sleep(self.executor_sleep);
                metash_example_agents::executor(&req.user_message, resume.as_ref(), &ws)
            }
            "verifier" => {
                let task = req.task_id.clone().unwrap_or_default();
                if self.verifier_passes.contains(&task) {
                    Reply::Output("{\"pass\": true}".into())
                } else if self.verifier_fails.contains(&task) {
                    Reply::Output(json!({"pass": false, "findings": [format!("{task} is never good enough")]}).to_string())
                } else {
                    metash_example_agents::verifier(&req.user_message, resume.as_ref(), &ws)
                }
            }
            other => Reply::Error(format!("no such agent {other}")),
        };
        let out = to_response(reply);
        self.record(req, resume, start);
        Ok(out)
    }
}

impl Sim {
    /// For an executor of a task in `meet`: says it started, then waits until every task there
    /// has (at most 20 s).
    fn meet_the_others(&self, req: &SpawnRequest) {
        let Some(task) = req.task_id.as_ref().filter(|t| self.meet.contains(t)) else {
            return;
        };
        let (started, cv) = &self.met;
        let mut started = started.lock().unwrap();
        if !started.contains(task) {
            started.push(task.clone());
            cv.notify_all();
        }
        let until = Instant::now() + Duration::from_secs(20);
        while self.meet.iter().any(|t| !started.contains(t)) {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            started = cv.wait_timeout(started, left).unwrap().0;
        }
    }

    /// A person's comments due during this spawn (`review_during`).
    fn review_now(&self, req: &SpawnRequest) {
        let task = req.task_id.clone().unwrap_or_default();
        let first = !self
            .spawns
            .lock()
            .unwrap()
            .iter()
            .any(|s| s.agent == req.agent_name && s.task == req.task_id);
        for (agent, during, on, text) in &self.review_during {
            if first && *agent == req.agent_name && *during == task {
                let file = format!("{on}.txt");
                let new = metash_orchestrator::review::NewComment {
                    task: on,
                    file: &file,
                    line: 1,
                    text,
                    by: "ui",
                };
                metash_orchestrator::review::comment(&self.store, &new).unwrap();
            }
        }
    }

    /// Remembers a spawn that ran from `start` until now.
    fn record(&self, req: &SpawnRequest, resume: Option<Value>, start: Instant) {
        self.spawns.lock().unwrap().push(Spawned {
            agent: req.agent_name.clone(),
            task: req.task_id.clone(),
            user_message: req.user_message.clone(),
            resume,
            workdir: req.workdir.clone(),
            start,
            end: Instant::now(),
        });
    }
}

/// The statuses of the plan's tasks, by id.
pub fn statuses(state: &Value) -> Vec<(String, String)> {
    state["plan"]["tasks"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| {
            (
                t["id"].as_str().unwrap().to_string(),
                t["status"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

pub fn commits_of(state: &Value, id: &str) -> Vec<String> {
    state["plan"]["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["id"] == id)
        .and_then(|t| t["commits"].as_array())
        .map(|c| c.iter().map(|s| s.as_str().unwrap().to_string()).collect())
        .unwrap_or_default()
}

/// The outcome of a run that completed after `phases` phases.
pub fn complete(phases: u32) -> RunOutcome {
    RunOutcome::Complete {
        phases_completed: phases,
    }
}

/// The outcome of a run stopped by `max_phases` after `phases` phases.
pub fn phase_limit(phases: u32) -> RunOutcome {
    RunOutcome::PhaseLimit {
        phases_completed: phases,
    }
}
