//! Issue 14 item 3: a compiled-code cache entry that metash did not write is never loaded. The
//! cache sits in the project (`.meta/cache/wasm`); a planted entry would be native code the host
//! runs. Each entry carries a MAC under the user's host key: a forged one is deleted, logged,
//! recompiled, and the agent runs as it should.

use metash_host::{SpawnRequest, Spawner};
use metash_protocol::AgentStatus;

use super::common::{msg, wat_agent, Project};

const TRAILER: &[u8] = b"metash-cwasm-hmac-sha256-v1";

fn project() -> Project {
    let p = Project::new();
    let out = msg(
        r#"{"type":"output","agent_id":"w","chunk_id":"c1","content_type":"text/plain","data":"genuine"}"#,
    );
    let done = msg(r#"{"type":"done"}"#);
    std::fs::write(p.path().join("agent.wat"), wat_agent(&[&out, &done], false)).expect("wat");
    p.agent("w", "wasm", &p.path().join("agent.wat"), &[]);
    p
}

fn run(p: &Project) {
    // A fresh host each time: a new runtime with an empty in-process cache, so the disk is read.
    let r = p
        .host(&[])
        .spawn_agent(&SpawnRequest::new("w", "", "go"))
        .expect("spawn");
    assert_eq!(r.status, AgentStatus::Success, "{r:?}");
    assert_eq!(r.data, "genuine");
}

fn entries(p: &Project) -> Vec<std::path::PathBuf> {
    let dir = p.path().join(".meta/cache/wasm");
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    v.retain(|e| e.extension().is_some_and(|x| x == "cwasm"));
    v
}

/// A crafted file: what wasmtime's own format starts with, then attacker bytes.
fn crafted() -> Vec<u8> {
    let mut b = b"\x7fELF\x02\x01\x01\0".to_vec();
    b.extend(std::iter::repeat_n(0x90u8, 4096));
    b
}

#[test]
fn a_forged_cache_entry_is_rejected_logged_and_recompiled() {
    let p = project();
    run(&p);
    let found = entries(&p);
    assert_eq!(found.len(), 1, "{found:?}");
    let entry = &found[0];
    assert!(std::fs::read(entry).expect("entry").ends_with(TRAILER));
    assert!(p.log_data("cache_rejected").is_empty());

    std::fs::write(entry, crafted()).expect("plant");
    run(&p);
    let rejected = p.log_data("cache_rejected");
    assert_eq!(rejected.len(), 1, "{rejected:?}");
    let name = entry.file_name().and_then(|n| n.to_str()).expect("name");
    assert!(rejected[0]["file"]
        .as_str()
        .is_some_and(|f| f.ends_with(name)));
    assert!(
        rejected[0]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("trailer")),
        "{rejected:?}"
    );
    // Replaced by a genuine entry, which the next host loads without complaint.
    let now = std::fs::read(entry).expect("entry");
    assert!(now.ends_with(TRAILER) && now != crafted());
    run(&p);
    assert_eq!(p.log_data("cache_rejected").len(), 1);
}

#[test]
fn an_entry_planted_before_first_use_is_never_loaded() {
    // Learn the name the cache would use from a first project, then plant it in a second one
    // before its agent ever ran: a forged MAC trailer does not help.
    let first = project();
    run(&first);
    let name = entries(&first)[0].file_name().expect("name").to_owned();
    let p = project();
    let dir = p.path().join(".meta/cache/wasm");
    std::fs::create_dir_all(&dir).expect("dir");
    let mut forged = crafted();
    forged.extend_from_slice(&[0u8; 32]);
    forged.extend_from_slice(TRAILER);
    std::fs::write(dir.join(&name), &forged).expect("plant");
    run(&p);
    let rejected = p.log_data("cache_rejected");
    assert_eq!(rejected.len(), 1, "{rejected:?}");
    assert!(rejected[0]["reason"]
        .as_str()
        .is_some_and(|r| r.contains("MAC does not match")));
    assert_ne!(std::fs::read(dir.join(&name)).expect("entry"), forged);
}
