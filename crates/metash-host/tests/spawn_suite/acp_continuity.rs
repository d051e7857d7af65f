//! Issue 34, continuity of an ACP role across its spawns (seed 003): the real claude-code-acp
//! 0.16.2 and codex-acp 0.16.0 each run two turns of the same role on the same task, in the
//! sandbox, against a loopback model. The first turn's ACP session id is kept as the role's
//! continuation key and the agent's HOME (where it files its sessions) is kept with it; the
//! second spawn continues the session with `session/load`: the model's second request carries
//! the first turn's user message and answer, and the log's `session` event says `loaded`. A
//! turn on another task starts a session of its own; a HOME that lost the agent's sessions
//! makes the load fail, and the turn goes on in a new session saying why. The kept HOME never
//! holds the real key.

use std::path::{Path, PathBuf};

use metash_host::{ConsentMode, Host, HostOptions, SpawnRequest, Spawner, Terminal};
use metash_protocol::AgentStatus;
use metash_testkit::anthropic::{sse_text, ModelServer};
use metash_testkit::cli::Cli;
use serde_json::Value;

use super::common::Project;

const KEY: &str = "sk-real-acp-continuity-0123456789-never-in-a-home";
const WORD: &str = "PAPAYA-4711";

/// The agent's launcher under `.tools` (installed by scripts/setup), or a skip (a failure under
/// CI) saying why it cannot run here.
fn agent_bin(test: &str, name: &str) -> Option<PathBuf> {
    let bin = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../.tools/node_modules/.bin")
        .join(name);
    if !bin.exists() {
        let why =
            format!("@zed-industries/{name} is not installed under .tools (run scripts/setup)");
        metash_testkit::skip(test, &why);
        return None;
    }
    if let Some(why) = super::common::native_unavailable() {
        metash_testkit::skip(test, &why);
        return None;
    }
    std::path::absolute(bin).ok()
}

/// Removes the kept spawn directories when the test ends (they live outside the project).
#[derive(Default)]
struct KeptDirs(Vec<PathBuf>);

impl KeptDirs {
    /// The spawn directory holding a session event's `home`.
    fn add(&mut self, ev: &Value) {
        let home = Path::new(ev["home"].as_str().unwrap_or_default());
        if let Some(d) = home.parent().filter(|d| !self.0.iter().any(|k| k == d)) {
            self.0.push(d.to_path_buf());
        }
    }
}

impl Drop for KeptDirs {
    fn drop(&mut self) {
        for d in &self.0 {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

/// A host on `p` with `config`'s role `coder`, the real key in its environment only.
fn host(p: &Project, config: &str) -> Host {
    p.config(config);
    Host::open(
        p.path(),
        HostOptions {
            terminal: Terminal::Silent,
            env: [("METASH_TEST_CLI_KEY".to_string(), KEY.to_string())].into(),
            consent: ConsentMode::NonInteractive,
            yes_to: vec!["native".parse().expect("capability")],
            ..HostOptions::default()
        },
    )
    .expect("host")
}

/// One turn of `coder` on `task`; its `session` log event.
fn turn(host: &Host, p: &Project, task: &str, message: &str) -> Value {
    let before = sessions(p).len();
    let mut req = SpawnRequest::new("coder", "You are a test.", message);
    req.task_id = Some(task.to_string());
    req.options.timeout_seconds = Some(180.0);
    let r = host.spawn_agent(&req).expect("spawn");
    assert_eq!(r.status, AgentStatus::Success, "{r:?}\n{:?}", p.log_kinds());
    let all = sessions(p);
    assert_eq!(all.len(), before + 1, "one session event per turn: {all:?}");
    all[before].clone()
}

/// The `session` events of the log, in order.
fn sessions(p: &Project) -> Vec<Value> {
    p.log_data("harness_event")
        .into_iter()
        .filter(|e| e["payload"]["type"] == "session")
        .map(|e| e["payload"].clone())
        .collect()
}

/// The kept HOME a session event names: it holds the agent's record of the session (a file
/// named by its id) and never the key.
fn check_home(ev: &Value) -> PathBuf {
    let home = PathBuf::from(ev["home"].as_str().expect("home"));
    let id = ev["sessionId"].as_str().expect("id");
    let files = metash_testkit::procs::files_under(&home);
    assert!(
        files.iter().any(|f| f.display().to_string().contains(id)),
        "the agent's session {id} is not filed under its kept HOME: {files:?}"
    );
    for f in &files {
        let text = std::fs::read(f).unwrap_or_default();
        assert!(
            !String::from_utf8_lossy(&text).contains(KEY),
            "{} holds the key",
            f.display()
        );
    }
    home
}

/// Two turns on task `t1`: the first in a new session, the second loading it (same session id,
/// same kept HOME), and the model's second request holding the first turn's conversation. Every
/// request carried the real key (`key`: the header and its value); neither HOME holds it.
fn two_turns_continue(
    host: &Host,
    p: &Project,
    server: &ModelServer,
    key: (&str, &str),
) -> (Value, KeptDirs) {
    let one = turn(host, p, "t1", &format!("ACP-TURN-ONE: remember {WORD}."));
    let mut kept = KeptDirs::default();
    kept.add(&one);
    check_home(&one);
    assert_eq!(one["loaded"], false, "{one}");

    let two = turn(host, p, "t1", "ACP-TURN-TWO: which word?");
    assert_eq!(two["loaded"], true, "{two}");
    assert_eq!(two["sessionId"], one["sessionId"], "{two}");
    assert_eq!(two["home"], one["home"], "{two}");
    let posts = server.posts();
    let second = posts
        .iter()
        .find(|c| c.text().contains("ACP-TURN-TWO"))
        .expect("the model heard the second turn");
    let text = second.text();
    assert!(
        text.contains(WORD) && text.contains("NOTED-ONE"),
        "the second turn's request lacks the first turn's conversation: {text}"
    );
    for c in &posts {
        assert_eq!(c.header(key.0), Some(key.1), "the upstream gets the key");
    }
    check_home(&two);
    (one, kept)
}

#[test]
fn claude_code_acp_continues_its_session_across_spawns() {
    let test = "claude_code_acp_continues_its_session_across_spawns";
    let Some(bin) = agent_bin(test, "claude-code-acp") else {
        return;
    };
    let p = Project::new();
    let server = ModelServer::start(|c| {
        let body = c.text();
        if body.contains("ACP-TURN-TWO") {
            sse_text("the word was remembered")
        } else if body.contains("ACP-TURN-ONE") {
            sse_text("NOTED-ONE")
        } else {
            sse_text("ok")
        }
    });
    let host = host(
        &p,
        &format!(
            "[roles.coder]\nfrontend = \"acp\"\ncommand = [{:?}]\nmodel_smart = \"claude-sonnet-4-5\"\n\
             base_url = \"{}\"\napi_key_env = \"METASH_TEST_CLI_KEY\"\n",
            bin.display().to_string(),
            server.base
        ),
    );
    let (one, mut kept) = two_turns_continue(&host, &p, &server, ("x-api-key", KEY));
    assert_eq!(one["fallback"], Value::Null, "{one}");

    // Another task: a session of its own, with nothing of t1's.
    let other = turn(&host, &p, "t2", "ACP-TURN-THREE: anything?");
    kept.add(&other);
    assert_ne!(other["home"], one["home"], "t2 has a HOME of its own");
    assert_eq!(other["loaded"], false, "{other}");
    assert_ne!(other["sessionId"], one["sessionId"]);
    let third = server
        .posts()
        .into_iter()
        .find(|c| c.text().contains("ACP-TURN-THREE"))
        .expect("the model heard t2");
    assert!(!third.text().contains(WORD), "t2 saw t1's conversation");

    // t1's HOME loses the agent's sessions: the load fails, and the turn goes on in a new
    // session saying why.
    let home = PathBuf::from(one["home"].as_str().expect("home"));
    std::fs::remove_dir_all(&home).expect("emptying the kept HOME");
    let lost = turn(&host, &p, "t1", "ACP-TURN-FOUR: still there?");
    assert_eq!(lost["loaded"], false, "{lost}");
    assert_ne!(lost["sessionId"], one["sessionId"], "{lost}");
    let why = lost["fallback"].as_str().unwrap_or_default();
    assert!(why.contains("session/load"), "{lost}");
    // The key is in no file of the project either (the records in `.meta/acp/` included).
    for f in metash_testkit::procs::files_under(p.path()) {
        let text = std::fs::read(&f).unwrap_or_default();
        assert!(
            !String::from_utf8_lossy(&text).contains(KEY),
            "{}",
            f.display()
        );
    }
}

#[test]
fn codex_acp_continues_its_session_across_spawns() {
    let test = "codex_acp_continues_its_session_across_spawns";
    let Some(bin) = agent_bin(test, "codex-acp") else {
        return;
    };
    let p = Project::new();
    let server = ModelServer::start(|c| {
        let body = c.text();
        if body.contains("ACP-TURN-TWO") {
            Cli::Codex.text("the word was remembered")
        } else if body.contains("ACP-TURN-ONE") {
            Cli::Codex.text("NOTED-ONE")
        } else {
            Cli::Codex.text("ok")
        }
    });
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
    let host = host(
        &p,
        &format!(
            "[roles.coder]\nfrontend = \"acp\"\nprovider = \"openai\"\ncommand = [{}]\n\
             model_smart = \"gpt-5.1-codex\"\nbase_url = \"{}/v1\"\n\
             api_key_env = \"METASH_TEST_CLI_KEY\"\n",
            command.join(", "),
            server.base
        ),
    );
    let bearer = format!("Bearer {KEY}");
    let (one, mut kept) =
        two_turns_continue(&host, &p, &server, ("authorization", bearer.as_str()));

    // The whole kept directory is gone: the key is not offered, and the turn says why.
    let dir = Path::new(one["home"].as_str().expect("home"))
        .parent()
        .expect("spawn dir")
        .to_path_buf();
    std::fs::remove_dir_all(&dir).expect("removing the kept directory");
    let gone = turn(&host, &p, "t1", "ACP-TURN-THREE: still there?");
    kept.add(&gone);
    assert_eq!(gone["loaded"], false, "{gone}");
    assert_ne!(gone["home"], one["home"], "{gone}");
    let why = gone["fallback"].as_str().unwrap_or_default();
    assert!(why.contains("is gone"), "{gone}");
}
