//! Task leases: how `metash worker`s on many machines share one plan, each task completed
//! exactly once. The protocol (docs/scale-out.md has the reason for every step):
//!
//! - **claim**: ready tasks whose labels the worker has, taken with `FOR UPDATE SKIP LOCKED`
//!   (claimers never wait on each other and never take the same row), each given a fencing
//!   token from a sequence and an expiry on the database's clock;
//! - **heartbeat**: extends a lease only while its token is still the task's; a worker whose
//!   heartbeat finds nothing has lost the task and must stop its processes;
//! - **complete**: one transaction that checks the token, records the result and the events,
//!   and counts down the dependents (a dependent at zero becomes ready); a stale token's
//!   completion is refused, and the refusal is logged;
//! - **reap**: returns expired leases to ready, re-checking each row under its lock, and logs it.

use std::time::Duration;

use metash_protocol::LogKind;
use serde_json::{json, Value};

use super::{log, Client, Db, Statement};
use crate::error::{Result, StoreError};
use crate::log::codec::NewEvent;

/// The protocol's prepared statements (one round trip each).
pub(crate) struct Statements {
    claim: Statement,
    heartbeat: Statement,
    /// Locks the task by its token, and the log's head if no one else holds it (with what is
    /// pending then).
    complete_lock: Statement,
    /// With the head: the pending events and the task's chained into the log, the task's end
    /// and its dependents' count-down, as one statement.
    complete_chained: Statement,
    /// Without it: the task's events left pending, its end and the count-down.
    complete_pending: Statement,
}

impl Statements {
    pub(crate) fn prepare(c: &mut Client) -> Result<Self> {
        Ok(Self {
            claim: c.prepare(CLAIM)?,
            heartbeat: c.prepare(HEARTBEAT)?,
            complete_lock: c.prepare(COMPLETE_LOCK)?,
            complete_chained: c.prepare(COMPLETE_CHAINED)?,
            complete_pending: c.prepare(COMPLETE_PENDING)?,
        })
    }
}

const CLAIM: &str = "WITH picked AS (
        SELECT id FROM metash.tasks
        WHERE project = $1 AND state = 'ready' AND labels <@ $3::text[]
        ORDER BY id
        LIMIT $4
        FOR UPDATE SKIP LOCKED)
    UPDATE metash.tasks t
    SET state = 'leased', lease_token = nextval('metash.fence'), lease_worker = $2,
        lease_expires = now() + make_interval(secs => $5::float8 / 1000.0),
        attempts = t.attempts + 1
    FROM picked WHERE t.project = $1 AND t.id = picked.id
    RETURNING t.id, t.lease_token, t.attempts, t.payload";

const HEARTBEAT: &str = "UPDATE metash.tasks t
    SET lease_expires = now() + make_interval(secs => $4::float8 / 1000.0)
    FROM unnest($2::text[], $3::bigint[]) AS h(id, token)
    WHERE t.project = $1 AND t.id = h.id AND t.lease_token = h.token AND t.state = 'leased'
    RETURNING t.id";

/// $1 project, $2 task, $3 token. The head is taken only if free (`SKIP LOCKED`): a completer
/// never waits for another's chaining, it leaves its events pending instead. What is pending is
/// read by a statement of its own after the lock: this one's snapshot may predate a chaining
/// that committed while it took the head, and would show events already chained.
const COMPLETE_LOCK: &str = "SELECT t.lease_worker, h.seq, h.hash
    FROM metash.tasks t
    LEFT JOIN LATERAL (
        SELECT seq, hash FROM metash.heads WHERE project = $1 FOR UPDATE SKIP LOCKED) h ON true
    WHERE t.project = $1 AND t.id = $2 AND t.lease_token = $3 AND t.state = 'leased'
    FOR UPDATE OF t";

/// The task's end and its dependents' count-down ($1 project, $5 task, $6 state, $7 result,
/// $8 whether to count down), after the CTEs each variant adds.
macro_rules! complete_task {
    () => {
        "
    deps AS (
        UPDATE metash.tasks t
        SET remaining = t.remaining - 1,
            state = CASE WHEN t.remaining = 1 THEN 'ready' ELSE t.state END
        FROM metash.task_deps d
        WHERE $8 AND d.project = $1 AND d.dep = $5 AND t.project = $1 AND t.id = d.task
          AND t.state = 'waiting')
    UPDATE metash.tasks
    SET state = $6, result = $7, done_token = lease_token, done_at = now(),
        lease_token = NULL, lease_worker = NULL, lease_expires = NULL
    WHERE project = $1 AND id = $5"
    };
}

/// Without it: $2 kinds, $3 agents, $4 data of the task's events, left pending.
const COMPLETE_PENDING: &str = concat!(
    "WITH ins AS (
        INSERT INTO metash.pending (project, kind, agent, data)
        SELECT $1, e.kind, e.agent, e.data
        FROM unnest($2::text[], $3::text[], $4::jsonb[]) WITH ORDINALITY AS e(kind, agent, data, n)
        ORDER BY e.n),",
    complete_task!()
);

/// With the head: $2 seqs, $3 kinds, $4 lines of the chained records, $9 the last seq, $10 its
/// hash, $11 the pending ids chained with them.
const COMPLETE_CHAINED: &str = concat!(
    "WITH ins AS (
        INSERT INTO metash.log (project, seq, kind, line)
        SELECT $1, r.seq, r.kind, r.line
        FROM unnest($2::bigint[], $3::text[], $4::text[]) AS r(seq, kind, line)),
    head AS (UPDATE metash.heads SET seq = $9, hash = $10 WHERE project = $1),
    gone AS (DELETE FROM metash.pending WHERE project = $1 AND id = ANY($11::bigint[])),",
    complete_task!()
);

/// One task of a plan, as enqueued.
#[derive(Debug, Clone)]
pub struct TaskSpec {
    pub id: String,
    pub deps: Vec<String>,
    /// A worker must have all of these to claim it.
    pub labels: Vec<String>,
    pub payload: Value,
}

/// A task a worker holds: its token must come back with the completion.
#[derive(Debug, Clone)]
pub struct Lease {
    pub task: String,
    pub token: i64,
    pub attempt: i32,
    pub payload: Value,
}

/// How a leased task ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Done: its dependents are counted down.
    Done,
    /// Failed: its dependents wait (the coordinator decides: retry, replan or stop).
    Failed,
}

impl Outcome {
    fn state(self) -> &'static str {
        match self {
            Self::Done => "done",
            Self::Failed => "failed",
        }
    }
}

/// Tasks per state for a project.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Counts {
    pub waiting: u64,
    pub ready: u64,
    pub leased: u64,
    pub done: u64,
    pub failed: u64,
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Adds `tasks` to `project`'s queue, in one transaction; a task whose dependencies are all
/// done already (or has none) is ready at once. An id already queued is an error (nothing added).
///
/// # Errors
/// A dependency that is neither queued nor in this batch, a duplicate id, or the database.
pub fn enqueue(db: &mut Db, project: &str, tasks: &[TaskSpec]) -> Result<()> {
    let Db { client, s, .. } = db;
    let mut tx = client.transaction()?;
    let insert = tx.prepare(
        "INSERT INTO metash.tasks (project, id, state, remaining, labels, payload)
         VALUES ($1, $2, 'waiting', $3, $4, $5)",
    )?;
    for t in tasks {
        let n = i32::try_from(t.deps.len()).map_err(|_| {
            StoreError::Rejected(format!("task {} has too many dependencies", t.id))
        })?;
        tx.execute(&insert, &[&project, &t.id, &n, &t.labels, &t.payload])?;
    }
    let dep =
        tx.prepare("INSERT INTO metash.task_deps (project, task, dep) VALUES ($1, $2, $3)")?;
    for t in tasks {
        for d in &t.deps {
            tx.execute(&dep, &[&project, &t.id, d])?;
        }
    }
    // A dependency must exist; those already done count as met (for this batch only: the
    // tasks queued before were counted when they were queued, and since by each completion).
    let ids: Vec<&str> = tasks.iter().map(|t| t.id.as_str()).collect();
    let missing = tx.query(
        "SELECT d.task, d.dep FROM metash.task_deps d
         LEFT JOIN metash.tasks t ON t.project = d.project AND t.id = d.dep
         WHERE d.project = $1 AND t.id IS NULL LIMIT 1",
        &[&project],
    )?;
    if let Some(row) = missing.first() {
        let (task, dep): (String, String) = (row.get(0), row.get(1));
        return Err(StoreError::Rejected(format!(
            "task {task} depends on {dep}, which is not in the plan"
        )));
    }
    tx.execute(
        "UPDATE metash.tasks t SET remaining = t.remaining - (
             SELECT count(*) FROM metash.task_deps d JOIN metash.tasks u
               ON u.project = d.project AND u.id = d.dep
             WHERE d.project = t.project AND d.task = t.id AND u.state = 'done')
         WHERE t.project = $1 AND t.id = ANY($2)",
        &[&project, &ids],
    )?;
    tx.execute(
        "UPDATE metash.tasks SET state = 'ready'
         WHERE project = $1 AND id = ANY($2) AND remaining = 0",
        &[&project, &ids],
    )?;
    log::append(
        &mut tx,
        s,
        project,
        &[NewEvent::new(
            LogKind::TasksEnqueued,
            None,
            json!({"tasks": ids}),
        )],
    )?;
    tx.commit()?;
    Ok(())
}

/// Claims up to `n` ready tasks for `worker`, leased for `lease` from the database's `now()`.
///
/// # Errors
/// The database.
pub fn claim(
    db: &mut Db,
    project: &str,
    worker: &str,
    labels: &[String],
    n: usize,
    lease: Duration,
) -> Result<Vec<Lease>> {
    let limit = i64::try_from(n).unwrap_or(i64::MAX);
    let rows = db.client.query(
        &db.l.claim,
        &[&project, &worker, &labels, &limit, &millis(lease)],
    )?;
    if rows.is_empty() {
        // An idle worker chains what completions left pending, so none waits for long.
        log::chain(db, project)?;
    }
    Ok(rows
        .iter()
        .map(|r| Lease {
            task: r.get(0),
            token: r.get(1),
            attempt: r.get(2),
            payload: r.get(3),
        })
        .collect())
}

/// Extends the leases still held (task and token both match); the tasks among `held` that are
/// no longer this worker's (reaped, or claimed by another after a reap).
///
/// # Errors
/// The database (the caller cannot tell: it keeps its leases until their expiry, then stops).
pub fn heartbeat(
    db: &mut Db,
    project: &str,
    held: &[(String, i64)],
    lease: Duration,
) -> Result<Vec<String>> {
    if held.is_empty() {
        return Ok(Vec::new());
    }
    let (ids, tokens): (Vec<String>, Vec<i64>) = held.iter().cloned().unzip();
    let rows = db
        .client
        .query(&db.l.heartbeat, &[&project, &ids, &tokens, &millis(lease)])?;
    let kept: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
    Ok(ids.into_iter().filter(|id| !kept.contains(id)).collect())
}

/// Records a leased task's end: its `result` and `events` (its commits, what it did) and a
/// `task_completed` record, in one transaction with the token check and the dependents'
/// count-down. The events are then chained into the log ([`log::chain`]), by this call or by a
/// concurrent one that got there first.
///
/// # Errors
/// [`StoreError::LeaseLost`] when `token` is no longer the task's (reaped, or done already):
/// nothing is recorded but the refusal, which is logged. Else the database.
pub fn complete(
    db: &mut Db,
    project: &str,
    task: &str,
    token: i64,
    outcome: Outcome,
    result: &Value,
    events: &[NewEvent],
) -> Result<()> {
    let Db { client, l, s } = db;
    let mut tx = client.transaction()?;
    let Some(held) = tx.query_opt(&l.complete_lock, &[&project, &task, &token])? else {
        drop(tx);
        return Err(refuse(db, project, task, token)?);
    };
    let worker: Option<String> = held.get(0);
    let mut ours: Vec<NewEvent> = events.to_vec();
    ours.push(NewEvent::new(
        LogKind::TaskCompleted,
        worker.as_deref(),
        json!({"task": task, "token": token, "outcome": outcome.state(), "result": result}),
    ));
    let end: [&(dyn postgres::types::ToSql + Sync); 4] =
        [&task, &outcome.state(), result, &(outcome == Outcome::Done)];
    match held.get::<_, Option<i64>>(1) {
        Some(seq) => {
            let tail = crate::log::codec::Tail {
                seq: u64::try_from(seq).unwrap_or(0),
                hash: held.get(2),
            };
            let (ids, mut all) = log::pending(&mut tx, s, project)?;
            all.extend(ours);
            let r = log::rows_for(&tail, &all)?;
            tx.execute(
                &l.complete_chained,
                &[
                    &project,
                    &r.seqs,
                    &r.kinds,
                    &r.lines,
                    end[0],
                    end[1],
                    end[2],
                    end[3],
                    &r.last_seq,
                    &r.last_hash,
                    &ids,
                ],
            )?;
        }
        None => {
            let kinds: Vec<&str> = ours.iter().map(|e| e.kind.as_str()).collect();
            let agents: Vec<Option<&str>> = ours.iter().map(|e| e.agent.as_deref()).collect();
            let data: Vec<&Value> = ours.iter().map(|e| &e.data).collect();
            tx.execute(
                &l.complete_pending,
                &[
                    &project, &kinds, &agents, &data, end[0], end[1], end[2], end[3],
                ],
            )?;
        }
    }
    tx.commit()?;
    Ok(())
}

/// A completion with a stale token: logs the refusal, and returns the error saying why.
fn refuse(db: &mut Db, project: &str, task: &str, token: i64) -> Result<StoreError> {
    let now = db.client().query_opt(
        "SELECT state, lease_token FROM metash.tasks WHERE project = $1 AND id = $2",
        &[&project, &task],
    )?;
    let (state, current): (String, Option<i64>) =
        now.map_or(("absent".into(), None), |r| (r.get(0), r.get(1)));
    log::append_now(
        db,
        project,
        &[NewEvent::new(
            LogKind::TaskCompletionRefused,
            None,
            json!({"task": task, "token": token, "state": state, "current_token": current}),
        )],
    )?;
    Ok(StoreError::LeaseLost(format!(
        "task {task}: token {token} is stale (the task is {state}, its lease token {current:?})"
    )))
}

/// Returns `project`'s expired leases to ready (each re-checked under its row lock: a lease
/// renewed meanwhile is kept) and logs each; the tasks returned.
///
/// # Errors
/// The database.
pub fn reap(db: &mut Db, project: &str) -> Result<Vec<String>> {
    let Db { client, s, .. } = db;
    let mut tx = client.transaction()?;
    let rows = tx.query(
        "WITH expired AS (
             SELECT id FROM metash.tasks
             WHERE project = $1 AND state = 'leased' AND lease_expires < now()
             FOR UPDATE SKIP LOCKED)
         UPDATE metash.tasks t
         SET state = 'ready', lease_token = NULL, lease_worker = NULL, lease_expires = NULL
         FROM expired
         WHERE t.project = $1 AND t.id = expired.id AND t.state = 'leased' AND t.lease_expires < now()
         RETURNING t.id",
        &[&project],
    )?;
    let ids: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
    log_tasks(&mut tx, s, project, LogKind::LeasesExpired, &ids)?;
    tx.commit()?;
    // Events a completer committed but did not chain (it died in between) go in now.
    log::chain(db, project)?;
    Ok(ids)
}

/// A record that `kind` happened to `ids`, if there are any.
fn log_tasks(
    tx: &mut super::Transaction<'_>,
    s: &log::Statements,
    project: &str,
    kind: LogKind,
    ids: &[String],
) -> Result<()> {
    if !ids.is_empty() {
        log::append(
            tx,
            s,
            project,
            &[NewEvent::new(kind, None, json!({"tasks": ids}))],
        )?;
    }
    Ok(())
}

/// Withdraws the queued or leased tasks whose ids start with `prefix` (an earlier attempt's
/// turn, queued again by a coordinator that restarted): a worker holding one loses its lease at
/// its next heartbeat, and its completion is refused. Returns them.
///
/// # Errors
/// The database.
pub fn cancel(db: &mut Db, project: &str, prefix: &str) -> Result<Vec<String>> {
    let Db { client, s, .. } = db;
    let mut tx = client.transaction()?;
    let pattern = format!(
        "{}%",
        prefix
            .replace('\\', "\\\\")
            .replace('%', "\\%")
            .replace('_', "\\_")
    );
    let rows = tx.query(
        "UPDATE metash.tasks
         SET state = 'failed', result = '{\"cancelled\": true}', lease_token = NULL,
             lease_worker = NULL, lease_expires = NULL
         WHERE project = $1 AND id LIKE $2 AND state IN ('ready', 'leased')
         RETURNING id",
        &[&project, &pattern],
    )?;
    let ids: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
    log_tasks(&mut tx, s, project, LogKind::TasksCancelled, &ids)?;
    tx.commit()?;
    Ok(ids)
}

/// A worker as the server last saw it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkerRow {
    pub id: String,
    pub host: String,
    pub slots: i32,
    pub labels: Vec<String>,
    pub seen_seconds_ago: f64,
    /// Leases it holds in the project asked about.
    pub leases: i64,
}

/// A lease held now.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LeaseRow {
    pub task: String,
    pub worker: String,
    pub attempt: i32,
    pub expires_in_seconds: f64,
}

/// What `metash status` shows of the workers: who is about (seen in the last ten minutes),
/// the leases held, the queue.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Fleet {
    pub project: String,
    pub workers: Vec<WorkerRow>,
    pub leases: Vec<LeaseRow>,
    pub queue: Counts,
}

/// Records worker `id` (again, when it restarts: the row is its latest start).
///
/// # Errors
/// The database.
pub fn register_worker(
    db: &mut Db,
    id: &str,
    host: &str,
    slots: usize,
    labels: &[String],
) -> Result<()> {
    let slots = i32::try_from(slots).unwrap_or(i32::MAX);
    db.client().execute(
        "INSERT INTO metash.workers (id, labels, slots, host) VALUES ($1, $2, $3, $4)
         ON CONFLICT (id) DO UPDATE SET labels = EXCLUDED.labels, slots = EXCLUDED.slots,
             host = EXCLUDED.host, started_at = now(), seen_at = now()",
        &[&id, &labels, &slots, &host],
    )?;
    Ok(())
}

/// Worker `id` is alive (its heartbeat, with or without leases).
///
/// # Errors
/// The database.
pub fn touch_worker(db: &mut Db, id: &str) -> Result<()> {
    db.client().execute(
        "UPDATE metash.workers SET seen_at = now() WHERE id = $1",
        &[&id],
    )?;
    Ok(())
}

/// The workers, leases and queue of `project`.
///
/// # Errors
/// The database.
pub fn fleet(db: &mut Db, project: &str) -> Result<Fleet> {
    let workers = db
        .client()
        .query(
            "SELECT w.id, w.host, w.slots, w.labels,
                    extract(epoch FROM now() - w.seen_at)::float8,
                    (SELECT count(*) FROM metash.tasks t
                     WHERE t.project = $1 AND t.state = 'leased' AND t.lease_worker = w.id)
             FROM metash.workers w WHERE w.seen_at > now() - interval '10 minutes'
             ORDER BY w.id",
            &[&project],
        )?
        .iter()
        .map(|r| WorkerRow {
            id: r.get(0),
            host: r.get(1),
            slots: r.get(2),
            labels: r.get(3),
            seen_seconds_ago: r.get(4),
            leases: r.get(5),
        })
        .collect();
    let leases = db
        .client()
        .query(
            "SELECT id, coalesce(lease_worker, ''), attempts,
                    extract(epoch FROM lease_expires - now())::float8
             FROM metash.tasks WHERE project = $1 AND state = 'leased' ORDER BY id",
            &[&project],
        )?
        .iter()
        .map(|r| LeaseRow {
            task: r.get(0),
            worker: r.get(1),
            attempt: r.get(2),
            expires_in_seconds: r.get(3),
        })
        .collect();
    Ok(Fleet {
        project: project.to_string(),
        workers,
        leases,
        queue: counts(db, project)?,
    })
}

/// Task `id`'s state, payload and result, if it is queued.
///
/// # Errors
/// The database.
pub fn state_of(
    db: &mut Db,
    project: &str,
    id: &str,
) -> Result<Option<(String, Value, Option<Value>)>> {
    let row = db.client().query_opt(
        "SELECT state, payload, result FROM metash.tasks WHERE project = $1 AND id = $2",
        &[&project, &id],
    )?;
    Ok(row.map(|r| (r.get(0), r.get(1), r.get(2))))
}

/// How many of `project`'s tasks are in each state.
///
/// # Errors
/// The database.
pub fn counts(db: &mut Db, project: &str) -> Result<Counts> {
    let mut c = Counts::default();
    for row in db.client().query(
        "SELECT state, count(*) FROM metash.tasks WHERE project = $1 GROUP BY state",
        &[&project],
    )? {
        let (state, n): (String, i64) = (row.get(0), row.get(1));
        let n = u64::try_from(n).unwrap_or(0);
        match state.as_str() {
            "waiting" => c.waiting = n,
            "ready" => c.ready = n,
            "leased" => c.leased = n,
            "done" => c.done = n,
            _ => c.failed = n,
        }
    }
    Ok(c)
}
