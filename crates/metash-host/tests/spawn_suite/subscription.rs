//! Issue 32 item 4: subscription sign-ins with the same guarantee as keys. The real Claude Code
//! and Codex CLIs run in metash's sandbox against loopback servers that speak the sign-in's wire
//! format: the model server gets the real token (and the OAuth beta header, the ChatGPT account
//! id), never the placeholder; an expired login is renewed by the proxy at a loopback token
//! endpoint (Anthropic's and OpenAI's refresh grants) and written back to the user's file; no
//! token is ever in the CLI's environment, arguments or files, nor in the project (its log
//! included).

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use base64::Engine;
use metash_host::{Host, HostOptions, SpawnRequest, Spawner};
use metash_protocol::AgentStatus;
use metash_testkit::anthropic::{sse_text, ModelServer};
use metash_testkit::cli::Cli;
use serde_json::{json, Value};

use super::common::Project;

const OAUTH_TOKEN: &str = "sk-ant-oat01-real-subscription-token-never-in-the-sandbox";
const PLACEHOLDER: &str = "metash-placeholder";

/// What a live CLI process held while it waited for the model: its command line, its
/// environment, and every file of its spawn directory (its HOME, config and CODEX_HOME).
#[derive(Debug, Clone, Default)]
struct Held {
    cmd: String,
    env: String,
    files: Vec<(PathBuf, String)>,
}

/// Every live process whose command line contains `needle` and whose working directory is
/// `cwd` (this test's CLI, not another test's running at the same time), as it is now.
fn held_by(needle: &str, cwd: &Path) -> Vec<Held> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let p = e.path();
        if std::fs::read_link(p.join("cwd")).ok().as_deref() != Some(cwd) {
            continue;
        }
        let (Ok(cmd), Ok(env)) = (
            std::fs::read(p.join("cmdline")),
            std::fs::read(p.join("environ")),
        ) else {
            continue;
        };
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if !cmd.contains(needle) {
            continue;
        }
        let env = String::from_utf8_lossy(&env).replace('\0', "\n");
        let files = spawn_dir(&env)
            .map(|d| {
                metash_testkit::procs::files_under(&d)
                    .into_iter()
                    .map(|f| {
                        let text = String::from_utf8_lossy(&std::fs::read(&f).unwrap_or_default())
                            .into_owned();
                        (f, text)
                    })
                    .collect()
            })
            .unwrap_or_default();
        out.push(Held { cmd, env, files });
    }
    out
}

/// The spawn's own directory (`metash-spawn-*`), from the HOME in a process's environment.
fn spawn_dir(env: &str) -> Option<PathBuf> {
    let home = env.lines().find_map(|l| l.strip_prefix("HOME="))?;
    Path::new(home)
        .ancestors()
        .find(|a| {
            a.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("metash-spawn-"))
        })
        .map(Path::to_path_buf)
}

/// None of `secrets` is anywhere the CLI could read, nor in the project's files (the log too).
fn assert_nowhere(secrets: &[&str], held: &[Held], project: &Path) {
    assert!(!held.is_empty(), "the CLI was running during its request");
    for h in held {
        assert!(
            !h.files.is_empty(),
            "the spawn's files were read: {}",
            h.cmd
        );
        for s in secrets {
            assert!(!h.cmd.contains(s), "a token in the CLI's argv: {}", h.cmd);
            assert!(
                !h.env.contains(s),
                "a token in the CLI's environment: {}",
                h.cmd
            );
            for (f, text) in &h.files {
                assert!(
                    !text.contains(s),
                    "a token in the sandbox's {}",
                    f.display()
                );
            }
        }
    }
    for f in metash_testkit::procs::files_under(project) {
        let text = String::from_utf8_lossy(&std::fs::read(&f).unwrap_or_default()).into_owned();
        for s in secrets {
            assert!(!text.contains(s), "{} holds a token", f.display());
        }
    }
}

/// A loopback OAuth token endpoint: each POST's path, headers and JSON body recorded, answered
/// `200 application/json` with what `answer` returns.
struct TokenServer {
    base: String,
    seen: Arc<TokenLog>,
}

impl TokenServer {
    fn start(answer: impl Fn(&Value) -> Value + Send + Sync + 'static) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let base = format!("http://{}", listener.local_addr().expect("addr"));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (log, answer) = (Arc::clone(&seen), Arc::new(answer));
        std::thread::spawn(move || {
            for sock in listener.incoming().flatten() {
                let (log, answer) = (Arc::clone(&log), Arc::clone(&answer));
                std::thread::spawn(move || serve_token(sock, &log, &*answer));
            }
        });
        Self { base, seen }
    }

    fn requests(&self) -> Vec<TokenRequest> {
        self.seen.lock().expect("lock").clone()
    }
}

/// A token request: its path, headers (names lowercased) and JSON body.
type TokenRequest = (String, Vec<(String, String)>, Value);
type TokenLog = Mutex<Vec<TokenRequest>>;

fn serve_token(sock: TcpStream, log: &TokenLog, answer: &dyn Fn(&Value) -> Value) {
    use std::io::{BufRead, BufReader, Read, Write};
    let mut reader = BufReader::new(sock.try_clone().expect("clone"));
    let mut line = String::new();
    let _ = reader.read_line(&mut line);
    let path = line
        .split_whitespace()
        .nth(1)
        .unwrap_or_default()
        .to_string();
    let (mut headers, mut len) = (Vec::new(), 0usize);
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).unwrap_or(0) == 0 || h.trim().is_empty() {
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
    let _ = reader.read_exact(&mut body);
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let out = answer(&body).to_string();
    log.lock().expect("lock").push((path, headers, body));
    let mut sock = sock;
    let _ = write!(
        sock,
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{out}",
        out.len()
    );
}

/// A JWT with `payload` (unsigned: only its claims are read).
fn jwt(payload: &Value) -> String {
    let e = |v: &Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
    format!(
        "{}.{}.c2ln",
        e(&json!({"alg": "RS256", "typ": "JWT"})),
        e(payload)
    )
}

fn now_s() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// A project with the CLIs' `.tools` and `config`, and a host whose environment is `env` only
/// (the keys set empty, so nothing from the test's own environment is used).
fn host_with(project: &Project, tools: &Path, config: &str, env: &[(&str, &str)]) -> Host {
    std::os::unix::fs::symlink(tools, project.path().join(".tools")).expect("link .tools");
    project.config(config);
    let mut opts = HostOptions::silent().with_yes_to(["native".parse().expect("capability")]);
    for (k, v) in [
        ("ANTHROPIC_API_KEY", ""),
        ("OPENAI_API_KEY", ""),
        ("CLAUDE_CODE_OAUTH_TOKEN", ""),
        ("CLAUDE_CONFIG_DIR", ""),
        ("CODEX_HOME", ""),
    ]
    .iter()
    .chain(env)
    {
        opts = opts.with_env(k, v);
    }
    Host::open(project.path(), opts).expect("host")
}

fn spawn(host: &Host, role: &str) -> metash_protocol::AgentResponse {
    let mut req = SpawnRequest::new(role, "Answer briefly.", "Say something.");
    req.options.timeout_seconds = Some(120.0);
    host.spawn_agent(&req).expect("spawn")
}

#[test]
fn claude_code_with_only_an_oauth_token_sends_the_token_as_a_bearer() {
    let Some(tools) = Cli::Claude.installed("claude_code_with_only_an_oauth_token") else {
        return;
    };
    let p = Project::new();
    let (server, held) = watching_server("claude.exe", &p, || {
        sse_text("answered on your subscription")
    });
    let home = tempfile::tempdir().expect("home");
    let host = host_with(
        &p,
        &tools,
        &format!(
            "[roles.coder]\nfrontend = \"agent-sdk\"\nmodel_smart = \"claude-sonnet-4-5\"\n\
             base_url = \"{}\"\n",
            server.base
        ),
        &[
            ("CLAUDE_CODE_OAUTH_TOKEN", OAUTH_TOKEN),
            ("HOME", &home.path().to_string_lossy()),
        ],
    );
    let r = spawn(&host, "coder");
    assert_eq!(r.status, AgentStatus::Success, "{r:?}");
    assert!(
        r.data.contains("answered on your subscription"),
        "{}",
        r.data
    );

    let posts = server.posts();
    assert!(!posts.is_empty());
    for c in &posts {
        assert_eq!(
            c.header("authorization"),
            Some(format!("Bearer {OAUTH_TOKEN}").as_str()),
            "the model gets the real token as Claude Code sends a subscription's"
        );
        let beta = c.header("anthropic-beta").unwrap_or_default();
        assert!(
            beta.split(',').any(|b| b.trim() == "oauth-2025-04-20"),
            "{beta}"
        );
        assert_eq!(c.header("x-api-key"), None, "{:?}", c.headers);
        assert!(
            c.headers.iter().all(|(_, v)| !v.contains(PLACEHOLDER)),
            "{:?}",
            c.headers
        );
    }
    let held = held.lock().expect("lock").clone();
    for h in &held {
        assert!(
            h.env
                .contains(&format!("CLAUDE_CODE_OAUTH_TOKEN={PLACEHOLDER}")),
            "the CLI signs in with the placeholder: {}",
            h.env
        );
    }
    assert_nowhere(&[OAUTH_TOKEN], &held, p.path());
}

/// A model server that, while the CLI waits for each answer, records what every process whose
/// command line holds `needle` holds.
fn watching_server(
    needle: &'static str,
    project: &Project,
    reply: impl Fn() -> String + Send + Sync + 'static,
) -> (ModelServer, Arc<Mutex<Vec<Held>>>) {
    let held = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&held);
    let cwd = project.path().canonicalize().expect("project");
    let server = ModelServer::start(move |_| {
        seen.lock().expect("lock").extend(held_by(needle, &cwd));
        reply()
    });
    (server, held)
}

/// `claude login`'s file under `home`, its token expired a minute ago.
fn expired_claude_login(home: &Path, access: &str, refresh: &str) -> PathBuf {
    let dir = home.join(".claude");
    std::fs::create_dir_all(&dir).expect("dir");
    let creds = dir.join(".credentials.json");
    let doc = json!({"claudeAiOauth": {"accessToken": access, "refreshToken": refresh,
        "expiresAt": (now_s() - 60) * 1000, "scopes": ["user:inference", "user:profile"],
        "subscriptionType": "max", "rateLimitTier": "default_claude_max_5x"},
        "mcpOAuth": {"kept": true}});
    std::fs::write(&creds, doc.to_string()).expect("credentials");
    creds
}

/// One refresh grant, as Claude Code sends it.
fn assert_claude_grant(tokens: &TokenServer, refresh: &str) {
    let reqs = tokens.requests();
    assert_eq!(reqs.len(), 1, "{reqs:?}");
    let (path, headers, body) = &reqs[0];
    assert_eq!(path, "/v1/oauth/token");
    assert!(headers
        .iter()
        .any(|(k, v)| k == "content-type" && v == "application/json"));
    assert_eq!(body["grant_type"], "refresh_token");
    assert_eq!(body["refresh_token"], refresh);
    assert_eq!(body["client_id"], "9d1c250a-e61b-44d9-88ed-5944d1962f5e");
    let scope = body["scope"].as_str().unwrap_or_default();
    assert!(scope.split(' ').any(|s| s == "user:inference"), "{scope}");
}

/// The user's file holds the new tokens as the CLI would have written them (its other fields
/// kept, mode 0600), and Claude Code's locks were let go.
fn assert_claude_file(creds: &Path, new: &str, new_refresh: &str) {
    let doc: Value = serde_json::from_slice(&std::fs::read(creds).expect("read")).expect("json");
    let o = &doc["claudeAiOauth"];
    assert_eq!(o["accessToken"], new);
    assert_eq!(o["refreshToken"], new_refresh);
    let expires = o["expiresAt"].as_i64().unwrap_or_default();
    assert!(expires > now_s() * 1000 + 3_600_000, "{o}");
    assert_eq!(o["subscriptionType"], "max");
    assert_eq!(o["rateLimitTier"], "default_claude_max_5x");
    assert_eq!(doc["mcpOAuth"]["kept"], true);
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(creds).expect("meta").permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    let dir = creds.parent().expect("dir");
    assert!(!dir.join(".oauth_refresh.lock").exists());
    assert!(!dir.with_extension("lock").exists());
}

#[test]
fn an_expired_claude_login_is_renewed_by_the_proxy_and_written_back() {
    let Some(tools) = Cli::Claude.installed("an_expired_claude_login_is_renewed") else {
        return;
    };
    let (old, refresh, new, new_refresh) = (
        "sk-ant-oat01-old-access-expired",
        "sk-ant-ort01-refresh-spent-once",
        "sk-ant-oat01-new-access-from-renewal",
        "sk-ant-ort01-refresh-rotated",
    );
    let tokens = TokenServer::start(move |_| {
        json!({"token_type": "Bearer", "access_token": new, "refresh_token": new_refresh,
               "expires_in": 28800, "scope": "user:inference user:profile"})
    });
    let p = Project::new();
    let (server, held) = watching_server("claude.exe", &p, || sse_text("renewed and answered"));
    let home = tempfile::tempdir().expect("home");
    let creds = expired_claude_login(home.path(), old, refresh);
    let host = host_with(
        &p,
        &tools,
        &format!(
            "[roles.coder]\nfrontend = \"claude-code\"\nmodel_smart = \"claude-sonnet-4-5\"\n\
             base_url = \"{}\"\nauth = \"subscription\"\n",
            server.base
        ),
        &[
            ("HOME", &home.path().to_string_lossy()),
            (
                "METASH_CLAUDE_OAUTH_TOKEN_URL",
                &format!("{}/v1/oauth/token", tokens.base),
            ),
        ],
    );
    let r = spawn(&host, "coder");
    assert_eq!(r.status, AgentStatus::Success, "{r:?}");
    assert_claude_grant(&tokens, refresh);
    // The model got the renewed token, never the old one nor the placeholder.
    let posts = server.posts();
    assert!(!posts.is_empty());
    for c in &posts {
        let bearer = format!("Bearer {new}");
        assert_eq!(c.header("authorization"), Some(bearer.as_str()));
    }
    assert_claude_file(&creds, new, new_refresh);
    let held = held.lock().expect("lock").clone();
    assert_nowhere(&[old, refresh, new, new_refresh], &held, p.path());
}

/// `codex login`'s `auth.json` in `codex_home`, its access token expired.
fn expired_codex_login(codex_home: &Path, id_token: &str, access: &str, refresh: &str) -> PathBuf {
    std::fs::create_dir_all(codex_home).expect("dir");
    let auth = codex_home.join("auth.json");
    let doc = json!({"OPENAI_API_KEY": null, "tokens": {"id_token": id_token,
        "access_token": access, "refresh_token": refresh, "account_id": ACCOUNT},
        "last_refresh": "2025-01-01T00:00:00Z"});
    std::fs::write(&auth, serde_json::to_vec_pretty(&doc).expect("json")).expect("auth.json");
    auth
}

const ACCOUNT: &str = "acct-real-7f3c";

/// Every request that reached the backend (the responses, the model list) was on the ChatGPT
/// backend's path and carried the real token and account; none the placeholder.
fn assert_codex_backend(server: &ModelServer, bearer: &str) {
    let all = server.requests.lock().expect("lock").clone();
    assert!(
        all.iter()
            .any(|c| c.method == "POST" && c.path == "/backend-api/codex/responses"),
        "{:?}",
        all.iter().map(|c| &c.path).collect::<Vec<_>>()
    );
    for c in &all {
        assert!(c.path.starts_with("/backend-api/codex/"), "{}", c.path);
        let expected = format!("Bearer {bearer}");
        assert_eq!(c.header("authorization"), Some(expected.as_str()));
        assert_eq!(c.header("chatgpt-account-id"), Some(ACCOUNT));
        assert!(
            c.headers.iter().all(|(_, v)| !v.contains(PLACEHOLDER)),
            "{:?}",
            c.headers
        );
    }
}

/// The user's `auth.json` holds the new tokens and a fresh `last_refresh`.
fn assert_codex_file(auth: &Path, new: &str, new_refresh: &str) {
    let doc: Value = serde_json::from_slice(&std::fs::read(auth).expect("read")).expect("json");
    assert_eq!(doc["tokens"]["access_token"], new);
    assert_eq!(doc["tokens"]["refresh_token"], new_refresh);
    assert_eq!(doc["tokens"]["account_id"], ACCOUNT);
    let last = doc["last_refresh"].as_str().unwrap_or_default();
    let at = chrono::DateTime::parse_from_rfc3339(last).expect("an RFC 3339 last_refresh");
    assert!(
        (now_s() - at.timestamp()).abs() < 600,
        "renewed now: {last}"
    );
}

#[test]
fn codex_login_reaches_the_chatgpt_backend_with_the_real_token_and_account() {
    let Some(tools) = Cli::Codex.installed("codex_login_reaches_the_chatgpt_backend") else {
        return;
    };
    let claims = json!({"email": "me@example.com", "https://api.openai.com/auth":
        {"chatgpt_account_id": ACCOUNT, "chatgpt_plan_type": "plus"}});
    let old = jwt(&json!({"exp": now_s() - 30, "scope": "old-access"}));
    let new = jwt(&json!({"exp": now_s() + 3600, "scope": "new-access"}));
    let (refresh, new_refresh) = ("rt-codex-real-spent-once", "rt-codex-rotated");
    let tokens = {
        let (id, new) = (jwt(&claims), new.clone());
        TokenServer::start(
            move |_| json!({"id_token": id, "access_token": new, "refresh_token": new_refresh}),
        )
    };
    let p = Project::new();
    let (server, held) = watching_server("exec --json", &p, || {
        Cli::Codex.text("answered on your ChatGPT plan")
    });
    let home = tempfile::tempdir().expect("home");
    let codex_home = home.path().join(".codex");
    let auth = expired_codex_login(&codex_home, &jwt(&claims), &old, refresh);
    let host = host_with(
        &p,
        &tools,
        &format!(
            "[roles.coder]\nfrontend = \"codex-cli\"\nmodel_smart = \"gpt-5.1-codex\"\n\
             base_url = \"{}/backend-api/codex\"\n",
            server.base
        ),
        &[
            ("HOME", &home.path().to_string_lossy()),
            ("CODEX_HOME", &codex_home.to_string_lossy()),
            (
                "CODEX_REFRESH_TOKEN_URL_OVERRIDE",
                &format!("{}/oauth/token", tokens.base),
            ),
        ],
    );
    let r = spawn(&host, "coder");
    assert_eq!(r.status, AgentStatus::Success, "{r:?}");
    assert!(
        r.data.contains("answered on your ChatGPT plan"),
        "{}",
        r.data
    );
    let reqs = tokens.requests();
    assert_eq!(reqs.len(), 1, "{reqs:?}");
    assert_eq!(reqs[0].0, "/oauth/token");
    assert_eq!(
        reqs[0].2,
        json!({"client_id": "app_EMoamEEZ73f0CkXaXp7hrann", "grant_type": "refresh_token",
               "refresh_token": refresh})
    );
    assert_codex_backend(&server, &new);
    assert_codex_file(&auth, &new, new_refresh);
    let held = held.lock().expect("lock").clone();
    for h in &held {
        let placeholder_auth = h.files.iter().find(|(f, _)| f.ends_with("auth.json"));
        assert!(
            placeholder_auth.is_some_and(|(_, t)| t.contains(PLACEHOLDER)),
            "Codex signs in with the placeholder"
        );
    }
    assert_nowhere(
        &[&old, &new, refresh, new_refresh, ACCOUNT],
        &held,
        p.path(),
    );
}

#[test]
fn a_subscription_role_without_a_sign_in_says_how_to_sign_in() {
    let p = Project::new();
    let home = tempfile::tempdir().expect("home");
    let h = home.path().to_string_lossy().into_owned();
    p.config(
        "[roles.sub]\nfrontend = \"agent-sdk\"\nauth = \"subscription\"\n\
         [roles.auto]\nfrontend = \"codex-cli\"\nauth = \"subscription\"\n",
    );
    let mut opts = HostOptions::silent();
    for (k, v) in [
        ("HOME", h.as_str()),
        ("CLAUDE_CODE_OAUTH_TOKEN", ""),
        ("CLAUDE_CONFIG_DIR", ""),
        ("CODEX_HOME", ""),
        ("ANTHROPIC_API_KEY", ""),
    ] {
        opts = opts.with_env(k, v);
    }
    let host = Host::open(p.path(), opts).expect("host");
    let roles = host.config().roles.clone();
    let err = host
        .preflight_role("sub", &roles["sub"])
        .expect_err("no sign-in");
    assert!(err.to_string().contains("claude login"), "{err}");
    let err = host
        .preflight_role("auto", &roles["auto"])
        .expect_err("no sign-in");
    assert!(err.to_string().contains("codex login"), "{err}");
    // A key role without its key names the variable and the sign-in alternative.
    let p2 = Project::new();
    p2.config("[roles.k]\nfrontend = \"agent-sdk\"\n");
    let mut opts = HostOptions::silent();
    for (k, v) in [
        ("HOME", h.as_str()),
        ("CLAUDE_CODE_OAUTH_TOKEN", ""),
        ("ANTHROPIC_API_KEY", ""),
    ] {
        opts = opts.with_env(k, v);
    }
    let host = Host::open(p2.path(), opts).expect("host");
    let err = host
        .preflight_role("k", &host.config().roles["k"].clone())
        .expect_err("no key");
    let text = err.to_string();
    assert!(
        text.contains("ANTHROPIC_API_KEY") && text.contains("claude login"),
        "{text}"
    );
    // A frontend without sign-ins refuses `auth = "subscription"` when the file is read.
    let p3 = Project::new();
    p3.config("[roles.x]\nfrontend = \"pi-sdk\"\nauth = \"subscription\"\n");
    let err = Host::open(p3.path(), HostOptions::silent())
        .map(|_| ())
        .expect_err("refused");
    assert!(err.to_string().contains("subscription"), "{err}");
}
