//! `metash worker`: runs the executor turns a coordinator (`metash run --workers`) queues on
//! the project's PostgreSQL store, on this machine, up to `slots` at once (docs/scale-out.md).
//!
//! Each task runs in a child process of its own (`metash worker-task`), in its own process
//! group, which dies with the worker (`PR_SET_PDEATHSIG`). That is how a worker that loses a
//! lease stops the task's processes: it kills the group. The worker heartbeats its leases
//! every third of the lease. A heartbeat that finds a task gone (reaped after the worker was
//! cut off longer than a lease, or taken by another) kills that task. A completion whose token
//! is stale is refused by the server, and the worker only counts it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use metash_host::Host;
use metash_protocol::{AgentResponse, AgentStatus, LogLevel, ResponseMetadata};
use metash_store::pg::lease::{self, Outcome};
use metash_store::pg::store::PgStore;
use metash_store::{Store, StoreError};
use serde_json::{json, Value};

use crate::engine::{branch_of, worktree_of, Orchestrator};
use crate::error::{OrchestratorError, Result};
use crate::git::Merge;
use crate::prompts::{Conflict, Focus, Role};
use crate::queue::short;
use crate::remote::{base_blob, main_blob, main_ref, result_blob};

/// How a worker runs.
#[derive(Debug, Clone)]
pub struct WorkerOptions {
    /// Names this worker in leases and records.
    pub id: String,
    /// Tasks at once.
    pub slots: usize,
    /// What this worker offers; it takes only tasks whose labels it has all of.
    pub labels: Vec<String>,
    /// How long a lease lasts without a heartbeat.
    pub lease: Duration,
    /// Stop after this long with nothing to run (`None`: until stopped).
    pub idle_exit: Option<Duration>,
    /// The command that runs one task; the task's queue id and a result file are appended.
    pub task_command: Vec<std::ffi::OsString>,
}

/// What a worker did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkerReport {
    pub completed: usize,
    /// Completions the server refused (a stale token).
    pub refused: usize,
    /// Tasks stopped because their lease was lost.
    pub lost: usize,
}

/// A task this worker runs.
struct Running {
    token: i64,
    child: Child,
    out: PathBuf,
}

/// A finished task whose completion is still to be recorded (the server may be away).
struct Finished {
    qid: String,
    token: i64,
    outcome: Outcome,
    result: Value,
}

const TICK: Duration = Duration::from_millis(100);

/// Runs the worker until `stop`, or until idle for `idle_exit`.
///
/// # Errors
/// The store is not on a server; the result directory cannot be made.
pub fn serve(store: &Store, opts: &WorkerOptions, stop: &AtomicBool) -> Result<WorkerReport> {
    let server = store.server().ok_or_else(|| {
        OrchestratorError::Refused(
            "a worker needs the store on PostgreSQL ([store] url in .meta/config.toml)".into(),
        )
    })?;
    // This clone's git runs nothing planted: checked before the first task (and by each task).
    crate::trust_gate::check(store, &crate::git::Git::new(store.workspace()))?;
    let results = store.meta_dir().join("worker").join(&opts.id);
    std::fs::create_dir_all(&results)
        .map_err(|e| OrchestratorError::io(results.display().to_string(), e))?;
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default();
    let _ = server.db(|db| lease::register_worker(db, &opts.id, &host, opts.slots, &opts.labels));
    let mut w = Loop {
        server,
        opts,
        results,
        running: BTreeMap::new(),
        finished: Vec::new(),
        report: WorkerReport::default(),
        last_beat: Instant::now(),
        last_reap: Instant::now(),
        idle_since: Instant::now(),
    };
    while !stop.load(Ordering::Relaxed) {
        w.collect();
        w.record();
        w.beat();
        w.claim();
        if w.idle_for_long() {
            break;
        }
        std::thread::sleep(TICK);
    }
    for (_, r) in std::mem::take(&mut w.running) {
        kill_group(r.child);
    }
    w.record();
    Ok(w.report)
}

struct Loop<'a> {
    server: &'a PgStore,
    opts: &'a WorkerOptions,
    results: PathBuf,
    running: BTreeMap<String, Running>,
    finished: Vec<Finished>,
    report: WorkerReport,
    last_beat: Instant,
    last_reap: Instant,
    idle_since: Instant,
}

impl Loop<'_> {
    /// Children that ended: their results, to be recorded.
    fn collect(&mut self) {
        let ended: Vec<String> = self
            .running
            .iter_mut()
            .filter_map(|(q, r)| matches!(r.child.try_wait(), Ok(Some(_))).then(|| q.clone()))
            .collect();
        if !ended.is_empty() {
            // Idle is counted from the last task's end, not from the last claim.
            self.idle_since = Instant::now();
        }
        for qid in ended {
            let Some(r) = self.running.remove(&qid) else {
                continue;
            };
            let result = std::fs::read(&r.out)
                .ok()
                .and_then(|b| serde_json::from_slice::<Value>(&b).ok());
            let _ = std::fs::remove_file(&r.out);
            let (outcome, result) = match result {
                Some(v) => (Outcome::Done, v),
                None => (
                    Outcome::Done,
                    error_result(&self.opts.id, "the task's process ended without a result"),
                ),
            };
            self.finished.push(Finished {
                qid,
                token: r.token,
                outcome,
                result,
            });
        }
    }

    /// Records finished tasks; keeps those the server could not take for the next tick.
    fn record(&mut self) {
        let project = self.server.project().to_string();
        let mut keep = Vec::new();
        for f in std::mem::take(&mut self.finished) {
            let done = self
                .server
                .db(|db| lease::complete(db, &project, &f.qid, f.token, f.outcome, &f.result, &[]));
            match done {
                Ok(()) => self.report.completed += 1,
                Err(StoreError::LeaseLost(_)) => self.report.refused += 1,
                Err(_) => keep.push(f),
            }
        }
        self.finished = keep;
    }

    /// Every third of the lease: extend the leases; kill the tasks whose lease is gone. With no
    /// answer from the server for a whole lease, every task is stopped: another worker may
    /// hold them by now.
    fn beat(&mut self) {
        let every = self.opts.lease / 3;
        if self.last_beat.elapsed() < every {
            return;
        }
        if self.running.is_empty() {
            let _ = self.server.db(|db| lease::touch_worker(db, &self.opts.id));
            self.last_beat = Instant::now();
            return;
        }
        let held: Vec<(String, i64)> = self
            .running
            .iter()
            .map(|(q, r)| (q.clone(), r.token))
            .collect();
        let project = self.server.project().to_string();
        match self
            .server
            .db(|db| lease::heartbeat(db, &project, &held, self.opts.lease))
        {
            Ok(lost) => {
                self.last_beat = Instant::now();
                let _ = self.server.db(|db| lease::touch_worker(db, &self.opts.id));
                for qid in lost {
                    self.stop_task(&qid);
                }
            }
            Err(_) if self.last_beat.elapsed() >= self.opts.lease => {
                let all: Vec<String> = self.running.keys().cloned().collect();
                for qid in all {
                    self.stop_task(&qid);
                }
            }
            Err(_) => {}
        }
    }

    fn stop_task(&mut self, qid: &str) {
        if let Some(r) = self.running.remove(qid) {
            kill_group(r.child);
            self.report.lost += 1;
        }
    }

    /// Takes tasks while slots are free, and starts each.
    fn claim(&mut self) {
        let free = self.opts.slots.saturating_sub(self.running.len());
        if free == 0 {
            self.idle_since = Instant::now();
            return;
        }
        let project = self.server.project().to_string();
        // Expired leases go back to the queue, as often as a heartbeat, not at every tick.
        if self.last_reap.elapsed() >= self.opts.lease / 3 {
            let _ = self.server.db(|db| lease::reap(db, &project));
            self.last_reap = Instant::now();
        }
        let leases = match self.server.db(|db| {
            lease::claim(
                db,
                &project,
                &self.opts.id,
                &self.opts.labels,
                free,
                self.opts.lease,
            )
        }) {
            Ok(l) => l,
            Err(_) => return,
        };
        if !leases.is_empty() {
            self.idle_since = Instant::now();
            if self.running.is_empty() {
                self.last_beat = Instant::now();
            }
        }
        for l in leases {
            let out = self.results.join(format!("{}.json", l.token));
            match start_task(&self.opts.task_command, &l.task, &out) {
                Ok(child) => {
                    self.running.insert(
                        l.task,
                        Running {
                            token: l.token,
                            child,
                            out,
                        },
                    );
                }
                Err(why) => self.finished.push(Finished {
                    qid: l.task,
                    token: l.token,
                    outcome: Outcome::Done,
                    result: error_result(&self.opts.id, &why),
                }),
            }
        }
    }

    fn idle_for_long(&self) -> bool {
        self.running.is_empty()
            && self.finished.is_empty()
            && self
                .opts
                .idle_exit
                .is_some_and(|d| self.idle_since.elapsed() >= d)
    }
}

/// A task's result when it could not run: an executor error saying why.
pub fn error_result(worker: &str, why: &str) -> Value {
    let response = AgentResponse {
        status: AgentStatus::Error,
        data: why.to_string(),
        metadata: ResponseMetadata::default(),
    };
    json!({"worker": worker, "response": response})
}

/// Starts the task's process in a group of its own that dies with this process.
fn start_task(
    command: &[std::ffi::OsString],
    qid: &str,
    out: &Path,
) -> std::result::Result<Child, String> {
    use std::os::unix::process::CommandExt;
    let (program, args) = command
        .split_first()
        .ok_or_else(|| "no task command".to_string())?;
    let mut cmd = Command::new(program);
    cmd.args(args)
        .arg(qid)
        .arg(out)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .process_group(0);
    // SAFETY: prctl(PR_SET_PDEATHSIG) is async-signal-safe and touches no memory of ours.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.spawn().map_err(|e| format!("starting the task: {e}"))
}

/// Kills a task's whole process group (its agents with it) and reaps the child.
fn kill_group(mut child: Child) {
    if let Ok(pid) = libc::pid_t::try_from(child.id()) {
        // SAFETY: kill(2) on the process group this worker made for the task.
        unsafe {
            libc::kill(-pid, libc::SIGKILL);
        }
    }
    let _ = child.wait();
}

/// Runs one queued task's executor turn (`metash worker-task`), in this workspace's clone of
/// the project; its result for the coordinator: the response, the bundle of its commit, the
/// worker's id. A merge-queue resolution turn (the payload's `resolve`) is run as
/// [`resolution_turn`] says.
///
/// # Errors
/// The task or its base is not on the server; git or the host failed; this clone's executable
/// git configuration changed (logged; no git command ran).
pub fn run_task(host: &Host, qid: &str, worker: &str) -> Result<Value> {
    run_task_with(host, host, qid, worker)
}

/// [`run_task`] with the roles spawned by `spawner` (the host itself in `metash worker-task`;
/// scripted agents in tests).
///
/// # Errors
/// As [`run_task`].
pub fn run_task_with(
    host: &Host,
    spawner: &dyn metash_host::Spawner,
    qid: &str,
    worker: &str,
) -> Result<Value> {
    let orch = Orchestrator::new(host, spawner)?;
    let outcome = orch
        .check_git_trust()
        .and_then(|()| task_turn(&orch, qid, worker));
    orch.trust_logged(outcome)
}

/// A queued turn's task, where it starts, and its worktree here.
struct Turn {
    qid: String,
    id: String,
    head: String,
    attempt: u32,
    wt: PathBuf,
    worker: String,
}

/// [`run_task`] once the configuration is known to be trusted: the task's branch fetched from
/// its bundle, its worktree here at the attempt's head, and the turn run.
fn task_turn(orch: &Orchestrator<'_>, qid: &str, worker: &str) -> Result<Value> {
    let store = orch.host.store();
    let server = store.server().ok_or_else(|| {
        OrchestratorError::Refused("a worker needs the store on PostgreSQL".into())
    })?;
    let project = server.project().to_string();
    let (_, payload, _) = server
        .db(|db| lease::state_of(db, &project, qid))?
        .ok_or_else(|| OrchestratorError::UnknownTask(qid.to_string()))?;
    let id = payload["task"].as_str().unwrap_or_default().to_string();
    let head = payload["head"].as_str().unwrap_or_default().to_string();
    let attempt = payload["attempt"]
        .as_u64()
        .and_then(|a| u32::try_from(a).ok())
        .unwrap_or(1);
    let base = server.get_blob(&base_blob(qid))?.ok_or_else(|| {
        OrchestratorError::Refused(format!("the base of {qid} is not on the server"))
    })?;
    let workspace = store.workspace().to_path_buf();
    let branch = branch_of(&id);
    let keep = format!("refs/metash/base/{}", qid.replace('#', "-"));
    orch.git
        .fetch_bundle(&workspace, &base, &format!("+refs/heads/{branch}:{keep}"))?;
    let wt = worktree_of(&workspace, &id);
    orch.git.ensure_worktree(&wt, &branch, &head)?;
    orch.git.reset_to(&wt, &head)?;
    let turn = Turn {
        qid: qid.to_string(),
        id,
        head,
        attempt,
        wt,
        worker: worker.to_string(),
    };
    if payload["resolve"].is_object() {
        return resolution_turn(orch, server, &turn, &payload["resolve"]);
    }
    executor_turn(orch, server, &turn, &payload)
}

/// Refused consent is the run's to stop, not this attempt's to fail: the coordinator halts at
/// once, as for a local executor (a retry could not change the answer). `Err`: the result
/// saying so.
fn unless_refused(
    turn: Result<AgentResponse>,
    worker: &str,
) -> Result<std::result::Result<AgentResponse, Value>> {
    match turn {
        Err(OrchestratorError::Host(metash_host::HostError::ConsentRefused {
            agent,
            capability,
            grant_command,
            message,
        })) => Ok(Err(
            json!({"consent_refused": {"agent": agent, "capability": capability,
            "grant_command": grant_command, "message": message}, "worker": worker}),
        )),
        other => other.map(Ok),
    }
}

/// The task's executor turn: its commit, if it made one, goes back as a bundle.
fn executor_turn(
    orch: &Orchestrator<'_>,
    server: &PgStore,
    t: &Turn,
    payload: &Value,
) -> Result<Value> {
    let findings: Vec<String> =
        serde_json::from_value(payload["findings"].clone()).unwrap_or_default();
    let last_error = payload["lastError"].as_str().map(str::to_string);
    let turn = orch.executor_turn(
        &t.id,
        t.attempt,
        &findings,
        last_error.as_deref(),
        &t.wt,
        &format!(" on {}", t.worker),
    );
    let mut response = match unless_refused(turn, &t.worker)? {
        Ok(response) => response,
        Err(refused) => return Ok(refused),
    };
    let mut bundle = None;
    if response.status == AgentStatus::Success {
        match crate::execute::commit_response(orch, &t.id, &t.wt, &t.head, &response.data)? {
            Err(why) => {
                response.status = AgentStatus::Error;
                response.data = why;
            }
            Ok(Some(_)) => bundle = Some(send_branch(orch, server, t)?),
            Ok(None) => {}
        }
    }
    Ok(json!({"response": response, "bundle": bundle, "worker": t.worker}))
}

/// The task's branch since the turn's head, as a bundle on the server; its name.
fn send_branch(orch: &Orchestrator<'_>, server: &PgStore, t: &Turn) -> Result<String> {
    let bytes = orch
        .git
        .bundle(&t.wt, &format!("{}..{}", t.head, branch_of(&t.id)))?;
    server.put_blob(&result_blob(&t.qid), &bytes)?;
    Ok(result_blob(&t.qid))
}

/// A merge-queue resolution turn: the project's commit `resolve.main` is fetched from its bundle
/// and merged into the task's branch here, as the coordinator did (git leaves the same conflict:
/// markers in the files, both sides in the index); the executor resolves it with the request
/// the coordinator would have made; the merge is committed as metash commits one (the same
/// exclusions) and goes back as a bundle, which the coordinator checks (remote.rs).
fn resolution_turn(
    orch: &Orchestrator<'_>,
    server: &PgStore,
    t: &Turn,
    resolve: &Value,
) -> Result<Value> {
    let list =
        |k: &str| -> Vec<String> { serde_json::from_value(resolve[k].clone()).unwrap_or_default() };
    let (files, with, why) = (list("files"), list("with"), list("why"));
    let main = resolve["main"].as_str().unwrap_or_default();
    let bytes = server.get_blob(&main_blob(&t.qid))?.ok_or_else(|| {
        OrchestratorError::Refused(format!(
            "the project's commit of {} is not on the server",
            t.qid
        ))
    })?;
    let keep = main_ref(&t.qid);
    orch.git
        .fetch_bundle(orch.git.root(), &bytes, &format!("+{keep}:{keep}"))?;
    let msg = format!("metash: update task {} with {}", t.id, short(main));
    let failed = |why: String| {
        let _ = orch.git.reset_to(&t.wt, &t.head);
        error_result(&t.worker, &why)
    };
    if let Merge::Clean = orch.git.merge(&t.wt, main, &msg)? {
        // Merged without a conflict here (git's rerere, say): the merge is the resolution.
        let summary = json!({"summary": format!("the update merged cleanly on {}", t.worker)});
        let response = success(summary.to_string());
        let bundle = send_branch(orch, server, t)?;
        return Ok(json!({"response": response, "bundle": bundle, "worker": t.worker}));
    }
    let conflict = Conflict {
        files: &files,
        with: &with,
        attempt: t.attempt,
        max_attempts: resolve["maxAttempts"]
            .as_u64()
            .and_then(|a| u32::try_from(a).ok())
            .unwrap_or(t.attempt),
        why: &why,
    };
    let response = match unless_refused(resolution_spawn(orch, t, &conflict), &t.worker)? {
        Ok(response) => response,
        Err(refused) => return Ok(refused),
    };
    if response.status != AgentStatus::Success {
        let _ = orch.git.reset_to(&t.wt, &t.head);
        return Ok(json!({"response": response, "worker": t.worker}));
    }
    if let Err(why) = crate::reply::apply_files(&t.wt, &response.data) {
        return Ok(failed(why));
    }
    let msg = format!("{msg} (conflicts resolved by the executor on {})", t.worker);
    match orch.git.commit_resolution(&t.wt, &msg)? {
        Err(unmerged) => Ok(failed(format!("still unmerged: {}", unmerged.join(", ")))),
        Ok(_) => {
            let bundle = send_branch(orch, server, t)?;
            Ok(json!({"response": response, "bundle": bundle, "worker": t.worker}))
        }
    }
}

/// The executor's resolution turn in the worktree, where the update is in progress.
fn resolution_spawn(
    orch: &Orchestrator<'_>,
    t: &Turn,
    conflict: &Conflict<'_>,
) -> Result<AgentResponse> {
    orch.progress(
        &format!(
            "task {}: resolving a conflict in {} on {} (attempt {})",
            t.id,
            conflict.files.join(", "),
            t.worker,
            t.attempt
        ),
        LogLevel::Info,
    );
    orch.spawn(
        Role::Executor,
        &Focus {
            task: Some(&t.id),
            resolve: Some(conflict),
            attempt: t.attempt,
            ..Focus::default()
        },
        Some(t.wt.clone()),
    )
}

/// A successful response with `data`.
fn success(data: String) -> AgentResponse {
    AgentResponse {
        status: AgentStatus::Success,
        data,
        metadata: ResponseMetadata::default(),
    }
}
