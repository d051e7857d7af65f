//! The store side of `metash fork --at SEQ` (docs/replay.md, "Fork"): a new project's `.meta/`
//! whose log is another session's first SEQ records, byte for byte, then a `fork` record naming
//! where they came from and a `session_init` carrying the session as it stood at SEQ under a new
//! session id.
//!
//! Why a byte-for-byte prefix: every record hashes its own bytes and the one before it, so the
//! copy verifies as it did in the original (`metash log verify`), and anyone can check that the
//! fork's history *is* the original's by comparing the first SEQ lines. Why a `session_init`
//! after it rather than folding on: the new session id belongs to the store (no `state_update`
//! may set it), and a `session_init` is where `rebuild` starts.
//!
//! The original is only ever read: its log is opened read-only (never through [`crate::EventLog`],
//! whose tail repair may cut a torn line), and no lock of it is taken.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use metash_protocol::{LogKind, LogRecord, SessionState};
use serde_json::{Map, Value};

use crate::error::{IoContext, Result, StoreError};
use crate::log::codec::Chain;
use crate::log::{decode, NewEvent, Tail};
use crate::tape::Tapes;
use crate::{atomic, context, names, rebuild, Store, StoreMeta, STORE_VERSION};

/// What a person writes in `.meta/` (the entries [`context::GITIGNORE`] lets into git): copied
/// from the original as they are now, since the log does not hold them.
const PERSON_FILES: &[&str] = &[
    ".gitignore",
    "config.toml",
    "policy.toml",
    "agents",
    "prompts",
];

/// The first records of a log, as they were written.
#[derive(Debug, Clone)]
pub struct Prefix {
    /// The log file it was read from (for messages).
    path: PathBuf,
    /// Every line with its newline, byte for byte.
    bytes: Vec<u8>,
    pub records: Vec<LogRecord>,
}

impl Prefix {
    /// The last record's seq.
    pub fn seq(&self) -> u64 {
        self.records.last().map_or(0, |r| r.seq)
    }

    /// The last record's hash: what the fork's next record chains to.
    pub fn hash(&self) -> &str {
        self.records.last().map_or("", |r| r.hash.as_str())
    }

    /// The session as it stood after the prefix's last record.
    ///
    /// # Errors
    /// [`StoreError::BrokenLog`] when the prefix has no `session_init` or its state events do not
    /// fold into a valid session.
    pub fn state(&self) -> Result<SessionState> {
        let mut doc = Value::Null;
        let mut revision = 0;
        for rec in &self.records {
            if rec.kind == LogKind::SessionInit || rec.kind == LogKind::StateUpdate {
                rebuild::fold(&mut doc, rec, &self.path)?;
                revision = rec.seq;
            }
        }
        let broken = |reason: String| StoreError::BrokenLog {
            path: self.path.clone(),
            seq: revision.max(1),
            reason,
        };
        if doc.is_null() {
            return Err(broken("the records up to it hold no session_init".into()));
        }
        let mut state: SessionState = serde_json::from_value(doc)
            .map_err(|e| broken(format!("the folded state does not match the schema: {e}")))?;
        state.revision = revision;
        Ok(state)
    }
}

/// Reads the first `seq` records of the log of the project at `workspace`, checking each
/// record's hash and the chain, without writing anything there.
///
/// # Errors
/// [`StoreError::Rejected`] naming `seq` when it is 0 or past the log's last record (and that
/// last seq); [`StoreError::NotInitialized`] without a log; a broken record.
pub fn read_prefix(workspace: &Path, seq: u64) -> Result<Prefix> {
    if seq == 0 {
        return Err(StoreError::Rejected(
            "seq 0 is not a record: the log's records are numbered from 1".into(),
        ));
    }
    let prefix = read_records(workspace, seq)?;
    if prefix.seq() < seq {
        return Err(StoreError::Rejected(format!(
            "seq {seq} is past the end of the log {} (its last record is {})",
            prefix.path.display(),
            prefix.seq()
        )));
    }
    Ok(prefix)
}

/// Every record of the log at `workspace` (read-only, as [`read_prefix`]).
pub fn read_whole(workspace: &Path) -> Result<Prefix> {
    read_records(workspace, u64::MAX)
}

/// Up to `limit` complete records; a final line without its newline (an append a crash cut)
/// is not a record.
fn read_records(workspace: &Path, limit: u64) -> Result<Prefix> {
    let path = workspace.join(".meta").join("events.jsonl");
    let file = match File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if !workspace.join(".meta").is_dir() {
                return Err(StoreError::NotInitialized(workspace.to_path_buf()));
            }
            return Err(StoreError::Rejected(format!(
                "no event log file {} (a store on a PostgreSQL server cannot be forked)",
                path.display()
            )));
        }
        Err(e) => return Err(StoreError::io(&path, e)),
    };
    let mut reader = BufReader::with_capacity(256 * 1024, file);
    let (mut bytes, mut records, mut line) = (Vec::new(), Vec::new(), Vec::new());
    let mut chain = Chain::new(&path);
    while (records.len() as u64) < limit {
        line.clear();
        let n = reader.read_until(b'\n', &mut line).at(&path)?;
        if n == 0 || line.last() != Some(&b'\n') {
            break;
        }
        let rec = decode(&line[..n - 1]).map_err(|e| e.at(&path, chain.next_seq()))?;
        chain.check(&rec)?;
        bytes.extend_from_slice(&line);
        records.push(rec);
    }
    Ok(Prefix {
        path,
        bytes,
        records,
    })
}

/// What the new store holds besides the prefix.
#[derive(Debug, Clone)]
pub struct ForkSpec {
    /// The session at the fork point, as the caller wants it to continue (its id is replaced).
    pub state: SessionState,
    /// The context the fork runs with.
    pub context: String,
    /// The `fork` record's data; `session_id` (the new one) and `context_sha256` are added.
    pub data: Value,
}

/// Creates `into/.meta/` from `prefix` of the project whose `.meta/` is `origin_meta`: the
/// person's files copied, the prefix, the `fork` record, the new session's `session_init`, and
/// the KV namespaces and scratchpad as the prefix's `kv_set` records left them. Returns the
/// store and the new session id.
///
/// # Errors
/// [`StoreError::AlreadyInitialized`] when `into` holds a log or session already; I/O.
pub fn create(
    into: &Path,
    origin_meta: &Path,
    prefix: &Prefix,
    spec: ForkSpec,
) -> Result<(Store, String)> {
    let store = Store::handle(into);
    if store.session_path().exists() || store.log.path().exists() {
        return Err(StoreError::AlreadyInitialized(store.meta.clone()));
    }
    std::fs::create_dir_all(&store.meta).at(&store.meta)?;
    for name in PERSON_FILES {
        copy_tree(&origin_meta.join(name), &store.meta.join(name))?;
    }
    context::write_gitignore(&store.meta)?;
    atomic::write_atomic(&store.context_path(), spec.context.as_bytes())?;
    let context_sha256 = context::sha256_hex(spec.context.as_bytes());
    let meta = StoreMeta {
        store_version: STORE_VERSION,
        context_sha256: context_sha256.clone(),
        context_next_sha256: None,
        created_at: crate::log::now(),
    };
    store.write_raw_json(&store.meta.join("store.json"), &meta)?;
    let origin = Store::handle(origin_meta.parent().unwrap_or(origin_meta));
    let tapes = copy_tapes(&origin, &store, &prefix.records)?;
    atomic::write_atomic(store.log.path(), &prefix.bytes)?;
    let session_id = uuid::Uuid::new_v4().to_string();
    let mut data = match spec.data {
        Value::Object(m) => m,
        _ => Map::new(),
    };
    data.insert("tapes".into(), Value::from(tapes));
    data.insert("session_id".into(), Value::String(session_id.clone()));
    data.insert("context_sha256".into(), Value::String(context_sha256));
    let mut state = spec.state;
    state.session_id = session_id.clone();
    {
        let _guard = store.lock()?;
        let tail = Tail {
            seq: prefix.seq(),
            hash: prefix.hash().to_string(),
        };
        let fork = NewEvent::new(LogKind::Fork, None, Value::Object(data));
        store.log.append(&tail, &[fork])?;
        store.set_base(state)?;
    }
    write_kv(&store, &prefix.records)?;
    Ok((store, session_id))
}

/// Writes `.meta/<name>.json` (in its versioned envelope) with no record: for a fork only, whose
/// log already holds the records that made the document (consent grants, folded by the caller).
///
/// # Errors
/// A bad name; I/O.
pub fn write_view(store: &Store, name: &str, data: &Value) -> Result<()> {
    names::check(name, "document name")?;
    store.write_json(&store.meta.join(format!("{name}.json")), data)
}

/// The KV namespaces and the scratchpad as the `kv_set` records in `records` left them.
fn write_kv(store: &Store, records: &[LogRecord]) -> Result<()> {
    let mut spaces: BTreeMap<String, Map<String, Value>> = BTreeMap::new();
    for rec in records.iter().filter(|r| r.kind == LogKind::KvSet) {
        let (Some(ns), Some(key)) = (
            rec.data.get("namespace").and_then(Value::as_str),
            rec.data.get("key").and_then(Value::as_str),
        ) else {
            continue;
        };
        let space = spaces.entry(ns.to_string()).or_default();
        match rec.data.get("value") {
            Some(v) if !v.is_null() => space.insert(key.to_string(), v.clone()),
            _ => space.remove(key),
        };
    }
    for (ns, map) in spaces {
        let path = if ns == "scratchpad" {
            store.meta.join("scratchpad.json")
        } else if names::check(&ns, "agent name").is_ok() {
            store.meta.join("kv").join(format!("{ns}.json"))
        } else {
            continue;
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).at(dir)?;
        }
        store.write_json(&path, &Value::Object(map))?;
    }
    Ok(())
}

/// The tapes the `tape` records in `records` name, index and blobs, so `metash tape` and
/// `metash replay` work in the fork on the turns before the fork point. Copied, not linked: a
/// blob shared by inode would have the original's time touched when the fork reuses it. A tape
/// that gc removed since, or that does not read, is skipped. Returns how many were copied.
fn copy_tapes(origin: &Store, store: &Store, records: &[LogRecord]) -> Result<usize> {
    let (from, to) = (Tapes::new(origin), Tapes::new(store));
    let ids = records
        .iter()
        .filter(|r| r.kind == LogKind::Tape)
        .filter_map(|r| r.data.get("id").and_then(Value::as_str));
    let mut copied = 0;
    for id in ids {
        let Ok(tape) = from.get(id) else {
            continue;
        };
        let blobs = to.dir().join("blobs");
        std::fs::create_dir_all(&blobs).at(&blobs)?;
        for ex in &tape.exchanges {
            for blob in [&ex.request_body.sha256, &ex.response_body.sha256] {
                let named = blob.len() == 64 && blob.bytes().all(|b| b.is_ascii_hexdigit());
                let (src, dst) = (from.dir().join("blobs").join(blob), blobs.join(blob));
                if named && src.is_file() && !dst.exists() {
                    std::fs::copy(&src, &dst).at(&dst)?;
                }
            }
        }
        let index = format!("{id}.json");
        std::fs::copy(from.dir().join(&index), to.dir().join(&index)).at(to.dir())?;
        copied += 1;
    }
    Ok(copied)
}

/// Copies a file or a directory tree (regular files and directories only: a symbolic link is
/// not followed, so nothing outside `.meta/` is copied in). Absent: nothing to copy.
fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    let meta = match std::fs::symlink_metadata(from) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(StoreError::io(from, e)),
    };
    if meta.is_file() {
        std::fs::copy(from, to).at(to)?;
    } else if meta.is_dir() {
        std::fs::create_dir_all(to).at(to)?;
        for entry in std::fs::read_dir(from).at(from)? {
            let entry = entry.at(from)?;
            copy_tree(&entry.path(), &to.join(entry.file_name()))?;
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "fork_tests.rs"]
mod tests;
