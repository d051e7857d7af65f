//! Seed 002's `input.context_refs` (issue 18): the host resolves each reference before the agent
//! starts, the agent receives them normalised, and fetches what they name (an artifact through
//! `state_get` scope `artifact`, only the ones it was given); a reference that does not resolve
//! refuses the spawn, naming it, and nothing starts.

use metash_host::{Host, SpawnRequest, Spawner};
use metash_protocol::{AgentResponse, AgentStatus, SpawnOptions};

use super::common::*;

fn spawn(host: &Host, message: &str, refs: &[&str]) -> AgentResponse {
    let mut req = SpawnRequest::new("reader", "", message);
    req.options = SpawnOptions {
        context_refs: refs.iter().map(|r| r.to_string()).collect(),
        ..SpawnOptions::default()
    };
    host.spawn_agent(&req).unwrap()
}

#[test]
fn refs_are_resolved_delivered_and_fetched_and_bad_ones_refuse_the_spawn() {
    if let Some(why) = native_unavailable() {
        metash_testkit::skip("context_refs", &why);
        return;
    }
    let p = Project::new();
    p.agent("reader", "native", &native_agent_exe(), &["memory"]);
    std::fs::create_dir_all(p.path().join("docs")).unwrap();
    std::fs::write(p.path().join("docs/notes.md"), "n").unwrap();
    let store = metash_store::Store::open(p.path()).unwrap();
    store
        .kv("reader")
        .unwrap()
        .set("plan", "\"v2\"".parse().unwrap())
        .unwrap();
    store
        .scratchpad()
        .set("shared", serde_json::json!(1))
        .unwrap();
    store
        .artifacts()
        .put("report", b"artifact body", None)
        .unwrap();
    let host = p.host(&["native", "memory"]);

    let r = spawn(
        &host,
        "refs",
        &[
            "file:./docs/notes.md",
            "kv:plan",
            "scratchpad:shared",
            "artifact:report",
        ],
    );
    assert_eq!(r.status, AgentStatus::Success, "{r:?}");
    assert_eq!(
        r.data,
        "file:docs/notes.md,kv:plan,scratchpad:shared,artifact:report"
    );
    let r = spawn(&host, "recall artifact report", &["artifact:report"]);
    assert_eq!(r.data, "got \"artifact body\"", "{r:?}");
    // An artifact it was not given stays out of reach.
    let r = spawn(&host, "recall artifact report", &[]);
    assert!(
        r.data.starts_with("denied") && r.data.contains("context_refs"),
        "{r:?}"
    );

    let started = || {
        p.log_kinds()
            .iter()
            .filter(|k| *k == "agent_started")
            .count()
    };
    let before = started();
    for (bad, why) in [
        ("file:../outside", "without `..`"),
        ("file:/etc/passwd", "relative"),
        ("file:.meta/session.json", "state directory"),
        ("file:docs/missing.md", "does not exist"),
        ("kv:nothing", "is not stored"),
        ("artifact:nope", "not a saved artifact"),
        ("web:https://x", "unknown kind"),
        ("plain", "KIND:VALUE"),
    ] {
        let r = spawn(&host, "refs", &[bad]);
        assert_eq!(r.status, AgentStatus::Error, "{bad}: {r:?}");
        assert!(
            r.data.contains(bad) && r.data.contains(why),
            "{bad}: {}",
            r.data
        );
    }
    assert_eq!(started(), before, "an agent started with a bad reference");
}
