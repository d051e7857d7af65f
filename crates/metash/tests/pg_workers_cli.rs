#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Tasks executed by `metash worker`s: the example project on a real PostgreSQL, a coordinator
//! (`metash run --workers`) that plans, verifies and merges, and two workers, each in its own
//! clone of the project, that run the executor turns. Code moves by git bundles through the
//! server; each task is completed once, by a worker, and its commit lands in the coordinator's
//! repository.
#![cfg(unix)]

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};

use metash_testkit::postgres::{prerequisites, Postgres};

fn metash(ws: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_metash"))
        .arg("-C")
        .arg(ws)
        .args(args)
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn ok(ws: &Path, args: &[&str]) -> String {
    let out = metash(ws, args);
    assert!(
        out.status.success(),
        "metash {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn git(dir: &Path, args: &[&str]) {
    let st = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["-c", "user.name=t", "-c", "user.email=t@localhost"])
        .args(args)
        .status()
        .unwrap();
    assert!(st.success(), "git {args:?}");
}

/// The example's agents and config, with `[store]` on top.
fn set_up(ws: &Path, store_toml: &str) {
    std::fs::create_dir_all(ws.join(".meta")).unwrap();
    metash_testkit::greetings::copy_into(ws);
    let example = std::fs::read_to_string(ws.join(".meta/config.toml")).unwrap();
    std::fs::write(
        ws.join(".meta/config.toml"),
        format!("{store_toml}\n{example}"),
    )
    .unwrap();
}

fn worker(ws: &Path, id: &str, store: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_metash"))
        .arg("-C")
        .arg(ws)
        .args([
            "--json",
            "worker",
            "--id",
            id,
            "--slots",
            "2",
            "--lease-seconds",
            "5",
        ])
        .args(["--idle-exit-seconds", "4"])
        .args(store)
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn workers_in_their_own_clones_execute_the_example_project() {
    let server = match prerequisites().and_then(|bin| Postgres::start(&bin)) {
        Ok(s) => s,
        Err(why) => return metash_testkit::skip("workers on postgres", &why),
    };
    let dir = tempfile::tempdir().unwrap();
    let coord = dir.path().join("coordinator");
    std::fs::create_dir_all(&coord).unwrap();
    git(&coord, &["init", "-q"]);
    git(
        &coord,
        &["commit", "-q", "--allow-empty", "-m", "empty project"],
    );
    let store_toml = format!(
        "[store]\nurl = \"{}\"\nproject = \"greetings\"\n",
        server.url("postgres")
    );
    std::fs::create_dir_all(coord.join(".meta")).unwrap();
    std::fs::write(coord.join(".meta/config.toml"), &store_toml).unwrap();
    let context = dir.path().join("vision.md");
    std::fs::write(&context, metash_testkit::greetings::context()).unwrap();
    ok(&coord, &["init", "--context", context.to_str().unwrap()]);
    set_up(&coord, &store_toml);
    for (agent, cap) in [
        ("executor", "files.read"),
        ("executor", "files.write"),
        ("verifier", "files.read"),
    ] {
        ok(&coord, &["consent", "grant", agent, cap]);
    }
    // Each worker: its own clone, the same config and agents (no store of its own: the server's).
    let clones: Vec<_> = ["w1", "w2"]
        .iter()
        .map(|w| {
            let ws = dir.path().join(w);
            let st = Command::new("git")
                .args(["clone", "-q"])
                .arg(&coord)
                .arg(&ws)
                .status()
                .unwrap();
            assert!(st.success());
            // w2 is told its store on the command line (`--store`), not in its config.
            set_up(&ws, if *w == "w1" { &store_toml } else { "" });
            ws
        })
        .collect();

    let first = metash(&coord, &["run", "--workers"]);
    assert_eq!(
        first.status.code(),
        Some(4),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    let url = server.url("postgres");
    let by_flag = ["--store", url.as_str(), "--project", "greetings"];
    let workers: Vec<Child> = vec![
        worker(&clones[0], "w1", &[]),
        worker(&clones[1], "w2", &by_flag),
    ];
    ok(&coord, &["run", "--workers", "--answer", "french"]);
    let mut completed = 0;
    for w in workers {
        let out = w.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let report: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(&out.stderr)));
        assert_eq!(report["refused"], 0);
        completed += report["completed"].as_u64().unwrap();
    }

    // The project is done, in the coordinator's repository, with the workers' commits.
    assert_eq!(
        std::fs::read_to_string(coord.join("hello.txt"))
            .unwrap()
            .trim(),
        "Bonjour, le monde !"
    );
    let status: serde_json::Value =
        serde_json::from_str(&ok(&coord, &["--json", "status"])).unwrap();
    assert_eq!(status["halt"]["reason"], "complete", "{status}");
    let log = ok(&coord, &["--json", "log", "export"]);
    let records: Vec<serde_json::Value> = log
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let done: Vec<&serde_json::Value> = records
        .iter()
        .filter(|r| r["kind"] == "task_completed")
        .collect();
    let queued = records
        .iter()
        .filter(|r| r["kind"] == "tasks_enqueued")
        .count();
    assert_eq!(done.len(), queued, "every queued turn completed once");
    assert_eq!(done.len() as u64, completed, "as the workers counted");
    assert!(
        done.len() >= 4,
        "the four tasks at least ({} turns)",
        done.len()
    );
    assert!(
        done.iter()
            .all(|r| r["agent"] == "w1" || r["agent"] == "w2"),
        "each by a worker"
    );
    let verified = ok(&coord, &["log", "verify"]);
    assert!(verified.contains("hash chain intact"), "{verified}");
    // `metash status` shows the workers, the leases (none left) and the queue.
    let fleet = &status["fleet"];
    let seen: Vec<&str> = fleet["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["id"].as_str().unwrap())
        .collect();
    assert_eq!(seen, vec!["w1", "w2"], "{fleet}");
    assert_eq!(fleet["queue"]["done"].as_u64(), Some(completed), "{fleet}");
    assert!(fleet["leases"].as_array().unwrap().is_empty(), "{fleet}");
    let text = ok(&coord, &["status"]);
    assert!(
        text.contains("store: PostgreSQL, project greetings") && text.contains("worker w2 on "),
        "{text}"
    );
}
