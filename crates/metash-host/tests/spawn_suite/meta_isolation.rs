//! Issue 14 items 1 and 2: the workspace an agent sees never contains metash's state. A native
//! agent granted read and write on the whole project finds `.meta/` empty and unwritable (an
//! empty read-only mount in its own namespace); a WASM agent is never given a directory holding
//! `.meta/`; a grant naming a path in `.meta/` is refused; and afterwards the grants, the session
//! and the log are as they were.

use metash_host::{SpawnRequest, Spawner};
use metash_protocol::AgentStatus;

use super::common::{msg, native_agent_exe, native_unavailable, wat_agent, Project};

fn snapshot(p: &Project) -> (Vec<u8>, Vec<u8>) {
    let meta = p.path().join(".meta");
    (
        std::fs::read(meta.join("consent.json")).unwrap_or_default(),
        std::fs::read(meta.join("session.json")).expect("session.json"),
    )
}

/// Registers the native test agent `n`, declaring read and write.
fn read_write_agent(p: &Project) {
    let caps = ["files.read", "files.write"];
    p.agent("n", "native", &native_agent_exe(), &caps);
}

/// A project with the native test agent `n`, granted read and write, and its canonical root
/// (None, having said why, where native agents cannot run).
fn native_project(test: &str) -> Option<(Project, metash_host::Host, std::path::PathBuf)> {
    if let Some(why) = native_unavailable() {
        metash_testkit::skip(test, &why);
        return None;
    }
    let p = Project::new();
    read_write_agent(&p);
    let host = p.host(&["native", "files.read", "files.write"]);
    let root = std::fs::canonicalize(p.path()).expect("root");
    Some((p, host, root))
}

fn attempt(host: &metash_host::Host, what: &str) -> String {
    let r = host
        .spawn_agent(&SpawnRequest::new("n", "", &format!("try {what}")))
        .expect("spawn");
    assert_eq!(r.status, AgentStatus::Success, "{what}: {r:?}");
    r.data
}

#[test]
fn a_native_agent_with_the_whole_project_cannot_reach_meta() {
    let Some((p, host, root)) = native_project("native agent, whole project") else {
        return;
    };
    let meta = root.join(".meta");
    std::fs::create_dir_all(meta.join("cache/wasm")).expect("cache dir");
    // Positive control: the agent does reach the project's own files.
    std::fs::write(root.join("notes.txt"), "project file").expect("notes");
    assert_eq!(
        attempt(&host, &format!("read {}", root.join("notes.txt").display())),
        "OK project file"
    );
    let before = snapshot(&p);
    let m = |rel: &str| meta.join(rel).display().to_string();
    let w = |rel: &str| root.join(rel).display().to_string();
    let tries = [
        format!("ls {}", meta.display()),
        format!("read {}", m("events.jsonl")),
        format!("read {}/../.meta/session.json", w("notes.d")),
        format!("write {}", m("consent.json")),
        format!("write {}", m("cache/wasm/planted.cwasm")),
        format!(
            "symlink-read {} {}",
            m("session.json"),
            w("link-to-session")
        ),
        format!("hardlink {} {}", m("events.jsonl"), w("hardlinked")),
        format!("rename {} {}", meta.display(), w("moved-meta")),
    ];
    for t in &tries {
        let out = attempt(&host, t);
        assert!(out.starts_with("DENIED"), "`{t}` must fail: {out}");
    }
    // What the host sees is untouched, and nothing leaked into the project.
    assert_eq!(snapshot(&p).0, before.0, "consent.json changed");
    let session_after: serde_json::Value =
        serde_json::from_slice(&snapshot(&p).1).expect("session");
    let session_before: serde_json::Value = serde_json::from_slice(&before.1).expect("session");
    assert_eq!(session_after["plan"], session_before["plan"]);
    assert_eq!(session_after["variables"], session_before["variables"]);
    assert!(!meta.join("cache/wasm/planted.cwasm").exists());
    assert!(!root.join("hardlinked").exists() && !root.join("moved-meta").exists());
    assert!(meta.join("events.jsonl").exists());
    metash_store::Store::open(&root)
        .expect("store")
        .log()
        .verify()
        .expect("the log verifies");
    // The start report says how.
    let started = p.log_data("agent_started");
    let hidden = &started.last().expect("started")["state_hidden"];
    assert_eq!(hidden["via"], "mount-namespace", "{hidden}");
}

#[test]
fn a_native_agent_in_a_task_worktree_cannot_climb_to_meta() {
    let Some((_p, host, root)) = native_project("native agent in a worktree") else {
        return;
    };
    let wt = root.join(".meta/worktrees/t1");
    std::fs::create_dir_all(&wt).expect("worktree");
    let run = |what: &str| {
        let mut req = SpawnRequest::new("n", "", &format!("try {what}"));
        req.workdir = Some(wt.clone());
        host.spawn_agent(&req).expect("spawn").data
    };
    assert!(run(&format!("write {}", wt.join("work.txt").display())).starts_with("OK"));
    for t in [
        format!("read {}/../../events.jsonl", wt.display()),
        format!("ls {}/../..", wt.display()),
        format!("write {}/../../consent.json", wt.display()),
        format!("read {}", root.join(".meta/session.json").display()),
    ] {
        let out = run(&t);
        assert!(out.starts_with("DENIED"), "`{t}` must fail: {out}");
    }
}

/// A WASM agent given the project root runs, with `.meta/` covered by an empty read-only mount
/// in its view (the runtime's `wasm_escape::wasm_sees_hidden_state_empty` tries to read and plant
/// files there).
#[test]
fn a_wasm_agent_with_the_project_root_runs_with_meta_covered() {
    let p = Project::new();
    let done = msg(r#"{"type":"done"}"#);
    std::fs::write(p.path().join("a.wat"), wat_agent(&[&done], false)).expect("wat");
    p.agent("w", "wasm", &p.path().join("a.wat"), &["files.read"]);
    let host = p.host(&["files.read"]);
    let r = host
        .spawn_agent(&SpawnRequest::new("w", "", "go"))
        .expect("spawn");
    assert_eq!(r.status, AgentStatus::Success, "{r:?}");
    let started = p.log_data("agent_started");
    assert_eq!(
        started.last().map(|d| d["paths_revocable"].clone()),
        Some(serde_json::json!("mount-namespace")),
        "{started:?}"
    );
}

#[test]
fn a_grant_naming_meta_is_refused_at_grant_time() {
    let p = Project::new();
    read_write_agent(&p);
    let store = metash_store::Store::open(p.path()).expect("store");
    let dirs = metash_policy::AgentDirs::new(p.path(), None);
    let policy = metash_policy::Policy::new(store, metash_policy::Registry::discover(&dirs));
    // A symlink in the project that points into `.meta/` does not launder a grant.
    std::os::unix::fs::symlink(p.path().join(".meta"), p.path().join("innocent")).expect("link");
    for cap in [
        "files.read:.meta/events.jsonl",
        "files.write:innocent/consent.json",
        "files.read:.meta",
    ] {
        let c: metash_policy::Capability = cap.parse().expect("capability");
        let err = policy
            .grant("n", &c, 3600, false, "test")
            .expect_err(cap)
            .to_string();
        assert!(err.contains("metash's own state"), "{cap}: {err}");
    }
    let ok: metash_policy::Capability = "files.read:src".parse().expect("capability");
    assert!(policy.grant("n", &ok, 3600, false, "test").is_ok());
}
