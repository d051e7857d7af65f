//! A newcomer's first run: which agent `metash init` sets up (`--agent`, or what it detects), and
//! `metash doctor`, which says what is missing for a real agent and the command that fixes it.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand, ValueEnum};
use metash_harness::{program_version, Program, Programs};
use metash_runtime::credential::signin::{self, SignIn, SignInCli};
use metash_runtime::native::probe::{self, Cgroups};
use serde::Serialize;

use super::Ctx;

/// The agent a project's planner, executor and verifier roles run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AgentChoice {
    /// Claude Code (`claude`), headless, with `ANTHROPIC_API_KEY` or your Claude subscription
    /// (`claude login`, or `CLAUDE_CODE_OAUTH_TOKEN` from `claude setup-token`).
    ClaudeCode,
    /// OpenAI's Codex CLI (`codex exec`), with `OPENAI_API_KEY` or your ChatGPT plan (`codex
    /// login`).
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

    /// The CLI whose subscription sign-in the roles may use instead of a key.
    fn sign_in_cli(self) -> Option<SignInCli> {
        match self {
            Self::ClaudeCode => Some(SignInCli::Claude),
            Self::Codex => Some(SignInCli::Codex),
            Self::Pi | Self::Api => None,
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
    /// whose key is set or that is signed in (claude-code, codex, pi), else the API client if a
    /// key is set. A signed-in CLI without its key gets `auth = "subscription"` roles.
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

fn env_var(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// The CLI's subscription sign-in, when it has one that can be used (never its token).
fn sign_in(cli: SignInCli) -> Option<SignIn> {
    signin::detect(cli, &env_var).ok().flatten()
}

/// How the roles `metash init` writes reach their model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InitAuth {
    /// The key in the agent's variable.
    Key,
    /// The CLI's subscription sign-in (`auth = "subscription"`).
    Subscription,
}

impl AgentChoice {
    /// The key when its variable is set, else the CLI's sign-in when it has one, else the key
    /// (which `metash doctor` then says is missing).
    fn auth(self) -> InitAuth {
        let (_, key, _) = self.role(&env_set);
        match self.sign_in_cli() {
            Some(cli) if !env_set(key) && sign_in(cli).is_some() => InitAuth::Subscription,
            _ => InitAuth::Key,
        }
    }

    /// Whether it can run here: its program installed (the API client needs none) and its key
    /// set or its CLI signed in.
    fn usable(self, programs: &Programs) -> bool {
        let (_, key, _) = self.role(&env_set);
        let installed = self.program().is_none_or(|p| programs.get(p).is_some());
        installed && (env_set(key) || self.auth() == InitAuth::Subscription)
    }
}

/// The agent `metash init` picks when none is named: an installed CLI with its key or its
/// sign-in, else the API.
fn detect(programs: &Programs) -> Option<AgentChoice> {
    [AgentChoice::ClaudeCode, AgentChoice::Codex, AgentChoice::Pi]
        .into_iter()
        .find(|a| a.usable(programs))
        .or_else(|| (env_set(ANTHROPIC) || env_set(OPENAI)).then_some(AgentChoice::Api))
}

/// `.meta/config.toml` with the three roles on `agent`, reaching the model by `auth`.
pub fn roles_toml(
    agent: AgentChoice,
    auth: InitAuth,
    base_url: Option<&str>,
    model: Option<&str>,
) -> String {
    let (frontend, key, default_model) = agent.role(&env_set);
    let model = model.unwrap_or(default_model);
    let (held, reach) = match auth {
        InitAuth::Key => ("The key stays", format!("api_key_env = \"{key}\"")),
        InitAuth::Subscription => (
            "Your subscription's sign-in stays",
            "auth = \"subscription\"   # your CLI's sign-in; or \"key\" with api_key_env"
                .to_string(),
        ),
    };
    let mut out = format!(
        "# Written by `metash init --agent {}`. `metash doctor` checks it; edit freely.\n\
         # Each role runs under metash's sandbox; its first run asks for native consent\n\
         # (or pass --yes-to native). {held} in metash: the agent never sees it.\n\n\
         schema_version = {}\n\n\
         [orchestrator]\nplanner = \"planner\"\nexecutor = \"executor\"\nverifier = \"verifier\"\n",
        agent.name(),
        metash_host::config::CONFIG_SCHEMA_VERSION
    );
    for role in ["planner", "executor", "verifier"] {
        out.push_str(&format!(
            "\n[roles.{role}]\nfrontend = \"{frontend}\"\nmodel_smart = {}\n{reach}\n",
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
    let text = roles_toml(
        agent,
        agent.auth(),
        opts.base_url.as_deref(),
        opts.model.as_deref(),
    );
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
    checks.extend(sign_in_checks());
    checks.push(agent_check(&programs));
    checks.extend(kernel_checks(&probe::probe()));
    checks.extend(project_roles(workspace));
    checks
}

/// Claude Code's and Codex's subscription sign-ins: where each is (never its token), or how to
/// make one.
fn sign_in_checks() -> Vec<Check> {
    [
        (SignInCli::Claude, "claude sign-in"),
        (SignInCli::Codex, "codex sign-in"),
    ]
    .into_iter()
    .map(|(cli, name)| {
        let fix = metash_host::config::no_sign_in(cli);
        match signin::detect(cli, &env_var) {
            Ok(Some(s)) => check(
                name,
                Status::Ok,
                format!(
                    "{} (metash keeps it; agents get a placeholder)",
                    s.describe()
                ),
                None,
            ),
            Ok(None) => check(name, Status::Warn, "not signed in".into(), Some(fix)),
            Err(e) => check(name, Status::Warn, format!("unusable: {e}"), Some(fix)),
        }
    })
    .collect()
}

/// Whether some real agent can run: an installed CLI with its key or its sign-in, or a key for
/// the API client.
fn agent_check(programs: &Programs) -> Check {
    let mut ways: Vec<String> = Vec::new();
    for agent in [AgentChoice::ClaudeCode, AgentChoice::Codex, AgentChoice::Pi] {
        if agent.usable(programs) {
            ways.push(match agent.auth() {
                InitAuth::Subscription => format!("{} with your subscription", agent.name()),
                InitAuth::Key => format!("{} with its key", agent.name()),
            });
        }
    }
    if env_set(ANTHROPIC) || env_set(OPENAI) {
        ways.push("the API client".into());
    }
    let usable = !ways.is_empty();
    check(
        "agent",
        if usable { Status::Ok } else { Status::Fail },
        if usable {
            format!("ready: {}", ways.join(", "))
        } else {
            "no model key is set and no CLI is signed in: no real agent can run (the offline \
             example still does)"
                .into()
        },
        Some(
            "export ANTHROPIC_API_KEY=<key> (Claude Code, API) or OPENAI_API_KEY=<key> (Codex, pi), \
             or sign a CLI in: `claude login` (or `claude setup-token` and export \
             CLAUDE_CODE_OAUTH_TOKEN), `codex login`",
        ),
    )
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
                match role.access(&env_var) {
                    Ok(metash_host::config::Access::SignIn(s)) => {
                        format!("{} ready, with {}", role.frontend.as_str(), s.describe())
                    }
                    Ok(metash_host::config::Access::Key(var)) => {
                        format!("{} ready, with {var}", role.frontend.as_str())
                    }
                    _ => format!("{} ready", role.frontend.as_str()),
                },
                None,
            ),
            Err(e) => check(
                &format!("role {name}"),
                Status::Fail,
                e.to_string(),
                Some("install the program, set the variable or sign the CLI in as named here"),
            ),
        })
        .collect()
}
