//! One Rust agent, two sandboxes: `metash-agent`'s `echo` example built for wasm32-wasip1 and for
//! the host (by this test, with the cargo that runs it) and run under both sandboxes. Skips, saying why, when the
//! wasm32-wasip1 target is not installed.

use std::path::PathBuf;
use std::process::Command;

use metash_runtime::sink::kinds;

use super::common::*;

fn build_echo(target: Option<&str>) -> Result<PathBuf, String> {
    let sysroot = Command::new("rustc")
        .args(["--print", "sysroot"])
        .output()
        .map_err(|e| format!("rustc not runnable: {e}"))?;
    let sysroot = String::from_utf8_lossy(&sysroot.stdout).trim().to_string();
    if target.is_some()
        && !PathBuf::from(&sysroot)
            .join("lib/rustlib/wasm32-wasip1")
            .exists()
    {
        return Err(
            "the wasm32-wasip1 target is not installed (rustup target add wasm32-wasip1)".into(),
        );
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let target_dir = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| root.join("target"));
    let mut cmd = Command::new(env!("CARGO"));
    cmd.current_dir(&root).args([
        "build",
        "-q",
        "-p",
        "metash-agent",
        "--example",
        "echo",
        "--release",
    ]);
    if let Some(t) = target {
        cmd.args(["--target", t]);
    }
    let status = cmd
        .env("CARGO_TARGET_DIR", &target_dir)
        .status()
        .expect("cargo runs");
    // Only a missing target is a reason to skip; a build that fails is a failure.
    assert!(
        status.success(),
        "cargo build of the echo example failed: {status}"
    );
    Ok(match target {
        Some(t) => target_dir.join(format!("{t}/release/examples/echo.wasm")),
        None => target_dir.join("release/examples/echo"),
    })
}

#[test]
fn rust_sdk_agent_runs_as_wasm() {
    let wasm = match build_echo(Some("wasm32-wasip1")) {
        Ok(p) => p,
        Err(why) => {
            println!("SKIP rust_sdk_agent_runs_as_wasm: {why}");
            return;
        }
    };
    let f = Fixture::new();
    let mut spec = f.wasm("rs-echo", "", &["files.read"], None);
    spec.entry = wasm;
    let mut a = f.start(spec);
    let (o, ev) = run(&mut a, "hello");
    assert_eq!(
        o.status.agent_status(),
        metash_protocol::AgentStatus::Success,
        "{o:?}"
    );
    assert_eq!(
        text(&ev),
        "echo: hello (workspace says \"hello from inside\")"
    );
    let states: Vec<_> = f
        .events("rs-echo", kinds::AGENT_EVENT)
        .into_iter()
        .filter(|e| e.data["type"] == "state_update")
        .collect();
    assert_eq!(states[0].data["value"], "hello");
    // The same source built natively, under the native sandbox, gives the same answer.
    if let Some(why) = native_unavailable() {
        println!("SKIP native half of rust_sdk_agent_runs_as_wasm: {why}");
        return;
    }
    let native = build_echo(None).unwrap();
    let mut spec = f.native("rs-echo-n", &["files.read"], None);
    spec.entry = native;
    let mut n = f.start(spec);
    let (_, ev) = run(&mut n, "hello");
    assert_eq!(
        text(&ev),
        "echo: hello (workspace says \"hello from inside\")"
    );
    n.shutdown().unwrap();
}
