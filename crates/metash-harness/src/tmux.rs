//! Opens an interactive spec in a new tmux window. Seed 003 leaves terminals to the control
//! plane; this is the control plane side for people running metash in a terminal.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use metash_protocol::ProcessInvocationSpec;

use crate::error::{HarnessError, Result};

/// The words after `tmux` that open `argv` in a new window named `window_name`, in `cwd` with
/// `env`: of the current session when `target_session` is `None`. argv is passed as separate
/// words, which tmux executes without a shell. tmux prints `session:index @id pane_pid`.
pub fn new_window_args(
    argv: &[String],
    cwd: &str,
    env: &[(String, String)],
    window_name: &str,
    target_session: Option<&str>,
) -> Vec<String> {
    let mut a = vec![
        "new-window".to_string(),
        "-P".into(),
        "-F".into(),
        "#{session_name}:#{window_index} #{window_id} #{pane_pid}".into(),
    ];
    if let Some(s) = target_session {
        a.extend(["-t".to_string(), format!("{s}:")]);
    }
    a.extend([
        "-n".to_string(),
        window_name.to_string(),
        "-c".into(),
        cwd.into(),
    ]);
    for (k, v) in env {
        a.extend(["-e".to_string(), format!("{k}={v}")]);
    }
    a.extend(argv.iter().cloned());
    a
}

/// Opens the spec in tmux and returns the `session:window` it runs in.
///
/// # Errors
/// `ProgramNotFound` without tmux; `HarnessFailed` when tmux refuses.
pub fn attach(spec: &ProcessInvocationSpec, window_name: &str) -> Result<String> {
    let env: Vec<(String, String)> = spec.env.clone().into_iter().collect();
    Ok(Tmux::from_env()
        .open_window(&spec.argv, &spec.cwd, &env, window_name)?
        .target)
}

/// The detached tmux session metash opens windows in when the caller is not inside tmux.
pub const SESSION: &str = "metash";

/// The variable naming a tmux server socket of metash's own (`tmux -S`): tests and people who
/// keep metash's sessions off their default server set it.
pub const SOCKET_VAR: &str = "METASH_TMUX_SOCKET";

/// A tmux server: the user's default one, or the one at `socket`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tmux {
    pub socket: Option<PathBuf>,
}

/// A window metash opened: where it is and the process it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Window {
    /// `session:index`, as a person types it after `tmux attach -t`.
    pub target: String,
    /// tmux's window id (`@N`), stable while the server lives.
    pub window_id: String,
    /// The pid of the program in its pane.
    pub pane_pid: u32,
}

impl Tmux {
    /// The server [`SOCKET_VAR`] names, else the default one.
    pub fn from_env() -> Self {
        Self {
            socket: std::env::var_os(SOCKET_VAR)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from),
        }
    }

    /// `tmux [-S socket] ARGS…`, stdin closed.
    pub fn command<I, S>(&self, args: I) -> Command
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        let mut c = Command::new("tmux");
        if let Some(s) = &self.socket {
            c.arg("-S").arg(s);
        }
        c.args(args).stdin(Stdio::null());
        c
    }

    /// The words after `tmux` that attach the caller's terminal to `target` (from inside tmux on
    /// the same server: switch to it instead of nesting).
    pub fn attach_args(&self, target: &str) -> Vec<String> {
        let inside = self.socket.is_none() && std::env::var_os("TMUX").is_some();
        let verb = if inside {
            "switch-client"
        } else {
            "attach-session"
        };
        vec![verb.to_string(), "-t".to_string(), target.to_string()]
    }

    /// Whether the caller's own tmux session gets the window (it runs inside tmux, on this
    /// server).
    fn in_current_session(&self) -> bool {
        self.socket.is_none() && std::env::var_os("TMUX").is_some()
    }

    /// Runs `args` and returns stdout, or the error tmux printed.
    fn output(&self, args: &[String]) -> Result<String> {
        let out = self
            .command(args)
            .output()
            .map_err(|e| HarnessError::ProgramNotFound(format!("tmux: {e}")))?;
        if !out.status.success() {
            return Err(HarnessError::HarnessFailed(format!(
                "tmux {}: {}",
                args.first().map(String::as_str).unwrap_or_default(),
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    /// Makes sure the detached session [`SESSION`] exists (outside tmux).
    fn ensure_session(&self, cwd: &str) -> Result<()> {
        let has = self
            .command(["has-session", "-t", SESSION])
            .stderr(Stdio::null())
            .status()
            .map_err(|e| HarnessError::ProgramNotFound(format!("tmux: {e}")))?;
        if has.success() {
            return Ok(());
        }
        let args = ["new-session", "-d", "-s", SESSION, "-c", cwd];
        // The server keeps the environment it starts with and gives it to every window: it
        // gets no credential of the caller's.
        let mut c = self.command(args);
        for (k, _) in std::env::vars_os() {
            if k.to_str().is_some_and(looks_secret) {
                c.env_remove(&k);
            }
        }
        let out = c
            .output()
            .map_err(|e| HarnessError::ProgramNotFound(format!("tmux: {e}")))?;
        if !out.status.success() {
            return Err(HarnessError::HarnessFailed(format!(
                "tmux new-session: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(())
    }

    /// Opens `argv` (executed by tmux as separate words, no shell) in a new window in `cwd` with
    /// `env` set for it: in the caller's session when it runs inside tmux, else in the detached
    /// session [`SESSION`], created if needed.
    ///
    /// # Errors
    /// `ProgramNotFound` without tmux; `HarnessFailed` when tmux refuses or prints something
    /// that is not a window.
    pub fn open_window(
        &self,
        argv: &[String],
        cwd: &str,
        env: &[(String, String)],
        window_name: &str,
    ) -> Result<Window> {
        let target_session = if self.in_current_session() {
            None
        } else {
            self.ensure_session(cwd)?;
            Some(SESSION)
        };
        let a = new_window_args(argv, cwd, env, window_name, target_session);
        let printed = self.output(&a)?;
        parse_window(&printed).ok_or_else(|| {
            HarnessError::HarnessFailed(format!("tmux new-window printed {printed:?}"))
        })
    }

    /// The pid running in the window `window_id`'s pane, or `None` when the server or the window
    /// is gone.
    pub fn pane_pid(&self, window_id: &str) -> Option<u32> {
        let out = self
            .command(["display-message", "-p", "-t", window_id, "#{pane_pid}"])
            .stderr(Stdio::null())
            .output()
            .ok()?;
        if !out.status.success() {
            return None;
        }
        String::from_utf8_lossy(&out.stdout).trim().parse().ok()
    }

    /// Closes the window (its programs get SIGHUP). A window already gone is not an error.
    ///
    /// # Errors
    /// `ProgramNotFound` without tmux.
    pub fn kill_window(&self, window_id: &str) -> Result<()> {
        self.command(["kill-window", "-t", window_id])
            .stderr(Stdio::null())
            .status()
            .map_err(|e| HarnessError::ProgramNotFound(format!("tmux: {e}")))?;
        Ok(())
    }
}

/// A variable that holds a credential by its name (`*_KEY`, `*_TOKEN`, `*_SECRET`,
/// `*_PASSWORD`).
pub fn looks_secret(name: &str) -> bool {
    ["_KEY", "_TOKEN", "_SECRET", "_PASSWORD"]
        .iter()
        .any(|s| name.ends_with(s))
}

/// `session:index @id pid` as `new-window -P -F` prints it.
fn parse_window(printed: &str) -> Option<Window> {
    let mut words = printed.split_whitespace();
    let target = words.next()?.to_string();
    let window_id = words.next().filter(|w| w.starts_with('@'))?.to_string();
    let pane_pid = words.next()?.parse().ok()?;
    Some(Window {
        target,
        window_id,
        pane_pid,
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use metash_protocol::{HarnessFrontend, InteractionMode, IoMode, ProviderDomain};

    use super::*;

    #[test]
    fn what_new_window_prints_is_read_back() {
        assert_eq!(
            parse_window("metash:3 @7 4242"),
            Some(Window {
                target: "metash:3".into(),
                window_id: "@7".into(),
                pane_pid: 4242
            })
        );
        assert_eq!(parse_window("metash:3"), None);
        assert_eq!(parse_window("metash:3 7 4242"), None);
        let t = Tmux {
            socket: Some("/s".into()),
        };
        assert_eq!(t.attach_args("m:1"), ["attach-session", "-t", "m:1"]);
        let args: Vec<String> = t
            .command(["ls"])
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert_eq!(args, ["-S", "/s", "ls"]);
    }

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
        let env: Vec<(String, String)> = spec.env.clone().into_iter().collect();
        let argv = new_window_args(&spec.argv, &spec.cwd, &env, "agent", Some("metash"));
        let tail: Vec<&str> = argv.iter().skip(4).map(String::as_str).collect();
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
