//! Control-plane sessions (seed 003's CP session): one record per interactive CLI session metash
//! started (`metash session start`, `metash attach`), kept in the versioned document
//! `.meta/cp_sessions.json`. Every change is one `cp_session` event in the log, made durable
//! before the document is replaced (the store's `update_doc`: under the lock, temp file, rename),
//! so a crash leaves the old record or the new one, and the log says what happened.
//!
//! The record holds what the control plane needs to find the session again (its terminal, its
//! process), to resume it (the provider-typed continuation key), and to say honestly whether it
//! still runs (`status`, checked against the process by the caller).

use std::collections::BTreeMap;
use std::path::PathBuf;

use chrono::{DateTime, Utc};
use metash_protocol::{HarnessFrontend, LogKind, ProviderDomain};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::error::{Result, StoreError};
use crate::log::NewEvent;
use crate::Store;

/// The document's name under `.meta/`.
pub const DOC: &str = "cp_sessions";

/// Where a session stands. A closed set: a listing never shows anything else.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SessionStatus {
    /// Its process runs (someone may be looking at it, or not).
    Running,
    /// Its process runs and the person who attached through metash detached.
    Detached,
    /// Its process ended (or was found dead: a killed terminal server, a reboot); it can be
    /// resumed when its continuation key is known.
    Exited,
    /// Closed for good by `metash session end`.
    Ended,
}

impl SessionStatus {
    /// Whether the record claims a live process.
    pub fn is_live(self) -> bool {
        matches!(self, Self::Running | Self::Detached)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Detached => "detached",
            Self::Exited => "exited",
            Self::Ended => "ended",
        }
    }
}

/// What happened to a session: the `event` of its `cp_session` log record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SessionEvent {
    Start,
    Attach,
    Detach,
    Exit,
    Resume,
    End,
    /// Something about the running session became known: its continuation key, its terminal
    /// and process.
    Observed,
}

impl SessionEvent {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Start => "start",
            Self::Attach => "attach",
            Self::Detach => "detach",
            Self::Exit => "exit",
            Self::Resume => "resume",
            Self::End => "end",
            Self::Observed => "observed",
        }
    }
}

/// The terminal multiplexer hosting a session. Only tmux today.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TerminalHost {
    Tmux,
}

/// Where the session's terminal is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Terminal {
    pub host: TerminalHost,
    /// `session:window` as tmux prints it (what a person types after `tmux attach -t`).
    pub target: String,
    /// tmux's window id (`@N`): stable while the server lives, unlike the index.
    #[serde(default)]
    pub window_id: Option<String>,
    /// The tmux server's socket when it is not the user's default one.
    #[serde(default)]
    pub socket: Option<PathBuf>,
}

/// The process running in the terminal, identified beyond its pid so a reused pid (after a
/// reboot, or a long time) is never taken for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessRef {
    pub pid: u32,
    /// Its start time in clock ticks since boot (`/proc/PID/stat` field 22), when known.
    #[serde(default)]
    pub start_ticks: Option<u64>,
    /// The kernel's boot id when it started (`/proc/sys/kernel/random/boot_id`).
    #[serde(default)]
    pub boot_id: Option<String>,
}

/// One CP session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CpSession {
    pub id: String,
    /// The role of `.meta/config.toml` it runs (absent for `metash attach` without `--role`).
    #[serde(default)]
    pub role: Option<String>,
    pub frontend: HarnessFrontend,
    pub provider: ProviderDomain,
    /// The provider-native key its conversation resumes with, once observed.
    #[serde(default)]
    pub continuation_key: Option<String>,
    pub workdir: PathBuf,
    /// The directory metash owns for it (the CLI's HOME and state; where its key is read).
    #[serde(default)]
    pub home: Option<PathBuf>,
    #[serde(default)]
    pub terminal: Option<Terminal>,
    #[serde(default)]
    pub process: Option<ProcessRef>,
    pub status: SessionStatus,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// The exit code of its last process (`None` while it runs, or when it was found dead).
    #[serde(default)]
    pub exit_status: Option<i32>,
    /// Why its last run ended other than by the CLI exiting (it could not start, it was found
    /// dead), for the listing.
    #[serde(default)]
    pub error: Option<String>,
    /// How many times its CLI was started (1, then one more per resume).
    #[serde(default = "one")]
    pub runs: u32,
}

fn one() -> u32 {
    1
}

/// A new session id: short enough to type (`s-` and 12 hex digits).
pub fn new_id() -> String {
    let u = uuid::Uuid::new_v4().simple().to_string();
    format!("s-{}", &u[..12])
}

/// The sessions of a project.
pub struct CpSessions<'a> {
    store: &'a Store,
}

impl Store {
    /// The project's CP sessions.
    pub fn cp_sessions(&self) -> CpSessions<'_> {
        CpSessions { store: self }
    }
}

impl CpSessions<'_> {
    /// Every session, oldest first.
    ///
    /// # Errors
    /// The document cannot be read, or a record does not parse (named).
    pub fn list(&self) -> Result<Vec<CpSession>> {
        let mut all: Vec<CpSession> = decode(self.store.read_doc(DOC)?)?.into_values().collect();
        all.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        Ok(all)
    }

    /// One session, or `None`.
    ///
    /// # Errors
    /// As [`CpSessions::list`].
    pub fn get(&self, id: &str) -> Result<Option<CpSession>> {
        Ok(decode(self.store.read_doc(DOC)?)?.remove(id))
    }

    /// Records a new session (`start`).
    ///
    /// # Errors
    /// An id already recorded, a bad id, or the store cannot be written.
    pub fn create(&self, session: &CpSession) -> Result<()> {
        crate::names::check(&session.id, "session id")?;
        let rec = session.clone();
        self.store.update_doc(DOC, |doc| {
            let mut all = decode(doc.clone())?;
            if all.contains_key(&rec.id) {
                return Err(StoreError::Rejected(format!(
                    "session `{}` already exists",
                    rec.id
                )));
            }
            let event = event_for(&rec, SessionEvent::Start, None);
            all.insert(rec.id.clone(), rec);
            *doc = encode(&all)?;
            Ok(event)
        })?;
        Ok(())
    }

    /// Changes one session under the store lock: `f` edits the record (it may refuse, and then
    /// nothing is written); the `event` is logged with the record as it is after `f`.
    /// `updated_at` is set here.
    ///
    /// # Errors
    /// No such session, `f`'s refusal, or the store cannot be written.
    pub fn update(
        &self,
        id: &str,
        event: SessionEvent,
        f: impl FnOnce(&mut CpSession) -> Result<()>,
    ) -> Result<CpSession> {
        let mut out = None;
        self.store.update_doc(DOC, |doc| {
            let mut all = decode(doc.clone())?;
            let rec = all
                .get_mut(id)
                .ok_or_else(|| StoreError::Rejected(format!("no session `{id}`")))?;
            let before = rec.status;
            f(rec)?;
            rec.updated_at = Utc::now();
            let ev = event_for(rec, event, Some(before));
            out = Some(rec.clone());
            *doc = encode(&all)?;
            Ok(ev)
        })?;
        out.ok_or_else(|| StoreError::Rejected(format!("no session `{id}`")))
    }
}

/// The log event for a change: what a reader of the log needs without the document.
fn event_for(s: &CpSession, event: SessionEvent, before: Option<SessionStatus>) -> NewEvent {
    NewEvent::new(
        LogKind::CpSession,
        s.role.as_deref(),
        json!({
            "id": s.id,
            "event": event.as_str(),
            "status": s.status.as_str(),
            "previous_status": before.map(SessionStatus::as_str),
            "role": s.role,
            "frontend": s.frontend,
            "provider": s.provider,
            "continuation_key": s.continuation_key,
            "workdir": s.workdir,
            "terminal": s.terminal,
            "pid": s.process.as_ref().map(|p| p.pid),
            "exit_status": s.exit_status,
            "error": s.error,
            "runs": s.runs,
        }),
    )
}

fn decode(doc: Value) -> Result<BTreeMap<String, CpSession>> {
    match doc {
        Value::Null => Ok(BTreeMap::new()),
        v => serde_json::from_value(v).map_err(|e| StoreError::BadFile {
            path: PathBuf::from(format!(".meta/{DOC}.json")),
            line: 0,
            message: format!("a session record does not parse: {e}"),
        }),
    }
}

fn encode(all: &BTreeMap<String, CpSession>) -> Result<Value> {
    serde_json::to_value(all).map_err(|e| StoreError::Rejected(e.to_string()))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn session(id: &str) -> CpSession {
        let now = Utc::now();
        CpSession {
            id: id.into(),
            role: Some("coder".into()),
            frontend: HarnessFrontend::ClaudeCode,
            provider: ProviderDomain::Anthropic,
            continuation_key: None,
            workdir: "/w".into(),
            home: None,
            terminal: None,
            process: None,
            status: SessionStatus::Running,
            created_at: now,
            updated_at: now,
            exit_status: None,
            error: None,
            runs: 1,
        }
    }

    #[test]
    fn a_session_is_recorded_changed_and_logged() {
        let d = tempfile::tempdir().unwrap();
        let store = Store::init(d.path(), None).unwrap();
        let s = store.cp_sessions();
        s.create(&session("s1")).unwrap();
        assert!(s.create(&session("s1")).is_err(), "ids are unique");
        assert!(s.create(&session("../x")).is_err(), "ids are names");
        let after = s
            .update("s1", SessionEvent::Exit, |r| {
                r.status = SessionStatus::Exited;
                r.exit_status = Some(3);
                Ok(())
            })
            .unwrap();
        assert_eq!(after.status, SessionStatus::Exited);
        // A refusal writes nothing.
        let refused = s.update("s1", SessionEvent::End, |_| {
            Err(StoreError::Rejected("no".into()))
        });
        assert!(refused.is_err());
        let got = s.get("s1").unwrap().unwrap();
        assert_eq!(got.exit_status, Some(3));
        assert_eq!(got.status, SessionStatus::Exited);
        assert!(s.update("nope", SessionEvent::End, |_| Ok(())).is_err());
        let log = std::fs::read_to_string(d.path().join(".meta/events.jsonl")).unwrap();
        let events: Vec<Value> = log
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .filter(|e| e["kind"] == "cp_session")
            .collect();
        assert_eq!(events.len(), 2, "{log}");
        assert_eq!(events[0]["data"]["event"], "start");
        assert_eq!(events[1]["data"]["event"], "exit");
        assert_eq!(events[1]["data"]["previous_status"], "running");
        assert_eq!(events[1]["data"]["exit_status"], 3);
    }

    #[test]
    fn an_unknown_status_is_refused_with_the_file_named() {
        let d = tempfile::tempdir().unwrap();
        let store = Store::init(d.path(), None).unwrap();
        store.cp_sessions().create(&session("s1")).unwrap();
        store
            .update_doc(DOC, |doc| {
                doc["s1"]["status"] = json!("zombie");
                Ok(NewEvent::new(LogKind::Progress, None, json!({})))
            })
            .unwrap();
        let err = store.cp_sessions().list().unwrap_err().to_string();
        assert!(err.contains("cp_sessions.json"), "{err}");
    }
}
