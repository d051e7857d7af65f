//! `init`, `state`, `log`, `kv`, `artifacts`, `gc`, `migrate`, `schema`: the commands on the
//! `.meta/` store.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use metash_protocol::{sanitize_for_terminal, sanitize_line};
use metash_store::{Retention, Store};
use serde_json::Value;

use super::Ctx;

#[derive(Debug, Subcommand)]
pub enum StoreCommand {
    /// Create `.meta/` (context.md, session.json, the event log) in the workspace.
    Init {
        /// Use this file as context.md instead of the template.
        #[arg(long)]
        context: Option<PathBuf>,
        #[command(flatten)]
        agent: super::onboard::InitAgent,
    },
    /// Read and change session.json.
    State {
        #[command(subcommand)]
        cmd: StateCmd,
    },
    /// The append-only event log.
    Log {
        #[command(subcommand)]
        cmd: LogCmd,
    },
    /// Per-agent key-value memory.
    Kv {
        #[command(subcommand)]
        cmd: KvCmd,
    },
    /// The files agents announced: list, show, apply the retention policy.
    Artifacts {
        #[command(subcommand)]
        cmd: super::artifacts::ArtifactsCmd,
    },
    /// Apply the artifact retention policy, and `[record]`'s to tapes.
    Gc {
        /// Remove artifacts older than this many days (`inf`: none by age).
        #[arg(long, default_value_t = 30.0, value_parser = days)]
        max_age_days: f64,
        /// Then remove the oldest until the rest fit in this many MiB.
        #[arg(long, default_value_t = 1024)]
        max_total_mib: u64,
    },
    /// Upgrade files written before they carried a version (config.toml, store documents),
    /// keeping everything else; manifests: `metash agents migrate`.
    Migrate {
        /// Only report what would change (exit 1 if anything would).
        #[arg(long)]
        check: bool,
    },
    /// Print the JSON Schema of a metash type (`--list` for the names).
    Schema {
        /// The type's schema name (e.g. `session`, `agent-response`).
        name: Option<String>,
        /// List the names instead.
        #[arg(long)]
        list: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum StateCmd {
    /// Print a value by dotted key path (the whole state without KEY).
    Get {
        /// A dotted key path, e.g. `variables.plan`.
        key: Option<String>,
    },
    /// Set a dotted key path to a JSON value, atomically (seed 000's update_state).
    Set {
        /// A dotted key path, e.g. `variables.plan`.
        key: String,
        /// A JSON value: `3`, `"text"`, `{"a":1}`.
        value: String,
        /// Refuse unless the state is still at this revision.
        #[arg(long)]
        expect_revision: Option<u64>,
        /// Lock timeout in milliseconds.
        #[arg(long, default_value_t = 5000)]
        lock_timeout_ms: u64,
    },
    /// Recreate session.json from the event log alone.
    Rebuild {},
}

#[derive(Debug, Subcommand)]
pub enum LogCmd {
    /// The last events.
    Tail {
        /// How many of the last events.
        #[arg(short = 'n', long, default_value_t = 20)]
        lines: usize,
        /// Print what agents wrote as it is: C1 controls and bidirectional overrides included
        /// (by default they are shown as escapes such as `\u{9b}`, so they cannot act on the
        /// terminal; the JSON of each record already escapes the C0 controls).
        #[arg(long)]
        raw: bool,
    },
    /// Check the hash chain; names the first broken event.
    Verify {},
    /// The whole verified log as JSON lines (to stdout or a file).
    Export {
        /// Write to this file instead of stdout.
        #[arg(long, short)]
        output: Option<PathBuf>,
    },
}

#[derive(Debug, Subcommand)]
pub enum KvCmd {
    /// Print one key's value.
    Get {
        /// The key.
        key: String,
        #[command(flatten)]
        ns: AgentArg,
    },
    /// Set a key to a JSON value.
    Set {
        /// The key.
        key: String,
        /// A JSON value.
        value: String,
        #[command(flatten)]
        ns: AgentArg,
    },
    /// List the namespace's keys.
    List {
        #[command(flatten)]
        ns: AgentArg,
    },
}

#[derive(Debug, Args)]
pub struct AgentArg {
    /// The agent whose namespace this is.
    #[arg(long)]
    agent: String,
}

pub fn run(cmd: StoreCommand, ctx: &Ctx) -> Result<ExitCode> {
    let json = ctx.json;
    match cmd {
        StoreCommand::Init { context, agent } => init(ctx, context, &agent),
        StoreCommand::State { cmd } => state(ctx, cmd),
        StoreCommand::Log { cmd } => log(ctx, cmd),
        StoreCommand::Kv { cmd } => kv(ctx, cmd),
        StoreCommand::Artifacts { cmd } => super::artifacts::run(ctx, cmd),
        StoreCommand::Migrate { check } => super::migrate::run(ctx, check),
        StoreCommand::Gc {
            max_age_days,
            max_total_mib,
        } => {
            let store = Store::open(&ctx.workspace)?;
            let policy = Retention {
                // `days` let through only numbers >= 0; past what a Duration holds is "never".
                max_age: Duration::try_from_secs_f64(max_age_days * 86_400.0)
                    .unwrap_or(Duration::MAX),
                max_total_bytes: max_total_mib.saturating_mul(1 << 20),
            };
            let report = store.artifacts().gc(policy, SystemTime::now())?;
            // Tapes under `[record]`'s retention (docs/replay.md).
            let tapes = super::tape::gc(ctx, &store)?;
            super::artifacts::print_gc_with_tapes(&report, &tapes, json)?;
            Ok(ExitCode::SUCCESS)
        }
        StoreCommand::Schema { name, list } => schema(name, list),
    }
}

fn init(
    ctx: &Ctx,
    context: Option<PathBuf>,
    agent: &super::onboard::InitAgent,
) -> Result<ExitCode> {
    let json = ctx.json;
    let text = match &context {
        Some(p) => {
            Some(std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?)
        }
        None => None,
    };
    std::fs::create_dir_all(&ctx.workspace)
        .with_context(|| format!("creating {}", ctx.workspace.display()))?;
    // `init --agent` on a project that exists adds the roles (config.toml must not exist yet).
    let store = match Store::init(&ctx.workspace, text.as_deref()) {
        Err(metash_store::StoreError::AlreadyInitialized(_))
            if agent.agent.is_some() && context.is_none() =>
        {
            Store::open(&ctx.workspace)?
        }
        r => r?,
    };
    let chosen = super::onboard::write_roles(ctx, agent)?;
    let trusted = record_git_trust(&store)?;
    let state = store.state()?;
    if json {
        let mut v = serde_json::to_value(&state)?;
        if let (Some(a), Value::Object(m)) = (chosen, &mut v) {
            m.insert("agent".into(), Value::String(a.name().into()));
        }
        println!("{v}");
    } else {
        match store.server_project() {
            Some(project) => println!(
                "initialised project {project} on its PostgreSQL store ([store] in {}) (session {})",
                store.meta_dir().join("config.toml").display(),
                state.session_id
            ),
            None => println!(
                "initialised {} (session {})",
                store.meta_dir().display(),
                state.session_id
            ),
        }
        if trusted {
            println!(
                "recorded the repository's executable git configuration as trusted \
                 (.meta/{}; `metash git trust` shows it)",
                metash_orchestrator::git::trust::TRUST_FILE
            );
        }
        match chosen {
            Some(a) => println!(
                "roles: planner, executor and verifier run {} (.meta/config.toml); next: metash run",
                a.name()
            ),
            None => println!(
                "no agent found (no installed claude, codex or pi with its key, no API key): \
                 `metash doctor` says what is missing; then `metash init --agent \
                 claude-code|codex|pi|api` here adds the roles"
            ),
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Records the repository's executable git configuration (filters, drivers, fsmonitor, hooks) as
/// trusted, when the project is in a git repository and none is recorded: what `metash run`
/// checks before it runs git (docs/orchestrator.md, "Git trust"). Whether it recorded.
fn record_git_trust(store: &Store) -> Result<bool> {
    use metash_orchestrator::git::trust;
    let Some(snap) = trust::record_if_absent(store.workspace())? else {
        return Ok(false);
    };
    let listed = trust::Snapshot::default().changes_to(&snap);
    store.append(
        metash_protocol::LogKind::GitTrust,
        None,
        trust::event("recorded", &listed, "init"),
    )?;
    Ok(true)
}

fn parse_json(value: &str) -> Result<Value> {
    serde_json::from_str(value)
        .with_context(|| format!("`{value}` is not a JSON value (quote strings: '\"text\"')"))
}

fn state(ctx: &Ctx, cmd: StateCmd) -> Result<ExitCode> {
    let json = ctx.json;
    match cmd {
        StateCmd::Get { key } => {
            let store = Store::open(&ctx.workspace)?;
            let value = store.get(key.as_deref().unwrap_or(""))?;
            print_value(&value, json)?;
        }
        StateCmd::Set {
            key,
            value,
            expect_revision,
            lock_timeout_ms,
        } => {
            let value = parse_json(&value)?;
            let store = Store::open(&ctx.workspace)?
                .with_lock_timeout(Duration::from_millis(lock_timeout_ms));
            let revision = store.update_state_as(None, &key, value, expect_revision)?;
            if json {
                println!("{}", serde_json::json!({ "revision": revision }));
            } else {
                println!("{key} set (revision {revision})");
            }
        }
        StateCmd::Rebuild {} => {
            let store = Store::open(&ctx.workspace)?;
            let state = store.rebuild_and_save()?;
            if json {
                println!("{}", serde_json::to_string(&state)?);
            } else {
                println!(
                    "rebuilt {} from the log (revision {})",
                    store.session_path().display(),
                    state.revision
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn log(ctx: &Ctx, cmd: LogCmd) -> Result<ExitCode> {
    let json = ctx.json;
    let store = Store::open(&ctx.workspace)?;
    // What leaves metash is redacted (the log on disk keeps what happened): token shapes, and
    // the values of the keys the project's roles use. Only the commands that print records
    // build it (it reads config.toml and the salt).
    let redactor = || {
        let config = metash_host::config::HostConfig::load(&ctx.workspace).unwrap_or_default();
        metash_host::redaction::output_redactor(&store, &config, &|k| std::env::var(k).ok(), [])
    };
    match cmd {
        LogCmd::Tail { lines, raw } => {
            let mut recs = Vec::new();
            store.log().scan_back(|r| {
                recs.push(r);
                recs.len() < lines
            })?;
            recs.reverse();
            let redactor = redactor();
            let mut out = std::io::stdout().lock();
            for r in recs.iter().map(|r| redactor.redact_record(r)) {
                if json {
                    writeln!(out, "{}", serde_json::to_string(&r)?)?;
                } else {
                    let agent = r.agent.as_deref().unwrap_or("-");
                    let row = format!(
                        "{:>6}  {}  {:<14} {:<12} {}",
                        r.seq, r.ts, r.kind, agent, r.data
                    );
                    if raw {
                        writeln!(out, "{row}")?;
                    } else {
                        writeln!(out, "{}", sanitize_line(&row))?;
                    }
                }
            }
        }
        LogCmd::Verify {} => match store.log().verify() {
            Ok(n) => {
                if json {
                    println!("{}", serde_json::json!({"ok": true, "events": n}));
                } else {
                    println!("ok: {n} events, hash chain intact");
                }
            }
            Err(metash_store::StoreError::BrokenLog { seq, reason, path }) => {
                if json {
                    println!(
                        "{}",
                        serde_json::json!({"ok": false, "first_broken_seq": seq, "reason": reason})
                    );
                } else {
                    eprintln!("{}: broken at event {seq}: {reason}", path.display());
                }
                return Ok(crate::exit::Exit::Failure.into());
            }
            Err(e) => return Err(e.into()),
        },
        LogCmd::Export { output } => {
            let mut sink: Box<dyn Write> = match &output {
                Some(p) => Box::new(std::io::BufWriter::new(
                    std::fs::File::create(p)
                        .with_context(|| format!("creating {}", p.display()))?,
                )),
                None => Box::new(std::io::BufWriter::new(std::io::stdout().lock())),
            };
            let redactor = redactor();
            store.log().for_each(|r| {
                let line = serde_json::to_string(&redactor.redact_record(&r))
                    .map_err(|e| metash_store::StoreError::Rejected(e.to_string()))?;
                writeln!(sink, "{line}").map_err(|e| metash_store::StoreError::io("stdout", e))
            })?;
            sink.flush()?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn kv(ctx: &Ctx, cmd: KvCmd) -> Result<ExitCode> {
    let json = ctx.json;
    let store = Store::open(&ctx.workspace)?;
    match cmd {
        KvCmd::Get { key, ns } => match store.kv(&ns.agent)?.get(&key)? {
            Some(v) => print_value(&v, json)?,
            None => bail!("no key `{key}` in {}'s namespace", ns.agent),
        },
        KvCmd::Set { key, value, ns } => {
            let seq = store.kv(&ns.agent)?.set(&key, parse_json(&value)?)?;
            if json {
                println!("{}", serde_json::json!({ "seq": seq }));
            } else {
                println!("{}: {key} set", ns.agent);
            }
        }
        KvCmd::List { ns } => {
            let map = store.kv(&ns.agent)?.list()?;
            if json {
                println!("{}", serde_json::to_string(&map)?);
            } else {
                for (k, v) in map {
                    println!("{}", sanitize_line(&format!("{k} = {v}")));
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn schema(name: Option<String>, list: bool) -> Result<ExitCode> {
    if list || name.is_none() {
        for n in metash_protocol::schema::NAMES {
            println!("{n}");
        }
        return Ok(ExitCode::SUCCESS);
    }
    let name = name.unwrap_or_default();
    match metash_protocol::schema::schema_json(&name) {
        Some(s) => print!("{s}"),
        None => bail!(
            "no schema `{name}`; known: {}",
            metash_protocol::schema::NAMES.join(", ")
        ),
    }
    Ok(ExitCode::SUCCESS)
}

/// Strings print bare for people; everything else as JSON. Agents write these values, so what
/// people see has its terminal controls shown as escapes (`--json` is left as it is).
fn print_value(value: &Value, json: bool) -> Result<()> {
    match value {
        Value::String(s) if !json => println!("{}", sanitize_for_terminal(s)),
        v if json => println!("{}", serde_json::to_string(v)?),
        v => println!(
            "{}",
            sanitize_for_terminal(&serde_json::to_string_pretty(v)?)
        ),
    }
    Ok(())
}

/// A number of days: >= 0, `inf` allowed; NaN and negatives are usage errors (a NaN age once
/// meant "older than 0 days", which deletes every artifact).
fn days(s: &str) -> std::result::Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(d) if d >= 0.0 => Ok(d),
        _ => Err(format!("`{s}` is not a number of days >= 0")),
    }
}
