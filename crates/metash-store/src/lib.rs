//! The `.meta/` store: every other layer writes through it.
//!
//! One truth: the event log. `session.json` is a view written atomically after its event is
//! durable; `rebuild` recreates it from the log alone. Every read-modify-write happens under one
//! lock file (`.meta/lock`) so the log's `seq` stays gapless and the hash chain unbroken across
//! processes. Layout:
//!
//! ```text
//! .meta/context.md      the vision (sha256 in store.json; changed only by `set_context`)
//! .meta/session.json    mutable state (SessionState), revision = seq of the last folded event
//! .meta/events.jsonl    append-only, hash-chained log
//! .meta/store.json      store metadata
//! .meta/lock            flock target
//! .meta/kv/<agent>.json per-agent KV      .meta/scratchpad.json   shared scratchpad
//! .meta/artifacts/      artifacts under a retention policy
//! ```

pub mod artifacts;
pub mod atomic;
pub mod backend;
mod context;
pub mod cp_sessions;
mod doc_migrate;
pub mod envelope;
mod error;
pub mod fork;
pub mod keypath;
mod kv;
pub mod lock;
pub mod log;
pub mod names;
pub mod pg;
mod rebuild;
pub mod session;
pub mod tape;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use metash_protocol::LogKind;

use metash_protocol::{LogRecord, SessionState};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

pub use artifacts::{ArtifactInfo, Artifacts, GcReport, Retention};
pub use context::{
    line_diff, placeholders_in, sha256_hex as context_sha256, ContextChange, RUN_LOCK,
    TEMPLATE as CONTEXT_TEMPLATE,
};
pub use error::{Result, StoreError};
pub use kv::{Kv, Quota as KvQuota};
pub use log::{EventLog, NewEvent, Tail};

use error::IoContext;

/// The lock timeout when none is configured.
pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_millis(5_000);

/// `.meta/store.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct StoreMeta {
    store_version: u32,
    context_sha256: String,
    /// Set while `set_context` replaces context.md: the hash of the file being written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    context_next_sha256: Option<String>,
    created_at: String,
}

const STORE_VERSION: u32 = 1;

/// A state change planned on the current session `doc` with the log at `tail`, the same for
/// every backend: the fencing check, `compute`'s updates applied and validated, the new
/// revision, and the `state_update` event. `Err(revision)`: nothing to write.
fn next_state(
    mut doc: Value,
    tail: &Tail,
    agent: Option<&str>,
    expected_revision: Option<u64>,
    compute: impl FnOnce(&Value) -> Result<Vec<(String, Value)>>,
) -> Result<std::result::Result<(SessionState, NewEvent), u64>> {
    let current = doc.get("revision").and_then(Value::as_u64).unwrap_or(0);
    if let Some(expected) = expected_revision {
        if expected != current {
            return Err(StoreError::Fenced {
                expected,
                found: current,
            });
        }
    }
    let updates = compute(&doc)?;
    let Some((first_key, _)) = updates.first() else {
        return Ok(Err(current));
    };
    for (key, value) in &updates {
        keypath::apply(&mut doc, key, value.clone())?;
    }
    let mut state = keypath::validate(doc, first_key)?;
    state.revision = tail.seq + 1;
    let data = match updates.as_slice() {
        [(key, value)] => json!({"key": key, "value": value, "scope": "session"}),
        many => json!({
            "updates": many.iter().map(|(k, v)| json!({"key": k, "value": v})).collect::<Vec<_>>(),
            "scope": "session",
        }),
    };
    Ok(Ok((
        state,
        NewEvent::new(LogKind::StateUpdate, agent, data),
    )))
}

/// A handle on one project's `.meta/`. Cheap to open; holds no lock between calls, so any number of
/// processes can hold handles at once. Cloning is free (paths only) and skips `open`'s checks.
#[derive(Debug, Clone)]
pub struct Store {
    workspace: PathBuf,
    meta: PathBuf,
    lock_timeout: Duration,
    log: EventLog,
    /// The server holding this project's store when `.meta/config.toml` names one
    /// (docs/scale-out.md); `None`: the files under `.meta/`.
    pg: Option<Arc<pg::store::PgStore>>,
}

impl Store {
    fn handle(workspace: &Path) -> Self {
        // One absolute workspace from here on: a relative `.` would name another directory for
        // every git and sandbox step that runs elsewhere (a worktree, a mount namespace).
        let workspace = std::path::absolute(workspace).unwrap_or_else(|_| workspace.to_path_buf());
        let meta = workspace.join(".meta");
        Self {
            workspace: workspace.clone(),
            log: EventLog::new(meta.join("events.jsonl")),
            meta,
            lock_timeout: DEFAULT_LOCK_TIMEOUT,
            pg: None,
        }
    }

    /// The store on a server, if this project's is.
    fn on_server(mut self, pg: Arc<pg::store::PgStore>) -> Self {
        self.log = EventLog::on_server(Arc::clone(&pg));
        self.pg = Some(pg);
        self
    }

    /// The time grants, questions and leases are judged by: the server's clock when the store is
    /// on one (machines sharing it agree however their clocks drift), else this machine's.
    pub fn now(&self) -> chrono::DateTime<chrono::Utc> {
        self.pg
            .as_deref()
            .map_or_else(chrono::Utc::now, pg::store::PgStore::now)
    }

    /// The server holding this project's store, if it is on one.
    pub fn server(&self) -> Option<&pg::store::PgStore> {
        self.pg.as_deref()
    }

    /// Whether this project's store is on a PostgreSQL server (its project name), not in files.
    pub fn server_project(&self) -> Option<&str> {
        self.pg.as_deref().map(pg::store::PgStore::project)
    }

    /// Creates `.meta/` with context.md (`context`, or the template), a fresh session and a log
    /// whose first event holds that session.
    ///
    /// # Errors
    /// [`StoreError::AlreadyInitialized`] when `.meta/session.json` exists; I/O errors.
    pub fn init(workspace: &Path, context: Option<&str>) -> Result<Self> {
        let store = Self::handle(workspace);
        std::fs::create_dir_all(&store.meta).at(&store.meta)?;
        context::write_gitignore(&store.meta)?;
        if let Some(pg) = backend::postgres(workspace, &store.meta, store.lock_timeout)? {
            let context = context.unwrap_or(context::TEMPLATE);
            let sha = context::sha256_hex(context.as_bytes());
            pg.init(
                context,
                &sha,
                SessionState::new(uuid::Uuid::new_v4().to_string()),
            )?;
            // A copy for people to read; the server's is the one checked.
            atomic::write_atomic(&store.context_path(), context.as_bytes())?;
            return Ok(store.on_server(pg));
        }
        let _guard = store.lock()?;
        if store.session_path().exists() || store.log.path().exists() {
            return Err(StoreError::AlreadyInitialized(store.meta.clone()));
        }
        let context = context.unwrap_or(context::TEMPLATE);
        atomic::write_atomic(&store.context_path(), context.as_bytes())?;
        let meta = StoreMeta {
            store_version: STORE_VERSION,
            context_sha256: context::sha256_hex(context.as_bytes()),
            context_next_sha256: None,
            created_at: log::now(),
        };
        store.write_raw_json(&store.meta.join("store.json"), &meta)?;
        store.set_base(SessionState::new(uuid::Uuid::new_v4().to_string()))?;
        Ok(store)
    }

    /// Opens an initialised project, refusing it if context.md changed, and folds into
    /// session.json any state event a crash left unfolded.
    ///
    /// # Errors
    /// [`StoreError::NotInitialized`], [`StoreError::ContextChanged`], I/O errors. A session.json
    /// that does not parse is not an error here (so `rebuild` can repair it); it is reported by the
    /// calls that need the state.
    pub fn open(workspace: &Path) -> Result<Self> {
        let store = Self::handle(workspace);
        if let Some(pg) = backend::postgres(workspace, &store.meta, store.lock_timeout)? {
            if pg.context()?.is_none() {
                return Err(StoreError::NotInitialized(workspace.to_path_buf()));
            }
            let store = store.on_server(pg);
            store.check_context()?;
            return Ok(store);
        }
        if !store.meta.join("store.json").exists() {
            return Err(StoreError::NotInitialized(workspace.to_path_buf()));
        }
        store.check_context()?;
        if let Ok(bytes) = std::fs::read(store.session_path()) {
            store.settle_session(&bytes)?;
        }
        Ok(store)
    }

    pub fn with_lock_timeout(mut self, timeout: Duration) -> Self {
        self.lock_timeout = timeout;
        self
    }

    pub fn workspace(&self) -> &Path {
        &self.workspace
    }

    pub fn meta_dir(&self) -> &Path {
        &self.meta
    }

    pub fn session_path(&self) -> PathBuf {
        self.meta.join("session.json")
    }

    pub fn context_path(&self) -> PathBuf {
        self.meta.join("context.md")
    }

    pub fn log(&self) -> &EventLog {
        &self.log
    }

    /// Takes the store lock (for callers that must group several store calls).
    pub fn lock(&self) -> Result<lock::LockGuard> {
        lock::acquire(&self.meta.join("lock"), self.lock_timeout)
    }

    /// The immutable context, after checking it is unchanged.
    pub fn context(&self) -> Result<String> {
        self.check_context()?;
        if let Some(pg) = &self.pg {
            return pg
                .context()?
                .map(|(text, _)| text)
                .ok_or_else(|| StoreError::NotInitialized(self.workspace.clone()));
        }
        std::fs::read_to_string(self.context_path()).at(&self.context_path())
    }

    fn check_context(&self) -> Result<()> {
        if let Some(pg) = &self.pg {
            return self.check_context_copy(pg);
        }
        let store_json = self.meta.join("store.json");
        let meta: StoreMeta =
            serde_json::from_value(self.read_raw_json(&store_json)?.unwrap_or(Value::Null))
                .map_err(|e| StoreError::BadFile {
                    path: store_json.clone(),
                    line: 1,
                    message: e.to_string(),
                })?;
        // store.json versions itself (and the layout of `.meta/`) with `store_version`.
        if meta.store_version != STORE_VERSION {
            return Err(StoreError::NewerVersion {
                path: store_json,
                what: "the store".into(),
                found: meta.store_version.to_string(),
                supported: STORE_VERSION.to_string(),
            });
        }
        let path = self.context_path();
        let bytes = std::fs::read(&path).at(&path)?;
        let found = context::sha256_hex(&bytes);
        if meta.context_next_sha256.as_deref() == Some(found.as_str()) {
            // A `set_context` killed after writing the file: finish it.
            return self.write_context_shas(&found, None);
        }
        if found != meta.context_sha256 {
            return Err(StoreError::ContextChanged {
                path,
                expected: meta.context_sha256,
                found,
            });
        }
        Ok(())
    }

    /// On a server the context is there, immutable; a copy in `.meta/context.md`, when there is
    /// one, must still be the same (the file backend's rule: context.md is never edited).
    fn check_context_copy(&self, pg: &pg::store::PgStore) -> Result<()> {
        let path = self.context_path();
        let Ok(bytes) = std::fs::read(&path) else {
            return Ok(());
        };
        let expected = pg.context_sha256()?;
        let found = context::sha256_hex(&bytes);
        if found != expected {
            return Err(StoreError::ContextChanged {
                path,
                expected,
                found,
            });
        }
        Ok(())
    }

    /// The session as session.json holds it.
    ///
    /// # Errors
    /// [`StoreError::BadSessionFile`] with file, line and column when it does not parse or match
    /// the schema.
    pub fn state(&self) -> Result<SessionState> {
        if let Some(pg) = &self.pg {
            return pg.state();
        }
        session::load(&self.session_path())
    }

    /// One value of the session by key path (`""` for all of it).
    pub fn get(&self, key: &str) -> Result<Value> {
        let state =
            serde_json::to_value(self.state()?).map_err(|e| StoreError::Rejected(e.to_string()))?;
        if key.is_empty() {
            return Ok(state);
        }
        keypath::get(&state, key)
            .cloned()
            .ok_or_else(|| StoreError::UnknownKey {
                key: key.to_string(),
                reason: "not set".into(),
            })
    }

    /// seed 000's `update_state`: sets one key path atomically and durably. Returns the new
    /// revision (the seq of its `state_update` event).
    ///
    /// # Errors
    /// Unknown key, invalid value, bad session file, changed context, lock timeout, I/O: in every
    /// case nothing was written.
    pub fn update_state(&self, key: &str, value: Value) -> Result<u64> {
        self.update_state_as(None, key, value, None)
    }

    /// `update_state` attributed to an agent, and fenced: with `expected_revision`, the write is
    /// refused unless the state is still at that revision (a writer that lost its lock, or computed
    /// its value from an old read, cannot overwrite newer state).
    pub fn update_state_as(
        &self,
        agent: Option<&str>,
        key: &str,
        value: Value,
        expected_revision: Option<u64>,
    ) -> Result<u64> {
        self.commit_state(agent, expected_revision, |_| {
            Ok(vec![(key.to_string(), value)])
        })
    }

    /// An atomic read-modify-write of one key: `f` gets the current value (if set) under the lock
    /// and returns the new one, so concurrent increments never lose an update.
    pub fn modify_state(
        &self,
        agent: Option<&str>,
        key: &str,
        f: impl FnOnce(Option<&Value>) -> Result<Value>,
    ) -> Result<u64> {
        self.commit_state(agent, None, |doc| {
            Ok(vec![(key.to_string(), f(keypath::get(doc, key))?)])
        })
    }

    /// Several key paths set as one update: one event, all or nothing (e.g. a task's status with
    /// its commits, or answering a checkpoint).
    pub fn update_many(
        &self,
        agent: Option<&str>,
        updates: Vec<(String, Value)>,
        expected_revision: Option<u64>,
    ) -> Result<u64> {
        self.commit_state(agent, expected_revision, |_| Ok(updates))
    }

    /// Like [`Store::modify_state`] over the whole session: `f` sees the current state and returns
    /// the updates to apply atomically (none: nothing is written, and the current revision is
    /// returned).
    pub fn transact(
        &self,
        agent: Option<&str>,
        f: impl FnOnce(&SessionState) -> Result<Vec<(String, Value)>>,
    ) -> Result<u64> {
        self.commit_state(agent, None, |doc| {
            let state: SessionState = serde_json::from_value(doc.clone())
                .map_err(|e| StoreError::Rejected(e.to_string()))?;
            f(&state)
        })
    }

    fn commit_state(
        &self,
        agent: Option<&str>,
        expected_revision: Option<u64>,
        compute: impl FnOnce(&Value) -> Result<Vec<(String, Value)>>,
    ) -> Result<u64> {
        let plan =
            |doc: Value, tail: &Tail| next_state(doc, tail, agent, expected_revision, compute);
        if let Some(pg) = &self.pg {
            self.check_context_copy(pg)?;
            return pg.commit_state(plan);
        }
        let _guard = self.lock()?;
        self.check_context()?;
        let (doc, tail) = self.load_current_value()?;
        let (state, event) = match plan(doc, &tail)? {
            Ok(next) => next,
            Err(current) => return Ok(current),
        };
        let bytes = session::to_bytes(&state)?;
        let path = self.session_path();
        let log_len = self.log.byte_len()?;
        // The event first (the truth), then the view (no directory fsync: a lost rename leaves
        // the old view, which the next open refolds from the log). If the view cannot be written
        // the event is taken back, so a failed update never reappears at the next recovery.
        self.log.append(&tail, &[event])?;
        if let Err(e) = atomic::write_view(&path, &bytes) {
            self.log.truncate_to(log_len)?;
            return Err(e);
        }
        Ok(state.revision)
    }

    /// Appends one event (not a state change) to the log; returns its seq.
    pub fn append(&self, kind: LogKind, agent: Option<&str>, data: Value) -> Result<u64> {
        let recs = self.append_batch(&[NewEvent::new(kind, agent, data)])?;
        Ok(recs.last().map(|r| r.seq).unwrap_or(0))
    }

    /// Appends several events with one fsync.
    pub fn append_batch(&self, events: &[NewEvent]) -> Result<Vec<LogRecord>> {
        if self.pg.is_some() {
            return self.append_locked(events);
        }
        let _guard = self.lock()?;
        self.append_locked(events)
    }

    /// Appends while the caller already holds the lock.
    pub fn append_locked(&self, events: &[NewEvent]) -> Result<Vec<LogRecord>> {
        if let Some(e) = events
            .iter()
            .find(|e| e.kind == LogKind::StateUpdate || e.kind == LogKind::SessionInit)
        {
            return Err(StoreError::Rejected(format!(
                "`{}` events are written only by update_state",
                e.kind
            )));
        }
        if let Some(pg) = &self.pg {
            return pg.append(events);
        }
        self.log.append(&self.log.tail()?, events)
    }

    /// Recreates the session from the log alone (does not write it).
    pub fn rebuild(&self) -> Result<SessionState> {
        rebuild::from_log(&self.log, u64::MAX)
    }

    /// The session as it stood after event `seq` (for audits and crash checks).
    pub fn rebuild_until(&self, seq: u64) -> Result<SessionState> {
        rebuild::from_log(&self.log, seq)
    }

    /// Rebuilds and replaces session.json; a session.json that does not parse is kept beside it as
    /// `session.json.bad-<time>` first, so nothing is lost.
    pub fn rebuild_and_save(&self) -> Result<SessionState> {
        if let Some(pg) = &self.pg {
            let state = self.rebuild()?;
            pg.save_rebuilt(&state)?;
            return Ok(state);
        }
        let _guard = self.lock()?;
        self.check_context()?;
        self.rebuild_and_save_locked()
    }

    fn rebuild_and_save_locked(&self) -> Result<SessionState> {
        let state = self.rebuild()?;
        let path = self.session_path();
        if let Ok(bytes) = std::fs::read(&path) {
            if session::parse(&path, &bytes).is_err() {
                let backup = self.meta.join(format!(
                    "session.json.bad-{}",
                    chrono::Utc::now().format("%Y%m%dT%H%M%S%.6f")
                ));
                atomic::write_atomic(&backup, &bytes)?;
            }
        }
        session::save(&path, &state)?;
        Ok(state)
    }

    /// The agent's own KV namespace.
    pub fn kv(&self, agent: &str) -> Result<Kv<'_>> {
        names::check(agent, "agent name")?;
        Ok(Kv {
            store: self,
            namespace: agent.to_string(),
            path: self.meta.join("kv").join(format!("{agent}.json")),
        })
    }

    /// The scratchpad all agents of the session share.
    pub fn scratchpad(&self) -> Kv<'_> {
        Kv {
            store: self,
            namespace: "scratchpad".to_string(),
            path: self.meta.join("scratchpad.json"),
        }
    }

    pub fn artifacts(&self) -> Artifacts<'_> {
        Artifacts {
            store: self,
            dir: self.meta.join("artifacts"),
        }
    }

    /// Reads `.meta/<name>.json` (`null` when absent). For other layers' small documents
    /// (consent grants, config caches).
    pub fn read_doc(&self, name: &str) -> Result<Value> {
        names::check(name, "document name")?;
        self.read_json(&self.meta.join(format!("{name}.json")))
    }

    /// Read-modify-write of `.meta/<name>.json` under the lock: `f` edits the document and returns
    /// the event that describes the change, which is made durable before the file is replaced.
    /// If `f` fails nothing is written.
    pub fn update_doc(
        &self,
        name: &str,
        f: impl FnOnce(&mut Value) -> Result<NewEvent>,
    ) -> Result<LogRecord> {
        names::check(name, "document name")?;
        self.update_json(&self.meta.join(format!("{name}.json")), f)
    }

    pub(crate) fn update_json(
        &self,
        path: &Path,
        f: impl FnOnce(&mut Value) -> Result<NewEvent>,
    ) -> Result<LogRecord> {
        if let Some(pg) = &self.pg {
            return pg.update_doc(&self.doc_name(path)?, f);
        }
        let _guard = self.lock()?;
        let mut doc = self.read_json(path)?;
        let event = f(&mut doc)?;
        let rec = self
            .append_locked(&[event])?
            .pop()
            .ok_or_else(|| StoreError::Rejected("no event was written".into()))?;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).at(dir)?;
        }
        self.write_json(path, &doc)?;
        Ok(rec)
    }

    /// A document's name on a server: its path under `.meta/` (`kv/agent.json`).
    fn doc_name(&self, path: &Path) -> Result<String> {
        path.strip_prefix(&self.meta)
            .ok()
            .and_then(Path::to_str)
            .map(|n| n.replace('\\', "/"))
            .ok_or_else(|| StoreError::Rejected(format!("{} is not under .meta/", path.display())))
    }

    /// A versioned document's data (`null` when absent): see [`envelope`].
    pub(crate) fn read_json(&self, path: &Path) -> Result<Value> {
        if let Some(pg) = &self.pg {
            return pg.read_doc(&self.doc_name(path)?);
        }
        Ok(self
            .read_doc_at(path)?
            .map(envelope::Doc::data)
            .unwrap_or(Value::Null))
    }

    fn read_doc_at(&self, path: &Path) -> Result<Option<envelope::Doc>> {
        self.read_raw_json(path)?
            .map(|v| envelope::open(path, v))
            .transpose()
    }

    fn read_raw_json(&self, path: &Path) -> Result<Option<Value>> {
        match std::fs::read(path) {
            Ok(bytes) => {
                serde_json::from_slice(&bytes)
                    .map(Some)
                    .map_err(|e| StoreError::BadFile {
                        path: path.to_path_buf(),
                        line: e.line(),
                        message: e.to_string(),
                    })
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(StoreError::io(path, e)),
        }
    }

    /// Writes `data` in its versioned envelope.
    fn write_json(&self, path: &Path, data: &Value) -> Result<()> {
        self.write_raw_json(path, &envelope::seal(data))
    }

    fn write_raw_json<T: Serialize>(&self, path: &Path, value: &T) -> Result<()> {
        let mut bytes =
            serde_json::to_vec_pretty(value).map_err(|e| StoreError::Rejected(e.to_string()))?;
        bytes.push(b'\n');
        atomic::write_atomic(path, &bytes)
    }

    /// On open, with session.json's `bytes` (read once): a file with no `revision` was not
    /// written by metash but by hand, as seed 001's example is written, and is taken as it is
    /// (validated, logged as the session's new base so `rebuild` gives it back, saved with its
    /// version and revision; otherwise the log's older state would be folded over it). A file
    /// metash wrote gets any state event a crash left unfolded. A file that does not parse or
    /// validate is left alone for the calls that need the state to report.
    fn settle_session(&self, bytes: &[u8]) -> Result<()> {
        let path = self.session_path();
        match serde_json::from_slice::<Value>(bytes) {
            Ok(Value::Object(m)) if !m.contains_key("revision") => {
                let _guard = self.lock()?;
                // Read again under the lock: another process may have adopted it meanwhile.
                let Ok(bytes) = std::fs::read(&path) else {
                    return Ok(());
                };
                let raw = match serde_json::from_slice::<Value>(&bytes) {
                    Ok(Value::Object(m)) if !m.contains_key("revision") => Value::Object(m),
                    _ => return Ok(()),
                };
                match session::parse(&path, &bytes).and_then(|_| keypath::validate(raw, "")) {
                    Ok(state) => self.set_base(state),
                    Err(_) => Ok(()),
                }
            }
            Ok(_) => match session::parse(&path, bytes) {
                Ok(state) if !self.unfolded(state.revision)?.is_empty() => {
                    let _guard = self.lock()?;
                    self.load_current().map(drop)
                }
                _ => Ok(()),
            },
            Err(_) if session::is_torn(bytes) => {
                let _guard = self.lock()?;
                match std::fs::read(&path) {
                    Ok(bytes) if session::is_torn(&bytes) => {
                        self.rebuild_and_save_locked().map(drop)
                    }
                    _ => Ok(()),
                }
            }
            Err(_) => Ok(()),
        }
    }

    /// Under the lock: `state` becomes the session's base, a `session_init` carrying it (so
    /// `rebuild` starts there) and session.json at that event's revision.
    fn set_base(&self, mut state: SessionState) -> Result<()> {
        let data = serde_json::to_value(&state).map_err(|e| StoreError::Rejected(e.to_string()))?;
        let rec = self.log.append(
            &self.log.tail()?,
            &[NewEvent::new(LogKind::SessionInit, None, data)],
        )?;
        state.revision = rec.first().map(|r| r.seq).unwrap_or(1);
        session::save(&self.session_path(), &state)
    }

    /// State events after `revision`, oldest first (what session.json has not folded yet).
    fn unfolded(&self, revision: u64) -> Result<Vec<LogRecord>> {
        let mut out = Vec::new();
        self.log.scan_back(|r| {
            if r.seq <= revision {
                return false;
            }
            if r.kind == LogKind::StateUpdate || r.kind == LogKind::SessionInit {
                out.push(r);
            }
            true
        })?;
        out.reverse();
        Ok(out)
    }

    /// Under the lock: the session with every durable state event folded in (repairing
    /// session.json if a crash came between the log append and the file write).
    fn load_current(&self) -> Result<SessionState> {
        let (doc, _) = self.load_current_value()?;
        keypath::validate(doc, "")
    }

    fn load_current_value(&self) -> Result<(Value, Tail)> {
        let state = self.state()?;
        let tail = self.log.tail()?;
        if state.revision > tail.seq {
            return Err(StoreError::BrokenLog {
                path: self.log.path().to_path_buf(),
                seq: tail.seq,
                reason: format!(
                    "session.json is at revision {} but the log ends at {}",
                    state.revision, tail.seq
                ),
            });
        }
        let pending = self.unfolded(state.revision)?;
        let mut doc =
            serde_json::to_value(&state).map_err(|e| StoreError::Rejected(e.to_string()))?;
        if !pending.is_empty() {
            let mut revision = state.revision;
            for rec in &pending {
                rebuild::fold(&mut doc, rec, self.log.path())?;
                revision = rec.seq;
            }
            let mut repaired = keypath::validate(doc, "")?;
            repaired.revision = revision;
            session::save(&self.session_path(), &repaired)?;
            doc =
                serde_json::to_value(&repaired).map_err(|e| StoreError::Rejected(e.to_string()))?;
        }
        Ok((doc, tail))
    }
}
