#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Issue 36 item 1 for interactive sessions (docs/replay.md): a real pi started by `metash
//! session start` in a window of a private tmux server, against a loopback model, gets a prompt
//! typed into its pane; when its pane is killed, its launcher saves the session's exchanges as a
//! tape tagged with the session's id (no task), which `metash tape list` shows as `session <id>`
//! and `metash tape show` holds the typed prompt in. The model echoes the key it was sent back in
//! its answer; no byte under `.meta/tapes/` holds the key or the placeholder. Without tmux or pi
//! the test is skipped (a failure when CI is set).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use metash_testkit::anthropic::ModelServer;
use metash_testkit::cli::Cli;
use serde_json::Value;

const KEY: &str = "sk-session-tape-key-0123456789abcdef";
const CLI: Cli = Cli::Pi;

/// A project, a private tmux server, the session's directories, and the CLIs' `.tools`.
struct Place {
    ws: tempfile::TempDir,
    state: tempfile::TempDir,
    sock: PathBuf,
    tools: PathBuf,
}

impl Drop for Place {
    fn drop(&mut self) {
        let _ = self.tmux(&["kill-server"]);
    }
}

impl Place {
    fn metash(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_metash"))
            .arg("-C")
            .arg(self.ws.path())
            .args(args)
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("HOME", self.state.path())
            .env("METASH_TMUX_SOCKET", &self.sock)
            .env("METASH_SESSIONS_DIR", self.state.path().join("sessions"))
            .env("METASH_TOOLS_DIR", &self.tools)
            .env("METASH_TEST_CLI_KEY", KEY)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    fn tmux(&self, args: &[&str]) -> Output {
        Command::new("tmux")
            .arg("-S")
            .arg(&self.sock)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    fn json(&self, args: &[&str]) -> Value {
        let out = self.metash(args);
        assert!(out.status.success(), "{args:?}: {}", text(&out));
        serde_json::from_slice(&out.stdout).unwrap()
    }

    fn status(&self, id: &str) -> Value {
        self.json(&["sessions", "--json"])
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["id"] == id)
            .cloned()
            .unwrap_or(Value::Null)
    }

    fn screen(&self, target: &str) -> String {
        metash_testkit::tmux::screen(&|a| self.tmux(a), target)
    }

    /// Types a prompt until the model got it (`metash_testkit::tmux::type_prompt`).
    fn type_prompt(&self, target: &str, line: &str, reached: impl Fn() -> bool) {
        metash_testkit::tmux::type_prompt(&|a| self.tmux(a), target, line, reached)
    }
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn wait_until(
    what: &str,
    within: Duration,
    mut ok: impl FnMut() -> bool,
    why: impl Fn() -> String,
) {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    panic!("{what}: not within {within:?}\n{}", why());
}

/// tmux and pi here, or a skip (a failure under CI).
fn ready(test: &str) -> Option<PathBuf> {
    let tmux = Command::new("tmux")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success());
    if !tmux {
        metash_testkit::skip(test, "tmux is not installed (scripts/setup installs it)");
        return None;
    }
    CLI.installed(test)
}

/// Every file under `.meta/tapes/` holds neither the key nor the placeholder.
fn no_key_stored(ws: &Path) {
    let mut stack = vec![ws.join(".meta/tapes")];
    let mut files = 0;
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = e.path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let bytes = std::fs::read(&path).unwrap();
            let text = String::from_utf8_lossy(&bytes);
            for secret in [KEY, "metash-placeholder"] {
                assert!(!text.contains(secret), "{} holds {secret}", path.display());
            }
            files += 1;
        }
    }
    assert!(files >= 2, "an index and its blobs");
}

#[test]
fn an_interactive_session_is_recorded_under_its_id_without_its_key() {
    let test = "an_interactive_session_is_recorded_under_its_id_without_its_key";
    let Some(tools) = ready(test) else {
        return;
    };
    let state = tempfile::tempdir().unwrap();
    let place = Place {
        ws: tempfile::tempdir().unwrap(),
        sock: state.path().join("tmux.sock"),
        state,
        tools,
    };
    assert!(place.metash(&["init"]).status.success());
    // The model answers the typed prompt with the credential it was sent.
    let server = ModelServer::start(|c| {
        if !c.text().contains("TAPED-PROMPT") {
            return CLI.text("ok");
        }
        let sent = c.header("authorization").unwrap_or("none");
        CLI.text(&format!("TAPED-ANSWER {sent}"))
    });
    std::fs::write(
        place.ws.path().join(".meta/config.toml"),
        CLI.role("coder", &server.base),
    )
    .unwrap();
    let started = place.json(&[
        "session", "start", "--role", "coder", "--yes-to", "native", "--json",
    ]);
    let id = started["id"].as_str().unwrap().to_string();
    let target = started["tmux_target"].as_str().unwrap().to_string();
    wait_until(
        "pi draws its UI",
        Duration::from_secs(60),
        || place.screen(&target).trim().len() > 20,
        || place.screen(&target),
    );
    place.type_prompt(&target, "TAPED-PROMPT", || {
        server
            .posts()
            .iter()
            .any(|c| c.text().contains("TAPED-PROMPT"))
    });
    wait_until(
        "the answer is shown",
        Duration::from_secs(90),
        || place.screen(&target).contains("TAPED-ANSWER"),
        || place.screen(&target),
    );
    assert!(
        server
            .posts()
            .iter()
            .any(|c| c.header("authorization") == Some(&format!("Bearer {KEY}"))),
        "the model never got the key"
    );
    // Its pane killed: the launcher stops the proxy and saves the tape, then says `exited`.
    let window = place.status(&id)["terminal"]["window_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(place.tmux(&["kill-pane", "-t", &window]).status.success());
    wait_until(
        "the session shows exited",
        Duration::from_secs(30),
        || place.status(&id)["status"] == "exited",
        || format!("{:?}", place.status(&id)),
    );
    // The launcher, told by the hangup, saves the tape as it ends.
    wait_until(
        "the session's tape is saved",
        Duration::from_secs(30),
        || !text(&place.metash(&["tape", "list"])).contains("no tapes"),
        || format!("{:?}", place.status(&id)),
    );
    let listed = place.metash(&["tape", "list"]);
    assert!(
        text(&listed).contains(&format!("coder  session {id}")),
        "{}",
        text(&listed)
    );
    let list = place.json(&["--json", "tape", "list"]);
    let tape = list
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["session_id"] == id.as_str())
        .unwrap_or_else(|| panic!("no tape of session {id}: {list}"));
    assert!(tape["task"].is_null(), "{tape}");
    let tape_id = tape["id"].as_str().unwrap();
    let shown = place.json(&["--json", "tape", "show", tape_id, "--bodies"]);
    assert_eq!(shown["frontend"], "pi-sdk", "{shown}");
    assert!(shown["spawn"].is_null(), "{shown}");
    assert!(shown.to_string().contains("TAPED-PROMPT"), "{shown}");
    assert!(
        shown.to_string().contains("TAPED-ANSWER Bearer *"),
        "{shown}"
    );
    no_key_stored(place.ws.path());
}
