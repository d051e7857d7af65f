//! Issue 14 items 4 and 5: an agent cannot speak for the host in the audit trail, and each event
//! an agent emits is one line of the log.

use metash_host::{SpawnRequest, Spawner};
use metash_policy::ledger::{self, Filter};
use metash_policy::{CapabilityRequest, Decision, Policy};
use metash_protocol::AgentStatus;

use super::common::{msg, native_agent_exe, native_unavailable, wat_agent, Project};

const VIOLATION: &str = "protocol_violation";

fn store(p: &Project) -> metash_store::Store {
    metash_store::Store::open(p.path()).expect("open store")
}

/// The capability is still denied, as metash's own policy sees it.
fn assert_still_denied(p: &Project, agent: &str, cap: &str) {
    let dirs = metash_policy::AgentDirs::new(p.path(), None);
    let policy = Policy::new(store(p), metash_policy::Registry::discover(&dirs));
    let req = CapabilityRequest::parse(cap, "the test checks").expect("capability");
    let decision = policy.check(agent, &req).expect("check");
    assert!(
        !matches!(decision, Decision::Allow { .. }),
        "{cap} must stay denied after the agent claimed it: {decision:?}"
    );
}

/// What the ledger shows for the agent: a violation, never a grant or a revocation.
fn assert_ledger_shows_violation(p: &Project, agent: &str, claimed: &[&str]) {
    let filter = Filter {
        agent: Some(agent.into()),
        ..Filter::default()
    };
    let recs = ledger::records(&store(p), &filter).expect("ledger");
    let kinds: Vec<&str> = recs.iter().map(|r| r.kind.as_str()).collect();
    assert!(
        !kinds.contains(&"consent_grant"),
        "ledger shows a grant: {kinds:?}"
    );
    assert!(
        !kinds.contains(&"consent_revoke"),
        "ledger shows a revocation: {kinds:?}"
    );
    let violations: Vec<String> = recs
        .iter()
        .filter(|r| r.kind == VIOLATION)
        .map(ledger::summary)
        .collect();
    assert_eq!(violations.len(), claimed.len(), "{violations:?}");
    for (line, ty) in violations.iter().zip(claimed) {
        assert!(line.starts_with("VIOLATION"), "{line}");
        assert!(line.contains(&format!("`{ty}`")), "{line}");
    }
    // A capability filter does not find the claim as if it were about that capability.
    let by_cap = Filter {
        capability: Some("network".parse().expect("capability")),
        ..Filter::default()
    };
    let claims = ledger::records(&store(p), &by_cap).expect("ledger");
    assert!(
        claims.iter().all(|r| r.kind != "consent_grant"),
        "{claims:?}"
    );
}

#[test]
fn wasm_agent_claiming_a_grant_is_a_violation() {
    let p = Project::new();
    let lines = [
        msg(
            r#"{"type":"consent_grant","capability":"network:*","expires_at":"2099-01-01T00:00:00Z"}"#,
        ),
        msg(r#"{"type":"consent_revoke","capability":"files.read"}"#),
        msg(
            r#"{"type":"output","agent_id":"w","chunk_id":"c1","content_type":"text/plain","data":"after"}"#,
        ),
        msg(r#"{"type":"done"}"#),
    ];
    let refs: Vec<&str> = lines.iter().map(String::as_str).collect();
    let wat = p.path().join("claim.wat");
    std::fs::write(&wat, wat_agent(&refs, false)).expect("write wat");
    p.agent("w", "wasm", &wat, &["network"]);
    let host = p.host(&[]);
    let r = host
        .spawn_agent(&SpawnRequest::new("w", "", "go"))
        .expect("spawn");
    // The run goes on: the violation is refused, not fatal.
    assert_eq!(r.status, AgentStatus::Success, "{r:?}");
    assert_eq!(r.data, "after");
    let v = p.log_data(VIOLATION);
    assert_eq!(v.len(), 2, "{v:?}");
    assert_eq!(v[0]["code"], "host_only_event");
    assert_eq!(v[0]["type"], "consent_grant");
    assert_eq!(v[0]["event"]["capability"], "network:*");
    assert_eq!(v[1]["type"], "consent_revoke");
    assert_ledger_shows_violation(&p, "w", &["consent_grant", "consent_revoke"]);
    assert_still_denied(&p, "w", "network:example.com");
    store(&p).log().verify().expect("the log's chain is intact");
}

#[test]
fn native_agent_is_told_why_its_grant_was_refused() {
    if let Some(why) = native_unavailable() {
        metash_testkit::skip("native_agent_is_told_why_its_grant_was_refused", &why);
        return;
    }
    let p = Project::new();
    p.agent("n", "native", &native_agent_exe(), &["network"]);
    let host = p.host(&["native"]);
    let r = host
        .spawn_agent(&SpawnRequest::new("n", "", "claim network:*"))
        .expect("spawn");
    assert_eq!(r.status, AgentStatus::Success, "{r:?}");
    assert!(
        r.data.starts_with("error host_only_event ") && r.data.contains("consent_request"),
        "the agent's error event must name the violation and say what to do: {}",
        r.data
    );
    assert_eq!(p.log_data(VIOLATION).len(), 1);
    assert_ledger_shows_violation(&p, "n", &["consent_grant"]);
    assert_still_denied(&p, "n", "network:example.com");
}

/// N agent events are N lines; everything else in the log is metash's own, and named here.
#[test]
fn one_agent_event_is_one_log_line() {
    let p = Project::new();
    let out = |i: usize| {
        msg(&format!(
            r#"{{"type":"output","agent_id":"w","chunk_id":"c{i}","content_type":"text/plain","data":"{i}"}}"#
        ))
    };
    let mut lines: Vec<String> = (0..6).map(out).collect();
    lines.push(msg(
        r#"{"type":"error","code":"warn","message":"not fatal"}"#,
    ));
    lines.push(msg(r#"{"type":"done"}"#));
    let refs: Vec<&str> = lines.iter().map(String::as_str).collect();
    let wat = p.path().join("many.wat");
    std::fs::write(&wat, wat_agent(&refs, false)).expect("write wat");
    p.agent("w", "wasm", &wat, &[]);
    let host = p.host(&[]);
    let before = p.log_kinds().len();
    let r = host
        .spawn_agent(&SpawnRequest::new("w", "", "go"))
        .expect("spawn");
    assert_eq!(r.status, AgentStatus::Success, "{r:?}");
    let kinds = p.log_kinds()[before..].to_vec();
    let agent_lines = kinds.iter().filter(|k| *k == "agent_event").count();
    assert_eq!(agent_lines, lines.len(), "{kinds:?}");
    let own: Vec<&str> = kinds
        .iter()
        .map(String::as_str)
        .filter(|k| *k != "agent_event")
        .collect();
    assert_eq!(
        own,
        [
            "agent_registered",
            "spawn",
            "agent_instance_registered",
            "agent_started",
            "agent_active",
            "agent_invoked",
            "agent_invocation_end",
            "agent_terminated",
            "spawn_end",
        ],
        "metash's own events around the agent's: {kinds:?}"
    );
    // And the agent's lines sit, in one run, between the invocation's start and end.
    let first = kinds.iter().position(|k| k == "agent_event").unwrap_or(0);
    assert_eq!(kinds[first - 1], "agent_invoked", "{kinds:?}");
    assert_eq!(
        kinds[first + lines.len()],
        "agent_invocation_end",
        "{kinds:?}"
    );
}
