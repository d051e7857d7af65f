//! `metash ui --under DIR`: every project in DIR and one level below on one server, an index
//! that says which wait on a person, and each project's views and answers under `/p/NAME`, with
//! one login and the same checks.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;

mod common;

use common::client::{request, Reply};

fn get(addr: SocketAddr, cookie: &str, path: &str) -> Reply {
    request(
        addr,
        &format!(
            "GET {path} HTTP/1.1\r\nHost: {addr}\r\nCookie: {cookie}\r\nConnection: close\r\n\r\n"
        ),
    )
}

#[test]
fn every_project_under_a_directory_is_served_with_its_own_views() {
    let (_dir, top, cp) = common::two_projects();
    std::fs::create_dir_all(top.join("notes/deep/deeper")).unwrap();
    std::fs::create_dir_all(top.join("node_modules/x/.meta")).unwrap();
    let beta = metash_store::Store::open(&top.join("team/beta")).unwrap();

    let rt = tokio::runtime::Runtime::new().unwrap();
    let served = rt
        .block_on(metash_ui::serve_under(
            &top,
            &metash_ui::UiOptions::default(),
        ))
        .unwrap();
    let addr = served.addr;
    // Nothing without the session, the projects' pages included.
    assert_eq!(get(addr, "", "/").status, 401);
    assert_eq!(get(addr, "", "/p/alpha/").status, 401);
    let cookie = common::client::login(addr, &served.url);

    let index = get(addr, &cookie, "/");
    assert_eq!(index.status, 200, "{}", index.body);
    assert!(index.body.contains("href=\"/p/alpha/\""), "{}", index.body);
    assert!(
        index.body.contains("href=\"/p/team/beta/\""),
        "{}",
        index.body
    );
    assert_eq!(
        index.body.matches("href=\"/p/").count(),
        2,
        "two projects: {}",
        index.body
    );
    assert!(index.body.contains("<title>(needs you)"), "beta waits");

    let page = get(addr, &cookie, "/p/team/beta/");
    assert_eq!(page.status, 200);
    assert!(page.body.contains("<base href=\"/p/team/beta/\">"));
    assert!(page.body.contains("Deploy beta?"));
    assert!(!get(addr, &cookie, "/p/alpha/")
        .body
        .contains("Deploy beta?"));
    let csrf = common::client::csrf_of(&page.body);
    let form = format!("csrf={csrf}&id={}&answer=yes", cp.id);
    let answered = request(
        addr,
        &format!(
            "POST /p/team/beta/checkpoint HTTP/1.1\r\nHost: {addr}\r\nCookie: {cookie}\r\n\
             Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\
             Connection: close\r\n\r\n{form}",
            form.len()
        ),
    );
    assert_eq!(answered.status, 303, "{}", answered.body);
    assert!(
        answered
            .head
            .to_ascii_lowercase()
            .contains("location: /p/team/beta/"),
        "{}",
        answered.head
    );
    assert!(beta.state().unwrap().pending_checkpoint.is_none());
    assert!(!get(addr, &cookie, "/").body.contains("(needs you)"));
    assert_eq!(get(addr, &cookie, "/p/nope/").status, 404);
    assert_eq!(get(addr, &cookie, "/p/alpha/ledger").status, 200);
    rt.block_on(served.stop());
}
