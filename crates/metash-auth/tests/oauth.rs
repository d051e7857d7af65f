//! The broker against a real OAuth 2.0 / OIDC server (`oidc-provider`, started on loopback by
//! each test: `tests/oidc/server.mjs`), with a real browser (Debian's Chromium through
//! Playwright's core library: `tests/oidc/browse.mjs`) playing the person: login by code + PKCE
//! and by device flow, the vault holding no token byte in clear, two concurrent refreshes
//! spending the refresh token once, an expired login said so, logout revoking at the server.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};

use metash_auth::broker::Login;
use metash_auth::flow::Opener;
use metash_auth::{AuthError, Broker, KeyOptions, Secret};
use metash_testkit::oidc::{browser, prerequisites, Oidc};

/// A project whose config names the server as provider `test`.
fn project(server: &Oidc) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join(".meta")).unwrap();
    std::fs::write(dir.path().join(".meta/config.toml"), server.provider_toml()).unwrap();
    dir
}

fn passphrase() -> KeyOptions {
    KeyOptions {
        passphrase: Some(Secret::new("correct horse battery staple")),
        keychain: metash_auth::KeychainChoice::Off,
    }
}

fn login(browser: &str, device: bool) -> (Login, Arc<Mutex<Vec<String>>>) {
    let said = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&said);
    let how = Login {
        scopes: None,
        device,
        opener: Opener {
            open_browser: true,
            browser: Some(browser.to_string()),
            say: Box::new(move |s| sink.lock().unwrap().push(s.to_string())),
        },
    };
    (how, said)
}

#[test]
fn login_by_pkce_and_by_device_then_logout_revokes_at_the_server() {
    let (tools, chromium) = match prerequisites() {
        Ok(p) => p,
        Err(why) => return metash_testkit::skip("oauth test", &why),
    };
    let server = Oidc::start(&tools, 600, 3600);
    let dir = project(&server);
    let vault = dir.path().join("config/metash/vault.json");
    let browse = browser(dir.path(), &tools, &chromium);
    let broker = Broker::new(dir.path(), &vault, passphrase()).unwrap();

    // Code + PKCE through the loopback redirect.
    let (how, said) = login(&browse, false);
    let info = broker.login("test", &how).unwrap();
    assert_eq!(info.flow, "pkce");
    assert!(info.refreshable, "{info:?}");
    assert!(
        said.lock().unwrap()[0].contains("code_challenge_method=S256"),
        "{:?}",
        said
    );
    assert_eq!(server.grants("authorization_code"), 1);
    let at = broker.access_token("test").unwrap();
    assert!(
        broker.introspect("test", &at).unwrap(),
        "the server holds it active"
    );

    // The device flow: the code shown, the page opened, the token polled for.
    let (how, said) = login(&browse, true);
    let info = broker.login("test", &how).unwrap();
    assert_eq!(info.flow, "device");
    assert!(
        said.lock().unwrap()[0].contains("enter the code"),
        "{said:?}"
    );
    assert_eq!(
        server.grants("urn:ietf:params:oauth:grant-type:device_code"),
        1
    );
    let device_at = broker.access_token("test").unwrap();
    assert_ne!(device_at.expose(), at.expose());

    // The vault file: no token byte in clear.
    let bytes = std::fs::read(&vault).unwrap();
    let text = String::from_utf8_lossy(&bytes);
    assert!(!text.contains(device_at.expose()) && !text.contains(at.expose()));
    assert!(text.contains("\"source\": \"passphrase\""), "{text}");
    assert_eq!(broker.list().unwrap().len(), 1);

    // Logout (by another process's broker) revokes at the server first: introspection says
    // inactive. The first broker remembered the token it read; the vault file changed, so it
    // no longer serves it.
    assert_eq!(
        broker.fresh_token("test").map(|t| t.expose().to_string()),
        Some(device_at.expose().to_string())
    );
    let out = Broker::new(dir.path(), &vault, passphrase())
        .unwrap()
        .logout("test")
        .unwrap();
    assert!(
        broker.fresh_token("test").is_none(),
        "a logout elsewhere is seen"
    );
    assert!(out.revoked_at_provider && out.was_logged_in, "{out:?}");
    assert!(
        !broker.introspect("test", &device_at).unwrap(),
        "revoked at the server"
    );
    assert!(broker.list().unwrap().is_empty());
    assert!(matches!(
        broker.access_token("test"),
        Err(AuthError::NotLoggedIn(_))
    ));
}

#[test]
fn two_concurrent_refreshes_spend_the_refresh_token_once() {
    let (tools, chromium) = match prerequisites() {
        Ok(p) => p,
        Err(why) => return metash_testkit::skip("oauth refresh test", &why),
    };
    // Access tokens live 4 s: refreshed once less than half their life is left.
    let server = Oidc::start(&tools, 4, 3600);
    let dir = project(&server);
    let vault = dir.path().join("config/metash/vault.json");
    let browse = browser(dir.path(), &tools, &chromium);
    let first = Broker::new(dir.path(), &vault, passphrase()).unwrap();
    let (how, _) = login(&browse, true);
    first.login("test", &how).unwrap();
    let before = first.access_token("test").unwrap();
    std::thread::sleep(std::time::Duration::from_millis(2_500));
    // Two brokers (each its own vault handle and lock file descriptor, as two runs have) ask at
    // once for a token that needs refreshing.
    let barrier = Arc::new(std::sync::Barrier::new(2));
    let askers: Vec<std::thread::JoinHandle<_>> = (0..2)
        .map(|_| {
            let (root, vault, barrier) = (
                dir.path().to_path_buf(),
                vault.clone(),
                Arc::clone(&barrier),
            );
            std::thread::spawn(move || {
                let b = Broker::new(&root, &vault, passphrase()).unwrap();
                barrier.wait();
                b.access_token("test").map(|s| s.expose().to_string())
            })
        })
        .collect();
    let tokens: Vec<String> = askers
        .into_iter()
        .map(|h| h.join().unwrap().unwrap())
        .collect();
    assert_eq!(tokens[0], tokens[1], "the second used the first's refresh");
    assert_ne!(tokens[0], before.expose());
    assert_eq!(server.grants("refresh_token"), 1, "{:?}", server.lines());
    let refused = server.errors("refresh_token");
    assert!(
        refused.is_empty(),
        "no refresh token spent twice: {refused:?}"
    );
}

#[test]
fn an_expired_login_says_to_log_in_again() {
    let (tools, chromium) = match prerequisites() {
        Ok(p) => p,
        Err(why) => return metash_testkit::skip("oauth expiry test", &why),
    };
    // Refresh tokens live 2 s.
    let server = Oidc::start(&tools, 2, 2);
    let dir = project(&server);
    let vault = dir.path().join("config/metash/vault.json");
    let browse = browser(dir.path(), &tools, &chromium);
    let broker = Broker::new(dir.path(), &vault, passphrase()).unwrap();
    let (how, _) = login(&browse, true);
    broker.login("test", &how).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(3_000));
    match broker.access_token("test") {
        Err(AuthError::LoginExpired(p)) => assert_eq!(p, "test"),
        other => panic!(
            "expected LoginExpired, got {:?}",
            other.map(|s| s.expose().len())
        ),
    }
    let said = AuthError::LoginExpired("test".into()).to_string();
    assert!(said.contains("metash auth login test"), "{said}");
}
