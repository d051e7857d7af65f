//! `metash ledger view|export`: the audit ledger (seed 002 §9), filtered, with secrets redacted.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Args, Subcommand, ValueEnum};
use metash_policy::ledger::{self, Filter, Format};
use metash_policy::redact::project_redactor;
use metash_protocol::LogKind;
use metash_store::Store;

use super::Ctx;

#[derive(Debug, Args)]
pub struct FilterArgs {
    /// Records concerning this agent.
    #[arg(long)]
    agent: Option<String>,
    /// Records concerning this capability or a narrower one.
    #[arg(long)]
    capability: Option<String>,
    /// RFC 3339, a date (2026-11-22) or an age (10m, 2h, 7d).
    #[arg(long)]
    since: Option<String>,
    /// Up to this time: RFC 3339, a date or an age, as --since.
    #[arg(long)]
    until: Option<String>,
    /// Only these event kinds (repeatable).
    #[arg(long)]
    kind: Vec<String>,
    /// Every log record, not only the ledger's.
    #[arg(long)]
    all: bool,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum FormatArg {
    Jsonl,
    Csv,
}

#[derive(Debug, Subcommand)]
pub enum LedgerCmd {
    /// A readable table (secrets redacted).
    View {
        #[command(flatten)]
        filter: FilterArgs,
        /// Only the last N records.
        #[arg(long)]
        limit: Option<usize>,
    },
    /// Exports the ledger with secrets redacted.
    Export {
        #[command(flatten)]
        filter: FilterArgs,
        /// jsonl (one record per line) or csv.
        #[arg(long, value_enum)]
        format: FormatArg,
        /// Write here instead of standard output.
        #[arg(long, short)]
        output: Option<PathBuf>,
    },
}

fn filter(args: FilterArgs) -> Result<Filter> {
    let now = chrono::Utc::now();
    Ok(Filter {
        agent: args.agent,
        capability: args
            .capability
            .as_deref()
            .map(super::capability::parse_cap)
            .transpose()?,
        since: args
            .since
            .as_deref()
            .map(|s| ledger::parse_time(s, now))
            .transpose()?,
        until: args
            .until
            .as_deref()
            .map(|s| ledger::parse_time(s, now))
            .transpose()?,
        kinds: args.kind.iter().map(|k| LogKind::parse(k)).collect(),
        all: args.all,
    })
}

pub fn run(cmd: LedgerCmd, ctx: &Ctx) -> Result<ExitCode> {
    let json = ctx.json;
    let store = Store::open(&ctx.workspace)?;
    let redactor = project_redactor(&store)?;
    match cmd {
        LedgerCmd::View { filter: f, limit } => {
            let mut recs = ledger::records(&store, &filter(f)?)?;
            if let Some(n) = limit {
                let skip = recs.len().saturating_sub(n);
                recs.drain(..skip);
            }
            if json {
                let v: Vec<_> = recs.iter().map(|r| redactor.redact_record(r)).collect();
                println!("{}", serde_json::to_string(&v)?);
            } else {
                print!("{}", ledger::render_table(&recs, &redactor));
            }
            Ok(ExitCode::SUCCESS)
        }
        LedgerCmd::Export {
            filter: f,
            format,
            output,
        } => {
            let format = match format {
                FormatArg::Jsonl => Format::Jsonl,
                FormatArg::Csv => Format::Csv,
            };
            let f = filter(f)?;
            match output {
                Some(path) => {
                    let file = std::fs::File::create(&path)
                        .with_context(|| format!("creating {}", path.display()))?;
                    let mut w = std::io::BufWriter::new(file);
                    let stats = ledger::export(&store, &f, format, &redactor, &mut w)?;
                    eprintln!("exported {} records to {}", stats.records, path.display());
                }
                None => {
                    let stdout = std::io::stdout();
                    let mut w = std::io::BufWriter::new(stdout.lock());
                    ledger::export(&store, &f, format, &redactor, &mut w)?;
                }
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}
