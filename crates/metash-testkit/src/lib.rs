//! Test support shared by metash's crates, so each test suite does not grow its own copy.
//! A dev-dependency only: nothing in a shipped crate depends on it. Failures here are test
//! failures, so these helpers panic with a message rather than return errors.

#![allow(clippy::unwrap_used, clippy::expect_used)]

pub mod anthropic;
pub mod cli;
pub mod openai;
pub mod procs;
pub mod wasm;

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
