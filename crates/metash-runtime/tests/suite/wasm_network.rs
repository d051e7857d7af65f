//! WASI preview-2 components: the plain protocol (`metash-agent`'s `echo` example built for
//! wasm32-wasip2) and network (its `net` example): no `network`, no connection; an allowlist, only
//! the host's CONNECT proxy, which checks the allowlist; every refusal logged host-side. Every
//! connection goes to a listener on 127.0.0.1 that the test starts; names outside the allowlist are
//! refused by the proxy before anything is resolved. Skips, saying why, when the wasm32-wasip2
//! target is not installed.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use metash_protocol::LogKind;

use metash_protocol::{AgentEvent, AgentStatus};
use metash_runtime::{NetworkAccess, Recorded};

use super::common::*;

const P2: &str = "wasm32-wasip2";

/// A loopback listener answering each line `x` with `pong: x`, recording what it received.
struct Listener {
    port: u16,
    received: Arc<Mutex<Vec<String>>>,
}

impl Listener {
    fn start() -> Self {
        let listener = TcpListener::bind(("127.0.0.1", 0)).unwrap();
        let port = listener.local_addr().unwrap().port();
        let received = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&received);
        // Accepts for the rest of the test process; each connection is answered once.
        thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let seen = Arc::clone(&seen);
                thread::spawn(move || {
                    conn.set_read_timeout(Some(Duration::from_secs(10))).ok();
                    let mut line = String::new();
                    if BufReader::new(&conn).read_line(&mut line).is_ok() && !line.is_empty() {
                        let line = line.trim_end().to_string();
                        // Recorded before the reply: once the agent has its answer, the test
                        // may look.
                        seen.lock().unwrap().push(line.clone());
                        let _ = (&conn).write_all(format!("pong: {line}\n").as_bytes());
                    }
                });
            }
        });
        Self { port, received }
    }

    fn received(&self) -> Vec<String> {
        self.received.lock().unwrap().clone()
    }
}

fn build(name: &str, test: &str) -> Option<PathBuf> {
    match build_example(name, Some(P2)) {
        Ok(p) => Some(p),
        Err(why) => {
            metash_testkit::skip(test, &why);
            None
        }
    }
}

/// The `error` events' messages (the net agent reports every failure as `denied`).
fn errors(events: &[AgentEvent]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match e {
            AgentEvent::Error { code, message, .. } if code == "denied" => Some(message.clone()),
            _ => None,
        })
        .collect()
}

fn outputs(events: &[AgentEvent]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match e {
            AgentEvent::Output { data, .. } => Some(data.clone()),
            _ => None,
        })
        .collect()
}

/// The host-side denials of the socket address check for `addr`.
fn addr_denials(f: &Fixture, id: &str, addr: &str) -> Vec<Recorded> {
    f.events(id, LogKind::SandboxDenied)
        .into_iter()
        .filter(|e| {
            e.data["what"] == "network"
                && e.data["via"] == "wasi-socket-addr-check"
                && e.data["addr"] == addr
        })
        .collect()
}

#[test]
fn wasm_p2_component_runs_the_echo_protocol() {
    let Some(wasm) = build("echo", "wasm_p2_component_runs_the_echo_protocol") else {
        return;
    };
    let f = Fixture::new();
    let mut spec = f.wasm("p2-echo", "", &["files.read"], None);
    spec.entry = wasm.clone();
    let mut a = f.start(spec);
    for prompt in ["hello", "again"] {
        let (o, ev) = run(&mut a, prompt);
        assert_eq!(o.status.agent_status(), AgentStatus::Success, "{o:?}");
        assert_eq!(
            text(&ev),
            format!("echo: {prompt} (workspace says \"hello from inside\")")
        );
    }
    let started = &f.events("p2-echo", LogKind::AgentStarted)[0].data;
    assert_eq!(started["kind"], "wasi-p2 component", "{started}");
    assert_eq!(started["network"]["mode"], "none", "{started}");
    assert_eq!(started["preopen"], "read-only");
    // Cached on disk as a component, distinct from any module entry.
    let cached: Vec<String> = std::fs::read_dir(f.dir.path().join("cache"))
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().to_string()))
        .collect();
    assert!(
        cached
            .iter()
            .any(|n| n.contains("-component-") && n.ends_with(".cwasm")),
        "{cached:?}"
    );
    // A second runtime on the same cache loads it from disk.
    let sink = Arc::new(metash_runtime::MemorySink::new());
    let rt2 = metash_runtime::Runtime::new(
        metash_runtime::RuntimeConfig {
            cache_dir: f.dir.path().join("cache"),
            cache_key: metash_runtime::CacheKey::ephemeral().expect("cache key"),
        },
        Arc::clone(&sink) as Arc<dyn metash_runtime::EventSink>,
    )
    .unwrap();
    let mut spec = f.wasm("p2-echo-disk", "", &[], None);
    spec.entry = wasm.clone();
    let mut b = rt2.register(spec).unwrap();
    let report = b.start().unwrap();
    assert_eq!(report["module_cache"], "disk", "{report}");
    let (o, ev) = run(&mut b, "from disk");
    assert_eq!(o.status.agent_status(), AgentStatus::Success, "{o:?}");
    assert_eq!(text(&ev), "echo: from disk (no files granted)");
    // The same component on the fuel engine, with plenty of fuel, behaves the same.
    let mut spec = f.wasm("p2-echo-fuel", "", &[], None);
    spec.entry = wasm;
    spec.fuel = Some(1_000_000_000);
    let mut c = f.start(spec);
    let (o, ev) = run(&mut c, "fueled");
    assert_eq!(o.status.agent_status(), AgentStatus::Success, "{o:?}");
    assert_eq!(text(&ev), "echo: fueled (no files granted)");
}

#[test]
fn wasm_p2_without_network_cannot_connect() {
    let Some(wasm) = build("net", "wasm_p2_without_network_cannot_connect") else {
        return;
    };
    let listener = Listener::start();
    let target = format!("127.0.0.1:{}", listener.port);
    let f = Fixture::new();
    // An allowlist in the spec is not honoured without the `network` capability.
    let mut spec = f.wasm("p2-nonet", "", &[], None);
    spec.entry = wasm;
    spec.network = NetworkAccess::Allowlist(vec!["localhost".into()]);
    let mut a = f.start(spec);
    let started = &f.events("p2-nonet", LogKind::AgentStarted)[0].data;
    assert_eq!(started["network"]["mode"], "none", "{started}");
    assert!(started["network"]["proxy_port"].is_null(), "{started}");

    let (o, ev) = run(&mut a, &format!("connect {target}"));
    assert_eq!(o.status.agent_status(), AgentStatus::Success, "{o:?}");
    let errs = errors(&ev);
    assert!(
        errs.len() == 1 && errs[0].contains("failed"),
        "connected? {ev:?}"
    );
    assert!(listener.received().is_empty());
    let denials = addr_denials(&f, "p2-nonet", &target);
    assert_eq!(denials.len(), 1, "{:?}", f.sink.events());
    assert_eq!(denials[0].data["use"], "tcp_connect");
    assert_eq!(denials[0].data["reason"], "network not granted");

    // UDP: refused at the bind, logged.
    let (_, ev) = run(&mut a, &format!("udp {target}"));
    let errs = errors(&ev);
    assert!(errs.len() == 1 && errs[0].contains("udp"), "{ev:?}");
    assert!(
        f.events("p2-nonet", LogKind::SandboxDenied)
            .iter()
            .any(|e| e.data["use"] == "udp_bind" && e.data["reason"] == "UDP is not allowed"),
        "{:?}",
        f.sink.events()
    );

    // No proxy either: nothing in the environment points at one.
    let (_, ev) = run(&mut a, &format!("proxy localhost:{}", listener.port));
    assert_eq!(errors(&ev), vec!["no HTTPS_PROXY in the environment"]);
    assert!(listener.received().is_empty());
}

#[test]
fn wasm_p2_allowlist_reaches_only_the_proxy() {
    let Some(wasm) = build("net", "wasm_p2_allowlist_reaches_only_the_proxy") else {
        return;
    };
    let listener = Listener::start();
    let target = format!("127.0.0.1:{}", listener.port);
    let f = Fixture::new();
    let mut spec = f.wasm("p2-allow", "", &["network"], None);
    spec.entry = wasm;
    spec.network = NetworkAccess::Allowlist(vec!["localhost".into()]);
    let mut a = f.start(spec);
    let started = f.events("p2-allow", LogKind::AgentStarted)[0].data.clone();
    assert_eq!(started["network"]["mode"], "allowlist", "{started}");
    assert_eq!(started["network"]["via"], "wasi-p2 socket_addr_check");
    let proxy_port = started["network"]["proxy_port"].as_u64().unwrap();
    assert_eq!(
        started["network"]["proxy_env"][0], "HTTPS_PROXY",
        "{started}"
    );

    // Direct: refused by the socket address check, logged.
    let (_, ev) = run(&mut a, &format!("connect {target}"));
    assert_eq!(errors(&ev).len(), 1, "connected directly? {ev:?}");
    assert!(listener.received().is_empty());
    let denials = addr_denials(&f, "p2-allow", &target);
    assert_eq!(denials.len(), 1, "{:?}", f.sink.events());
    assert!(
        denials[0].data["reason"]
            .as_str()
            .unwrap()
            .contains("proxy"),
        "{:?}",
        denials[0]
    );

    // By name: no name lookup (the proxy resolves); the refusal is logged too.
    let (_, ev) = run(&mut a, &format!("connect localhost:{}", listener.port));
    assert_eq!(errors(&ev).len(), 1, "connected by name? {ev:?}");
    assert!(listener.received().is_empty());
    assert!(
        f.events("p2-allow", LogKind::SandboxDenied)
            .iter()
            .any(|e| { e.data["via"] == "wasi-ip-name-lookup" && e.data["name"] == "localhost" }),
        "{:?}",
        f.sink.events()
    );

    // Through the proxy to an allowlisted name: end to end.
    let (o, ev) = run(&mut a, &format!("proxy localhost:{}", listener.port));
    assert_eq!(o.status.agent_status(), AgentStatus::Success, "{o:?}");
    assert_eq!(outputs(&ev), vec!["proxied: pong: ping"], "{ev:?}");
    assert_eq!(listener.received(), vec!["ping"]);
    assert!(f
        .events("p2-allow", LogKind::NetworkConnect)
        .iter()
        .any(|e| e.data["host"] == "localhost" && e.data["port"] == listener.port));
    // The proxy's own port passed the check: no denial for it.
    assert!(addr_denials(&f, "p2-allow", &format!("127.0.0.1:{proxy_port}")).is_empty());

    // Through the proxy to names outside the allowlist (refused before any lookup), and to the
    // listener's IP literal (not an allowlisted name either).
    for refused in [format!("outside.invalid:{}", listener.port), target.clone()] {
        let (_, ev) = run(&mut a, &format!("proxy {refused}"));
        let errs = errors(&ev);
        assert!(
            errs.len() == 1 && errs[0].contains("403"),
            "{refused}: {ev:?}"
        );
        let host = refused.rsplit_once(':').unwrap().0.to_string();
        assert!(
            f.events("p2-allow", LogKind::SandboxDenied)
                .iter()
                .any(|e| {
                    e.data["host"] == host.as_str() && e.data["code"] == "domain_not_allowed"
                }),
            "{refused}: {:?}",
            f.sink.events()
        );
    }
    assert_eq!(listener.received(), vec!["ping"]);
}

#[test]
fn wasm_p2_unrestricted_connects_directly() {
    let Some(wasm) = build("net", "wasm_p2_unrestricted_connects_directly") else {
        return;
    };
    let listener = Listener::start();
    let f = Fixture::new();
    let mut spec = f.wasm("p2-open", "", &["network"], None);
    spec.entry = wasm;
    spec.network = NetworkAccess::Unrestricted;
    let mut a = f.start(spec);
    let started = &f.events("p2-open", LogKind::AgentStarted)[0].data;
    assert_eq!(started["network"]["mode"], "unrestricted", "{started}");
    let (_, ev) = run(&mut a, &format!("connect 127.0.0.1:{}", listener.port));
    assert_eq!(outputs(&ev), vec!["connected: pong: ping"], "{ev:?}");
    assert_eq!(listener.received(), vec!["ping"]);
    assert!(f.events("p2-open", LogKind::SandboxDenied).is_empty());
}

#[test]
fn wasm_p1_module_has_no_network_even_when_granted() {
    let f = Fixture::new();
    let mut spec = f.wasm("p1-net", &wat_echo(), &["network"], None);
    spec.network = NetworkAccess::Allowlist(vec!["localhost".into()]);
    let mut a = f.start(spec);
    let started = &f.events("p1-net", LogKind::AgentStarted)[0].data;
    assert_eq!(started["kind"], "wasi-p1 module");
    assert_eq!(started["network"]["mode"], "none", "{started}");
    assert_eq!(started["network"]["via"], "wasi-p1");
    assert!(
        started["network"]["proxy_port"].is_null(),
        "no proxy for a p1 module"
    );
    let (o, _) = run(&mut a, "go");
    assert_eq!(o.status.agent_status(), AgentStatus::Success, "{o:?}");
}

/// A WAT component (no Rust toolchain needed) that imports nothing and exports `wasi:cli/run`:
/// the p2 path runs it and maps its `ok` result to exit code 0.
#[test]
fn wasm_wat_component_runs() {
    let f = Fixture::new();
    let wat = r#"(component
  (core module $m (func (export "run") (result i32) i32.const 0))
  (core instance $i (instantiate $m))
  (func $run (result (result)) (canon lift (core func $i "run")))
  (instance $r (export "run" (func $run)))
  (export "wasi:cli/run@0.2.0" (instance $r))
)"#;
    let mut a = f.start(f.wasm("wat-comp", wat, &[], None));
    let started = &f.events("wat-comp", LogKind::AgentStarted)[0].data;
    assert_eq!(started["kind"], "wasi-p2 component", "{started}");
    // It says nothing on stdout: the invocation ends as an exit with code 0.
    let (o, _) = run(&mut a, "go");
    assert_eq!(
        o.status,
        metash_runtime::InvocationStatus::Exited {
            code: Some(0),
            signal: None
        },
        "{o:?}"
    );
}
