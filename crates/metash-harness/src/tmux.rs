//! Opens an interactive spec in a new tmux window. Seed 003 leaves terminals to the control
//! plane; this is the control plane side for people running metash in a terminal.

use std::process::{Command, Stdio};

use metash_protocol::ProcessInvocationSpec;

use crate::error::{HarnessError, Result};

/// The tmux argv that opens `spec` in a new window: of the current session when `in_tmux`, else
/// of a detached session `session` (created if needed by the caller). argv is passed as separate
/// words, which tmux executes without a shell.
pub fn new_window_argv(
    spec: &ProcessInvocationSpec,
    window_name: &str,
    target_session: Option<&str>,
) -> Vec<String> {
    let mut a = vec![
        "tmux".to_string(),
        "new-window".to_string(),
        "-P".into(),
        "-F".into(),
        "#{session_name}:#{window_index}".into(),
    ];
    if let Some(s) = target_session {
        a.extend(["-t".to_string(), format!("{s}:")]);
    }
    a.extend([
        "-n".to_string(),
        window_name.to_string(),
        "-c".to_string(),
        spec.cwd.clone(),
    ]);
    for (k, v) in &spec.env {
        a.extend(["-e".to_string(), format!("{k}={v}")]);
    }
    a.extend(spec.argv.iter().cloned());
    a
}

/// Opens the spec in tmux and returns the `session:window` it runs in.
///
/// # Errors
/// `ProgramNotFound` without tmux; `HarnessFailed` when tmux refuses.
pub fn attach(spec: &ProcessInvocationSpec, window_name: &str) -> Result<String> {
    let in_tmux = std::env::var_os("TMUX").is_some();
    let session = "metash";
    if !in_tmux {
        let has = Command::new("tmux")
            .args(["has-session", "-t", session])
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map_err(|e| HarnessError::ProgramNotFound(format!("tmux: {e}")))?;
        if !has.success() {
            let ok = Command::new("tmux")
                .args(["new-session", "-d", "-s", session])
                .stdin(Stdio::null())
                .status()
                .map_err(|e| HarnessError::ProgramNotFound(format!("tmux: {e}")))?;
            if !ok.success() {
                return Err(HarnessError::HarnessFailed(
                    "tmux new-session failed".into(),
                ));
            }
        }
    }
    let argv = new_window_argv(spec, window_name, (!in_tmux).then_some(session));
    let out = Command::new(&argv[0])
        .args(&argv[1..])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| HarnessError::ProgramNotFound(format!("tmux: {e}")))?;
    if !out.status.success() {
        return Err(HarnessError::HarnessFailed(format!(
            "tmux new-window: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use metash_protocol::{HarnessFrontend, InteractionMode, IoMode, ProviderDomain};

    use super::*;

    #[test]
    fn the_window_gets_cwd_env_and_argv_as_separate_words() {
        let mut env = BTreeMap::new();
        env.insert("HOME".to_string(), "/asp/claude/home".to_string());
        let spec = ProcessInvocationSpec {
            provider: ProviderDomain::Anthropic,
            frontend: HarnessFrontend::ClaudeCode,
            argv: vec!["/opt/claude".into(), "--resume".into(), "k 1".into()],
            cwd: "/work".into(),
            env,
            interaction_mode: InteractionMode::Interactive,
            io_mode: IoMode::Pty,
            continuation: None,
            display_command: None,
        };
        let argv = new_window_argv(&spec, "agent", Some("metash"));
        let tail: Vec<&str> = argv.iter().skip(5).map(String::as_str).collect();
        assert_eq!(
            tail,
            [
                "-t",
                "metash:",
                "-n",
                "agent",
                "-c",
                "/work",
                "-e",
                "HOME=/asp/claude/home",
                "/opt/claude",
                "--resume",
                "k 1"
            ]
        );
    }
}
