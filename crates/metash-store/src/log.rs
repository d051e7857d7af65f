//! The append-only, hash-chained event log (`.meta/events.jsonl`), one [`LogRecord`] per line.
//!
//! Why JSONL and not SQLite: the log is append-only and read front to back (rebuild, verify,
//! export) or from the back (tail); a text file gives that with one `write` and one `fdatasync`
//! per append, is greppable by people, and needs no C dependency. The hash is computed over the
//! exact bytes written, so verification never depends on re-serialising JSON the same way.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use metash_protocol::{LogKind, LogRecord, LOG_SCHEMA_VERSION};
use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

use std::sync::Arc;

use crate::error::{IoContext, Result, StoreError};
use crate::pg::store::PgStore;

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
    fn at(self, path: &Path, seq: u64) -> StoreError {
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

/// The log: the file, or the project's rows on a PostgreSQL server (`pg`), read the same way.
/// All mutating calls must be made under the store lock.
#[derive(Debug, Clone)]
pub struct EventLog {
    path: PathBuf,
    pg: Option<Arc<PgStore>>,
}

impl EventLog {
    pub fn new(path: PathBuf) -> Self {
        Self { path, pg: None }
    }

    /// The log of a project held by a PostgreSQL server.
    pub(crate) fn on_server(pg: Arc<PgStore>) -> Self {
        Self {
            path: pg.place(),
            pg: Some(pg),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends `events` with one write and one fdatasync, after `tail` (which the caller read under
    /// the lock). Returns the records as written.
    pub fn append(&self, tail: &Tail, events: &[NewEvent]) -> Result<Vec<LogRecord>> {
        let (lines, out) = encode_batch(tail, events)?;
        let buf = lines.concat();
        let mut f = OpenOptions::new()
            .append(true)
            .create(true)
            .open(&self.path)
            .at(&self.path)?;
        let len_before = f.metadata().at(&self.path)?.len();
        if let Err(e) = f.write_all(&buf).and_then(|()| f.sync_data()) {
            // Leave no partial line behind: the events were never acknowledged.
            let _ = f.set_len(len_before);
            let _ = f.sync_data();
            return Err(StoreError::io(&self.path, e));
        }
        Ok(out)
    }

    /// A number that grows whenever the log does (the file's length, or the server's last
    /// seq), for a watcher that re-reads only after a change; 0 when it cannot be read.
    pub fn change_mark(&self) -> u64 {
        match &self.pg {
            Some(pg) => pg.tail().map_or(0, |t| t.seq),
            None => std::fs::metadata(&self.path).map_or(0, |m| m.len()),
        }
    }

    /// The file's length: a point [`EventLog::truncate_to`] can return to.
    pub fn byte_len(&self) -> Result<u64> {
        match std::fs::metadata(&self.path) {
            Ok(m) => Ok(m.len()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
            Err(e) => Err(StoreError::io(&self.path, e)),
        }
    }

    /// Takes back events appended after `len`, for a write whose second half (session.json)
    /// failed: they were never acknowledged, and leaving them would apply them at the next
    /// recovery although the caller was told the update failed. Only under the lock.
    pub(crate) fn truncate_to(&self, len: u64) -> Result<()> {
        let f = OpenOptions::new()
            .write(true)
            .open(&self.path)
            .at(&self.path)?;
        f.set_len(len).at(&self.path)?;
        f.sync_data().at(&self.path)
    }

    /// Reads the last complete record, first cutting off a torn final line (a write that a crash
    /// interrupted: it was never acknowledged, because acknowledgement follows the fsync).
    pub fn tail(&self) -> Result<Tail> {
        if let Some(pg) = &self.pg {
            return pg.tail();
        }
        let mut tail = Tail::genesis();
        self.scan_back(|r| {
            tail = Tail {
                seq: r.seq,
                hash: r.hash,
            };
            false
        })?;
        Ok(tail)
    }

    /// Visits records newest first until `visit` returns false, reading the file backwards in
    /// growing chunks: finding what session.json has not folded yet costs only the records after it.
    pub fn scan_back(&self, mut visit: impl FnMut(LogRecord) -> bool) -> Result<()> {
        if let Some(pg) = &self.pg {
            return pg.scan_back(visit);
        }
        let mut f = match File::options().read(true).write(true).open(&self.path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(StoreError::io(&self.path, e)),
        };
        let mut end = repair_torn_tail(&mut f, &self.path)?;
        // Bytes of a line that started before the chunk we read last.
        let mut carry: Vec<u8> = Vec::new();
        let mut chunk = 8 * 1024u64;
        while end > 0 {
            let start = end.saturating_sub(chunk);
            let mut buf = vec![0u8; (end - start) as usize];
            f.seek(SeekFrom::Start(start)).at(&self.path)?;
            f.read_exact(&mut buf).at(&self.path)?;
            buf.extend_from_slice(&carry);
            let first_complete = if start == 0 {
                0
            } else {
                match buf.iter().position(|&b| b == b'\n') {
                    Some(p) => p + 1,
                    None => {
                        carry = buf;
                        end = start;
                        chunk = chunk.saturating_mul(2);
                        continue;
                    }
                }
            };
            for line in buf[first_complete..]
                .split(|&b| b == b'\n')
                .filter(|l| !l.is_empty())
                .rev()
            {
                let rec = decode(line).map_err(|e| e.at(&self.path, 0))?;
                if !visit(rec) {
                    return Ok(());
                }
            }
            buf.truncate(first_complete.saturating_sub(1));
            carry = buf;
            end = start;
        }
        Ok(())
    }

    /// Up to `max` complete records from byte `offset` on (a value this returned before, or 0),
    /// and the offset after the last of them: how a reader in another process follows the log
    /// (`metash ui`'s live stream) without reading it all again, in bounded memory. Each line's
    /// own hash is checked. An offset past the end (the log was cut back, as after a failed
    /// update) is an error naming it; the caller starts again from 0.
    ///
    /// On a server the offset is a seq: the records after it, and the last one's seq.
    pub fn read_from(&self, offset: u64, max: usize) -> Result<(Vec<LogRecord>, u64)> {
        if let Some(pg) = &self.pg {
            let records = pg.read_after(offset, max)?;
            let at = records.last().map_or(offset, |r| r.seq);
            return Ok((records, at));
        }
        let mut file = match File::open(&self.path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && offset == 0 => {
                return Ok((Vec::new(), 0))
            }
            Err(e) => return Err(StoreError::io(&self.path, e)),
        };
        let len = file.metadata().at(&self.path)?.len();
        if offset > len {
            return Err(StoreError::BrokenLog {
                path: self.path.clone(),
                seq: 0,
                reason: format!("read from byte {offset}, past the end ({len} bytes)"),
            });
        }
        file.seek(SeekFrom::Start(offset)).at(&self.path)?;
        let mut reader = BufReader::with_capacity(64 * 1024, file);
        let (mut out, mut at, mut line) = (Vec::new(), offset, Vec::with_capacity(512));
        while out.len() < max {
            line.clear();
            let n = reader.read_until(b'\n', &mut line).at(&self.path)?;
            if n == 0 || line.last() != Some(&b'\n') {
                // The end, or a line still being written: read it next time.
                break;
            }
            at += n as u64;
            line.pop();
            let seq = out.last().map_or(0, |r: &LogRecord| r.seq) + 1;
            out.push(decode(&line).map_err(|e| e.at(&self.path, seq))?);
        }
        Ok((out, at))
    }

    /// Every record in order. Each line's own hash is checked; the chain is checked by
    /// [`EventLog::verify`].
    pub fn read_all(&self) -> Result<Vec<LogRecord>> {
        let mut out = Vec::new();
        self.for_each(|r| {
            out.push(r);
            Ok(())
        })?;
        Ok(out)
    }

    /// Streams every record in order, checking hashes and the chain as it goes.
    pub fn for_each(&self, mut f: impl FnMut(LogRecord) -> Result<()>) -> Result<()> {
        if let Some(pg) = &self.pg {
            return self.for_each_on_server(pg, f);
        }
        let file = match File::open(&self.path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(StoreError::io(&self.path, e)),
        };
        let mut reader = BufReader::with_capacity(256 * 1024, file);
        let mut line = Vec::with_capacity(512);
        let mut chain = Chain::new(&self.path);
        loop {
            line.clear();
            let n = reader.read_until(b'\n', &mut line).at(&self.path)?;
            if n == 0 {
                return Ok(());
            }
            if line.last() != Some(&b'\n') {
                // Torn tail of a crashed append: never acknowledged, not part of the log.
                return Ok(());
            }
            line.pop();
            let rec = decode(&line).map_err(|e| e.at(&self.path, chain.next_seq()))?;
            chain.check(&rec)?;
            f(rec)?;
        }
    }

    /// [`EventLog::for_each`] over a server's rows, page by page, with the same checks.
    fn for_each_on_server(
        &self,
        pg: &PgStore,
        mut f: impl FnMut(LogRecord) -> Result<()>,
    ) -> Result<()> {
        let mut chain = Chain::new(&self.path);
        loop {
            let page = pg.read_after(chain.last_seq(), 5_000)?;
            if page.is_empty() {
                return Ok(());
            }
            for rec in page {
                chain.check(&rec)?;
                f(rec)?;
            }
        }
    }

    /// Checks the whole chain; returns the number of records.
    ///
    /// # Errors
    /// [`StoreError::BrokenLog`] naming the first broken record.
    pub fn verify(&self) -> Result<u64> {
        let mut n = 0;
        self.for_each(|_| {
            n += 1;
            Ok(())
        })?;
        Ok(n)
    }
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

    fn next_seq(&self) -> u64 {
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

/// Truncates a final line that has no newline; returns the file length after.
fn repair_torn_tail(f: &mut File, path: &Path) -> Result<u64> {
    let len = f.metadata().at(path)?.len();
    if len == 0 {
        return Ok(0);
    }
    let mut last = [0u8; 1];
    f.seek(SeekFrom::Start(len - 1)).at(path)?;
    f.read_exact(&mut last).at(path)?;
    if last[0] == b'\n' {
        return Ok(len);
    }
    // Find the previous newline.
    let mut pos = len;
    let mut buf = vec![0u8; 64 * 1024];
    while pos > 0 {
        let start = pos.saturating_sub(buf.len() as u64);
        let n = (pos - start) as usize;
        f.seek(SeekFrom::Start(start)).at(path)?;
        f.read_exact(&mut buf[..n]).at(path)?;
        if let Some(p) = buf[..n].iter().rposition(|&b| b == b'\n') {
            let keep = start + p as u64 + 1;
            f.set_len(keep).at(path)?;
            f.sync_data().at(path)?;
            return Ok(keep);
        }
        pos = start;
    }
    f.set_len(0).at(path)?;
    f.sync_data().at(path)?;
    Ok(0)
}

/// RFC 3339 UTC with microseconds.
pub fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}
