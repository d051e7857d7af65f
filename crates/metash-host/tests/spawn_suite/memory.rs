//! Issue 18 (seed 002 §7): agents read back what they stored. A native agent stores a value in
//! its own KV namespace and reads it back in the same invocation and in a later spawn; another
//! agent does not see it (namespaces); the shared scratchpad is shared; the session's variables
//! can be read, nothing else of the session; without `memory` the read is refused with a reason.

use metash_host::{Host, SpawnRequest, Spawner};
use metash_protocol::AgentStatus;

use super::common::{native_agent_exe, native_unavailable, Project};

/// A project (None, having said why, where native agents cannot run).
fn native_project(test: &str) -> Option<Project> {
    if let Some(why) = native_unavailable() {
        metash_testkit::skip(test, &why);
        return None;
    }
    Some(Project::new())
}

fn ask(host: &Host, agent: &str, message: &str) -> String {
    let r = host
        .spawn_agent(&SpawnRequest::new(agent, "", message))
        .expect("spawn");
    assert_eq!(r.status, AgentStatus::Success, "{message}: {r:?}");
    r.data
}

#[test]
fn agents_read_back_what_they_stored_in_their_own_namespace() {
    let Some(p) = native_project("memory read-back") else {
        return;
    };
    p.agent("keeper", "native", &native_agent_exe(), &["memory"]);
    p.agent("other", "native", &native_agent_exe(), &["memory"]);
    p.agent("forgetful", "native", &native_agent_exe(), &[]);
    let host = p.host(&["native", "memory"]);

    assert_eq!(
        ask(
            &host,
            "keeper",
            r#"remember plan {"step":2,"notes":["a","b"]}"#
        ),
        r#"got {"notes":["a","b"],"step":2}"#
    );
    // A later spawn (a new process) reads it back; the whole namespace lists it.
    assert_eq!(
        ask(&host, "keeper", "recall plan"),
        r#"got {"notes":["a","b"],"step":2}"#
    );
    assert_eq!(
        ask(&host, "keeper", "recall agent "),
        r#"got {"plan":{"notes":["a","b"],"step":2}}"#
    );
    // Namespaces: another agent's `plan` is not this one.
    assert_eq!(ask(&host, "other", "recall plan"), "missing");

    // The scratchpad is shared between agents.
    host.store()
        .scratchpad()
        .set("shared", serde_json::json!("hello"))
        .unwrap();
    assert_eq!(
        ask(&host, "other", "recall scratchpad shared"),
        r#"got "hello""#
    );

    // The session's variables can be read; the plan cannot.
    host.update_state(None, "variables.phase_goal", serde_json::json!("ship"))
        .unwrap();
    assert_eq!(
        ask(&host, "other", "recall session variables.phase_goal"),
        r#"got "ship""#
    );
    let refused = ask(&host, "other", "recall session status");
    assert!(
        refused.starts_with("denied ") && refused.contains("variables.*"),
        "{refused}"
    );

    // Without `memory`: refused, saying why.
    let refused = ask(&host, "forgetful", "recall plan");
    assert!(
        refused.contains("`memory` capability is not granted"),
        "{refused}"
    );
}

#[test]
fn a_write_past_the_namespace_quota_is_refused_and_the_agent_told() {
    let Some(p) = native_project("memory quota") else {
        return;
    };
    p.agent("keeper", "native", &native_agent_exe(), &["memory"]);
    std::fs::write(
        p.path().join(".meta/config.toml"),
        "[host]\nkv_max_keys = 2\nkv_max_bytes = 64\n",
    )
    .unwrap();
    let host = p.host(&["native", "memory"]);
    assert_eq!(ask(&host, "keeper", "remember a 1"), "got 1");
    let big = format!("remember b \"{}\"", "x".repeat(100));
    let refused = ask(&host, "keeper", &big);
    assert!(
        refused.contains("would hold") && refused.contains("its quota is 64"),
        "{refused}"
    );
    assert_eq!(ask(&host, "keeper", "remember c 3"), "got 3");
    let refused = ask(&host, "keeper", "remember d 4");
    assert!(
        refused.contains("would hold 3 keys; its quota is 2"),
        "{refused}"
    );
    // Nothing of the refused writes was stored.
    assert_eq!(
        ask(&host, "keeper", "recall agent "),
        r#"got {"a":1,"c":3}"#
    );
}

/// An agent's `artifact` is copied into `.meta/artifacts/` (it outlives the worktree); a path
/// outside the agent's workspace, through a symlink, or into metash's state is refused and logged.
#[test]
fn announced_artifacts_are_kept_and_escapes_refused() {
    let Some(p) = native_project("artifacts") else {
        return;
    };
    p.agent("maker", "native", &native_agent_exe(), &[]);
    let host = p.host(&["native"]);
    std::fs::write(p.path().join("report.txt"), "the report").unwrap();
    assert_eq!(ask(&host, "maker", "artifact report report.txt"), "sent");
    let kept = p.path().join(".meta/artifacts/report");
    assert_eq!(std::fs::read_to_string(&kept).unwrap(), "the report");

    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret.txt"), "outside").unwrap();
    std::os::unix::fs::symlink(outside.path().join("secret.txt"), p.path().join("link.txt"))
        .unwrap();
    let outside_path = outside.path().join("secret.txt");
    for (id, path) in [
        ("abs", outside_path.to_str().unwrap()),
        ("link", "link.txt"),
        ("state", ".meta/session.json"),
        ("missing", "nope.txt"),
    ] {
        assert_eq!(
            ask(&host, "maker", &format!("artifact {id} {path}")),
            "sent"
        );
        assert!(
            !p.path().join(".meta/artifacts").join(id).exists(),
            "{id} was kept"
        );
    }
    let denied = p.log_data("denied");
    let ids: Vec<&str> = denied
        .iter()
        .filter(|d| d["what"] == "artifact")
        .filter_map(|d| d["id"].as_str())
        .collect();
    assert_eq!(ids, ["abs", "link", "state", "missing"], "{denied:?}");
}
