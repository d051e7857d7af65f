//! `metash sandbox --role R -- CMD…`: any command under a role's sandbox, exactly as the role's
//! CLI runs in a spawn (same consent, same confinement, same credential proxy). From a terminal the
//! command gets a pty of its own that metash relays, never the user's terminal; without one it has
//! no terminal at all. `metash attach --role R` opens interactive CLI sessions through it.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::Duration;

use metash_protocol::LogKind;

use crate::config::Role;
use crate::error::{HostError, Result};
use crate::host::Host;
use crate::spawn::confine::native_consent;
pub use crate::spawn::confine::RoleConfiner;
use crate::spawn::key_proxy;
use crate::spawn::tape::TurnTape;

/// A command ready to run confined, and everything that must outlive it.
pub struct Sandboxed {
    command: Command,
    /// The report of what the sandbox allows (also in the log as `agent_started`).
    pub report: serde_json::Value,
    _confinement: metash_runtime::native::confine::Confinement,
    /// From a terminal: the host's side of the program's own pty.
    relay: Option<Relay>,
    proxy: Option<metash_runtime::credential::CredentialProxy>,
    /// The command's model exchanges (docs/replay.md), saved when it ended and the proxy stopped:
    /// a sandboxed CLI is recorded as a spawn's is.
    tape: Option<(TurnTape, metash_store::Store)>,
    _dir: tempfile::TempDir,
}

impl Sandboxed {
    /// Runs it to the end: on its own pty relayed to the caller's terminal, or without a terminal,
    /// with the caller's stdin and whichever of stdout and stderr is the caller's terminal copied
    /// through a pipe (a terminal's descriptor would let it read what the user types).
    ///
    /// # Errors
    /// The program could not be started, or the relay failed.
    pub fn status(mut self) -> Result<ExitStatus> {
        let run = |e: std::io::Error| HostError::Other(format!("running the command: {e}"));
        let status = match self.relay.take() {
            Some(relay) => self
                .command
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .and_then(|mut child| relay_run(relay, &mut child)),
            None => headless(&mut self.command),
        };
        // Stopping the proxy delivers every exchange it recorded; then the tape is whole.
        drop(self.proxy.take());
        if let Some((tape, store)) = self.tape.take() {
            tape.save_in(&store);
        }
        status.map_err(run)
    }
}

/// The random part of the sandbox's own directory (`metash-sandbox-XXXXXX`): unique while it
/// runs, so it names the run's tape.
fn sandbox_id(dir: &Path) -> String {
    dir.file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix("metash-sandbox-"))
        .unwrap_or("run")
        .to_string()
}

#[cfg(target_os = "linux")]
type Relay = metash_runtime::native::tty::Relay;
#[cfg(not(target_os = "linux"))]
type Relay = std::convert::Infallible;

#[cfg(target_os = "linux")]
fn relay_run(relay: Relay, child: &mut std::process::Child) -> std::io::Result<ExitStatus> {
    relay.run(child)
}

#[cfg(not(target_os = "linux"))]
fn relay_run(relay: Relay, _: &mut std::process::Child) -> std::io::Result<ExitStatus> {
    match relay {}
}

/// From a terminal (stdin is one): the program's own pty, relayed (for `metash sandbox` and an
/// interactive session's launcher). Elsewhere no sandbox runs.
pub(crate) fn interactive(
    confinement: &mut metash_runtime::native::confine::Confinement,
) -> Result<Option<Relay>> {
    use std::io::IsTerminal;
    if !std::io::stdin().is_terminal() {
        return Ok(None);
    }
    #[cfg(target_os = "linux")]
    return confinement
        .relay_terminal()
        .map(Some)
        .map_err(|e| HostError::Other(e.to_string()));
    #[cfg(not(target_os = "linux"))]
    {
        let _ = confinement;
        Ok(None)
    }
}

/// Runs `command` with no terminal: stdout and stderr that are the caller's terminal go through
/// pipes copied here.
fn headless(command: &mut Command) -> std::io::Result<ExitStatus> {
    use std::io::IsTerminal;
    if std::io::stdout().is_terminal() {
        command.stdout(Stdio::piped());
    }
    if std::io::stderr().is_terminal() {
        command.stderr(Stdio::piped());
    }
    let mut child = command.spawn()?;
    let copies = [
        child.stdout.take().map(|o| copy_to(o, std::io::stdout())),
        child.stderr.take().map(|e| copy_to(e, std::io::stderr())),
    ];
    let status = child.wait()?;
    for c in copies.into_iter().flatten() {
        let _ = c.join();
    }
    Ok(status)
}

/// A thread copying `from` to `to` until the end.
fn copy_to(
    mut from: impl std::io::Read + Send + 'static,
    mut to: impl std::io::Write + Send + 'static,
) -> std::thread::JoinHandle<std::io::Result<u64>> {
    std::thread::spawn(move || std::io::copy(&mut from, &mut to))
}

impl Host {
    /// A role of `.meta/config.toml`, or an error naming the ones there are.
    fn configured_role(&self, name: &str) -> Result<&Role> {
        self.config().roles.get(name).ok_or_else(|| {
            HostError::Config(format!(
                "no role `{name}` in .meta/config.toml (known: {})",
                self.config()
                    .roles
                    .keys()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })
    }

    /// How the sandboxed command reaches the role's model: through a credential proxy when the
    /// role has a key (its variables get the placeholder, the base URL variables the proxy), else
    /// straight to the role's `base_url`. The proxy and the one TCP port the sandbox allows.
    fn model_route(
        &self,
        role_name: &str,
        role: &Role,
        spec_env: &mut std::collections::BTreeMap<String, String>,
        tape: Option<&TurnTape>,
    ) -> Result<(Option<key_proxy::Started>, Option<u16>)> {
        let hooks = key_proxy::Hooks {
            tap: None,
            recorder: tape.map(TurnTape::recorder),
        };
        let proxy = key_proxy::start_recorded(self, role_name, role, hooks)?;
        let port = match &proxy {
            Some(started) => {
                for v in &started.placeholders {
                    spec_env.insert(v.clone(), key_proxy::PLACEHOLDER.to_string());
                }
                let base = started.endpoint.base_url.clone();
                spec_env.insert("METASH_MODEL_BASE_URL".into(), base.clone());
                let var = metash_harness::frontend::info(role.frontend).base_url_env;
                spec_env.insert(var.into(), base);
                Some(started.proxy.addr().port())
            }
            None => role
                .base_url
                .as_deref()
                .and_then(crate::spawn::confine::url_port),
        };
        Ok((proxy, port))
    }

    /// Prepares `argv` to run under the sandbox of the role `role`, in `workdir`, with `env` added
    /// to the allowlisted environment. The role's model key stays here: the command gets the
    /// placeholder and, in `METASH_MODEL_BASE_URL` and the provider's usual base-URL variable,
    /// the credential proxy's address.
    ///
    /// # Errors
    /// No such role, consent refused, or the sandbox cannot be prepared (fail closed).
    pub fn sandboxed(
        &self,
        role_name: &str,
        workdir: &Path,
        argv: &[String],
        env: &[(String, String)],
    ) -> Result<Sandboxed> {
        let Some((argv0, rest)) = argv.split_first() else {
            return Err(HostError::Config("no command to run in the sandbox".into()));
        };
        let role = self.configured_role(role_name)?;
        native_consent(self, role_name)?;
        let dir = tempfile::Builder::new()
            .prefix("metash-sandbox-")
            .tempdir_in(self.spawn_root()?)
            .map_err(|e| HostError::Other(format!("creating the sandbox directory: {e}")))?;
        let mut spec_env: std::collections::BTreeMap<String, String> =
            env.iter().cloned().collect();
        // Tagged `sandbox-…` where a session's tape carries the session's id: no task to name.
        let tape = TurnTape::for_session(
            self,
            role_name,
            role.frontend.as_str(),
            &format!("sandbox-{}", sandbox_id(dir.path())),
        );
        let (proxy, port) = self.model_route(role_name, role, &mut spec_env, tape.as_ref())?;
        let workdir = self.check_workdir(workdir)?;
        let mut confiner = RoleConfiner::new(
            role_name,
            role,
            dir.path(),
            Duration::from_secs(24 * 3600),
            |k| self.env_var(k),
            self.event_sink(),
        );
        confiner.fence.hidden = self.hidden_dirs();
        confiner.fence.protected = self.protected_dirs();
        confiner.project = Some(self.workspace());
        confiner.fence.connect_ports = port.into_iter().collect();
        let mut confinement = confiner
            .prepare(argv0, &workdir, &spec_env)
            .map_err(HostError::Other)?;
        let relay = interactive(&mut confinement)?;
        let program = confinement.report["program"]
            .as_str()
            .map_or_else(|| PathBuf::from(argv0), PathBuf::from);
        let mut command = Command::new(program);
        command.args(rest).current_dir(&workdir);
        confinement.apply(&mut command);
        let report = confinement.report.clone();
        self.event_sink().record(
            LogKind::AgentStarted,
            Some(role_name),
            serde_json::json!({"sandbox_command": argv, "report": report}),
        );
        Ok(Sandboxed {
            command,
            report,
            _confinement: confinement,
            relay,
            proxy: proxy.map(|s| s.proxy),
            tape: tape.map(|t| (t, self.store().clone())),
            _dir: dir,
        })
    }
}
