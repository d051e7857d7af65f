//! Default deny, consent grants, expiry, revocation, sensitive actions, prompters.

use std::io::Cursor;
use std::path::Path;

use metash_policy::{
    Answer, Authorization, CapabilityRequest, ConsentPrompter, Decision, DenyAll, DenyCode,
    NonInteractive, Policy, PolicyFile, Registry, Sensitive, TerminalPrompter,
};
use metash_protocol::AgentEvent;

use super::common::{manifest_with, Counting, Project};

fn project_with(
    caps: &[&str],
    sandbox: &str,
) -> (Project, Policy, std::sync::Arc<metash_policy::ManualClock>) {
    let p = Project::new();
    p.add_agent("a", &manifest_with(caps, sandbox));
    let (policy, clock) = p.policy();
    (p, policy, clock)
}

fn req(c: &str) -> CapabilityRequest {
    CapabilityRequest::parse(c, "test").unwrap()
}

fn cap(c: &str) -> metash_policy::Capability {
    c.parse().unwrap()
}

#[test]
fn undeclared_capability_is_refused_without_a_prompt() {
    let (p, policy, _) = project_with(&["files.read"], "wasm");
    let mut prompter = Counting::new(Answer::AllowOnce);
    let auth = policy
        .authorize("a", &req("network:api.github.com"), &mut prompter)
        .unwrap();
    assert_eq!(
        prompter.calls, 0,
        "the prompter must never be asked about an undeclared capability"
    );
    let Authorization::Denied { code, event, .. } = auth else {
        panic!("allowed")
    };
    assert_eq!(code, DenyCode::CapabilityUndeclared);
    let AgentEvent::Error { code, hint, .. } = event else {
        panic!("{event:?}")
    };
    assert_eq!(code, "capability_undeclared");
    assert!(hint.unwrap_or_default().contains("manifest.toml"));
    assert!(!p.kinds().contains(&"consent_request".to_string()));
    assert_eq!(p.kinds().last().map(String::as_str), Some("error"));
    // Nor can it be granted: consent does not widen the manifest.
    assert!(policy
        .grant("a", &cap("network"), 60, false, "test")
        .is_err());
    // A scoped declaration does not cover other scopes.
    let (_p, policy, _) = project_with(&["network:api.github.com"], "wasm");
    let d = policy.check("a", &req("network:evil.com")).unwrap();
    assert!(
        matches!(
            d,
            Decision::Deny {
                code: DenyCode::CapabilityUndeclared,
                ..
            }
        ),
        "{d:?}"
    );
}

#[test]
fn unknown_agent_is_refused() {
    let (_p, policy, _) = project_with(&["files.read"], "wasm");
    let d = policy.check("nobody", &req("files.read")).unwrap();
    assert!(matches!(
        d,
        Decision::Deny {
            code: DenyCode::UnknownAgent,
            ..
        }
    ));
}

#[test]
fn declared_but_not_granted_asks_and_no_one_to_ask_means_deny() {
    let (p, policy, _) = project_with(&["files.read"], "wasm");
    assert_eq!(
        policy.check("a", &req("files.read:src")).unwrap(),
        Decision::Ask
    );
    let auth = policy
        .authorize("a", &req("files.read:src"), &mut DenyAll)
        .unwrap();
    assert!(matches!(
        auth,
        Authorization::Denied {
            code: DenyCode::ConsentDenied,
            ..
        }
    ));
    let k = p.kinds();
    assert_eq!(
        &k[k.len() - 3..],
        ["consent_request", "consent_answer", "error"]
    );
}

#[test]
fn a_grant_that_expires_mid_test_is_no_longer_honoured() {
    let (_p, policy, clock) = project_with(&["network"], "wasm");
    let g = policy
        .grant("a", &cap("network:api.github.com"), 60, false, "test")
        .unwrap();
    assert_eq!(g.duration_s, 60);
    assert!(
        g.expires_at.starts_with("2026-01-01T00:01:00"),
        "{}",
        g.expires_at
    );
    let r = req("network:api.github.com");
    assert!(policy.check("a", &r).unwrap().is_allow());
    clock.advance(chrono::Duration::seconds(59));
    assert!(policy.check("a", &r).unwrap().is_allow());
    clock.advance(chrono::Duration::seconds(1));
    assert_eq!(
        policy.check("a", &r).unwrap(),
        Decision::Ask,
        "expired at exactly expires_at"
    );
    let mut prompter = Counting::new(Answer::Deny);
    assert!(!policy
        .authorize("a", &r, &mut prompter)
        .unwrap()
        .is_allowed());
    assert_eq!(prompter.calls, 1);
}

#[test]
fn a_grant_expires_on_the_real_clock_too() {
    let p = Project::new();
    p.add_agent("a", &manifest_with(&["memory"], "wasm"));
    let policy = Policy::new(p.store(), Registry::discover(&p.dirs()));
    policy.grant("a", &cap("memory"), 1, false, "test").unwrap();
    assert!(policy.check("a", &req("memory")).unwrap().is_allow());
    std::thread::sleep(std::time::Duration::from_millis(1100));
    assert_eq!(policy.check("a", &req("memory")).unwrap(), Decision::Ask);
}

#[test]
fn a_revoke_by_another_handle_takes_effect_at_once_with_a_clear_error() {
    let (p, policy, _) = project_with(&["network"], "wasm");
    policy
        .grant("a", &cap("network:api.github.com"), 3600, false, "test")
        .unwrap();
    let r = req("network:api.github.com");
    assert!(policy.check("a", &r).unwrap().is_allow());
    // Another handle on the same store, as another process would have.
    let (other, _) = p.policy();
    let revoked = other.revoke("a", &cap("network"), "test").unwrap();
    assert_eq!(revoked.len(), 1);
    let mut prompter = Counting::new(Answer::AllowOnce);
    let auth = policy.authorize("a", &r, &mut prompter).unwrap();
    assert_eq!(prompter.calls, 0, "a revocation is not re-asked");
    let Authorization::Denied {
        code: DenyCode::ConsentRevoked,
        event:
            AgentEvent::Error {
                code,
                message,
                hint,
            },
        ..
    } = auth
    else {
        panic!("{auth:?}")
    };
    assert_eq!(code, "consent_revoked");
    assert!(message.contains("revoked"), "{message}");
    assert!(hint
        .unwrap_or_default()
        .contains("metash consent grant a network:api.github.com"));
    // Granting again lifts it.
    policy
        .grant("a", &cap("network"), 60, false, "test")
        .unwrap();
    assert!(policy.check("a", &r).unwrap().is_allow());
}

#[test]
fn sensitive_actions_ask_every_time_unless_a_grant_covers_sensitive_use() {
    let (_p, policy, _) = project_with(&["network", "process.spawn", "files.write"], "native");
    policy
        .grant("a", &cap("network"), 3600, false, "test")
        .unwrap();
    let write = CapabilityRequest::network("api.github.com", true, "push");
    assert_eq!(write.sensitive, Some(Sensitive::NetworkWrite));
    assert!(policy
        .check(
            "a",
            &CapabilityRequest::network("api.github.com", false, "get")
        )
        .unwrap()
        .is_allow());
    assert_eq!(policy.check("a", &write).unwrap(), Decision::Ask);
    let mut once = Counting::new(Answer::AllowOnce);
    assert!(policy
        .authorize("a", &write, &mut once)
        .unwrap()
        .is_allowed());
    assert!(policy
        .authorize("a", &write, &mut once)
        .unwrap()
        .is_allowed());
    assert_eq!(once.calls, 2, "asked per action");
    assert_eq!(
        once.last.as_ref().unwrap().sensitive,
        Some(Sensitive::NetworkWrite)
    );
    // Process starts and native execution are sensitive by construction.
    assert_eq!(
        CapabilityRequest::process_spawn("git", "x").sensitive,
        Some(Sensitive::ProcessSpawn)
    );
    let native = CapabilityRequest::native_exec("run");
    assert_eq!(policy.check("a", &native).unwrap(), Decision::Ask);
    // "allow for N seconds" on a sensitive ask stops the asking for N seconds.
    let mut for_a_while = Counting::new(Answer::AllowFor(30));
    assert!(policy
        .authorize("a", &native, &mut for_a_while)
        .unwrap()
        .is_allowed());
    assert!(policy
        .authorize("a", &native, &mut for_a_while)
        .unwrap()
        .is_allowed());
    assert_eq!(for_a_while.calls, 1);
}

#[test]
fn writes_outside_the_workspace_are_sensitive() {
    let ws = Path::new("/proj");
    let inside = CapabilityRequest::files_write(ws, Path::new("/proj/docs/a.md"), "x");
    assert_eq!(inside.sensitive, None);
    assert_eq!(inside.capability.to_string(), "files.write:docs/a.md");
    let outside = CapabilityRequest::files_write(ws, Path::new("/etc/passwd"), "x");
    assert_eq!(outside.sensitive, Some(Sensitive::WriteOutsideWorkspace));
    assert_eq!(outside.capability.to_string(), "files.write:/etc/passwd");
    let root = CapabilityRequest::files_write(ws, Path::new("/proj"), "x");
    assert_eq!(root.capability.to_string(), "files.write");
    let rel = CapabilityRequest::files_read(ws, Path::new("src/lib.rs"), "x");
    assert_eq!(rel.capability.to_string(), "files.read:src/lib.rs");
    assert_eq!(rel.sensitive, None);
    assert!("files.read:src"
        .parse::<metash_policy::Capability>()
        .unwrap()
        .covers(&rel.capability));
}

#[test]
fn allow_once_is_not_remembered_and_allow_for_is() {
    let (p, policy, clock) = project_with(&["codegen"], "wasm");
    let r = req("codegen");
    let mut once = Counting::new(Answer::AllowOnce);
    assert!(policy.authorize("a", &r, &mut once).unwrap().is_allowed());
    assert_eq!(policy.check("a", &r).unwrap(), Decision::Ask);
    let mut later = Counting::new(Answer::AllowFor(10));
    assert!(policy.authorize("a", &r, &mut later).unwrap().is_allowed());
    assert!(policy.check("a", &r).unwrap().is_allow());
    clock.advance(chrono::Duration::seconds(11));
    assert_eq!(policy.check("a", &r).unwrap(), Decision::Ask);
    let k = p.kinds();
    assert!(
        k.ends_with(&[
            "consent_request".into(),
            "consent_answer".into(),
            "consent_grant".into()
        ]),
        "{k:?}"
    );
}

#[test]
fn terminal_prompter_reads_answers_from_its_reader() {
    let q = metash_policy::ConsentQuestion {
        agent: "a".into(),
        agent_name: "Agent A".into(),
        capability: cap("network:api.github.com"),
        reason: "fetch issues".into(),
        sensitive: None,
        duration_s: Some(120),
    };
    let ask = |input: &str| {
        let mut t = TerminalPrompter::new(Cursor::new(input.as_bytes().to_vec()), Vec::new());
        let a = t.ask(&q);
        (a, String::from_utf8(t.into_inner().1).unwrap())
    };
    let (a, out) = ask("o\n");
    assert_eq!(a, Answer::AllowOnce);
    assert!(
        out.contains(
            "Agent A (a) asks for `network:api.github.com` (120 s suggested)\n  reason (the \
             agent's words): fetch issues"
        ),
        "{out}"
    );
    assert!(out.contains("[s 120]"), "{out}");
    assert_eq!(ask("s 30\n").0, Answer::AllowFor(30));
    assert_eq!(ask("d\n").0, Answer::Deny);
    assert_eq!(
        ask("").0,
        Answer::Deny,
        "end of input is a deny, not a hang"
    );
    let (a, out) = ask("what\nhuh\n?\no\n");
    assert_eq!(a, Answer::Deny, "three unreadable answers are a deny");
    assert_eq!(out.matches("answer `o`").count(), 3);
    assert_eq!(ask("maybe\n30\n").0, Answer::AllowFor(30));
}

#[test]
fn non_interactive_policy_file_and_yes_to() {
    let (_p, policy, _) = project_with(&["network", "files.read", "process.spawn"], "wasm");
    let file = PolicyFile::parse(
        Path::new("ci-policy.toml"),
        r#"schema_version = "0.1"

[[allow]]
agent = "*"
capability = "files.read"
duration_s = 60

[[allow]]
agent = "a"
capability = "process.spawn:git"
sensitive = true

[[deny]]
agent = "*"
capability = "network:*.evil.com"
"#,
    )
    .unwrap();
    let mut ni = NonInteractive::new(Some(file), vec![cap("network")]);
    assert!(policy
        .authorize("a", &req("files.read:src"), &mut ni)
        .unwrap()
        .is_allowed());
    assert!(
        policy
            .check("a", &req("files.read:src"))
            .unwrap()
            .is_allow(),
        "duration_s records a grant"
    );
    assert!(policy
        .authorize("a", &CapabilityRequest::process_spawn("git", "x"), &mut ni)
        .unwrap()
        .is_allowed());
    assert!(!policy
        .authorize("a", &CapabilityRequest::process_spawn("curl", "x"), &mut ni)
        .unwrap()
        .is_allowed());
    assert!(
        policy
            .authorize("a", &req("network:api.github.com"), &mut ni)
            .unwrap()
            .is_allowed(),
        "--yes-to"
    );
    assert!(
        !policy
            .authorize("a", &req("network:x.evil.com"), &mut ni)
            .unwrap()
            .is_allowed(),
        "deny wins over --yes-to"
    );
    // Nothing configured: deny.
    let mut none = NonInteractive::default();
    assert!(!policy
        .authorize("a", &req("network:api.github.com"), &mut none)
        .unwrap()
        .is_allowed());
}

#[test]
fn policy_file_errors_are_located() {
    let e = PolicyFile::parse(
        Path::new("p.toml"),
        "schema_version = \"0.1\"\n[[allow]]\nagent = \"*\"\ncapability = \"netwrk\"\n",
    )
    .unwrap_err()
    .to_string();
    assert!(e.starts_with("p.toml: 4:14:"), "{e}");
    assert!(e.contains("netwrk"), "{e}");
    let e = PolicyFile::parse(Path::new("p.toml"), "schema_version = \"9\"\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("unsupported schema_version \"9\""), "{e}");
}

#[test]
fn consent_list_shows_grants_and_tombstones() {
    let (_p, policy, clock) = project_with(&["network", "memory"], "wasm");
    policy
        .grant("a", &cap("memory"), 10, false, "test")
        .unwrap();
    policy
        .grant("a", &cap("network"), 100, false, "test")
        .unwrap();
    policy.revoke("a", &cap("network"), "test").unwrap();
    clock.advance(chrono::Duration::seconds(20));
    let grants = policy.grants().unwrap();
    assert_eq!(grants.len(), 2);
    assert!(grants.iter().all(|(_, live)| !live));
    assert!(grants.iter().any(|(g, _)| g.revoked_at.is_some()));
}

#[test]
fn agent_consent_requests_map_to_requests_and_answers_to_events() {
    let (_p, policy, _) = project_with(&["network"], "wasm");
    let ev = AgentEvent::ConsentRequest {
        capability: "network:api.github.com".into(),
        reason: "fetch".into(),
        duration_s: Some(90),
    };
    let r = CapabilityRequest::from_agent_event(&ev).unwrap().unwrap();
    assert_eq!(r.duration_s, Some(90));
    let mut p = Counting::new(Answer::AllowFor(90));
    let auth = policy.authorize("a", &r, &mut p).unwrap();
    assert_eq!(p.last.unwrap().duration_s, Some(90));
    let AgentEvent::ConsentGrant {
        capability,
        expires_at,
    } = auth.to_event(&r.capability)
    else {
        panic!()
    };
    assert_eq!(capability, "network:api.github.com");
    assert!(expires_at.unwrap().starts_with("2026-01-01T00:01:30"));
    let bad = AgentEvent::ConsentRequest {
        capability: "teleport".into(),
        reason: String::new(),
        duration_s: None,
    };
    assert!(CapabilityRequest::from_agent_event(&bad).unwrap().is_err());
    let AgentEvent::Error { code, .. } = policy
        .authorize("a", &req("network:x.com"), &mut DenyAll)
        .unwrap()
        .to_event(&r.capability)
    else {
        panic!()
    };
    assert_eq!(code, "consent_denied");
}

#[test]
fn revoking_a_narrow_scope_holds_against_a_broader_live_grant() {
    let (_p, policy, clock) = project_with(&["network"], "wasm");
    policy
        .grant("a", &cap("network"), 3600, false, "test")
        .unwrap();
    clock.advance(chrono::Duration::seconds(1));
    policy
        .revoke("a", &cap("network:evil.com"), "test")
        .unwrap();
    let d = policy.check("a", &req("network:evil.com")).unwrap();
    assert!(
        matches!(
            d,
            Decision::Deny {
                code: DenyCode::ConsentRevoked,
                ..
            }
        ),
        "{d:?}"
    );
    assert!(policy
        .check("a", &req("network:api.github.com"))
        .unwrap()
        .is_allow());
    // A grant made after the revocation lifts it.
    clock.advance(chrono::Duration::seconds(1));
    policy
        .grant("a", &cap("network"), 3600, false, "test")
        .unwrap();
    assert!(policy
        .check("a", &req("network:evil.com"))
        .unwrap()
        .is_allow());
}

#[test]
fn absurd_durations_are_refused_not_a_panic() {
    let (_p, policy, _) = project_with(&["memory"], "wasm");
    assert!(policy
        .grant("a", &cap("memory"), u64::MAX, false, "test")
        .is_err());
    let mut p = Counting::new(Answer::AllowFor(u64::MAX));
    assert!(policy.authorize("a", &req("memory"), &mut p).is_err());
}

#[test]
fn policy_can_be_shared_across_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Policy>();
    assert_send_sync::<Registry>();
}
