//! The append-only, hash-chained event log (`.meta/events.jsonl`), one [`LogRecord`] per line.
//!
//! Why JSONL and not SQLite: the log is append-only and read front to back (rebuild, verify,
//! export) or from the back (tail); a text file gives that with one `write` and one `fdatasync`
//! per append, is greppable by people, and needs no C dependency. The hash is computed over the
//! exact bytes written, so verification never depends on re-serialising JSON the same way.
//!
//! The lines, hashes and chain checks are [`codec`]'s, shared with the PostgreSQL backend
//! (`crate::pg`), which this file reaches only through [`ServerLog`].

pub(crate) mod codec;

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use metash_protocol::LogRecord;

pub use codec::{decode, now, NewEvent, Tail, Undecodable, GENESIS_HASH};
use codec::{encode_batch, Chain};

use crate::error::{IoContext, Result, StoreError};

/// A log held by a server rather than in the file: what [`EventLog`] reads it through. The
/// PostgreSQL backend implements it (`crate::pg::store`); the file log names only this trait, so
/// it knows nothing of the backend, and the backend builds on the shared encoding
/// ([`codec`]) rather than on this module.
pub(crate) trait ServerLog: std::fmt::Debug + Send + Sync {
    /// What error messages name where the file's path would be.
    fn place(&self) -> PathBuf;
    /// The last record's position (genesis when empty).
    fn tail(&self) -> Result<Tail>;
    /// Up to `max` records after seq `after`, each line's own hash checked.
    fn read_after(&self, after: u64, max: usize) -> Result<Vec<LogRecord>>;
    /// Records newest first until `visit` returns false.
    fn scan_back(&self, visit: &mut dyn FnMut(LogRecord) -> bool) -> Result<()>;
}

/// The log: the file, or the project's rows on a PostgreSQL server (`pg`), read the same way.
/// All mutating calls must be made under the store lock.
#[derive(Debug, Clone)]
pub struct EventLog {
    path: PathBuf,
    pg: Option<Arc<dyn ServerLog>>,
}

impl EventLog {
    pub fn new(path: PathBuf) -> Self {
        Self { path, pg: None }
    }

    /// The log of a project held by a PostgreSQL server.
    pub(crate) fn on_server(pg: Arc<impl ServerLog + 'static>) -> Self {
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
            return pg.scan_back(&mut visit);
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
            return self.for_each_on_server(pg.as_ref(), f);
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
        pg: &dyn ServerLog,
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
