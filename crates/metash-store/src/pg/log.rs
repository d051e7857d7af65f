//! The hash-chained log in PostgreSQL: the same records, lines and hashes as the file log
//! (`events.jsonl`), one row each. An append locks its project's `heads` row, so appends from
//! any number of machines are ordered and `seq` stays gapless; it runs inside the caller's
//! transaction, so a task's completion and its events commit together or not at all.

use metash_protocol::LogRecord;

use super::{Client, Db, Statement, Transaction};
use crate::error::{Result, StoreError};
use crate::log::codec::{decode, encode_batch, Chain, NewEvent, Tail, GENESIS_HASH};

/// The log's prepared statements.
pub(crate) struct Statements {
    head_init: Statement,
    head_lock: Statement,
    /// Inserts the rows (arrays of seq, kind, line) and moves the head, in one round trip.
    write: Statement,
    read: Statement,
    pending: Statement,
    pending_any: Statement,
    pending_done: Statement,
}

impl Statements {
    pub(crate) fn prepare(c: &mut Client) -> Result<Self> {
        Ok(Self {
            head_init: c.prepare(
                "INSERT INTO metash.heads (project, seq, hash) VALUES ($1, 0, $2)
                 ON CONFLICT DO NOTHING",
            )?,
            head_lock: c
                .prepare("SELECT seq, hash FROM metash.heads WHERE project = $1 FOR UPDATE")?,
            write: c.prepare(WRITE)?,
            read: c.prepare(
                "SELECT seq, line FROM metash.log WHERE project = $1 AND seq > $2
                 ORDER BY seq LIMIT $3",
            )?,
            pending: c.prepare(
                "SELECT id, kind, agent, data FROM metash.pending WHERE project = $1
                 ORDER BY id LIMIT 10000",
            )?,
            pending_any: c
                .prepare("SELECT EXISTS (SELECT 1 FROM metash.pending WHERE project = $1)")?,
            pending_done: c
                .prepare("DELETE FROM metash.pending WHERE project = $1 AND id = ANY($2)")?,
        })
    }
}

/// The rows and the head's move, as one statement ($1 project, $2 seqs, $3 kinds, $4 lines,
/// $5 the last seq, $6 its hash).
pub(crate) const WRITE: &str = "WITH ins AS (
        INSERT INTO metash.log (project, seq, kind, line)
        SELECT $1, r.seq, r.kind, r.line
        FROM unnest($2::bigint[], $3::text[], $4::text[]) AS r(seq, kind, line))
    UPDATE metash.heads SET seq = $5, hash = $6 WHERE project = $1";

fn broken(project: &str, seq: u64, reason: String) -> StoreError {
    StoreError::BrokenLog {
        path: format!("postgres: metash.log of {project}").into(),
        seq,
        reason,
    }
}

fn seq_of(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

pub(crate) fn db_seq(v: u64) -> Result<i64> {
    i64::try_from(v).map_err(|_| StoreError::Rejected(format!("seq {v} is out of range")))
}

/// The head of `project`'s log, locked for the rest of `tx` (made at genesis if new).
pub(crate) fn lock_head(tx: &mut Transaction<'_>, s: &Statements, project: &str) -> Result<Tail> {
    let row = match tx.query_opt(&s.head_lock, &[&project])? {
        Some(row) => row,
        None => {
            tx.execute(&s.head_init, &[&project, &GENESIS_HASH])?;
            tx.query_one(&s.head_lock, &[&project])?
        }
    };
    Ok(Tail {
        seq: seq_of(row.get(0)),
        hash: row.get(1),
    })
}

/// What [`WRITE`] takes for `events` after `tail`: seqs, kinds, lines, the last seq and hash,
/// and the records.
pub(crate) struct Rows {
    pub seqs: Vec<i64>,
    pub kinds: Vec<String>,
    pub lines: Vec<String>,
    pub last_seq: i64,
    pub last_hash: String,
    pub records: Vec<LogRecord>,
}

pub(crate) fn rows_for(tail: &Tail, events: &[NewEvent]) -> Result<Rows> {
    let (lines, records) = encode_batch(tail, events)?;
    let mut out = Rows {
        seqs: Vec::with_capacity(records.len()),
        kinds: Vec::with_capacity(records.len()),
        lines: Vec::with_capacity(records.len()),
        last_seq: db_seq(tail.seq)?,
        last_hash: tail.hash.clone(),
        records: Vec::new(),
    };
    for (line, rec) in lines.into_iter().zip(&records) {
        let mut line = String::from_utf8(line)
            .map_err(|e| StoreError::Rejected(format!("a log line is not UTF-8: {e}")))?;
        line.pop(); // its newline
        out.seqs.push(db_seq(rec.seq)?);
        out.kinds.push(rec.kind.as_str().to_string());
        out.lines.push(line);
        out.last_seq = db_seq(rec.seq)?;
        out.last_hash.clone_from(&rec.hash);
    }
    out.records = records;
    Ok(out)
}

/// Appends `events` to `project`'s log within `tx`; the records as written.
///
/// # Errors
/// An event that cannot be serialised, or the database.
pub(crate) fn append(
    tx: &mut Transaction<'_>,
    db: &Statements,
    project: &str,
    events: &[NewEvent],
) -> Result<Vec<LogRecord>> {
    let tail = lock_head(tx, db, project)?;
    write_after(tx, db, project, &tail, events)
}

/// Writes `events` after `tail` (the head, locked by the caller) and moves the head.
fn write_after(
    tx: &mut Transaction<'_>,
    s: &Statements,
    project: &str,
    tail: &Tail,
    events: &[NewEvent],
) -> Result<Vec<LogRecord>> {
    let r = rows_for(tail, events)?;
    tx.execute(
        &s.write,
        &[
            &project,
            &r.seqs,
            &r.kinds,
            &r.lines,
            &r.last_seq,
            &r.last_hash,
        ],
    )?;
    Ok(r.records)
}

/// Moves `project`'s pending events (committed by completions) into the log, in the order they
/// were written, under the head's lock: one transaction and one fsync for all that are there.
/// A caller that waited for the lock while another chained finds nothing left and returns at
/// once. Returns how many it chained.
///
/// # Errors
/// The database.
pub fn chain(db: &mut Db, project: &str) -> Result<usize> {
    let Db { client, s, .. } = db;
    // Most calls find nothing: they ask without taking the head, which completions want.
    if !client
        .query_one(&s.pending_any, &[&project])?
        .get::<_, bool>(0)
    {
        return Ok(0);
    }
    let mut total = 0;
    loop {
        let mut tx = client.transaction()?;
        let tail = lock_head(&mut tx, s, project)?;
        let (ids, events) = pending(&mut tx, s, project)?;
        if ids.is_empty() {
            return Ok(total);
        }
        write_after(&mut tx, s, project, &tail, &events)?;
        tx.execute(&s.pending_done, &[&project, &ids])?;
        tx.commit()?;
        total += ids.len();
    }
}

/// The pending events of `project` (ids and events, oldest first), read by a statement of its
/// own so that it sees every chaining committed before it; call it holding the head.
pub(crate) fn pending(
    tx: &mut Transaction<'_>,
    s: &Statements,
    project: &str,
) -> Result<(Vec<i64>, Vec<NewEvent>)> {
    let rows = tx.query(&s.pending, &[&project])?;
    let ids = rows.iter().map(|r| r.get(0)).collect();
    let events = rows
        .iter()
        .map(|r| NewEvent {
            kind: metash_protocol::LogKind::parse(r.get(1)),
            agent: r.get(2),
            data: r.get(3),
        })
        .collect();
    Ok((ids, events))
}

/// [`append`] in a transaction of its own.
///
/// # Errors
/// As [`append`].
pub fn append_now(db: &mut Db, project: &str, events: &[NewEvent]) -> Result<Vec<LogRecord>> {
    let Db { client, s, .. } = db;
    let mut tx = client.transaction()?;
    let records = append(&mut tx, s, project, events)?;
    tx.commit()?;
    Ok(records)
}

/// Up to `max` records after `after` (a seq; 0 for the start), each line's own hash checked.
///
/// # Errors
/// A row that is not the record its hash says, or the database.
pub fn read_after(db: &mut Db, project: &str, after: u64, max: usize) -> Result<Vec<LogRecord>> {
    let limit = i64::try_from(max).unwrap_or(i64::MAX);
    let rows = db
        .client
        .query(&db.s.read, &[&project, &db_seq(after)?, &limit])?;
    rows.iter()
        .map(|row| {
            let seq = seq_of(row.get(0));
            let line: &str = row.get(1);
            decode(line.as_bytes()).map_err(|e| broken(project, seq, format!("{e:?}")))
        })
        .collect()
}

/// Checks `project`'s whole chain (each line's hash, seq without gaps, each `prev`) and that the
/// head row names the last record; the number of records.
///
/// # Errors
/// [`StoreError::BrokenLog`] naming the first broken record.
pub fn verify(db: &mut Db, project: &str) -> Result<u64> {
    let place = std::path::PathBuf::from(format!("postgres: metash.log of {project}"));
    let mut chain = Chain::new(&place);
    loop {
        let batch = read_after(db, project, chain.last_seq(), 10_000)?;
        if batch.is_empty() {
            break;
        }
        for rec in &batch {
            chain.check(rec)?;
        }
    }
    let expect = chain.last().clone();
    let head = db.client.query_opt(
        "SELECT seq, hash FROM metash.heads WHERE project = $1",
        &[&project],
    )?;
    if let Some(head) = head {
        let (seq, hash): (i64, String) = (head.get(0), head.get(1));
        if seq_of(seq) != expect.seq || hash != expect.hash {
            return Err(broken(
                project,
                expect.seq,
                format!("the head says seq {seq}, the log ends at {}", expect.seq),
            ));
        }
    }
    Ok(expect.seq)
}
