#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The README's second path, "On a fresh machine: the offline example", run literally: its command
//! read from README.md and executed by bash from the repository's root, in a fresh HOME (the Rust
//! toolchain found where it is installed, as on a fresh machine), with the `metash` this test was
//! built with (`METASH`, which the script honours, so it does not build it again). The example
//! must stop at its checkpoint, be answered, and complete with every file in place.

use std::path::Path;
use std::process::Command;

/// The README's command under "On a fresh machine: the offline example".
fn offline_command(root: &Path) -> String {
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let section = readme
        .split("## On a fresh machine: the offline example")
        .nth(1)
        .expect("the README has the offline example");
    section
        .split("```sh\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("its sh block")
        .trim()
        .to_string()
}

#[test]
fn the_readme_offline_example_runs_as_written() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap();
    let command = offline_command(&root);
    assert!(
        command.contains("examples/greetings/run.sh"),
        "the README's offline command changed: {command}"
    );
    let home = tempfile::tempdir().unwrap();
    let real_home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    let toolchain = |var: &str, default: &str| {
        std::env::var(var).unwrap_or_else(|_| format!("{real_home}/{default}"))
    };
    let out = Command::new("bash")
        .args(["-c", &command])
        .current_dir(&root)
        .env("HOME", home.path())
        .env("CARGO_HOME", toolchain("CARGO_HOME", ".cargo"))
        .env("RUSTUP_HOME", toolchain("RUSTUP_HOME", ".rustup"))
        .env("METASH", env!("CARGO_BIN_EXE_metash"))
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("== metash run --answer french"), "{stdout}");
    assert!(stderr.contains("the project is complete"), "{stderr}");
    for f in ["hello.txt", "bye.txt", "README.md", "shout.txt"] {
        assert!(stdout.contains(&format!("--- {f}")), "{f}: {stdout}");
    }
    assert!(!stdout.contains("No such file"), "{stdout}");
}
