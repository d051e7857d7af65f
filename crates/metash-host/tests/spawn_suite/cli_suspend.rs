//! Suspend and resume reach a coding CLI run as a role (issue 18, seed 002 §3): mid-turn, while
//! its shell tool runs, a request from another process (what `metash agent suspend` does) stops
//! the CLI's process group; resumed, the turn completes.

use std::time::{Duration, Instant};

use metash_host::control::Want;
use metash_host::{SpawnRequest, Spawner};
use metash_protocol::AgentStatus;
use metash_testkit::anthropic::ModelServer;
use metash_testkit::cli::Cli;
use metash_testkit::procs::state;

use super::common::{ask_control, Project};

#[test]
fn claude_code_is_suspended_mid_turn_and_resumed() {
    let cli = Cli::Claude;
    let Some(tools) =
        super::common::cli_ready(cli, "claude_code_is_suspended_mid_turn_and_resumed")
    else {
        return;
    };
    let p = Project::new();
    let server = ModelServer::start(move |c| {
        let body = c.text();
        match cli.results(&body) {
            0 => cli.shell(0, &body, "sleep 2; echo done > done.txt"),
            _ => cli.text("finished"),
        }
    });
    std::os::unix::fs::symlink(&tools, p.path().join(".tools")).expect("link .tools");
    p.config(&cli.role("coder", &server.base));
    let host = super::cli_sandbox::cli_host(&p);
    let ws = p.path().to_path_buf();
    std::thread::scope(|s| {
        let run = s.spawn(|| {
            let mut req = SpawnRequest::new("coder", "You are a test.", "Do the thing.");
            req.options.timeout_seconds = Some(120.0);
            host.spawn_agent(&req).expect("spawn")
        });
        let until = Instant::now() + Duration::from_secs(60);
        while server.posts().is_empty() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(300));
        assert!(ask_control(&ws, "coder", Want::Suspended), "suspended");
        // The answer comes first; the event itself is written with the host's next batch.
        let store = metash_store::Store::open(&ws).expect("store");
        let until = Instant::now() + Duration::from_secs(5);
        let suspended =
            loop {
                let found =
                    store.log().read_all().expect("log").into_iter().find(|r| {
                        r.kind == "agent_suspended" && r.agent.as_deref() == Some("coder")
                    });
                match found {
                    Some(r) => break r,
                    None if Instant::now() < until => std::thread::sleep(Duration::from_millis(20)),
                    None => {
                        ask_control(&ws, "coder", Want::Active);
                        panic!("no agent_suspended event");
                    }
                }
            };
        let pgid = suspended.data["pgid"]
            .as_i64()
            .and_then(|g| i32::try_from(g).ok())
            .expect("the CLI's group");
        // `SIGSTOP` is sent by then, but the CLI stops only once the kernel runs it again.
        if !within(Duration::from_secs(10), || state(pgid) == 'T') {
            ask_control(&ws, "coder", Want::Active);
            panic!("the CLI is not stopped: state {}", state(pgid));
        }
        std::thread::sleep(Duration::from_secs(1));
        let asked = server.posts().len();
        assert!(ask_control(&ws, "coder", Want::Active), "resumed");
        assert!(
            within(Duration::from_secs(10), || state(pgid) != 'T'),
            "the CLI goes on"
        );
        let r = run.join().expect("spawn thread");
        assert_eq!(r.status, AgentStatus::Success, "{r:?}");
        assert!(r.data.contains("finished"), "{}", r.data);
        assert!(server.posts().len() > asked, "it went on after the resume");
    });
    assert!(p.path().join("done.txt").exists());
}

/// Whether `f` holds within `limit` (polled every 20 ms).
fn within(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let until = Instant::now() + limit;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= until {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
