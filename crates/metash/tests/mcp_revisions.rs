#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Issue 34 item 3: `metash mcp` serves both MCP eras on the same stdio server, each driven by real
//! client libraries from the registries, pinned and installed by scripts/setup:
//! - 2025-11-25 (the `initialize` handshake): PyPI's `mcp` 1.30.0 and npm's
//!   `@modelcontextprotocol/sdk` 1.26.0, whose newest revision it is;
//! - 2026-07-28 (stateless, every request carrying its version in `_meta`): PyPI's `mcp` 2.3.0 and
//!   npm's `@modelcontextprotocol/client` 2.4.0, each in its `auto` mode (probe with
//!   `server/discover`, fall back to `initialize` only for a legacy server), and `mcp` 2.3.0
//!   pinned to 2026-07-28 without the probe.
//!
//! Each client lists the tools, sets a state key, reads it back and logs a progress line
//! (tests/support/mcp_client.py and mcp_client.cjs). The wire is recorded on both sides (`tee`
//! around `metash mcp`), so the test checks what the library really sent and what metash answered,
//! and the store is read afterwards with the CLI: the calls took effect.

use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

const BIN: &str = env!("CARGO_BIN_EXE_metash");
const TOOLS: [&str; 5] = [
    "answer_checkpoint",
    "get_state",
    "log_progress",
    "spawn_agent",
    "update_state",
];
const PROTOCOL_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
const SERVER_INFO: &str = "io.modelcontextprotocol/serverInfo";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn metash(ws: &Path, args: &[&str]) -> Output {
    Command::new(BIN)
        .current_dir(ws)
        .args(args)
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// A fresh git project with `metash init` run in it.
fn project(dir: &Path) -> PathBuf {
    let ws = dir.join("p");
    std::fs::create_dir_all(&ws).unwrap();
    let git = Command::new("git")
        .args(["init", "-q"])
        .current_dir(&ws)
        .output()
        .unwrap();
    assert!(git.status.success(), "{git:?}");
    let init = metash(&ws, &["init"]);
    assert!(init.status.success(), "metash init: {init:?}");
    ws
}

/// How to start one client library's script: the program and its leading arguments, and the
/// environment that finds the library.
struct Client {
    program: PathBuf,
    args: Vec<OsString>,
    env: Vec<(&'static str, PathBuf)>,
}

/// PyPI's `mcp` at `version` (in .tools/mcp-py/VERSION) under the setup script's Python, or why
/// it is not there.
fn python_client(version: &str) -> Result<Client, String> {
    let python = repo().join(".tools/py/bin/python");
    let lib = repo().join(".tools/mcp-py").join(version);
    if !python.exists() {
        return Err(format!(
            "{} is missing (run scripts/setup)",
            python.display()
        ));
    }
    if !lib.join("mcp").is_dir() {
        return Err(format!(
            "mcp {version} is not in {} (run scripts/setup)",
            lib.display()
        ));
    }
    Ok(Client {
        program: python,
        args: vec![repo()
            .join("crates/metash/tests/support/mcp_client.py")
            .into()],
        env: vec![("PYTHONPATH", lib)],
    })
}

/// npm's `package` (in .tools/node_modules) under Node, or why it is not there.
fn node_client(package: &str) -> Result<Client, String> {
    let tools = repo().join(".tools");
    if !tools
        .join("node_modules")
        .join(package)
        .join("package.json")
        .exists()
    {
        return Err(format!(
            "{package} is not in .tools/node_modules (run scripts/setup)"
        ));
    }
    let node = Command::new("node").arg("--version").output();
    if !node.is_ok_and(|o| o.status.success()) {
        return Err("`node --version` does not run (Node 20; scripts/setup)".into());
    }
    Ok(Client {
        program: PathBuf::from("node"),
        args: vec![
            repo()
                .join("crates/metash/tests/support/mcp_client.cjs")
                .into(),
            tools.into(),
        ],
        env: Vec::new(),
    })
}

/// What one client run produced: its own summary and both directions of the wire.
struct Run {
    summary: Value,
    sent: Vec<Value>,
    received: Vec<Value>,
}

impl Run {
    fn reply_to(&self, method: &str) -> Vec<&Value> {
        let ids: Vec<&Value> = self
            .sent
            .iter()
            .filter(|m| m["method"] == method)
            .map(|m| &m["id"])
            .collect();
        self.received
            .iter()
            .filter(|m| ids.contains(&&m["id"]) && m.get("result").is_some())
            .collect()
    }
}

fn json_lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

/// Runs `client` in `mode` (`legacy`, `auto` or a version to pin) against `metash mcp` in `ws`.
fn drive(ws: &Path, client: &Client, mode: &str, value: &str) -> Run {
    let wire = ws.join("wire");
    std::fs::create_dir_all(&wire).unwrap();
    let (sent, received) = (wire.join("sent.jsonl"), wire.join("received.jsonl"));
    let mut child = Command::new(&client.program)
        .current_dir(ws)
        .envs(client.env.iter().map(|(k, v)| (k, v)))
        .env("NO_COLOR", "1")
        .args(&client.args)
        .args([mode, value, "--", "sh", "-c"])
        .arg(r#"tee "$1" | "$2" mcp --quiet | tee "$3""#)
        .arg("sh")
        .args([&sent, Path::new(BIN), &received])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the client failed ({:?}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let summary = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "client output ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    Run {
        summary,
        sent: json_lines(&sent),
        received: json_lines(&received),
    }
}

/// The tools were listed and the calls took effect in the store: the state key holds `value`
/// and the progress line is in the log.
fn assert_served(ws: &Path, run: &Run, value: &str) {
    let s = &run.summary;
    assert_eq!(s["tools"], json!(TOOLS), "{s}");
    for call in ["update_state", "get_state", "log_progress"] {
        assert_eq!(s[call]["is_error"], false, "{call}: {s}");
    }
    assert_eq!(s["get_state"]["text"], value, "{s}");
    let state = metash(ws, &["--json", "state", "get", "variables.revision_probe"]);
    assert!(state.status.success(), "{state:?}");
    let stored: Value = serde_json::from_slice(&state.stdout).unwrap();
    assert_eq!(stored, json!(value));
    let log = metash(ws, &["--json", "log", "export"]);
    let message = format!("revision probe {value}");
    let logged = String::from_utf8_lossy(&log.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .any(|r| r["kind"] == "progress" && r["data"]["message"] == message.as_str());
    assert!(logged, "no progress record {message:?} in the log");
}

/// A 2025-11-25 client: `initialize`, then a session without per-request metadata; results
/// carry no 2026-07-28 fields. `library` is what the script reports (`NAME VERSION`).
fn speaks_2025_11_25(client: Result<Client, String>, library: &str) {
    let client = match client {
        Ok(found) => found,
        Err(why) => return metash_testkit::skip(&format!("{library} against metash mcp"), &why),
    };
    let dir = tempfile::tempdir().unwrap();
    let ws = project(dir.path());
    let value = format!("legacy {library}");
    let run = drive(&ws, &client, "legacy", &value);
    assert_eq!(run.summary["library"], library);
    assert_eq!(run.summary["protocol_version"], "2025-11-25");
    assert_served(&ws, &run, &value);
    assert_eq!(run.summary["server_name"], "metash");

    assert_eq!(run.sent[0]["method"], "initialize", "{:?}", run.sent[0]);
    assert_eq!(run.sent[0]["params"]["protocolVersion"], "2025-11-25");
    assert!(run.sent.iter().all(|m| m["method"] != "server/discover"));
    let init = run.reply_to("initialize");
    assert_eq!(init.len(), 1);
    assert_eq!(init[0]["result"]["protocolVersion"], "2025-11-25");
    assert_eq!(init[0]["result"]["serverInfo"]["name"], "metash");
    let calls = run.reply_to("tools/call");
    assert_eq!(calls.len(), 3);
    for reply in run.reply_to("tools/list").iter().chain(&calls) {
        for field in ["resultType", "ttlMs", "cacheScope", "_meta"] {
            let result = &reply["result"];
            assert!(
                result.get(field).is_none(),
                "{field} in a 2025-11-25 result: {reply}"
            );
        }
    }
}

/// A 2026-07-28 client in `auto` mode: `server/discover` first, no `initialize`, every request
/// self-describing; results say `resultType` and name the server, the list has the cache hints.
fn speaks_2026_07_28(client: Result<Client, String>, library: &str) {
    let client = match client {
        Ok(found) => found,
        Err(why) => return metash_testkit::skip(&format!("{library} against metash mcp"), &why),
    };
    let dir = tempfile::tempdir().unwrap();
    let ws = project(dir.path());
    let value = format!("modern {library}");
    let run = drive(&ws, &client, "auto", &value);
    assert_eq!(run.summary["library"], library);
    assert_eq!(run.summary["protocol_version"], "2026-07-28");
    assert_served(&ws, &run, &value);
    assert_eq!(
        run.summary["server_name"], "metash",
        "from the discover result"
    );

    assert_eq!(
        run.sent[0]["method"], "server/discover",
        "{:?}",
        run.sent[0]
    );
    assert_stateless(&run);
    let discover = run.reply_to("server/discover");
    assert_eq!(discover.len(), 1);
    let found = &discover[0]["result"];
    let all = [
        "2024-11-05",
        "2025-03-26",
        "2025-06-18",
        "2025-11-25",
        "2026-07-28",
    ];
    assert_eq!(found["supportedVersions"], json!(all), "{found}");
    assert_eq!(found["capabilities"]["tools"], json!({}), "{found}");
    assert_eq!(found["_meta"][SERVER_INFO]["name"], "metash", "{found}");
    let list = run.reply_to("tools/list");
    assert_eq!(list.len(), 1);
    assert_eq!(list[0]["result"]["ttlMs"], 0, "{}", list[0]);
    assert_eq!(list[0]["result"]["cacheScope"], "public", "{}", list[0]);
    let calls = run.reply_to("tools/call");
    assert_eq!(calls.len(), 3);
    for reply in list.iter().chain(&calls) {
        assert_eq!(reply["result"]["resultType"], "complete", "{reply}");
        let named = &reply["result"]["_meta"][SERVER_INFO]["name"];
        assert_eq!(named, "metash", "{reply}");
    }
}

/// No handshake message was sent, and every request carried 2026-07-28 in its `_meta`.
fn assert_stateless(run: &Run) {
    for m in &run.sent {
        assert!(
            m["method"] != "initialize" && m["method"] != "notifications/initialized",
            "a handshake message from a 2026-07-28 client: {m}"
        );
        if m.get("id").is_some() {
            assert_eq!(m["params"]["_meta"][PROTOCOL_VERSION], "2026-07-28", "{m}");
        }
    }
}

#[test]
fn pypi_mcp_1_30_0_speaks_2025_11_25() {
    speaks_2025_11_25(python_client("1.30.0"), "mcp 1.30.0");
}

#[test]
fn npm_sdk_1_26_0_speaks_2025_11_25() {
    let client = node_client("@modelcontextprotocol/sdk");
    speaks_2025_11_25(client, "@modelcontextprotocol/sdk 1.26.0");
}

#[test]
fn pypi_mcp_2_3_0_speaks_2026_07_28() {
    speaks_2026_07_28(python_client("2.3.0"), "mcp 2.3.0");
}

#[test]
fn npm_client_2_4_0_speaks_2026_07_28() {
    let client = node_client("@modelcontextprotocol/client");
    speaks_2026_07_28(client, "@modelcontextprotocol/client 2.4.0");
}

/// `metash mcp` answering one hand-written request line (stdin then closed).
fn raw(ws: &Path, request: &Value) -> Value {
    let mut child = Command::new(BIN)
        .current_dir(ws)
        .args(["mcp", "--quiet"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    writeln!(stdin, "{request}").unwrap();
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|m| m["id"] == request["id"])
        .expect("a reply to the request")
}

/// `initialize` asking for 2026-07-28 is answered with 2025-11-25: the newest revision that has
/// a handshake (2026-07-28 has none).
#[test]
fn initialize_asking_for_2026_07_28_gets_2025_11_25() {
    let dir = tempfile::tempdir().unwrap();
    let ws = project(dir.path());
    let request = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2026-07-28", "capabilities": {},
        "clientInfo": {"name": "hand", "version": "0"}}});
    let reply = raw(&ws, &request);
    assert_eq!(reply["result"]["protocolVersion"], "2025-11-25", "{reply}");
}

/// A request naming a revision metash does not speak is refused with the spec's
/// `UnsupportedProtocolVersionError` (-32022) listing what it supports, up to 2026-07-28: a newer
/// rmcp does not silently widen the set.
#[test]
fn an_unknown_revision_is_refused_with_the_supported_list() {
    let dir = tempfile::tempdir().unwrap();
    let ws = project(dir.path());
    let meta = json!({
        PROTOCOL_VERSION: "2099-01-01",
        "io.modelcontextprotocol/clientInfo": {"name": "hand", "version": "0"},
        "io.modelcontextprotocol/clientCapabilities": {},
    });
    let request = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list",
                         "params": {"_meta": meta}});
    let reply = raw(&ws, &request);
    assert_eq!(reply["error"]["code"], -32022, "{reply}");
    assert_eq!(reply["error"]["data"]["requested"], "2099-01-01", "{reply}");
    let supported = reply["error"]["data"]["supported"].as_array().unwrap();
    assert!(supported.contains(&json!("2026-07-28")), "{reply}");
    assert!(supported.contains(&json!("2025-11-25")), "{reply}");
    assert!(
        supported.iter().all(|v| v.as_str() <= Some("2026-07-28")),
        "{reply}"
    );
}

/// A 2026-07-28 client that skips the optional `server/discover` (mcp 2.3.0 pinned with
/// `mode="2026-07-28"`) is served from its first request on: no handshake at all. (The library
/// learns the server's name only from a discover result, so it has none here.)
#[test]
fn pypi_mcp_2_3_0_pinned_to_2026_07_28_is_served_without_discover() {
    let client = match python_client("2.3.0") {
        Ok(found) => found,
        Err(why) => return metash_testkit::skip("mcp 2.3.0 pinned against metash mcp", &why),
    };
    let dir = tempfile::tempdir().unwrap();
    let ws = project(dir.path());
    let run = drive(&ws, &client, "2026-07-28", "inline mcp 2.3.0");
    assert_eq!(run.summary["protocol_version"], "2026-07-28");
    assert_served(&ws, &run, "inline mcp 2.3.0");
    assert_eq!(run.sent[0]["method"], "tools/list", "{:?}", run.sent[0]);
    assert!(run.sent.iter().all(|m| m["method"] != "server/discover"));
    assert_stateless(&run);
    for reply in run.reply_to("tools/call") {
        assert_eq!(reply["result"]["resultType"], "complete", "{reply}");
    }
}
