//! Test support shared by metash's crates, so each test suite does not grow its own copy.
//! A dev-dependency only: nothing in a shipped crate depends on it. Failures here are test
//! failures, so these helpers panic with a message rather than return errors.

#![allow(clippy::unwrap_used, clippy::expect_used)]

pub mod acp;
pub mod anthropic;
pub mod cli;
pub mod greetings;
pub mod oidc;
pub mod openai;
#[cfg(unix)]
pub mod postgres;
pub mod procs;
#[cfg(unix)]
pub mod pty;
pub mod sdk;
#[cfg(unix)]
pub mod secret_service;
pub mod tmux;
pub mod wasm;

use std::path::PathBuf;

/// A test whose prerequisite is missing: on a laptop it prints `SKIP <test>: <why>` and the caller
/// returns; on CI (the `CI` variable set) it fails, because a skipped test there would hide a
/// missing install step.
pub fn skip(test: &str, why: &str) {
    if std::env::var_os("CI").is_some_and(|v| !v.is_empty()) {
        panic!("{test} cannot run, and CI is set: {why}");
    }
    eprintln!("SKIP {test}: {why}");
}

/// Seed 002's example manifest, verbatim: what the policy and the CLI must accept as written.
pub const SEED_MANIFEST: &str = r#"schema_version = "0.1"
name = "Claude Code"
version = "0.1.0"
entry = "claude_agent.wasm"
sandbox = "wasm"              # wasm | native

capabilities = ["codegen", "files.read", "files.write", "network", "media.preview"]
oauth_scopes = ["github:repo", "google:drive.readonly"]

resources.cpu = "500m"
resources.mem = "512Mi"

ui.hints = ["streaming", "diff", "preview"]
"#;

/// Seed 001's runtime snapshot exactly as the seed prints it (no `schema_version`, no `revision`).
pub const SEED_SESSION: &str = r#"{
  "sessionId": "550e8400-e29b-41d4-a716-446655440000",
  "status": "executing",
  "currentPhase": 1,
  "gapCount": 0,
  "plan": {
    "currentTaskIdx": 1,
    "tasks": [
      {"id": "01", "title": "Setup Cargo Project", "status": "complete", "dependencies": [], "commits": ["a1b2c3d"]},
      {"id": "02", "title": "Implement SQLite Schema", "status": "pending", "dependencies": ["01"], "commits": []},
      {"id": "03", "title": "Build TUI List View", "status": "pending", "dependencies": ["02"]}
    ]
  },
  "variables": {"last_verification_failed": false}
}"#;

/// `src` with each edit applied in turn: `(position, op, byte)` replaces (op 0), inserts (1) or
/// removes (2) one byte at `position` modulo the length. What property tests feed parsers.
pub fn mutate(src: &[u8], edits: &[(usize, u8, u8)]) -> Vec<u8> {
    let mut bytes = src.to_vec();
    for (pos, op, b) in edits {
        if bytes.is_empty() {
            bytes.push(*b);
            continue;
        }
        let i = pos % bytes.len();
        match op % 3 {
            0 => bytes[i] = *b,
            1 => bytes.insert(i, *b),
            _ => {
                bytes.remove(i);
            }
        }
    }
    bytes
}

/// Build `metash-agent`'s example `name` (release) with the cargo running the tests, for
/// `target` or the host. `Err(why)` only when the target is not installed (the caller prints
/// `SKIP`); a build that fails is a test failure.
pub fn build_example(name: &str, target: Option<&str>) -> Result<PathBuf, String> {
    let sysroot = std::process::Command::new("rustc")
        .args(["--print", "sysroot"])
        .output()
        .map_err(|e| format!("rustc not runnable: {e}"))?;
    let sysroot = String::from_utf8_lossy(&sysroot.stdout).trim().to_string();
    if let Some(t) = target {
        if !PathBuf::from(&sysroot).join("lib/rustlib").join(t).exists() {
            return Err(format!(
                "the {t} target is not installed (rustup target add {t}, or scripts/setup)"
            ));
        }
    }
    // This crate is `crates/metash-testkit`: the workspace is two levels up.
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let target_dir = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| root.join("target"));
    let mut cmd = std::process::Command::new(env!("CARGO"));
    cmd.current_dir(&root).args([
        "build",
        "-q",
        "-p",
        "metash-agent",
        "--example",
        name,
        "--release",
    ]);
    if let Some(t) = target {
        cmd.args(["--target", t]);
    }
    let status = cmd
        .env("CARGO_TARGET_DIR", &target_dir)
        .status()
        .expect("cargo runs");
    assert!(
        status.success(),
        "cargo build of the {name} example failed: {status}"
    );
    Ok(match target {
        Some(t) => target_dir.join(format!("{t}/release/examples/{name}.wasm")),
        None => target_dir.join(format!("release/examples/{name}")),
    })
}

/// Joins a new session keyring for this thread (what a login session has; a process started
/// outside one, as CI's may be, has none, and the kernel keyring then has nowhere to keep a key).
///
/// # Panics
/// The kernel refuses `keyctl` (a container whose seccomp profile forbids it).
#[cfg(target_os = "linux")]
pub fn join_session_keyring() {
    const KEYCTL_JOIN_SESSION_KEYRING: libc::c_long = 1;
    // SAFETY: keyctl with a null name joins a new anonymous session keyring; no memory is passed.
    let r = unsafe {
        libc::syscall(
            libc::SYS_keyctl,
            KEYCTL_JOIN_SESSION_KEYRING,
            std::ptr::null::<libc::c_char>(),
        )
    };
    assert!(
        r >= 0,
        "keyctl(JOIN_SESSION_KEYRING): {}",
        std::io::Error::last_os_error()
    );
}
