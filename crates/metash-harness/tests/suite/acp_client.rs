//! metash's ACP client against a tiny scripted ACP agent (Python, speaking ACP on stdio): the
//! updates become metash events (text, one tool call and one result per call, the plan), a
//! permission question is decided by the host (one allowed, one refused, answered with the
//! matching option), the file methods go through the host (a write lands, a read outside is
//! refused), `terminal/*` is refused, and a turn past its deadline gets `session/cancel`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use metash_harness::acp::{self, AcpEvent, AcpHost, AcpTurn, End, Subject, ToolKind, ToolStatus};
use metash_harness::CancellationToken;
use metash_protocol::{
    HarnessFrontend, InteractionMode, IoMode, ProcessInvocationSpec, ProviderDomain,
};

/// The agent: answers `initialize` and `session/new`; its prompt says which script to play.
const AGENT: &str = r#"
import json, os, sys
def send(m):
    sys.stdout.write(json.dumps(m) + "\n"); sys.stdout.flush()
def read():
    line = sys.stdin.readline()
    if not line: sys.exit(0)
    return json.loads(line)
nid = [100]
def call(method, params):
    nid[0] += 1; send({"jsonrpc": "2.0", "id": nid[0], "method": method, "params": params})
    while True:
        m = read()
        if m.get("id") == nid[0] and "method" not in m: return m
def update(sid, u):
    send({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": sid, "update": u}})
OPTS = [{"optionId": "yes-always", "name": "Always", "kind": "allow_always"},
        {"optionId": "yes", "name": "Allow", "kind": "allow_once"},
        {"optionId": "no", "name": "Reject", "kind": "reject_once"}]
cwd = None
while True:
    m = read()
    meth, mid, p = m.get("method"), m.get("id"), m.get("params") or {}
    if meth == "initialize":
        caps = p["clientCapabilities"]
        send({"jsonrpc": "2.0", "id": mid, "result": {"protocolVersion": 1,
              "agentCapabilities": {"loadSession": False}, "echo": caps}})
    elif meth == "session/new":
        cwd = p["cwd"]
        send({"jsonrpc": "2.0", "id": mid, "result": {"sessionId": "sess-1"}})
    elif meth == "session/prompt":
        sid = p["sessionId"]; text = p["prompt"][0]["text"]
        if text == "hang":
            update(sid, {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "waiting"}})
            while True:
                c = read()
                if c.get("method") == "session/cancel":
                    open(os.path.join(cwd, "cancel-seen"), "w").write(c["params"]["sessionId"])
                    send({"jsonrpc": "2.0", "id": mid, "result": {"stopReason": "cancelled"}})
                    break
            continue
        notes = []
        update(sid, {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "hello "}})
        update(sid, {"sessionUpdate": "plan", "entries": [
            {"content": "write a.txt", "priority": "high", "status": "in_progress"},
            {"content": "clean up", "priority": "low", "status": "pending"}]})
        update(sid, {"sessionUpdate": "tool_call", "toolCallId": "t1", "title": "Write a.txt",
                     "kind": "edit", "status": "pending", "rawInput": {"file_path": cwd + "/a.txt"}})
        r = call("session/request_permission", {"sessionId": sid,
                 "toolCall": {"toolCallId": "t1"}, "options": OPTS})
        o = r["result"]["outcome"]; notes.append("p1=" + o.get("optionId", o["outcome"]))
        if o.get("optionId") == "yes":
            w = call("fs/write_text_file", {"sessionId": sid, "path": cwd + "/a.txt", "content": "written by the agent\n"})
            notes.append("write=" + ("ok" if "result" in w else "error"))
        update(sid, {"sessionUpdate": "tool_call_update", "toolCallId": "t1", "status": "in_progress"})
        update(sid, {"sessionUpdate": "tool_call_update", "toolCallId": "t1", "status": "completed",
                     "content": [{"type": "content", "content": {"type": "text", "text": "wrote a.txt"}}]})
        update(sid, {"sessionUpdate": "tool_call", "toolCallId": "t2", "title": "rm -rf ~",
                     "status": "pending", "rawInput": {"command": "rm -rf ~"}})
        r = call("session/request_permission", {"sessionId": sid,
                 "toolCall": {"toolCallId": "t2"}, "options": OPTS})
        o = r["result"]["outcome"]; notes.append("p2=" + o.get("optionId", o["outcome"]))
        update(sid, {"sessionUpdate": "tool_call_update", "toolCallId": "t2", "status": "failed"})
        r = call("fs/read_text_file", {"sessionId": sid, "path": "/etc/hostname"})
        notes.append("outside=" + ("error" if "error" in r else "read"))
        r = call("fs/read_text_file", {"sessionId": sid, "path": cwd + "/a.txt", "line": 1, "limit": 1})
        notes.append("inside=" + r.get("result", {}).get("content", "error").strip())
        r = call("terminal/create", {"sessionId": sid, "command": "sh"})
        notes.append("terminal=" + str(r.get("error", {}).get("code")))
        r = call("fs/read_text_file", {"sessionId": "someone-else", "path": cwd + "/a.txt"})
        notes.append("other_session=" + ("error" if "error" in r else "read"))
        update(sid, {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": " ".join(notes)}})
        send({"jsonrpc": "2.0", "id": mid, "result": {"stopReason": "end_turn"}})
"#;

/// Allows edits, refuses everything else; reads and writes only under `root`.
struct TestHost {
    root: PathBuf,
    asked: Mutex<Vec<Subject>>,
}

impl TestHost {
    fn inside(&self, path: &str) -> Result<PathBuf, String> {
        let p = Path::new(path);
        if p.starts_with(&self.root) && !path.contains("..") {
            Ok(p.to_path_buf())
        } else {
            Err(format!("{path} is outside the worktree"))
        }
    }
}

impl AcpHost for TestHost {
    fn permission(&self, subject: &Subject) -> bool {
        self.asked.lock().expect("lock").push(subject.clone());
        subject.kind == ToolKind::Edit
    }

    fn read_text_file(&self, path: &str) -> Result<String, String> {
        std::fs::read_to_string(self.inside(path)?).map_err(|e| e.to_string())
    }

    fn write_text_file(&self, path: &str, content: &str) -> Result<(), String> {
        std::fs::write(self.inside(path)?, content).map_err(|e| e.to_string())
    }
}

fn spec(dir: &Path, script: &Path) -> ProcessInvocationSpec {
    ProcessInvocationSpec {
        provider: ProviderDomain::Anthropic,
        frontend: HarnessFrontend::AgentSdk,
        argv: vec!["python3".into(), script.display().to_string()],
        cwd: dir.display().to_string(),
        env: BTreeMap::new(),
        interaction_mode: InteractionMode::Headless,
        io_mode: IoMode::Pipes,
        continuation: None,
        display_command: None,
    }
}

fn setup() -> Option<(tempfile::TempDir, PathBuf, Arc<TestHost>)> {
    if std::process::Command::new("python3")
        .arg("-c")
        .arg("")
        .status()
        .map_or(true, |s| !s.success())
    {
        metash_testkit::skip("acp_client", "python3 is not installed");
        return None;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().canonicalize().expect("canonical");
    let script = root.join("agent.py");
    std::fs::write(&script, AGENT).expect("script");
    let host = Arc::new(TestHost {
        root: root.clone(),
        asked: Mutex::default(),
    });
    Some((dir, root, host))
}

#[tokio::test]
async fn updates_become_events_and_requests_go_to_the_host() {
    let Some((_dir, root, host)) = setup() else {
        return;
    };
    let script = root.join("agent.py");
    let s = spec(&root, &script);
    let cancel = CancellationToken::new();
    let mut events = Vec::new();
    let out = acp::run_turn(
        AcpTurn {
            spec: &s,
            confiner: None,
            prompt: "work",
            mcp_servers: Vec::new(),
            timeout: Some(Duration::from_secs(30)),
            cancel: &cancel,
            host: host.clone(),
            keep_session: false,
        },
        &mut |e| events.push(e),
    )
    .await
    .expect("turn");
    assert_eq!(out.end, End::Stopped(acp::StopReason::EndTurn), "{out:?}");
    assert_eq!(out.session_id.as_deref(), Some("sess-1"));
    // Edit allowed with the once option (never "always": metash's grants decide the next
    // use), the command refused, the write landed, the read outside refused.
    assert!(
        out.text
            .contains("p1=yes write=ok p2=no outside=error inside=written by the agent"),
        "{}",
        out.text
    );
    assert!(out.text.contains("terminal=-32601"), "{}", out.text);
    assert!(out.text.contains("other_session=error"), "{}", out.text);
    assert_eq!(
        std::fs::read_to_string(root.join("a.txt")).expect("a.txt"),
        "written by the agent\n"
    );
    let asked = host.asked.lock().expect("lock").clone();
    assert_eq!(asked.len(), 2, "{asked:?}");
    assert_eq!(asked[0].kind, ToolKind::Edit);
    assert_eq!(asked[0].title, "Write a.txt");
    // The second call named no kind: inferred from its input.
    assert_eq!(asked[1].kind, ToolKind::Execute);
    assert_eq!(asked[1].command.as_deref(), Some("rm -rf ~"));

    let calls: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            AcpEvent::ToolCall { id, kind, .. } => Some((id.clone(), *kind)),
            _ => None,
        })
        .collect();
    assert_eq!(
        calls,
        vec![
            ("t1".into(), ToolKind::Edit),
            ("t2".into(), ToolKind::Execute)
        ]
    );
    let results: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            AcpEvent::ToolResult {
                id, status, output, ..
            } => Some((id.clone(), *status, output.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(
        results,
        vec![
            ("t1".into(), ToolStatus::Completed, "wrote a.txt".into()),
            ("t2".into(), ToolStatus::Failed, String::new()),
        ]
    );
    let perms: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            AcpEvent::Permission {
                allowed, option_id, ..
            } => Some((*allowed, option_id.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(
        perms,
        vec![(true, Some("yes".into())), (false, Some("no".into()))]
    );
    assert!(events.iter().any(
        |e| matches!(e, AcpEvent::Plan { entries } if entries.len() == 2 && entries[0].content == "write a.txt")
    ));
    assert!(matches!(
        events.last(),
        Some(AcpEvent::Stopped {
            reason: acp::StopReason::EndTurn
        })
    ));
}

#[tokio::test]
async fn a_turn_past_its_deadline_is_cancelled_with_session_cancel() {
    let Some((_dir, root, host)) = setup() else {
        return;
    };
    let script = root.join("agent.py");
    let s = spec(&root, &script);
    let cancel = CancellationToken::new();
    let started = std::time::Instant::now();
    let mut events = Vec::new();
    let out = acp::run_turn(
        AcpTurn {
            spec: &s,
            confiner: None,
            prompt: "hang",
            mcp_servers: Vec::new(),
            // Long enough for python3 to start and the prompt to arrive on a busy machine (a
            // deadline before it would have no turn to cancel), short of the bound below.
            timeout: Some(Duration::from_secs(5)),
            cancel: &cancel,
            host,
            keep_session: false,
        },
        &mut |e| events.push(e),
    )
    .await
    .expect("turn");
    assert_eq!(out.end, End::TimedOut, "{out:?}");
    assert_eq!(out.text, "waiting");
    // The agent saw the cancel for its session (it writes the marker only then).
    assert_eq!(
        std::fs::read_to_string(root.join("cancel-seen")).expect("the agent got session/cancel"),
        "sess-1"
    );
    // It answered the prompt as ACP asks: stop reason `cancelled`.
    assert!(matches!(
        events.last(),
        Some(AcpEvent::Stopped {
            reason: acp::StopReason::Cancelled
        })
    ));
    // The deadline, not the agent, ended the turn (it would wait for a cancel forever).
    let took = started.elapsed();
    assert!(
        (Duration::from_secs(5)..Duration::from_secs(30)).contains(&took),
        "{took:?}"
    );
}

#[tokio::test]
async fn the_callers_cancel_stops_the_turn_the_same_way() {
    let Some((_dir, root, host)) = setup() else {
        return;
    };
    let script = root.join("agent.py");
    let s = spec(&root, &script);
    let cancel = CancellationToken::new();
    let c = cancel.clone();
    let out = acp::run_turn(
        AcpTurn {
            spec: &s,
            confiner: None,
            prompt: "hang",
            mcp_servers: Vec::new(),
            timeout: Some(Duration::from_secs(60)),
            cancel: &cancel,
            host,
            keep_session: false,
        },
        // Cancelled once the agent is in its turn (it says "waiting"), not after a guess at
        // how long python3 takes to get there: before the prompt there is nothing to cancel.
        &mut |e| {
            if matches!(&e, AcpEvent::Text { text } if text == "waiting") {
                c.cancel();
            }
        },
    )
    .await
    .expect("turn");
    assert_eq!(out.end, End::Cancelled, "{out:?}");
    assert!(root.join("cancel-seen").exists());
}

#[tokio::test]
async fn a_missing_agent_is_program_not_found() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut s = spec(dir.path(), Path::new("/nonexistent"));
    s.argv = vec!["/nonexistent/metash-acp-agent".into()];
    let host = Arc::new(TestHost {
        root: dir.path().to_path_buf(),
        asked: Mutex::default(),
    });
    let cancel = CancellationToken::new();
    let err = acp::run_turn(
        AcpTurn {
            spec: &s,
            confiner: None,
            prompt: "x",
            mcp_servers: Vec::new(),
            timeout: Some(Duration::from_secs(5)),
            cancel: &cancel,
            host,
            keep_session: false,
        },
        &mut |_| {},
    )
    .await
    .err();
    assert_eq!(
        err.map(|e| e.code()),
        Some(metash_protocol::HarnessErrorCode::ProgramNotFound)
    );
}
