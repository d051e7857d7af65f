//! How a role reaches its model: its key, or the user's subscription sign-in (`[roles.X] auth`),
//! resolved against the environment. Kept apart from the file's format in `config.rs`.

use metash_protocol::HarnessFrontend;
use metash_runtime::credential::signin::{self, SignIn, SignInCli};

use super::{Role, RoleAuth};

/// What a role reaches its model with, resolved against the environment ([`Role::access`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Access {
    /// Nothing to add (a local server without a key, or a CLI with neither key nor sign-in).
    None,
    /// The key in this variable (which may be unset: [`crate::Host::preflight_role`] says so).
    Key(String),
    /// The user's subscription sign-in (never holds the token itself).
    SignIn(SignIn),
}

impl Role {
    /// Whose subscription sign-in this role's frontend can use: Claude Code (`agent-sdk`,
    /// `claude-code`) and Codex (`codex-cli`).
    pub fn sign_in_cli(&self) -> Option<SignInCli> {
        match self.frontend {
            HarnessFrontend::AgentSdk | HarnessFrontend::ClaudeCode => Some(SignInCli::Claude),
            HarnessFrontend::CodexCli => Some(SignInCli::Codex),
            _ => None,
        }
    }

    /// What the role reaches its model with: `auth`, or when absent the key if its variable is
    /// set, else a sign-in found for the frontend, else the key (unset) or nothing.
    ///
    /// # Errors
    /// `auth = "subscription"` on a frontend without sign-ins, or with none found; a sign-in
    /// file that exists but cannot be used.
    pub fn access(
        &self,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> std::result::Result<Access, String> {
        let cli = self.sign_in_cli();
        // A sign-in capable CLI reads its provider's usual key when the role names none.
        let key_var = self.key_env().or_else(|| {
            cli.map(|_| {
                metash_harness::frontend::info(self.frontend)
                    .key_env
                    .to_string()
            })
        });
        let key_set = key_var
            .as_deref()
            .is_some_and(|v| env(v).is_some_and(|k| !k.is_empty()));
        let found = || {
            cli.map(|c| signin::detect(c, env))
                .transpose()
                .map(Option::flatten)
        };
        match self.auth {
            Some(RoleAuth::Key) => Ok(key_var.map_or(Access::None, Access::Key)),
            Some(RoleAuth::Subscription) => {
                let Some(cli) = cli else {
                    return Err(format!(
                        "auth = \"subscription\" needs Claude Code (agent-sdk, claude-code) or \
                         Codex (codex-cli), not {}",
                        self.frontend.as_str()
                    ));
                };
                match found().map_err(|e| e.to_string())? {
                    Some(s) => Ok(Access::SignIn(s)),
                    None => Err(format!("auth = \"subscription\" but {}", no_sign_in(cli))),
                }
            }
            None if key_set => Ok(key_var.map_or(Access::None, Access::Key)),
            None => match found().map_err(|e| e.to_string())? {
                Some(s) => Ok(Access::SignIn(s)),
                None if self.key_env().is_some() => Ok(key_var.map_or(Access::None, Access::Key)),
                None => Ok(Access::None),
            },
        }
    }
}

/// What a person does to sign `cli` in.
pub fn no_sign_in(cli: SignInCli) -> &'static str {
    match cli {
        SignInCli::Claude => {
            "Claude Code is not signed in: run `claude login` (Linux keeps the login in \
             ~/.claude/.credentials.json) or `claude setup-token` and export CLAUDE_CODE_OAUTH_TOKEN"
        }
        SignInCli::Codex => {
            "Codex is not signed in with ChatGPT: run `codex login` (kept in ~/.codex/auth.json)"
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::config::HostConfig;

    fn role(toml: &str) -> Role {
        let c = HostConfig::parse(toml, std::path::Path::new("config.toml")).unwrap();
        c.roles["r"].clone()
    }

    #[test]
    fn the_key_wins_when_set_else_a_sign_in_else_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().to_string_lossy().into_owned();
        let env = |vars: &'static [(&'static str, &'static str)]| {
            let home = home.clone();
            move |k: &str| -> Option<String> {
                if k == "HOME" {
                    return Some(home.clone());
                }
                vars.iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        let sdk = role("[roles.r]\nfrontend = \"agent-sdk\"\n");
        let both = env(&[("ANTHROPIC_API_KEY", "k"), ("CLAUDE_CODE_OAUTH_TOKEN", "t")]);
        assert_eq!(
            sdk.access(&both),
            Ok(Access::Key("ANTHROPIC_API_KEY".into()))
        );
        let token = env(&[("CLAUDE_CODE_OAUTH_TOKEN", "t")]);
        assert!(matches!(sdk.access(&token), Ok(Access::SignIn(s)) if s.path.is_none()));
        let none = env(&[]);
        assert_eq!(
            sdk.access(&none),
            Ok(Access::Key("ANTHROPIC_API_KEY".into()))
        );
        // claude-code names no key of its own: the provider's usual variable is the key's.
        let cli = role("[roles.r]\nfrontend = \"claude-code\"\n");
        assert_eq!(cli.access(&none), Ok(Access::None));
        let key = env(&[("ANTHROPIC_API_KEY", "k")]);
        assert_eq!(
            cli.access(&key),
            Ok(Access::Key("ANTHROPIC_API_KEY".into()))
        );
        // Explicit choices.
        let sub = role("[roles.r]\nfrontend = \"agent-sdk\"\nauth = \"subscription\"\n");
        assert!(matches!(sub.access(&both), Ok(Access::SignIn(_))));
        assert!(sub.access(&none).unwrap_err().contains("claude login"));
        let k = role("[roles.r]\nfrontend = \"agent-sdk\"\nauth = \"key\"\n");
        assert_eq!(
            k.access(&token),
            Ok(Access::Key("ANTHROPIC_API_KEY".into()))
        );
        let codex = role("[roles.r]\nfrontend = \"codex-cli\"\nauth = \"subscription\"\n");
        assert!(codex.access(&none).unwrap_err().contains("codex login"));
        let pi = role("[roles.r]\nfrontend = \"pi-sdk\"\n");
        assert_eq!(pi.sign_in_cli(), None);
    }
}
