//! Issue 13 items 1–3, issue 14: a real coding CLI runs as a role under metash's native sandbox.
//! A loopback model asks it for ordinary shell tool calls, one after the other: the work in its
//! workspace succeeds; every escape (a file outside the project, `../`, a write outside, the
//! user's `~/.ssh`, the host's environment and process memory, listening, connecting to a port
//! or a Unix socket on the host, metash's `.meta/`) is denied, the run goes on, and each denial is
//! in the log as the tool's result.

use std::io::Read;
use std::net::TcpListener;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use metash_host::{ConsentMode, Host, HostOptions, SpawnRequest, Spawner, Terminal};
use metash_protocol::AgentStatus;
use metash_testkit::anthropic::ModelServer;
use metash_testkit::cli::Cli;

use super::common::Project;

const KEY: &str = "sk-ant-real-cli-sandbox-key-0123456789";
const SECRET: &str = "the-outside-secret-4711";

/// Everything one probe run needs: the files and servers the sandbox must keep the CLI from.
pub(super) struct Outside {
    _dir: tempfile::TempDir,
    root: PathBuf,
    secret_file: PathBuf,
    write_target: PathBuf,
    ssh_canary: Option<PathBuf>,
    tcp_port: u16,
    tcp_hits: Arc<AtomicUsize>,
    unix_path: PathBuf,
    unix_hits: Arc<AtomicUsize>,
}

impl Outside {
    pub(super) fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().canonicalize().expect("canonical");
        let secret_file = root.join("secret.txt");
        std::fs::write(&secret_file, SECRET).expect("secret");
        // The invoking user's ~/.ssh: a canary file there, removed afterwards.
        let ssh_canary = std::env::var_os("HOME").map(|h| {
            let ssh = Path::new(&h).join(".ssh");
            let _ = std::fs::create_dir_all(&ssh);
            let f = ssh.join(format!("metash-canary-{}", std::process::id()));
            let _ = std::fs::write(&f, SECRET);
            f
        });
        let tcp = TcpListener::bind("127.0.0.1:0").expect("tcp");
        let tcp_port = tcp.local_addr().expect("addr").port();
        let tcp_hits = Arc::new(AtomicUsize::new(0));
        let hits = tcp_hits.clone();
        std::thread::spawn(move || {
            for c in tcp.incoming().flatten() {
                hits.fetch_add(1, Ordering::SeqCst);
                drop(c);
            }
        });
        let unix_path = root.join("host.sock");
        let unix = UnixListener::bind(&unix_path).expect("unix");
        let unix_hits = Arc::new(AtomicUsize::new(0));
        let hits = unix_hits.clone();
        std::thread::spawn(move || {
            for mut c in unix.incoming().flatten() {
                hits.fetch_add(1, Ordering::SeqCst);
                let mut b = [0u8; 16];
                let _ = c.read(&mut b);
            }
        });
        Self {
            write_target: root.join("written-from-inside.txt"),
            _dir: dir,
            root,
            secret_file,
            ssh_canary,
            tcp_port,
            tcp_hits,
            unix_path,
            unix_hits,
        }
    }

    /// (name, shell command, whether it must succeed). Run in the project root.
    pub(super) fn probes(&self, project: &Path) -> Vec<(&'static str, String, bool)> {
        let parent_file = project
            .parent()
            .map(|p| p.join(format!("metash-parent-{}.txt", std::process::id())))
            .expect("parent");
        std::fs::write(&parent_file, SECRET).expect("parent file");
        let ssh = self
            .ssh_canary
            .as_ref()
            .map(|c| c.display().to_string())
            .unwrap_or_else(|| "/root/.ssh/id_rsa".into());
        let py = |code: String| format!("/usr/bin/python3 -c \"{code}\" 2>&1 | tail -1");
        vec![
            ("work", "echo made-in-the-sandbox > made.txt && cat made.txt".into(), true),
            ("outside_file", format!("cat {} 2>&1", self.secret_file.display()), false),
            ("dotdot", format!("cat ../{} 2>&1", parent_file.file_name().and_then(|n| n.to_str()).unwrap_or("")), false),
            ("write_outside", format!("echo x > {} 2>&1; cat {} 2>&1", self.write_target.display(), self.write_target.display()), false),
            ("ssh", format!("cat {ssh} 2>&1; ls {} 2>&1", Path::new(&ssh).parent().map(|p| p.display().to_string()).unwrap_or_default()), false),
            ("host_env", "env | grep -c CARGO_ ; echo ENV-END".into(), false),
            ("host_memory", format!("cat /proc/{}/environ 2>&1 | tr '\\0' '\\n' | grep -c CARGO_", std::process::id()), false),
            ("listen", py("import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); print('LISTENING')".into()), false),
            ("connect", py(format!("import socket; socket.create_connection(('127.0.0.1', {})); print('CONNECTED')", self.tcp_port)), false),
            ("unix_socket", py(format!("import socket; s=socket.socket(socket.AF_UNIX); s.connect('{}'); print('CONNECTED')", self.unix_path.display())), false),
            ("meta", "ls -A .meta 2>&1; cat .meta/events.jsonl 2>&1 | head -c 300; echo x > .meta/planted 2>&1".into(), false),
        ]
    }
}

impl Drop for Outside {
    fn drop(&mut self) {
        if let Some(c) = &self.ssh_canary {
            let _ = std::fs::remove_file(c);
        }
    }
}

/// The project's host with the CLI's key and native agents allowed.
pub(super) fn cli_host(p: &Project) -> Host {
    Host::open(
        p.path(),
        HostOptions::silent()
            .with_env("METASH_TEST_CLI_KEY", KEY)
            .with_yes_to(["native".parse().expect("capability")]),
    )
    .expect("host")
}

fn probe_run(cli: Cli, test: &str) {
    let Some(tools) = super::common::cli_ready(cli, test) else {
        return;
    };
    let p = Project::new();
    let outside = Outside::new();
    let probes = outside.probes(p.path());
    let commands: Vec<String> = probes.iter().map(|(_, c, _)| c.clone()).collect();
    let server = ModelServer::start(move |c| {
        let body = c.text();
        if !body.contains("Do the probes.") {
            return cli.text("ok");
        }
        let done = cli.results(&body);
        match commands.get(done) {
            Some(cmd) => cli.shell(done, &body, cmd),
            None => cli.text("all probes ran"),
        }
    });
    std::os::unix::fs::symlink(&tools, p.path().join(".tools")).expect("link .tools");
    p.config(&cli.role("coder", &server.base));
    let host = cli_host(&p);
    let mut req = SpawnRequest::new("coder", "You are a test.", "Do the probes.");
    req.options.timeout_seconds = Some(300.0);
    let r = host.spawn_agent(&req).expect("spawn");
    assert_eq!(r.status, AgentStatus::Success, "{r:?}");
    assert!(r.data.contains("all probes ran"), "{}", r.data);
    check_probes(&p, &outside, &probes);
}

#[test]
fn claude_code_works_in_its_workspace_and_every_escape_is_denied() {
    probe_run(
        Cli::Claude,
        "claude_code_works_in_its_workspace_and_every_escape_is_denied",
    );
}

#[test]
fn codex_works_in_its_workspace_and_every_escape_is_denied() {
    probe_run(
        Cli::Codex,
        "codex_works_in_its_workspace_and_every_escape_is_denied",
    );
}

#[test]
fn pi_works_in_its_workspace_and_every_escape_is_denied() {
    probe_run(
        Cli::Pi,
        "pi_works_in_its_workspace_and_every_escape_is_denied",
    );
}

/// The sandbox was reported, each probe ran once, work succeeded and every escape failed.
pub(super) fn check_probes(
    p: &Project,
    outside: &Outside,
    probes: &[(&'static str, String, bool)],
) {
    let started = p.log_data("agent_started");
    let report = started
        .iter()
        .find(|s| s["sandbox"] == "native" && s.get("frontend").is_some())
        .unwrap_or_else(|| panic!("no sandbox report: {started:?}"));
    assert!(report["state_hidden"]["dirs"].is_array(), "{report}");
    let calls = p.log_data("tool_call");
    let results = p.log_data("tool_result");
    assert_eq!(calls.len(), probes.len(), "{calls:#?}");
    assert_eq!(results.len(), probes.len(), "{results:#?}");
    let out = |i: usize| results[i]["output"].as_str().unwrap_or("").to_string();
    for (i, (name, _, ok)) in probes.iter().enumerate() {
        let o = out(i);
        eprintln!("probe {name}: {o}");
        assert!(!o.contains(SECRET), "probe {name} read the secret: {o}");
        if *ok {
            assert!(o.contains("made-in-the-sandbox"), "{name}: {o}");
        }
    }
    let find = |name: &str| {
        probes
            .iter()
            .position(|(n, ..)| *n == name)
            .map(out)
            .unwrap_or_default()
    };
    assert!(
        find("outside_file").contains("denied"),
        "{}",
        find("outside_file")
    );
    assert!(find("dotdot").contains("denied"), "{}", find("dotdot"));
    assert!(
        find("write_outside").contains("denied"),
        "{}",
        find("write_outside")
    );
    assert!(find("ssh").contains("denied"), "{}", find("ssh"));
    // `grep -c` printed how many of the host's CARGO_* variables it saw: none.
    let count = |o: String| {
        o.lines()
            .find(|l| l.trim().parse::<u32>().is_ok())
            .map(|l| l.trim().to_string())
    };
    assert_eq!(
        count(find("host_env")).as_deref(),
        Some("0"),
        "{}",
        find("host_env")
    );
    assert_eq!(
        count(find("host_memory")).as_deref(),
        Some("0"),
        "{}",
        find("host_memory")
    );
    for n in ["listen", "connect", "unix_socket"] {
        let o = find(n);
        assert!(
            !o.contains("LISTENING") && !o.contains("CONNECTED"),
            "{n}: {o}"
        );
        assert!(
            o.contains("Error") || o.contains("denied") || o.contains("not permitted"),
            "{n}: {o}"
        );
    }
    assert!(!find("meta").contains("session"), "{}", find("meta"));
    assert_eq!(
        outside.tcp_hits.load(Ordering::SeqCst),
        0,
        "a connection reached the host port"
    );
    assert_eq!(
        outside.unix_hits.load(Ordering::SeqCst),
        0,
        "a connection reached the host socket"
    );
    assert!(!outside.write_target.exists(), "a write outside landed");
    assert!(
        !p.path().join(".meta/planted").exists(),
        "a write into .meta landed"
    );
    assert_eq!(
        std::fs::read_to_string(p.path().join("made.txt"))
            .expect("made.txt")
            .trim(),
        "made-in-the-sandbox"
    );
    let _ = &outside.root;
}

/// One Claude Code turn with `permissions = "ask"` that asks for `echo asked > asked.txt`; the
/// host answers consent from `yes_to` only.
fn ask_run(yes_to: &[&str]) -> (Project, metash_protocol::AgentResponse) {
    let p = Project::new();
    let tools = Cli::Claude.tools().expect("checked by the caller");
    let server = ModelServer::start(move |c| {
        let body = c.text();
        if !body.contains("Write the file.") {
            return Cli::Claude.text("ok");
        }
        match Cli::Claude.results(&body) {
            0 => Cli::Claude.shell(0, &body, "echo asked > asked.txt"),
            _ => Cli::Claude.text("turn over"),
        }
    });
    std::os::unix::fs::symlink(&tools, p.path().join(".tools")).expect("link .tools");
    p.config(&format!(
        "{}permissions = \"ask\"\n",
        Cli::Claude.role("coder", &server.base)
    ));
    let host = Host::open(
        p.path(),
        HostOptions {
            terminal: Terminal::Silent,
            env: [("METASH_TEST_CLI_KEY".to_string(), KEY.to_string())].into(),
            consent: ConsentMode::NonInteractive,
            yes_to: yes_to
                .iter()
                .map(|c| c.parse().expect("capability"))
                .collect(),
            ..HostOptions::default()
        },
    )
    .expect("host");
    let mut req = SpawnRequest::new("coder", "You are a test.", "Write the file.");
    req.options.timeout_seconds = Some(120.0);
    let r = host.spawn_agent(&req).expect("spawn");
    (p, r)
}

#[test]
fn with_permissions_ask_each_claude_code_tool_use_is_a_consent_request() {
    let test = "with_permissions_ask_each_claude_code_tool_use_is_a_consent_request";
    if super::common::cli_ready(Cli::Claude, test).is_none() {
        return;
    }
    // Granted: the request is in the ledger and the call ran.
    let (p, r) = ask_run(&["native", "process.spawn"]);
    assert_eq!(r.status, AgentStatus::Success, "{r:?}");
    let asked = p.log_data("consent_request");
    assert!(
        asked.iter().any(|a| a["capability"] == "process.spawn:echo"
            && a["reason"]
                .as_str()
                .is_some_and(|r| r.contains("asked.txt"))),
        "{asked:?}"
    );
    assert_eq!(
        std::fs::read_to_string(p.path().join("asked.txt"))
            .expect("the call ran")
            .trim(),
        "asked"
    );
    // Denied: the same request, refused; the call never ran and the CLI was told why.
    let (p, r) = ask_run(&["native"]);
    assert_eq!(r.status, AgentStatus::Success, "{r:?}");
    assert!(!p.path().join("asked.txt").exists(), "a refused call ran");
    let answers = p.log_data("consent_answer");
    assert!(
        answers
            .iter()
            .any(|a| a["answer"] == "deny" && a["capability"] == "process.spawn:echo"),
        "{answers:?}"
    );
    let results = p.log_data("tool_result");
    assert!(
        results.iter().any(|r| r["output"]
            .as_str()
            .is_some_and(|o| o.contains("metash refused"))),
        "{results:?}"
    );
}

/// The run's `max_cost_usd` stops a CLI mid-turn: the model's first answer (a tool call) reports
/// 50 000 output tokens, priced past the budget; the host reads that usage on the wire as it
/// streams, stops the CLI while its tool call is still running, says why, and the call's effect
/// never happens.
fn cost_stop(cli: Cli, test: &str) {
    let Some(tools) = super::common::cli_ready(cli, test) else {
        return;
    };
    let p = Project::new();
    let server = ModelServer::start(move |c| {
        let body = c.text();
        if !body.contains("Spend a lot.") {
            return cli.text("ok");
        }
        match cli.results(&body) {
            0 => cli.shell_with_usage(0, &body, "sleep 20; echo late > late.txt", 50_000),
            _ => cli.text("the turn went on"),
        }
    });
    std::os::unix::fs::symlink(&tools, p.path().join(".tools")).expect("link .tools");
    let role = cli.role("coder", &server.base);
    let model = role
        .lines()
        .find_map(|l| l.strip_prefix("model_smart = "))
        .expect("model")
        .to_string();
    p.config(&format!(
        "{role}[budget]\nmax_cost_usd = 0.1\n[prices.{model}]\ninput_per_mtok = 0.0\noutput_per_mtok = 10.0\n"
    ));
    let host = cli_host(&p);
    let started = std::time::Instant::now();
    let mut req = SpawnRequest::new("coder", "You are a test.", "Spend a lot.");
    req.options.timeout_seconds = Some(120.0);
    let r = host.spawn_agent(&req).expect("spawn");
    assert_eq!(r.status, AgentStatus::Error, "{r:?}");
    assert!(r.data.contains("max_cost_usd exceeded"), "{}", r.data);
    assert!(
        started.elapsed() < std::time::Duration::from_secs(20),
        "stopped before the tool ended"
    );
    // The CLI was stopped: its tool call never finished and it never asked the model again.
    std::thread::sleep(std::time::Duration::from_secs(1));
    assert!(!p.path().join("late.txt").exists());
    let asked = server
        .posts()
        .iter()
        .filter(|c| c.text().contains("Spend a lot."))
        .count();
    assert_eq!(asked, 1, "no request after the stop");
    // What it used is charged: 50 000 output tokens at $10/Mtok.
    let used = metash_host::budget::used(host.store()).expect("budget");
    assert!(used.cost_usd >= 0.5 - 1e-9, "{used:?}");
}

#[test]
fn claude_code_is_stopped_mid_turn_at_the_cost_budget() {
    cost_stop(
        Cli::Claude,
        "claude_code_is_stopped_mid_turn_at_the_cost_budget",
    );
}

#[test]
fn codex_is_stopped_mid_turn_at_the_cost_budget() {
    cost_stop(Cli::Codex, "codex_is_stopped_mid_turn_at_the_cost_budget");
}

#[test]
fn pi_is_stopped_mid_turn_at_the_cost_budget() {
    cost_stop(Cli::Pi, "pi_is_stopped_mid_turn_at_the_cost_budget");
}
