//! Issue 30, part 5, end to end: a hostile native agent swaps `d` between a real directory
//! holding `d/f` and a symlink to a directory outside its workspace holding a secret `f`, in a
//! tight loop on a thread of its own, while it announces `d/f` as an artifact 1,000 times.
//! The host opens each one beneath the workspace without following symlinks and reads that
//! descriptor, so no copy ever holds the secret; some copies succeed (with the inside content)
//! and some are refused, which shows the race really ran. The same race against the opening
//! alone, and a control that loses it by path, are unit tests of `spawn/artifact.rs`.

use std::path::PathBuf;

use metash_host::{SpawnRequest, Spawner};
use metash_protocol::{AgentStatus, SpawnOptions};

use super::common::{native_unavailable, Project};

const TRIES: usize = 1_000;
const SECRET: &str = "SECRET from outside the workspace";

fn race_agent_exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_metash-host-race-agent"))
}

/// `swaps=S refused=R sent=N` as numbers.
fn counts(data: &str) -> (u64, usize, usize) {
    let field = |name: &str| {
        data.split_whitespace()
            .find_map(|w| w.strip_prefix(name))
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no {name} in {data:?}"))
    };
    (
        field("swaps="),
        field("refused=") as usize,
        field("sent=") as usize,
    )
}

#[test]
fn a_racing_agent_never_gets_a_file_from_outside_copied() {
    if let Some(why) = native_unavailable() {
        metash_testkit::skip("the artifact race", &why);
        return;
    }
    let p = Project::new();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("f"), SECRET).unwrap();
    p.agent("racer", "native", &race_agent_exe(), &["files.write"]);
    let host = p.host(&["native", "files.write"]);
    let mut req = SpawnRequest::new(
        "racer",
        "",
        &format!("race {TRIES} {}", outside.path().display()),
    );
    req.options = SpawnOptions {
        timeout_seconds: Some(900.0),
        ..SpawnOptions::default()
    };
    let r = host.spawn_agent(&req).unwrap();
    assert_eq!(r.status, AgentStatus::Success, "{r:?}");
    let (swaps, refused, sent) = counts(&r.data);
    assert_eq!(sent, TRIES, "{}", r.data);

    let store = p.path().join(".meta/artifacts");
    let (mut inside, mut secret, mut absent) = (0, 0, 0);
    for i in 0..TRIES {
        match std::fs::read_to_string(store.join(format!("r{i}"))) {
            Ok(t) if t.contains("SECRET") => secret += 1,
            Ok(t) => {
                assert_eq!(t, "inside", "r{i}");
                inside += 1;
            }
            Err(_) => absent += 1,
        }
    }
    let seen = format!(
        "{} | copied inside {inside}, secret {secret}, absent {absent}",
        r.data
    );
    eprintln!("artifact race: {seen}");
    assert_eq!(
        secret, 0,
        "a file from outside the workspace was copied: {seen}"
    );
    // The race ran: the agent swapped throughout, and the host both copied `d/f` while it was
    // the real directory and refused it while it was the symlink.
    assert!(swaps >= TRIES as u64, "{seen}");
    assert!(inside > 0 && refused > 0, "{seen}");
    assert_eq!(absent, refused, "every refusal reached the agent: {seen}");
    let denied = p
        .log_data("denied")
        .into_iter()
        .filter(|d| d["what"] == "artifact")
        .count();
    assert_eq!(denied, refused, "every refusal is logged: {seen}");
}
