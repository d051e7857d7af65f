//! Consent while an agent runs: the agent's own `consent_request` answered on its stdin, network
//! writes asked per connection at the host's proxy, a revocation from another handle refusing the
//! very next use with an `error` (code and hint), and process starts asked per program. Native
//! agents (the proxy and the exec gate are the native sandbox's); every server is on 127.0.0.1.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use metash_host::{Host, HostOptions, SpawnRequest, Spawner, Terminal};
use metash_protocol::{AgentResponse, AgentStatus};
use serde_json::Value;

use super::common::{native_agent_exe, native_unavailable, Project};

fn project(caps: &[&str]) -> Option<Project> {
    if let Some(why) = native_unavailable() {
        metash_testkit::skip("consent tests", &why);
        return None;
    }
    let p = Project::new();
    p.agent("native-c", "native", &native_agent_exe(), caps);
    Some(p)
}

fn host(p: &Project, yes_to: &[&str], policy: Option<&str>) -> Host {
    let policy_file = policy.map(|text| {
        let f = p.path().join("policy.toml");
        std::fs::write(&f, format!("schema_version = \"0.1\"\n{text}")).unwrap();
        f
    });
    Host::open(
        p.path(),
        HostOptions {
            terminal: Terminal::Silent,
            yes_to: yes_to.iter().map(|c| c.parse().unwrap()).collect(),
            policy_file,
            ..HostOptions::default()
        },
    )
    .unwrap()
}

fn spawn(host: &Host, message: &str) -> AgentResponse {
    let req = SpawnRequest::new("native-c", "be brief", message);
    let r = host.spawn_agent(&req).unwrap();
    assert_eq!(r.status, AgentStatus::Success, "{r:?}");
    r
}

/// The ledger's events of `kind` about `capability`.
fn ledger(p: &Project, kind: &str, capability: &str) -> Vec<Value> {
    p.log_data(kind)
        .into_iter()
        .filter(|d| d["capability"] == capability)
        .collect()
}

/// An HTTP server on 127.0.0.1 answering `200 ok` and recording `METHOD PATH` of each request.
fn server() -> (u16, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let seen2 = Arc::clone(&seen);
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let mut reader = BufReader::new(conn.try_clone().unwrap());
            let mut line = String::new();
            let _ = reader.read_line(&mut line);
            loop {
                let mut h = String::new();
                if reader.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                    break;
                }
            }
            let mut words = line.split_whitespace();
            let (m, path) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
            seen2.lock().unwrap().push(format!("{m} {path}"));
            let _ = (&conn).write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
        }
    });
    (port, seen)
}

#[test]
fn an_agents_consent_request_is_answered_mid_run() {
    let Some(p) = project(&["files.read", "codegen", "network:localhost"]) else {
        return;
    };
    let h = host(
        &p,
        &["native"],
        Some("[[allow]]\nagent = \"*\"\ncapability = \"codegen\"\nduration_s = 120\n"),
    );
    let r = spawn(&h, "consent codegen");
    assert!(r.data.starts_with("granted 20"), "{}", r.data);
    let answers = ledger(&p, "consent_answer", "codegen");
    assert_eq!(
        answers.last().unwrap()["answer"],
        "allow_for",
        "{answers:?}"
    );

    // Declared but nobody allows it: denied, and the agent is told why.
    let r = spawn(&h, "consent network:localhost");
    assert!(r.data.starts_with("refused consent_denied"), "{}", r.data);

    // Undeclared: refused without asking anyone.
    let r = spawn(&h, "consent network:evil.example");
    assert!(
        r.data.starts_with("refused capability_undeclared"),
        "{}",
        r.data
    );
    assert!(ledger(&p, "consent_request", "network:evil.example").is_empty());
    let r = spawn(&h, "consent not a capability");
    assert!(
        r.data.starts_with("refused invalid_capability"),
        "{}",
        r.data
    );
}

#[test]
fn network_writes_are_asked_per_connection() {
    let Some(p) = project(&["files.read", "network:localhost"]) else {
        return;
    };
    let (port, seen) = server();
    let grant = "[[allow]]\nagent = \"*\"\ncapability = \"network:localhost\"\nduration_s = 600\n";
    let h = host(&p, &["native"], Some(grant));
    let r = spawn(&h, &format!("fetch GET http://localhost:{port}/read"));
    assert!(r.data.contains("200 OK ok"), "{}", r.data);
    let r = spawn(&h, &format!("fetch POST http://localhost:{port}/write"));
    assert!(r.data.contains("403"), "{}", r.data);
    assert!(r.data.contains("error consent_denied"), "{}", r.data);
    assert_eq!(*seen.lock().unwrap(), vec![format!("GET /read")]);
    let asked = ledger(&p, "consent_request", "network:localhost");
    assert!(
        asked.iter().any(|d| d["sensitive"] == "network_write"),
        "the write was not asked: {asked:?}"
    );

    // A rule that also answers sensitive actions lets the write through; each one is asked.
    let h = host(&p, &["native"], Some(&format!("{grant}sensitive = true\n")));
    let before = ledger(&p, "consent_request", "network:localhost").len();
    let r = spawn(&h, &format!("fetch POST http://localhost:{port}/write"));
    assert!(r.data.contains("200 OK ok"), "{}", r.data);
    assert_eq!(seen.lock().unwrap().last().unwrap(), "POST /write");
    assert_eq!(
        ledger(&p, "consent_request", "network:localhost").len(),
        before + 1
    );
}

#[test]
fn a_revocation_refuses_the_next_use_with_an_error_event() {
    let Some(p) = project(&["files.read", "network:localhost"]) else {
        return;
    };
    let (port, seen) = server();
    let h = host(
        &p,
        &["native"],
        Some("[[allow]]\nagent = \"*\"\ncapability = \"network:localhost\"\nduration_s = 600\n"),
    );
    let go: PathBuf = p.path().join("go");
    let msg = format!("fetch GET http://localhost:{port}/x {}", go.display());
    let ws = p.path().to_path_buf();
    let revoker = std::thread::spawn(move || {
        let until = Instant::now() + Duration::from_secs(20);
        while seen.lock().unwrap().is_empty() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
        // Another handle on the project (as `metash consent revoke` in another process is).
        let store = metash_store::Store::open(&ws).unwrap();
        let registry = metash_policy::Registry::discover(&metash_policy::AgentDirs::new(&ws, None));
        let policy = metash_policy::Policy::new(store, registry);
        policy
            .revoke("native-c", &"network:localhost".parse().unwrap(), "test")
            .unwrap();
        std::fs::write(ws.join("go"), "").unwrap();
    });
    let r = spawn(&h, &msg);
    revoker.join().unwrap();
    let lines: Vec<&str> = r.data.lines().collect();
    assert_eq!(lines.len(), 2, "{}", r.data);
    assert!(lines[0].contains("200 OK ok"), "{}", r.data);
    assert!(lines[1].contains("403"), "{}", r.data);
    assert!(lines[1].contains("error consent_revoked"), "{}", r.data);
    assert!(
        lines[1].contains("metash consent grant native-c"),
        "{}",
        r.data
    );
}

#[test]
fn process_starts_are_asked_per_program() {
    let Some(p) = project(&["files.read", "process.spawn:true"]) else {
        return;
    };
    let h = host(&p, &["native", "process.spawn:true"], None);
    let r = spawn(&h, "run /bin/true");
    assert_eq!(r.data, "exit 0");
    let asked = ledger(&p, "consent_request", "process.spawn:/bin/true");
    assert_eq!(asked.len(), 1, "{asked:?}");
    assert_eq!(asked[0]["sensitive"], "process_spawn");

    // Undeclared program: refused without asking.
    let r = spawn(&h, "run /bin/false");
    assert!(r.data.starts_with("refused"), "{}", r.data);
    assert!(r.data.contains("error capability_undeclared"), "{}", r.data);
    assert!(ledger(&p, "consent_request", "process.spawn:/bin/false").is_empty());

    // Declared, but nobody says yes.
    let h = host(&p, &["native"], None);
    let r = spawn(&h, "run /bin/true");
    assert!(r.data.contains("error consent_denied"), "{}", r.data);
}

/// Scoped file grants are paths of their own: `files.write:sub` opens `sub` and nothing else of the
/// workspace; a path outside the workspace is a sensitive write, asked at every spawn.
#[test]
fn scoped_file_grants_open_only_their_paths() {
    let outside = tempfile::tempdir().unwrap();
    let out = outside.path().display().to_string();
    let Some(p) = project(&["files.write:sub", &format!("files.write:{out}")]) else {
        return;
    };
    std::fs::create_dir_all(p.path().join("sub")).unwrap();
    let write = |h: &Host, path: PathBuf| spawn(h, &format!("write {}", path.display())).data;

    let h = host(&p, &["native", "files.write:sub"], None);
    assert_eq!(write(&h, p.path().join("sub/a.txt")), "wrote");
    assert!(write(&h, p.path().join("b.txt")).starts_with("refused"));
    assert!(write(&h, outside.path().join("c.txt")).starts_with("refused"));
    let asked = ledger(&p, "consent_request", &format!("files.write:{out}"));
    assert!(
        !asked.is_empty()
            && asked
                .iter()
                .all(|d| d["sensitive"] == "write_outside_workspace"),
        "{asked:?}"
    );

    let h = host(
        &p,
        &["native", "files.write:sub", &format!("files.write:{out}")],
        None,
    );
    assert_eq!(write(&h, outside.path().join("c.txt")), "wrote");
    assert_eq!(
        std::fs::read_to_string(outside.path().join("c.txt")).unwrap(),
        "written"
    );
    assert!(!p.path().join("b.txt").exists());
}

/// A policy file the user named is never silently ignored: one that does not parse, or says a
/// version this build does not read, stops the host from opening, naming the file and line.
#[test]
fn a_bad_policy_file_stops_the_host_with_file_and_line() {
    let p = Project::new();
    for (text, says) in [
        ("schema_version = \"0.1\"\n[[allow]\n", "2:"),
        (
            "schema_version = \"9.9\"\n",
            "unsupported schema_version \"9.9\"",
        ),
        (
            "schema_version = \"0.1\"\n[[allow]]\nagent = \"*\"\ncapability = \"teleport\"\n",
            "4:",
        ),
    ] {
        let f = p.path().join("policy.toml");
        std::fs::write(&f, text).unwrap();
        let mut options = HostOptions::silent();
        options.policy_file = Some(f);
        let err = Host::open(p.path(), options).unwrap_err().to_string();
        assert!(err.contains("policy.toml"), "{err}");
        assert!(err.contains(says), "{text:?}: {err}");
    }
}

/// With `[host] consent_wait_seconds`, a question no rule answers waits for any client (what
/// `metash ui` shows): the first answer reaches the running agent, a second is refused; a question
/// nobody answers is denied at its deadline.
#[test]
fn a_question_waits_for_any_client_and_the_first_answer_wins() {
    let Some(p) = project(&["codegen", "network:localhost"]) else {
        return;
    };
    p.config("[host]\nconsent_wait_seconds = 20\n");
    let h = host(&p, &["native"], None);
    let store = metash_store::Store::open(p.path()).unwrap();
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let finished = Arc::clone(&done);
    // A client: allows `codegen` for 90 s (then tries to answer it again, as a second client
    // would), denies anything else (the spawn also asks for `network:localhost`).
    let answerer = std::thread::spawn(move || {
        let mut second = None;
        while !finished.load(std::sync::atomic::Ordering::SeqCst) {
            for ask in metash_host::asks::pending(&store).unwrap() {
                assert_eq!(ask.agent, "native-c");
                let answer = if ask.capability == "codegen" {
                    metash_policy::Answer::AllowFor(90)
                } else {
                    metash_policy::Answer::Deny
                };
                metash_host::asks::reply(&store, &ask.id, answer, "ui").unwrap();
                if ask.capability == "codegen" {
                    let again = metash_host::asks::reply(
                        &store,
                        &ask.id,
                        metash_policy::Answer::Deny,
                        "terminal",
                    );
                    second = Some(again.map_err(|e| e.to_string()));
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        second
    });
    let t0 = Instant::now();
    let r = spawn(&h, "consent codegen");
    let took = t0.elapsed();
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let second = answerer.join().unwrap();
    assert!(
        took < Duration::from_secs(10),
        "answered at once, not at the deadline: {took:?}"
    );
    assert!(r.data.starts_with("granted 20"), "{}", r.data);
    assert!(
        second
            .as_ref()
            .is_some_and(|s| s.as_ref().is_err_and(|e| e.contains("already answered"))),
        "{second:?}"
    );
    let answers = ledger(&p, "consent_answer", "codegen");
    assert_eq!(answers.last().unwrap()["answer"], "allow_for");
    assert_eq!(answers.last().unwrap()["by"], "any client");
    let replied = p.log_data("consent_replied");
    assert_eq!(
        replied.len(),
        2,
        "codegen and network, once each: {replied:?}"
    );
    assert!(replied.iter().all(|r| r["by"] == "ui"));

    // Nobody answers: denied at the deadline, and the question no longer waits.
    p.config("[host]\nconsent_wait_seconds = 0.5\n");
    let h = host(&p, &["native"], None);
    let t = Instant::now();
    let r = spawn(&h, "consent network:localhost");
    assert!(r.data.starts_with("refused consent_denied"), "{}", r.data);
    assert!(t.elapsed() >= Duration::from_millis(500));
    let store = metash_store::Store::open(p.path()).unwrap();
    assert!(metash_host::asks::pending(&store).unwrap().is_empty());
}
