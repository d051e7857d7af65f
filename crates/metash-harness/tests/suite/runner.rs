//! The runner spawns a spec exactly as given, in each I/O mode.

use std::collections::BTreeMap;
use std::io::Read;
use std::time::Duration;

use metash_harness::runner::{run_piped, spawn_pty};
use metash_harness::CancellationToken;
use metash_protocol::{
    HarnessFrontend, InteractionMode, IoMode, ProcessInvocationSpec, ProviderDomain,
};

fn spec(argv: &[&str], io: IoMode) -> ProcessInvocationSpec {
    let mut env = BTreeMap::new();
    env.insert("METASH_TEST_VAR".to_string(), "it's set".to_string());
    ProcessInvocationSpec {
        provider: ProviderDomain::Anthropic,
        frontend: HarnessFrontend::ClaudeCode,
        argv: argv.iter().map(|s| s.to_string()).collect(),
        cwd: "/tmp".into(),
        env,
        interaction_mode: InteractionMode::Headless,
        io_mode: io,
        continuation: None,
        display_command: None,
    }
}

#[tokio::test]
async fn pipes_give_null_stdin_the_env_delta_and_the_cwd() {
    let s = spec(
        &["sh", "-c", "cat; echo \"$METASH_TEST_VAR\"; pwd"],
        IoMode::Pipes,
    );
    let mut lines = Vec::new();
    let out = run_piped(
        &s,
        Some(Duration::from_secs(10)),
        &CancellationToken::new(),
        &mut |l| lines.push(l.to_string()),
    )
    .await
    .unwrap();
    assert!(out.status.success());
    assert_eq!(lines, vec!["it's set".to_string(), "/tmp".to_string()]);
}

#[tokio::test]
async fn a_timeout_kills_the_process_group() {
    let s = spec(&["sh", "-c", "sleep 30 & sleep 30"], IoMode::Pipes);
    let start = std::time::Instant::now();
    let err = run_piped(
        &s,
        Some(Duration::from_millis(200)),
        &CancellationToken::new(),
        &mut |_| {},
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), metash_protocol::HarnessErrorCode::Timeout);
    assert!(start.elapsed() < Duration::from_secs(5));
}

#[test]
fn pty_gives_a_controlling_terminal() {
    let s = spec(
        &["sh", "-c", "test -t 0 && test -t 1 && echo on-a-tty"],
        IoMode::Pty,
    );
    let mut p = spawn_pty(&s, 24, 80).unwrap();
    let status = p.child.wait().unwrap();
    assert!(status.success());
    let mut out = Vec::new();
    let mut buf = [0u8; 1024];
    // The slave is closed once the child exits: read until EIO.
    while let Ok(n) = p.master.read(&mut buf) {
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
    }
    assert!(String::from_utf8_lossy(&out).contains("on-a-tty"));
}

#[tokio::test]
async fn a_grandchild_holding_stdout_open_does_not_hang_the_run() {
    let s = spec(&["sh", "-c", "echo done; sleep 30 &"], IoMode::Pipes);
    let start = std::time::Instant::now();
    let mut lines = Vec::new();
    let out = run_piped(
        &s,
        Some(Duration::from_secs(20)),
        &CancellationToken::new(),
        &mut |l| lines.push(l.to_string()),
    )
    .await
    .unwrap();
    assert!(out.status.success());
    assert_eq!(lines, vec!["done".to_string()]);
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );
}
