//! Issue 31 parts 5 and 6 through the host: the quotas a CLI role runs under (a default memory
//! limit, disk and file quotas over its worktree, HOME and TMPDIR, the log cap, all in its start
//! report), exercised with shell commands under the role's own confinement (`metash sandbox`'s
//! path, the same `RoleConfiner` as a CLI role's spawn) and with a real CLI driven by a loopback
//! model; and the consent flood: 100 questions in a row from one native agent, of which at most
//! the rate is asked and the rest refused at once with the reason.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use metash_host::{Host, HostOptions, SpawnRequest, Spawner, Terminal};
use metash_protocol::AgentStatus;
use metash_testkit::anthropic::ModelServer;
use metash_testkit::cli::Cli;

use super::common::{native_agent_exe, native_unavailable, Project};

const MIB: u64 = 1 << 20;

/// Bytes and entries under `dir` (not following links).
fn usage(dir: &Path) -> (u64, u64) {
    let (mut bytes, mut files) = (0, 0);
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let md = e.metadata().unwrap();
        files += 1;
        if md.is_dir() {
            let (b, f) = usage(&e.path());
            bytes += b;
            files += f;
        } else {
            bytes += md.len();
        }
    }
    (bytes, files)
}

/// A project whose role `coder` (Claude Code's frontend; nothing of it runs here) has `extra`
/// settings, and its host.
fn sandbox_project(extra: &str) -> Option<(Project, Host)> {
    if let Some(why) = native_unavailable() {
        metash_testkit::skip("quota tests", &why);
        return None;
    }
    let p = Project::new();
    p.config(&format!(
        "{}{extra}",
        Cli::Claude.role("coder", "http://127.0.0.1:9")
    ));
    let host = super::cli_sandbox::cli_host(&p);
    Some((p, host))
}

/// Runs `script` with `sh -c` under the role's confinement in the project root: whether it
/// exited successfully, the start report, how long it took.
fn sandboxed(p: &Project, host: &Host, script: &str) -> (bool, serde_json::Value, Duration) {
    let argv = ["sh".to_string(), "-c".to_string(), script.to_string()];
    let s = host
        .sandboxed("coder", p.path(), &argv, &[])
        .expect("sandboxed");
    let report = s.report.clone();
    let t = Instant::now();
    let ok = s.status().expect("ran").success();
    let took = t.elapsed();
    host.flush_events().expect("flush");
    (ok, report, took)
}

/// The disk watcher's `limit_exceeded` events.
fn watcher_events(p: &Project) -> Vec<serde_json::Value> {
    p.log_data("limit_exceeded")
        .into_iter()
        .filter(|d| d["via"] == "disk-watch")
        .collect()
}

#[test]
fn a_cli_roles_start_report_shows_every_limit_with_the_defaults() {
    let Some((p, host)) = sandbox_project("") else {
        return;
    };
    let (ok, report, _) = sandboxed(&p, &host, "true");
    assert!(ok);
    let limits = &report["limits"];
    assert_eq!(limits["memory_bytes"]["value"], 4u64 << 30, "{limits}");
    assert_eq!(limits["pids"]["value"], 512, "{limits}");
    assert_eq!(limits["disk_bytes"]["value"], 2u64 << 30, "{limits}");
    assert_eq!(limits["files"]["value"], 100_000, "{limits}");
    assert!(limits.get("cpu_millis").is_some(), "{limits}");
    // The log cap is the host's: in the report as logged.
    let started = p.log_data("agent_started");
    let logged = &started.last().expect("agent_started")["report"]["limits"];
    assert_eq!(logged["log_bytes"]["value"], 256u64 << 20, "{logged}");
}

#[test]
fn a_gigabyte_written_under_a_cli_roles_confinement_stops_at_its_disk_quota() {
    let Some((p, host)) = sandbox_project("disk = \"50m\"\n") else {
        return;
    };
    let (ok, report, took) = sandboxed(
        &p,
        &host,
        "mkdir -p out && i=0; while [ $i -lt 1024 ]; do head -c 1048576 /dev/zero > out/part$i \
         || exit 7; i=$((i+1)); done; echo WROTE-IT-ALL > out/done",
    );
    assert_eq!(report["limits"]["disk_bytes"]["value"], 50 * MIB);
    assert!(!ok, "it ran to the end");
    assert!(!p.path().join("out/done").exists(), "it ran to the end");
    let hits = watcher_events(&p);
    assert_eq!(hits.len(), 1, "{hits:?}");
    assert_eq!(hits[0]["limit"], "disk");
    assert!(
        hits[0]["used"].as_u64().unwrap() > 50 * MIB,
        "{:?}",
        hits[0]
    );
    let (bytes, _) = usage(&p.path().join("out"));
    assert!(bytes > 50 * MIB, "what it wrote was removed: {bytes}");
    assert!(
        bytes < 512 * MIB,
        "{bytes} bytes written before it was stopped"
    );
    assert!(took < Duration::from_secs(30), "{took:?}");
}

#[test]
fn a_hundred_thousand_files_under_a_cli_roles_confinement_stop_at_its_file_quota() {
    let Some((p, host)) = sandbox_project("files = 2000\n") else {
        return;
    };
    // In its HOME: the quota covers what it may write, not only the worktree.
    let (ok, _, took) = sandboxed(
        &p,
        &host,
        "mkdir \"$HOME/many\" && cd \"$HOME/many\" && i=0; while [ $i -lt 100000 ]; do : > f$i \
         || exit 7; i=$((i+1)); done; echo MADE-THEM-ALL > \"$HOME/done\"",
    );
    assert!(!ok, "it ran to the end");
    let hits = watcher_events(&p);
    assert_eq!(hits.len(), 1, "{hits:?}");
    assert_eq!(hits[0]["limit"], "files");
    assert_eq!(hits[0]["max"], 2000);
    let used = hits[0]["used"].as_u64().unwrap();
    assert!((2001..100_000).contains(&used), "{used}");
    assert!(took < Duration::from_secs(30), "{took:?}");
}

/// The role `coder` of `cli`, driven by a loopback model that asks for one shell call of `cmd`
/// and then answers `finished`; the spawn's response.
fn cli_turn(
    cli: Cli,
    tools: &Path,
    p: &Project,
    extra: &str,
    cmd: &str,
) -> metash_protocol::AgentResponse {
    let cmd = cmd.to_string();
    let server = ModelServer::start(move |c| {
        let body = c.text();
        if !body.contains("Fill the disk.") {
            return cli.text("ok");
        }
        match cli.results(&body) {
            0 => cli.shell(0, &body, &cmd),
            _ => cli.text("finished"),
        }
    });
    std::os::unix::fs::symlink(tools, p.path().join(".tools")).expect("link .tools");
    p.config(&format!("{}{extra}", cli.role("coder", &server.base)));
    let host = super::cli_sandbox::cli_host(p);
    let mut req = SpawnRequest::new("coder", "You are a test.", "Fill the disk.");
    req.options.timeout_seconds = Some(300.0);
    host.spawn_agent(&req).expect("spawn")
}

/// A real CLI told to write 1 GiB: its turn ends at the quota, saying why.
fn real_cli_fills_the_disk(cli: Cli, test: &str) {
    let Some(tools) = super::common::cli_ready(cli, test) else {
        return;
    };
    let p = Project::new();
    let r = cli_turn(
        cli,
        &tools,
        &p,
        "disk = \"50m\"\n",
        "mkdir -p out && for i in $(seq 1024); do head -c 1048576 /dev/zero > out/part$i; done; \
         echo WROTE-IT-ALL",
    );
    assert_eq!(r.status, AgentStatus::Error, "{r:?}");
    // The spawn's HOME and TMPDIR are kept for inspection: gone once inspected here.
    let kept = r
        .data
        .rsplit_once("kept in ")
        .map(|(_, d)| d.trim())
        .expect("kept");
    assert!(Path::new(kept).join("home").is_dir(), "{}", r.data);
    std::fs::remove_dir_all(kept).expect("remove the kept spawn directory");
    assert!(r.data.contains("exceeded its disk quota"), "{}", r.data);
    assert!(r.data.contains("52428800"), "{}", r.data);
    let started = p.log_data("agent_started");
    let report = started
        .iter()
        .find(|s| s.get("frontend").is_some())
        .unwrap_or_else(|| panic!("no CLI start report: {started:?}"));
    assert_eq!(
        report["limits"]["memory_bytes"]["value"],
        4u64 << 30,
        "{report}"
    );
    assert_eq!(
        report["limits"]["disk_bytes"]["value"],
        50 * MIB,
        "{report}"
    );
    assert_eq!(
        report["limits"]["log_bytes"]["value"],
        256u64 << 20,
        "{report}"
    );
    // Left in place, and far from the gigabyte (the quota counts its HOME and TMPDIR too, so
    // `out` alone may hold a little less than the quota).
    let hits = watcher_events(&p);
    assert_eq!(hits.len(), 1, "{hits:?}");
    assert!(
        hits[0]["used"].as_u64().unwrap() > 50 * MIB,
        "{:?}",
        hits[0]
    );
    let (bytes, _) = usage(&p.path().join("out"));
    assert!(
        (MIB..512 * MIB).contains(&bytes),
        "{bytes} bytes in out/: {:?}",
        hits[0]
    );
}

#[test]
fn claude_code_told_to_write_a_gigabyte_stops_at_its_disk_quota() {
    real_cli_fills_the_disk(
        Cli::Claude,
        "claude_code_told_to_write_a_gigabyte_stops_at_its_disk_quota",
    );
}

#[test]
fn codex_told_to_write_a_gigabyte_stops_at_its_disk_quota() {
    real_cli_fills_the_disk(
        Cli::Codex,
        "codex_told_to_write_a_gigabyte_stops_at_its_disk_quota",
    );
}

#[test]
fn pi_told_to_write_a_gigabyte_stops_at_its_disk_quota() {
    real_cli_fills_the_disk(
        Cli::Pi,
        "pi_told_to_write_a_gigabyte_stops_at_its_disk_quota",
    );
}

#[test]
fn a_native_agent_writing_a_gigabyte_stops_at_the_hosts_agent_disk_quota() {
    if let Some(why) = native_unavailable() {
        metash_testkit::skip("native disk quota", &why);
        return;
    }
    let p = Project::new();
    let caps = ["files.read", "files.write", "process.spawn"];
    p.agent("native-q", "native", &native_agent_exe(), &caps);
    p.config("[host]\nagent_disk = \"20m\"\n");
    std::fs::write(
        p.path().join("fill.sh"),
        "mkdir -p out && i=0; while [ $i -lt 1024 ]; do head -c 1048576 /dev/zero > out/part$i \
         || exit 7; i=$((i+1)); done",
    )
    .unwrap();
    let host = p.host(&["native", "files.read", "files.write", "process.spawn"]);
    let r = host
        .spawn_agent(&SpawnRequest::new(
            "native-q",
            "be brief",
            "run /bin/sh fill.sh",
        ))
        .unwrap();
    assert_eq!(r.status, AgentStatus::Error, "{r:?}");
    assert!(r.data.contains("exceeded its disk limit"), "{}", r.data);
    let hits = watcher_events(&p);
    assert_eq!(hits.len(), 1, "{hits:?}");
    assert_eq!(hits[0]["max"], 20 * MIB);
    let started = p.log_data("agent_started");
    let limits = &started.last().expect("agent_started")["limits"];
    assert_eq!(limits["disk_bytes"]["value"], 20 * MIB, "{limits}");
    assert_eq!(limits["log_bytes"]["value"], 256u64 << 20, "{limits}");
    let (bytes, _) = usage(&p.path().join("out"));
    assert!((20 * MIB..512 * MIB).contains(&bytes), "{bytes}");
}

/// Answers every question waiting for a client with `allow once`, until `stop`.
fn answer_everything(ws: &Path, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<usize> {
    let store = metash_store::Store::open(ws).unwrap();
    std::thread::spawn(move || {
        let mut answered = 0;
        while !stop.load(Ordering::SeqCst) {
            for ask in metash_host::asks::pending(&store).unwrap_or_default() {
                if metash_host::asks::reply(
                    &store,
                    &ask.id,
                    metash_policy::Answer::AllowOnce,
                    "test",
                )
                .is_ok()
                {
                    answered += 1;
                }
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        answered
    })
}

#[test]
fn a_hundred_consent_questions_in_a_row_ask_at_most_the_rate() {
    if let Some(why) = native_unavailable() {
        metash_testkit::skip("consent flood", &why);
        return;
    }
    let p = Project::new();
    // A copy: other tests look for live processes of the test agent's own path.
    let exe = p.path().join("flood-agent");
    std::fs::copy(native_agent_exe(), &exe).unwrap();
    p.agent("native-c", "native", &exe, &["codegen"]);
    // Nobody at a terminal: questions wait for any client (a client answers them all here).
    p.config("[host]\nconsent_wait_seconds = 30\n");
    let host = Host::open(
        p.path(),
        HostOptions {
            terminal: Terminal::Silent,
            yes_to: vec!["native".parse().unwrap()],
            ..HostOptions::default()
        },
    )
    .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let client = answer_everything(p.path(), Arc::clone(&stop));
    let t = Instant::now();
    let r = host
        .spawn_agent(&SpawnRequest::new(
            "native-c",
            "be brief",
            "consents 100 codegen",
        ))
        .unwrap();
    stop.store(true, Ordering::SeqCst);
    let answered = client.join().unwrap();
    assert_eq!(r.status, AgentStatus::Success, "{r:?}");
    // The first ten were asked (and allowed by the client); the other ninety refused at once.
    assert_eq!(r.data, "consent_rate_limited:90 granted:10", "{r:?}");
    // Its questions, not the host's own at its start (`codegen` for the spawn, not counted).
    let mine = |kind: &str| -> Vec<serde_json::Value> {
        p.log_data(kind)
            .into_iter()
            .filter(|d| d["reason"].as_str().is_some_and(|r| r.starts_with("ask ")))
            .collect()
    };
    assert_eq!(mine("consent_request").len(), 10);
    assert_eq!(mine("consent_pending").len(), 10);
    assert_eq!(answered, 11, "its ten and the host's one at the start");
    let refused: Vec<_> = p
        .log_data("limit_exceeded")
        .into_iter()
        .filter(|d| d["limit"] == "consent_rate_limited")
        .collect();
    assert_eq!(refused.len(), 90);
    assert!(
        refused[0]["message"]
            .as_str()
            .unwrap()
            .contains("10 consent questions in the last minute"),
        "{:?}",
        refused[0]
    );
    assert!(t.elapsed() < Duration::from_secs(60), "{:?}", t.elapsed());
}
