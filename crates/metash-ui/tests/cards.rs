//! The cards' server side over real HTTP: artifacts previewed only for an agent holding
//! `media.preview` (and never as active content), a task's diff with line comments that reach
//! the agent, the budget checkpoint as its own card, `[ui] notify_command`, and a live stream
//! that ends on time so the browser resumes it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use metash_protocol::LogKind;
use serde_json::json;

mod common;

use common::client::Ui;
use common::git;

fn policy(ui: &Ui) -> metash_policy::Policy {
    let registry =
        metash_policy::Registry::discover(&metash_policy::AgentDirs::new(&ui.root, None));
    metash_policy::Policy::new(ui.store(), registry)
}

fn register(ui: &Ui, name: &str, caps: &[&str]) {
    let dir = ui.root.join(".meta/agents").join(name);
    std::fs::create_dir_all(&dir).unwrap();
    let caps: Vec<String> = caps.iter().map(|c| format!("{c:?}")).collect();
    std::fs::write(
        dir.join("manifest.toml"),
        format!(
            "schema_version = \"0.1\"\nname = \"{name}\"\nversion = \"0.1.0\"\nentry = \"a.wasm\"\n\
             sandbox = \"wasm\"\ncapabilities = [{}]\n",
            caps.join(", ")
        ),
    )
    .unwrap();
}

#[test]
fn artifacts_are_previewed_only_for_an_agent_holding_media_preview() {
    let ui = Ui::start();
    let store = ui.store();
    register(&ui, "painter", &["media.preview"]);
    register(&ui, "sketcher", &[]);
    let png = b"\x89PNG\r\n\x1a\nnot really, but typed by name";
    let arts = store.artifacts();
    arts.put("a.png", png, Some("painter")).unwrap();
    arts.put("b.png", png, Some("sketcher")).unwrap();
    arts.put("page.html", b"<script>alert(1)</script>", Some("painter"))
        .unwrap();
    // No grant yet: nothing is served.
    assert_eq!(ui.get("/artifact/a.png").status, 403);
    let info = ui.get("/preview/a.png");
    assert!(
        info.body.contains("does not hold media.preview"),
        "{}",
        info.body
    );
    policy(&ui)
        .grant(
            "painter",
            &"media.preview".parse().unwrap(),
            600,
            false,
            "test",
        )
        .unwrap();
    let a = ui.get("/artifact/a.png");
    assert_eq!(a.status, 200, "{}", a.head);
    let head = a.head.to_ascii_lowercase();
    assert!(head.contains("content-type: image/png"), "{head}");
    assert!(head.contains("x-content-type-options: nosniff"), "{head}");
    assert!(head.contains("sandbox"), "the artifact's own CSP: {head}");
    assert!(a.body.starts_with("\u{89}PNG") || a.body.contains("PNG"));
    // Another agent's image, HTML from the granted agent, and names that leave the directory.
    assert_eq!(ui.get("/artifact/b.png").status, 403);
    let html = ui.get("/artifact/page.html");
    assert_eq!(html.status, 403);
    assert!(
        html.body.contains("only images and videos"),
        "{}",
        html.body
    );
    for bad in ["..%2Fconfig.toml", ".hidden.png", "%2Fetc%2Fpasswd"] {
        assert_eq!(ui.get(&format!("/artifact/{bad}")).status, 403, "{bad}");
    }
    // Revoked: the next view is refused.
    policy(&ui)
        .revoke("painter", &"media.preview".parse().unwrap(), "test")
        .unwrap();
    assert_eq!(ui.get("/artifact/a.png").status, 403);
}

/// A completed task's diff (from its commits) is shown, escaped; a comment on a line is stored
/// once, waits for the agent, and a bad one is refused with the reason.
#[test]
fn a_completed_tasks_diff_is_shown_and_commented_on() {
    let ui = Ui::start();
    let store = ui.store();
    let root = &ui.root;
    git(root, &["init", "-q", "-b", "main"]);
    std::fs::write(root.join(".gitignore"), ".meta/\n").unwrap();
    std::fs::write(root.join("a.txt"), "one\ntwo\n").unwrap();
    git(root, &["add", "-A"]);
    git(root, &["commit", "-q", "-m", "base"]);
    std::fs::write(root.join("a.txt"), "one\n<two>\nthree\n").unwrap();
    git(root, &["commit", "-q", "-am", "task"]);
    let sha = git(root, &["rev-parse", "HEAD"]);
    store
        .update_state(
            "plan",
            json!({"currentTaskIdx": 1, "tasks": [
                {"id": "t1", "title": "edit a", "status": "complete", "commits": [sha]}]}),
        )
        .unwrap();
    let page = ui.get("/diff?task=t1");
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(page.body.contains("data-file=\"a.txt\""), "{}", page.body);
    assert!(page.body.contains("&lt;two&gt;"), "escaped: {}", page.body);
    assert!(!page.body.contains("<two>"));
    assert!(
        page.body.contains("data-line=\"3\""),
        "line 3 is commentable"
    );
    assert_eq!(ui.get("/diff?task=nope").status, 404);

    let form = |line: &str, text: &str| {
        format!(
            "csrf={}&task=t1&file=a.txt&line={line}&text={text}",
            ui.csrf
        )
    };
    let r = ui.post_form("/comment", &form("3", "say+three+twice"), "");
    assert_eq!(r.status, 303, "{}", r.body);
    for (line, text, why) in [("x", "hi", "whole number"), ("3", "", "1 to 4000 bytes")] {
        let r = ui.post_form("/comment", &form(line, text), "");
        assert_eq!(r.status, 400, "{line} {text}");
        assert!(r.body.contains(why), "{}", r.body);
    }
    let r = ui.post_form(
        "/comment",
        &format!("csrf={}&task=t1&file=..%2Fx&line=1&text=hi", ui.csrf),
        "",
    );
    assert_eq!(r.status, 400, "a path outside the repository");
    let r = ui.post_form(
        "/comment",
        "csrf=wrong&task=t1&file=a.txt&line=1&text=hi",
        "",
    );
    assert_eq!(r.status, 403, "no CSRF token, no comment");
    let waiting = metash_orchestrator::review::waiting(&store, "t1").unwrap();
    assert_eq!(waiting.len(), 1);
    assert_eq!(
        waiting[0].as_finding(),
        "review comment on a.txt:3: say three twice"
    );
    let page = ui.get("/diff?task=t1");
    assert!(page.body.contains("say three twice"));
    assert!(page.body.contains("waiting for the task's next step"));
    let run = ui.get("/");
    assert!(
        run.body.contains("1 comment(s) waiting"),
        "the run view says so"
    );
    // Taken once, by the executor: then it says where it went.
    let taken = metash_orchestrator::review::take(&store, "t1", "executor").unwrap();
    assert_eq!(taken.len(), 1);
    assert!(metash_orchestrator::review::take(&store, "t1", "executor")
        .unwrap()
        .is_empty());
    assert!(ui
        .get("/diff?task=t1")
        .body
        .contains("delivered to the executor"));
}

#[test]
fn the_budget_checkpoint_is_its_own_card() {
    let ui = Ui::start();
    std::fs::write(
        ui.root.join(".meta/config.toml"),
        "[budget]\nmax_tokens = 1000\nmax_cost_usd = 5.0\n",
    )
    .unwrap();
    metash_host::budget::charge(&ui.store(), "w", 250, Some(2.0)).unwrap();
    let page = ui.get("/");
    assert!(
        page.body
            .contains("tokens 250 of 1000 · cost $2.0000 of $5.00"),
        "{}",
        page.body
    );
    assert!(
        page.body.contains("fill p40"),
        "the bar follows the nearer limit (cost, 40%)"
    );
    let signal = metash_protocol::CheckpointSignal {
        kind: Default::default(),
        reason: metash_protocol::CheckpointReason::DecisionRequired,
        message: "Spawning `w` would exceed the run budget".into(),
        options: vec!["continue".into(), "stop".into()],
        resume_id: Some(metash_host::checkpoint::BUDGET_CHECKPOINT.into()),
    };
    metash_host::checkpoint::raise(&ui.store(), "w", &signal).unwrap();
    let page = ui.get("/");
    assert!(page.body.contains("budget-out"), "{}", page.body);
    assert!(page.body.contains("budget exhausted: 250 of 1000 tokens"));
    assert!(page.body.contains("value=\"continue\""));
    assert!(page.body.contains("<title>(needs you)"));
}

/// `[ui] notify_command` runs once per new thing waiting on a person, with the event (redacted)
/// on stdin; a wrong `[ui]` stops the start with the file named.
#[test]
fn needs_you_runs_the_notify_command_once_per_question() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    metash_store::Store::init(&root, None).unwrap();
    let out = root.join("notified.jsonl");
    let script = root.join("notify.sh");
    std::fs::write(&script, format!("#!/bin/sh\ncat >> '{}'\n", out.display())).unwrap();
    std::fs::write(
        root.join(".meta/config.toml"),
        format!(
            "[ui]\nnotify_command = [\"/bin/sh\", \"{}\"]\n",
            script.display()
        ),
    )
    .unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let served = rt
        .block_on(metash_ui::serve(&root, &metash_ui::UiOptions::default()))
        .unwrap();
    let store = metash_store::Store::open(&root).unwrap();
    let planted = "sk-ant-api03-PLANTEDplantedPLANTEDplanted0123456789";
    let q = metash_policy::ConsentQuestion::new(
        "fetcher",
        "network:api.example.com".parse().unwrap(),
        &format!("use key {planted}"),
        Some(60),
    );
    metash_host::asks::post(&store, &q, Duration::from_secs(60)).unwrap();
    // More records that change nothing waiting: no second notification.
    for i in 0..5 {
        store
            .append(
                LogKind::Progress,
                None,
                json!({"message": format!("tick {i}")}),
            )
            .unwrap();
    }
    let until = Instant::now() + Duration::from_secs(10);
    while Instant::now() < until
        && !std::fs::read_to_string(&out).is_ok_and(|s| s.lines().count() >= 1)
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(600));
    rt.block_on(served.stop());
    let got = std::fs::read_to_string(&out).unwrap();
    assert_eq!(got.lines().count(), 1, "{got}");
    let ev: serde_json::Value = serde_json::from_str(got.lines().next().unwrap()).unwrap();
    assert_eq!(ev["kind"], "consent");
    assert_eq!(ev["agent"], "fetcher");
    assert_eq!(ev["capability"], "network:api.example.com");
    assert!(!got.contains(planted), "the token is redacted: {got}");

    std::fs::write(
        root.join(".meta/config.toml"),
        "[ui]\nnotify_comand = [\"x\"]\n",
    )
    .unwrap();
    let err = match rt.block_on(metash_ui::serve(&root, &metash_ui::UiOptions::default())) {
        Ok(_) => panic!("a misspelt [ui] key is refused"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("config.toml") && err.contains("notify_comand"),
        "{err}"
    );
}

/// A stream ends after `stream_seconds` and tells the browser to come back soon (`retry`).
#[test]
fn a_stream_ends_on_time_and_asks_for_a_quick_reconnect() {
    let ui = Ui::start_with(&metash_ui::UiOptions {
        stream_seconds: Some(1),
        ..metash_ui::UiOptions::default()
    });
    ui.store()
        .append(LogKind::Progress, None, json!({"message": "hello"}))
        .unwrap();
    let mut s = TcpStream::connect(ui.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET /events HTTP/1.1\r\nHost: {}\r\nCookie: {}\r\nConnection: close\r\n\r\n",
        ui.addr, ui.cookie
    )
    .unwrap();
    let t = Instant::now();
    let mut body = String::new();
    s.read_to_string(&mut body).unwrap();
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(5),
        "{took:?}"
    );
    assert!(body.contains("retry: 250"), "{body}");
    assert!(body.contains("\"hello\""), "{body}");
}
