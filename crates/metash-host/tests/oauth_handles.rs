//! OAuth handles: an agent holding `oauth:test.repo` gets a base URL on a credential proxy, and
//! a loopback "API" sees the person's real token (logged in against a real OIDC server,
//! `oidc-provider`, with Chromium as the person); whatever auth the agent sends is replaced;
//! another path or another host is refused; a revoked grant stops the next request; no token is
//! ever in the log. (Wiring the handles into a spawned agent's sandbox is not built yet.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use metash_auth::broker::Login;
use metash_auth::flow::Opener;
use metash_auth::{Broker, KeyOptions, Secret, Vault};
use metash_host::{Host, HostOptions, Terminal};
use metash_testkit::oidc::{browser, prerequisites, Oidc};

const PASSPHRASE: &str = "the handles test's passphrase";

/// What the API saw: each request's path and Authorization.
type Seen = Arc<Mutex<Vec<(String, String)>>>;

/// A loopback API: answers `200 api ok` and records each request's path and Authorization.
fn api() -> (SocketAddr, Seen) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&seen);
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let mut conn = conn;
            let mut buf = vec![0u8; 16384];
            let n = conn.read(&mut buf).unwrap_or(0);
            let head = String::from_utf8_lossy(&buf[..n]).into_owned();
            let path = head
                .split_whitespace()
                .nth(1)
                .unwrap_or_default()
                .to_string();
            let auth = head
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("authorization")
                        .then(|| v.trim().to_string())
                })
                .unwrap_or_default();
            sink.lock().unwrap().push((path, auth));
            let _ = conn.write_all(
                b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\nConnection: close\r\n\r\napi ok",
            );
        }
    });
    (addr, seen)
}

/// One HTTP/1.1 request to the proxy; (status, body).
fn get(proxy: &str, target: &str, auth: &str) -> (u16, String) {
    let addr = proxy
        .trim_start_matches("http://")
        .split('/')
        .next()
        .unwrap()
        .to_string();
    let mut s = TcpStream::connect(&addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        s,
        "GET {target} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: {auth}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let status = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

fn keys() -> KeyOptions {
    KeyOptions {
        passphrase: Some(Secret::new(PASSPHRASE)),
        no_keychain: true,
    }
}

#[test]
fn a_handle_adds_the_real_token_for_its_api_only_while_the_grant_is_live() {
    let (tools, chromium) = match prerequisites() {
        Ok(p) => p,
        Err(why) => return metash_testkit::skip("oauth handles test", &why),
    };
    let server = Oidc::start(&tools, 600, 3600);
    let (api_addr, seen) = api();
    let dir = tempfile::tempdir().unwrap();
    let (root, home) = (dir.path().join("ws"), dir.path().join("home"));
    std::fs::create_dir_all(&root).unwrap();
    metash_store::Store::init(&root, None).unwrap();
    let toml = server
        .provider_toml()
        .replace("http://127.0.0.1:9/", &format!("http://{api_addr}/"));
    std::fs::write(root.join(".meta/config.toml"), toml).unwrap();
    let agent_dir = root.join(".meta/agents/fetcher");
    std::fs::create_dir_all(&agent_dir).unwrap();
    std::fs::write(
        agent_dir.join("manifest.toml"),
        "schema_version = \"0.1\"\nname = \"fetcher\"\nversion = \"0.1.0\"\nentry = \"a.wasm\"\n\
         sandbox = \"wasm\"\ncapabilities = [\"oauth:test.repo\"]\n",
    )
    .unwrap();

    // The person logs in (device flow, Chromium confirming the code).
    let vault = Vault::default_path(&home);
    let broker = Broker::new(&root, &vault, keys()).unwrap();
    let browse = browser(dir.path(), &tools, &chromium);
    let how = Login {
        scopes: None,
        device: true,
        opener: Opener {
            open_browser: true,
            browser: Some(browse),
            say: Box::new(|_| {}),
        },
    };
    broker.login("test", &how).unwrap();
    let real = broker.access_token("test").unwrap();

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
    // Without a grant: no handle.
    assert!(
        metash_host::oauth::start(&host, "fetcher", std::slice::from_ref(&cap))
            .unwrap()
            .is_none()
    );
    let registry = metash_policy::Registry::discover(&metash_policy::AgentDirs::new(&root, None));
    let policy = metash_policy::Policy::new(host.store().clone(), registry);
    policy.grant("fetcher", &cap, 600, false, "test").unwrap();
    let handles = metash_host::oauth::start(&host, "fetcher", std::slice::from_ref(&cap))
        .unwrap()
        .expect("a handle for a live grant");
    let h = &handles.handles[0];
    assert_eq!(h.provider, "test");
    let env = handles.env();
    assert!(env
        .iter()
        .any(|(k, v)| k == "METASH_OAUTH_TEST" && *v == h.base_url));
    assert!(env
        .iter()
        .any(|(k, v)| k == "METASH_OAUTH_TEST_HANDLE" && *v == h.id));
    assert!(
        env.iter().all(|(_, v)| !v.contains(real.expose())),
        "no token in the env"
    );
    let prefix = h.base_url.split_once("127.0.0.1").unwrap().1;
    let prefix = &prefix[prefix.find('/').unwrap()..];

    // Through the handle: the API sees the real token, whatever the agent sent.
    let (status, body) = get(
        &h.base_url,
        &format!("{prefix}/repos?page=2"),
        "Bearer the-agents-guess",
    );
    assert_eq!((status, body.as_str()), (200, "api ok"));
    let got = seen.lock().unwrap().clone();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].0, "/repos?page=2");
    assert_eq!(got[0].1, format!("Bearer {}", real.expose()));

    // Another path, another host: refused, and the API never asked.
    let (status, _) = get(&h.base_url, "/elsewhere", "Bearer x");
    assert_eq!(status, 403);
    let (status, _) = get(&h.base_url, &format!("http://{api_addr}/repos"), "Bearer x");
    assert_eq!(status, 403);
    assert_eq!(seen.lock().unwrap().len(), 1);

    // Revoked: the next request is refused with the reason.
    policy.revoke("fetcher", &cap, "test").unwrap();
    let (status, body) = get(&h.base_url, &format!("{prefix}/repos"), "Bearer x");
    assert_ne!(status, 200);
    assert!(body.contains("no longer granted"), "{status} {body}");
    assert_eq!(
        seen.lock().unwrap().len(),
        1,
        "the API saw nothing after the revocation"
    );

    // No token anywhere in the log.
    drop(handles);
    let log = std::fs::read_to_string(root.join(".meta/log.jsonl")).unwrap_or_default()
        + &metash_store::Store::open(&root)
            .unwrap()
            .log()
            .read_all()
            .unwrap()
            .iter()
            .map(|r| r.data.to_string())
            .collect::<Vec<_>>()
            .join("\n");
    assert!(
        !log.contains(real.expose()),
        "the token is in no log record"
    );
}
