//! The world the OAuth handle tests and the handle benchmark share: a real OIDC server
//! (`oidc-provider`), a person logged in to it by the device flow (Chromium confirming the
//! code), and a project whose agents declare `oauth:test.repo` for a loopback API.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use metash_auth::broker::Login;
use metash_auth::flow::Opener;
use metash_auth::{Broker, KeyOptions, Secret, Vault};
use metash_host::{Host, HostOptions, Terminal};
use metash_testkit::oidc::{browser, Oidc};

const PASSPHRASE: &str = "the handles test's passphrase";

/// What the API saw: each request's path and Authorization.
pub type Seen = Arc<Mutex<Vec<(String, String)>>>;

/// A loopback API: answers `200 api ok` and records each request's path and Authorization.
pub fn api() -> (SocketAddr, Seen) {
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
            let streaming = path.starts_with("/stream");
            sink.lock().unwrap().push((path, auth));
            if streaming {
                // A long answer: a chunk every 100 ms for 30 s, until the reader goes away.
                let sink = Arc::clone(&sink);
                std::thread::spawn(move || {
                    let _ = conn.write_all(
                        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n",
                    );
                    for _ in 0..300 {
                        if conn
                            .write_all(b"5\r\ntick\n\r\n")
                            .and_then(|()| conn.flush())
                            .is_err()
                        {
                            sink.lock()
                                .unwrap()
                                .push(("stream closed".into(), String::new()));
                            return;
                        }
                        std::thread::sleep(Duration::from_millis(100));
                    }
                });
                continue;
            }
            let _ = conn.write_all(
                b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\nConnection: close\r\n\r\napi ok",
            );
        }
    });
    (addr, seen)
}

pub fn keys() -> KeyOptions {
    KeyOptions {
        passphrase: Some(Secret::new(PASSPHRASE)),
        keychain: metash_auth::KeychainChoice::Off,
    }
}

/// The person logged in to the OIDC server as provider `test`, whose API is a loopback server;
/// a project whose agent `fetcher` (WASM) and `native-fetcher` (native) declare `oauth:test.repo`.
pub struct World {
    pub _server: Oidc,
    pub _dir: tempfile::TempDir,
    pub api_addr: SocketAddr,
    pub seen: Seen,
    pub root: std::path::PathBuf,
    pub host: Host,
    pub real: Secret,
}

pub fn world(tools: &std::path::Path, chromium: &std::path::Path) -> World {
    world_with(tools, chromium, 600, 3600)
}

/// [`world`] with the server's access and refresh token lifetimes.
pub fn world_with(
    tools: &std::path::Path,
    chromium: &std::path::Path,
    at_ttl: u32,
    rt_ttl: u32,
) -> World {
    world_on(tools, chromium, at_ttl, rt_ttl, api())
}

/// [`world_with`] whose provider's API is the server at `api.0`.
pub fn world_on(
    tools: &std::path::Path,
    chromium: &std::path::Path,
    at_ttl: u32,
    rt_ttl: u32,
    api: (SocketAddr, Seen),
) -> World {
    let server = Oidc::start(tools, at_ttl, rt_ttl);
    let (api_addr, seen) = api;
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
    let native_dir = root.join(".meta/agents/native-fetcher");
    std::fs::create_dir_all(&native_dir).unwrap();
    std::fs::write(
        native_dir.join("manifest.toml"),
        format!(
            "schema_version = \"0.1\"\nname = \"native-fetcher\"\nversion = \"0.1.0\"\n\
             entry = {:?}\nsandbox = \"native\"\ncapabilities = [\"oauth:test.repo\"]\n\
             resources.mem = \"256Mi\"\n",
            env!("CARGO_BIN_EXE_metash-host-test-agent")
        ),
    )
    .unwrap();

    // The person logs in (device flow, Chromium confirming the code).
    let vault = Vault::default_path(&home);
    let broker = Broker::new(&root, &vault, keys()).unwrap();
    let browse = browser(dir.path(), tools, chromium);
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
            yes_to: vec!["native".parse().unwrap()],
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
    World {
        _server: server,
        _dir: dir,
        api_addr,
        seen,
        root,
        host,
        real,
    }
}
