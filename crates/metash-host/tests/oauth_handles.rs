//! OAuth handles: an agent holding `oauth:test.repo` gets a base URL on a credential proxy, and
//! a loopback "API" sees the person's real token (logged in against a real OIDC server,
//! `oidc-provider`, with Chromium as the person); whatever auth the agent sends is replaced;
//! another path or another host is refused; a revoked grant stops the next request; no token is
//! ever in the log. A native and a WASM agent spawned by the host call the API through theirs.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/oauth_world.rs"]
mod oauth_world;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

use metash_auth::Secret;
use metash_host::Host;
use metash_testkit::oidc::prerequisites;
use oauth_world::{world, world_with, World};

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

/// No log record holds the token.
fn assert_no_token_in_log(host: &Host, token: &Secret) {
    let records = host.store().log().read_all().unwrap();
    assert!(
        records
            .iter()
            .all(|r| !r.data.to_string().contains(token.expose())),
        "the token is in no log record"
    );
}

/// The ledger has the handle given and one request through it (never the token), and its export
/// holds no token either: it was never written.
fn assert_ledger_holds_the_use(w: &World, cap: &metash_policy::Capability) {
    let filter = metash_policy::ledger::Filter {
        capability: Some(cap.clone()),
        ..metash_policy::ledger::Filter::default()
    };
    let records = metash_policy::ledger::records(w.host.store(), &filter).unwrap();
    let kinds: Vec<String> = records.iter().map(|r| r.kind.to_string()).collect();
    assert!(kinds.contains(&"oauth_handle".to_string()), "{kinds:?}");
    let uses: Vec<_> = records
        .iter()
        .filter(|r| r.kind == metash_protocol::LogKind::OauthUse)
        .collect();
    assert_eq!(uses.len(), 1, "one request, one entry: {uses:?}");
    assert_eq!(uses[0].data["refreshed"], false);
    assert!(metash_policy::ledger::summary(uses[0]).contains("with the test token"));
    let mut export = Vec::new();
    metash_policy::ledger::export(
        w.host.store(),
        &metash_policy::ledger::Filter::default(),
        metash_policy::ledger::Format::Jsonl,
        &metash_policy::Redactor::new(b"salt"),
        &mut export,
    )
    .unwrap();
    assert!(!String::from_utf8_lossy(&export).contains(w.real.expose()));
}

fn policy(root: &std::path::Path, store: &metash_store::Store) -> metash_policy::Policy {
    let registry = metash_policy::Registry::discover(&metash_policy::AgentDirs::new(root, None));
    metash_policy::Policy::new(store.clone(), registry)
}

#[test]
fn a_handle_adds_the_real_token_for_its_api_only_while_the_grant_is_live() {
    let (tools, chromium) = match prerequisites() {
        Ok(p) => p,
        Err(why) => return metash_testkit::skip("oauth handles test", &why),
    };
    // The world lives to the end of the test (its directory with it).
    let w = world(&tools, &chromium);
    let (api_addr, seen, root, host, real) = (
        w.api_addr,
        Arc::clone(&w.seen),
        w.root.clone(),
        &w.host,
        w.real.clone(),
    );
    let cap: metash_policy::Capability = "oauth:test.repo".parse().unwrap();
    // Without a grant: no handle.
    assert!(
        metash_host::oauth::start(host, "fetcher", std::slice::from_ref(&cap))
            .unwrap()
            .is_none()
    );
    let registry = metash_policy::Registry::discover(&metash_policy::AgentDirs::new(&root, None));
    let policy = metash_policy::Policy::new(host.store().clone(), registry);
    policy.grant("fetcher", &cap, 600, false, "test").unwrap();
    let handles = metash_host::oauth::start(host, "fetcher", std::slice::from_ref(&cap))
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
    handles.flush();
    let refused: Vec<_> = host
        .store()
        .log()
        .read_all()
        .unwrap()
        .into_iter()
        .filter(|r| r.kind == metash_protocol::LogKind::OauthUse && r.data.get("refused").is_some())
        .collect();
    assert_eq!(
        refused.len(),
        1,
        "the refused request is a ledger entry too"
    );
    assert!(refused[0].data["refused"]
        .as_str()
        .unwrap()
        .contains("no longer granted"));

    drop(handles);
    assert_no_token_in_log(host, &real);
}

/// A native agent under metash's sandbox, spawned by the host, calls the API through its handle:
/// the API sees the real token; the agent's environment holds the handle and never the token;
/// without a live grant it gets no handle.
#[test]
fn a_native_agent_calls_its_api_through_the_handle_and_never_sees_the_token() {
    let (tools, chromium) = match prerequisites() {
        Ok(p) => p,
        Err(why) => return metash_testkit::skip("oauth handles agent test", &why),
    };
    let abi = metash_runtime::native::isolate::landlock_abi();
    if abi < 4 {
        return metash_testkit::skip(
            "oauth handles agent test",
            &format!("Landlock ABI {abi} < 4: native agents cannot be sandboxed here"),
        );
    }
    let w = world(&tools, &chromium);
    let cap: metash_policy::Capability = "oauth:test.repo".parse().unwrap();
    let policy = policy(&w.root, w.host.store());
    policy
        .grant("native-fetcher", &cap, 600, false, "test")
        .unwrap();
    let spawn = |prompt: &str| {
        use metash_host::Spawner;
        let r = w
            .host
            .spawn_agent(&metash_host::SpawnRequest::new(
                "native-fetcher",
                "",
                prompt,
            ))
            .unwrap();
        assert_eq!(r.status, metash_protocol::AgentStatus::Success, "{r:?}");
        r.data
    };
    let got = spawn("handle METASH_OAUTH_TEST /repos");
    assert_eq!(got.trim(), "200 api ok", "{got}");
    let seen = w.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].0, "/repos");
    assert_eq!(seen[0].1, format!("Bearer {}", w.real.expose()));
    let env = spawn("env");
    assert!(env.contains("METASH_OAUTH_TEST=http://127.0.0.1:"), "{env}");
    assert!(env.contains("METASH_OAUTH_TEST_HANDLE=handle-"), "{env}");
    assert!(
        !env.contains(w.real.expose()),
        "the token is not in the agent's environment"
    );
    // Straight to the API (not through its handle): the sandbox refuses the connection.
    let direct = spawn(&format!("handle http://{} /repos", w.api_addr));
    assert!(direct.starts_with("refused"), "{direct}");
    assert_ledger_holds_the_use(&w, &cap);
    // Revoked: the next spawn gets no handle at all.
    policy.revoke("native-fetcher", &cap, "test").unwrap();
    let after = spawn("handle METASH_OAUTH_TEST /repos");
    assert!(
        after.starts_with("refused no $METASH_OAUTH_TEST"),
        "{after}"
    );
    assert_eq!(w.seen.lock().unwrap().len(), 1);
}

/// A WASM agent (a preview-2 component, `metash-agent`'s `net` example) calls the API through its
/// handle: the socket check lets it reach the handle's port and nothing else.
#[test]
fn a_wasm_agent_calls_its_api_through_the_handle() {
    let (tools, chromium) = match prerequisites() {
        Ok(p) => p,
        Err(why) => return metash_testkit::skip("oauth handles WASM test", &why),
    };
    let component = match metash_testkit::build_example("net", Some("wasm32-wasip2")) {
        Ok(p) => p,
        Err(why) => return metash_testkit::skip("oauth handles WASM test", &why),
    };
    let w = world(&tools, &chromium);
    let dir = w.root.join(".meta/agents/wasm-fetcher");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("manifest.toml"),
        format!(
            "schema_version = \"0.1\"\nname = \"wasm-fetcher\"\nversion = \"0.1.0\"\n\
             entry = {component:?}\nsandbox = \"wasm\"\ncapabilities = [\"oauth:test.repo\"]\n"
        ),
    )
    .unwrap();
    let cap: metash_policy::Capability = "oauth:test.repo".parse().unwrap();
    policy(&w.root, w.host.store())
        .grant("wasm-fetcher", &cap, 600, false, "test")
        .unwrap();
    let spawn = |prompt: &str| {
        use metash_host::Spawner;
        let r = w
            .host
            .spawn_agent(&metash_host::SpawnRequest::new("wasm-fetcher", "", prompt))
            .unwrap();
        r.data
    };
    let got = spawn("handle METASH_OAUTH_TEST /repos");
    assert_eq!(got.trim(), "200 api ok", "{got}");
    let seen = w.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].1, format!("Bearer {}", w.real.expose()));
    // Straight to the API: refused by the socket check (no network grant).
    let direct = spawn(&format!("handle http://{} /repos", w.api_addr));
    assert!(!direct.contains("api ok"), "{direct}");
    assert_eq!(w.seen.lock().unwrap().len(), 1);
}

/// A login that expired behind a live handle: the request is refused with the reason, and a
/// checkpoint asks a person to log in again (not a crash).
#[test]
fn an_expired_login_behind_a_handle_becomes_a_checkpoint() {
    let (tools, chromium) = match prerequisites() {
        Ok(p) => p,
        Err(why) => return metash_testkit::skip("oauth expiry checkpoint test", &why),
    };
    // Access and refresh tokens live 2 s.
    let w = world_with(&tools, &chromium, 2, 2);
    let cap: metash_policy::Capability = "oauth:test.repo".parse().unwrap();
    policy(&w.root, w.host.store())
        .grant("fetcher", &cap, 600, false, "test")
        .unwrap();
    let handles = metash_host::oauth::start(&w.host, "fetcher", std::slice::from_ref(&cap))
        .unwrap()
        .unwrap();
    std::thread::sleep(Duration::from_millis(3_000));
    let h = &handles.handles[0];
    let prefix = h.base_url.split_once("127.0.0.1").unwrap().1;
    let prefix = &prefix[prefix.find('/').unwrap()..];
    let (status, body) = get(&h.base_url, &format!("{prefix}/repos"), "Bearer x");
    assert_ne!(status, 200);
    assert!(body.contains("metash auth login test"), "{status} {body}");
    let pending = w
        .host
        .store()
        .state()
        .unwrap()
        .pending_checkpoint
        .expect("a checkpoint");
    assert_eq!(pending.id, "metash-oauth-test");
    assert!(pending.signal.message.contains("metash auth login test"));
    assert!(w.seen.lock().unwrap().is_empty(), "the API was never asked");
}

/// A revocation cuts a request through the handle that is in flight (a long streamed answer), not
/// only the next one; the API's connection is closed behind it.
#[test]
fn a_revocation_cuts_a_request_in_flight() {
    let (tools, chromium) = match prerequisites() {
        Ok(p) => p,
        Err(why) => return metash_testkit::skip("oauth in-flight revocation test", &why),
    };
    let w = world(&tools, &chromium);
    let cap: metash_policy::Capability = "oauth:test.repo".parse().unwrap();
    let policy = policy(&w.root, w.host.store());
    policy.grant("fetcher", &cap, 600, false, "test").unwrap();
    let handles = metash_host::oauth::start(&w.host, "fetcher", std::slice::from_ref(&cap))
        .unwrap()
        .unwrap();
    let h = &handles.handles[0];
    let addr = h
        .base_url
        .trim_start_matches("http://")
        .split('/')
        .next()
        .unwrap()
        .to_string();
    let prefix = h.base_url.split_once(addr.as_str()).unwrap().1.to_string();
    let mut s = TcpStream::connect(&addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET {prefix}/stream HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&got).contains("tick") {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "the stream ended before its first chunk");
        got.extend_from_slice(&buf[..n]);
    }
    policy.revoke("fetcher", &cap, "test").unwrap();
    let revoked_at = std::time::Instant::now();
    // The stream ends (cut), well before the API's 30 s.
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
        assert!(
            revoked_at.elapsed() < Duration::from_secs(5),
            "still streaming after the revocation"
        );
    }
    let took = revoked_at.elapsed();
    assert!(
        took < Duration::from_secs(2),
        "cut {took:?} after the revocation"
    );
    let text = String::from_utf8_lossy(&got);
    assert!(
        !text.contains("0\r\n\r\n"),
        "cut, not a complete chunked body: {text}"
    );
    // The API's side is closed behind it.
    let until = std::time::Instant::now() + Duration::from_secs(5);
    while std::time::Instant::now() < until
        && !w
            .seen
            .lock()
            .unwrap()
            .iter()
            .any(|(p, _)| p == "stream closed")
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        w.seen
            .lock()
            .unwrap()
            .iter()
            .any(|(p, _)| p == "stream closed"),
        "the API's connection was closed"
    );
}
