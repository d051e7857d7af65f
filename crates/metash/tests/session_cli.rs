#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Issue 35: interactive sessions that last. Each real CLI (Claude Code, Codex, pi) is started
//! by `metash session start` in a tmux window of a private tmux server, against a loopback
//! model: a prompt typed into the pane reaches the model; the CLI's shell, confined like a
//! headless role, cannot read a file planted outside the worktree and has no model key; `metash
//! sessions --json` shows the provider and the continuation key; the pane is killed, the session
//! shows `exited`, a resume with the other provider's key is refused, `session resume` starts
//! the CLI again and its next request carries the earlier conversation. Without tmux or a CLI
//! the test is skipped (a failure when CI is set).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use metash_testkit::anthropic::{Captured, ModelServer};
use metash_testkit::cli::Cli;
use serde_json::Value;

const KEY: &str = "sk-session-real-key-0123456789abcdef";
const SECRET: &str = "PLANTED-OUTSIDE-SECRET-4242";

/// A project, a private tmux server, the sessions' directories, and the CLIs' `.tools`.
struct Place {
    ws: tempfile::TempDir,
    state: tempfile::TempDir,
    outside: tempfile::TempDir,
    sock: PathBuf,
    tools: PathBuf,
}

impl Drop for Place {
    fn drop(&mut self) {
        let _ = self.tmux(&["kill-server"]);
    }
}

impl Place {
    fn new(tools: &Path) -> Self {
        let state = tempfile::tempdir().unwrap();
        let place = Self {
            ws: tempfile::tempdir().unwrap(),
            sock: state.path().join("tmux.sock"),
            state,
            outside: tempfile::tempdir().unwrap(),
            tools: tools.to_path_buf(),
        };
        std::fs::write(place.outside.path().join("secret.txt"), SECRET).unwrap();
        let out = place.metash(&["init"]).output().unwrap();
        assert!(out.status.success(), "{}", text(&out));
        place
    }

    fn metash(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_metash"));
        c.arg("-C")
            .arg(self.ws.path())
            .args(args)
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("HOME", self.state.path())
            .env("METASH_TMUX_SOCKET", &self.sock)
            .env("METASH_SESSIONS_DIR", self.state.path().join("sessions"))
            .env("METASH_TOOLS_DIR", &self.tools)
            .env("METASH_TEST_CLI_KEY", KEY)
            .stdin(Stdio::null());
        c
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

    fn config(&self, role: &str) {
        std::fs::write(self.ws.path().join(".meta/config.toml"), role).unwrap();
    }

    fn sessions(&self) -> Vec<Value> {
        let out = self.metash(&["sessions", "--json"]).output().unwrap();
        assert!(out.status.success(), "{}", text(&out));
        serde_json::from_slice::<Value>(&out.stdout)
            .unwrap()
            .as_array()
            .unwrap()
            .clone()
    }

    fn session(&self, id: &str) -> Value {
        self.sessions()
            .into_iter()
            .find(|s| s["id"] == id)
            .unwrap_or_else(|| panic!("no session {id}"))
    }

    fn screen(&self, target: &str) -> String {
        metash_testkit::tmux::screen(&|a| self.tmux(a), target)
    }

    /// Types a prompt until the model got it (`metash_testkit::tmux::type_prompt`).
    fn type_prompt(&self, target: &str, line: &str, reached: impl Fn() -> bool) {
        metash_testkit::tmux::type_prompt(&|a| self.tmux(a), target, line, reached)
    }

    /// Starts (`start`) or resumes the session and returns `(id, tmux target)`.
    fn open(&self, args: &[&str]) -> (String, String) {
        let out = self.metash(args).output().unwrap();
        assert!(out.status.success(), "{args:?}: {}", text(&out));
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        let target = v["tmux_target"].as_str().unwrap().to_string();
        (v["id"].as_str().unwrap().to_string(), target)
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

/// tmux here, or a skip (a failure under CI).
fn tmux_installed(test: &str) -> bool {
    let ok = Command::new("tmux")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        metash_testkit::skip(test, "tmux is not installed (scripts/setup installs it)");
    }
    ok
}

/// The model: the first prompt gets one shell call (read the planted file, count the key in the
/// environment), then an answer; the second prompt gets its own answer.
fn reply(cli: Cli, outside: &Path) -> impl Fn(&Captured) -> String + Send + Sync + 'static {
    let probe = format!(
        "cat {}/secret.txt 2>&1; echo KEYS=$(env | grep -c 'sk-session-rea[l]'); echo PROBE-DONE",
        outside.display()
    );
    move |c: &Captured| {
        let body = c.text();
        if body.contains("SECOND-PROMPT") {
            cli.text("SECOND-ANSWER")
        } else if body.contains("FIRST-PROMPT") && cli.results(&body) == 0 && offers_tools(&body) {
            cli.shell(1, &body, &probe)
        } else if body.contains("FIRST-PROMPT") {
            cli.text("FIRST-ANSWER")
        } else {
            cli.text("ok")
        }
    }
}

/// Side requests (Codex's title, Claude's quota check) offer no tools: they get text.
fn offers_tools(body: &str) -> bool {
    let v: Value = serde_json::from_str(body).unwrap_or_default();
    !metash_testkit::openai::offered_tools(&v).is_empty()
}

/// The request carrying the probe's output: cat's message names the file (`secret.txt: …`), or
/// the file's content; the command itself holds neither.
fn probe_output(server: &ModelServer) -> Option<String> {
    server
        .posts()
        .iter()
        .map(Captured::text)
        .find(|b| b.contains("secret.txt: ") || b.contains(SECRET))
}

fn posts_with(server: &ModelServer, needle: &str) -> Vec<String> {
    server
        .posts()
        .iter()
        .map(Captured::text)
        .filter(|b| b.contains(needle))
        .collect()
}

/// The tokens charged to the budget for session `id` so far.
fn charged(place: &Place, id: &str) -> u64 {
    let log = std::fs::read_to_string(place.ws.path().join(".meta/events.jsonl")).unwrap();
    log.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["kind"] == "budget_charge" && e["data"]["cp_session_id"] == id)
        .filter_map(|e| e["data"]["tokens"].as_u64())
        .sum()
}

/// The processes whose environment mentions `needle` (pid and command line).
fn processes_with(needle: &str) -> Vec<(u32, String)> {
    processes_where(|env, _| env.contains(needle))
}

/// The processes whose environment and command line satisfy `pick`.
fn processes_where(pick: impl Fn(&str, &str) -> bool) -> Vec<(u32, String)> {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(env) = std::fs::read(e.path().join("environ")) else {
            continue;
        };
        let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if pick(&String::from_utf8_lossy(&env), &cmd) {
            found.push((pid, cmd));
        }
    }
    found
}

/// The other provider's frontend, for the refused resume.
fn other_role(cli: Cli, base: &str) -> String {
    match cli {
        Cli::Claude => Cli::Codex.role("coder", base),
        Cli::Codex | Cli::Pi => Cli::Claude.role("coder", base),
    }
}

fn a_session_lasts(cli: Cli, test: &str) {
    if !tmux_installed(test) {
        return;
    }
    let Some(tools) = cli.installed(test) else {
        return;
    };
    let place = Place::new(&tools);
    let server = ModelServer::start(reply(cli, place.outside.path()));
    place.config(&cli.role("coder", &server.base));
    let s = first_run(&place, &server, cli);
    let id = s["id"].as_str().unwrap().to_string();
    let key = s["continuation_key"].as_str().unwrap().to_string();
    killed_and_refused(&place, &server, cli, &s);
    let window = resumed(&place, &server, cli, &id, &key);
    ended(&place, &id, &window);
}

/// Started, a prompt typed, the probe run confined, the key recorded, usage charged: the
/// session's record.
fn first_run(place: &Place, server: &ModelServer, cli: Cli) -> Value {
    let (id, target) = place.open(&[
        "session", "start", "--role", "coder", "--yes-to", "native", "--json",
    ]);
    let provider = match cli {
        Cli::Claude => "anthropic",
        Cli::Codex | Cli::Pi => "openai",
    };
    assert_eq!(place.session(&id)["status"], "running");
    // The CLI's terminal UI is up once it has drawn something; then a typed prompt reaches the
    // model (typed again if the UI was still starting and dropped it).
    wait_until(
        "the CLI draws its UI",
        Duration::from_secs(60),
        || place.screen(&target).trim().len() > 20,
        || place.screen(&target),
    );
    place.type_prompt(&target, "FIRST-PROMPT", || {
        !posts_with(server, "FIRST-PROMPT").is_empty()
    });
    wait_until(
        "the first prompt's tool result reaches the model",
        Duration::from_secs(90),
        || probe_output(server).is_some(),
        || format!("{}\n{:?}", place.screen(&target), place.session(&id)),
    );
    let probed = probe_output(server).unwrap();
    // The answer to the tool result is on the screen: the CLI has it in its conversation.
    wait_until(
        "the first answer is shown",
        Duration::from_secs(60),
        || place.screen(&target).contains("FIRST-ANSWER"),
        || place.screen(&target),
    );
    // Confined: the planted file is unreadable, the key is not in the environment.
    assert!(
        !probed.contains(SECRET),
        "the shell read the planted file: {probed}"
    );
    assert!(probed.contains("Permission denied"), "{probed}");
    assert!(probed.contains("KEYS=0"), "{probed}");
    for p in server.posts() {
        assert!(!p.text().contains(KEY), "the key reached a request body");
    }
    wait_until(
        "the key is recorded",
        Duration::from_secs(30),
        || place.session(&id)["continuation_key"].is_string(),
        || format!("{:?}", place.session(&id)),
    );
    let s = place.session(&id);
    assert_eq!(s["provider"], provider, "{s}");
    assert_eq!(s["status"], "running", "{s}");
    // Its model usage, read on the wire by the credential proxy, is charged to the budget.
    wait_until(
        "the session's usage is charged",
        Duration::from_secs(10),
        || charged(place, &id) > 0,
        || "no budget_charge for the session".to_string(),
    );
    // While it runs, its CLI is seen with the session's HOME (so the check below can fail).
    let home = s["home"].as_str().unwrap().to_string();
    assert!(
        !processes_with(&home).is_empty(),
        "no process has the session's HOME"
    );
    // The key is only in the launcher's memory: neither it nor the CLI has it in its
    // environment or command line (and nor has the tmux server metash started).
    let id = s["id"].as_str().unwrap();
    let mut ours = processes_with(&home);
    // This place's tmux server (its socket is this test's own; other tests' tmux clients hold
    // their user's environment, as any terminal does, and are not the session's).
    let sock = place.sock.display().to_string();
    ours.extend(processes_where(|_, cmd| {
        cmd.contains(id) || (cmd.starts_with("tmux") && cmd.contains(&sock))
    }));
    assert!(
        ours.iter().any(|(_, cmd)| cmd.contains("session run")),
        "{ours:?}"
    );
    for (pid, cmd) in &ours {
        let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        assert!(
            !String::from_utf8_lossy(&env).contains(KEY) && !cmd.contains(KEY),
            "the key is in process {pid} ({cmd})"
        );
    }
    s
}

/// The pane killed: `exited`, its processes gone, a resume with the other provider refused.
fn killed_and_refused(place: &Place, server: &ModelServer, cli: Cli, s: &Value) {
    let id = s["id"].as_str().unwrap();
    let home = s["home"].as_str().unwrap().to_string();
    // The pane is killed: the session says so.
    let window = s["terminal"]["window_id"].as_str().unwrap().to_string();
    let out = place.tmux(&["kill-pane", "-t", &window]);
    assert!(out.status.success(), "{}", text(&out));
    wait_until(
        "the session shows exited",
        Duration::from_secs(20),
        || place.session(id)["status"] == "exited",
        || format!("{:?}", place.session(id)),
    );
    // The CLI went with its pane: nothing runs with the session's HOME any more.
    wait_until(
        "the session's processes end",
        Duration::from_secs(15),
        || processes_with(&home).is_empty(),
        || format!("still running: {:?}", processes_with(&home)),
    );
    // Its launcher, told by the hangup, stopped the CLI and recorded why.
    wait_until(
        "the launcher records the closed window",
        Duration::from_secs(15),
        || {
            place.session(id)["error"]
                .as_str()
                .is_some_and(|e| e.contains("window was closed"))
        },
        || format!("{:?}", place.session(id)),
    );
    // Hung up as a closed terminal hangs up, the CLI ended by itself (time to save its
    // conversation), not by the kill that follows the grace period (128 + SIGKILL).
    let exit = place.session(id)["exit_status"].clone();
    assert!(exit.is_i64() && exit != 137, "exit status {exit}");
    // Provider-typed: the role now runs the other provider's CLI; the key is refused.
    place.config(&other_role(cli, &server.base));
    let out = place
        .metash(&["session", "resume", id, "--yes-to", "native", "--json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(7), "{}", text(&out));
    assert!(text(&out).contains("provider_mismatch"), "{}", text(&out));
}

/// Resumed: the next request carries the earlier conversation. The new window's id.
fn resumed(place: &Place, server: &ModelServer, cli: Cli, id: &str, key: &str) -> String {
    place.config(&cli.role("coder", &server.base));
    let (_, target) = place.open(&["session", "resume", id, "--yes-to", "native", "--json"]);
    wait_until(
        "the resumed CLI draws its UI",
        Duration::from_secs(60),
        || place.screen(&target).contains("FIRST") || place.screen(&target).trim().len() > 20,
        || place.screen(&target),
    );
    place.type_prompt(&target, "SECOND-PROMPT", || {
        !posts_with(server, "SECOND-PROMPT").is_empty()
    });
    // The turn's own request (it offers tools), not a side request such as Codex's title, which
    // carries the prompt alone and may come first.
    let turn = || {
        let found = posts_with(server, "SECOND-PROMPT");
        found.into_iter().find(|b| offers_tools(b))
    };
    wait_until(
        "the second prompt's turn reaches the model",
        Duration::from_secs(90),
        || turn().is_some(),
        || format!("{}\n{:?}", place.screen(&target), place.session(id)),
    );
    let second = turn().unwrap();
    assert!(
        second.contains("FIRST-PROMPT"),
        "the earlier conversation is not carried: {second}"
    );
    assert!(second.contains("FIRST-ANSWER"), "{second}");
    let s = place.session(id);
    assert_eq!(s["continuation_key"], key, "{s}");
    assert_eq!(s["runs"], 2, "{s}");
    s["terminal"]["window_id"].as_str().unwrap().to_string()
}

/// Ended: the window is closed, and the log tells the story without the key.
fn ended(place: &Place, id: &str, window: &str) {
    let out = place.metash(&["session", "end", id]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(place.session(id)["status"], "ended");
    assert!(
        !place.tmux(&["has-session", "-t", window]).status.success() || {
            place
                .tmux(&["display-message", "-p", "-t", window, "#{pane_pid}"])
                .stdout
                .is_empty()
        }
    );
    let log = std::fs::read_to_string(place.ws.path().join(".meta/events.jsonl")).unwrap();
    let events: Vec<String> = log
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["kind"] == "cp_session" && e["data"]["id"] == id)
        .map(|e| e["data"]["event"].as_str().unwrap().to_string())
        .collect();
    let order: Vec<&str> = ["start", "exit", "resume", "end"]
        .into_iter()
        .filter(|want| events.iter().any(|e| e == want))
        .collect();
    assert_eq!(order, ["start", "exit", "resume", "end"], "{events:?}");
    let at = |want: &str| events.iter().position(|e| e == want).unwrap();
    assert!(at("start") < at("exit") && at("exit") < at("resume") && at("resume") < at("end"));
    assert!(!log.contains(KEY), "the key is in the log");
    // Each run was confined: the sandbox's report names the session.
    let started = log
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["kind"] == "agent_started" && e["data"]["cp_session_id"] == id)
        .count();
    assert_eq!(started, 2, "one confined start per run");
}

#[test]
fn a_claude_code_session_is_recorded_confined_and_resumed() {
    a_session_lasts(
        Cli::Claude,
        "a_claude_code_session_is_recorded_confined_and_resumed",
    );
}

#[test]
fn a_codex_session_is_recorded_confined_and_resumed() {
    a_session_lasts(
        Cli::Codex,
        "a_codex_session_is_recorded_confined_and_resumed",
    );
}

#[test]
fn a_pi_session_is_recorded_confined_and_resumed() {
    a_session_lasts(Cli::Pi, "a_pi_session_is_recorded_confined_and_resumed");
}

/// `metash session attach ID` on a terminal of the test's, until tmux detaches every client.
fn attach_and_detach(place: &Place, id: &str) {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    use std::os::unix::process::CommandExt;
    let (mut master, pts) = metash_testkit::pty::open();
    let slave = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOCTTY)
        .open(&pts)
        .unwrap();
    let mut c = place.metash(&["session", "attach", id]);
    c.env("TERM", "xterm")
        .stdin(Stdio::from(slave.try_clone().unwrap()))
        .stdout(Stdio::from(slave.try_clone().unwrap()))
        .stderr(Stdio::from(slave.try_clone().unwrap()));
    let fd = slave.as_raw_fd();
    // SAFETY: setsid and ioctl are async-signal-safe; `fd` stays open until the spawn returns.
    unsafe {
        c.pre_exec(move || {
            if libc::setsid() < 0 || libc::ioctl(fd, libc::TIOCSCTTY, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = c.spawn().unwrap();
    drop(slave);
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while std::io::Read::read(&mut master, &mut buf).is_ok_and(|n| n > 0) {}
    });
    wait_until(
        "a client is attached",
        Duration::from_secs(15),
        || !place.tmux(&["list-clients"]).stdout.is_empty(),
        || format!("{:?}", place.session(id)),
    );
    assert_eq!(place.session(id)["status"], "running");
    let out = place.tmux(&["detach-client", "-s", "metash"]);
    assert!(out.status.success(), "{}", text(&out));
    let status = child.wait().unwrap();
    assert!(status.success(), "attach ended with {status}");
}

/// `metash attach` with a spec is a session too, and a killed tmux server turns it `exited`.
#[test]
fn an_attached_spec_is_listed_and_a_dead_tmux_server_makes_it_exited() {
    let test = "an_attached_spec_is_listed_and_a_dead_tmux_server_makes_it_exited";
    if !tmux_installed(test) {
        return;
    }
    let place = Place::new(Path::new("/nonexistent-tools"));
    let spec = serde_json::json!({
        "provider": "openai", "frontend": "codex-cli",
        "argv": ["/bin/sleep", "600"], "cwd": place.ws.path(), "env": {},
        "interactionMode": "interactive", "ioMode": "pty",
        "continuation": {"provider": "openai", "key": "thread-1"}
    });
    let spec_file = place.state.path().join("spec.json");
    std::fs::write(&spec_file, spec.to_string()).unwrap();
    let out = place
        .metash(&["attach", "--spec", spec_file.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let sessions = place.sessions();
    assert_eq!(sessions.len(), 1, "{sessions:?}");
    let s = &sessions[0];
    assert_eq!(s["status"], "running", "{s}");
    assert_eq!(s["provider"], "openai");
    assert_eq!(s["continuation_key"], "thread-1");
    assert!(s["process"]["pid"].as_u64().is_some(), "{s}");
    // Attached from a terminal, then detached: the process keeps running.
    let id = s["id"].as_str().unwrap();
    attach_and_detach(&place, id);
    let s = place.session(id);
    assert_eq!(s["status"], "detached", "{s}");
    let log = std::fs::read_to_string(place.ws.path().join(".meta/events.jsonl")).unwrap();
    assert!(
        log.contains("\"attach\"") && log.contains("\"detach\""),
        "{log}"
    );
    let out = place.tmux(&["kill-server"]);
    assert!(out.status.success(), "{}", text(&out));
    wait_until(
        "the session shows exited",
        Duration::from_secs(10),
        || place.sessions()[0]["status"] == "exited",
        || format!("{:?}", place.sessions()),
    );
    assert!(place.sessions()[0]["error"]
        .as_str()
        .unwrap()
        .contains("gone"));
    // Nothing to attach to, and resume needs a role.
    let out = place
        .metash(&["session", "attach", s["id"].as_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(text(&out).contains("exited"), "{}", text(&out));
}

/// What is refused before any window opens: a role with no terminal UI, an unknown role, a
/// resume without a continuation key (`continuation_not_found`, exit 7), a resume of an ended
/// session, an unknown session.
#[test]
fn refusals_happen_before_anything_opens() {
    use metash_store::cp_sessions::{CpSession, SessionStatus};
    let place = Place::new(Path::new("/nonexistent-tools"));
    place.config(
        "[roles.chat]\nfrontend = \"openai-chat\"\nbase_url = \"http://127.0.0.1:9/v1\"\n\
         [roles.coder]\nfrontend = \"codex-cli\"\nbase_url = \"http://127.0.0.1:9/v1\"\n",
    );
    let start = |role: &str| {
        place
            .metash(&["session", "start", "--role", role, "--yes-to", "native"])
            .output()
            .unwrap()
    };
    let out = start("chat");
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("no interactive terminal UI"),
        "{}",
        text(&out)
    );
    let out = start("nobody");
    assert!(text(&out).contains("no role `nobody`"), "{}", text(&out));
    let out = place
        .metash(&[
            "session", "start", "--role", "coder", "--task", "t9", "--yes-to", "native",
        ])
        .output()
        .unwrap();
    assert!(
        text(&out).contains("task `t9` has no worktree"),
        "{}",
        text(&out)
    );
    assert!(place.sessions().is_empty(), "nothing was recorded");
    let store = metash_store::Store::open(place.ws.path()).unwrap();
    let now = chrono::Utc::now();
    let mut record = CpSession {
        id: "s-nokey".into(),
        role: Some("coder".into()),
        frontend: metash_protocol::HarnessFrontend::CodexCli,
        provider: metash_protocol::ProviderDomain::Openai,
        continuation_key: None,
        workdir: place.ws.path().to_path_buf(),
        home: Some(place.state.path().join("sessions/s-nokey")),
        terminal: None,
        process: None,
        status: SessionStatus::Exited,
        created_at: now,
        updated_at: now,
        exit_status: Some(0),
        error: None,
        runs: 1,
    };
    store.cp_sessions().create(&record).unwrap();
    record.id = "s-ended".into();
    record.status = SessionStatus::Ended;
    record.continuation_key = Some("k".into());
    store.cp_sessions().create(&record).unwrap();
    let resume = |id: &str| {
        place
            .metash(&["session", "resume", id, "--yes-to", "native", "--json"])
            .output()
            .unwrap()
    };
    let out = resume("s-nokey");
    assert_eq!(out.status.code(), Some(7), "{}", text(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["error"]["code"], "continuation_not_found", "{v}");
    let out = resume("s-ended");
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("was ended"), "{}", text(&out));
    let out = resume("s-none");
    assert!(text(&out).contains("no session `s-none`"), "{}", text(&out));
    // Nothing was opened: the sessions are as they were.
    assert_eq!(place.sessions().len(), 2);
    let s = place.session("s-nokey");
    assert_eq!(s["status"], "exited", "{s}");
    assert_eq!(s["runs"], 1, "{s}");
}

/// In a git project, a session started without `--task` or `--workdir` works in a worktree made
/// for it, on its own branch: the CLI's shell writes there, the user's checkout is untouched.
#[test]
fn a_session_in_a_git_project_gets_a_worktree_of_its_own() {
    let test = "a_session_in_a_git_project_gets_a_worktree_of_its_own";
    if !tmux_installed(test) {
        return;
    }
    let Some(tools) = Cli::Claude.installed(test) else {
        return;
    };
    let place = Place::new(&tools);
    let git = |args: &[&str]| {
        let out = Command::new("git")
            .arg("-C")
            .arg(place.ws.path())
            .args(["-c", "user.name=t", "-c", "user.email=t@t"])
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "git {args:?}: {}", text(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    git(&["init", "-q"]);
    std::fs::write(place.ws.path().join("README.md"), "hello\n").unwrap();
    git(&["add", "README.md"]);
    git(&["commit", "-q", "-m", "first"]);
    let server = ModelServer::start(|c: &Captured| {
        let body = c.text();
        if body.contains("WHERE-PROMPT") && Cli::Claude.results(&body) == 0 && offers_tools(&body) {
            Cli::Claude.shell(1, &body, "pwd > where.txt; echo WHERE-DONE")
        } else if body.contains("WHERE-PROMPT") {
            Cli::Claude.text("WHERE-ANSWER")
        } else {
            Cli::Claude.text("ok")
        }
    });
    place.config(&Cli::Claude.role("coder", &server.base));
    let (id, target) = place.open(&[
        "session", "start", "--role", "coder", "--yes-to", "native", "--json",
    ]);
    let dir = place
        .ws
        .path()
        .canonicalize()
        .unwrap()
        .join(".meta/worktrees")
        .join(format!("session-{id}"));
    let s = place.session(&id);
    assert_eq!(s["workdir"], dir.display().to_string(), "{s}");
    let branch = format!("metash/session/{id}");
    assert!(
        git(&["branch", "--list", &branch]).contains(&branch),
        "no branch {branch}"
    );
    wait_until(
        "the CLI draws its UI",
        Duration::from_secs(60),
        || place.screen(&target).trim().len() > 20,
        || place.screen(&target),
    );
    place.type_prompt(&target, "WHERE-PROMPT", || {
        !posts_with(&server, "WHERE-PROMPT").is_empty()
    });
    wait_until(
        "the shell wrote where it ran",
        Duration::from_secs(90),
        || dir.join("where.txt").exists(),
        || place.screen(&target),
    );
    let wrote = std::fs::read_to_string(dir.join("where.txt")).unwrap();
    assert_eq!(wrote.trim(), dir.display().to_string());
    assert!(
        !place.ws.path().join("where.txt").exists(),
        "the user's checkout was written"
    );
    let out = place.metash(&["session", "end", &id]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
}
