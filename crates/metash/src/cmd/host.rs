//! `spawn` and `resume`: seed 000's `spawn_agent` from the shell, and answering a checkpoint.

use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context as _, Result};
use clap::{Args, Subcommand, ValueEnum};
use metash_host::{ConsentMode, Host, HostOptions, SpawnRequest, Spawner, Terminal};
use metash_protocol::{
    sanitize_for_terminal, sanitize_line, AgentResponse, AgentStatus, CheckpointSignal, ModelHint,
    SpawnOptions,
};

use super::Ctx;
use crate::exit::Exit;

/// How a command that runs agents gets consent answers; shared with `metash run`.
#[derive(Debug, Clone, Args)]
pub struct HostArgs {
    /// Allow this capability without asking (repeatable), e.g. `--yes-to files.write`,
    /// `--yes-to native`.
    #[arg(long = "yes-to", value_name = "CAPABILITY")]
    pub yes_to: Vec<String>,
    /// A consent policy file (see docs/policy.md); default `.meta/policy.toml` when present.
    #[arg(long)]
    pub policy: Option<PathBuf>,
    /// Never ask at the terminal: answer from the policy file and `--yes-to`, deny the rest.
    #[arg(long)]
    pub non_interactive: bool,
    /// With --non-interactive: a question no rule answers waits this many seconds for any
    /// client to answer it (how `metash acp` hands its runs' questions to the editor).
    #[arg(long, hide = true, value_name = "SECONDS")]
    pub consent_wait: Option<u64>,
}

impl HostArgs {
    pub fn interactive(&self) -> bool {
        !self.non_interactive && std::io::stdin().is_terminal()
    }

    pub fn open(&self, ctx: &Ctx) -> Result<Host> {
        let yes_to = self
            .yes_to
            .iter()
            .map(|c| c.parse().map_err(|e| anyhow::anyhow!("--yes-to {c}: {e}")))
            .collect::<Result<Vec<_>>>()?;
        let default_policy = ctx.workspace.join(".meta/policy.toml");
        let options = HostOptions {
            terminal: Terminal::Stderr,
            consent: match (self.interactive(), self.consent_wait) {
                (true, _) => ConsentMode::Interactive,
                (false, Some(s)) => ConsentMode::Clients(std::time::Duration::from_secs(
                    s.min(metash_host::config::MAX_CONSENT_WAIT_S as u64),
                )),
                (false, None) => ConsentMode::NonInteractive,
            },
            policy_file: self
                .policy
                .clone()
                .or_else(|| default_policy.exists().then_some(default_policy)),
            yes_to,
            config_home: config_home(),
            env: Default::default(),
        };
        Ok(Host::open(&ctx.workspace, options)?)
    }
}

/// `$XDG_CONFIG_HOME`, else `~/.config`.
pub(crate) fn config_home() -> Option<PathBuf> {
    std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Hint {
    Fast,
    Smart,
}

#[derive(Debug, Subcommand)]
pub enum HostCommand {
    /// Run one sub-agent (seed 000's spawn_agent) and print its AgentResponse.
    /// Exit codes: 0 success, 3 error, 4 checkpoint, 6 timeout, 8 refused consent (docs/cli.md).
    Spawn {
        /// A registered agent or a role of .meta/config.toml.
        agent: String,
        /// The task for the sub-agent (its only view of the conversation).
        #[arg(long)]
        message: String,
        /// A system prompt for it.
        #[arg(long, default_value = "")]
        system: String,
        /// Model roles: pick the role's fast or smart model.
        #[arg(long, value_enum)]
        model_hint: Option<Hint>,
        /// Seconds.
        #[arg(long)]
        timeout: Option<f64>,
        /// Token budget for the spawn (model roles stop when it is spent).
        #[arg(long)]
        max_tokens: Option<u64>,
        /// Where the agent works (default: the project).
        #[arg(long)]
        workdir: Option<PathBuf>,
        /// What the agent should look at (repeatable): `file:PATH`, `artifact:ID`, `kv:KEY`,
        /// `scratchpad:KEY`; each must exist, or nothing runs.
        #[arg(long = "context-ref", value_name = "REF")]
        context_refs: Vec<String>,
        /// Wait for the answer to a checkpoint on stdin even when it is not a terminal.
        #[arg(long)]
        wait_for_answer: bool,
        /// Print the agent's output as the bytes it sent: escape sequences, control characters
        /// and bidirectional overrides included (by default they are shown as escapes such as
        /// `\x1b`, so they cannot act on the terminal).
        #[arg(long)]
        raw: bool,
        #[command(flatten)]
        host: HostArgs,
    },
    /// Run any command under a role's sandbox, as the role's CLI runs in a spawn: the working
    /// directory writable, its own HOME and TMPDIR, the project's state hidden, TCP only to the
    /// role's credential proxy, the environment cleared to an allowlist. Exits with the
    /// command's code (126 when it could not be confined).
    Sandbox {
        /// A role of .meta/config.toml.
        #[arg(long)]
        role: String,
        /// The writable directory it runs in (default: the current directory).
        #[arg(long)]
        workdir: Option<PathBuf>,
        /// Pass a variable in (repeatable): `--env NAME=VALUE`.
        #[arg(long = "env", value_name = "NAME=VALUE")]
        env: Vec<String>,
        /// Print what the sandbox allows (JSON) to stderr before running.
        #[arg(long)]
        show: bool,
        #[command(flatten)]
        host: HostArgs,
        /// The command and its arguments.
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Answer the pending checkpoint; the next spawn receives the answer, once.
    Resume {
        /// The answer: an option, its number, or free text.
        #[arg(long)]
        answer: String,
        /// The checkpoint being answered (refused if it is not the pending one).
        #[arg(long)]
        checkpoint: Option<String>,
    },
}

pub fn run(cmd: HostCommand, ctx: &Ctx) -> Result<ExitCode> {
    let json = ctx.json;
    match cmd {
        HostCommand::Spawn {
            agent,
            message,
            system,
            model_hint,
            timeout,
            max_tokens,
            workdir,
            context_refs,
            wait_for_answer,
            raw,
            host,
        } => {
            let h = host.open(ctx)?;
            let mut req = SpawnRequest::new(&agent, &system, &message);
            req.options = SpawnOptions {
                model_hint: model_hint.map(|h| match h {
                    Hint::Fast => ModelHint::Fast,
                    Hint::Smart => ModelHint::Smart,
                }),
                timeout_seconds: timeout,
                max_tokens,
                context_refs,
            };
            req.workdir = workdir;
            let response = h.spawn_agent(&req)?;
            print_response(&response, json, raw)?;
            if response.status == AgentStatus::Checkpoint {
                let ask = wait_for_answer || host.interactive();
                return checkpoint(&h, &response, ask, json);
            }
            Ok(status_code(response.status))
        }
        HostCommand::Sandbox {
            role,
            workdir,
            env,
            show,
            host,
            command,
        } => sandbox(ctx, &role, workdir, &env, show, &host, &command),
        HostCommand::Resume { answer, checkpoint } => {
            let store = metash_store::Store::open(&ctx.workspace)?;
            let data = metash_host::checkpoint::answer(&store, checkpoint.as_deref(), &answer)?;
            if json {
                println!("{}", serde_json::to_string(&data)?);
            } else {
                println!(
                    "answered checkpoint `{}` with `{}`; the next spawn receives it",
                    sanitize_line(&data.checkpoint_id),
                    sanitize_line(&data.user_input)
                );
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn sandbox(
    ctx: &Ctx,
    role: &str,
    workdir: Option<PathBuf>,
    env: &[String],
    show: bool,
    host: &HostArgs,
    command: &[String],
) -> Result<ExitCode> {
    let env = env
        .iter()
        .map(|kv| {
            kv.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .ok_or_else(|| anyhow::anyhow!("--env {kv}: expected NAME=VALUE"))
        })
        .collect::<Result<Vec<_>>>()?;
    let h = host.open(ctx)?;
    let workdir = match workdir {
        Some(w) => w,
        None => std::env::current_dir().context("the current directory")?,
    };
    let sandboxed = h.sandboxed(role, &workdir, command, &env)?;
    if show {
        eprintln!("{}", serde_json::to_string_pretty(&sandboxed.report)?);
    }
    let status = sandboxed.status()?;
    h.flush_events()?;
    Ok(match status.code() {
        Some(c) => ExitCode::from(u8::try_from(c).unwrap_or(1)),
        // Killed by a signal: the shell's convention.
        #[cfg(unix)]
        None => {
            use std::os::unix::process::ExitStatusExt;
            ExitCode::from(128u8.saturating_add(status.signal().unwrap_or(0) as u8))
        }
        #[cfg(not(unix))]
        None => ExitCode::from(1),
    })
}

pub fn status_code(status: AgentStatus) -> ExitCode {
    match status {
        AgentStatus::Success => ExitCode::SUCCESS,
        AgentStatus::Error => Exit::AgentError.into(),
        AgentStatus::Timeout => Exit::Timeout.into(),
        AgentStatus::Checkpoint => Exit::Checkpoint.into(),
    }
}

/// The response for people on stderr, the agent's output on stdout: with every terminal
/// control in it shown as an escape, unless `raw` (the bytes as sent).
fn print_response(r: &AgentResponse, json: bool, raw: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string(r)?);
        return Ok(());
    }
    let status = serde_json::to_value(r.status)?;
    eprintln!(
        "status: {} ({} tokens, {} ms)",
        status.as_str().unwrap_or("?"),
        r.metadata.tokens_used,
        r.metadata.duration_ms
    );
    if r.status != AgentStatus::Checkpoint {
        if raw {
            println!("{}", r.data);
        } else {
            println!("{}", sanitize_for_terminal(&r.data));
        }
    }
    Ok(())
}

/// The host has already made the checkpoint durable. With someone to ask, show it and record the
/// answer; otherwise say how to answer and exit with the checkpoint code.
pub fn checkpoint(h: &Host, r: &AgentResponse, ask: bool, json: bool) -> Result<ExitCode> {
    let signal: CheckpointSignal =
        serde_json::from_str(&r.data).context("the checkpoint signal is not valid JSON")?;
    let id = signal.resume_id.clone().unwrap_or_default();
    let mut err = std::io::stderr().lock();
    // The id, message and options are the agent's: shown escaped (issue 31).
    let shown_id = sanitize_line(&id);
    writeln!(
        err,
        "\ncheckpoint `{shown_id}` ({:?}): {}",
        signal.reason,
        sanitize_for_terminal(&signal.message)
    )?;
    for (i, o) in signal.options.iter().enumerate() {
        writeln!(err, "  {}. {}", i + 1, sanitize_line(o))?;
    }
    if !ask {
        writeln!(
            err,
            "waiting for an answer: metash resume --answer VALUE --checkpoint {shown_id}"
        )?;
        return Ok(Exit::Checkpoint.into());
    }
    drop(err);
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    loop {
        eprint!("answer> ");
        let Some(line) = lines.next() else {
            eprintln!("\nno answer (end of input); the checkpoint stays pending");
            return Ok(Exit::Checkpoint.into());
        };
        match h.answer_checkpoint(Some(&id), &line?) {
            Ok(data) => {
                if json {
                    println!("{}", serde_json::to_string(&data)?);
                }
                eprintln!(
                    "answered `{}`; the next spawn receives it",
                    sanitize_line(&data.user_input)
                );
                return Ok(ExitCode::SUCCESS);
            }
            Err(e) => eprintln!("{}", sanitize_for_terminal(&e.to_string())),
        }
    }
}
