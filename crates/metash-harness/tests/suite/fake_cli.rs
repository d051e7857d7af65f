//! The CLI frontends' plumbing with stand-in programs (shell scripts printing what the real CLIs
//! print), for the cases a loopback server cannot provoke: cancellation mid-turn and Claude's
//! `subtype: "success"` with `is_error: true`.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use metash_harness::{CancellationToken, Harness, Programs, RunTurnNonInteractiveRequest};
use metash_protocol::{
    HarnessErrorCode, HarnessEvent, HarnessFrontend, RunTurnNonInteractiveResponse,
};

fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// A stand-in CLI for `frontend` in a fresh directory: its harness and a "hi" turn request.
fn stand_in(
    dir: &Path,
    frontend: HarnessFrontend,
    body: &str,
) -> (Harness, RunTurnNonInteractiveRequest) {
    let mut programs = Programs {
        claude: None,
        codex: None,
        pi: None,
    };
    let slot = match frontend {
        HarnessFrontend::CodexCli => &mut programs.codex,
        HarnessFrontend::PiSdk => &mut programs.pi,
        _ => &mut programs.claude,
    };
    *slot = Some(script(dir, "cli", body));
    let req = RunTurnNonInteractiveRequest::new(frontend, dir.join("asp"), dir, "hi");
    (Harness::new(programs).unwrap(), req)
}

/// A whole turn of a stand-in CLI, events dropped.
async fn stand_in_turn(frontend: HarnessFrontend, body: &str) -> RunTurnNonInteractiveResponse {
    let dir = tempfile::tempdir().unwrap();
    let (h, req) = stand_in(dir.path(), frontend, body);
    h.run_turn_non_interactive(&req, &CancellationToken::new(), &mut |_| {})
        .await
        .unwrap()
}

#[tokio::test]
async fn cancelling_a_cli_turn_kills_it_and_keeps_the_observed_key() {
    let dir = tempfile::tempdir().unwrap();
    let (h, req) = stand_in(
        dir.path(),
        HarnessFrontend::AgentSdk,
        r#"echo '{"type":"system","subtype":"init","session_id":"sess-42","cwd":"/","model":"m"}'; sleep 30"#,
    );
    let cancel = CancellationToken::new();
    let c2 = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(500)).await;
        c2.cancel();
    });
    let start = Instant::now();
    let mut events = Vec::new();
    let r = h
        .run_turn_non_interactive(&req, &cancel, &mut |e| events.push(e))
        .await
        .unwrap();
    assert!(start.elapsed() < Duration::from_secs(10));
    assert_eq!(r.result.error.unwrap().code, HarnessErrorCode::Cancelled);
    assert_eq!(r.continuation.unwrap().key.as_deref(), Some("sess-42"));
    let last = events.last().unwrap();
    assert!(matches!(
        last.payload,
        Some(HarnessEvent::TurnCompleted { .. })
    ));
    assert_eq!(
        last.continuation.as_ref().unwrap().key.as_deref(),
        Some("sess-42")
    );
}

#[tokio::test]
async fn claude_is_error_wins_over_subtype_success() {
    let r = stand_in_turn(
        HarnessFrontend::ClaudeCode,
        r#"echo '{"type":"system","subtype":"init","session_id":"s1"}'
echo '{"type":"result","subtype":"success","is_error":true,"result":"Invalid API key","session_id":"s1"}'
exit 1"#,
    )
    .await;
    assert!(!r.result.success);
    let err = r.result.error.unwrap();
    assert_eq!(err.code, HarnessErrorCode::HarnessFailed);
    assert_eq!(err.message, "Invalid API key");
}

#[tokio::test]
async fn a_cli_dying_without_output_is_a_clear_failure() {
    let r = stand_in_turn(
        HarnessFrontend::CodexCli,
        "echo 'boom: config error' >&2; exit 2",
    )
    .await;
    let err = r.result.error.unwrap();
    assert_eq!(err.code, HarnessErrorCode::HarnessFailed);
    assert!(
        err.message.contains("boom: config error"),
        "{}",
        err.message
    );
}

#[tokio::test]
async fn codex_reconnect_errors_do_not_fail_a_completed_turn() {
    let r = stand_in_turn(
        HarnessFrontend::CodexCli,
        r#"echo '{"type":"thread.started","thread_id":"t-1"}'
echo '{"type":"turn.started"}'
echo '{"type":"error","message":"Reconnecting... 1/5"}'
echo '{"type":"item.completed","item":{"id":"i0","type":"agent_message","text":"fine"}}'
echo '{"type":"turn.completed","usage":{"input_tokens":3,"cached_input_tokens":0,"output_tokens":2}}'"#,
    )
    .await;
    assert!(r.result.success, "{:?}", r.result);
    assert_eq!(r.result.final_output.as_deref(), Some("fine"));
    assert_eq!(r.continuation.unwrap().key.as_deref(), Some("t-1"));
}

/// Attachments with a CLI frontend: text ones reach the CLI's prompt wrapped with their path,
/// before the prompt; an image is refused (the CLIs' prompts are text) before the CLI starts.
#[tokio::test]
async fn text_attachments_join_a_cli_prompt_and_images_are_refused_before_it_starts() {
    let dir = tempfile::tempdir().unwrap();
    let seen = dir.path().join("prompt.txt");
    let (h, mut req) = stand_in(
        dir.path(),
        HarnessFrontend::AgentSdk,
        &format!(
            r#"for a; do last="$a"; done; printf '%s' "$last" > '{}'
echo '{{"type":"result","subtype":"success","is_error":false,"result":"ok","session_id":"s1"}}'"#,
            seen.display()
        ),
    );
    std::fs::write(dir.path().join("notes.md"), "remember the milk").unwrap();
    req.attachments = vec!["notes.md".into()];
    let r = h
        .run_turn_non_interactive(&req, &CancellationToken::new(), &mut |_| {})
        .await
        .unwrap();
    assert!(r.result.success, "{:?}", r.result);
    assert_eq!(
        std::fs::read_to_string(&seen).unwrap(),
        "<attachment path=\"notes.md\">\nremember the milk\n</attachment>\n\nhi"
    );
    std::fs::remove_file(&seen).unwrap();
    std::fs::write(dir.path().join("shot.png"), b"\x89PNG\r\n\x1a\n\0\0").unwrap();
    req.attachments = vec!["shot.png".into()];
    let err = h
        .run_turn_non_interactive(&req, &CancellationToken::new(), &mut |_| {})
        .await
        .unwrap_err();
    assert_eq!(err.code(), HarnessErrorCode::InvalidRequest);
    assert!(err.to_string().contains("shot.png"), "{err}");
    assert!(!seen.exists(), "the CLI ran");
}
