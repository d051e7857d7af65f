//! `metash ui` over real HTTP on loopback: the security checks (each refuses what it is for), a
//! checkpoint answered from the UI exactly once and delivered to the next spawn, a revocation
//! from the ledger view, agent markup shown as text, and the live stream resuming after
//! `Last-Event-ID` with nothing missed and nothing twice.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use metash_protocol::LogKind;
use metash_store::Store;
use serde_json::json;

mod common;

use common::client::{read_events, request, Ui};

#[test]
fn every_check_refuses_what_it_is_for() {
    let ui = Ui::start();
    let a = ui.addr;
    let page = ui.get("/");
    assert_eq!(page.status, 200);
    assert!(page
        .head
        .contains("content-security-policy: default-src 'none'; script-src 'self'"));
    assert!(page.head.contains("x-frame-options: DENY"));
    let no_cookie = request(
        a,
        &format!("GET / HTTP/1.1\r\nHost: {a}\r\nConnection: close\r\n\r\n"),
    );
    assert_eq!(no_cookie.status, 401);
    let wrong_token = request(
        a,
        &format!("GET /login?token=guess HTTP/1.1\r\nHost: {a}\r\nConnection: close\r\n\r\n"),
    );
    assert_eq!(wrong_token.status, 401);
    assert!(!wrong_token.head.contains("set-cookie"));
    let rebinding = request(
        a,
        &format!(
            "GET / HTTP/1.1\r\nHost: evil.example:{}\r\nCookie: {}\r\nConnection: close\r\n\r\n",
            a.port(),
            ui.cookie
        ),
    );
    assert_eq!(rebinding.status, 421);
    let foreign = request(
        a,
        &format!(
            "GET / HTTP/1.1\r\nHost: {a}\r\nOrigin: http://evil.example\r\nCookie: {}\r\nConnection: close\r\n\r\n",
            ui.cookie
        ),
    );
    assert_eq!(foreign.status, 403);
    // A form post without the page's token, and one with a wrong token.
    let no_csrf = ui.post_form("/revoke", "agent=a&capability=network", "");
    assert_eq!(
        no_csrf.status, 422,
        "the form misses its csrf field: {}",
        no_csrf.body
    );
    let bad_csrf = ui.post_form("/revoke", "csrf=nope&agent=a&capability=network", "");
    assert_eq!(bad_csrf.status, 403);
    let json_post = request(
        a,
        &format!(
            "POST /revoke HTTP/1.1\r\nHost: {a}\r\nCookie: {}\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{{}}",
            ui.cookie
        ),
    );
    assert_eq!(json_post.status, 403, "no CSRF header");
}

#[test]
fn a_checkpoint_is_answered_from_the_page_once_and_reaches_the_next_spawn() {
    let ui = Ui::start();
    let store = ui.store();
    let signal = common::checkpoint("Which language? <b>pick</b>", &["french", "german"]);
    let pending = metash_host::checkpoint::raise(&store, "planner", &signal).unwrap();
    let page = ui.get("/");
    assert!(
        page.body.contains("<title>(needs you) metash: run</title>"),
        "{}",
        page.body
    );
    assert!(page
        .body
        .contains("Which language? &lt;b&gt;pick&lt;/b&gt;"));
    assert!(page.body.contains("value=\"german\""));
    let form = format!("csrf={}&id={}&answer=german", ui.csrf, pending.id);
    assert_eq!(ui.post_form("/checkpoint", &form, "").status, 303);
    // Answered once: a second answer (another tab, or a terminal first) is refused.
    let again = ui.post_form("/checkpoint", &form, "");
    assert_eq!(again.status, 409, "{}", again.body);
    let resume = metash_host::checkpoint::take_resume(&store, "planner").unwrap();
    assert_eq!(resume.map(|r| r.user_input), Some("german".to_string()));
    assert_eq!(
        metash_host::checkpoint::take_resume(&store, "planner").unwrap(),
        None
    );
    assert!(!ui.get("/").body.contains("(needs you)"));
}

#[test]
fn a_grant_is_revoked_from_the_ledger_view() {
    let ui = Ui::start();
    let dir = ui.root.join(".meta/agents/fetcher");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("manifest.toml"),
        "schema_version = \"0.1\"\nname = \"fetcher\"\nversion = \"0.1.0\"\nentry = \"f.wasm\"\n\
         sandbox = \"wasm\"\ncapabilities = [\"network:api.example.com\"]\n",
    )
    .unwrap();
    let registry =
        metash_policy::Registry::discover(&metash_policy::AgentDirs::new(&ui.root, None));
    let policy = metash_policy::Policy::new(ui.store(), registry);
    let cap = "network:api.example.com".parse().unwrap();
    policy.grant("fetcher", &cap, 600, false, "test").unwrap();
    let ledger = ui.get("/ledger");
    assert!(
        ledger.body.contains("hash chain: verified"),
        "{}",
        ledger.body
    );
    assert!(ledger.body.contains("action=\"revoke\""));
    let form = format!(
        "csrf={}&agent=fetcher&capability=network%3Aapi.example.com",
        ui.csrf
    );
    assert_eq!(ui.post_form("/revoke", &form, "").status, 303);
    let live: Vec<_> = policy
        .grants()
        .unwrap()
        .into_iter()
        .filter(|(_, l)| *l)
        .collect();
    assert!(live.is_empty(), "{live:?}");
    let after = ui.get("/ledger");
    assert!(after.body.contains("revoked"));
    let export = ui.get("/ledger/export");
    assert_eq!(export.status, 200);
    assert!(export.body.contains("consent_revoked") || export.body.contains("revok"));
}

#[test]
fn markup_from_an_agent_or_a_plan_is_text() {
    let ui = Ui::start();
    let store = ui.store();
    store
        .update_state(
            "plan",
            json!({"currentTaskIdx": 0, "tasks": [{"id": "t1", "title": "<script>alert(1)</script>", "status": "pending"}]}),
        )
        .unwrap();
    let page = ui.get("/");
    assert!(page.body.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
    assert_eq!(
        page.body.matches("<script").count(),
        2,
        "only the page's own scripts"
    );
    assert_eq!(
        page.body.matches("<script src=\"assets/").count(),
        2,
        "both from this origin"
    );
}

#[test]
fn the_live_stream_resumes_after_the_last_event_with_nothing_missed_or_twice() {
    let ui = Ui::start();
    let store = ui.store();
    let first = store.log().tail().unwrap().seq;
    for i in 0..5 {
        store
            .append(
                LogKind::Progress,
                Some("a"),
                json!({"message": format!("m{i}")}),
            )
            .unwrap();
    }
    let all = read_events(&ui, None, (first + 5) as usize);
    let ids: Vec<u64> = all.iter().map(|(id, _)| *id).collect();
    assert_eq!(ids, (1..=first + 5).collect::<Vec<_>>());
    // A reconnect after the third progress record gets the rest, then what is appended later.
    let cut = first + 3;
    let writer = {
        let root = ui.root.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            let s = Store::open(&root).unwrap();
            s.append(LogKind::Progress, Some("a"), json!({"message": "later"}))
                .unwrap();
        })
    };
    let rest = read_events(&ui, Some(cut), 3);
    writer.join().unwrap();
    let ids: Vec<u64> = rest.iter().map(|(id, _)| *id).collect();
    assert_eq!(ids, vec![cut + 1, cut + 2, cut + 3]);
    assert_eq!(rest[2].1["data"]["message"], "later");
    assert_eq!(rest[0].1["data"]["message"], "m3");
}

#[test]
fn secrets_in_the_stream_are_redacted() {
    let ui = Ui::start();
    let store = ui.store();
    let secret = "sk-ant-api03-AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";
    store
        .append(
            LogKind::Progress,
            Some("a"),
            json!({"message": format!("key {secret}")}),
        )
        .unwrap();
    let n = store.log().tail().unwrap().seq as usize;
    let evs = read_events(&ui, Some(n as u64 - 1), 1);
    let text = evs[0].1.to_string();
    assert!(!text.contains(secret), "{text}");
    assert!(text.contains("key "), "{text}");
}

#[test]
fn a_waiting_consent_question_is_answered_from_the_page_once() {
    let ui = Ui::start();
    let store = ui.store();
    let q = metash_policy::ConsentQuestion::new(
        "fetcher",
        "network:api.example.com".parse().unwrap(),
        "fetch <the> docs",
        Some(120),
    );
    let id = metash_host::asks::post(&store, &q, Duration::from_secs(60)).unwrap();
    let page = ui.get("/");
    assert!(page.body.contains("<title>(needs you) metash: run</title>"));
    assert!(page.body.contains("fetch &lt;the&gt; docs"));
    assert!(page.body.contains("network:api.example.com"));
    let bad = ui.post_form(
        "/consent",
        &format!("csrf={}&id={id}&answer=for&seconds=0", ui.csrf),
        "",
    );
    assert_eq!(bad.status, 400, "{}", bad.body);
    let form = format!("csrf={}&id={id}&answer=for&seconds=45", ui.csrf);
    assert_eq!(ui.post_form("/consent", &form, "").status, 303);
    assert_eq!(
        ui.post_form("/consent", &form, "").status,
        409,
        "answered once"
    );
    assert!(metash_host::asks::pending(&store).unwrap().is_empty());
    let replied = common::replies(&store);
    assert_eq!(replied.len(), 1);
    assert_eq!(replied[0].data["answer"], "allow_for");
    assert_eq!(replied[0].data["duration_s"], 45);
    assert_eq!(replied[0].data["by"], "ui");
    assert!(!ui.get("/").body.contains("(needs you)"));
}
