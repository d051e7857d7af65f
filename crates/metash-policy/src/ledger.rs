//! The audit ledger: the policy events in the store's hash-chained log, filtered for people
//! (`metash ledger view`) and exported with secrets redacted (`metash ledger export`).
//!
//! The ledger is not a second file: it is a view of the one log, so it can never disagree with it.

use std::io::Write;

use metash_protocol::LogKind;

use chrono::{DateTime, Duration, NaiveDate, Utc};
use metash_protocol::{sanitize_line, LogRecord};
use metash_store::Store;
use serde_json::Value;

use crate::capability::Capability;
use crate::clock::parse_rfc3339;
use crate::error::{PolicyError, Result};
use crate::redact::Redactor;

/// Kinds the ledger shows by default (plus any record attributed to an agent).
pub const LEDGER_KINDS: &[LogKind] = &[
    LogKind::AgentRegistered,
    LogKind::ConsentRequest,
    LogKind::ConsentAnswer,
    LogKind::ConsentGrant,
    LogKind::ConsentRevoke,
    LogKind::Error,
    LogKind::AgentAction,
    LogKind::ProtocolViolation,
];

/// Which records to show or export.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    pub agent: Option<String>,
    /// Records whose capability this covers (`network` matches `network:api.github.com`).
    pub capability: Option<Capability>,
    pub since: Option<DateTime<Utc>>,
    pub until: Option<DateTime<Utc>>,
    /// Only these kinds (empty: the ledger kinds and agent-attributed records, or all with `all`).
    pub kinds: Vec<LogKind>,
    pub all: bool,
}

impl Filter {
    pub fn matches(&self, rec: &LogRecord) -> bool {
        if !self.kinds.is_empty() {
            if !self.kinds.contains(&rec.kind) {
                return false;
            }
        } else if !self.all && !LEDGER_KINDS.contains(&rec.kind) && rec.agent.is_none() {
            return false;
        }
        if let Some(a) = &self.agent {
            if rec.agent.as_deref() != Some(a.as_str()) {
                return false;
            }
        }
        if let Some(c) = &self.capability {
            if !capabilities_of(rec).iter().any(|r| c.covers(r)) {
                return false;
            }
        }
        if self.since.is_some() || self.until.is_some() {
            let Some(ts) = parse_rfc3339(&rec.ts) else {
                return false;
            };
            if self.since.is_some_and(|s| ts < s) || self.until.is_some_and(|u| ts > u) {
                return false;
            }
        }
        true
    }
}

/// The capabilities a record concerns: `data.capability`, or a registration's list.
pub fn capabilities_of(rec: &LogRecord) -> Vec<Capability> {
    if let Some(c) = rec.data.get("capability").and_then(Value::as_str) {
        return c.parse().into_iter().collect();
    }
    rec.data
        .get("capabilities")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .filter_map(|s| s.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// `--since`/`--until`: RFC 3339, a date (`2026-11-22`, midnight UTC), or an age (`30s`, `10m`,
/// `2h`, `7d`) counted back from `now`.
///
/// # Errors
/// [`PolicyError::Invalid`] saying the accepted forms.
pub fn parse_time(s: &str, now: DateTime<Utc>) -> Result<DateTime<Utc>> {
    if let Some(t) = parse_rfc3339(s) {
        return Ok(t);
    }
    if let Ok(d) = NaiveDate::parse_from_str(s, "%Y-%m-%d") {
        if let Some(t) = d.and_hms_opt(0, 0, 0) {
            return Ok(t.and_utc());
        }
    }
    let unit = s.chars().last().unwrap_or(' ');
    let n: Option<i64> = s
        .get(..s.len().saturating_sub(1))
        .and_then(|n| n.parse().ok());
    let age = match (n, unit) {
        (Some(n), 's') => Duration::try_seconds(n),
        (Some(n), 'm') => Duration::try_minutes(n),
        (Some(n), 'h') => Duration::try_hours(n),
        (Some(n), 'd') => Duration::try_days(n),
        _ => None,
    };
    age.and_then(|a| now.checked_sub_signed(a)).ok_or_else(|| {
        PolicyError::Invalid(format!(
            "invalid time `{s}`: expected RFC 3339 (2026-11-22T09:00:00Z), a date (2026-11-22) or an age (30s, 10m, 2h, 7d)"
        ))
    })
}

/// The matching records, oldest first (the chain is checked while reading).
///
/// # Errors
/// Store errors, including a broken hash chain.
pub fn records(store: &Store, filter: &Filter) -> Result<Vec<LogRecord>> {
    let mut out = Vec::new();
    store.log().for_each(|r| {
        if filter.matches(&r) {
            out.push(r);
        }
        Ok(())
    })?;
    Ok(out)
}

/// One line of what happened, for the table.
pub fn summary(rec: &LogRecord) -> String {
    let d = &rec.data;
    let s = |k: &str| d.get(k).and_then(Value::as_str).unwrap_or("").to_string();
    if let Some(violation) = violation(rec) {
        return violation;
    }
    match rec.kind {
        LogKind::AgentRegistered => format!(
            "{} {} ({}) from {}",
            s("name"),
            s("version"),
            s("sandbox"),
            s("manifest")
        ),
        LogKind::ConsentRequest => {
            let sens = d
                .get("sensitive")
                .and_then(Value::as_str)
                .map(|x| format!(" [{x}]"))
                .unwrap_or_default();
            format!("asked {}{sens}: {}", s("prompter"), s("reason"))
        }
        LogKind::ConsentAnswer => match d.get("duration_s").and_then(Value::as_u64) {
            Some(n) => format!("{} {n}s by {}", s("answer"), s("by")),
            None => format!("{} by {}", s("answer"), s("by")),
        },
        LogKind::ConsentGrant => format!("until {} ({})", s("expires_at"), s("source")),
        LogKind::ConsentRevoke => {
            let n = d
                .get("revoked")
                .and_then(Value::as_array)
                .map(Vec::len)
                .unwrap_or(0);
            format!("{n} live grant(s) revoked ({})", s("source"))
        }
        LogKind::Error => format!("{}: {}", s("code"), s("message")),
        LogKind::OauthHandle => format!(
            "OAuth handle {} for `{}` ({})",
            s("handle"),
            s("capability"),
            s("provider")
        ),
        LogKind::OauthUse => oauth_use(d),
        _ => shortened(d),
    }
}

/// An agent's attempt at a host-only event, shown as what it is. Logs written before the
/// runtime rejected host-only events hold an agent's own `consent_grant`/`consent_revoke` under
/// that kind; they carry the event's `type` field, which the policy's records never do.
fn violation(rec: &LogRecord) -> Option<String> {
    let d = &rec.data;
    let agent_claim = matches!(rec.kind, LogKind::ConsentGrant | LogKind::ConsentRevoke)
        && d.get("type").is_some();
    if !agent_claim && rec.kind != LogKind::ProtocolViolation {
        return None;
    }
    let ty = d.get("type").and_then(Value::as_str).unwrap_or("?");
    let cap = d
        .get("capability")
        .or_else(|| d.get("event").and_then(|e| e.get("capability")))
        .and_then(Value::as_str)
        .map(|c| format!(" ({c})"))
        .unwrap_or_default();
    Some(format!("VIOLATION: the agent sent the host-only event `{ty}`{cap}; rejected, nothing was granted or revoked"))
}

/// One request through an OAuth handle: refused and why, or sent with which provider's token.
fn oauth_use(d: &Value) -> String {
    let s = |k: &str| d.get(k).and_then(Value::as_str).unwrap_or("").to_string();
    match d.get("refused").and_then(Value::as_str) {
        Some(why) => format!("OAuth request through {} refused: {why}", s("handle")),
        None => format!(
            "OAuth request through {} with the {} token{}",
            s("handle"),
            s("provider"),
            if d.get("refreshed").and_then(Value::as_bool) == Some(true) {
                " (refreshed first)"
            } else {
                ""
            }
        ),
    }
}

/// Any other record's data as JSON, cut to 100 bytes (at a character boundary).
fn shortened(d: &Value) -> String {
    let mut t = d.to_string();
    if t.len() > 100 {
        let mut cut = 97;
        while !t.is_char_boundary(cut) {
            cut -= 1;
        }
        t.truncate(cut);
        t.push_str("...");
    }
    t
}

/// A readable table of `recs`, redacted, every cell safe to print on a terminal.
pub fn render_table(recs: &[LogRecord], redactor: &Redactor) -> String {
    let rows: Vec<[String; 6]> = recs
        .iter()
        .map(|r| {
            let r = redactor.redact_record(r);
            let caps = capabilities_of(&r);
            let cap = if r.kind == LogKind::AgentRegistered || caps.len() != 1 {
                String::from("-")
            } else {
                caps[0].to_string()
            };
            [
                r.seq.to_string(),
                r.ts.get(..19).unwrap_or(&r.ts).replace('T', " "),
                r.kind.to_string(),
                r.agent.clone().unwrap_or_else(|| "-".into()),
                cap,
                summary(&r),
            ]
            // Reasons, messages and paths are the agents' words: shown, never obeyed, by the
            // terminal (and one row per record, whatever newlines they hold).
            .map(|cell| sanitize_line(&cell).into_owned())
        })
        .collect();
    let header = ["SEQ", "TIME (UTC)", "KIND", "AGENT", "CAPABILITY", "DETAIL"];
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in &rows {
        for (w, c) in widths.iter_mut().zip(row.iter()).take(5) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    let line = |cells: Vec<&str>, out: &mut String| {
        for (i, c) in cells.iter().enumerate() {
            if i < 5 {
                out.push_str(&format!("{c:<w$}  ", w = widths[i]));
            } else {
                out.push_str(c);
            }
        }
        out.push('\n');
    };
    line(header.to_vec(), &mut out);
    for row in &rows {
        line(row.iter().map(String::as_str).collect(), &mut out);
    }
    out
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Jsonl,
    Csv,
}

/// Counts of an export.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExportStats {
    pub records: u64,
    pub bytes: u64,
}

/// Streams the matching records to `out`, redacted, one JSON object per line or as CSV with the
/// columns `seq,ts,kind,agent,capability,data,hash` (`data` as compact JSON).
///
/// # Errors
/// Store errors, or the writer's I/O error.
pub fn export(
    store: &Store,
    filter: &Filter,
    format: Format,
    redactor: &Redactor,
    out: &mut dyn Write,
) -> Result<ExportStats> {
    let mut stats = ExportStats::default();
    let io = |e: std::io::Error| PolicyError::io("<export output>", e);
    if format == Format::Csv {
        let header = b"seq,ts,kind,agent,capability,data,hash\n";
        out.write_all(header).map_err(io)?;
        stats.bytes += header.len() as u64;
    }
    let mut failed = None;
    store.log().for_each(|r| {
        if failed.is_some() || !filter.matches(&r) {
            return Ok(());
        }
        let line = export_line(&r, format, redactor);
        if let Err(e) = out.write_all(line.as_bytes()) {
            failed = Some(e);
        }
        stats.records += 1;
        stats.bytes += line.len() as u64;
        Ok(())
    })?;
    if let Some(e) = failed {
        return Err(io(e));
    }
    out.flush().map_err(io)?;
    Ok(stats)
}

/// One exported record, newline included.
pub fn export_line(rec: &LogRecord, format: Format, redactor: &Redactor) -> String {
    let r = redactor.redact_record(rec);
    match format {
        Format::Jsonl => {
            let mut s =
                serde_json::to_string(&r).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"));
            s.push('\n');
            s
        }
        Format::Csv => {
            let caps = capabilities_of(&r);
            let cap = if caps.len() == 1 {
                caps[0].to_string()
            } else {
                String::new()
            };
            let cells = [
                r.seq.to_string(),
                r.ts.clone(),
                r.kind.to_string(),
                r.agent.clone().unwrap_or_default(),
                cap,
                r.data.to_string(),
                r.hash.clone(),
            ];
            let mut s = cells
                .iter()
                .map(|c| csv_cell(c))
                .collect::<Vec<_>>()
                .join(",");
            s.push('\n');
            s
        }
    }
}

/// RFC 4180 quoting: quote when the cell holds `,`, `"`, CR or LF; double inner quotes.
pub fn csv_cell(c: &str) -> std::borrow::Cow<'_, str> {
    if c.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", c.replace('"', "\"\"")).into()
    } else {
        c.into()
    }
}
