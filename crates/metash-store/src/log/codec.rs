//! The log's encoding, shared by every backend: how an event becomes its line and hash
//! ([`encode_batch`]), how a line is checked and read back ([`decode`]), and how records are
//! checked in chain order ([`Chain`]). The file log ([`super::EventLog`]) and the PostgreSQL
//! backend (`crate::pg::log`) both build on it, and it imports neither: the two backends write
//! the same bytes and hashes without knowing of each other.

use std::path::Path;

use metash_protocol::{LogKind, LogRecord, LOG_SCHEMA_VERSION};
use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::error::{Result, StoreError};

/// The `prev` of the first record.
pub const GENESIS_HASH: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// `,"hash":"` + 64 hex digits + `"}`: the fixed-size suffix of every line.
const HASH_SUFFIX_LEN: usize = 9 + 64 + 2;

/// An event to append; the log assigns `seq`, `ts`, `prev` and `hash`.
#[derive(Debug, Clone, PartialEq)]
pub struct NewEvent {
    pub kind: LogKind,
    pub agent: Option<String>,
    pub data: Value,
}

impl NewEvent {
    pub fn new(kind: LogKind, agent: Option<&str>, data: Value) -> Self {
        Self {
            kind,
            agent: agent.map(str::to_string),
            data,
        }
    }
}

/// The last record's position in the chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tail {
    pub seq: u64,
    pub hash: String,
}

impl Tail {
    pub(crate) fn genesis() -> Self {
        Self {
            seq: 0,
            hash: GENESIS_HASH.to_string(),
        }
    }
}

#[derive(Serialize)]
struct Body<'a> {
    schema_version: u32,
    seq: u64,
    ts: &'a str,
    kind: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    agent: Option<&'a str>,
    data: &'a Value,
    prev: &'a str,
}

/// Serialises one record as its line (with `\n`), computing its hash.
fn encode(seq: u64, ts: &str, ev: &NewEvent, prev: &str) -> Result<(Vec<u8>, String)> {
    let body = serde_json::to_vec(&Body {
        schema_version: LOG_SCHEMA_VERSION,
        seq,
        ts,
        kind: ev.kind.as_str(),
        agent: ev.agent.as_deref(),
        data: &ev.data,
        prev,
    })
    .map_err(|e| StoreError::Rejected(format!("event is not serialisable: {e}")))?;
    let hash = hex::encode(Sha256::digest(&body));
    let mut line = body;
    line.pop(); // the closing brace
    line.extend_from_slice(b",\"hash\":\"");
    line.extend_from_slice(hash.as_bytes());
    line.extend_from_slice(b"\"}\n");
    Ok((line, hash))
}

/// The lines (each with its `\n`) and records of `events` appended after `tail`, one timestamp
/// for the batch: what every backend writes.
pub(crate) fn encode_batch(
    tail: &Tail,
    events: &[NewEvent],
) -> Result<(Vec<Vec<u8>>, Vec<LogRecord>)> {
    let ts = now();
    let mut lines = Vec::with_capacity(events.len());
    let mut out = Vec::with_capacity(events.len());
    let mut prev = tail.hash.clone();
    for (i, ev) in events.iter().enumerate() {
        let seq = tail.seq + 1 + i as u64;
        let (line, hash) = encode(seq, &ts, ev, &prev)?;
        lines.push(line);
        out.push(LogRecord {
            schema_version: LOG_SCHEMA_VERSION,
            seq,
            ts: ts.clone(),
            kind: ev.kind.clone(),
            agent: ev.agent.clone(),
            data: ev.data.clone(),
            prev: std::mem::replace(&mut prev, hash.clone()),
            hash,
        });
    }
    Ok((lines, out))
}

/// Why a line is not a record this build can use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Undecodable {
    /// A newer metash wrote it.
    Newer { found: u32 },
    /// Not a record, or not the record its hash says.
    Broken(String),
}

impl Undecodable {
    pub(crate) fn at(self, path: &Path, seq: u64) -> StoreError {
        match self {
            Self::Newer { found } => StoreError::NewerVersion {
                path: path.to_path_buf(),
                what: match seq {
                    0 => "a log record".to_string(),
                    n => format!("log record {n}"),
                },
                found: found.to_string(),
                supported: LOG_SCHEMA_VERSION.to_string(),
            },
            Self::Broken(reason) => StoreError::BrokenLog {
                path: path.to_path_buf(),
                seq,
                reason,
            },
        }
    }
}

/// Checks one line's own hash and returns the parsed record.
pub fn decode(line: &[u8]) -> std::result::Result<LogRecord, Undecodable> {
    let record: LogRecord = serde_json::from_slice(line)
        .map_err(|e| Undecodable::Broken(format!("not a log record: {e}")))?;
    if record.schema_version != LOG_SCHEMA_VERSION {
        return Err(Undecodable::Newer {
            found: record.schema_version,
        });
    }
    if line.len() < HASH_SUFFIX_LEN || !line.ends_with(b"\"}") {
        return Err(Undecodable::Broken(
            "line does not end with its hash".into(),
        ));
    }
    let cut = line.len() - HASH_SUFFIX_LEN;
    if &line[cut..cut + 9] != b",\"hash\":\"" {
        return Err(Undecodable::Broken("hash is not the last field".into()));
    }
    let mut hasher = Sha256::new();
    hasher.update(&line[..cut]);
    hasher.update(b"}");
    let computed = hex::encode(hasher.finalize());
    if computed != record.hash {
        return Err(Undecodable::Broken(format!(
            "hash mismatch (stored {}, computed {computed})",
            record.hash
        )));
    }
    Ok(record)
}

/// Records checked in chain order, whatever holds them: `seq` without gaps, each `prev` the
/// hash before it.
pub(crate) struct Chain<'a> {
    path: &'a Path,
    expect: Tail,
}

impl<'a> Chain<'a> {
    pub(crate) fn new(path: &'a Path) -> Self {
        Self {
            path,
            expect: Tail::genesis(),
        }
    }

    pub(crate) fn last_seq(&self) -> u64 {
        self.expect.seq
    }

    pub(crate) fn last(&self) -> &Tail {
        &self.expect
    }

    pub(crate) fn next_seq(&self) -> u64 {
        self.expect.seq + 1
    }

    /// `rec` follows what came before, or the error names where the chain breaks.
    pub(crate) fn check(&mut self, rec: &LogRecord) -> Result<()> {
        let broken = |reason: String| StoreError::BrokenLog {
            path: self.path.to_path_buf(),
            seq: self.next_seq(),
            reason,
        };
        if rec.seq != self.next_seq() {
            return Err(broken(format!(
                "seq {} where {} was expected (gap or reorder)",
                rec.seq,
                self.next_seq()
            )));
        }
        if rec.prev != self.expect.hash {
            return Err(broken(
                "prev does not match the previous record's hash".into(),
            ));
        }
        self.expect = Tail {
            seq: rec.seq,
            hash: rec.hash.clone(),
        };
        Ok(())
    }
}

/// RFC 3339 UTC with microseconds.
pub fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}
