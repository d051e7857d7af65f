//! `agents`, `consent` (and `ledger`, in `ledger.rs`): the policy layer (seed 002) from the
//! command line. Thin: each
//! command calls `metash-policy` and prints for people, or JSON with `--json`.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand, ValueEnum};
use metash_policy::manifest::Diagnostic;
use metash_policy::{
    migrate, Agent, AgentDirs, Authorization, CapabilityRequest, ConsentPrompter, Decision,
    NonInteractive, Policy, PolicyError, PolicyFile, Registry, Sensitive, Source, TerminalPrompter,
};
use metash_protocol::sanitize_line;
use metash_store::Store;
use serde_json::{json, Value};

use super::capability::parse_cap;
use super::Ctx;

#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Agents: their manifests, validation and migration; suspending and resuming a running one.
    #[command(visible_alias = "agent")]
    Agents {
        #[command(subcommand)]
        cmd: AgentsCmd,
    },
    /// Consent grants: list, grant, revoke, check.
    Consent {
        #[command(subcommand)]
        cmd: ConsentCmd,
    },
    /// The audit ledger: registrations, consent requests and answers, grants, revocations, actions.
    Ledger {
        #[command(subcommand)]
        cmd: super::ledger::LedgerCmd,
    },
}

#[derive(Debug, Subcommand)]
pub enum AgentsCmd {
    /// Agents found in `.meta/agents/` and `$XDG_CONFIG_HOME/metash/agents/` (records new ones as
    /// Registered in the ledger).
    List {},
    /// One agent's manifest, resolved entry and declared capabilities.
    Show {
        /// The agent's id.
        id: String,
    },
    /// Validates a manifest (a file, or a directory holding manifest.toml), or every agent found.
    Validate {
        /// A manifest file or agent directory (default: every agent found).
        path: Option<PathBuf>,
    },
    /// Pauses a running agent (native: SIGSTOP to its process group; WASM: at its next epoch
    /// check), from any terminal; its state stays as it was.
    Suspend {
        /// The agent's id.
        id: String,
        /// How long to wait for the process running it to answer.
        #[arg(long, default_value_t = 5000)]
        wait_ms: u64,
    },
    /// Lets a suspended agent go on.
    Resume {
        /// The agent's id.
        id: String,
        /// How long to wait for the process running it to answer.
        #[arg(long, default_value_t = 5000)]
        wait_ms: u64,
    },
    /// Upgrades manifests without `schema_version` to the current schema, keeping comments.
    Migrate {
        /// A manifest file or agent directory (default: every agent found).
        path: Option<PathBuf>,
        /// Only report what would change (exit 1 if anything would).
        #[arg(long)]
        check: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum ConsentCmd {
    /// Grants as persisted: live ones, or with `--all` expired ones and revocations too.
    List {
        /// Only this agent's grants.
        #[arg(long)]
        agent: Option<String>,
        /// Expired grants and revocations too.
        #[arg(long)]
        all: bool,
    },
    /// Grants a capability the agent's manifest declares, for a limited time.
    Grant {
        /// The agent's id.
        agent: String,
        /// A capability its manifest declares, e.g. `files.write:src` or `network:api.github.com`.
        capability: String,
        /// How long the grant lasts.
        #[arg(long, default_value_t = 3600)]
        duration_s: u64,
        /// Also allow sensitive actions (network writes, process starts, writes outside the
        /// workspace, native execution) without asking each time.
        #[arg(long)]
        sensitive: bool,
    },
    /// Revokes a capability (and every narrower grant it covers); effective at once everywhere.
    ///
    /// A running agent is told at once (`consent_revoke`), and its next use is refused: a
    /// consent request or a network connection gets an `error` `consent_revoked`; a `memory`
    /// read or write (state_get, state_update) answers `state_denied`; a file grant is withdrawn
    /// from the agent's view before it is told (unreadable, or read-only for `files.write`). A
    /// withdrawal that failed makes this command fail (exit 1).
    Revoke {
        /// The agent's id.
        agent: String,
        /// The capability (every narrower grant it covers goes too).
        capability: String,
    },
    /// Decides whether the agent may use the capability now, asking if needed (exit 7 if refused).
    Check(CheckArgs),
    /// Agents' questions waiting for an answer from any client (`[host] consent_wait_seconds`).
    Pending,
    /// Answers a waiting question: the first answer from any client (this, `metash ui`,
    /// JSON-RPC) wins.
    Answer {
        /// The question's id (`metash consent pending`).
        id: String,
        /// `once`, `deny`, or `for` with `--seconds`.
        #[arg(value_parser = ["once", "for", "deny"])]
        answer: String,
        /// With `for`: how long the grant lasts (1 to 86400).
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..=86_400))]
        seconds: Option<u64>,
    },
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ActionArg {
    NetworkWrite,
    ProcessSpawn,
    WriteOutsideWorkspace,
    NativeExec,
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The agent's id.
    agent: String,
    /// The capability requested, e.g. `files.read:src`.
    capability: String,
    /// The request is a sensitive action (asked every time).
    #[arg(long, value_enum)]
    action: Option<ActionArg>,
    /// Why the capability is wanted (shown when asking, recorded in the ledger).
    #[arg(long, default_value = "requested from the command line")]
    reason: String,
    /// Answer consent requests from this policy file (TOML, see docs/policy.md).
    #[arg(long)]
    policy: Option<PathBuf>,
    /// Answer "allow once" to requests this capability covers (repeatable).
    #[arg(long = "yes-to", value_name = "CAPABILITY")]
    yes_to: Vec<String>,
    /// Ask on the terminal when stdin is one (otherwise only the policy and --yes-to answer).
    #[arg(long)]
    interactive: bool,
    /// Only print the decision; never ask or write to the ledger.
    #[arg(long)]
    dry_run: bool,
}

pub fn run(cmd: PolicyCommand, ctx: &Ctx) -> Result<ExitCode> {
    match cmd {
        PolicyCommand::Agents { cmd } => agents(cmd, ctx),
        PolicyCommand::Consent { cmd } => consent(cmd, ctx),
        PolicyCommand::Ledger { cmd } => super::ledger::run(cmd, ctx),
    }
}

/// Absolute, so the paths recorded in the ledger mean the same from any directory.
fn dirs(ctx: &Ctx) -> AgentDirs {
    let ws = std::fs::canonicalize(&ctx.workspace).unwrap_or_else(|_| ctx.workspace.clone());
    AgentDirs::from_env(&ws, |k| std::env::var_os(k))
}

/// The registry, with new or changed agents recorded when the project has a store.
fn registry(ctx: &Ctx) -> Result<(Registry, Option<Store>)> {
    let reg = Registry::discover(&dirs(ctx));
    let store = match Store::open(&ctx.workspace) {
        Ok(s) => Some(s),
        Err(metash_store::StoreError::NotInitialized(_)) => None,
        Err(e) => return Err(e.into()),
    };
    if let Some(s) = &store {
        reg.record(s)?;
    }
    Ok((reg, store))
}

fn policy(ctx: &Ctx) -> Result<Policy> {
    let (reg, store) = registry(ctx)?;
    let store = match store {
        Some(s) => s,
        None => Store::open(&ctx.workspace)?,
    };
    // CLI roles of config.toml are agents too (their native consent is granted here).
    let config = metash_host::config::HostConfig::load(&ctx.workspace)?;
    Ok(config.declare_roles(Policy::new(store, reg)))
}

fn source_str(s: Source) -> &'static str {
    match s {
        Source::Project => "project",
        Source::User => "user",
    }
}

fn agent_json(a: &Agent) -> Value {
    json!({
        "id": a.id,
        "name": a.manifest.name,
        "version": a.manifest.version,
        "schema_version": a.manifest.schema_version,
        "sandbox": a.manifest.sandbox,
        "source": source_str(a.source),
        "manifest": a.manifest_path,
        "entry": a.entry_path,
        "capabilities": a.declared.iter().map(|c| c.to_string()).collect::<Vec<_>>(),
        "oauth_scopes": a.manifest.oauth_scopes,
        "resources": a.manifest.resources,
        "ui": a.manifest.ui,
        "sha256": a.sha256,
    })
}

fn agents(cmd: AgentsCmd, ctx: &Ctx) -> Result<ExitCode> {
    let json = ctx.json;
    match cmd {
        AgentsCmd::List {} => agents_list(ctx, json),
        AgentsCmd::Show { id } => agents_show(ctx, &id, json),
        AgentsCmd::Validate { path } => validate(ctx, path, json),
        AgentsCmd::Migrate { path, check } => migrate_cmd(ctx, path, check, json),
        AgentsCmd::Suspend { id, wait_ms } => {
            super::control::run(ctx, &id, metash_host::control::Want::Suspended, wait_ms)
        }
        AgentsCmd::Resume { id, wait_ms } => {
            super::control::run(ctx, &id, metash_host::control::Want::Active, wait_ms)
        }
    }
}

/// `metash agents list`: every agent found, and the manifests that did not validate.
fn agents_list(ctx: &Ctx, json: bool) -> Result<ExitCode> {
    let (reg, _) = registry(ctx)?;
    if json {
        let agents: Vec<Value> = reg.agents().map(agent_json).collect();
        let invalid: Vec<Value> = reg
            .invalid()
            .iter()
            .map(|i| json!({"manifest": i.manifest_path, "source": source_str(i.source), "error": i.error}))
            .collect();
        println!("{}", json!({"agents": agents, "invalid": invalid}));
    } else {
        if reg.agents().next().is_none() && reg.invalid().is_empty() {
            println!("no agents (add one as .meta/agents/<id>/manifest.toml)");
        }
        for a in reg.agents() {
            println!(
                "{:<20} {:<24} {:<10} {:<7} {:<8} {}",
                a.id,
                a.manifest.name,
                a.manifest.version,
                json!(a.manifest.sandbox).as_str().unwrap_or(""),
                source_str(a.source),
                a.declared
                    .iter()
                    .map(|c| c.to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            );
        }
        for i in reg.invalid() {
            println!(
                "INVALID {}\n  {}",
                i.manifest_path.display(),
                i.error.replace('\n', "\n  ")
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `metash agents show ID`: one agent's manifest, entry and declared capabilities.
fn agents_show(ctx: &Ctx, id: &str, json: bool) -> Result<ExitCode> {
    let (reg, _) = registry(ctx)?;
    let a = reg
        .get(id)
        .ok_or_else(|| PolicyError::UnknownAgent(id.to_string()))?;
    if json {
        println!("{}", agent_json(a));
    } else {
        println!("id:           {}", a.id);
        println!("name:         {}", a.manifest.name);
        println!("version:      {}", a.manifest.version);
        println!("schema:       {}", a.manifest.schema_version);
        println!(
            "sandbox:      {}",
            json!(a.manifest.sandbox).as_str().unwrap_or("")
        );
        println!(
            "source:       {} ({})",
            source_str(a.source),
            a.manifest_path.display()
        );
        println!("entry:        {}", a.entry_path.display());
        println!(
            "capabilities: {}",
            a.declared
                .iter()
                .map(|c| c.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
        println!("oauth_scopes: {}", a.manifest.oauth_scopes.join(", "));
        println!(
            "resources:    cpu {} mem {}",
            a.manifest.resources.cpu.as_deref().unwrap_or("-"),
            a.manifest.resources.mem.as_deref().unwrap_or("-")
        );
        println!("ui.hints:     {}", a.manifest.ui.hints.join(", "));
    }
    Ok(ExitCode::SUCCESS)
}

/// The manifest files a PATH argument names (a file, or a directory holding manifest.toml), or
/// every manifest discovered.
fn manifest_paths(ctx: &Ctx, path: Option<PathBuf>) -> Vec<(PathBuf, Source)> {
    match path {
        Some(p) if p.is_dir() => vec![(p.join("manifest.toml"), Source::Project)],
        Some(p) => vec![(p, Source::Project)],
        None => {
            let reg = Registry::discover(&dirs(ctx));
            let mut v: Vec<(PathBuf, Source)> = reg
                .agents()
                .map(|a| (a.manifest_path.clone(), a.source))
                .chain(
                    reg.invalid()
                        .iter()
                        .map(|i| (i.manifest_path.clone(), i.source)),
                )
                .collect();
            v.sort();
            v
        }
    }
}

fn diag_json(d: &Diagnostic) -> Value {
    json!({
        "path": d.path, "line": d.line, "column": d.column, "field": d.field,
        "message": d.message, "suggestion": d.suggestion, "text": d.to_string(),
    })
}

fn error_json(e: &PolicyError) -> Vec<Value> {
    match e {
        PolicyError::Manifest(ds) => ds.0.iter().map(diag_json).collect(),
        other => vec![json!({"text": other.to_string()})],
    }
}

fn validate(ctx: &Ctx, path: Option<PathBuf>, json: bool) -> Result<ExitCode> {
    let paths = manifest_paths(ctx, path);
    if paths.is_empty() && !json {
        println!("no manifests found");
    }
    let mut ok_all = true;
    let mut out = Vec::new();
    for (p, _source) in paths {
        match metash_policy::manifest::load(&p) {
            Ok((m, _)) => {
                if json {
                    out.push(json!({"path": p, "ok": true, "name": m.name, "version": m.version}));
                } else {
                    println!("ok      {} ({} {})", p.display(), m.name, m.version);
                }
            }
            Err(e) => {
                ok_all = false;
                if json {
                    out.push(json!({"path": p, "ok": false, "errors": error_json(&e)}));
                } else {
                    println!("INVALID {}", p.display());
                    eprintln!("{e}");
                }
            }
        }
    }
    if json {
        println!("{}", Value::Array(out));
    }
    Ok(if ok_all {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn migrate_cmd(ctx: &Ctx, path: Option<PathBuf>, check: bool, json: bool) -> Result<ExitCode> {
    let mut out = Vec::new();
    let mut changed_any = false;
    let mut failed = false;
    for (p, source) in manifest_paths(ctx, path) {
        let text =
            std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
        let m = match migrate::migrate(&p, &text) {
            Ok(m) => m,
            Err(d) => {
                failed = true;
                if json {
                    out.push(json!({"path": p, "error": d.to_string()}));
                } else {
                    eprintln!("{d}");
                }
                continue;
            }
        };
        let changed = !m.changes.is_empty();
        changed_any |= changed;
        if changed && !check {
            metash_store::atomic::write_atomic(&p, m.output.as_bytes())?;
        }
        // What the result would be, validated.
        let validation = metash_policy::manifest::parse(&p, &m.output).err();
        failed |= validation.is_some();
        if json {
            out.push(json!({
                "path": p,
                "changed": changed,
                "written": changed && !check,
                "changes": m.changes.iter().map(|c| json!({"line": c.line, "description": c.description, "added": c.added})).collect::<Vec<_>>(),
                "errors": validation.as_ref().map(|d| d.0.iter().map(diag_json).collect::<Vec<_>>()).unwrap_or_default(),
            }));
            continue;
        }
        let verb = if check { "would change" } else { "migrated" };
        if changed {
            println!("{verb} {}", p.display());
            for c in &m.changes {
                println!("  line {}: + {}    # {}", c.line, c.added, c.description);
            }
        } else {
            println!("up to date {}", p.display());
        }
        if let Some(d) = validation {
            println!("  still invalid after migration ({}):", source_str(source));
            eprintln!("{d}");
        }
    }
    if json {
        println!("{}", Value::Array(out));
    }
    Ok(if failed || (check && changed_any) {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// `metash consent list`: live grants (with `--all` expired and revoked ones too).
fn consent_list(ctx: &Ctx, agent: Option<&str>, all: bool) -> Result<ExitCode> {
    let json = ctx.json;
    let p = policy(ctx)?;
    let grants: Vec<_> = p
        .grants()?
        .into_iter()
        .filter(|(g, live)| (all || *live) && agent.is_none_or(|a| a == g.agent))
        .collect();
    if json {
        let v: Vec<Value> = grants
            .iter()
            .map(|(g, live)| {
                let mut v = json!(g);
                v["live"] = json!(live);
                v
            })
            .collect();
        println!("{}", Value::Array(v));
    } else if grants.is_empty() {
        println!("no {}grants", if all { "" } else { "live " });
    } else {
        print_grants(&grants);
    }
    Ok(ExitCode::SUCCESS)
}

/// The grants as a table for people.
fn print_grants(grants: &[(metash_policy::Grant, bool)]) {
    println!(
        "{:<20} {:<32} {:<8} {:<28} SOURCE",
        "AGENT", "CAPABILITY", "STATE", "EXPIRES (UTC)"
    );
    for (g, live) in grants {
        let live = *live;
        let state = if g.revoked_at.is_some() {
            "revoked"
        } else if live {
            if g.sensitive {
                "live+s"
            } else {
                "live"
            }
        } else {
            "expired"
        };
        println!(
            "{:<20} {:<32} {:<8} {:<28} {}",
            sanitize_line(&g.agent),
            sanitize_line(&g.capability.to_string()),
            state,
            sanitize_line(&g.expires_at),
            sanitize_line(&g.source)
        );
    }
}

fn consent(cmd: ConsentCmd, ctx: &Ctx) -> Result<ExitCode> {
    let json = ctx.json;
    match cmd {
        ConsentCmd::List { agent, all } => consent_list(ctx, agent.as_deref(), all),
        ConsentCmd::Grant {
            agent,
            capability,
            duration_s,
            sensitive,
        } => {
            let p = policy(ctx)?;
            if duration_s == 0 {
                bail!("--duration-s must be at least 1 (grants are time-bounded)");
            }
            let g = p.grant(
                &agent,
                &parse_cap(&capability)?,
                duration_s,
                sensitive,
                "cli",
            )?;
            if json {
                println!("{}", json!(g));
            } else {
                println!(
                    "granted `{}` to {} until {}",
                    g.capability, g.agent, g.expires_at
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        ConsentCmd::Revoke { agent, capability } => revoke(ctx, &agent, &capability),
        ConsentCmd::Check(args) => check(ctx, args),
        ConsentCmd::Pending => super::asks::pending(ctx),
        ConsentCmd::Answer {
            id,
            answer,
            seconds,
        } => super::asks::answer(ctx, &id, &answer, seconds),
    }
}

/// `consent revoke`: the ledger at once, then what the process running the agent (if one does)
/// made of it. A withdrawal it could not make is an error (exit 1), never a success.
fn revoke(ctx: &Ctx, agent: &str, capability: &str) -> Result<ExitCode> {
    use super::revoked::Outcome;
    let p = policy(ctx)?;
    let store = Store::open(&ctx.workspace)?;
    let after = store.log().tail()?.seq;
    let revoked = p.revoke(agent, &parse_cap(capability)?, "cli")?;
    let role = metash_host::config::HostConfig::load(&ctx.workspace)?
        .roles
        .contains_key(agent);
    let outcome = super::revoked::outcome(&store, agent, after, role)?;
    if let Outcome::Failed(why) = &outcome {
        bail!(
            "revoked `{capability}` for {agent} in the ledger, but the running agent still holds \
             it: {} (stop it: `metash agents suspend {agent}`, or end its run)",
            why.join("; ")
        );
    }
    let running = match &outcome {
        Outcome::Applied(w) => json!({"told": true, "withdrawn": w}),
        Outcome::Unconfirmed => json!({"told": null}),
        _ => json!(null),
    };
    if ctx.json {
        println!(
            "{}",
            json!({"agent": agent, "capability": capability, "revoked": revoked,
                   "running": running})
        );
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "revoked `{capability}` for {agent} ({} live grant(s) ended; its next use is refused: \
         consent_revoked for a request or connection, state_denied for `memory`, a file grant \
         withdrawn)",
        revoked.len()
    );
    match outcome {
        Outcome::Applied(w) => {
            let paths: Vec<&str> = w.iter().filter_map(|v| v["path"].as_str()).collect();
            if paths.is_empty() {
                println!("the running agent was told");
            } else {
                println!("withdrawn from the running agent: {}", paths.join(", "));
            }
        }
        Outcome::Unconfirmed => eprintln!(
            "metash: warning: a run of {agent} has not ended in the log, but no running metash \
             confirmed the revocation (a killed process leaves such a run)"
        ),
        _ => {}
    }
    Ok(ExitCode::SUCCESS)
}

/// `consent check --dry-run`: the decision, without asking or writing to the ledger.
fn dry_run(p: &Policy, agent: &str, req: &CapabilityRequest, json: bool) -> Result<ExitCode> {
    let d = p.check(agent, req)?;
    let (word, code, message, hint) = match &d {
        Decision::Allow { .. } => ("allow", None, None, None),
        Decision::Ask => ("ask", None, None, None),
        Decision::Deny {
            code,
            message,
            hint,
        } => (
            "deny",
            Some(code.as_str()),
            Some(message.clone()),
            Some(hint.clone()),
        ),
    };
    if json {
        println!(
            "{}",
            json!({"decision": word, "code": code, "message": message, "hint": hint})
        );
    } else {
        println!(
            "{word}{}",
            message.map(|m| format!(": {m}")).unwrap_or_default()
        );
    }
    Ok(if d.is_allow() {
        ExitCode::SUCCESS
    } else {
        crate::exit::Exit::Refused.into()
    })
}

fn check(ctx: &Ctx, a: CheckArgs) -> Result<ExitCode> {
    let json = ctx.json;
    let p = policy(ctx)?;
    let mut req = CapabilityRequest::parse(&a.capability, a.reason.clone())?;
    req.sensitive = a.action.map(|x| match x {
        ActionArg::NetworkWrite => Sensitive::NetworkWrite,
        ActionArg::ProcessSpawn => Sensitive::ProcessSpawn,
        ActionArg::WriteOutsideWorkspace => Sensitive::WriteOutsideWorkspace,
        ActionArg::NativeExec => Sensitive::NativeExec,
    });
    if a.dry_run {
        return dry_run(&p, &a.agent, &req, json);
    }
    let yes_to = a
        .yes_to
        .iter()
        .map(|s| parse_cap(s))
        .collect::<Result<Vec<_>>>()?;
    let file = a.policy.as_deref().map(PolicyFile::load).transpose()?;
    let mut prompter: Box<dyn ConsentPrompter> = if a.interactive && std::io::stdin().is_terminal()
    {
        Box::new(TerminalPrompter::new(
            std::io::stdin().lock(),
            std::io::stderr(),
        ))
    } else {
        Box::new(NonInteractive::new(file, yes_to))
    };
    let auth = p.authorize(&a.agent, &req, prompter.as_mut())?;
    match auth {
        Authorization::Allowed { .. } => {
            if json {
                println!("{}", json!({"decision": "allow"}));
            } else {
                println!("allowed");
            }
            Ok(ExitCode::SUCCESS)
        }
        Authorization::Denied { event, .. } => {
            if json {
                println!("{}", json!({"decision": "deny", "event": event}));
            } else if let metash_protocol::AgentEvent::Error {
                code,
                message,
                hint,
            } = &event
            {
                println!("denied: {code}: {message}");
                if let Some(h) = hint {
                    println!("  hint: {h}");
                }
            }
            Ok(crate::exit::Exit::Refused.into())
        }
    }
}
