//! Withdrawing file grants from a running agent (seed 002 §2, issue 18): the host's
//! [`metash_runtime::Withdrawer`] takes `files.write` (the workspace becomes read-only) or
//! `files.read` (its contents become unreadable) back while the agent runs, in both sandboxes, and
//! the agent's next use is refused while the host's files are untouched. The native agent is one
//! process across invocations and works relative to its working directory (the workspace); the
//! WASM guest is withdrawn from between two opens of one invocation.

use metash_protocol::AgentEvent;
use metash_runtime::{InvocationStatus, PathAccess};

use super::common::*;

#[test]
fn native_writes_then_reads_are_withdrawn_mid_run() {
    require_native!();
    let f = Fixture::new();
    let mut a = f.start(f.native("n-wd", &["files.read", "files.write"], None));
    let w = a
        .withdrawer()
        .expect("a native agent with file grants has a withdrawer");
    let (_, ev) = run(&mut a, "write a.txt");
    assert_eq!(text(&ev), "WRITE-OK");

    let withdrawn = w.withdraw("files.write").expect("files.write gave a path");
    assert_eq!(withdrawn.unwrap(), f.workspace());
    let (_, ev) = run(&mut a, "write b.txt");
    assert!(!text(&ev).contains("WRITE-OK"), "{}", text(&ev));
    assert!(!f.workspace().join("b.txt").exists());
    let (_, ev) = run(&mut a, "write a.txt");
    assert!(
        !text(&ev).contains("WRITE-OK"),
        "an existing file: {}",
        text(&ev)
    );
    // Reading is still granted, relative to the working directory and by absolute path.
    let (_, ev) = run(&mut a, "read inside.txt");
    assert_eq!(text(&ev), "READ-OK:hello from inside");

    w.withdraw("files.read").expect("a path").unwrap();
    let abs = f.workspace().join("inside.txt").display().to_string();
    for path in ["inside.txt", "./inside.txt", abs.as_str(), "a.txt"] {
        let (_, ev) = run(&mut a, &format!("read {path}"));
        assert!(!text(&ev).contains("READ-OK"), "read {path}: {}", text(&ev));
    }
    // The agent is still running and can go on without its files.
    let (o, _) = run(&mut a, "read inside.txt");
    assert!(matches!(o.status, InvocationStatus::Done { .. }), "{o:?}");
    // The host's view is unchanged.
    assert_eq!(
        std::fs::read_to_string(f.workspace().join("inside.txt")).unwrap(),
        "hello from inside"
    );
    assert_eq!(
        std::fs::read_to_string(f.workspace().join("a.txt")).unwrap(),
        "pwned"
    );
    a.shutdown().unwrap();
}

#[test]
fn native_scoped_write_is_withdrawn_and_the_rest_stays() {
    require_native!();
    let f = Fixture::new();
    let out = f.dir.path().join("outside/out");
    std::fs::create_dir_all(&out).unwrap();
    let cap = format!("files.write:{}", out.display());
    let mut spec = f.native("n-wd-scoped", &["files.read", &cap], None);
    spec.paths = vec![PathAccess {
        path: out.clone(),
        write: true,
    }];
    let mut a = f.start(spec);
    let w = a.withdrawer().unwrap();
    let target = out.join("x.txt").display().to_string();
    let (_, ev) = run(&mut a, &format!("write {target}"));
    assert_eq!(text(&ev), "WRITE-OK");
    assert!(w.withdraw("network").is_none(), "no path behind network");
    assert!(
        w.withdraw("files.write:/elsewhere").is_none(),
        "not a grant it holds"
    );
    assert_eq!(w.withdraw(&cap).unwrap().unwrap(), out);
    let (_, ev) = run(&mut a, &format!("write {}", out.join("y.txt").display()));
    assert!(!text(&ev).contains("WRITE-OK"), "{}", text(&ev));
    assert!(!out.join("y.txt").exists());
    let (_, ev) = run(&mut a, "read inside.txt");
    assert_eq!(
        text(&ev),
        "READ-OK:hello from inside",
        "the workspace grant stays"
    );
    a.shutdown().unwrap();
}

/// Opens `path` on the workspace preopen (read, or create for writing), reports, sleeps 400 ms,
/// then opens it again and reports: the test withdraws in between.
fn wat_open_twice(path: &str, write: bool) -> String {
    let (oflags, rights) = if write { (1, 64) } else { (0, 2) };
    let open = format!(
        "(if (i32.eqz (call $path_open (i32.const 3) (i32.const 1) (global.get $path) (global.get $path_len) (i32.const {oflags}) (i64.const {rights}) (i64.const 0) (i32.const 0) (i32.const 16)))
           (then (call $ok)) (else (call $denied)))"
    );
    let sleep = "(i64.store (i32.const 8192) (i64.const 0))
         (i32.store8 (i32.const 8200) (i32.const 0))
         (i32.store (i32.const 8208) (i32.const 1))
         (i64.store (i32.const 8216) (i64.const 400000000))
         (i64.store (i32.const 8224) (i64.const 0))
         (i32.store16 (i32.const 8232) (i32.const 0))
         (drop (call $poll_oneoff (i32.const 8192) (i32.const 8448) (i32.const 1) (i32.const 8704)))";
    wat_module(
        path,
        &format!("{open} {sleep} {open} (call $done)"),
        r#"(import "wasi_snapshot_preview1" "poll_oneoff" (func $poll_oneoff (param i32 i32 i32 i32) (result i32)))"#,
    )
}

/// Runs the guest once, withdrawing `capability` when its first answer arrives; the answers.
fn withdraw_between(f: &Fixture, id: &str, wat: &str, capability: &str) -> Vec<String> {
    let mut a = f.start(f.wasm(id, wat, &["files.read", "files.write"], None));
    let w = a
        .withdrawer()
        .expect("a WASM agent with file grants has a withdrawer");
    let mut answers = Vec::new();
    let outcome = a
        .invoke("go", &[], &mut |e| match e {
            AgentEvent::Output { data, .. } => {
                if answers.is_empty() {
                    w.withdraw(capability).expect("a path").unwrap();
                }
                answers.push(data.clone());
            }
            AgentEvent::Error { message, .. } => answers.push(message.clone()),
            _ => {}
        })
        .unwrap();
    assert!(
        matches!(outcome.status, InvocationStatus::Done { .. }),
        "{outcome:?}"
    );
    answers
}

#[test]
fn wasm_read_is_withdrawn_within_one_invocation() {
    let f = Fixture::new();
    let answers = withdraw_between(
        &f,
        "w-wd-read",
        &wat_open_twice("inside.txt", false),
        "files.read",
    );
    assert_eq!(answers, ["OK", "the sandbox refused"]);
    assert_eq!(
        std::fs::read_to_string(f.workspace().join("inside.txt")).unwrap(),
        "hello from inside"
    );
}

#[test]
fn wasm_write_is_withdrawn_within_one_invocation() {
    let f = Fixture::new();
    let answers = withdraw_between(
        &f,
        "w-wd-write",
        &wat_open_twice("made.txt", true),
        "files.write",
    );
    assert_eq!(answers, ["OK", "the sandbox refused"]);
    // The first open created it; reading is still granted.
    assert!(f.workspace().join("made.txt").exists());
    let mut a = f.start(f.wasm(
        "w-wd-after",
        &wat_open("inside.txt", false),
        &["files.read", "files.write"],
        None,
    ));
    let (_, ev) = run(&mut a, "go");
    assert_eq!(text(&ev), "OK", "a new agent gets its grants afresh");
}
