//! The sessions page (issue 35 item 4): live and past interactive sessions with their status; a
//! record that claims to run but whose process is gone is shown (and recorded) `exited`, never
//! `running`; what a session's record holds is shown as text.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use metash_protocol::{HarnessFrontend, ProviderDomain};
use metash_store::cp_sessions::{CpSession, ProcessRef, SessionStatus};

mod common;

use common::client::Ui;

fn session(id: &str, status: SessionStatus, process: Option<ProcessRef>) -> CpSession {
    let now = chrono::Utc::now();
    CpSession {
        id: id.into(),
        role: Some("<b>coder</b>".into()),
        frontend: HarnessFrontend::CodexCli,
        provider: ProviderDomain::Openai,
        continuation_key: Some(format!("key-of-{id}")),
        workdir: "/w".into(),
        home: None,
        terminal: None,
        process,
        status,
        created_at: now,
        updated_at: now,
        exit_status: None,
        error: None,
        runs: 1,
    }
}

#[test]
fn live_and_past_sessions_are_listed_and_a_dead_one_is_never_running() {
    let ui = Ui::start();
    let store = ui.store();
    let live = metash_host::session_liveness::process_ref(std::process::id());
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = metash_host::session_liveness::process_ref(child.id());
    child.wait().unwrap();
    let s = store.cp_sessions();
    s.create(&session("s-live", SessionStatus::Running, Some(live)))
        .unwrap();
    s.create(&session("s-dead", SessionStatus::Running, Some(dead)))
        .unwrap();
    s.create(&session("s-ended", SessionStatus::Ended, None))
        .unwrap();
    let page = ui.get("/sessions");
    assert_eq!(page.status, 200, "{}", page.body);
    let row = |id: &str| {
        page.body
            .split("<tr")
            .find(|r| r.contains(id))
            .unwrap_or_else(|| panic!("no row for {id}: {}", page.body))
            .to_string()
    };
    assert!(
        row("s-live").contains("class=\"running\""),
        "{}",
        row("s-live")
    );
    assert!(row("s-live").contains("key-of-s-live"));
    assert!(
        row("s-dead").contains("class=\"exited\""),
        "{}",
        row("s-dead")
    );
    assert!(row("s-dead").contains("is gone"), "{}", row("s-dead"));
    assert!(row("s-ended").contains("class=\"ended\""));
    assert!(page.body.contains("&lt;b&gt;coder&lt;/b&gt;"));
    assert!(!page.body.contains("<b>coder</b>"));
    // The page's reading was recorded: the dead session is exited in the store too.
    assert_eq!(
        s.get("s-dead").unwrap().unwrap().status,
        SessionStatus::Exited
    );
    assert!(ui.get("/").body.contains("href=\"sessions\""));
}
