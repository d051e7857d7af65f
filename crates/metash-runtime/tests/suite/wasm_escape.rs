//! The escape suite against the WASM sandbox. Each attempt has a positive control where it makes
//! sense (the same operation allowed inside the workspace), so a denial is not a broken fixture.

use std::time::{Duration, Instant};

use metash_protocol::LogKind;

use metash_runtime::InvocationStatus;

use super::common::*;

/// How long after its deadline (or interrupt, or shutdown grace) a stop may take. The product
/// needs a few hundred milliseconds; the margin is for a loaded CI machine descheduling the
/// host's threads. The agents stopped here would otherwise run forever, so staying under this
/// bound still proves the stop.
const STOP_WITHIN: Duration = Duration::from_secs(5);

#[test]
fn wasm_reads_inside_workspace_with_files_read() {
    let f = Fixture::new();
    let mut a = f.start(f.wasm(
        "w-in",
        &wat_open("inside.txt", false),
        &["files.read"],
        None,
    ));
    let (o, ev) = run(&mut a, "go");
    assert!(matches!(o.status, InvocationStatus::Done { .. }), "{o:?}");
    assert_eq!(text(&ev), "OK");
}

#[test]
fn wasm_denies_files_without_capability() {
    let f = Fixture::new();
    // No files.* granted: no preopen at all, fd 3 does not exist.
    let mut a = f.start(f.wasm("w-nocap", &wat_open("inside.txt", false), &[], None));
    let (_, ev) = run(&mut a, "go");
    assert_eq!(text(&ev), "the sandbox refused");
    assert!(f.logged_denial("w-nocap"));
}

#[test]
fn wasm_denies_reads_outside_workspace() {
    let f = Fixture::new();
    let secret = f.secret_path().display().to_string();
    for (i, path) in [
        "/etc/shadow",
        secret.as_str(),
        "../outside/secret.txt",
        "link",
        "./../../../../etc/passwd",
    ]
    .iter()
    .enumerate()
    {
        let id = format!("w-read-{i}");
        let mut a = f.start(f.wasm(
            &id,
            &wat_open(path, false),
            &["files.read", "files.write"],
            None,
        ));
        let (_, ev) = run(&mut a, "go");
        assert_eq!(text(&ev), "the sandbox refused", "path {path} was opened");
        assert!(f.logged_denial(&id), "no denial logged for {path}");
    }
}

#[test]
fn wasm_denies_writes_outside_and_readonly() {
    let f = Fixture::new();
    // Outside, even with files.write.
    let mut a = f.start(f.wasm(
        "w-wout",
        &wat_open("../outside/pwned", true),
        &["files.write"],
        None,
    ));
    let (_, ev) = run(&mut a, "go");
    assert_eq!(text(&ev), "the sandbox refused");
    assert!(!f.dir.path().join("outside/pwned").exists());
    assert!(f.logged_denial("w-wout"));
    // Inside with files.read only: read-only preopen.
    let mut a = f.start(f.wasm("w-wro", &wat_open("new.txt", true), &["files.read"], None));
    let (_, ev) = run(&mut a, "go");
    assert_eq!(text(&ev), "the sandbox refused");
    assert!(!f.workspace().join("new.txt").exists());
    // Positive control: inside with files.write.
    let mut a = f.start(f.wasm("w-win", &wat_open("new.txt", true), &["files.write"], None));
    let (_, ev) = run(&mut a, "go");
    assert_eq!(text(&ev), "OK");
    assert!(f.workspace().join("new.txt").exists());
}

#[test]
fn wasm_has_no_environment() {
    let f = Fixture::new();
    // environ count == 0 -> $ok; the host's own environment (PATH, HOME...) never reaches the guest.
    let wat = wat_module(
        "",
        "(drop (call $environ_sizes_get (i32.const 16) (i32.const 20)))
         (if (i32.eqz (i32.load (i32.const 16))) (then (call $ok)) (else (call $denied)))
         (call $done)",
        "",
    );
    let mut a = f.start(f.wasm("w-env", &wat, &[], None));
    let (_, ev) = run(&mut a, "go");
    assert_eq!(text(&ev), "OK", "the guest saw environment variables");
}

#[test]
fn wasm_socket_imports_are_refused_with_and_without_network() {
    let f = Fixture::new();
    let wat = wat_module(
        "",
        "(call $done)",
        r#"(import "wasi_snapshot_preview1" "sock_connect" (func $sock_connect (param i32 i32 i32) (result i32)))"#,
    );
    for (id, granted) in [("w-sock", vec![]), ("w-sock-net", vec!["network"])] {
        let mut spec = f.wasm(id, &wat, &granted, None);
        spec.network = metash_runtime::NetworkAccess::Allowlist(vec!["localhost".into()]);
        let mut a = f.rt.register(spec).unwrap();
        let err = a.start().unwrap_err();
        assert_eq!(err.code(), "sandbox_setup_failed", "{err}");
        assert!(err.to_string().contains("sock_connect"), "{err}");
        assert_eq!(f.events(id, LogKind::SandboxDenied).len(), 1);
    }
}

#[test]
fn wasm_memory_limit() {
    let f = Fixture::new();
    // Grow by 4096 pages (256 MiB) with a 64 MiB limit: memory.grow returns -1.
    let wat = wat_module(
        "",
        "(if (i32.eq (memory.grow (i32.const 4096)) (i32.const -1)) (then (call $denied)) (else (call $ok)))
         (call $done)",
        "",
    );
    let mut a = f.start(f.wasm("w-mem", &wat, &[], Some("64Mi")));
    let (_, ev) = run(&mut a, "go");
    assert_eq!(text(&ev), "the sandbox refused");
    let lim = f.events("w-mem", LogKind::LimitExceeded);
    assert_eq!(lim.len(), 1);
    assert_eq!(lim[0].data["limit"], "memory");
    // Positive control: 16 pages fit.
    let wat = wat_module(
        "",
        "(if (i32.eq (memory.grow (i32.const 16)) (i32.const -1)) (then (call $denied)) (else (call $ok)))
         (call $done)",
        "",
    );
    let mut a = f.start(f.wasm("w-mem-ok", &wat, &[], Some("64Mi")));
    assert_eq!(text(&run(&mut a, "go").1), "OK");
}

#[test]
fn wasm_spin_past_timeout_is_stopped() {
    let f = Fixture::new();
    let mut spec = f.wasm("w-spin", &wat_spin(), &[], None);
    spec.timeout = Duration::from_millis(300);
    let mut a = f.start(spec);
    let t = Instant::now();
    let (o, _) = run(&mut a, "go");
    let took = t.elapsed();
    assert_eq!(o.status, InvocationStatus::Timeout);
    // The deadline is set when the invocation starts (after `t`); the guest would spin forever,
    // so a bound of a few seconds proves the stop without depending on scheduling.
    assert!(
        took >= Duration::from_millis(300),
        "timed out early: {took:?}"
    );
    assert!(
        took < Duration::from_millis(300) + STOP_WITHIN,
        "took {took:?}"
    );
    assert_eq!(f.events("w-spin", LogKind::AgentTimeout).len(), 1);
    // The agent is still usable for the next invocation (a fresh instance).
    assert_eq!(a.state(), metash_runtime::LifecycleState::Active);
}

#[test]
fn wasm_ignoring_shutdown_is_interrupted() {
    let f = Fixture::new();
    let mut spec = f.wasm("w-ign", &wat_spin(), &[], None);
    spec.timeout = Duration::from_secs(30);
    let mut a = f.start(spec);
    let stop = a.interrupter();
    let t = Instant::now();
    let h = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        stop.interrupt();
    });
    let (o, _) = run(&mut a, "go");
    h.join().unwrap();
    let took = t.elapsed();
    // Killed, not Timeout: the 30 s deadline would have ended the spin otherwise. The interrupt
    // comes at least 200 ms after `t`.
    assert!(matches!(o.status, InvocationStatus::Killed { .. }), "{o:?}");
    assert!(took >= Duration::from_millis(200), "{took:?}");
    assert!(took < Duration::from_millis(200) + STOP_WITHIN, "{took:?}");
    assert_eq!(f.events("w-ign", LogKind::AgentKilled).len(), 1);
    a.shutdown().unwrap();
}

/// A scoped grant preopens only its directory: `sub/x.txt` opens, the rest of the workspace does
/// not (fd 3 is `sub`, and `..` cannot leave it).
#[test]
fn wasm_scoped_grant_opens_only_its_directory() {
    let f = Fixture::new();
    let sub = f.workspace().join("sub");
    std::fs::create_dir_all(&sub).unwrap();
    std::fs::write(sub.join("x.txt"), "x").unwrap();
    for (id, path, want) in [
        ("w-sub-in", "x.txt", "OK"),
        ("w-sub-up", "../inside.txt", "the sandbox refused"),
    ] {
        let mut spec = f.wasm(id, &wat_open(path, false), &[], None);
        spec.paths = vec![metash_runtime::PathAccess {
            path: sub.clone(),
            write: false,
        }];
        let mut a = f.start(spec);
        let (_, ev) = run(&mut a, "go");
        assert_eq!(text(&ev), want, "{path}");
    }
    let started = f.events("w-sub-in", LogKind::AgentStarted);
    assert_eq!(
        started[0].data["paths"]["applied"][0]["guest"], "/workspace/sub",
        "{:?}",
        started[0].data
    );
}

/// The host's state inside a grant (`.meta/` of a project root) is covered in the guest's view:
/// nothing in it can be read, and nothing planted; the rest of the grant works.
#[test]
fn wasm_sees_hidden_state_empty() {
    let f = Fixture::new();
    let meta = f.workspace().join(".meta");
    std::fs::create_dir_all(&meta).unwrap();
    std::fs::write(meta.join("session.json"), SECRET).unwrap();
    for (i, (wat, expect)) in [
        (wat_open(".meta/session.json", false), "the sandbox refused"),
        (wat_open(".meta/planted", true), "the sandbox refused"),
        (wat_open("inside.txt", false), "OK"),
    ]
    .iter()
    .enumerate()
    {
        let id = format!("w-hidden-{i}");
        let mut spec = f.wasm(&id, wat, &["files.read", "files.write"], None);
        spec.hidden = vec![meta.clone()];
        let mut a = f.start(spec);
        let (_, ev) = run(&mut a, "go");
        assert_eq!(text(&ev), *expect, "{id}");
    }
    assert!(!meta.join("planted").exists());
    assert_eq!(
        std::fs::read_to_string(meta.join("session.json")).unwrap(),
        SECRET
    );
}
