//! `metash sandbox --role R -- CMD…`: any command under a role's sandbox, exactly as the role's
//! CLI runs in a spawn (same consent, same confinement, same credential proxy), with the terminal
//! inherited. `metash attach --role R` opens interactive CLI sessions through it.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::Duration;

use metash_protocol::LogKind;

use crate::config::Role;
use crate::error::{HostError, Result};
use crate::host::Host;
use crate::spawn::confine::native_consent;
pub use crate::spawn::confine::RoleConfiner;
use crate::spawn::key_proxy;

/// A command ready to run confined, and everything that must outlive it.
pub struct Sandboxed {
    command: Command,
    /// The report of what the sandbox allows (also in the log as `agent_started`).
    pub report: serde_json::Value,
    _confinement: metash_runtime::native::confine::Confinement,
    _proxy: Option<metash_runtime::credential::CredentialProxy>,
    _dir: tempfile::TempDir,
}

impl Sandboxed {
    /// Runs it to the end with the caller's stdio.
    ///
    /// # Errors
    /// The program could not be started.
    pub fn status(mut self) -> Result<ExitStatus> {
        self.command
            .status()
            .map_err(|e| HostError::Other(format!("running the command: {e}")))
    }
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
    ) -> Result<(Option<key_proxy::Started>, Option<u16>)> {
        let proxy = key_proxy::start(self, role_name, role, None)?;
        let port = match &proxy {
            Some((p, endpoint, vars)) => {
                for v in vars {
                    spec_env.insert(v.clone(), key_proxy::PLACEHOLDER.to_string());
                }
                spec_env.insert("METASH_MODEL_BASE_URL".into(), endpoint.base_url.clone());
                let var = metash_harness::frontend::info(role.frontend).base_url_env;
                spec_env.insert(var.into(), endpoint.base_url.clone());
                Some(p.addr().port())
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
        if let Some(refused) = native_consent(self, role_name)? {
            return Err(HostError::Other(refused.data));
        }
        let dir = tempfile::Builder::new()
            .prefix("metash-sandbox-")
            .tempdir_in(self.spawn_root()?)
            .map_err(|e| HostError::Other(format!("creating the sandbox directory: {e}")))?;
        let mut spec_env: std::collections::BTreeMap<String, String> =
            env.iter().cloned().collect();
        let (proxy, port) = self.model_route(role_name, role, &mut spec_env)?;
        let workdir = std::path::absolute(workdir)
            .map_err(|e| HostError::Other(format!("{}: {e}", workdir.display())))?;
        let mut confiner = RoleConfiner::new(
            role_name,
            role,
            dir.path(),
            Duration::from_secs(24 * 3600),
            |k| self.env_var(k),
            self.event_sink(),
        );
        confiner.fence.hidden = self.hidden_dirs();
        confiner.fence.connect_ports = port.into_iter().collect();
        let confinement = confiner
            .prepare(argv0, &workdir, &spec_env)
            .map_err(HostError::Other)?;
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
            _proxy: proxy.map(|(p, ..)| p),
            _dir: dir,
        })
    }
}
