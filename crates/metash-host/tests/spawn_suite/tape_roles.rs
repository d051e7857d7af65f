//! Issue 36 item 1 beyond the CLI roles: an API role's turn (metash's own Anthropic client) and
//! an ACP agent's turn (the real `claude-code-acp`), each against a loopback model as task 01's
//! attempt 2, are recorded through the credential proxy like a CLI's: one tape naming the role,
//! its frontend, the task and the attempt, every request body as the model got it, linked from
//! the log, and no byte under `.meta/tapes/` holding the key or the placeholder (the model echoes
//! the key it was sent back in its answer, so the redaction is exercised on both sides). The API
//! role's tape then answers the same turn again with the model unreachable and no key set.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use metash_host::{Host, HostOptions, SpawnRequest, Spawner};
use metash_protocol::AgentStatus;
use metash_store::tape::{Tape, Tapes};
use metash_store::Store;
use metash_testkit::anthropic::{sse_text, ModelServer};

use super::common::Project;

const KEY: &str = "sk-ant-tape-roles-0123456789-never-stored";
const PLACEHOLDER: &str = "metash-placeholder";

/// A loopback model answering the task's request with its answer and the key it was sent (as a
/// leaky upstream might), anything else with `ok`.
fn echo_model(answer: &'static str) -> ModelServer {
    ModelServer::start(move |c| {
        if !c.text().contains("TAPE-ROLE-TASK") {
            return sse_text("ok");
        }
        let sent = c
            .header("x-api-key")
            .or_else(|| c.header("authorization"))
            .unwrap_or("none");
        sse_text(&format!("{answer} (sent {sent})"))
    })
}

fn host(p: &Project, key: Option<&str>) -> Host {
    let mut o = HostOptions::silent().with_yes_to(["native".parse().expect("capability")]);
    if let Some(key) = key {
        o = o.with_env("METASH_TEST_KEY", key);
    }
    Host::open(p.path(), o).expect("host")
}

/// One turn of role `coder` as task 01's executor, the orchestrator's book saying attempt 2.
fn turn(host: &Host) -> metash_protocol::AgentResponse {
    host.store()
        .update_state(
            "variables.metash.running.01",
            serde_json::json!({"attempt": 2}),
        )
        .expect("book");
    let mut req = SpawnRequest::new("coder", "You are a test.", "TAPE-ROLE-TASK: answer.");
    req.options.timeout_seconds = Some(180.0);
    req.task_id = Some("01".into());
    host.spawn_agent(&req).expect("spawn")
}

/// The project's one tape, checked against what the model got: its metadata, every POST body
/// in order, the log's link, and no key nor placeholder in any byte stored.
fn check_tape(p: &Project, frontend: &str, posts: &[Vec<u8>]) -> Tape {
    let store = Store::open(p.path()).expect("store");
    let tapes = Tapes::new(&store);
    let list = tapes.list().expect("list");
    assert_eq!(list.len(), 1, "{list:?}");
    let tape = tapes.get(&list[0].id).expect("tape");
    assert_eq!(tape.agent, "coder");
    assert_eq!(tape.frontend.as_deref(), Some(frontend));
    assert_eq!((tape.task.as_deref(), tape.attempt), (Some("01"), Some(2)));
    let recorded: Vec<Vec<u8>> = tape
        .exchanges
        .iter()
        .filter(|e| e.method == "POST")
        .map(|e| tapes.blob(&e.request_body.sha256).expect("request blob"))
        .collect();
    assert!(
        recorded == posts,
        "request bodies differ from what was sent"
    );
    let linked = p.log_data("tape");
    assert_eq!(linked.len(), 1, "{linked:?}");
    assert_eq!(linked[0]["id"], tape.id.as_str());
    eprintln!(
        "{frontend}: {} exchanges, {} body bytes stored for the turn",
        tape.exchanges.len(),
        tape.body_bytes()
    );
    no_secret_stored(&tapes);
    tape
}

fn no_secret_stored(tapes: &Tapes<'_>) {
    let files = tapes.all_bytes().expect("tape files");
    assert!(files.len() >= 2, "index and blobs: {files:?}");
    for (path, bytes) in files {
        let text = String::from_utf8_lossy(&bytes);
        for secret in [KEY, PLACEHOLDER] {
            assert!(
                !text.contains(secret),
                "{} holds `{secret}`",
                path.display()
            );
        }
    }
}

fn api_project(base: &str) -> Project {
    let p = Project::new();
    p.config(&format!(
        "[roles.coder]\nfrontend = \"anthropic-api\"\nmodel_smart = \"api-model\"\n\
         base_url = \"{base}\"\napi_key_env = \"METASH_TEST_KEY\"\nmax_tokens = 64\n"
    ));
    p
}

#[test]
fn an_api_role_turn_is_recorded_without_its_key_and_replays_with_no_model() {
    let server = echo_model("the api answer");
    let p = api_project(&server.base);
    let r = turn(&host(&p, Some(KEY)));
    assert_eq!(r.status, AgentStatus::Success, "{r:?}");
    // The real key reached the model (through the proxy), and came back in the answer.
    assert!(
        r.data.contains(&format!("the api answer (sent {KEY})")),
        "{}",
        r.data
    );
    let posts: Vec<Vec<u8>> = server.posts().into_iter().map(|c| c.body).collect();
    assert_eq!(posts.len(), 1);
    let tape = check_tape(&p, "anthropic-api", &posts);
    // Replayed: the role pointed at a port nobody listens on, no key, the proxy answering
    // from the tape.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        format!("http://{}", l.local_addr().expect("addr"))
    };
    p.config(&format!(
        "[roles.coder]\nfrontend = \"anthropic-api\"\nmodel_smart = \"api-model\"\n\
         base_url = \"{dead}\"\napi_key_env = \"METASH_TEST_KEY\"\nmax_tokens = 64\n"
    ));
    let store = Store::open(p.path()).expect("store");
    let cassette = Arc::new(metash_host::tape_cassette(&store, &tape.id).expect("cassette"));
    let replay = host(&p, None);
    replay.replay_from(Arc::clone(&cassette));
    let again = turn(&replay);
    assert!(cassette.finished(), "{:?}", cassette.divergence());
    assert_eq!(again.status, AgentStatus::Success, "{again:?}");
    // The recorded answer, its echoed key masked as the tape holds it.
    assert!(
        again.data.starts_with("the api answer (sent *"),
        "{}",
        again.data
    );
    assert!(!again.data.contains(KEY));
    assert_eq!(server.posts().len(), 1, "the model was asked again");
    // A replay records nothing.
    assert_eq!(Tapes::new(&store).list().expect("list").len(), 1);
}

#[test]
fn an_api_role_with_recording_off_records_nothing() {
    let server = echo_model("unrecorded");
    let p = api_project(&server.base);
    let config = std::fs::read_to_string(p.path().join(".meta/config.toml")).expect("config");
    p.config(&format!("{config}\n[record]\nenabled = false\n"));
    let r = turn(&host(&p, Some(KEY)));
    assert_eq!(r.status, AgentStatus::Success, "{r:?}");
    assert_eq!(server.posts().len(), 1);
    assert!(!p.path().join(".meta/tapes").exists());
}

/// The ACP agent's launcher under `.tools` (scripts/setup), or a skip (a failure under CI).
fn claude_code_acp(test: &str) -> Option<PathBuf> {
    let bin = Path::new(env!("CARGO_MANIFEST_DIR"))
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

#[test]
fn an_acp_agent_turn_is_recorded_without_its_key() {
    let test = "an_acp_agent_turn_is_recorded_without_its_key";
    let Some(bin) = claude_code_acp(test) else {
        return;
    };
    let server = echo_model("the acp answer");
    let p = Project::new();
    p.config(&format!(
        "[roles.coder]\nfrontend = \"acp\"\ncommand = [{:?}]\nmodel_smart = \"claude-sonnet-4-5\"\n\
         base_url = \"{}\"\napi_key_env = \"METASH_TEST_KEY\"\n",
        bin.display().to_string(),
        server.base
    ));
    let r = turn(&host(&p, Some(KEY)));
    assert_eq!(r.status, AgentStatus::Success, "{r:?}");
    assert!(r.data.contains("the acp answer"), "{}", r.data);
    let posts: Vec<Vec<u8>> = server.posts().into_iter().map(|c| c.body).collect();
    assert!(
        posts
            .iter()
            .any(|b| String::from_utf8_lossy(b).contains("TAPE-ROLE-TASK")),
        "the task reached the model"
    );
    check_tape(&p, "acp", &posts);
}
