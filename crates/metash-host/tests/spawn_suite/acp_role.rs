//! Issue 34, the client side: a real ACP agent from npm (`@zed-industries/claude-code-acp`,
//! which wraps Claude Code's SDK) runs one turn as a `frontend = "acp"` role, in metash's
//! sandbox, against a loopback Anthropic server through the credential proxy. The model's
//! scripted answers make it write a file through ACP's `fs/write_text_file` (asked, granted by
//! consent, landed in the worktree), run a shell command (asked, refused by consent, never run),
//! and read a file outside the project through `fs/read_text_file` (refused by metash: the
//! secret never reaches the model). The real key is nowhere in the agent's environment.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use metash_host::{ConsentMode, Host, HostOptions, SpawnRequest, Spawner, Terminal};
use metash_protocol::AgentStatus;
use metash_testkit::anthropic::{sse_text, sse_tool_use, sse_tool_use_with, ModelServer};
use metash_testkit::cli::Cli;
use serde_json::json;

use super::common::Project;

const KEY: &str = "sk-ant-real-acp-0123456789-never-in-the-sandbox";
const SECRET: &str = "OUTSIDE-THE-PROJECT-7f3a9c";

/// The agent's launcher under `.tools` (installed by scripts/setup), or a skip (a failure under
/// CI) saying why it cannot run here.
fn claude_code_acp(test: &str) -> Option<PathBuf> {
    let bin = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../.tools/node_modules/.bin/claude-code-acp");
    if !bin.exists() {
        metash_testkit::skip(
            test,
            "@zed-industries/claude-code-acp is not installed under .tools (run scripts/setup)",
        );
        return None;
    }
    if let Some(why) = super::common::native_unavailable() {
        metash_testkit::skip(test, &why);
        return None;
    }
    std::path::absolute(bin).ok()
}

/// The environment of every live process whose command line names the agent.
fn agent_environs() -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let p = e.path();
        let (Ok(cmd), Ok(env)) = (
            std::fs::read(p.join("cmdline")),
            std::fs::read(p.join("environ")),
        ) else {
            continue;
        };
        let cmd = String::from_utf8_lossy(&cmd);
        if ["claude-code-acp", "claude-agent-sdk", "codex-acp"]
            .iter()
            .any(|n| cmd.contains(n))
        {
            out.push(String::from_utf8_lossy(&env).replace('\0', "\n"));
        }
    }
    out
}

/// One turn of the agent as the role `coder` (`permissions = "ask"`), consent answered from
/// `yes_to` only; the model answers the task's `n`th request with `script(n, worktree, secret)`.
struct Run {
    p: Project,
    ws: PathBuf,
    server: ModelServer,
    environs: Arc<Mutex<Vec<String>>>,
    r: metash_protocol::AgentResponse,
    _outside: tempfile::TempDir,
}

fn run(
    bin: &std::path::Path,
    yes_to: &[&str],
    extra_config: &str,
    script: impl Fn(usize, &std::path::Path, &std::path::Path) -> String + Send + Sync + 'static,
) -> Run {
    let p = Project::new();
    let ws = p.path().canonicalize().expect("workspace");
    let outside = tempfile::tempdir().expect("outside");
    let secret = outside.path().join("secret.txt");
    std::fs::write(&secret, SECRET).expect("secret");
    let environs = Arc::new(Mutex::new(Vec::new()));
    let server = {
        let (environs, ws) = (environs.clone(), ws.clone());
        ModelServer::start(move |c| {
            // While the agent waits for this answer, look at what it holds.
            environs.lock().expect("lock").extend(agent_environs());
            let body = c.text();
            if !body.contains("ACP-TASK") {
                return sse_text("ok");
            }
            script(Cli::Claude.results(&body), &ws, &secret)
        })
    };
    p.config(&format!(
        "[roles.coder]\nfrontend = \"acp\"\ncommand = [{:?}]\nmodel_smart = \"claude-sonnet-4-5\"\n\
         base_url = \"{}\"\napi_key_env = \"METASH_TEST_CLI_KEY\"\npermissions = \"ask\"\n{extra_config}",
        bin.display().to_string(),
        server.base
    ));
    let host = Host::open(
        p.path(),
        HostOptions {
            terminal: Terminal::Silent,
            env: [("METASH_TEST_CLI_KEY".to_string(), KEY.to_string())].into(),
            consent: ConsentMode::NonInteractive,
            yes_to: yes_to
                .iter()
                .map(|c| c.parse().expect("capability"))
                .collect(),
            ..HostOptions::default()
        },
    )
    .expect("host");
    let mut req = SpawnRequest::new("coder", "You are a test.", "ACP-TASK: write hello.txt.");
    req.options.timeout_seconds = Some(180.0);
    let r = host.spawn_agent(&req).expect("spawn");
    Run {
        p,
        ws,
        server,
        environs,
        r,
        _outside: outside,
    }
}

#[test]
fn an_acp_agent_runs_confined_with_its_permissions_as_consent_and_its_escape_refused() {
    let test = "an_acp_agent_runs_confined_with_its_permissions_as_consent_and_its_escape_refused";
    let Some(bin) = claude_code_acp(test) else {
        return;
    };
    let Run {
        p,
        ws,
        server,
        environs,
        r,
        ..
    } = run(
        &bin,
        &["native", "files.write"],
        "",
        |n, ws, secret| match n {
            0 => sse_tool_use(
                "toolu_w",
                "mcp__acp__Write",
                &json!({"file_path": ws.join("hello.txt"), "content": "written through ACP\n"}),
            ),
            1 => sse_tool_use("toolu_r", "mcp__acp__Read", &json!({"file_path": secret})),
            // A refused tool use interrupts claude-code-acp's turn: this is the last call.
            2 => sse_tool_use(
                "toolu_b",
                "Bash",
                &json!({"command": "echo ran > denied.txt", "description": "write"}),
            ),
            _ => sse_text("all done"),
        },
    );
    let kinds = p.log_kinds();
    assert_eq!(r.status, AgentStatus::Success, "{r:?}\n{kinds:?}");
    let stops: Vec<_> = p
        .log_data("harness_event")
        .into_iter()
        .filter(|e| e["payload"]["type"] == "stopped")
        .collect();
    assert_eq!(stops.len(), 1, "{stops:?}");
    assert_eq!(stops[0]["payload"]["stopReason"], "end_turn");

    // The write was asked, granted, and landed through fs/write_text_file.
    assert_eq!(
        std::fs::read_to_string(ws.join("hello.txt")).expect("the write landed"),
        "written through ACP\n"
    );
    // The shell command was asked, refused, and never ran.
    assert!(!ws.join("denied.txt").exists(), "a refused command ran");
    let answers = p.log_data("consent_answer");
    assert!(
        answers
            .iter()
            .any(|a| a["answer"] == "deny" && a["capability"] == "process.spawn:echo"),
        "{answers:?}"
    );
    let perms: Vec<_> = p
        .log_data("harness_event")
        .into_iter()
        .filter(|e| e["payload"]["type"] == "permission")
        .map(|e| {
            (
                e["payload"]["kind"].clone(),
                e["payload"]["allowed"].clone(),
            )
        })
        .collect();
    assert!(perms.contains(&(json!("edit"), json!(true))), "{perms:?}");
    assert!(
        perms.contains(&(json!("execute"), json!(false))),
        "{perms:?}"
    );

    // One tool_call and one tool_result line per call, with kind, title and status.
    let calls = p.log_data("tool_call");
    let call_kinds: Vec<_> = calls.iter().map(|c| c["kind"].clone()).collect();
    assert!(
        call_kinds.contains(&json!("edit")) && call_kinds.contains(&json!("execute")),
        "{calls:?}"
    );
    assert!(
        calls.iter().any(|c| c["kind"] == "edit"
            && c["title"].as_str().is_some_and(|t| t.contains("hello.txt"))
            && c["args"]
                .as_str()
                .is_some_and(|a| a.contains("written through ACP"))),
        "{calls:?}"
    );
    let results = p.log_data("tool_result");
    assert!(
        results
            .iter()
            .any(|r| r["kind"] == "execute" && r["status"] == "error"),
        "{results:?}"
    );
    for c in &calls {
        let n = results.iter().filter(|r| r["id"] == c["id"]).count();
        assert_eq!(n, 1, "one result for {c}: {results:?}");
    }

    // The escape probe: the read outside the project was refused by metash, and the secret
    // reached neither the model nor the log.
    let posts = server.posts();
    let last = posts
        .iter()
        .find(|c| Cli::Claude.results(&c.text()) == 2)
        .expect("the model heard the read's result");
    assert!(
        last.text().contains("outside the worktree"),
        "{}",
        last.text()
    );
    for c in &posts {
        assert!(!c.text().contains(SECRET), "the secret reached the model");
        assert_eq!(
            c.header("x-api-key"),
            Some(KEY),
            "the upstream gets the real key"
        );
    }
    // The agent ran in the sandbox (its start report says so) with the placeholder only.
    let started = p.log_data("agent_started");
    assert!(
        started.iter().any(|s| s["frontend"] == "acp"),
        "{started:?}"
    );
    let environs = environs.lock().expect("lock").clone();
    assert!(
        !environs.is_empty(),
        "the agent was running during its requests"
    );
    for env in &environs {
        assert!(!env.contains(KEY), "the key reached the agent");
        assert!(env.contains("metash-placeholder"), "{env}");
    }
    for f in metash_testkit::procs::files_under(p.path()) {
        let text = std::fs::read(&f).unwrap_or_default();
        let text = String::from_utf8_lossy(&text);
        assert!(!text.contains(KEY), "{} holds the key", f.display());
        assert!(!text.contains(SECRET), "{} holds the secret", f.display());
    }
}

/// The agent's own shell tool, granted by consent, runs inside the sandbox: it reads no file
/// outside the project and finds no key in its environment (the command ran: its files are
/// there).
#[test]
fn an_acp_agents_own_shell_runs_in_the_sandbox() {
    let test = "an_acp_agents_own_shell_runs_in_the_sandbox";
    let Some(bin) = claude_code_acp(test) else {
        return;
    };
    let run = run(
        &bin,
        &["native", "process.spawn"],
        "",
        |n, _ws, secret: &std::path::Path| match n {
            0 => sse_tool_use(
                "toolu_s",
                "Bash",
                &json!({"command": format!("cat {} > leak.txt 2>&1; env > env.txt", secret.display()),
                    "description": "probe"}),
            ),
            _ => sse_text("probed"),
        },
    );
    assert_eq!(run.r.status, AgentStatus::Success, "{:?}", run.r);
    assert!(run.r.data.contains("probed"), "{}", run.r.data);
    let leak = std::fs::read_to_string(run.ws.join("leak.txt")).expect("the command ran");
    assert!(
        !leak.contains(SECRET),
        "the sandbox let the secret out: {leak}"
    );
    assert!(
        leak.contains("Permission denied") || leak.contains("No such file"),
        "{leak}"
    );
    let env = std::fs::read_to_string(run.ws.join("env.txt")).expect("the command ran");
    assert!(!env.contains(KEY), "the key is in the agent's environment");
    assert!(env.contains("metash-placeholder"), "{env}");
    assert!(!run.environs.lock().expect("lock").is_empty());
    let answers = run.p.log_data("consent_answer");
    assert!(
        answers
            .iter()
            .any(|a| a["capability"] == "process.spawn:cat" && a["answer"] != "deny"),
        "{answers:?}"
    );
    assert!(run
        .server
        .posts()
        .iter()
        .all(|c| !c.text().contains(SECRET)));
}

/// The run's `max_cost_usd` stops an ACP agent mid-turn: the model's first answer (a shell
/// call) reports 50 000 output tokens, priced past the budget; the proxy's tap reads it as it
/// streams, metash sends `session/cancel` and ends the tree, says why, and the call's effect
/// never happens.
#[test]
fn an_acp_agent_is_cancelled_mid_turn_at_the_cost_budget() {
    let test = "an_acp_agent_is_cancelled_mid_turn_at_the_cost_budget";
    let Some(bin) = claude_code_acp(test) else {
        return;
    };
    let started = std::time::Instant::now();
    let run = run(
        &bin,
        &["native", "process.spawn"],
        "[budget]\nmax_cost_usd = 0.1\n[prices.\"claude-sonnet-4-5\"]\n\
         input_per_mtok = 0.0\noutput_per_mtok = 10.0\n",
        |n, _ws, _secret| match n {
            0 => sse_tool_use_with(
                "toolu_l",
                "Bash",
                &json!({"command": "sleep 20; echo late > late.txt", "description": "slow"}),
                50_000,
            ),
            _ => sse_text("the turn went on"),
        },
    );
    assert_eq!(run.r.status, AgentStatus::Error, "{:?}", run.r);
    assert!(
        run.r.data.contains("max_cost_usd exceeded"),
        "{}",
        run.r.data
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(20),
        "stopped before the tool ended"
    );
    std::thread::sleep(std::time::Duration::from_secs(1));
    assert!(!run.ws.join("late.txt").exists());
    let asked = run
        .server
        .posts()
        .iter()
        .filter(|c| c.text().contains("ACP-TASK"))
        .count();
    assert_eq!(asked, 1, "no request after the stop");
    let stops: Vec<_> = run
        .p
        .log_data("harness_event")
        .into_iter()
        .filter(|e| e["payload"]["type"] == "stopped")
        .collect();
    // metash sent `session/cancel` and the agent ended its turn as ACP asks.
    assert_eq!(stops.len(), 1, "{stops:?}");
    assert_eq!(stops[0]["payload"]["stopReason"], "cancelled", "{stops:?}");
}

/// codex-acp (Codex behind ACP), `provider = "openai"`: its endpoint is named in its own `-c`
/// config through `${METASH_MODEL_BASE_URL}`. One turn runs in the sandbox to `end_turn`, the
/// upstream gets the real key, the agent's processes only the placeholder, and its tool call is
/// one `tool_call` and one `tool_result` line. Its shell command runs, confined: the Codex inside
/// codex-acp 0.16.0 starts commands through `socketpair(AF_UNIX, SOCK_SEQPACKET)`, which the
/// sandbox allows (a connected pair reaches nothing; docs/runtime.md).
#[test]
fn codex_acp_runs_one_turn_in_the_sandbox() {
    let test = "codex_acp_runs_one_turn_in_the_sandbox";
    let bin = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../.tools/node_modules/.bin/codex-acp");
    if !bin.exists() {
        metash_testkit::skip(
            test,
            "@zed-industries/codex-acp is not installed under .tools (run scripts/setup)",
        );
        return;
    }
    if let Some(why) = super::common::native_unavailable() {
        metash_testkit::skip(test, &why);
        return;
    }
    let bin = std::path::absolute(bin).expect("bin");
    let p = Project::new();
    let environs = Arc::new(Mutex::new(Vec::new()));
    let server = {
        let environs = environs.clone();
        ModelServer::start(move |c| {
            environs.lock().expect("lock").extend(agent_environs());
            let body = c.text();
            if !body.contains("ACP-TASK") {
                return Cli::Codex.text("ok");
            }
            match Cli::Codex.results(&body) {
                0 => Cli::Codex.shell(0, &body, "echo from-codex > codex.txt"),
                _ => Cli::Codex.text("codex done"),
            }
        })
    };
    let command: Vec<String> = [
        bin.display().to_string().as_str(),
        "-c",
        "model_provider=\"metash\"",
        "-c",
        "model_providers.metash={name=\"metash\", base_url=\"${METASH_MODEL_BASE_URL}\", \
         env_key=\"OPENAI_API_KEY\", wire_api=\"responses\"}",
        "-c",
        "model=\"gpt-5.1-codex\"",
        "-c",
        "approval_policy=\"never\"",
        "-c",
        "sandbox_mode=\"danger-full-access\"",
        "-c",
        "analytics.enabled=false",
        "-c",
        "check_for_update_on_startup=false",
        "-c",
        "features.unified_exec=false",
    ]
    .iter()
    .map(|a| format!("{a:?}"))
    .collect();
    p.config(&format!(
        "[roles.coder]\nfrontend = \"acp\"\nprovider = \"openai\"\ncommand = [{}]\n\
         model_smart = \"gpt-5.1-codex\"\nbase_url = \"{}/v1\"\n\
         api_key_env = \"METASH_TEST_CLI_KEY\"\n",
        command.join(", "),
        server.base
    ));
    let host = Host::open(
        p.path(),
        HostOptions {
            terminal: Terminal::Silent,
            env: [("METASH_TEST_CLI_KEY".to_string(), KEY.to_string())].into(),
            consent: ConsentMode::NonInteractive,
            yes_to: vec!["native".parse().expect("capability")],
            ..HostOptions::default()
        },
    )
    .expect("host");
    let mut req = SpawnRequest::new("coder", "You are a test.", "ACP-TASK: probe.");
    req.options.timeout_seconds = Some(180.0);
    let r = host.spawn_agent(&req).expect("spawn");
    assert_eq!(r.status, AgentStatus::Success, "{r:?}\n{:?}", p.log_kinds());
    assert!(r.data.contains("codex done"), "{}", r.data);
    let posts = server.posts();
    let with_result = posts
        .iter()
        .find(|c| Cli::Codex.results(&c.text()) == 1)
        .expect("the model heard the call's result");
    // Codex starts its command over a seqpacket socket pair, which the sandbox allows: it ran.
    assert!(
        !with_result.text().contains("Operation not permitted"),
        "the command was refused: {}",
        with_result.text()
    );
    let ws = p.path().canonicalize().expect("workspace");
    assert_eq!(
        std::fs::read_to_string(ws.join("codex.txt")).expect("the command ran"),
        "from-codex\n"
    );
    for c in &posts {
        assert_eq!(
            c.header("authorization"),
            Some(format!("Bearer {KEY}").as_str()),
            "the upstream gets the real key"
        );
    }
    let environs = environs.lock().expect("lock").clone();
    assert!(
        !environs.is_empty(),
        "the agent was running during its requests"
    );
    for env in &environs {
        assert!(
            !env.contains(KEY) && env.contains("metash-placeholder"),
            "{env}"
        );
    }
    let calls = p.log_data("tool_call");
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0]["kind"], "execute");
    let results = p.log_data("tool_result");
    assert_eq!(results.len(), 1, "{results:?}");
    assert_eq!(results[0]["id"], calls[0]["id"]);
    assert!(p
        .log_data("agent_started")
        .iter()
        .any(|s| s["frontend"] == "acp"));
}

/// An ACP role whose command is not an executable ends the spawn with an error naming it,
/// before anything runs (the sandbox resolves the program when it is prepared).
#[test]
fn an_acp_role_whose_command_is_missing_ends_with_an_error() {
    let test = "an_acp_role_whose_command_is_missing_ends_with_an_error";
    if let Some(why) = super::common::native_unavailable() {
        metash_testkit::skip(test, &why);
        return;
    }
    let p = Project::new();
    p.config(
        "[roles.coder]\nfrontend = \"acp\"\ncommand = [\"/nonexistent/metash-acp-agent\"]\n\
         base_url = \"http://127.0.0.1:9\"\napi_key_env = \"METASH_TEST_CLI_KEY\"\n",
    );
    let host = Host::open(
        p.path(),
        HostOptions {
            terminal: Terminal::Silent,
            env: [("METASH_TEST_CLI_KEY".to_string(), KEY.to_string())].into(),
            consent: ConsentMode::NonInteractive,
            yes_to: vec!["native".parse().expect("capability")],
            ..HostOptions::default()
        },
    )
    .expect("host");
    let r = host
        .spawn_agent(&SpawnRequest::new("coder", "", "ACP-TASK"))
        .expect("spawn");
    assert_eq!(r.status, AgentStatus::Error, "{r:?}");
    assert!(
        r.data.contains("/nonexistent/metash-acp-agent") && r.data.contains("sandbox"),
        "{}",
        r.data
    );
    assert!(p.log_data("agent_started").is_empty());
}
