//! Issue 36 item 1: each real CLI's turn (Claude Code, Codex, pi) against a loopback model,
//! through the credential proxy, as task 01's attempt 2, is recorded: the tape (naming the task
//! and attempt) holds every request body in order and each streamed response as it was sent, is
//! linked from the log, and no byte under `.meta/tapes/` holds the key or the placeholder. `[record] enabled = false` records nothing.
//! Replay's first step: the tape, as a cassette, answers the same requests again with no
//! upstream; pi run again against it completes its turn with the model never asked, and a changed
//! prompt stops the replay at the first request, with both bodies.

use std::io::{Read, Write};
use std::sync::Arc;

use metash_host::{Host, HostOptions, SpawnRequest, Spawner};
use metash_protocol::AgentStatus;
use metash_runtime::credential::{AuthStyle, Cassette, CredentialProxy, Mount, ProxyConfig, Route};
use metash_store::tape::{Tape, Tapes};
use metash_store::Store;
use metash_testkit::anthropic::ModelServer;
use metash_testkit::cli::Cli;

use super::common::Project;

const KEY: &str = "sk-tape-real-key-0123456789-never-stored";
const PLACEHOLDER: &str = "metash-placeholder";

/// A turn of `cli` that runs one shell command, then answers. Returns the project, what the
/// model server was sent (POST bodies, in order) and what it answered to each.
fn recorded_turn(cli: Cli, tools: &std::path::Path, config: &str) -> (Project, Vec<Vec<u8>>) {
    let (p, posts, _server) = recorded_turn_on(cli, tools, config);
    (p, posts)
}

/// [`recorded_turn`], keeping the model server (to check nothing more reaches it).
fn recorded_turn_on(
    cli: Cli,
    tools: &std::path::Path,
    config: &str,
) -> (Project, Vec<Vec<u8>>, ModelServer) {
    let server = ModelServer::start(move |c| {
        let body = c.text();
        if !body.contains("Record this turn.") {
            return cli.text("ok");
        }
        match cli.results(&body) {
            0 => cli.shell(0, &body, "echo recorded-tool-output"),
            _ => cli.text("the recorded final answer"),
        }
    });
    let p = Project::new();
    std::os::unix::fs::symlink(tools, p.path().join(".tools")).expect("link .tools");
    p.config(&format!("{}{config}", cli.role("coder", &server.base)));
    let host = Host::open(
        p.path(),
        HostOptions::silent()
            .with_env("METASH_TEST_CLI_KEY", KEY)
            .with_yes_to(["native".parse().expect("capability")]),
    )
    .expect("host");
    let r = turn(&host, "Record this turn.");
    assert_eq!(r.status, AgentStatus::Success, "{r:?}");
    assert!(r.data.contains("the recorded final answer"), "{}", r.data);
    let posts = server.posts().into_iter().map(|c| c.body).collect();
    (p, posts, server)
}

fn one_tape(p: &Project) -> Tape {
    let store = Store::open(p.path()).expect("store");
    let tapes = Tapes::new(&store);
    let list = tapes.list().expect("list");
    assert_eq!(list.len(), 1, "{list:?}");
    tapes.get(&list[0].id).expect("tape")
}

fn check(cli: Cli, test: &str) {
    let Some(tools) = super::common::cli_ready(cli, test) else {
        return;
    };
    let (p, posts) = recorded_turn(cli, &tools, "");
    let tape = one_tape(&p);
    assert_eq!(tape.agent, "coder");
    assert_eq!((tape.task.as_deref(), tape.attempt), (Some("01"), Some(2)));
    eprintln!(
        "{}: {} exchanges, {} body bytes stored for the turn",
        cli.name(),
        tape.exchanges.len(),
        tape.body_bytes()
    );
    let store = Store::open(p.path()).expect("store");
    let tapes = Tapes::new(&store);
    // Every POST the model got, in order, with its body as sent.
    let recorded: Vec<Vec<u8>> = tape
        .exchanges
        .iter()
        .filter(|e| e.method == "POST")
        .map(|e| tapes.blob(&e.request_body.sha256).expect("request blob"))
        .collect();
    assert_eq!(recorded.len(), posts.len());
    assert!(
        recorded == posts,
        "request bodies differ from what was sent"
    );
    assert!(posts.len() >= 2, "a tool call and an answer");
    // Each response streamed, whole: the last POST's holds the final answer.
    for e in &tape.exchanges {
        assert_eq!(e.status, 200, "{e:?}");
        let sum: u64 = e.chunks.iter().map(|c| c.1).sum();
        assert_eq!(sum, e.response_body.bytes, "{e:?}");
        assert!(e.chunks.windows(2).all(|w| w[0].0 <= w[1].0), "{e:?}");
    }
    let last = tape
        .exchanges
        .iter()
        .rev()
        .find(|e| e.method == "POST")
        .expect("a POST");
    let answer = tapes.blob(&last.response_body.sha256).expect("response");
    assert!(
        String::from_utf8_lossy(&answer).contains("the recorded final answer"),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    // Linked from the log.
    let linked = p.log_data("tape");
    assert_eq!(linked.len(), 1, "{linked:?}");
    assert_eq!(linked[0]["id"], tape.id.as_str());
    assert_eq!(linked[0]["exchanges"], tape.exchanges.len());
    assert_eq!(
        (linked[0]["task"].as_str(), linked[0]["attempt"].as_u64()),
        (Some("01"), Some(2))
    );
    replays(&p, &tape);
    // No key, no placeholder, in any byte stored.
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

/// A proxy answering from tape `id`, its upstream a port nobody listens on, no credential.
fn replaying(p: &Project, id: &str) -> (CredentialProxy, Arc<Cassette>) {
    let store = Store::open(p.path()).expect("store");
    let cassette = Arc::new(metash_host::tape_cassette(&store, id).expect("cassette"));
    let mut config = ProxyConfig::new(vec![Route {
        id: "model".into(),
        mount: Mount::WholePort,
        upstream: "http://127.0.0.1:9".into(),
        auth: AuthStyle::XApiKey,
    }]);
    config.replay = Some(Arc::clone(&cassette));
    let proxy = CredentialProxy::start(
        config,
        Arc::new(metash_runtime::credential::StaticSource::new()),
        Arc::new(metash_runtime::MemorySink::new()),
    )
    .expect("replay proxy");
    (proxy, cassette)
}

/// Sends `method target` with `body` and returns the answer's status and de-chunked body.
fn send(proxy: &CredentialProxy, method: &str, target: &str, body: &[u8]) -> (u16, Vec<u8>) {
    let mut s = std::net::TcpStream::connect(proxy.addr()).expect("connect");
    let head = format!(
        "{method} {target} HTTP/1.1\r\nhost: {}\r\ncontent-type: application/json\r\n\
         connection: close\r\ncontent-length: {}\r\n\r\n",
        proxy.addr(),
        body.len()
    );
    s.write_all(head.as_bytes()).expect("head");
    s.write_all(body).expect("body");
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).expect("answer");
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a head")
        + 4;
    let head = String::from_utf8_lossy(&raw[..split]).to_ascii_lowercase();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status");
    let mut rest = &raw[split..];
    if !head.contains("transfer-encoding: chunked") {
        return (status, rest.to_vec());
    }
    let mut out = Vec::new();
    while let Some(eol) = rest.windows(2).position(|w| w == b"\r\n") {
        let n = usize::from_str_radix(String::from_utf8_lossy(&rest[..eol]).trim(), 16)
            .expect("chunk size");
        if n == 0 {
            break;
        }
        out.extend_from_slice(&rest[eol + 2..eol + 2 + n]);
        rest = &rest[eol + 4 + n..];
    }
    (status, out)
}

/// Every exchange of the tape, asked again in order, gets its recorded answer.
fn replays(p: &Project, tape: &Tape) {
    let (proxy, cassette) = replaying(p, &tape.id);
    let store = Store::open(p.path()).expect("store");
    let tapes = Tapes::new(&store);
    for e in &tape.exchanges {
        let body = tapes.blob(&e.request_body.sha256).expect("request");
        let (status, answer) = send(&proxy, &e.method, &e.target, &body);
        assert_eq!(status, e.status);
        assert!(
            answer == tapes.blob(&e.response_body.sha256).expect("response"),
            "exchange {} answered differently",
            e.seq
        );
    }
    assert!(cassette.finished(), "{:?}", cassette.divergence());
}

#[test]
fn a_claude_code_turn_is_recorded_without_its_key() {
    check(
        Cli::Claude,
        "a_claude_code_turn_is_recorded_without_its_key",
    );
}

#[test]
fn a_codex_turn_is_recorded_without_its_key() {
    check(Cli::Codex, "a_codex_turn_is_recorded_without_its_key");
}

#[test]
fn a_pi_turn_is_recorded_without_its_key() {
    check(Cli::Pi, "a_pi_turn_is_recorded_without_its_key");
}

#[test]
fn recording_off_records_nothing() {
    let test = "recording_off_records_nothing";
    let Some(tools) = super::common::cli_ready(Cli::Pi, test) else {
        return;
    };
    let (p, posts) = recorded_turn(Cli::Pi, &tools, "\n[record]\nenabled = false\n");
    assert!(!posts.is_empty());
    assert!(!p.path().join(".meta/tapes").exists());
    assert!(p.log_data("tape").is_empty());
}

/// One turn of the role as task `01`'s executor, the orchestrator's book saying attempt 2 runs.
fn turn(host: &Host, message: &str) -> metash_protocol::AgentResponse {
    host.store()
        .update_state(
            "variables.metash.running.01",
            serde_json::json!({"attempt": 2}),
        )
        .expect("book");
    let mut req = SpawnRequest::new("coder", "You are a test.", message);
    req.options.timeout_seconds = Some(300.0);
    req.task_id = Some("01".into());
    host.spawn_agent(&req).expect("spawn")
}

/// Runs the CLI again with `message`, its role's model the replay of its recorded turn (the
/// role's `base_url` is the replay proxy, whose own upstream is a closed port). Returns the
/// turn's answer and the cassette.
fn rerun(cli: Cli, p: &Project, message: &str) -> (metash_protocol::AgentResponse, Arc<Cassette>) {
    let tape = one_tape(p);
    let (proxy, cassette) = replaying(p, &tape.id);
    let url = format!("http://{}", proxy.addr());
    let role: String = cli
        .role("coder", &url)
        .lines()
        .map(|l| {
            if l.starts_with("base_url") {
                format!("base_url = \"{url}\"\n")
            } else {
                format!("{l}\n")
            }
        })
        .collect();
    p.config(&role);
    let host = Host::open(
        p.path(),
        HostOptions::silent()
            .with_env("METASH_TEST_CLI_KEY", KEY)
            .with_yes_to(["native".parse().expect("capability")]),
    )
    .expect("host");
    (turn(&host, message), cassette)
}

#[test]
fn pi_replays_its_recorded_turn_with_no_model() {
    let test = "pi_replays_its_recorded_turn_with_no_model";
    let Some(tools) = super::common::cli_ready(Cli::Pi, test) else {
        return;
    };
    let (p, posts, server) = recorded_turn_on(Cli::Pi, &tools, "");
    let (r, cassette) = rerun(Cli::Pi, &p, "Record this turn.");
    assert!(cassette.finished(), "{:?}", cassette.divergence());
    assert_eq!(cassette.served(), one_tape_count(&p, 0));
    assert_eq!(r.status, AgentStatus::Success, "{r:?}");
    assert!(r.data.contains("the recorded final answer"), "{}", r.data);
    // The tool ran again: its output is in the second turn's log.
    let outputs = p.log_data("tool_result");
    assert_eq!(outputs.len(), 2, "{outputs:?}");
    assert!(outputs[1].to_string().contains("recorded-tool-output"));
    assert_eq!(
        server.posts().len(),
        posts.len(),
        "the model was asked again"
    );
}

#[test]
fn a_changed_prompt_stops_the_replay_at_the_first_request() {
    let test = "a_changed_prompt_stops_the_replay_at_the_first_request";
    let Some(tools) = super::common::cli_ready(Cli::Pi, test) else {
        return;
    };
    let (p, _) = recorded_turn(Cli::Pi, &tools, "");
    let (r, cassette) = rerun(Cli::Pi, &p, "Record this other turn.");
    let d = cassette.divergence().expect("the replay stopped");
    assert_eq!(d.seq, 1);
    assert!(d.reason.contains("the body differs"), "{}", d.reason);
    let got = String::from_utf8_lossy(&d.got.2).into_owned();
    let expected = d
        .expected
        .map(|e| String::from_utf8_lossy(&e.2).into_owned());
    assert!(got.contains("Record this other turn."));
    assert!(expected.is_some_and(|e| e.contains("Record this turn.")));
    assert_ne!(r.status, AgentStatus::Success, "{r:?}");
    assert!(!r.data.contains("the recorded final answer"), "{}", r.data);
}

/// Exchanges of the `n`th tape, oldest first.
fn one_tape_count(p: &Project, n: usize) -> usize {
    let store = Store::open(p.path()).expect("store");
    let tapes = Tapes::new(&store);
    let list = tapes.list().expect("list");
    list[n].exchanges
}
