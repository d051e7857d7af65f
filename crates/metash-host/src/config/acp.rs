//! `frontend = "acp"`: a role run by any Agent Client Protocol agent (docs/acp.md). The agent is
//! not one of seed 003's provider-typed frontends, so the role keeps a harness frontend for what
//! its model traffic needs (the key variable, the base-URL variable, how the credential proxy
//! sends the key): the one of its `provider` ([`wire_frontend`]). Everything that reads a role's
//! key, sign-in or proxy then works unchanged; [`Role::acp`] says the spawn speaks ACP.

use std::collections::BTreeMap;

use metash_protocol::{HarnessFrontend, ProviderDomain};
use serde::{Deserialize, Deserializer};

use super::Role;

/// The wire name.
pub const NAME: &str = "acp";

/// Every name `frontend` takes, for the error that lists them.
const NAMES: &[&str] = &[
    "agent-sdk",
    "pi-sdk",
    "claude-code",
    "codex-cli",
    "anthropic-api",
    "openai-responses",
    "openai-chat",
    NAME,
];

/// The harness frontend whose model facts an ACP agent of `provider` gets: Anthropic's
/// (`ANTHROPIC_API_KEY`, `ANTHROPIC_BASE_URL`, `x-api-key`, Claude sign-ins) as Claude Code's
/// SDK reads them, or OpenAI's (`OPENAI_API_KEY`, `OPENAI_BASE_URL`, bearer).
pub fn wire_frontend(provider: ProviderDomain) -> HarnessFrontend {
    match provider {
        ProviderDomain::Anthropic => HarnessFrontend::AgentSdk,
        ProviderDomain::Openai => HarnessFrontend::PiSdk,
    }
}

impl Role {
    /// The frontend as the user wrote it, for messages: `acp`, or the harness frontend's name.
    pub fn frontend_name(&self) -> &'static str {
        if self.acp {
            NAME
        } else {
            self.frontend.as_str()
        }
    }

    /// Whether the role's agent can ask metash before a tool use (`permissions = "ask"`):
    /// Claude Code's permission-prompt hook, or any ACP agent's `session/request_permission`.
    pub fn can_ask(&self) -> bool {
        self.acp || metash_harness::frontend::info(self.frontend).permission_prompt
    }
}

/// Reads a role's `frontend`: a harness frontend's wire name, or `acp` (read as Anthropic's wire
/// frontend until [`mark`] sets the role's own).
///
/// # Errors
/// An unknown name, listing the known ones.
pub(super) fn frontend<'de, D: Deserializer<'de>>(d: D) -> Result<HarnessFrontend, D::Error> {
    let name = String::deserialize(d)?;
    if name == NAME {
        return Ok(wire_frontend(ProviderDomain::Anthropic));
    }
    HarnessFrontend::parse(&name).ok_or_else(|| serde::de::Error::unknown_variant(&name, NAMES))
}

/// Flags the roles written `frontend = "acp"` and gives each the wire frontend of its
/// `provider`; refuses an ACP role without a command, and ACP settings on any other role.
///
/// # Errors
/// What is wrong, naming the role's section.
pub(super) fn mark(text: &str, roles: &mut BTreeMap<String, Role>) -> Result<(), String> {
    #[derive(Deserialize)]
    struct File {
        #[serde(default)]
        roles: BTreeMap<String, Named>,
    }
    #[derive(Deserialize)]
    struct Named {
        #[serde(default)]
        frontend: Option<String>,
    }
    if roles.is_empty() {
        return Ok(());
    }
    let names: File = toml::from_str(text).map_err(|e| e.message().to_string())?;
    for (name, role) in roles.iter_mut() {
        let written = names.roles.get(name).and_then(|n| n.frontend.as_deref());
        if written == Some(NAME) {
            let Some(program) = role.command.first() else {
                return Err(format!(
                    "[roles.{name}] frontend = \"acp\" needs command = [\"program\", \"arg\", …]"
                ));
            };
            if program.trim().is_empty() {
                return Err(format!(
                    "[roles.{name}] command starts with an empty program"
                ));
            }
            role.acp = true;
            role.frontend = wire_frontend(role.provider.unwrap_or(ProviderDomain::Anthropic));
        } else if !role.command.is_empty() || !role.env.is_empty() || role.provider.is_some() {
            return Err(format!(
                "[roles.{name}] command, env and provider are settings of frontend = \"acp\""
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::path::Path;

    use super::*;
    use crate::config::HostConfig;

    #[test]
    fn an_acp_role_parses_with_its_command_env_and_provider() {
        let p = Path::new(".meta/config.toml");
        let c = HostConfig::parse(
            "[roles.a]\nfrontend = \"acp\"\ncommand = [\"claude-code-acp\", \"--x\"]\n\
             env = { A = \"1\" }\npermissions = \"ask\"\n\
             [roles.b]\nfrontend = \"acp\"\ncommand = [\"codex-acp\"]\nprovider = \"openai\"\n\
             permissions = \"ask\"\n[roles.c]\nfrontend = \"agent-sdk\"\n",
            p,
        )
        .unwrap();
        let a = &c.roles["a"];
        assert!(a.acp && a.runs_cli());
        assert_eq!(a.frontend, HarnessFrontend::AgentSdk);
        assert_eq!(a.command, ["claude-code-acp", "--x"]);
        assert_eq!(a.env["A"], "1");
        let b = &c.roles["b"];
        assert!(b.acp);
        assert_eq!(b.frontend, HarnessFrontend::PiSdk);
        assert!(!c.roles["c"].acp);
    }

    #[test]
    fn acp_settings_are_checked() {
        let p = Path::new(".meta/config.toml");
        let err = |t: &str| HostConfig::parse(t, p).unwrap_err().to_string();
        let e = err("[roles.a]\nfrontend = \"acp\"\n");
        assert!(
            e.contains("[roles.a]") && e.contains("needs command"),
            "{e}"
        );
        let e = err("[roles.a]\nfrontend = \"agent-sdk\"\ncommand = [\"x\"]\n");
        assert!(e.contains("settings of frontend = \"acp\""), "{e}");
        let e = err("[roles.a]\nfrontend = \"telepathy\"\n");
        assert!(e.contains("config.toml:2") && e.contains("acp"), "{e}");
        let e = err("[roles.a]\nfrontend = \"acp\"\ncommand = [\"x\"]\nprovider = \"mistral\"\n");
        assert!(e.contains("config.toml:4"), "{e}");
    }
}
