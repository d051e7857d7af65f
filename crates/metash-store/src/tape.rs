//! `.meta/tapes/`: what each model turn exchanged through the credential proxy (issue 36,
//! docs/replay.md). Bodies are content-addressed blobs (`blobs/<sha256>`, written once, shared by
//! every tape that holds the same bytes); each turn has an index, `<id>.json`, naming its agent,
//! task and attempt and, per exchange in order, the request and response with their blobs and the
//! arrival offset of each streamed chunk. A `tape` record in the log links the turn to its tape.
//! Tapes are runtime state: `.meta/.gitignore` keeps them out of git (everything there not
//! allow-listed is), and `metash gc` applies the `[record]` retention to them.
//!
//! The store writes what it is given: redaction happens before, at the credential proxy, which
//! is the only place that knows the secret.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use metash_protocol::LogKind;
use serde::{Deserialize, Serialize};
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::artifacts::GcReport;
use crate::atomic::{sync_dir, write_atomic};
use crate::error::{IoContext, Result, StoreError};
use crate::log::NewEvent;
use crate::Store;

/// The index format this build writes and reads.
pub const TAPE_SCHEMA_VERSION: u32 = 1;

/// The directory under `.meta/`.
pub const TAPES_DIR: &str = "tapes";

/// How long a blob no index names is kept by gc: a turn being recorded writes its blobs as its
/// exchanges end and its index when it ends.
pub const BLOB_GRACE: Duration = Duration::from_secs(24 * 3600);

/// A stored body: its sha256 names the blob.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlobRef {
    pub sha256: String,
    pub bytes: u64,
    /// The proxy recorded only the first bytes (its cap); the rest was forwarded, not kept.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
}

/// One exchange of a turn, in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TapeExchange {
    /// 1, 2, ... within the tape, in the order the exchanges ended.
    pub seq: u32,
    pub route: String,
    pub method: String,
    /// Path and query as the agent sent them.
    pub target: String,
    /// Milliseconds from the tape's start to the request's arrival.
    pub at_ms: u64,
    /// Lowercase names; auth and cookie headers were never recorded.
    pub request_headers: Vec<(String, String)>,
    pub request_body: BlobRef,
    pub status: u16,
    pub response_headers: Vec<(String, String)>,
    /// Milliseconds from the request to the response head.
    pub head_ms: u64,
    /// `[offset_ms, bytes]` per response chunk as it arrived (offsets from the request).
    pub chunks: Vec<(u64, u64)>,
    pub response_body: BlobRef,
    /// How the response ended: `complete`, `upstream_error`, `client_gone`, `withdrawn`.
    pub end: String,
    pub duration_ms: u64,
}

/// One turn's tape (`.meta/tapes/<id>.json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tape {
    pub schema_version: u32,
    pub id: String,
    /// The control plane's session (`.meta/session.json`'s `sessionId`) when there is one.
    #[serde(default)]
    pub session_id: Option<String>,
    /// The agent (role) that ran the turn.
    pub agent: String,
    /// The CLI or API frontend of the role.
    #[serde(default)]
    pub frontend: Option<String>,
    #[serde(default)]
    pub task: Option<String>,
    #[serde(default)]
    pub attempt: Option<u32>,
    /// RFC 3339, UTC.
    pub started_at: String,
    pub ended_at: String,
    pub exchanges: Vec<TapeExchange>,
    /// What the turn was asked (`None` in tapes recorded before it was kept): what `metash
    /// replay` runs again, since the prompt the orchestrator built depends on the session's
    /// state at that moment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spawn: Option<TapeSpawn>,
}

/// The spawn a turn ran: its prompts, its options and the directory it worked in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TapeSpawn {
    pub system_prompt: String,
    pub user_message: String,
    /// The spawn's `SpawnOptions` (model hint, timeout, token cap) as JSON.
    #[serde(default)]
    pub options: serde_json::Value,
    /// The workdir as the CLI was given it (resolved): a replay in another worktree puts its own
    /// in its place in the recorded requests.
    #[serde(default)]
    pub workdir: Option<String>,
}

impl Tape {
    /// Request and response body bytes of every exchange (what the tape's blobs hold).
    pub fn body_bytes(&self) -> u64 {
        self.exchanges
            .iter()
            .map(|e| e.request_body.bytes + e.response_body.bytes)
            .sum()
    }
}

/// A tape in [`Tapes::list`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TapeSummary {
    pub id: String,
    pub agent: String,
    pub task: Option<String>,
    pub attempt: Option<u32>,
    /// The tape's `session_id`: an interactive session's id for its tapes (which have no task).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    pub started_at: String,
    pub exchanges: usize,
    pub bytes: u64,
}

/// How long tapes are kept (`[record]` in config.toml).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TapeRetention {
    /// Tapes older than this are removed.
    pub max_age: Duration,
    /// Then the oldest until the rest (their body bytes) fit.
    pub max_total_bytes: u64,
}

impl Default for TapeRetention {
    /// 30 days, 1 GiB.
    fn default() -> Self {
        Self {
            max_age: Duration::from_secs(30 * 24 * 3600),
            max_total_bytes: 1 << 30,
        }
    }
}

/// The tapes of one project.
#[derive(Debug)]
pub struct Tapes<'a> {
    store: &'a Store,
    dir: PathBuf,
}

impl<'a> Tapes<'a> {
    pub fn new(store: &'a Store) -> Self {
        Self {
            store,
            dir: store.meta_dir().join(TAPES_DIR),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn blob_dir(&self) -> PathBuf {
        self.dir.join("blobs")
    }

    /// A fresh tape id: UTC time, agent, and a random suffix (sortable by time).
    pub fn new_id(agent: &str) -> String {
        let agent: String = agent
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .take(40)
            .collect();
        let rand = uuid::Uuid::new_v4().simple().to_string();
        format!(
            "{}-{agent}-{}",
            chrono::Utc::now().format("%Y%m%dT%H%M%SZ"),
            &rand[..8]
        )
    }

    /// Stores `bytes` under their sha256, once: a blob already there with these very bytes is
    /// kept (and touched), anything else under the name is replaced. Written to a temp file in
    /// the same directory and renamed, without an fsync: a blob is checked against its name
    /// whenever it is read or reused, so one a power cut left empty or zero-filled is reported
    /// as damaged, and written anew by the next turn that holds those bytes. Measured: an fsync
    /// per blob (and its directory) made a recorded pi turn 1.13× an unrecorded one; without,
    /// 1.00× (`cargo bench -p metash-host --bench record_turn`). The tape's index and its log
    /// record are written durably.
    ///
    /// # Errors
    /// The blob cannot be written.
    pub fn put_blob(&self, bytes: &[u8], truncated: bool) -> Result<BlobRef> {
        let sha = hex::encode(Sha256::digest(bytes));
        let dir = self.blob_dir();
        std::fs::create_dir_all(&dir).at(&dir)?;
        let path = dir.join(&sha);
        let len = bytes.len() as u64;
        let present = std::fs::metadata(&path).is_ok_and(|m| m.is_file() && m.len() == len)
            && std::fs::read(&path).is_ok_and(|b| b == bytes);
        // A blob found is touched: its time says it is in use (gc spares recent blobs no index
        // names yet, the turn being recorded may be the one using it).
        let touched = present
            && std::fs::OpenOptions::new()
                .append(true)
                .open(&path)
                .and_then(|f| f.set_modified(SystemTime::now()))
                .is_ok();
        if !touched {
            crate::atomic::write_view(&path, bytes)?;
        }
        Ok(BlobRef {
            sha256: sha,
            bytes: len,
            truncated,
        })
    }

    /// A blob's bytes, checked against its name.
    ///
    /// # Errors
    /// Not a sha256, missing, or its bytes no longer hash to its name.
    pub fn blob(&self, sha256: &str) -> Result<Vec<u8>> {
        if sha256.len() != 64 || !sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(invalid(sha256, "is not a sha256"));
        }
        let path = self.blob_dir().join(sha256.to_ascii_lowercase());
        let bytes = std::fs::read(&path).at(&path)?;
        if hex::encode(Sha256::digest(&bytes)) != sha256.to_ascii_lowercase() {
            return Err(StoreError::BadFile {
                path,
                line: 0,
                message: "the blob's bytes do not match its sha256".into(),
            });
        }
        Ok(bytes)
    }

    /// Writes the tape's index (its blobs must be stored already) and logs a `tape` record
    /// linking it. Returns the record's seq.
    ///
    /// # Errors
    /// A bad id, or the index or the log cannot be written.
    pub fn save(&self, tape: &Tape) -> Result<u64> {
        crate::names::check(&tape.id, "tape id")?;
        std::fs::create_dir_all(&self.dir).at(&self.dir)?;
        let path = self.index_path(&tape.id);
        let mut bytes = serde_json::to_vec_pretty(tape)
            .map_err(|e| StoreError::Rejected(format!("tape {}: {e}", tape.id)))?;
        bytes.push(b'\n');
        write_atomic(&path, &bytes)?;
        self.store.append(
            LogKind::Tape,
            Some(&tape.agent),
            json!({
                "id": tape.id,
                "agent": tape.agent,
                "task": tape.task,
                "attempt": tape.attempt,
                "exchanges": tape.exchanges.len(),
                "bytes": tape.body_bytes(),
            }),
        )
    }

    fn index_path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }

    /// One tape.
    ///
    /// # Errors
    /// A bad id, no such tape, an index that does not parse, or one newer than this build.
    pub fn get(&self, id: &str) -> Result<Tape> {
        crate::names::check(id, "tape id")?;
        read_index(&self.index_path(id))
    }

    /// The tapes' index files with their modification time, oldest first.
    fn indexes(&self) -> Result<Vec<(SystemTime, PathBuf)>> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(StoreError::io(&self.dir, e)),
        };
        let mut out = Vec::new();
        for entry in entries {
            let entry = entry.at(&self.dir)?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let meta = entry.metadata().at(&entry.path())?;
            if !meta.is_file() || name.starts_with('.') || !name.ends_with(".json") {
                continue;
            }
            let modified = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
            out.push((modified, entry.path()));
        }
        out.sort();
        Ok(out)
    }

    /// Every tape, oldest first. An index that cannot be read is skipped.
    ///
    /// # Errors
    /// The directory cannot be read.
    pub fn list(&self) -> Result<Vec<TapeSummary>> {
        let mut out: Vec<TapeSummary> = self
            .indexes()?
            .iter()
            .filter_map(|(_, path)| read_index(path).ok())
            .map(|t| TapeSummary {
                exchanges: t.exchanges.len(),
                bytes: t.body_bytes(),
                id: t.id,
                agent: t.agent,
                task: t.task,
                attempt: t.attempt,
                session_id: t.session_id,
                started_at: t.started_at,
            })
            .collect();
        out.sort_by(|a, b| a.started_at.cmp(&b.started_at).then(a.id.cmp(&b.id)));
        Ok(out)
    }

    /// Applies `policy` as of `now`: removes the tapes older than its age, then the oldest
    /// until the rest fit its size, then every blob no remaining tape names, except those
    /// written or reused within [`BLOB_GRACE`] (or the policy's age, if shorter): a turn being
    /// recorded writes its blobs before its index. Logs a `gc` record (`what: "tapes"`) when
    /// anything was removed.
    ///
    /// # Errors
    /// The directory or a file cannot be read or removed, or the log cannot be written.
    pub fn gc(&self, policy: TapeRetention, now: SystemTime) -> Result<GcReport> {
        let _guard = self.store.lock()?;
        let tapes: Vec<(SystemTime, PathBuf, Option<Tape>)> = self
            .indexes()?
            .into_iter()
            .map(|(m, p)| {
                let t = read_index(&p).ok();
                (m, p, t)
            })
            .collect();
        let size = |t: &Option<Tape>| t.as_ref().map_or(0, Tape::body_bytes);
        let mut total: u64 = tapes.iter().map(|t| size(&t.2)).sum();
        let mut report = GcReport::default();
        let mut live = HashSet::new();
        for (modified, path, tape) in &tapes {
            let age = now.duration_since(*modified).unwrap_or_default();
            // An index that does not parse (a newer build's, a damaged file) is kept.
            if tape.is_some() && (age > policy.max_age || total > policy.max_total_bytes) {
                std::fs::remove_file(path).at(path)?;
                total -= size(tape);
                report.removed_bytes += size(tape);
                report.removed.push(file_stem(path));
            } else {
                report.kept += 1;
                report.kept_bytes += size(tape);
                if let Some(t) = tape {
                    live.extend(t.exchanges.iter().flat_map(|e| {
                        [
                            e.request_body.sha256.clone(),
                            e.response_body.sha256.clone(),
                        ]
                    }));
                }
            }
        }
        let unsure = tapes.iter().any(|t| t.2.is_none());
        let keep_after = now
            .checked_sub(policy.max_age.min(BLOB_GRACE))
            .unwrap_or(SystemTime::UNIX_EPOCH);
        let swept = self.sweep_blobs(&live, unsure, keep_after)?;
        if !report.removed.is_empty() || swept > 0 {
            sync_dir(&self.dir)?;
            self.store.append_locked(&[NewEvent::new(
                LogKind::Gc,
                None,
                json!({"what": "tapes", "removed": report.removed,
                       "removed_bytes": report.removed_bytes, "blobs_removed": swept}),
            )])?;
        }
        Ok(report)
    }

    /// Removes blobs not in `live` and last written before `keep_after`; none when an
    /// unreadable index might name them.
    fn sweep_blobs(
        &self,
        live: &HashSet<String>,
        unsure: bool,
        keep_after: SystemTime,
    ) -> Result<usize> {
        let dir = self.blob_dir();
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(StoreError::io(&dir, e)),
        };
        if unsure {
            return Ok(0);
        }
        let mut removed = 0;
        for entry in entries {
            let entry = entry.at(&dir)?;
            let name = entry.file_name().to_string_lossy().into_owned();
            // Temp files of a writer still at work start with `.`.
            if name.starts_with('.') || live.contains(&name) {
                continue;
            }
            let modified = entry.metadata().and_then(|m| m.modified());
            if modified.map_or(true, |m| m > keep_after) {
                continue;
            }
            std::fs::remove_file(entry.path()).at(&entry.path())?;
            removed += 1;
        }
        if removed > 0 {
            sync_dir(&dir)?;
        }
        Ok(removed)
    }

    /// Every byte under `.meta/tapes/`, for a test that searches it for a key.
    ///
    /// # Errors
    /// A file cannot be read.
    pub fn all_bytes(&self) -> Result<Vec<(PathBuf, Vec<u8>)>> {
        let mut out = Vec::new();
        let mut stack = vec![self.dir.clone()];
        while let Some(dir) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries {
                let path = entry.at(&dir)?.path();
                if path.is_dir() {
                    stack.push(path);
                } else {
                    let bytes = std::fs::read(&path).at(&path)?;
                    out.push((path, bytes));
                }
            }
        }
        Ok(out)
    }
}

fn invalid(name: &str, reason: &str) -> StoreError {
    StoreError::InvalidName {
        name: name.to_string(),
        reason: format!("blob name {reason}"),
    }
}

fn file_stem(path: &Path) -> String {
    path.file_stem()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Reads an index, refusing one newer than this build.
fn read_index(path: &Path) -> Result<Tape> {
    let bytes = std::fs::read(path).at(path)?;
    let value: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|e| bad_file(path, &e))?;
    let version = value
        .get("schema_version")
        .and_then(serde_json::Value::as_u64)
        .unwrap_or(1);
    if version > u64::from(TAPE_SCHEMA_VERSION) {
        return Err(StoreError::NewerVersion {
            path: path.to_path_buf(),
            what: "tape".into(),
            found: version.to_string(),
            supported: TAPE_SCHEMA_VERSION.to_string(),
        });
    }
    serde_json::from_value(value).map_err(|e| bad_file(path, &e))
}

fn bad_file(path: &Path, e: &serde_json::Error) -> StoreError {
    StoreError::BadFile {
        path: path.to_path_buf(),
        line: e.line(),
        message: e.to_string(),
    }
}

#[cfg(test)]
#[path = "tape_tests.rs"]
mod tests;
