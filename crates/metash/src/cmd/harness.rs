//! `metash harness list|invocation|turn` and `metash attach`: the harness layer (seed 003) from
//! the command line, so a control plane in any language can use it through JSON.

use super::Ctx;
use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{anyhow, bail, Context};
use clap::{Args, Subcommand};
use metash_harness::{
    BuildProcessInvocationSpecRequest, CancellationToken, Endpoint, Harness, HarnessError,
    HarnessOptions, Programs, RunTurnNonInteractiveRequest,
};
use metash_protocol::{
    FrontendKind, HarnessContinuationRef, HarnessFrontend, InteractionMode, IoMode,
    ProcessInvocationSpec, ProviderDomain,
};

#[derive(Debug, Subcommand)]
pub enum HarnessCommand {
    /// Coding-agent harnesses and model API clients: capabilities, invocation specs, turns.
    Harness {
        #[command(subcommand)]
        command: HarnessSub,
    },
    /// Opens an interactive invocation spec (JSON, from `metash harness invocation --interactive`)
    /// in a new tmux window, recorded as a session (`metash sessions`).
    Attach {
        /// The spec file, or `-` for standard input.
        #[arg(long, default_value = "-")]
        spec: String,
        /// The tmux window's name.
        #[arg(long, default_value = "metash")]
        window_name: String,
        /// Run it under this role's sandbox (`metash sandbox --role ROLE`): the session is
        /// confined like the role's spawns, and asks for the native consent once.
        #[arg(long)]
        role: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
pub enum HarnessSub {
    /// Providers, their frontends (installed? which version?) and models.
    List {},
    /// Prints the ProcessInvocationSpec for a CLI harness as JSON (warnings go to stderr).
    Invocation(Box<InvocationArgs>),
    /// Runs one non-interactive turn and prints the response.
    Turn(Box<TurnArgs>),
}

#[derive(Debug, Args)]
pub struct CommonArgs {
    /// claude-code, codex-cli, agent-sdk, pi-sdk, anthropic-api, openai-responses, openai-chat.
    #[arg(long)]
    frontend: String,
    /// The harness's working directory (made absolute).
    #[arg(long)]
    cwd: PathBuf,
    /// The model (default: the frontend's own).
    #[arg(long)]
    model: Option<String>,
    /// The prompt (headless runs need one).
    #[arg(long)]
    prompt: Option<String>,
    /// Where the harness keeps its state (default `<workspace>/.meta/harness`).
    #[arg(long)]
    asp_home: Option<PathBuf>,
    /// The control plane's session id, stamped on every event.
    #[arg(long, default_value = "default")]
    cp_session_id: String,
    /// The continuation's provider (default: the frontend's).
    #[arg(long)]
    continuation_provider: Option<String>,
    /// Resume this conversation (a key a previous turn reported).
    #[arg(long)]
    continuation_key: Option<String>,
    /// Provider base URL (default: ANTHROPIC_BASE_URL / OPENAI_BASE_URL, else the provider's own).
    #[arg(long)]
    base_url: Option<String>,
    /// The environment variable that holds the API key.
    #[arg(long)]
    api_key_env: Option<String>,
    /// The provider name in Codex's / pi's config (keep it stable across turns).
    #[arg(long)]
    provider_name: Option<String>,
    /// Give the harness its own HOME under aspHome.
    #[arg(long)]
    isolated_home: bool,
    /// With --isolated-home: pre-answer the CLI's "trust this folder?" question for --cwd.
    #[arg(long)]
    trust_cwd: bool,
    /// Claude: `--permission-mode`; Codex: a sandbox mode (read-only, workspace-write,
    /// danger-full-access).
    #[arg(long)]
    permission_mode: Option<String>,
    /// Claude: the MCP tool (`mcp__SERVER__TOOL`) that answers permission prompts headless.
    #[arg(long)]
    permission_prompt_tool: Option<String>,
    /// Turn the CLI's own permission prompts and sandbox off (Claude
    /// `--dangerously-skip-permissions`, Codex `--dangerously-bypass-approvals-and-sandbox`).
    #[arg(long)]
    skip_permissions: bool,
    /// Replace the harness's system prompt.
    #[arg(long)]
    system_prompt: Option<String>,
    /// Append to the harness's system prompt.
    #[arg(long)]
    append_system_prompt: Option<String>,
    /// Another directory the CLI may work in (repeatable).
    #[arg(long = "add-dir")]
    extra_dirs: Vec<PathBuf>,
    /// Claude: `--max-budget-usd`.
    #[arg(long)]
    max_budget_usd: Option<f64>,
    /// Claude: `--max-turns`.
    #[arg(long)]
    max_turns: Option<u32>,
    /// MCP servers as a JSON object `{name: {command, args, env}}`.
    #[arg(long)]
    mcp_servers: Option<String>,
    /// Extra environment for the harness, `KEY=VALUE` (repeatable).
    #[arg(long = "env")]
    env: Vec<String>,
}

#[derive(Debug, Args)]
pub struct InvocationArgs {
    #[command(flatten)]
    common: CommonArgs,
    /// A headless run (the default).
    #[arg(long, conflicts_with = "interactive")]
    headless: bool,
    /// An interactive run for a terminal.
    #[arg(long)]
    interactive: bool,
    /// pipes, pty or inherit (default: pty when interactive, pipes when headless).
    #[arg(long)]
    io: Option<String>,
    /// Claude: fix the new conversation's id up front.
    #[arg(long)]
    session_id: Option<String>,
    /// Where the built spec is recorded (`invocation.json`) and the harness may emit logs
    /// (`ASP_ARTIFACT_DIR`); absolute.
    #[arg(long)]
    artifact_dir: Option<PathBuf>,
    /// A JSON file holding the space's `SpaceSpec` (an object), materialized for the harness
    /// (`ASP_SPACE_SPEC`).
    #[arg(long, value_name = "FILE")]
    space_spec: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct TurnArgs {
    #[command(flatten)]
    common: CommonArgs,
    /// API frontends: the response's token cap.
    #[arg(long)]
    max_tokens: Option<u32>,
    /// Bound on the whole turn.
    #[arg(long)]
    timeout_secs: Option<u64>,
    /// A file that goes with the prompt (repeatable): an image (API frontends) or UTF-8 text,
    /// relative to the turn's cwd.
    #[arg(long = "attach", value_name = "FILE")]
    attachments: Vec<String>,
    /// Stream every event as a JSON line to stderr.
    #[arg(long)]
    events: bool,
}

pub fn run(cmd: HarnessCommand, ctx: &super::Ctx) -> anyhow::Result<ExitCode> {
    let json = ctx.json;
    let workspace = absolute(&ctx.workspace)?;
    let programs = Programs::discover(Some(&workspace));
    match cmd {
        HarnessCommand::Harness { command } => match command {
            HarnessSub::List {} => list(&programs, json),
            HarnessSub::Invocation(a) => invocation(&programs, &workspace, *a),
            HarnessSub::Turn(a) => turn(programs, &workspace, *a, json),
        },
        HarnessCommand::Attach {
            spec,
            window_name,
            role,
        } => attach(ctx, &spec, &window_name, role.as_deref()),
    }
}

fn absolute(p: &Path) -> anyhow::Result<PathBuf> {
    let abs = if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir()?.join(p)
    };
    Ok(std::fs::canonicalize(&abs).unwrap_or(abs))
}

fn list(programs: &Programs, json: bool) -> anyhow::Result<ExitCode> {
    let caps = metash_harness::get_harness_capabilities(programs);
    if json {
        println!("{}", serde_json::to_string_pretty(&caps)?);
        return Ok(ExitCode::SUCCESS);
    }
    for p in &caps.providers {
        println!("{} (models: {})", p.provider.as_str(), p.models.join(", "));
        for f in &p.frontends {
            let state = match (f.kind, f.installed, &f.version) {
                (FrontendKind::Api, _, _) => "built in".to_string(),
                (_, true, Some(v)) => format!("installed, {v}"),
                (_, true, None) => "installed".to_string(),
                (_, false, _) => "not installed".to_string(),
            };
            println!(
                "  {:<17} {:<4} {state}",
                f.frontend.as_str(),
                f.kind.as_str()
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn parse_frontend(s: &str) -> anyhow::Result<HarnessFrontend> {
    HarnessFrontend::parse(s).ok_or_else(|| anyhow!("unsupported_frontend: {s:?}"))
}

/// The harness options and shared request fields from the common flags.
struct Common {
    frontend: HarnessFrontend,
    cwd: PathBuf,
    asp_home: PathBuf,
    continuation: Option<HarnessContinuationRef>,
    env: BTreeMap<String, String>,
    options: HarnessOptions,
}

fn common(c: &CommonArgs, workspace: &Path) -> anyhow::Result<Common> {
    let frontend = parse_frontend(&c.frontend)?;
    let cwd = absolute(&c.cwd)?;
    let asp_home = match &c.asp_home {
        Some(p) => absolute(p)?,
        None => workspace.join(".meta").join("harness"),
    };
    let continuation = match (&c.continuation_provider, &c.continuation_key) {
        (None, None) => None,
        (p, key) => {
            let provider = match p {
                Some(p) => {
                    ProviderDomain::parse(p).ok_or_else(|| anyhow!("unknown provider {p:?}"))?
                }
                None => frontend.provider(),
            };
            Some(HarnessContinuationRef {
                provider,
                key: key.clone(),
            })
        }
    };
    let mut env = BTreeMap::new();
    for kv in &c.env {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| anyhow!("--env wants KEY=VALUE, got {kv:?}"))?;
        env.insert(k.to_string(), v.to_string());
    }
    let base_url = c.base_url.clone().or_else(|| {
        let var = metash_harness::frontend::info(frontend).base_url_env;
        std::env::var(var).ok().filter(|v| !v.is_empty())
    });
    let endpoint = base_url.map(|base_url| Endpoint {
        base_url,
        api_key_env: c.api_key_env.clone(),
        provider_name: c.provider_name.clone(),
    });
    let mcp_servers = c
        .mcp_servers
        .as_deref()
        .map(serde_json::from_str)
        .transpose()
        .context("--mcp-servers is not JSON")?;
    let options = HarnessOptions {
        permission_mode: c.permission_mode.clone(),
        permission_prompt_tool: c.permission_prompt_tool.clone(),
        skip_permissions: c.skip_permissions,
        system_prompt: c.system_prompt.clone(),
        append_system_prompt: c.append_system_prompt.clone(),
        extra_dirs: c.extra_dirs.clone(),
        max_budget_usd: c.max_budget_usd,
        max_turns: c.max_turns,
        allowed_tools: Vec::new(),
        disallowed_tools: Vec::new(),
        mcp_servers,
        endpoint,
        isolated_home: c.isolated_home,
        session_id: None,
        include_partial_messages: false,
        trust_cwd: c.trust_cwd,
        sign_in: None,
    };
    Ok(Common {
        frontend,
        cwd,
        asp_home,
        continuation,
        env,
        options,
    })
}

/// A refusal with its stable code, as JSON on stdout, and exit code 7 (`Exit::Refused`: refused
/// before anything ran, docs/cli.md "Exit codes").
fn refused(err: &HarnessError) -> anyhow::Result<ExitCode> {
    let doc = serde_json::json!({"error": {"code": err.code(), "message": err.to_string()}});
    println!("{}", serde_json::to_string_pretty(&doc)?);
    eprintln!("metash: {err}");
    Ok(crate::exit::Exit::Refused.into())
}

fn invocation(
    programs: &Programs,
    workspace: &Path,
    a: InvocationArgs,
) -> anyhow::Result<ExitCode> {
    let c = common(&a.common, workspace)?;
    let interaction_mode = if a.interactive {
        InteractionMode::Interactive
    } else {
        InteractionMode::Headless
    };
    let io_mode = match a.io.as_deref() {
        None if a.interactive => IoMode::Pty,
        None => IoMode::Pipes,
        Some("pipes") => IoMode::Pipes,
        Some("pty") => IoMode::Pty,
        Some("inherit") => IoMode::Inherit,
        Some(other) => bail!("--io must be pipes, pty or inherit, not {other:?}"),
    };
    let mut options = c.options;
    options.session_id = a.session_id;
    let spec = a
        .space_spec
        .as_deref()
        .map(|f| -> anyhow::Result<serde_json::Value> {
            let text =
                std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
            serde_json::from_str(&text).with_context(|| format!("{}: not JSON", f.display()))
        })
        .transpose()?;
    let req = BuildProcessInvocationSpecRequest {
        cp_session_id: a.common.cp_session_id.clone(),
        asp_home: c.asp_home,
        provider: None,
        frontend: c.frontend,
        model: a.common.model.clone(),
        interaction_mode,
        io_mode,
        continuation: c.continuation,
        cwd: c.cwd,
        env: c.env,
        prompt: a.common.prompt.clone(),
        options,
        artifact_dir: a.artifact_dir,
        spec,
    };
    match metash_harness::build_process_invocation_spec(&req, programs) {
        Ok(resp) => {
            for w in &resp.warnings {
                eprintln!("metash: warning: {w}");
            }
            println!("{}", serde_json::to_string_pretty(&resp.spec)?);
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => refused(&e),
    }
}

fn turn(programs: Programs, workspace: &Path, a: TurnArgs, json: bool) -> anyhow::Result<ExitCode> {
    let c = common(&a.common, workspace)?;
    let prompt = a
        .common
        .prompt
        .clone()
        .ok_or_else(|| anyhow!("--prompt is required for a turn"))?;
    let mut req = RunTurnNonInteractiveRequest::new(c.frontend, c.asp_home, c.cwd, prompt);
    req.cp_session_id = a.common.cp_session_id.clone();
    req.model = a.common.model.clone();
    req.continuation = c.continuation;
    req.env = c.env;
    req.options = c.options;
    req.max_tokens = a.max_tokens;
    req.timeout_ms = a.timeout_secs.map(|s| s.saturating_mul(1000));
    req.attachments = a.attachments;
    let harness = Harness::new(programs)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let cancel = CancellationToken::new();
    let events = a.events;
    let result = rt.block_on(async {
        let c2 = cancel.clone();
        tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                c2.cancel();
            }
        });
        let mut sink = |e: metash_protocol::HarnessEventEnvelope| {
            if events {
                if let Ok(line) = serde_json::to_string(&e) {
                    eprintln!("{}", metash_protocol::sanitize_line(&line));
                }
            }
        };
        harness
            .run_turn_non_interactive(&req, &cancel, &mut sink)
            .await
    });
    let resp = match result {
        Ok(r) => r,
        Err(e) => return refused(&e),
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&resp)?);
    } else {
        // The model's words: its terminal controls shown as escapes (`--json` has them as sent).
        if let Some(text) = &resp.result.final_output {
            println!("{}", metash_protocol::sanitize_for_terminal(text));
        }
        if let Some(key) = resp.continuation.as_ref().and_then(|c| c.key.as_deref()) {
            eprintln!("continuation: {} {key}", resp.provider.as_str());
        }
        if let Some(err) = &resp.result.error {
            eprintln!(
                "metash: {}: {}",
                err.code.as_str(),
                metash_protocol::sanitize_for_terminal(&err.message)
            );
        }
    }
    Ok(if resp.result.success {
        ExitCode::SUCCESS
    } else {
        crate::exit::Exit::AgentError.into()
    })
}

fn attach(
    ctx: &Ctx,
    spec_path: &str,
    window_name: &str,
    role: Option<&str>,
) -> anyhow::Result<ExitCode> {
    let text = if spec_path == "-" {
        let mut s = String::new();
        std::io::stdin().read_to_string(&mut s)?;
        s
    } else {
        std::fs::read_to_string(spec_path).with_context(|| format!("read {spec_path}"))?
    };
    let spec: ProcessInvocationSpec =
        serde_json::from_str(&text).context("not a ProcessInvocationSpec")?;
    if spec.interaction_mode != InteractionMode::Interactive {
        eprintln!(
            "metash: warning: the spec is {:?}; attach is meant for interactive specs",
            spec.interaction_mode
        );
    }
    let spec = match role {
        Some(role) => sandboxed_spec(spec, role, &ctx.workspace)?,
        None => spec,
    };
    let tmux = metash_harness::tmux::Tmux::from_env();
    let env: Vec<(String, String)> = spec.env.clone().into_iter().collect();
    let window = tmux.open_window(&spec.argv, &spec.cwd, &env, window_name)?;
    let target = window.target.clone();
    // Recorded as a CP session too (`metash sessions`, Unix only), as far as the project can
    // be opened.
    #[cfg(unix)]
    if let Err(e) = super::session::record_attached(ctx, &spec, role, &tmux, &window) {
        eprintln!("metash: warning: the session was not recorded: {e:#}");
    }
    println!("{target}");
    if std::env::var_os("TMUX").is_none() {
        eprintln!("metash: opened in tmux {target}; run `tmux attach -t metash` to see it");
    }
    Ok(ExitCode::SUCCESS)
}

/// The same session, started by `metash sandbox --role ROLE` (the spec's variables handed over
/// with `--env`, since the sandbox clears the rest).
fn sandboxed_spec(
    mut spec: ProcessInvocationSpec,
    role: &str,
    workspace: &std::path::Path,
) -> anyhow::Result<ProcessInvocationSpec> {
    let exe = std::env::current_exe().context("locating the metash executable")?;
    let workspace = std::path::absolute(workspace)?;
    let mut argv = vec![
        exe.display().to_string(),
        "-C".into(),
        workspace.display().to_string(),
        "sandbox".into(),
        "--role".into(),
        role.to_string(),
        "--workdir".into(),
        spec.cwd.clone(),
    ];
    for (k, v) in std::mem::take(&mut spec.env) {
        argv.extend(["--env".to_string(), format!("{k}={v}")]);
    }
    argv.push("--".into());
    argv.append(&mut spec.argv);
    spec.argv = argv;
    Ok(spec)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::io::{Read, Write};
    use std::net::TcpListener;

    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(subcommand)]
        cmd: HarnessCommand,
    }

    fn parse(args: &[&str]) -> HarnessCommand {
        Cli::try_parse_from(std::iter::once("metash").chain(args.iter().copied()))
            .unwrap()
            .cmd
    }

    #[test]
    fn attach_with_a_role_starts_the_session_through_metash_sandbox() {
        let spec = ProcessInvocationSpec {
            provider: ProviderDomain::Anthropic,
            frontend: HarnessFrontend::ClaudeCode,
            argv: vec!["claude".into(), "--model".into(), "x".into()],
            cwd: "/ws/.meta/worktrees/t1".into(),
            env: [("HOME".to_string(), "/h".to_string())].into(),
            interaction_mode: InteractionMode::Interactive,
            io_mode: metash_protocol::IoMode::Pty,
            continuation: None,
            display_command: None,
        };
        let s = sandboxed_spec(spec, "coder", Path::new("/ws")).unwrap();
        assert!(
            s.env.is_empty(),
            "the sandbox clears the environment; --env carries it"
        );
        let tail: Vec<&str> = s.argv[1..].iter().map(String::as_str).collect();
        assert_eq!(
            tail,
            [
                "-C",
                "/ws",
                "sandbox",
                "--role",
                "coder",
                "--workdir",
                "/ws/.meta/worktrees/t1",
                "--env",
                "HOME=/h",
                "--",
                "claude",
                "--model",
                "x"
            ]
        );
        assert!(matches!(
            parse(&["attach", "--role", "coder"]),
            HarnessCommand::Attach { role: Some(r), .. } if r == "coder"
        ));
    }

    #[test]
    fn invocation_flags_parse_and_default_sensibly() {
        let HarnessCommand::Harness {
            command: HarnessSub::Invocation(a),
        } = parse(&[
            "harness",
            "invocation",
            "--frontend",
            "claude-code",
            "--cwd",
            "/tmp",
            "--interactive",
            "--continuation-key",
            "k1",
            "--model",
            "opus",
            "--add-dir",
            "/a",
            "--env",
            "A=b=c",
        ])
        else {
            panic!("not an invocation");
        };
        let c = common(&a.common, Path::new("/ws")).unwrap();
        assert_eq!(c.asp_home, Path::new("/ws/.meta/harness"));
        assert_eq!(c.continuation.unwrap().provider, ProviderDomain::Anthropic);
        assert_eq!(c.env.get("A").map(String::as_str), Some("b=c"));
        assert_eq!(c.options.extra_dirs, vec![PathBuf::from("/a")]);
        assert!(a.interactive);
        let HarnessCommand::Attach { spec, .. } = parse(&["attach", "--spec", "s.json"]) else {
            panic!()
        };
        assert_eq!(spec, "s.json");
        assert!(Cli::try_parse_from([
            "metash",
            "harness",
            "invocation",
            "--frontend",
            "x",
            "--cwd",
            "/",
            "--headless",
            "--interactive"
        ])
        .is_err());
    }

    /// `metash harness turn` end to end against a loopback chat-completions server.
    #[test]
    fn turn_runs_against_a_loopback_server_and_persists_the_transcript() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}/v1", listener.local_addr().unwrap());
        let server = std::thread::spawn(move || {
            let (mut sock, _) = listener.accept().unwrap();
            let mut buf = vec![0u8; 65536];
            let mut got = Vec::new();
            loop {
                let n = sock.read(&mut buf).unwrap();
                got.extend_from_slice(&buf[..n]);
                let text = String::from_utf8_lossy(&got);
                if let Some(end) = text.find("\r\n\r\n") {
                    let len = text[..end]
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase()
                                .strip_prefix("content-length:")
                                .map(|v| v.trim().parse::<usize>().unwrap())
                        })
                        .unwrap_or(0);
                    if got.len() >= end + 4 + len {
                        break;
                    }
                }
            }
            let chunk =
                r#"{"choices":[{"index":0,"delta":{"content":"pong"},"finish_reason":"stop"}]}"#;
            let body = format!("data: {chunk}\n\ndata: [DONE]\n\n");
            let head =
                "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n";
            sock.write_all(head.as_bytes()).unwrap();
            sock.write_all(body.as_bytes()).unwrap();
            String::from_utf8_lossy(&got).into_owned()
        });
        let ws = tempfile::tempdir().unwrap();
        let HarnessCommand::Harness {
            command: HarnessSub::Turn(a),
        } = parse(&[
            "harness",
            "turn",
            "--frontend",
            "openai-chat",
            "--cwd",
            "/tmp",
            "--prompt",
            "ping",
            "--model",
            "local",
            "--base-url",
            &base,
        ])
        else {
            panic!("not a turn");
        };
        let code = turn(Programs::default(), ws.path(), *a, true).unwrap();
        assert_eq!(code, ExitCode::SUCCESS);
        let request = server.join().unwrap();
        assert!(request.starts_with("POST /v1/chat/completions"));
        assert!(request.contains("\"ping\""));
        let transcripts = std::fs::read_dir(ws.path().join(".meta/harness/transcripts"))
            .unwrap()
            .count();
        assert_eq!(transcripts, 1);
    }
}
