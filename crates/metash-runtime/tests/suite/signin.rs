//! Subscription sign-ins behind the credential proxy (`credential::signin`), against a loopback
//! model upstream and a loopback token endpoint the tests start: a renewal that fails is a 503
//! naming the reason and never a token; concurrent requests spend a refresh token once; a 401
//! from the provider renews the login before the next request.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use metash_runtime::credential::signin::{self, SignInCli};
use metash_runtime::credential::{CredentialProxy, Mount, ProxyConfig, Route};
use metash_runtime::MemorySink;
use serde_json::{json, Value};

/// One request a test server saw: path, headers (lowercased names), body.
type Seen = Arc<Mutex<Vec<(String, Vec<(String, String)>, String)>>>;

/// A loopback HTTP server: each request recorded, answered with `(status, JSON)` from `answer`.
fn serve(
    answer: impl Fn(&str, &[(String, String)]) -> (u16, Value) + Send + Sync + 'static,
) -> (String, Seen) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let seen: Seen = Arc::default();
    let (log, answer) = (Arc::clone(&seen), Arc::new(answer));
    std::thread::spawn(move || {
        for sock in listener.incoming().flatten() {
            let (log, answer) = (Arc::clone(&log), Arc::clone(&answer));
            std::thread::spawn(move || {
                let mut r = BufReader::new(sock.try_clone().expect("clone"));
                let (path, headers, body) = read_request(&mut r);
                let (status, out) = answer(&path, &headers);
                log.lock().expect("lock").push((path, headers, body));
                let out = out.to_string();
                let mut sock = sock;
                let _ = write!(
                    sock,
                    "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{out}",
                    out.len()
                );
            });
        }
    });
    (base, seen)
}

fn read_request(r: &mut impl BufRead) -> (String, Vec<(String, String)>, String) {
    let mut line = String::new();
    let _ = r.read_line(&mut line);
    let path = line
        .split_whitespace()
        .nth(1)
        .unwrap_or_default()
        .to_string();
    let (mut headers, mut len) = (Vec::new(), 0usize);
    loop {
        let mut h = String::new();
        if r.read_line(&mut h).unwrap_or(0) == 0 || h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.trim_end().split_once(':') {
            let (k, v) = (k.trim().to_ascii_lowercase(), v.trim().to_string());
            if k == "content-length" {
                len = v.parse().unwrap_or(0);
            }
            headers.push((k, v));
        }
    }
    let mut body = vec![0; len];
    let _ = r.read_exact(&mut body);
    (path, headers, String::from_utf8_lossy(&body).into_owned())
}

/// A POST through the proxy as a CLI holding the placeholder sends it: (status, body).
fn post(proxy: &CredentialProxy, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(proxy.addr()).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let body = "{}";
    write!(
        s,
        "POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer metash-placeholder\r\n\
         chatgpt-account-id: metash-placeholder\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("write");
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let status = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (
        status,
        out.split("\r\n\r\n").nth(1).unwrap_or_default().to_string(),
    )
}

fn header<'a>(h: &'a [(String, String)], name: &str) -> Option<&'a str> {
    h.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

fn now_s() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

fn jwt(payload: &Value) -> String {
    let e = |v: &Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
    format!("{}.{}.c2ln", e(&json!({"alg": "none"})), e(payload))
}

/// The proxy for `cli`'s sign-in found under `home`, the upstream `upstream` on `mount`.
fn proxy_for(
    cli: SignInCli,
    home: &Path,
    token_url: &str,
    upstream: &str,
) -> (CredentialProxy, Arc<MemorySink>) {
    let (home, token_url) = (home.to_string_lossy().into_owned(), token_url.to_string());
    let env = move |k: &str| -> Option<String> {
        match k {
            "HOME" => Some(home.clone()),
            signin::CLAUDE_TOKEN_URL_ENV | signin::CODEX_TOKEN_URL_ENV => Some(token_url.clone()),
            _ => None,
        }
    };
    let found = signin::detect(cli, &env)
        .expect("readable")
        .expect("signed in");
    let source = found.source("model", &env).expect("source");
    let mut config = ProxyConfig::new(vec![Route {
        id: "model".into(),
        mount: Mount::WholePort,
        upstream: upstream.to_string(),
        auth: found.auth_style(),
    }]);
    config.agent = Some("coder".into());
    let sink = Arc::new(MemorySink::new());
    let proxy = CredentialProxy::start(config, Arc::new(source), sink.clone()).expect("proxy");
    (proxy, sink)
}

fn claude_login(
    home: &Path,
    access: &str,
    refresh: &str,
    expires_at_ms: i64,
) -> std::path::PathBuf {
    let dir = home.join(".claude");
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join(".credentials.json");
    let doc = json!({"claudeAiOauth": {"accessToken": access, "refreshToken": refresh,
        "expiresAt": expires_at_ms, "scopes": ["user:inference"], "subscriptionType": "pro"}});
    std::fs::write(&path, doc.to_string()).expect("write");
    path
}

#[test]
fn a_failed_renewal_is_a_503_naming_the_reason_and_is_not_retried() {
    let (old, refresh) = ("sk-ant-oat01-old-expired-xyz", "sk-ant-ort01-refused-abc");
    let (token_base, tokens) = serve(move |_, _| {
        (
            400,
            json!({"error": "invalid_grant", "error_description": format!("bad {refresh}")}),
        )
    });
    let (model_base, model) = serve(|_, _| (200, json!({"ok": true})));
    let home = tempfile::tempdir().expect("home");
    let file = claude_login(home.path(), old, refresh, (now_s() - 10) * 1000);
    let before = std::fs::read(&file).expect("read");
    let (proxy, sink) = proxy_for(
        SignInCli::Claude,
        home.path(),
        &format!("{token_base}/v1/oauth/token"),
        &model_base,
    );
    let (status, body) = post(&proxy, "/v1/messages");
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("invalid_grant"), "{body}");
    for secret in [old, refresh] {
        assert!(!body.contains(secret), "{body}");
        let events = format!("{:?}", sink.events());
        assert!(!events.contains(secret), "{events}");
    }
    assert!(
        events_mention(&sink, "invalid_grant"),
        "the refusal is logged"
    );
    assert_eq!(tokens.lock().expect("lock").len(), 1);
    assert!(
        model.lock().expect("lock").is_empty(),
        "nothing reached the model"
    );
    assert_eq!(
        std::fs::read(&file).expect("read"),
        before,
        "the login is left as it was"
    );
    assert!(!home.path().join(".claude/.oauth_refresh.lock").exists());
    // A refused refresh token is not sent again (the CLI retries a 503)...
    let (status, body) = post(&proxy, "/v1/messages");
    assert_eq!(status, 503);
    assert!(body.contains("sign in again with `claude login`"), "{body}");
    assert_eq!(tokens.lock().expect("lock").len(), 1);
    // ...until the user signs in again.
    claude_login(
        home.path(),
        old,
        "sk-ant-ort01-new-login",
        (now_s() - 10) * 1000,
    );
    assert_eq!(post(&proxy, "/v1/messages").0, 503);
    assert_eq!(tokens.lock().expect("lock").len(), 2);
}

fn events_mention(sink: &MemorySink, text: &str) -> bool {
    format!("{:?}", sink.events()).contains(text)
}

#[test]
fn concurrent_requests_spend_a_codex_refresh_token_once() {
    let account = "acct-concurrent";
    let old = jwt(&json!({"exp": now_s() - 5}));
    let new = jwt(&json!({"exp": now_s() + 3600}));
    let (token_base, tokens) = {
        let new = new.clone();
        serve(move |_, _| {
            std::thread::sleep(Duration::from_millis(300));
            (200, json!({"access_token": new, "refresh_token": "rt-2"}))
        })
    };
    let (model_base, model) = serve(|_, _| (200, json!({"ok": true})));
    let home = tempfile::tempdir().expect("home");
    std::fs::create_dir_all(home.path().join(".codex")).expect("dir");
    let auth = home.path().join(".codex/auth.json");
    let claims = json!({"https://api.openai.com/auth": {"chatgpt_account_id": account}});
    std::fs::write(
        &auth,
        json!({"OPENAI_API_KEY": null, "tokens": {"id_token": jwt(&claims), "access_token": old,
            "refresh_token": "rt-1", "account_id": account}, "last_refresh": "2025-01-01T00:00:00Z"})
        .to_string(),
    )
    .expect("auth.json");
    let (proxy, _sink) = proxy_for(
        SignInCli::Codex,
        home.path(),
        &format!("{token_base}/oauth/token"),
        &model_base,
    );
    let proxy = Arc::new(proxy);
    let clients: Vec<_> = (0..4)
        .map(|_| {
            let proxy = Arc::clone(&proxy);
            std::thread::spawn(move || post(&proxy, "/responses"))
        })
        .collect();
    for c in clients {
        assert_eq!(c.join().expect("client").0, 200);
    }
    let spent = tokens.lock().expect("lock").clone();
    assert_eq!(spent.len(), 1, "one renewal for four requests: {spent:?}");
    assert!(
        spent[0].2.contains("\"refresh_token\":\"rt-1\""),
        "{}",
        spent[0].2
    );
    let seen = model.lock().expect("lock").clone();
    assert_eq!(seen.len(), 4);
    for (_, h, _) in &seen {
        assert_eq!(
            header(h, "authorization"),
            Some(format!("Bearer {new}").as_str())
        );
        assert_eq!(header(h, "chatgpt-account-id"), Some(account));
        assert_eq!(
            h.iter().filter(|(k, _)| k == "chatgpt-account-id").count(),
            1
        );
    }
    let doc: Value = serde_json::from_slice(&std::fs::read(&auth).expect("read")).expect("json");
    assert_eq!(doc["tokens"]["refresh_token"], "rt-2");
}

#[test]
fn a_401_renews_the_login_before_the_next_request() {
    let (old, new) = ("sk-ant-oat01-revoked-early", "sk-ant-oat01-after-401");
    let (token_base, tokens) = serve(move |_, _| {
        (
            200,
            json!({"access_token": new, "refresh_token": "rt-b", "expires_in": 3600}),
        )
    });
    let (model_base, model) = serve(move |_, h| {
        if header(h, "authorization") == Some(format!("Bearer {old}").as_str()) {
            (
                401,
                json!({"type": "error", "error": {"type": "authentication_error"}}),
            )
        } else {
            (200, json!({"ok": true}))
        }
    });
    let home = tempfile::tempdir().expect("home");
    let file = claude_login(home.path(), old, "rt-a", (now_s() + 3600) * 1000);
    let (proxy, _sink) = proxy_for(
        SignInCli::Claude,
        home.path(),
        &format!("{token_base}/v1/oauth/token"),
        &model_base,
    );
    assert_eq!(
        post(&proxy, "/v1/messages").0,
        401,
        "not due: the token is used as is"
    );
    assert!(tokens.lock().expect("lock").is_empty());
    assert_eq!(post(&proxy, "/v1/messages").0, 200, "renewed after the 401");
    assert_eq!(tokens.lock().expect("lock").len(), 1);
    let seen = model.lock().expect("lock").clone();
    assert_eq!(
        header(&seen[1].1, "authorization"),
        Some(format!("Bearer {new}").as_str())
    );
    let doc: Value = serde_json::from_slice(&std::fs::read(&file).expect("read")).expect("json");
    assert_eq!(doc["claudeAiOauth"]["accessToken"], new);
    assert_eq!(doc["claudeAiOauth"]["subscriptionType"], "pro");
}
