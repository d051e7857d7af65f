//! `metash serve --stdio` (JSON-RPC 2.0 over NDJSON) and `metash mcp` (an MCP server over stdio):
//! the host for programs in any language and for LLM harnesses. stdin and stdout carry the
//! protocol, so nothing else may print to stdout, progress lines go to stderr, and consent is never
//! asked (there is no terminal to ask on): a policy file grants what spawned agents may do.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use metash_host::serve::mcp::McpServer;
use metash_host::serve::RpcServer;
use metash_host::{ConsentMode, Host, HostOptions, Terminal};

use super::Ctx;

#[derive(Debug, Subcommand)]
pub enum ServeCommand {
    /// Serve the host over JSON-RPC 2.0 on stdin/stdout, one JSON object per line.
    ///
    /// Methods spawnAgent, updateState, getState, logProgress, answerCheckpoint,
    /// pendingCheckpoint; an `event` notification for every durable event. See docs/host-rpc.md.
    Serve(ServeArgs),
    /// Serve the host as an MCP server over stdio, e.g. for `claude --mcp-config`.
    ///
    /// Tools spawn_agent, update_state, get_state, log_progress, answer_checkpoint. See
    /// docs/host-rpc.md.
    Mcp(HostArgs),
    /// Serve the web UI for this project on 127.0.0.1 (the run, live agent output, checkpoint
    /// answers, the ledger and revocation).
    ///
    /// Prints a URL with a one-time token: open it (it is exchanged for a session cookie). Runs
    /// until interrupted. See docs/ui.md.
    Ui(UiArgs),
}

#[derive(Debug, Args)]
pub struct UiArgs {
    /// The port (default: any free one).
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// Listen on this address instead of 127.0.0.1. Anyone who can reach it and has the URL can
    /// answer for you: use it only on a network you trust.
    #[arg(long, value_name = "ADDR")]
    listen: Option<std::net::IpAddr>,
    /// Open the URL in the desktop's browser (xdg-open / open).
    #[arg(long)]
    open: bool,
    /// Serve every metash project in DIR and one level below (an index at `/`, each project
    /// under `/p/NAME`) instead of the one project.
    #[arg(long, value_name = "DIR")]
    under: Option<std::path::PathBuf>,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Serve on stdin/stdout (the only transport).
    #[arg(long, required = true)]
    stdio: bool,
    #[command(flatten)]
    host: HostArgs,
}

#[derive(Debug, Args)]
pub struct HostArgs {
    /// A consent policy file granting capabilities to spawned agents (nobody can be asked for
    /// consent over stdio). Same flag as `metash spawn --policy`.
    #[arg(long = "policy", visible_alias = "policy-file", value_name = "FILE")]
    policy: Option<PathBuf>,
    /// Print no progress lines on stderr.
    #[arg(long)]
    quiet: bool,
}

pub fn run(cmd: ServeCommand, ctx: &Ctx) -> Result<ExitCode> {
    match cmd {
        ServeCommand::Serve(args) => {
            let host = open(ctx, &args.host)?;
            debug_assert!(args.stdio);
            RpcServer::new(host.clone(), host)
                .serve_stdio()
                .context("reading stdin")?;
        }
        ServeCommand::Mcp(args) => {
            let host = open(ctx, &args)?;
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .context("starting the async runtime")?;
            let served = runtime.block_on(McpServer::new(host.clone(), host.clone()).serve_stdio());
            // The host may own a runtime of its own: drop it here, outside any async context.
            drop(runtime);
            drop(host);
            served?;
        }
        ServeCommand::Ui(args) => ui(ctx, &args)?,
    }
    Ok(ExitCode::SUCCESS)
}

/// `metash ui`: serves until Ctrl-C.
fn ui(ctx: &Ctx, args: &UiArgs) -> Result<()> {
    let workspace = std::fs::canonicalize(&ctx.workspace).unwrap_or_else(|_| ctx.workspace.clone());
    if let Some(ip) = args.listen.filter(|ip| !ip.is_loopback()) {
        eprintln!(
            "metash ui: WARNING: listening on {ip}: anyone who can reach it and has the URL can \
             answer checkpoints and revoke grants"
        );
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let options = metash_ui::UiOptions {
        port: args.port,
        listen: args.listen,
        ..metash_ui::UiOptions::default()
    };
    let under = args
        .under
        .as_ref()
        .map(|d| std::fs::canonicalize(d).with_context(|| format!("--under {}", d.display())))
        .transpose()?;
    runtime.block_on(async {
        let (served, what) = match &under {
            Some(dir) => (
                metash_ui::serve_under(dir, &options).await?,
                format!("the projects under {}", dir.display()),
            ),
            None => (
                metash_ui::serve(&workspace, &options).await?,
                workspace.display().to_string(),
            ),
        };
        println!("{}", served.url);
        eprintln!(
            "metash ui: serving {what} at http://{}/ (open the URL above; Ctrl-C to stop)",
            served.addr
        );
        if args.open {
            let opener = if cfg!(target_os = "macos") {
                "open"
            } else {
                "xdg-open"
            };
            if let Err(e) = std::process::Command::new(opener).arg(&served.url).spawn() {
                eprintln!("metash ui: could not run {opener}: {e}; open the URL yourself");
            }
        }
        tokio::signal::ctrl_c()
            .await
            .context("waiting for Ctrl-C")?;
        served.stop().await;
        anyhow::Ok(())
    })
}

fn open(ctx: &Ctx, args: &HostArgs) -> Result<Arc<Host>> {
    let workspace = std::fs::canonicalize(&ctx.workspace).unwrap_or_else(|_| ctx.workspace.clone());
    let options = HostOptions {
        terminal: if args.quiet {
            Terminal::Silent
        } else {
            Terminal::Stderr
        },
        consent: ConsentMode::NonInteractive,
        policy_file: args.policy.clone(),
        yes_to: Vec::new(),
        config_home: config_home(),
        ..HostOptions::default()
    };
    let host = Host::open(&workspace, options)
        .with_context(|| format!("opening the project at {}", workspace.display()))?;
    Ok(Arc::new(host))
}

/// `$XDG_CONFIG_HOME` (when absolute) or `~/.config`, where user-wide agents live.
fn config_home() -> Option<PathBuf> {
    std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))
}
