#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `metash sandbox --role R -- CMD…` (issue 13 item 2): any command under a role's sandbox. The
//! command works in its directory and gets its exit code back; it cannot read outside, cannot see
//! `.meta/`, holds the placeholder instead of the role's key; without the native consent nothing
//! runs and the ledger says why.

use std::path::Path;
use std::process::{Command, Output, Stdio};

const KEY: &str = "sk-sandbox-cli-real-key-0123456789";

fn project() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_metash"))
        .arg("-C")
        .arg(d.path())
        .arg("init")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::write(
        d.path().join(".meta/config.toml"),
        "[roles.coder]\nfrontend = \"pi-sdk\"\nbase_url = \"http://127.0.0.1:9/v1\"\n\
         api_key_env = \"METASH_SANDBOX_KEY\"\nmax_pids = 64\n",
    )
    .unwrap();
    d
}

fn sandbox(ws: &Path, consent: bool, script: &str) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_metash"));
    c.arg("-C")
        .arg(ws)
        .args(["sandbox", "--role", "coder", "--non-interactive"]);
    if consent {
        c.args(["--yes-to", "native"]);
    }
    c.args(["--", "/bin/bash", "-c", script])
        .current_dir(ws)
        .env("METASH_SANDBOX_KEY", KEY)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

#[test]
fn a_command_runs_under_the_roles_sandbox() {
    if let Some(why) = metash_runtime_unavailable() {
        metash_testkit::skip("a_command_runs_under_the_roles_sandbox", &why);
        return;
    }
    let p = project();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret"), "outside-secret").unwrap();
    let script = format!(
        "echo work > made.txt; cat {}/secret 2>&1; ls .meta 2>&1; \
         echo \"key=$METASH_SANDBOX_KEY\"; exit 7",
        outside.path().display()
    );
    let out = sandbox(p.path(), true, &script);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(7),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(p.path().join("made.txt")).unwrap(),
        "work\n"
    );
    assert!(!stdout.contains("outside-secret"), "{stdout}");
    assert!(stdout.contains("secret: Permission denied"), "{stdout}");
    assert!(stdout.contains("'.meta': Permission denied"), "{stdout}");
    assert!(stdout.contains("key=metash-placeholder"), "{stdout}");
    assert!(!stdout.contains(KEY));
    // The consent and the sandbox are in the log.
    let log = std::fs::read_to_string(p.path().join(".meta/events.jsonl")).unwrap();
    assert!(log.contains("\"sandbox_command\""), "{log}");
    assert!(!log.contains(KEY));
}

#[test]
fn without_native_consent_nothing_runs() {
    let p = project();
    let out = sandbox(p.path(), false, "echo ran > ran.txt");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("native execution of the role `coder` is not allowed"),
        "{stderr}"
    );
    assert!(!p.path().join("ran.txt").exists());
    let log = std::fs::read_to_string(p.path().join(".meta/events.jsonl")).unwrap();
    assert!(
        log.contains("consent_denied") || log.contains("\"error\""),
        "{log}"
    );
}

/// Why the native sandbox cannot run here (no Landlock), if so.
fn metash_runtime_unavailable() -> Option<String> {
    // SAFETY: the VERSION query of landlock_create_ruleset reads nothing.
    let abi = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            1u32,
        )
    };
    (abi < 1).then(|| "Landlock is not available in this kernel".to_string())
}
