#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Issue 32 item 3: every command that takes `-C` works when run from inside the project with
//! the default (`-C .`), as the README's first path does: `run` with a task retry that reuses
//! its worktree, `worker` in its clone, `consent revoke` while an agent runs (the agent's next
//! read is cut; a failed withdrawal is an error), `sandbox`, `attach`, `ui`, `serve --stdio` and
//! `mcp`. No command here is given `-C`.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

const BIN: &str = env!("CARGO_BIN_EXE_metash");

/// `metash ARGS` started in `ws`, without `-C`.
fn in_ws(ws: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.current_dir(ws)
        .args(args)
        .env("NO_COLOR", "1")
        .env_remove("TMUX")
        .stdin(Stdio::null());
    c
}

fn here(ws: &Path, args: &[&str]) -> Output {
    in_ws(ws, args).output().unwrap()
}

fn ok(ws: &Path, args: &[&str]) -> String {
    let out = here(ws, args);
    assert!(
        out.status.success(),
        "metash {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn git(dir: &Path, args: &[&str]) {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["-c", "user.name=t", "-c", "user.email=t@localhost"])
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {out:?}");
}

/// A git project `dir/name`, `metash init` run inside it with `context` (a path relative to the
/// project), and `config` as its `.meta/config.toml`.
fn project(dir: &Path, name: &str, context: &str) -> PathBuf {
    let ws = dir.join(name);
    std::fs::create_dir_all(&ws).unwrap();
    git(&ws, &["init", "-q"]);
    git(
        &ws,
        &["commit", "-q", "--allow-empty", "-m", "empty project"],
    );
    std::fs::write(dir.join(format!("{name}-vision.md")), context).unwrap();
    ok(&ws, &["init", "--context", &format!("../{name}-vision.md")]);
    ws
}

/// The example project (WASM planner, executor, verifier) in `dir/name`, set up from inside,
/// with `head` on top of its config.
fn greetings(dir: &Path, name: &str, head: &str) -> PathBuf {
    let ws = project(dir, name, &metash_testkit::greetings::context());
    metash_testkit::greetings::copy_into(&ws);
    let example = std::fs::read_to_string(ws.join(".meta/config.toml")).unwrap();
    std::fs::write(ws.join(".meta/config.toml"), format!("{head}\n{example}")).unwrap();
    for (agent, cap) in [
        ("executor", "files.read"),
        ("executor", "files.write"),
        ("verifier", "files.read"),
    ] {
        ok(&ws, &["consent", "grant", agent, cap]);
    }
    ws
}

fn log(ws: &Path) -> Vec<Value> {
    ok(ws, &["--json", "log", "export"])
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .collect()
}

/// The executor's spawns for task `id`.
fn executor_turns(records: &[Value], id: &str) -> usize {
    records
        .iter()
        .filter(|r| r["kind"] == "spawn" && r["agent"] == "executor" && r["data"]["task_id"] == id)
        .count()
}

/// The verifier's prompt for task `id`, the language decided.
fn verifier_prompt(id: &str, language: &str) -> String {
    let req = json!({"task": {"id": id}, "decisions": [
        {"id": "greeting-language", "question": "Which language?", "answer": language}]});
    format!("Check the task.\n```json\n{req}\n```\n")
}

/// The example runs to completion from inside the project, the `bye` task's second attempt
/// reusing its worktree; then `serve --stdio` and `mcp` each spawn the verifier on the project.
#[test]
fn run_with_a_retry_then_serve_and_mcp_from_inside_the_project() {
    let dir = tempfile::tempdir().unwrap();
    let ws = greetings(dir.path(), "p", "");
    let first = here(&ws, &["run"]);
    assert_eq!(
        first.status.code(),
        Some(4),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    let out = here(&ws, &["run", "--answer", "french"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains("not a git repository"), "{stderr}");
    let bye = std::fs::read_to_string(ws.join("bye.txt")).unwrap();
    assert_eq!(bye.trim(), "Au revoir !");
    let records = log(&ws);
    assert!(
        executor_turns(&records, "bye") >= 2,
        "the verifier sent `bye` back once: a second attempt in the same worktree"
    );

    // `serve --stdio`: one spawn of the verifier, which reads the project's hello.txt.
    let request = json!({"jsonrpc": "2.0", "id": 1, "method": "spawnAgent", "params": {
        "agent_name": "verifier", "user_message": verifier_prompt("hello", "french")}});
    let served = with_stdin(in_ws(&ws, &["serve", "--stdio"]), &format!("{request}\n"));
    let reply = served
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["id"] == 1)
        .unwrap_or_else(|| panic!("no answer: {served}"));
    assert_eq!(reply["result"]["status"], "success", "{reply}");
    let verdict: Value = serde_json::from_str(reply["result"]["data"].as_str().unwrap()).unwrap();
    assert_eq!(verdict["pass"], true, "{verdict}");

    // `mcp`: the same verifier asked about English finds the French file (it read it).
    let args =
        json!({"agent_name": "verifier", "user_message": verifier_prompt("hello", "english")});
    let lines = [
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"}}}),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
               "params": {"name": "spawn_agent", "arguments": args}}),
    ];
    let input: String = lines.iter().map(|l| format!("{l}\n")).collect();
    let said = mcp(&ws, &input);
    let answer = said
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["id"] == 2)
        .unwrap_or_else(|| panic!("no answer: {said}"));
    let text = answer["result"]["content"][0]["text"].as_str().unwrap();
    let response: Value = serde_json::from_str(text).unwrap();
    assert_eq!(response["status"], "success", "{response}");
    let verdict: Value = serde_json::from_str(response["data"].as_str().unwrap()).unwrap();
    assert_eq!(verdict["pass"], false, "{verdict}");
    assert!(
        verdict["findings"][0]
            .as_str()
            .is_some_and(|f| f.contains("found \"Bonjour, le monde !\"")),
        "{verdict}"
    );
}

/// Runs `cmd` with `input` on stdin (closed after it); its stdout.
fn with_stdin(mut cmd: Command, input: &str) -> String {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// `metash mcp` answering `input`, kept open until the tool's answer (id 2) is out.
fn mcp(ws: &Path, input: &str) -> String {
    let mut child = in_ws(ws, &["mcp", "--quiet"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input.as_bytes()).unwrap();
    let mut said = String::new();
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        let done = serde_json::from_str::<Value>(&line).is_ok_and(|v| v["id"] == 2);
        said.push_str(&line);
        said.push('\n');
        if done {
            break;
        }
    }
    drop(stdin);
    let _ = child.wait();
    said
}

/// `metash worker` started in its clone with the default workspace completes the coordinator's
/// tasks, the `bye` retry included (a second attempt in the worker's own worktree).
#[test]
fn a_worker_in_its_clone_with_the_default_workspace_completes_tasks() {
    let server = match metash_testkit::postgres::prerequisites()
        .and_then(|bin| metash_testkit::postgres::Postgres::start(&bin))
    {
        Ok(s) => s,
        Err(why) => return metash_testkit::skip("worker with the default workspace", &why),
    };
    let dir = tempfile::tempdir().unwrap();
    let head = format!(
        "[store]\nurl = \"{}\"\nproject = \"rel\"\n",
        server.url("postgres")
    );
    std::fs::create_dir_all(dir.path().join("coord/.meta")).unwrap();
    std::fs::write(dir.path().join("coord/.meta/config.toml"), &head).unwrap();
    let coord = greetings(dir.path(), "coord", &head);
    let w1 = dir.path().join("w1");
    let st = Command::new("git")
        .args(["clone", "-q"])
        .arg(&coord)
        .arg(&w1)
        .status()
        .unwrap();
    assert!(st.success());
    std::fs::create_dir_all(w1.join(".meta")).unwrap();
    metash_testkit::greetings::copy_into(&w1);
    let example = std::fs::read_to_string(w1.join(".meta/config.toml")).unwrap();
    std::fs::write(w1.join(".meta/config.toml"), format!("{head}\n{example}")).unwrap();

    assert_eq!(here(&coord, &["run", "--workers"]).status.code(), Some(4));
    let worker = in_ws(&w1, &["--json", "worker", "--id", "w1", "--slots", "2"])
        .args(["--lease-seconds", "5", "--idle-exit-seconds", "4"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    ok(&coord, &["run", "--workers", "--answer", "french"]);
    let out = worker.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains("not a git repository"), "{stderr}");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(report["completed"].as_u64().unwrap() >= 5, "{report}");
    let status: Value = serde_json::from_str(&ok(&coord, &["--json", "status"])).unwrap();
    assert_eq!(status["halt"]["reason"], "complete", "{status}");
    assert_eq!(
        std::fs::read_to_string(coord.join("bye.txt"))
            .unwrap()
            .trim(),
        "Au revoir !"
    );
    let failed: Vec<Value> = log(&coord)
        .into_iter()
        .filter(|r| r["kind"] == "task_completed")
        .filter(|r| r["data"]["response"]["status"] == "error")
        .collect();
    assert!(failed.is_empty(), "a worker's turn failed: {failed:?}");
}

/// A native agent reading `notes.txt` runs (`metash spawn`, from inside); `metash consent
/// revoke` from inside takes the grant back while it runs: its next read is refused, and the
/// command says what it withdrew.
#[test]
fn consent_revoke_from_inside_cuts_the_running_agents_next_read() {
    if metash_runtime::native::isolate::landlock_abi() < 4 {
        return metash_testkit::skip("revoke from inside", "no Landlock ABI 4 here");
    }
    let exe = match metash_testkit::build_example("revocable", None) {
        Ok(p) => p,
        Err(why) => return metash_testkit::skip("revoke from inside", &why),
    };
    let dir = tempfile::tempdir().unwrap();
    let ws = project(dir.path(), "p", "# Project: revoke\n\nPhase 1: read.\n");
    let agent = ws.join(".meta/agents/rev");
    std::fs::create_dir_all(&agent).unwrap();
    std::fs::write(
        agent.join("manifest.toml"),
        format!(
            "schema_version = \"0.1\"\nname = \"rev\"\nversion = \"0.1.0\"\nentry = {:?}\n\
             sandbox = \"native\"\ncapabilities = [\"files.read\"]\n",
            exe.display().to_string()
        ),
    )
    .unwrap();
    std::fs::write(ws.join("notes.txt"), "cached notes").unwrap();
    ok(&ws, &["consent", "grant", "rev", "files.read"]);
    let spawn = in_ws(&ws, &["spawn", "rev", "--message", "files.read notes.txt"])
        .args(["--yes-to", "native", "--non-interactive"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for("the agent to listen", || {
        log(&ws).iter().any(|r| {
            r["agent"] == "rev"
                && r["kind"] == "agent_event"
                && r["data"]["data"]
                    .as_str()
                    .is_some_and(|d| d.contains("waiting"))
        })
    });
    let said = ok(&ws, &["consent", "revoke", "rev", "files.read"]);
    let canonical = ws.canonicalize().unwrap();
    assert!(
        said.contains(&format!(
            "withdrawn from the running agent: {}",
            canonical.display()
        )),
        "{said}"
    );
    let out = spawn.wait_with_output().unwrap();
    let answer = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{answer}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(answer.contains("read before: cached notes"), "{answer}");
    assert!(answer.contains("read after: refused"), "{answer}");
    let sent: Vec<Value> = log(&ws)
        .into_iter()
        .filter(|r| r["kind"] == "consent_revoke_sent")
        .collect();
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert!(sent[0]["data"]["withdrawn"]["path"].is_string(), "{sent:?}");
}

/// When the process running the agent could not take the grant back (it logs why), `metash
/// consent revoke` fails with those words: it never reports a success the agent does not feel.
/// The running host is played here by the test, which writes what a host writes.
#[test]
fn a_failed_withdrawal_is_an_error_of_consent_revoke() {
    let dir = tempfile::tempdir().unwrap();
    let ws = project(dir.path(), "p", "# Project: revoke\n\nPhase 1: read.\n");
    let agent = ws.join(".meta/agents/held");
    std::fs::create_dir_all(&agent).unwrap();
    std::fs::write(
        agent.join("manifest.toml"),
        "schema_version = \"0.1\"\nname = \"held\"\nversion = \"0.1.0\"\nentry = \"a.wasm\"\n\
         sandbox = \"wasm\"\ncapabilities = [\"files.read\"]\n",
    )
    .unwrap();
    ok(&ws, &["consent", "grant", "held", "files.read"]);
    let store = metash_store::Store::open(&ws).unwrap();
    store
        .append(metash_protocol::LogKind::Spawn, Some("held"), json!({}))
        .unwrap();
    let after = store.log().tail().unwrap().seq;
    let revoke = in_ws(&ws, &["consent", "revoke", "held", "files.read"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // As the running host's watcher does once it sees the revocation.
    wait_for("the revocation", || {
        let records = store.log().read_all().unwrap();
        records
            .iter()
            .any(|r| r.seq > after && r.kind == metash_protocol::LogKind::ConsentRevoke)
    });
    let why = "making /p read-only in the agent's mount namespace: Device or resource busy";
    store
        .append(
            metash_protocol::LogKind::ConsentRevokeSent,
            Some("held"),
            json!({"capability": "files.read", "why": "revoked", "withdrawn": {"error": why}}),
        )
        .unwrap();
    let out = revoke.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(why) && stderr.contains("still holds it"),
        "{stderr}"
    );
    assert!(!String::from_utf8_lossy(&out.stdout).contains("revoked `"));
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let until = Instant::now() + Duration::from_secs(30);
    while Instant::now() < until {
        if f() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("timed out waiting for {what}");
}

/// A project with the role `coder` (a CLI role: its commands run in metash's native sandbox).
fn with_role(dir: &Path) -> PathBuf {
    let ws = project(dir, "p", "# Project: sandbox\n\nPhase 1: run.\n");
    std::fs::write(
        ws.join(".meta/config.toml"),
        "[roles.coder]\nfrontend = \"pi-sdk\"\nbase_url = \"http://127.0.0.1:9/v1\"\n\
         api_key_env = \"METASH_SANDBOX_KEY\"\n",
    )
    .unwrap();
    ws
}

fn native_unavailable(test: &str) -> bool {
    let abi = metash_runtime::native::isolate::landlock_abi();
    if abi < 4 {
        metash_testkit::skip(test, &format!("Landlock ABI {abi} < 4"));
    }
    abi < 4
}

/// `metash sandbox` from inside runs the command confined, in the project.
#[test]
fn sandbox_from_inside_runs_in_the_project() {
    if native_unavailable("sandbox from inside") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let ws = with_role(dir.path());
    let out = in_ws(&ws, &["sandbox", "--role", "coder", "--non-interactive"])
        .args(["--yes-to", "native", "--", "/bin/sh", "-c"])
        .arg("pwd > where.txt; ls .meta > meta.txt 2>&1; exit 3")
        .env("METASH_SANDBOX_KEY", "sk-relative-0123456789")
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let canonical = ws.canonicalize().unwrap();
    let wher = std::fs::read_to_string(ws.join("where.txt")).unwrap();
    assert_eq!(wher.trim(), canonical.display().to_string());
    let meta = std::fs::read_to_string(ws.join("meta.txt")).unwrap();
    assert!(meta.contains("Permission denied"), "{meta}");
}

/// `metash attach --role coder` from inside opens a tmux window (on a tmux server of the
/// test's own) whose command runs in the role's sandbox, in the project.
#[test]
fn attach_from_inside_runs_the_session_in_the_project() {
    if native_unavailable("attach from inside") {
        return;
    }
    if Command::new("tmux").arg("-V").output().is_err() {
        return metash_testkit::skip("attach from inside", "tmux is not installed");
    }
    let dir = tempfile::tempdir().unwrap();
    let ws = with_role(dir.path());
    ok(
        &ws,
        &[
            "consent",
            "grant",
            "coder",
            "native",
            "--sensitive",
            "--duration-s",
            "600",
        ],
    );
    let tmux_dir = dir.path().join("tmux");
    std::fs::create_dir_all(&tmux_dir).unwrap();
    let canonical = ws.canonicalize().unwrap();
    let spec = metash_protocol::ProcessInvocationSpec {
        provider: metash_protocol::ProviderDomain::Openai,
        frontend: metash_protocol::HarnessFrontend::PiSdk,
        argv: vec![
            "/bin/sh".into(),
            "-c".into(),
            "pwd > attached.txt; sleep 1".into(),
        ],
        cwd: canonical.display().to_string(),
        env: Default::default(),
        interaction_mode: metash_protocol::InteractionMode::Interactive,
        io_mode: metash_protocol::IoMode::Pty,
        continuation: None,
        display_command: None,
    };
    let mut child = in_ws(&ws, &["attach", "--role", "coder", "--window-name", "rel"])
        .env("TMUX_TMPDIR", &tmux_dir)
        .env("METASH_SANDBOX_KEY", "sk-relative-0123456789")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let text = serde_json::to_string(&spec).unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let attached = ws.join("attached.txt");
    let until = Instant::now() + Duration::from_secs(30);
    // The shell creates the file, then writes it: wait for what it wrote.
    let written = || std::fs::read_to_string(&attached).is_ok_and(|s| s.ends_with('\n'));
    while !written() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = Command::new("tmux")
        .args(["kill-server"])
        .env("TMUX_TMPDIR", &tmux_dir)
        .env_remove("TMUX")
        .status();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let wher = std::fs::read_to_string(&attached).unwrap_or_default();
    assert_eq!(wher.trim(), canonical.display().to_string());
}

/// `metash ui` from inside serves this project: its URL logs in, and `/` is the project's page.
#[test]
fn ui_from_inside_serves_the_project() {
    let dir = tempfile::tempdir().unwrap();
    let ws = project(
        dir.path(),
        "p",
        "# Project: Relative UI\n\nPhase 1: look.\n",
    );
    let mut child: Child = in_ws(&ws, &["ui"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    let url = first.trim().to_string();
    let addr = url
        .trim_start_matches("http://")
        .split('/')
        .next()
        .unwrap()
        .to_string();
    let path = url.split_once(&addr).unwrap().1.to_string();
    let login = http(
        &addr,
        &format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"),
    );
    let cookie = login
        .lines()
        .find_map(|l| l.strip_prefix("set-cookie: "))
        .map(|c| c.split(';').next().unwrap().to_string());
    let page = cookie.as_ref().map(|c| {
        http(
            &addr,
            &format!("GET / HTTP/1.1\r\nHost: {addr}\r\nCookie: {c}\r\nConnection: close\r\n\r\n"),
        )
    });
    let _ = child.kill();
    let _ = child.wait();
    assert!(login.starts_with("HTTP/1.1 303"), "{login}");
    let page = page.expect("a session cookie");
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    let canonical = ws.canonicalize().unwrap();
    assert!(
        page.contains(&format!("<h1>{}</h1>", canonical.display())),
        "{page}"
    );
}

/// One HTTP exchange with a loopback server: the whole reply.
fn http(addr: &str, raw: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(raw.as_bytes()).unwrap();
    let mut bytes = Vec::new();
    let _ = s.read_to_end(&mut bytes);
    String::from_utf8_lossy(&bytes).into_owned()
}
