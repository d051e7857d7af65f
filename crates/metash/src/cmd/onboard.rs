//! A newcomer's first run: which agent `metash init` sets up (`--agent`, or what it detects), and
//! `metash doctor`, which says what is missing for a real agent and the command that fixes it.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand, ValueEnum};
use metash_harness::{program_version, Program, Programs};
use metash_runtime::native::probe::{self, Cgroups};
use serde::Serialize;

use super::Ctx;

/// The agent a project's planner, executor and verifier roles run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AgentChoice {
    /// Claude Code (`claude`), headless, with `ANTHROPIC_API_KEY`.
    ClaudeCode,
    /// OpenAI's Codex CLI (`codex exec`), with `OPENAI_API_KEY`.
    Codex,
    /// pi-coding-agent (`pi`), with `OPENAI_API_KEY` (any OpenAI-compatible endpoint).
    Pi,
    /// metash's own API client (no coding CLI): Anthropic with `ANTHROPIC_API_KEY`, else OpenAI.
    Api,
}

impl AgentChoice {
    /// The role frontend, its key variable, and a model to start with (the user edits it).
    fn role(self, env: &dyn Fn(&str) -> bool) -> (&'static str, &'static str, &'static str) {
        match self {
            Self::ClaudeCode => ("agent-sdk", ANTHROPIC, "claude-sonnet-4-5"),
            Self::Codex => ("codex-cli", OPENAI, "gpt-5-codex"),
            Self::Pi => ("pi-sdk", OPENAI, "gpt-5"),
            Self::Api if env(ANTHROPIC) || !env(OPENAI) => {
                ("anthropic-api", ANTHROPIC, "claude-sonnet-4-5")
            }
            Self::Api => ("openai-responses", OPENAI, "gpt-5"),
        }
    }

    fn program(self) -> Option<Program> {
        match self {
            Self::ClaudeCode => Some(Program::Claude),
            Self::Codex => Some(Program::Codex),
            Self::Pi => Some(Program::Pi),
            Self::Api => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::ClaudeCode => "claude-code",
            Self::Codex => "codex",
            Self::Pi => "pi",
            Self::Api => "api",
        }
    }
}

const ANTHROPIC: &str = "ANTHROPIC_API_KEY";
const OPENAI: &str = "OPENAI_API_KEY";

/// `metash init`'s options for the roles it writes.
#[derive(Debug, Clone, Args)]
pub struct InitAgent {
    /// Which agent runs the planner, executor and verifier roles. Absent: the first installed CLI
    /// whose key is set (claude-code, codex, pi), else the API client if a key is set.
    #[arg(long, value_enum)]
    pub agent: Option<AgentChoice>,
    /// The model endpoint (a proxy, a local server); absent: the provider's own.
    #[arg(long)]
    pub base_url: Option<String>,
    /// The model the roles use (absent: a current default for the agent, written into the file).
    #[arg(long)]
    pub model: Option<String>,
}

fn env_set(name: &str) -> bool {
    std::env::var_os(name).is_some_and(|v| !v.is_empty())
}

/// The agent `metash init` picks when none is named: an installed CLI with its key, else the API.
fn detect(programs: &Programs) -> Option<AgentChoice> {
    [AgentChoice::ClaudeCode, AgentChoice::Codex, AgentChoice::Pi]
        .into_iter()
        .find(|a| {
            let (_, key, _) = a.role(&env_set);
            a.program().is_some_and(|p| programs.get(p).is_some()) && env_set(key)
        })
        .or_else(|| (env_set(ANTHROPIC) || env_set(OPENAI)).then_some(AgentChoice::Api))
}

/// `.meta/config.toml` with the three roles on `agent`.
pub fn roles_toml(agent: AgentChoice, base_url: Option<&str>, model: Option<&str>) -> String {
    let (frontend, key, default_model) = agent.role(&env_set);
    let model = model.unwrap_or(default_model);
    let mut out = format!(
        "# Written by `metash init --agent {}`. `metash doctor` checks it; edit freely.\n\
         # Each role runs under metash's sandbox; its first run asks for native consent\n\
         # (or pass --yes-to native). The key stays in metash: the agent never sees it.\n\n\
         schema_version = {}\n\n\
         [orchestrator]\nplanner = \"planner\"\nexecutor = \"executor\"\nverifier = \"verifier\"\n",
        agent.name(),
        metash_host::config::CONFIG_SCHEMA_VERSION
    );
    for role in ["planner", "executor", "verifier"] {
        out.push_str(&format!(
            "\n[roles.{role}]\nfrontend = \"{frontend}\"\nmodel_smart = {}\napi_key_env = \"{key}\"\n",
            toml_str(model)
        ));
        if let Some(url) = base_url {
            out.push_str(&format!("base_url = {}\n", toml_str(url)));
        }
    }
    out
}

fn toml_str(s: &str) -> String {
    serde_json::Value::String(s.to_string()).to_string()
}

/// After `Store::init`: writes the roles (never over an existing config.toml) and says what it
/// chose, or how to choose.
pub fn write_roles(ctx: &Ctx, opts: &InitAgent) -> Result<Option<AgentChoice>> {
    let programs = Programs::discover(Some(&ctx.workspace));
    let Some(agent) = opts.agent.or_else(|| detect(&programs)) else {
        if opts.base_url.is_some() || opts.model.is_some() {
            bail!("--base-url and --model need an agent: pass --agent claude-code|codex|pi|api");
        }
        return Ok(None);
    };
    let path = ctx.workspace.join(".meta").join("config.toml");
    let text = roles_toml(agent, opts.base_url.as_deref(), opts.model.as_deref());
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)
        .with_context(|| {
            format!(
                "{} exists: edit its roles instead of re-running init",
                path.display()
            )
        })?;
    f.write_all(text.as_bytes())
        .and_then(|()| f.sync_all())
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(Some(agent))
}

#[derive(Debug, Subcommand)]
pub enum OnboardCommand {
    /// What a real agent needs here (CLIs, keys, Landlock, seccomp, cgroups, user namespaces),
    /// each missing piece with the command that fixes it. Exit 1 when something needed is missing.
    Doctor {},
}

/// How one check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Ok,
    /// Optional, or a weaker fallback is used.
    Warn,
    /// Needed: real agents cannot run (safely) without it.
    Fail,
}

#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub name: String,
    pub status: Status,
    pub detail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

fn check(name: &str, status: Status, detail: String, fix: Option<&str>) -> Check {
    Check {
        name: name.into(),
        status,
        detail,
        fix: (status != Status::Ok)
            .then(|| fix.map(str::to_string))
            .flatten(),
    }
}

pub fn run(command: OnboardCommand, ctx: &Ctx) -> Result<ExitCode> {
    let json = ctx.json;
    let OnboardCommand::Doctor {} = command;
    let checks = doctor(&ctx.workspace);
    let ok = checks.iter().all(|c| c.status != Status::Fail);
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({"ok": ok, "checks": checks}))?
        );
    } else {
        for c in &checks {
            let mark = match c.status {
                Status::Ok => "ok  ",
                Status::Warn => "warn",
                Status::Fail => "FAIL",
            };
            println!("{mark}  {:<22} {}", c.name, c.detail);
            if let Some(fix) = &c.fix {
                println!("      {:<22} fix: {fix}", "");
            }
        }
        println!(
            "\n{}",
            if ok {
                "ready: `metash init` then `metash run`"
            } else {
                "not ready: fix the FAIL lines above"
            }
        );
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        crate::exit::Exit::Failure.into()
    })
}

/// Every check, in the order a person fixes them.
pub fn doctor(workspace: &Path) -> Vec<Check> {
    let programs = Programs::discover(Some(workspace));
    let mut checks = Vec::new();
    let mut usable_agent = false;
    for (program, package) in [
        (Program::Claude, "@anthropic-ai/claude-code"),
        (Program::Codex, "@openai/codex"),
        (Program::Pi, "@mariozechner/pi-coding-agent"),
    ] {
        let fix = format!("npm install -g {package}");
        checks.push(match programs.get(program) {
            Some(path) => {
                let version = program_version(path)
                    .unwrap_or_else(|| "version unknown (--version failed)".into());
                let key = if program == Program::Claude {
                    ANTHROPIC
                } else {
                    OPENAI
                };
                usable_agent |= env_set(key);
                check(
                    program.name(),
                    Status::Ok,
                    format!("{version} at {}", path.display()),
                    None,
                )
            }
            None => check(
                program.name(),
                Status::Warn,
                "not installed (optional: one agent is enough)".into(),
                Some(&fix),
            ),
        });
    }
    for key in [ANTHROPIC, OPENAI] {
        let set = env_set(key);
        usable_agent |= set;
        checks.push(check(
            key,
            if set { Status::Ok } else { Status::Warn },
            if set {
                "set (metash keeps it; agents get a placeholder)".into()
            } else {
                "not set".into()
            },
            Some(&format!("export {key}=<your key>")),
        ));
    }
    checks.push(check(
        "agent",
        if usable_agent {
            Status::Ok
        } else {
            Status::Fail
        },
        if usable_agent {
            "a model key is set".into()
        } else {
            "no model key is set: no real agent can run (the offline example still does)".into()
        },
        Some(
            "export ANTHROPIC_API_KEY=<key> (Claude Code, API) or OPENAI_API_KEY=<key> (Codex, pi)",
        ),
    ));
    checks.extend(kernel_checks(&probe::probe()));
    checks.extend(project_roles(workspace));
    checks
}

fn kernel_checks(k: &probe::HostSupport) -> Vec<Check> {
    let root = is_root();
    vec![
        check(
            "landlock",
            if k.landlock_abi >= 4 { Status::Ok } else { Status::Fail },
            format!("ABI {} (the sandbox needs 4 or more)", k.landlock_abi),
            Some("boot Linux 6.7 or newer with Landlock enabled (lsm=...,landlock on the kernel command line)"),
        ),
        match &k.seccomp_user_notif {
            Ok(()) => check("seccomp", Status::Ok, "filters and user notification".into(), None),
            Err(why) => check(
                "seccomp",
                Status::Fail,
                why.clone(),
                Some("run Linux 5.5 or newer on x86_64 or aarch64"),
            ),
        },
        check(
            "cgroups",
            match (k.cgroups, k.cgroups_writable) {
                (Cgroups::None, _) | (_, false) => Status::Warn,
                _ => Status::Ok,
            },
            match (k.cgroups, k.cgroups_writable) {
                (Cgroups::None, _) => "none mounted: memory/CPU/process quotas fall back to rlimits".into(),
                (v, false) => format!("{}, not writable here: quotas fall back to rlimits", hierarchy(v)),
                (v, true) => format!("{}, writable: per-agent memory, CPU and pids quotas", hierarchy(v)),
            },
            Some("run metash as root, or in a delegated cgroup: systemd-run --user --scope -p Delegate=yes metash run"),
        ),
        match &k.user_namespaces {
            Ok(()) => check("user namespaces", Status::Ok, "available".into(), None),
            Err(why) => check(
                "user namespaces",
                if root { Status::Warn } else { Status::Fail },
                format!("{why} (needed to hide .meta/ from agents when not root)"),
                Some("sysctl -w kernel.unprivileged_userns_clone=1 (Debian) or sysctl -w user.max_user_namespaces=15000"),
            ),
        },
    ]
}

fn hierarchy(c: Cgroups) -> &'static str {
    match c {
        Cgroups::V2 => "cgroup v2",
        Cgroups::V1 => "cgroup v1",
        Cgroups::None => "none",
    }
}

#[cfg(unix)]
fn is_root() -> bool {
    // SAFETY: geteuid(2) cannot fail and has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

#[cfg(not(unix))]
fn is_root() -> bool {
    false
}

/// The project's configured roles, checked as `metash run` checks them before spending anything.
fn project_roles(workspace: &Path) -> Vec<Check> {
    if !workspace.join(".meta").join("session.json").exists() {
        return vec![check(
            "project",
            Status::Warn,
            format!("{} is not a metash project yet", workspace.display()),
            Some("metash init (it detects an installed CLI and its key, or pass --agent)"),
        )];
    }
    let host = match metash_host::Host::open(workspace, metash_host::HostOptions::default()) {
        Ok(h) => h,
        Err(e) => {
            return vec![check(
                "project",
                Status::Fail,
                e.to_string(),
                Some("fix the file named above"),
            )]
        }
    };
    let roles = &host.config().roles;
    if roles.is_empty() {
        return vec![check(
            "roles",
            Status::Warn,
            "no model-backed roles in .meta/config.toml (agents only)".into(),
            Some("add [roles.*], see docs/host.md, or start anew with metash init --agent pi"),
        )];
    }
    roles
        .iter()
        .map(|(name, role)| match host.preflight_role(name, role) {
            Ok(()) => check(
                &format!("role {name}"),
                Status::Ok,
                format!("{} ready", role.frontend.as_str()),
                None,
            ),
            Err(e) => check(
                &format!("role {name}"),
                Status::Fail,
                e.to_string(),
                Some("install the program or set the variable named here"),
            ),
        })
        .collect()
}
