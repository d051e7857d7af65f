//! Issue 32 item 2: project agents start. A native agent whose manifest and entry sit in the
//! project's `.meta/agents/<id>/` (the documented place), granted the workspace, runs with the
//! same sandbox as a user agent: its own package readable and executable, read-only; nothing else
//! of `.meta/` (the log, the consent ledger, the config, another agent's directory) in view.

use std::path::{Path, PathBuf};

use metash_host::{SpawnRequest, Spawner};
use metash_protocol::AgentStatus;

use super::common::{msg, native_agent_exe, native_unavailable, wat_agent, Project};

const READ_WRITE: [&str; 2] = ["files.read", "files.write"];

/// Writes `.meta/agents/<id>/manifest.toml` with `entry` relative to it, as a user would.
fn manifest(p: &Project, id: &str, sandbox: &str, entry: &str, caps: &[&str]) -> PathBuf {
    let dir = p.path().join(".meta/agents").join(id);
    std::fs::create_dir_all(&dir).expect("agent dir");
    let caps: Vec<String> = caps.iter().map(|c| format!("{c:?}")).collect();
    std::fs::write(
        dir.join("manifest.toml"),
        format!(
            "schema_version = \"0.1\"\nname = \"{id}\"\nversion = \"0.1.0\"\nentry = {entry:?}\n\
             sandbox = \"{sandbox}\"\ncapabilities = [{}]\nresources.mem = \"256Mi\"\n",
            caps.join(", ")
        ),
    )
    .expect("manifest");
    dir
}

/// A project whose state files all exist (so "unreadable" is about the sandbox, not a missing
/// file), another agent's directory holding a secret, and its canonical root. `None` (having
/// said why) where native agents cannot run.
fn project(test: &str) -> Option<(Project, PathBuf)> {
    if let Some(why) = native_unavailable() {
        metash_testkit::skip(test, &why);
        return None;
    }
    let p = Project::new();
    p.config("# the project's configuration\n");
    let other = p.path().join(".meta/agents/other");
    std::fs::create_dir_all(&other).expect("other agent");
    std::fs::write(other.join("secret.txt"), "another agent's secret").expect("secret");
    let root = std::fs::canonicalize(p.path()).expect("root");
    Some((p, root))
}

/// The native binary test agent, copied into its package directory under `.meta/agents/<id>/`.
fn binary_agent(p: &Project, id: &str) -> PathBuf {
    let dir = manifest(p, id, "native", "bin/agent", &READ_WRITE);
    std::fs::create_dir_all(dir.join("bin")).expect("bin");
    std::fs::copy(native_agent_exe(), dir.join("bin/agent")).expect("copy the agent");
    dir
}

/// A Python script agent (`#!/usr/bin/env python3`) importing a module beside it: `write PATH`
/// writes a marker, `try OP PATH` answers `OK …` or `DENIED …` as the binary test agent does.
fn script_agent(p: &Project, id: &str) -> PathBuf {
    let dir = manifest(p, id, "native", "agent.py", &READ_WRITE);
    std::fs::write(dir.join("helper.py"), "WORD = 'from the package'\n").expect("helper");
    let entry = dir.join("agent.py");
    std::fs::write(
        &entry,
        r#"#!/usr/bin/env python3
import json, os, sys
def say(**m):
    sys.stdout.write(json.dumps({"schema_version": "0.1", **m}) + "\n"); sys.stdout.flush()
def attempt(op, path):
    try:
        if op == "read":
            with open(path) as f:
                return "OK " + f.read()[:40]
        if op == "ls":
            names = os.listdir(path)
            return ("OK " + ",".join(names)) if names else "DENIED empty"
        if op == "write":
            with open(path, "w") as f:
                f.write("forged")
            return "OK"
        return "DENIED unknown op " + op
    except Exception as e:
        return "DENIED " + type(e).__name__ + ": " + str(e)
for line in sys.stdin:
    msg = json.loads(line)
    if msg["type"] != "input":
        continue
    words = msg["prompt"].split(" ")
    if words[0] == "write":
        import helper
        with open(words[1], "w") as f:
            f.write(helper.WORD)
        text = "wrote"
    else:
        text = attempt(words[1], words[2])
    say(type="output", agent_id="s", chunk_id="a:0", content_type="text/plain", data=text)
    say(type="done")
"#,
    )
    .expect("script");
    std::fs::set_permissions(&entry, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    dir
}

/// A stored grant of `files.read` to `id`, so `.meta/consent.json` exists and holds something.
fn stored_grant(p: &Project, id: &str) {
    let store = metash_store::Store::open(p.path()).expect("store");
    let dirs = metash_policy::AgentDirs::new(p.path(), None);
    let policy = metash_policy::Policy::new(store, metash_policy::Registry::discover(&dirs));
    let cap: metash_policy::Capability = "files.read".parse().expect("capability");
    policy.grant(id, &cap, 3600, false, "test").expect("grant");
}

fn ask(host: &metash_host::Host, id: &str, prompt: &str) -> String {
    let r = host
        .spawn_agent(&SpawnRequest::new(id, "", prompt))
        .expect("spawn");
    assert_eq!(r.status, AgentStatus::Success, "{id} `{prompt}`: {r:?}");
    r.data
}

/// The agent `id` (its package `pkg`) runs and writes its marker into the workspace; `.meta/`'s
/// state, another agent's directory and the listing of `.meta/agents` stay out of its reach; its
/// own directory is readable and not writable; the start report says what was shown.
fn runs_fenced(p: &Project, root: &Path, id: &str, pkg: &Path) {
    stored_grant(p, id);
    let host = p.host(&["native", "files.read", "files.write"]);
    let marker = root.join(format!("marker-{id}.txt"));
    assert_eq!(
        ask(&host, id, &format!("write {}", marker.display())),
        "wrote"
    );
    assert!(marker.exists(), "{id} wrote no marker");
    let meta = root.join(".meta");
    for f in ["events.jsonl", "consent.json", "config.toml"] {
        assert!(
            meta.join(f).exists(),
            "{f} is missing: the test would prove nothing"
        );
    }
    let denied = [
        format!("read {}", meta.join("events.jsonl").display()),
        format!("read {}", meta.join("consent.json").display()),
        format!("read {}", meta.join("config.toml").display()),
        format!("read {}", meta.join("agents/other/secret.txt").display()),
        format!("ls {}", meta.join("agents").display()),
        format!("ls {}", meta.display()),
        format!("write {}", pkg.join("planted.txt").display()),
        format!("write {}", pkg.join("manifest.toml").display()),
        format!("write {}", meta.join("planted.txt").display()),
    ];
    for t in &denied {
        let out = ask(&host, id, &format!("try {t}"));
        assert!(out.starts_with("DENIED"), "{id}: `{t}` must fail: {out}");
    }
    assert!(!pkg.join("planted.txt").exists());
    // Positive control: its own package is in view.
    let own = ask(
        &host,
        id,
        &format!("try read {}", pkg.join("manifest.toml").display()),
    );
    assert!(own.starts_with("OK schema_version"), "{id}: {own}");
    let started = p.log_data("agent_started");
    let hidden = &started.last().expect("started")["state_hidden"];
    assert_eq!(hidden["dirs"], serde_json::json!([meta]), "{hidden}");
    assert_eq!(
        hidden["except"]["paths"],
        serde_json::json!([pkg]),
        "{hidden}"
    );
}

#[test]
fn a_native_binary_agent_in_meta_agents_starts_and_sees_only_its_package() {
    let Some((p, root)) = project("native binary project agent") else {
        return;
    };
    binary_agent(&p, "nb");
    runs_fenced(&p, &root, "nb", &root.join(".meta/agents/nb"));
}

#[test]
fn a_native_script_agent_in_meta_agents_starts_and_sees_only_its_package() {
    let Some((p, root)) = project("native script project agent") else {
        return;
    };
    if !Path::new("/usr/bin/python3").exists() {
        return metash_testkit::skip("native script project agent", "no /usr/bin/python3");
    }
    script_agent(&p, "ns");
    runs_fenced(&p, &root, "ns", &root.join(".meta/agents/ns"));
    // It imported its helper from its package (the marker holds the helper's word).
    let marker = std::fs::read_to_string(root.join("marker-ns.txt")).expect("marker");
    assert_eq!(marker, "from the package");
}

/// An entry in `.meta/` outside its own package (here another agent's binary) is not shown: the
/// spawn fails at once, saying why, and nothing starts.
#[test]
fn an_entry_in_meta_outside_its_package_is_refused() {
    let Some((p, _root)) = project("project agent entry outside its package") else {
        return;
    };
    binary_agent(&p, "nb");
    manifest(&p, "borrower", "native", "../nb/bin/agent", &READ_WRITE);
    let host = p.host(&["native", "files.read", "files.write"]);
    let r = host
        .spawn_agent(&SpawnRequest::new("borrower", "", "echo hi"))
        .expect("spawn");
    assert_eq!(r.status, AgentStatus::Error, "{r:?}");
    assert!(
        r.data.contains("inside its own package directory"),
        "{}",
        r.data
    );
}

/// A WASM agent in `.meta/agents/` (its module is read by the host) runs with the project.
#[test]
fn a_wasm_agent_in_meta_agents_runs_with_the_project() {
    let p = Project::new();
    let dir = manifest(&p, "w", "wasm", "agent.wat", &READ_WRITE);
    let done = msg(r#"{"type":"done"}"#);
    std::fs::write(dir.join("agent.wat"), wat_agent(&[&done], false)).expect("wat");
    let host = p.host(&["files.read", "files.write"]);
    let r = host
        .spawn_agent(&SpawnRequest::new("w", "", "go"))
        .expect("spawn");
    assert_eq!(r.status, AgentStatus::Success, "{r:?}");
}
