//! The store's API on PostgreSQL (`[store] url` in `.meta/config.toml`): what `.meta/` holds
//! on disk for the file backend, held in the server for a project, so processes on many
//! machines share one session, one log, one set of documents.
//!
//! Every write is one transaction that first locks the project's log head (`metash.heads`,
//! `FOR UPDATE`): that lock is the file backend's `.meta/lock`. It orders writers on every
//! machine, it is released by the server when its holder's connection dies, and it is given up
//! after `lock_timeout` with [`StoreError::LockTimeout`]. Unlike the file backend, the event
//! and the view it changes (the session, a document) commit together, so there is nothing to
//! settle after a crash.

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use metash_protocol::{LogRecord, SessionState};
use serde_json::Value;

use super::{log, Db, Transaction};
use crate::envelope;
use crate::error::{Result, StoreError};
use crate::log::codec::{decode, NewEvent, Tail, GENESIS_HASH};
use crate::log::ServerLog;

/// SQLSTATE `lock_not_available`: `lock_timeout` ran out.
const LOCK_NOT_AVAILABLE: &str = "55P03";

/// One project in one PostgreSQL database, with a small pool of connections.
pub struct PgStore {
    project: String,
    url: String,
    password: Option<String>,
    lock_timeout: Duration,
    pool: Mutex<Vec<Db>>,
    /// The context's sha256, read once: it never changes.
    context_sha: std::sync::OnceLock<String>,
    /// The server's clock minus this machine's, and when it was measured.
    offset: Mutex<Option<(std::time::Instant, chrono::Duration)>>,
}

/// How long a measured clock offset is trusted.
const OFFSET_FOR: Duration = Duration::from_secs(60);

/// Never the password.
impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("project", &self.project)
            .finish_non_exhaustive()
    }
}

/// How a write's transaction changes a document or the session: the new value, and the event
/// that says so; or nothing to write.
pub type Change<T> = Option<(T, NewEvent)>;

impl PgStore {
    /// Connects (checking the server and the schema) to `project` at `url`.
    ///
    /// # Errors
    /// As [`Db::open`].
    pub fn connect(
        url: &str,
        password: Option<String>,
        project: &str,
        lock_timeout: Duration,
    ) -> Result<Self> {
        let store = Self {
            project: project.to_string(),
            url: url.to_string(),
            password,
            lock_timeout,
            pool: Mutex::new(Vec::new()),
            context_sha: std::sync::OnceLock::new(),
            offset: Mutex::new(None),
        };
        store.with_db(|_| Ok(()))?;
        Ok(store)
    }

    pub fn project(&self) -> &str {
        &self.project
    }

    /// What error messages name where a file path would be.
    pub fn place(&self) -> PathBuf {
        format!("postgres:{}", self.project).into()
    }

    /// Runs `f` on one of this store's connections (the lease protocol's calls, for one).
    ///
    /// # Errors
    /// What `f` returns; no connection.
    pub fn db<T>(&self, f: impl FnOnce(&mut Db) -> Result<T>) -> Result<T> {
        self.with_db(f)
    }

    /// The time by the server's clock: what decides every lease, and what grants and questions
    /// expire by when the store is shared, so machines whose clocks disagree agree on both. The
    /// offset to this machine's clock is measured once a minute (a round trip), so asking costs
    /// nothing; with the server away, the last offset known stands.
    pub fn now(&self) -> chrono::DateTime<chrono::Utc> {
        chrono::Utc::now() + self.offset()
    }

    fn offset(&self) -> chrono::Duration {
        let Ok(mut held) = self.offset.lock() else {
            return chrono::Duration::zero();
        };
        if let Some((at, off)) = *held {
            if at.elapsed() < OFFSET_FOR {
                return off;
            }
        }
        let measured = self.with_db(|db| {
            let before = chrono::Utc::now();
            let micros: i64 = db
                .client()
                .query_one(
                    "SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint",
                    &[],
                )?
                .get(0);
            let after = chrono::Utc::now();
            let server = chrono::DateTime::from_timestamp_micros(micros).unwrap_or(after);
            Ok(server - (before + (after - before) / 2))
        });
        match measured {
            Ok(off) => {
                *held = Some((std::time::Instant::now(), off));
                off
            }
            Err(_) => held.map_or_else(chrono::Duration::zero, |(_, off)| off),
        }
    }

    /// Keeps `bytes` under `name` (a git bundle moving between machines).
    ///
    /// # Errors
    /// The database.
    pub fn put_blob(&self, name: &str, bytes: &[u8]) -> Result<()> {
        let project = self.project.clone();
        self.with_db(|db| {
            db.client().execute(
                "INSERT INTO metash.blobs (project, name, bytes) VALUES ($1, $2, $3)
                 ON CONFLICT (project, name) DO UPDATE SET bytes = EXCLUDED.bytes",
                &[&project, &name, &bytes],
            )?;
            Ok(())
        })
    }

    /// The bytes kept under `name`.
    ///
    /// # Errors
    /// The database.
    pub fn get_blob(&self, name: &str) -> Result<Option<Vec<u8>>> {
        let project = self.project.clone();
        self.with_db(|db| {
            let row = db.client().query_opt(
                "SELECT bytes FROM metash.blobs WHERE project = $1 AND name = $2",
                &[&project, &name],
            )?;
            Ok(row.map(|r| r.get(0)))
        })
    }

    /// Runs `f` on a pooled connection; a connection the server closed is not kept.
    fn with_db<T>(&self, f: impl FnOnce(&mut Db) -> Result<T>) -> Result<T> {
        let pooled = self.pool.lock().ok().and_then(|mut p| p.pop());
        let mut db = match pooled {
            Some(db) => db,
            None => {
                let mut db = Db::open(&self.url, self.password.as_deref())?;
                let ms = self.lock_timeout.as_millis();
                db.client()
                    .batch_execute(&format!("SET lock_timeout = {ms}"))?;
                db
            }
        };
        let out = f(&mut db).map_err(|e| self.timeout(e));
        if !db.client().is_closed() {
            if let Ok(mut pool) = self.pool.lock() {
                pool.push(db);
            }
        }
        out
    }

    /// A lock wait that ran out becomes the same error the file backend gives.
    fn timeout(&self, e: StoreError) -> StoreError {
        match e {
            StoreError::Database(m) if m.contains(LOCK_NOT_AVAILABLE) => StoreError::LockTimeout {
                path: self.place(),
                waited_ms: u64::try_from(self.lock_timeout.as_millis()).unwrap_or(u64::MAX),
                holder: String::new(),
            },
            other => other,
        }
    }

    /// Runs `f` in a transaction holding the project's head; commits what it returns `Ok`.
    fn write<T>(
        &self,
        f: impl FnOnce(&mut Transaction<'_>, &log::Statements, Tail) -> Result<T>,
    ) -> Result<T> {
        let project = self.project.clone();
        self.with_db(|db| {
            let Db { client, s, .. } = db;
            let mut tx = client.transaction()?;
            let tail = log::lock_head(&mut tx, s, &project)?;
            let out = f(&mut tx, s, tail)?;
            tx.commit()?;
            Ok(out)
        })
    }

    /// Whether the project was initialised; its context and the context's sha256 if so.
    ///
    /// # Errors
    /// The database.
    pub fn context(&self) -> Result<Option<(String, String)>> {
        let project = self.project.clone();
        let found = self.with_db(|db| {
            let row = db.client().query_opt(
                "SELECT context, context_sha256 FROM metash.projects WHERE project = $1",
                &[&project],
            )?;
            Ok(row.map(|r| (r.get::<_, String>(0), r.get::<_, String>(1))))
        })?;
        // The sha never changes once the project exists: keep it for the checks.
        if let Some((_, sha)) = &found {
            let _ = self.context_sha.set(sha.clone());
        }
        Ok(found)
    }

    /// The context's sha256.
    ///
    /// # Errors
    /// [`StoreError::NotInitialized`]; the database.
    pub fn context_sha256(&self) -> Result<String> {
        if let Some(sha) = self.context_sha.get() {
            return Ok(sha.clone());
        }
        let (_, sha) = self
            .context()?
            .ok_or_else(|| StoreError::NotInitialized(self.place()))?;
        Ok(self.context_sha.get_or_init(|| sha).clone())
    }

    /// Creates the project: its context, and its session whose first event holds `state`.
    ///
    /// # Errors
    /// [`StoreError::AlreadyInitialized`] when the project exists; the database.
    pub fn init(&self, context: &str, sha256: &str, mut state: SessionState) -> Result<()> {
        let project = self.project.clone();
        let place = self.place();
        self.write(|tx, s, _| {
            let made = tx.execute(
                "INSERT INTO metash.projects (project, context, context_sha256) VALUES ($1, $2, $3)
                 ON CONFLICT DO NOTHING",
                &[&project, &context, &sha256],
            )?;
            if made == 0 {
                return Err(StoreError::AlreadyInitialized(place));
            }
            let data =
                serde_json::to_value(&state).map_err(|e| StoreError::Rejected(e.to_string()))?;
            let rec = log::append(
                tx,
                s,
                &project,
                &[NewEvent::new(
                    metash_protocol::LogKind::SessionInit,
                    None,
                    data,
                )],
            )?;
            state.revision = rec.first().map_or(1, |r| r.seq);
            save_session(tx, &project, &state)
        })
    }

    /// The session as the server holds it.
    ///
    /// # Errors
    /// [`StoreError::NotInitialized`] for an unknown project; the database.
    pub fn state(&self) -> Result<SessionState> {
        let project = self.project.clone();
        let place = self.place();
        self.with_db(|db| {
            let row = db
                .client()
                .query_opt(
                    "SELECT doc FROM metash.sessions WHERE project = $1",
                    &[&project],
                )?
                .ok_or(StoreError::NotInitialized(place))?;
            let doc: Value = row.get(0);
            serde_json::from_value(doc).map_err(|e| StoreError::Rejected(e.to_string()))
        })
    }

    /// A state change: `plan` gets the current session document and the log's tail (under the
    /// head's lock) and returns the new session with its event, or the revision to report when
    /// there is nothing to write.
    ///
    /// # Errors
    /// What `plan` returns; the database.
    pub fn commit_state(
        &self,
        plan: impl FnOnce(Value, &Tail) -> Result<std::result::Result<(SessionState, NewEvent), u64>>,
    ) -> Result<u64> {
        let project = self.project.clone();
        let place = self.place();
        self.write(|tx, s, tail| {
            let row = tx
                .query_opt(
                    "SELECT doc FROM metash.sessions WHERE project = $1",
                    &[&project],
                )?
                .ok_or(StoreError::NotInitialized(place))?;
            match plan(row.get(0), &tail)? {
                Err(current) => Ok(current),
                Ok((state, event)) => {
                    log::append(tx, s, &project, &[event])?;
                    save_session(tx, &project, &state)?;
                    Ok(state.revision)
                }
            }
        })
    }

    /// Appends `events` (not state changes: the caller checked).
    ///
    /// # Errors
    /// The database.
    pub fn append(&self, events: &[NewEvent]) -> Result<Vec<LogRecord>> {
        let project = self.project.clone();
        self.write(|tx, s, _| log::append(tx, s, &project, events))
    }

    /// Document `name` (relative to `.meta/`, as `kv/agent.json`), `null` when absent.
    ///
    /// # Errors
    /// A document newer than this build; the database.
    pub fn read_doc(&self, name: &str) -> Result<Value> {
        let project = self.project.clone();
        self.with_db(|db| {
            let row = db.client().query_opt(
                "SELECT doc FROM metash.docs WHERE project = $1 AND name = $2",
                &[&project, &name],
            )?;
            open_doc(name, row.map(|r| r.get(0)))
        })
    }

    /// Read-modify-write of document `name`: `f` edits it and returns the event that says so,
    /// committed together.
    ///
    /// # Errors
    /// What `f` returns (nothing is written); the database.
    pub fn update_doc(
        &self,
        name: &str,
        f: impl FnOnce(&mut Value) -> Result<NewEvent>,
    ) -> Result<LogRecord> {
        let project = self.project.clone();
        self.write(|tx, s, _| {
            let row = tx.query_opt(
                "SELECT doc FROM metash.docs WHERE project = $1 AND name = $2 FOR UPDATE",
                &[&project, &name],
            )?;
            let mut doc = open_doc(name, row.map(|r| r.get(0)))?;
            let event = f(&mut doc)?;
            let rec = log::append(tx, s, &project, &[event])?
                .pop()
                .ok_or_else(|| StoreError::Rejected("no event was written".into()))?;
            tx.execute(
                "INSERT INTO metash.docs (project, name, doc) VALUES ($1, $2, $3)
                 ON CONFLICT (project, name) DO UPDATE SET doc = EXCLUDED.doc",
                &[&project, &name, &envelope::seal(&doc)],
            )?;
            Ok(rec)
        })
    }

    /// The session rebuilt from the log replaces the view.
    ///
    /// # Errors
    /// The database.
    pub fn save_rebuilt(&self, state: &SessionState) -> Result<()> {
        let project = self.project.clone();
        self.write(|tx, _, _| save_session(tx, &project, state))
    }

    /// The log's last record (genesis when empty).
    ///
    /// # Errors
    /// The database.
    pub fn tail(&self) -> Result<Tail> {
        let project = self.project.clone();
        self.with_db(|db| {
            let row = db.client().query_opt(
                "SELECT seq, hash FROM metash.heads WHERE project = $1",
                &[&project],
            )?;
            Ok(row.map_or_else(
                || Tail {
                    seq: 0,
                    hash: GENESIS_HASH.to_string(),
                },
                |r| Tail {
                    seq: u64::try_from(r.get::<_, i64>(0)).unwrap_or(0),
                    hash: r.get(1),
                },
            ))
        })
    }

    /// Up to `max` records after seq `after`.
    ///
    /// # Errors
    /// A broken record; the database.
    pub fn read_after(&self, after: u64, max: usize) -> Result<Vec<LogRecord>> {
        let project = self.project.clone();
        self.with_db(|db| log::read_after(db, &project, after, max))
    }

    /// Records newest first, in pages, until `visit` says stop.
    ///
    /// # Errors
    /// A broken record; the database.
    pub fn scan_back(&self, mut visit: impl FnMut(LogRecord) -> bool) -> Result<()> {
        let mut before = i64::MAX;
        loop {
            let project = self.project.clone();
            let page: Vec<LogRecord> = self.with_db(|db| {
                let rows = db.client().query(
                    "SELECT seq, line FROM metash.log WHERE project = $1 AND seq < $2
                     ORDER BY seq DESC LIMIT 1000",
                    &[&project, &before],
                )?;
                rows.iter()
                    .map(|r| {
                        let line: &str = r.get(1);
                        decode(line.as_bytes()).map_err(|e| StoreError::BrokenLog {
                            path: self.place(),
                            seq: u64::try_from(r.get::<_, i64>(0)).unwrap_or(0),
                            reason: format!("{e:?}"),
                        })
                    })
                    .collect()
            })?;
            let Some(last) = page.last() else {
                return Ok(());
            };
            before = log::db_seq(last.seq)?;
            for rec in page {
                if !visit(rec) {
                    return Ok(());
                }
            }
        }
    }
}

/// The file log's view of this store's log ([`crate::log::EventLog`] on a server).
impl ServerLog for PgStore {
    fn place(&self) -> PathBuf {
        PgStore::place(self)
    }

    fn tail(&self) -> Result<Tail> {
        PgStore::tail(self)
    }

    fn read_after(&self, after: u64, max: usize) -> Result<Vec<LogRecord>> {
        PgStore::read_after(self, after, max)
    }

    fn scan_back(&self, visit: &mut dyn FnMut(LogRecord) -> bool) -> Result<()> {
        PgStore::scan_back(self, visit)
    }
}

fn save_session(tx: &mut Transaction<'_>, project: &str, state: &SessionState) -> Result<()> {
    let doc = serde_json::to_value(state).map_err(|e| StoreError::Rejected(e.to_string()))?;
    let revision = log::db_seq(state.revision)?;
    tx.execute(
        "INSERT INTO metash.sessions (project, revision, doc) VALUES ($1, $2, $3)
         ON CONFLICT (project) DO UPDATE SET revision = EXCLUDED.revision, doc = EXCLUDED.doc",
        &[&project, &revision, &doc],
    )?;
    Ok(())
}

/// A stored document's data (its envelope opened), `null` when absent.
fn open_doc(name: &str, doc: Option<Value>) -> Result<Value> {
    match doc {
        None => Ok(Value::Null),
        Some(v) => Ok(envelope::open(std::path::Path::new(name), v)?.data()),
    }
}
