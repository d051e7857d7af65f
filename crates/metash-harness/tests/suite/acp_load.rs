//! Continuity of an ACP agent's session (seed 003): a scripted ACP agent (Python on stdio) that
//! advertises `loadSession` keeps each session's prompts in a file; its session id comes back
//! as the turn's provider-typed continuation key, and a later turn given that key continues the
//! session with `session/load` (the agent sees the earlier prompt; the history it replays is
//! not reported as the new turn's output). A key the agent does not know, a key of another
//! provider, or an agent that cannot load sessions start a new session instead.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use metash_harness::acp::{self, AcpEvent, AcpHost, AcpOutcome, AcpTurn, End, Subject};
use metash_harness::CancellationToken;
use metash_protocol::{
    HarnessContinuationRef, HarnessFrontend, InteractionMode, IoMode, ProcessInvocationSpec,
    ProviderDomain,
};

/// The agent: `AGENT_LOADS=1` advertises `loadSession`; sessions are files in `AGENT_STORE`
/// holding one prompt a line. Each prompt answers `<new|load> <session> turns=<n>`.
const AGENT: &str = r#"
import json, os, sys
loads = os.environ.get("AGENT_LOADS") == "1"
store = os.environ["AGENT_STORE"]
def send(m):
    sys.stdout.write(json.dumps(m) + "\n"); sys.stdout.flush()
def update(sid, text):
    send({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": sid,
          "update": {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}}}})
mode = None
for line in sys.stdin:
    m = json.loads(line)
    meth, mid, p = m.get("method"), m.get("id"), m.get("params") or {}
    if meth == "initialize":
        send({"jsonrpc": "2.0", "id": mid, "result": {"protocolVersion": 1,
              "agentCapabilities": {"loadSession": loads}}})
    elif meth == "session/new":
        sid = "sess-%d" % len(os.listdir(store))
        open(os.path.join(store, sid), "w").close()
        mode = "new"
        send({"jsonrpc": "2.0", "id": mid, "result": {"sessionId": sid}})
    elif meth == "session/load":
        path = os.path.join(store, p["sessionId"])
        if not loads or not os.path.exists(path):
            send({"jsonrpc": "2.0", "id": mid, "error": {"code": -32603, "message": "Session not found"}})
            continue
        for old in open(path).read().splitlines():
            update(p["sessionId"], "HISTORY " + old)
        mode = "load"
        send({"jsonrpc": "2.0", "id": mid, "result": {}})
    elif meth == "session/prompt":
        sid = p["sessionId"]
        with open(os.path.join(store, sid), "a") as f:
            f.write(p["prompt"][0]["text"] + "\n")
        turns = len(open(os.path.join(store, sid)).read().splitlines())
        update(sid, "%s %s turns=%d" % (mode, sid, turns))
        send({"jsonrpc": "2.0", "id": mid, "result": {"stopReason": "end_turn"}})
"#;

/// Allows everything; no file requests are expected.
struct Host;

impl AcpHost for Host {
    fn permission(&self, _: &Subject) -> bool {
        true
    }
    fn read_text_file(&self, _: &str) -> Result<String, String> {
        Err("no files".into())
    }
    fn write_text_file(&self, _: &str, _: &str) -> Result<(), String> {
        Err("no files".into())
    }
}

/// One turn in `dir` given `continuation`: the outcome and the text events it reported.
async fn turn(
    dir: &Path,
    loads: bool,
    continuation: Option<HarnessContinuationRef>,
) -> (AcpOutcome, Vec<String>) {
    let spec = ProcessInvocationSpec {
        provider: ProviderDomain::Anthropic,
        frontend: HarnessFrontend::AgentSdk,
        argv: vec!["python3".into(), dir.join("agent.py").display().to_string()],
        cwd: dir.display().to_string(),
        env: BTreeMap::from([
            ("AGENT_LOADS".into(), if loads { "1" } else { "0" }.into()),
            (
                "AGENT_STORE".into(),
                dir.join("store").display().to_string(),
            ),
        ]),
        interaction_mode: InteractionMode::Headless,
        io_mode: IoMode::Pipes,
        continuation,
        display_command: None,
    };
    let cancel = CancellationToken::new();
    let mut texts = Vec::new();
    let out = acp::run_turn(
        AcpTurn {
            spec: &spec,
            confiner: None,
            prompt: "a prompt",
            mcp_servers: Vec::new(),
            timeout: Some(Duration::from_secs(30)),
            cancel: &cancel,
            host: Arc::new(Host),
            keep_session: true,
        },
        &mut |e| {
            if let AcpEvent::Text { text } = e {
                texts.push(text);
            }
        },
    )
    .await
    .expect("turn");
    assert_eq!(out.end, End::Stopped(acp::StopReason::EndTurn), "{out:?}");
    (out, texts)
}

fn key(provider: ProviderDomain, key: &str) -> Option<HarnessContinuationRef> {
    Some(HarnessContinuationRef {
        provider,
        key: Some(key.into()),
    })
}

#[tokio::test]
async fn a_later_turn_continues_the_session_through_session_load() {
    if std::process::Command::new("python3")
        .arg("-c")
        .arg("")
        .status()
        .map_or(true, |s| !s.success())
    {
        metash_testkit::skip("acp_load", "python3 is not installed");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().canonicalize().expect("canonical");
    std::fs::write(root.join("agent.py"), AGENT).expect("script");
    std::fs::create_dir(root.join("store")).expect("store");

    // The first turn: a new session, whose id is the continuation key.
    let (first, _) = turn(&root, true, None).await;
    assert_eq!(first.text, "new sess-0 turns=1");
    assert!(!first.resumed);
    assert_eq!(first.fallback, None);
    assert_eq!(first.continuation, key(ProviderDomain::Anthropic, "sess-0"));

    // A later turn with that key: loaded, the earlier prompt is there, the replayed history
    // is not this turn's output.
    let (second, texts) = turn(&root, true, first.continuation.clone()).await;
    assert_eq!(second.text, "load sess-0 turns=2");
    assert_eq!(texts, vec!["load sess-0 turns=2".to_string()]);
    assert!(second.resumed);
    assert_eq!(second.fallback, None);
    assert_eq!(second.continuation, first.continuation);

    // A key the agent does not know: a new session, said so.
    let (lost, _) = turn(&root, true, key(ProviderDomain::Anthropic, "sess-9")).await;
    assert_eq!(lost.text, "new sess-1 turns=1");
    assert!(!lost.resumed);
    let why = lost.fallback.clone().unwrap_or_default();
    assert!(
        why.contains("session/load") && why.contains("Session not found"),
        "{why}"
    );
    assert_eq!(lost.continuation, key(ProviderDomain::Anthropic, "sess-1"));

    // A key of another provider is never used.
    let (other, _) = turn(&root, true, key(ProviderDomain::Openai, "sess-0")).await;
    assert_eq!(other.text, "new sess-2 turns=1");
    assert!(!other.resumed);
    assert!(
        other
            .fallback
            .as_deref()
            .is_some_and(|w| w.contains("openai")),
        "{:?}",
        other.fallback
    );

    // An agent that cannot load sessions: never asked to, and its ids are no continuation key.
    let (cannot, _) = turn(&root, false, first.continuation.clone()).await;
    assert_eq!(cannot.text, "new sess-3 turns=1");
    assert!(!cannot.resumed);
    assert_eq!(
        cannot.fallback.as_deref(),
        Some("the agent does not advertise loadSession")
    );
    assert_eq!(cannot.continuation, None);
    assert_eq!(
        std::fs::read_to_string(root.join("store/sess-0")).expect("sess-0"),
        "a prompt\na prompt\n",
        "sess-0 got exactly the two turns"
    );
}
