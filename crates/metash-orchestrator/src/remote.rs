//! Tasks run by `metash worker`s (`metash run --workers`, the store on PostgreSQL; see
//! docs/scale-out.md). The coordinator keeps the loop exactly as it is when it runs tasks
//! itself: it plans, prepares each task's worktree (merging its dependencies), records the
//! attempt, verifies and merges. Only the executor's turn moves: the task's base goes to the
//! server as a git bundle with the task in the lease queue, a worker on any machine runs the
//! executor on it and returns the response and its commit as a bundle, and the coordinator
//! fast-forwards the task's branch to it (only to exactly one commit on the attempt's head, by
//! its id: `worker_commit`) and records the task as it would have.
//!
//! A merge-queue **resolution turn** (resolve.rs) moves the same way: the task's branch (at its
//! recorded tip) and the project's commit it is brought up to date with go as bundles, the worker
//! makes the same update merge again (git leaves the same conflict there: markers in the files,
//! both sides in the index), its executor resolves it, and the merge commit comes back as a
//! bundle. The coordinator takes it only as the merge of exactly those two commits, by its id,
//! checks the files for markers and has it re-verified, as it does a resolution made here.

use std::path::Path;
use std::time::{Duration, Instant};

use metash_protocol::{AgentResponse, AgentStatus, LogLevel};
use metash_store::pg::lease::{self, TaskSpec};
use metash_store::pg::store::PgStore;
use serde_json::{json, Value};

use crate::book::QueueEntry;
use crate::engine::{branch_of, Orchestrator};
use crate::error::{OrchestratorError, Result};
use crate::execute::{Attempt, Begun, Ready};
use crate::planning::{clip, status_word};
use crate::prompts::Conflict;
use crate::queue::short;
use crate::resolve::Resolution;

/// How often the coordinator looks at a queued task.
const POLL: Duration = Duration::from_millis(100);
/// How often it returns expired leases to the queue while it waits.
const REAP_EVERY: Duration = Duration::from_secs(1);
/// How long the server may be away (a restart, a partition) before a wait gives up.
const OUTAGE: Duration = Duration::from_secs(120);

/// The bundle of a queued task's base, and of a worker's result, on the server.
pub(crate) fn base_blob(qid: &str) -> String {
    format!("base/{qid}")
}

/// The bundle of the project's commit a resolution turn merges into the task's branch.
pub(crate) fn main_blob(qid: &str) -> String {
    format!("main/{qid}")
}

/// The ref that commit is bundled under, and a worker keeps it at.
pub(crate) fn main_ref(qid: &str) -> String {
    format!("refs/metash/main/{}", qid.replace('#', "-"))
}

/// Refused consent on a worker: the coordinator's run stops at once, as for a local executor.
fn consent_refusal(result: &Value) -> Option<OrchestratorError> {
    let refused = result.get("consent_refused").filter(|r| r.is_object())?;
    let text = |k: &str| refused[k].as_str().unwrap_or_default().to_string();
    Some(OrchestratorError::Host(
        metash_host::HostError::ConsentRefused {
            agent: text("agent"),
            capability: text("capability"),
            grant_command: text("grant_command"),
            message: text("message"),
        },
    ))
}

/// A worker's result read as the agent's response and the worker's name: refused consent stops
/// the run (`Err`), a result that is no response is a failed turn (the inner `Err`, why).
fn worker_response(result: &Value) -> Result<std::result::Result<(AgentResponse, &str), String>> {
    if let Some(refused) = consent_refusal(result) {
        return Err(refused);
    }
    let worker = result["worker"].as_str().unwrap_or("a worker");
    Ok(serde_json::from_value(result["response"].clone())
        .map(|r| (r, worker))
        .map_err(|e| format!("the worker's result is not a response: {e}")))
}

/// (Written by a worker, which runs on Linux only.)
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
pub(crate) fn result_blob(qid: &str) -> String {
    format!("result/{qid}")
}

impl Orchestrator<'_> {
    /// The server this project's store is on (workers need one).
    pub(crate) fn server(&self) -> Result<&PgStore> {
        self.store().server().ok_or_else(|| {
            OrchestratorError::Refused(
                "--workers needs the store on PostgreSQL ([store] url in .meta/config.toml)".into(),
            )
        })
    }

    /// One attempt at task `id`, its executor turn run by a worker.
    pub(crate) fn attempt_remote(&self, id: &str) -> Result<Attempt> {
        let server = self.server()?;
        let Ready { wt, head, begun } = match self.prepare_attempt(id)? {
            Ok(ready) => ready,
            Err(outcome) => return Ok(Attempt::Stop(outcome)),
        };
        let qid = self.new_turn(server, id)?;
        let bundle = self.git.bundle(&wt, &branch_of(id))?;
        server.put_blob(&base_blob(&qid), &bundle)?;
        let payload = json!({
            "task": id,
            "attempt": begun.attempt,
            "head": head,
            "findings": begun.findings,
            "lastError": begun.last_error,
        });
        self.enqueue_turn(server, id, &qid, payload)?;
        self.progress(
            &format!("task {id}: queued for a worker (attempt {})", begun.attempt),
            LogLevel::Info,
        );
        let result = self.wait_for(server, &qid)?;
        self.settle_remote(id, &qid, &wt, &head, &begun, &result)
    }

    /// A new turn's queue id for task `id`. A turn an earlier run queued for the task (it was
    /// killed waiting) is withdrawn first: only the turn queued now may complete it.
    fn new_turn(&self, server: &PgStore, id: &str) -> Result<String> {
        let stale = server.db(|db| lease::cancel(db, server.project(), &format!("{id}#")))?;
        if !stale.is_empty() {
            self.progress(
                &format!(
                    "task {id}: withdrew {} turn(s) an earlier run queued",
                    stale.len()
                ),
                LogLevel::Warn,
            );
        }
        Ok(format!("{id}#{}", uuid::Uuid::new_v4().simple()))
    }

    /// Puts turn `qid` of task `id` in the lease queue, for a worker with the task's labels.
    fn enqueue_turn(&self, server: &PgStore, id: &str, qid: &str, payload: Value) -> Result<()> {
        let labels = crate::book::Book::of(&self.store().state()?).labels_of(id);
        server.db(|db| {
            lease::enqueue(
                db,
                server.project(),
                &[TaskSpec {
                    id: qid.to_string(),
                    deps: Vec::new(),
                    labels,
                    payload,
                }],
            )
        })?;
        Ok(())
    }

    /// Task `id`'s resolution turn run by a worker: the update in progress in `wt` (of the
    /// recorded tip `entry.head` with `entry.main`) goes as the two commits, and the merge commit
    /// the worker brings back is taken as [`Orchestrator::take_worker_resolution`] says.
    pub(crate) fn resolve_on_worker(
        &self,
        id: &str,
        wt: &Path,
        entry: &QueueEntry,
        conflict: &Conflict<'_>,
    ) -> Result<Resolution> {
        let server = self.server()?;
        let qid = self.new_turn(server, id)?;
        server.put_blob(&base_blob(&qid), &self.git.bundle(wt, &branch_of(id))?)?;
        // A bundle carries refs: the project's commit gets one for as long as it is bundled.
        let main = main_ref(&qid);
        self.git.run(wt, &["update-ref", &main, &entry.main])?;
        let bundled = self.git.bundle(wt, &main);
        let _ = self.git.run(wt, &["update-ref", "-d", &main]);
        server.put_blob(&main_blob(&qid), &bundled?)?;
        let payload = json!({
            "task": id,
            "attempt": conflict.attempt,
            "head": entry.head,
            "resolve": {
                "main": entry.main,
                "files": conflict.files,
                "with": conflict.with,
                "maxAttempts": conflict.max_attempts,
                "why": conflict.why,
            },
        });
        self.enqueue_turn(server, id, &qid, payload)?;
        self.progress(
            &format!(
                "task {id}: resolution queued for a worker (attempt {})",
                conflict.attempt
            ),
            LogLevel::Info,
        );
        let result = self.wait_for(server, &qid)?;
        self.take_worker_resolution(id, wt, &qid, entry, &result)
    }

    /// What a worker's resolution turn brought: its merge commit, taken only when it is the
    /// merge of exactly the task's tip and the project's commit (by its id), the worktree moved
    /// to it and none of the conflicting files holding a marker.
    fn take_worker_resolution(
        &self,
        id: &str,
        wt: &Path,
        qid: &str,
        entry: &QueueEntry,
        result: &Value,
    ) -> Result<Resolution> {
        let (response, worker) = match worker_response(result)? {
            Ok(both) => both,
            Err(why) => return Ok(Resolution::Failed(why)),
        };
        match response.status {
            AgentStatus::Success => {}
            AgentStatus::Checkpoint => return Ok(Resolution::Asked(response)),
            AgentStatus::Error | AgentStatus::Timeout => {
                return Ok(Resolution::Failed(format!(
                    "the executor on {worker} did not resolve the conflict ({}): {}",
                    status_word(response.status),
                    clip(&response.data)
                )))
            }
        }
        let Some(name) = result["bundle"].as_str() else {
            return Ok(Resolution::Failed(format!(
                "{worker} brought no resolution"
            )));
        };
        let bytes = self.server()?.get_blob(name)?.ok_or_else(|| {
            OrchestratorError::Refused(format!("the worker's bundle {name} is gone"))
        })?;
        let tip = format!("refs/metash/result/{}", qid.replace('#', "-"));
        let spec = format!("+refs/heads/{}:{tip}", branch_of(id));
        self.git.fetch_bundle(wt, &bytes, &spec)?;
        let Some(new) = self.git.resolve(wt, &tip)? else {
            return Ok(Resolution::Failed(format!(
                "{worker}'s bundle holds no {}",
                branch_of(id)
            )));
        };
        if self.git.parents(wt, &new)? != [entry.head.clone(), entry.main.clone()] {
            return Ok(Resolution::Failed(format!(
                "refused {worker}'s resolution {new}: it is not the merge of the task's tip {} \
                 and {}",
                entry.head, entry.main
            )));
        }
        // The update in progress here gives way to the worker's merge, by its id.
        self.git.reset_to(wt, &entry.head)?;
        self.git.run(wt, &["merge", "--ff-only", "--quiet", &new])?;
        self.drop_fetched(wt, &tip, &new);
        let marked = self.git.with_markers(wt, &entry.files);
        if !marked.is_empty() {
            return Ok(Resolution::Failed(format!(
                "conflict markers are left in {} (resolved on {worker}, {})",
                marked.join(", "),
                short(&new)
            )));
        }
        Ok(Resolution::Committed {
            sha: new,
            on: format!(" on {worker}"),
        })
    }

    /// Waits until a worker completes `qid`; its result. Meanwhile returns expired leases to the
    /// queue, so a worker that died does not hold the task.
    ///
    /// The server may be away for a while (restarted, out of reach): the wait goes on, and
    /// gives up only after [`OUTAGE`] without an answer.
    fn wait_for(&self, server: &PgStore, qid: &str) -> Result<Value> {
        let mut reaped = Instant::now();
        let mut answered = Instant::now();
        loop {
            std::thread::sleep(POLL);
            let row = match server.db(|db| lease::state_of(db, server.project(), qid)) {
                Ok(row) => row,
                Err(e) if answered.elapsed() >= OUTAGE => return Err(e.into()),
                Err(_) => continue,
            };
            answered = Instant::now();
            if let Some((state, _, result)) = row {
                if state == "done" || state == "failed" {
                    return Ok(result.unwrap_or(Value::Null));
                }
            }
            if reaped.elapsed() >= REAP_EVERY {
                let _ = server.db(|db| lease::reap(db, server.project()));
                reaped = Instant::now();
            }
        }
    }

    /// The commit a worker's bundle brought (fetched to `fetched`), if metash can record it for
    /// the task: exactly one commit on the attempt's `head` (the worker folds an agent's own
    /// commits into metash's one), or `head` itself. `Err`: why it is refused (the attempt fails).
    fn worker_commit(
        &self,
        wt: &Path,
        fetched: &str,
        head: &str,
    ) -> Result<std::result::Result<String, String>> {
        let Some(new) = self.git.resolve(wt, fetched)? else {
            return Ok(Err(format!("the worker's bundle holds no {fetched}")));
        };
        if new == head {
            return Ok(Ok(new));
        }
        let first = self.git.resolve(wt, &format!("{new}^1"))?;
        let second = self.git.resolve(wt, &format!("{new}^2"))?;
        if first.as_deref() != Some(head) || second.is_some() {
            return Ok(Err(format!(
                "refused the worker's result {new}: it is not one commit on {head}, where the \
                 attempt started"
            )));
        }
        Ok(Ok(new))
    }

    /// Deletes the ref a worker's bundle was fetched to, once its commit `new` is merged (the
    /// task's branch holds it now): one ref per queued turn would otherwise pile up in the
    /// coordinator's repository. Only while the ref still names `new`; a ref that cannot be
    /// deleted is left, which costs nothing but its line. A refused result's ref stays, to be
    /// looked at.
    fn drop_fetched(&self, wt: &Path, fetched: &str, new: &str) {
        let _ = self.git.run(wt, &["update-ref", "-d", fetched, new]);
    }

    /// What the worker's response means, as [`Orchestrator::attempt`] would have taken it.
    fn settle_remote(
        &self,
        id: &str,
        qid: &str,
        wt: &Path,
        head: &str,
        begun: &Begun,
        result: &Value,
    ) -> Result<Attempt> {
        let (response, worker) = match worker_response(result)? {
            Ok(both) => both,
            Err(why) => return self.fail_attempt(id, wt, head, why),
        };
        match response.status {
            AgentStatus::Success => {
                let sha = match result["bundle"].as_str() {
                    Some(name) => {
                        let bytes = self.server()?.get_blob(name)?.ok_or_else(|| {
                            OrchestratorError::Refused(format!(
                                "the worker's bundle {name} is gone"
                            ))
                        })?;
                        let tip = format!("refs/metash/result/{}", qid.replace('#', "-"));
                        self.git.fetch_bundle(
                            wt,
                            &bytes,
                            &format!("+refs/heads/{}:{tip}", branch_of(id)),
                        )?;
                        let new = match self.worker_commit(wt, &tip, head)? {
                            Ok(new) => new,
                            Err(why) => return self.fail_attempt(id, wt, head, why),
                        };
                        // By its id, as checked: the fetched ref may be written again meanwhile.
                        self.git.run(wt, &["merge", "--ff-only", "--quiet", &new])?;
                        self.drop_fetched(wt, &tip, &new);
                        (new != head).then_some(new)
                    }
                    None => None,
                };
                self.progress(&format!("task {id}: done by {worker}"), LogLevel::Info);
                self.record_complete(id, begun, sha, &response.data)
            }
            AgentStatus::Error | AgentStatus::Timeout => {
                let why = format!(
                    "executor on {worker} {}: {}",
                    status_word(response.status),
                    clip(&response.data)
                );
                self.fail_attempt(id, wt, head, why)
            }
            AgentStatus::Checkpoint => {
                self.attempt_checkpoint(id, wt, head, begun.attempt, &response)
            }
        }
    }
}
