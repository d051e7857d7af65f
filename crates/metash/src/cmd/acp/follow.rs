//! The project followed while a prompt's run goes, from another process as `metash ui` follows
//! it (the store's log and `metash status`'s report), turned into `session/update`s:
//! - the plan: every task of the session's DAG as a plan entry (`completed` once complete,
//!   `in_progress` while an executor runs it, else `pending`), sent again whenever it changes;
//! - agent text: the run's progress lines;
//! - tool calls: each spawn (`execute`, completed or failed with its status) and each merge
//!   (`edit`, completed);
//! - the verifier's findings on a task, as agent text;
//! - consent questions nobody's rule answered (`[host] consent_wait_seconds`): asked as
//!   `session/request_permission` and answered in the store for the run that waits.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use metash_harness::acp::wire::{agent, method, PlanEntryStatus, ToolKind, ToolStatus};
use metash_orchestrator::book::Entry;
use metash_policy::Answer;
use metash_protocol::{LogKind, LogRecord, TaskStatus};
use metash_store::Store;
use serde_json::Value;

use super::conn::{Conn, Session};

/// How often the store is looked at.
const POLL: Duration = Duration::from_millis(150);

/// Who answered, as the ledger records it.
const BY: &str = "editor (metash acp)";

/// A grant the editor gives with "allow always": this long (the run's session, in practice).
const ALWAYS_S: u64 = 8 * 3600;

/// What has been streamed so far.
#[derive(Default)]
struct Seen {
    offset: u64,
    plan: Vec<(String, PlanEntryStatus)>,
    merged: BTreeSet<String>,
    findings: BTreeSet<(String, String)>,
    /// Spawns still running, per agent, oldest first: their tool call ids.
    spawns: HashMap<String, VecDeque<String>>,
}

/// The thread that follows the store for one prompt.
pub(super) struct Follower {
    inner: Arc<Inner>,
    thread: Option<std::thread::JoinHandle<()>>,
}

struct Inner {
    conn: Arc<Conn>,
    session_id: String,
    store: Store,
    seen: Mutex<Seen>,
    stop: AtomicBool,
}

impl Follower {
    /// Starts following from the log's end now (what happened before this prompt is not
    /// replayed, but the plan is sent as it stands): merges and findings already in the report
    /// were the news of an earlier prompt.
    pub fn start(conn: Arc<Conn>, session: &Session) -> anyhow::Result<Self> {
        let store = Store::open(&session.cwd)?;
        let mut offset = 0;
        loop {
            let (records, at) = store.log().read_from(offset, 1024)?;
            offset = at;
            if records.is_empty() {
                break;
            }
        }
        let mut seen = Seen {
            offset,
            ..Seen::default()
        };
        let tasks = metash_orchestrator::report(&store).map(|r| r.tasks);
        for t in tasks.unwrap_or_default() {
            if t.merged {
                seen.merged.insert(t.id.clone());
            }
            seen.findings
                .extend(t.findings.into_iter().map(|f| (t.id.clone(), f)));
        }
        let inner = Arc::new(Inner {
            conn,
            session_id: session.id.clone(),
            store,
            seen: Mutex::new(seen),
            stop: AtomicBool::new(false),
        });
        let worker = Arc::clone(&inner);
        let thread = std::thread::spawn(move || {
            while !worker.stop.load(Ordering::SeqCst) {
                worker.pass();
                std::thread::sleep(POLL);
            }
        });
        Ok(Self {
            inner,
            thread: Some(thread),
        })
    }

    /// Streams what happened up to now (before the prompt's answer is sent).
    pub fn catch_up(&self) {
        self.inner.pass();
    }

    pub fn stop(mut self) {
        self.inner.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.inner.pass();
    }
}

impl Inner {
    fn pass(&self) {
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        while let Ok((records, at)) = self.store.log().read_from(seen.offset, 256) {
            seen.offset = at;
            if records.is_empty() {
                break;
            }
            for r in records {
                self.record(&mut seen, &r);
            }
        }
        self.report(&mut seen);
    }

    fn update(&self, update: Value) {
        self.conn.update(&self.session_id, update);
    }

    /// One log record as updates.
    fn record(&self, seen: &mut Seen, r: &LogRecord) {
        let agent_name = r.agent.clone().unwrap_or_default();
        match r.kind {
            LogKind::Progress => {
                if let Some(m) = r.data.get("message").and_then(Value::as_str) {
                    self.update(agent::text_chunk(&format!("{m}\n")));
                }
            }
            LogKind::Spawn => {
                let id = format!("spawn-{}", r.seq);
                let task = r.data.get("task_id").and_then(Value::as_str);
                let title = match task {
                    Some(t) => format!("{agent_name}: task {t}"),
                    None => agent_name.clone(),
                };
                self.update(agent::tool_call(
                    &id,
                    &title,
                    ToolKind::Execute,
                    ToolStatus::InProgress,
                ));
                seen.spawns.entry(agent_name).or_default().push_back(id);
            }
            LogKind::SpawnEnd => {
                let Some(id) = seen
                    .spawns
                    .get_mut(&agent_name)
                    .and_then(VecDeque::pop_front)
                else {
                    return;
                };
                let status = r.data.get("status").and_then(Value::as_str).unwrap_or("");
                // A spawn that stopped at a checkpoint did its part: it asked.
                let done = if status == "success" || status == "checkpoint" {
                    ToolStatus::Completed
                } else {
                    ToolStatus::Failed
                };
                self.update(agent::tool_call_update(&id, done, Some(status)));
            }
            LogKind::ConsentPending => self.ask_consent(r),
            LogKind::StateUpdate => self.findings_of(seen, &r.data),
            _ => {}
        }
    }

    /// The status report as plan, merges and findings (only what changed).
    fn report(&self, seen: &mut Seen) {
        let Ok(report) = metash_orchestrator::report(&self.store) else {
            return;
        };
        let plan: Vec<(String, PlanEntryStatus)> = report
            .tasks
            .iter()
            .map(|t| {
                let status = match (t.status, t.running) {
                    (TaskStatus::Complete, _) => PlanEntryStatus::Completed,
                    (_, true) => PlanEntryStatus::InProgress,
                    _ => PlanEntryStatus::Pending,
                };
                (format!("{}: {}", t.id, t.title), status)
            })
            .collect();
        if plan != seen.plan && !plan.is_empty() {
            self.update(agent::plan(&plan));
            seen.plan = plan;
        }
        for t in &report.tasks {
            if t.merged && seen.merged.insert(t.id.clone()) {
                let id = format!("merge-{}", t.id);
                let title = format!("merge task {} ({})", t.id, t.title);
                self.update(agent::tool_call(
                    &id,
                    &title,
                    ToolKind::Edit,
                    ToolStatus::Completed,
                ));
            }
            for f in &t.findings {
                self.finding(seen, &t.id, f);
            }
        }
    }

    /// The verifier's findings as the orchestrator records them (its book's `findings.<task>`
    /// in a state update): read from the log, so a retry that clears them before the next poll
    /// of the status report cannot hide them.
    fn findings_of(&self, seen: &mut Seen, data: &Value) {
        let prefix = format!("{}.", metash_orchestrator::book::key(Entry::Findings));
        let single = data.get("key").map(|k| (k, data.get("value")));
        let many = data.get("updates").and_then(Value::as_array);
        let pairs = single.into_iter().chain(
            many.into_iter()
                .flatten()
                .filter_map(|u| u.get("key").map(|k| (k, u.get("value")))),
        );
        for (key, value) in pairs {
            let Some(task) = key.as_str().and_then(|k| k.strip_prefix(&prefix)) else {
                continue;
            };
            for f in value.and_then(Value::as_array).into_iter().flatten() {
                if let Some(f) = f.as_str() {
                    self.finding(seen, task, f);
                }
            }
        }
    }

    /// One finding, sent once.
    fn finding(&self, seen: &mut Seen, task: &str, f: &str) {
        if seen.findings.insert((task.to_string(), f.to_string())) {
            self.update(agent::text_chunk(&format!(
                "verifier finding on task {task}: {f}\n"
            )));
        }
    }

    /// A consent question waiting for any client: asked of the editor on its own thread (the
    /// stream goes on meanwhile), answered in the store for the run.
    fn ask_consent(&self, r: &LogRecord) {
        let (Some(id), Some(capability)) = (
            r.data.get("id").and_then(Value::as_str),
            r.data.get("capability").and_then(Value::as_str),
        ) else {
            return;
        };
        let who = r.agent.clone().unwrap_or_else(|| "an agent".into());
        let reason = r.data.get("reason").and_then(Value::as_str).unwrap_or("");
        let title = format!("{who} asks for {capability}: {reason}");
        let params = agent::permission_request(
            &self.session_id,
            &format!("consent-{id}"),
            &title,
            kind_of(capability),
            vec![
                agent::option("allow_once", "Allow once", "allow_once"),
                agent::option("allow_always", "Allow for this run", "allow_always"),
                agent::option("deny", "Deny", "reject_once"),
            ],
        );
        let (conn, store, id) = (Arc::clone(&self.conn), self.store.clone(), id.to_string());
        std::thread::spawn(move || {
            let chosen = conn
                .request(method::REQUEST_PERMISSION, &params)
                .ok()
                .as_ref()
                .and_then(agent::chosen_option);
            let answer = match chosen.as_deref() {
                Some("allow_once") => Answer::AllowOnce,
                Some("allow_always") => Answer::AllowFor(ALWAYS_S),
                _ => Answer::Deny,
            };
            let _ = metash_host::asks::reply(&store, &id, answer, BY);
        });
    }
}

/// The ACP tool kind a capability's question is shown as: the client side's table
/// (docs/acp.md) read backwards.
fn kind_of(capability: &str) -> ToolKind {
    match capability {
        "files.read" => ToolKind::Read,
        "files.write" => ToolKind::Edit,
        "network" => ToolKind::Fetch,
        "process.spawn" | "native" => ToolKind::Execute,
        _ => ToolKind::Other,
    }
}

/// A prompt that links the project's `.meta/context.md` (a `resource_link`, or an embedded
/// `resource`) sets the context from the editor's copy: its buffer, unsaved edits included,
/// read through `fs/read_text_file` when the editor offered it (else the embedded text, else
/// the file). The planner then plans from what the user sees.
pub(super) fn use_linked_context(conn: &Conn, session: &Session, params: &Value) {
    let context = session.cwd.join(".meta/context.md");
    let Some(blocks) = params.get("prompt").and_then(Value::as_array) else {
        return;
    };
    for b in blocks {
        let (uri, embedded) = match b.get("type").and_then(Value::as_str) {
            Some("resource_link") => (b.get("uri").and_then(Value::as_str), None),
            Some("resource") => (
                b.pointer("/resource/uri").and_then(Value::as_str),
                b.pointer("/resource/text").and_then(Value::as_str),
            ),
            _ => continue,
        };
        let Some(path) = uri.map(|u| u.strip_prefix("file://").unwrap_or(u)) else {
            continue;
        };
        if Path::new(path) != context {
            continue;
        }
        let text = if conn.fs_read.load(Ordering::Relaxed) {
            read_through_editor(conn, session, path)
        } else {
            embedded
                .map(str::to_string)
                .or_else(|| std::fs::read_to_string(path).ok())
        };
        let Some(text) = text else { continue };
        let note = match Store::open(&session.cwd).and_then(|s| s.set_context(&text)) {
            Ok(_) => "The context is now the editor's .meta/context.md.\n".to_string(),
            Err(e) => format!("The editor's .meta/context.md was not used: {e}\n"),
        };
        conn.update(&session.id, agent::text_chunk(&note));
    }
}

fn read_through_editor(conn: &Conn, session: &Session, path: &str) -> Option<String> {
    let answer = conn
        .request(
            method::READ_TEXT_FILE,
            &agent::read_text_file(&session.id, path),
        )
        .ok()?;
    answer
        .get("content")
        .and_then(Value::as_str)
        .map(str::to_string)
}
