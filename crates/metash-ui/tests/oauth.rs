//! An OAuth token in `metash ui`'s payloads: none. A person's login (a real OIDC server,
//! Chromium as the person), a handle used through the credential proxy, then the login expiring
//! behind it (a checkpoint, and `[ui] notify_command` run for it): the token appears in no page,
//! no live-stream event, no ledger export and no notification.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use metash_auth::broker::Login;
use metash_auth::flow::Opener;
use metash_auth::{Broker, KeyOptions, Secret, Vault};
use metash_host::{Host, HostOptions, Terminal};
use metash_testkit::oidc::{browser, prerequisites, Oidc};

mod common;

const PASSPHRASE: &str = "the ui oauth test's passphrase";

/// How long access and refresh tokens live (seconds): long enough for the setup between the
/// login and the handle's first use (the UI, the vault's key derivation...) on a loaded machine.
const LIFETIME: u32 = 15;

/// A loopback API answering `200 api ok`.
fn api() -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for mut conn in listener.incoming().flatten() {
            let mut buf = [0u8; 8192];
            let _ = conn.read(&mut buf);
            let _ = conn.write_all(
                b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\nConnection: close\r\n\r\napi ok",
            );
        }
    });
    addr
}

fn get_through(base: &str, path: &str) -> String {
    let addr = base
        .trim_start_matches("http://")
        .split('/')
        .next()
        .unwrap()
        .to_string();
    let prefix = base.split_once(addr.as_str()).unwrap().1.to_string();
    let mut s = TcpStream::connect(&addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        s,
        "GET {prefix}{path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

/// The server, a project naming it (with `[ui] notify_command` writing to `notified`), and the
/// person logged in; the token the vault holds.
struct Setup {
    _server: Oidc,
    dir: tempfile::TempDir,
    root: std::path::PathBuf,
    home: std::path::PathBuf,
    notified: std::path::PathBuf,
    token: String,
}

fn setup(tools: &std::path::Path, chromium: &std::path::Path) -> Setup {
    // Access and refresh tokens live `LIFETIME`: the login expires behind the handle.
    let server = Oidc::start(tools, LIFETIME, LIFETIME);
    let api_addr = api();
    let dir = tempfile::tempdir().unwrap();
    let (root, home) = (dir.path().join("ws"), dir.path().join("home"));
    std::fs::create_dir_all(&root).unwrap();
    metash_store::Store::init(&root, None).unwrap();
    let notified = dir.path().join("notified.jsonl");
    let script = dir.path().join("notify.sh");
    std::fs::write(
        &script,
        format!("#!/bin/sh\ncat >> '{}'\n", notified.display()),
    )
    .unwrap();
    let config = server
        .provider_toml()
        .replace("http://127.0.0.1:9/", &format!("http://{api_addr}/"))
        + &format!(
            "[ui]\nnotify_command = [\"/bin/sh\", \"{}\"]\n",
            script.display()
        );
    std::fs::write(root.join(".meta/config.toml"), config).unwrap();
    let agent_dir = root.join(".meta/agents/fetcher");
    std::fs::create_dir_all(&agent_dir).unwrap();
    std::fs::write(
        agent_dir.join("manifest.toml"),
        "schema_version = \"0.1\"\nname = \"fetcher\"\nversion = \"0.1.0\"\nentry = \"a.wasm\"\n\
         sandbox = \"wasm\"\ncapabilities = [\"oauth:test.repo\"]\n",
    )
    .unwrap();

    let keys = KeyOptions {
        passphrase: Some(Secret::new(PASSPHRASE)),
        keychain: metash_auth::KeychainChoice::Off,
    };
    let broker = Broker::new(&root, &Vault::default_path(&home), keys).unwrap();
    let how = Login {
        scopes: None,
        device: true,
        opener: Opener {
            open_browser: true,
            browser: Some(browser(dir.path(), tools, chromium)),
            say: Box::new(|_| {}),
        },
    };
    broker.login("test", &how).unwrap();
    let token = broker.access_token("test").unwrap().expose().to_string();

    Setup {
        _server: server,
        dir,
        root,
        home,
        notified,
        token,
    }
}

#[test]
fn no_oauth_token_reaches_a_page_an_event_an_export_or_a_notification() {
    let (tools, chromium) = match prerequisites() {
        Ok(p) => p,
        Err(why) => return metash_testkit::skip("ui oauth test", &why),
    };
    let Setup {
        _server,
        dir: _dir,
        root,
        home,
        notified,
        token,
    } = setup(&tools, &chromium);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let served = rt
        .block_on(metash_ui::serve(&root, &metash_ui::UiOptions::default()))
        .unwrap();
    let host = Host::open(
        &root,
        HostOptions {
            terminal: Terminal::Silent,
            config_home: Some(home.clone()),
            env: [(
                "METASH_VAULT_PASSPHRASE".to_string(),
                PASSPHRASE.to_string(),
            )]
            .into_iter()
            .collect(),
            ..HostOptions::default()
        },
    )
    .unwrap();
    let cap: metash_policy::Capability = "oauth:test.repo".parse().unwrap();
    let registry = metash_policy::Registry::discover(&metash_policy::AgentDirs::new(&root, None));
    metash_policy::Policy::new(host.store().clone(), registry)
        .grant("fetcher", &cap, 600, false, "test")
        .unwrap();
    let handles = metash_host::oauth::start(&host, "fetcher", std::slice::from_ref(&cap))
        .unwrap()
        .unwrap();
    let base = handles.handles[0].base_url.clone();
    assert!(get_through(&base, "/repos").contains("api ok"));
    // The login expires behind the handle: a checkpoint, and the notifier runs for it. Every
    // token the vault holds was granted by now (at the login, or by a refresh during that use),
    // so all have expired a `LIFETIME` later. A sleep, not a poll: each use through the handle
    // in a token's second half-life refreshes it, and the rotated refresh token lives anew.
    std::thread::sleep(Duration::from_secs(u64::from(LIFETIME) + 1));
    assert!(!get_through(&base, "/repos").contains("api ok"));
    let until = Instant::now() + Duration::from_secs(10);
    while Instant::now() < until && !std::fs::read_to_string(&notified).is_ok_and(|s| !s.is_empty())
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    let notification = std::fs::read_to_string(&notified).unwrap();
    assert!(notification.contains("metash-oauth-test"), "{notification}");

    // Every payload the UI serves.
    let addr = served.addr;
    let cookie = common::client::login(addr, &served.url);
    let get = |path: &str| {
        common::client::request(
            addr,
            &format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nCookie: {cookie}\r\nConnection: close\r\n\r\n"),
        )
        .body
    };
    let mut payloads = vec![
        get("/"),
        get("/ledger"),
        get("/ledger/export"),
        notification,
    ];
    handles.flush();
    let last = host.store().log().tail().unwrap().seq;
    let events: Vec<String> = common::client::read_events_at(addr, &cookie, Some(0), last as usize)
        .into_iter()
        .map(|(_, v)| v.to_string())
        .collect();
    assert!(
        events.iter().any(|e| e.contains("oauth_use")),
        "the stream carries the ledger entries"
    );
    payloads.extend(events);
    for p in &payloads {
        assert!(
            !p.contains(&token),
            "a token in a payload: {}",
            &p[..p.len().min(200)]
        );
    }
    drop(handles);
    rt.block_on(served.stop());
}
