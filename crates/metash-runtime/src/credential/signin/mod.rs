//! Subscription sign-ins as credential sources: the way most people run Claude Code (a Claude
//! Pro/Max plan: `claude login`, or `claude setup-token` giving `CLAUDE_CODE_OAUTH_TOKEN`) and
//! Codex (a ChatGPT plan: `codex login`), with the same guarantee as a model key. metash reads the
//! sign-in outside the sandbox; the CLI inside gets a placeholder in the form it expects; the
//! credential proxy adds the real token, and renews it when it expires as the CLI itself would
//! (writing the renewed tokens back to the user's file, atomically and under the CLI's own lock),
//! only on requests to the provider's endpoint.
//!
//! What each sign-in looks like (checked against Claude Code 2.1 and Codex 0.169):
//!
//! | kind | where | on the wire |
//! |---|---|---|
//! | [`SignInKind::ClaudeOauthToken`] | `CLAUDE_CODE_OAUTH_TOKEN` | `Authorization: Bearer`, `anthropic-beta: oauth-2025-04-20` (the CLI sends it) |
//! | [`SignInKind::ClaudeLogin`] | `$CLAUDE_CONFIG_DIR/.credentials.json` (`~/.claude`), `claudeAiOauth` | as above; renewed at Anthropic's token endpoint 5 minutes before `expiresAt` |
//! | [`SignInKind::CodexLogin`] | `$CODEX_HOME/auth.json` (`~/.codex`), `tokens` | `Authorization: Bearer`, `chatgpt-account-id`; renewed at auth.openai.com when the access token's `exp` is near (or `last_refresh` is 8 days old) |
//!
//! On macOS `claude login` keeps its tokens in the keychain, and Codex may be configured to use
//! the keyring (`cli_auth_credentials_store`): neither is read here (use `CLAUDE_CODE_OAUTH_TOKEN`
//! from `claude setup-token`, or the file store).
//!
//! The token endpoints can be pointed elsewhere for tests: [`CLAUDE_TOKEN_URL_ENV`] and Codex's own
//! [`CODEX_TOKEN_URL_ENV`] (an `https` URL, or `http` on loopback).

mod claude;
mod codex;
mod common;

use std::path::PathBuf;

use super::route::AuthStyle;
use super::secret::{CredentialSource, Grant, GrantFuture, Secret, SourceError};

/// Replaces Anthropic's OAuth token endpoint (`https://platform.claude.com/v1/oauth/token`), for
/// tests against a loopback server.
pub const CLAUDE_TOKEN_URL_ENV: &str = "METASH_CLAUDE_OAUTH_TOKEN_URL";
/// Replaces OpenAI's (`https://auth.openai.com/oauth/token`): Codex's own override variable.
pub const CODEX_TOKEN_URL_ENV: &str = "CODEX_REFRESH_TOKEN_URL_OVERRIDE";
/// Where Claude Code reads a long-lived subscription token (`claude setup-token`).
pub const CLAUDE_TOKEN_ENV: &str = "CLAUDE_CODE_OAUTH_TOKEN";

/// How a caller's environment is read (the host's extra variables first, then the process's).
pub type Env<'a> = &'a dyn Fn(&str) -> Option<String>;

/// The CLIs whose subscription sign-ins metash stands in for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignInCli {
    Claude,
    Codex,
}

/// Which sign-in was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignInKind {
    /// `CLAUDE_CODE_OAUTH_TOKEN` (from `claude setup-token`): a bearer token, never renewed here.
    ClaudeOauthToken,
    /// `claude login`'s credentials file: a bearer token, renewed with its refresh token.
    ClaudeLogin,
    /// `codex login` in ChatGPT mode: a bearer token and the account id, renewed likewise.
    CodexLogin,
}

/// A sign-in found in the environment or the user's files. Holds no token: the token is read
/// again when its source is made (and from the file at every renewal).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignIn {
    pub kind: SignInKind,
    /// The file it lives in (`None`: the variable).
    pub path: Option<PathBuf>,
    /// The plan as the sign-in names it (`max`, `pro`, `plus`...): not a secret.
    pub plan: Option<String>,
}

/// Why a sign-in cannot be used. Never holds a token.
#[derive(Debug, thiserror::Error)]
pub enum SignInError {
    #[error("{}: {reason}", path.display())]
    File { path: PathBuf, reason: String },
    #[error("{var}: {reason}")]
    Setting { var: &'static str, reason: String },
    /// A [`SignIn`] not made by [`detect`] (a login kind without its file).
    #[error("{0}")]
    Invalid(&'static str),
}

impl SignIn {
    /// One line for a person: where the sign-in is and its plan.
    pub fn describe(&self) -> String {
        let what = match (self.kind, &self.path) {
            (SignInKind::ClaudeOauthToken, _) => format!("{CLAUDE_TOKEN_ENV} (claude setup-token)"),
            (SignInKind::ClaudeLogin, Some(p)) => format!("claude login ({})", p.display()),
            (SignInKind::CodexLogin, Some(p)) => format!("codex login ({})", p.display()),
            (_, None) => "a sign-in".to_string(),
        };
        match &self.plan {
            Some(plan) => format!("{what}, {plan} plan"),
            None => what,
        }
    }

    /// How the token travels (always a bearer token).
    pub fn auth_style(&self) -> AuthStyle {
        AuthStyle::Bearer
    }

    /// The provider's own endpoint for this sign-in, as the route's upstream (Codex's ChatGPT
    /// backend is not the API the key mode uses).
    pub fn default_upstream(&self) -> &'static str {
        match self.kind {
            SignInKind::ClaudeOauthToken | SignInKind::ClaudeLogin => "https://api.anthropic.com",
            SignInKind::CodexLogin => "https://chatgpt.com/backend-api/codex",
        }
    }

    /// The proxy's source for `route`: the token read now, renewed when due.
    ///
    /// # Errors
    /// The variable is gone, the file is unreadable, a token endpoint override is unusable.
    pub fn source(&self, route: &str, env: Env<'_>) -> Result<SignInSource, SignInError> {
        let inner = match (self.kind, &self.path) {
            (SignInKind::ClaudeOauthToken, _) => {
                let token = env(CLAUDE_TOKEN_ENV)
                    .filter(|t| !t.trim().is_empty())
                    .ok_or(SignInError::Setting {
                        var: CLAUDE_TOKEN_ENV,
                        reason: "is no longer set".into(),
                    })?;
                Inner::Static(Secret::new(token.trim().to_string()))
            }
            (SignInKind::ClaudeLogin, Some(path)) => Inner::Claude(claude::ClaudeLogin::open(
                path.clone(),
                common::token_url(env, CLAUDE_TOKEN_URL_ENV, claude::TOKEN_URL)?,
            )?),
            (SignInKind::CodexLogin, Some(path)) => Inner::Codex(codex::CodexLogin::open(
                path.clone(),
                common::token_url(env, CODEX_TOKEN_URL_ENV, codex::TOKEN_URL)?,
            )?),
            (_, None) => return Err(SignInError::Invalid("a login sign-in without its file")),
        };
        Ok(SignInSource {
            route: route.to_string(),
            inner,
        })
    }
}

/// Finds `cli`'s subscription sign-in: for Claude Code `CLAUDE_CODE_OAUTH_TOKEN`, else `claude
/// login`'s file; for Codex `codex login`'s `auth.json` in ChatGPT mode. `Ok(None)`: not signed in.
///
/// # Errors
/// A credentials file that exists but cannot be used (unreadable, not JSON, no token).
pub fn detect(cli: SignInCli, env: Env<'_>) -> Result<Option<SignIn>, SignInError> {
    match cli {
        SignInCli::Claude => {
            if env(CLAUDE_TOKEN_ENV).is_some_and(|t| !t.trim().is_empty()) {
                return Ok(Some(SignIn {
                    kind: SignInKind::ClaudeOauthToken,
                    path: None,
                    plan: None,
                }));
            }
            claude::detect(env)
        }
        SignInCli::Codex => codex::detect(env),
    }
}

/// The proxy's source for a sign-in (see [`SignIn::source`]).
pub struct SignInSource {
    route: String,
    inner: Inner,
}

enum Inner {
    Static(Secret),
    Claude(claude::ClaudeLogin),
    Codex(codex::CodexLogin),
}

impl std::fmt::Debug for SignInSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self.inner {
            Inner::Static(_) => "token",
            Inner::Claude(_) => "claude login",
            Inner::Codex(_) => "codex login",
        };
        f.debug_struct("SignInSource")
            .field("route", &self.route)
            .field("kind", &kind)
            .finish_non_exhaustive()
    }
}

impl SignInSource {
    fn check(&self, route: &str) -> Result<(), SourceError> {
        if route == self.route {
            Ok(())
        } else {
            Err(SourceError::Missing(route.to_string()))
        }
    }
}

impl CredentialSource for SignInSource {
    /// The token as last read, without renewing it (the proxy asks [`Self::grant`]).
    fn credential(&self, route: &str) -> Result<Secret, SourceError> {
        self.check(route)?;
        match &self.inner {
            Inner::Static(s) => Ok(s.clone()),
            Inner::Claude(c) => c.current(route),
            Inner::Codex(c) => c.current(route).map(|g| g.secret),
        }
    }

    fn grant<'a>(&'a self, route: &'a str) -> GrantFuture<'a> {
        Box::pin(async move {
            self.check(route)?;
            match &self.inner {
                Inner::Static(s) => Ok(Grant::from(s.clone())),
                Inner::Claude(c) => c.grant(route).await,
                Inner::Codex(c) => c.grant(route).await,
            }
        })
    }

    fn rejected(&self, route: &str) {
        if self.check(route).is_err() {
            return;
        }
        match &self.inner {
            Inner::Static(_) => {}
            Inner::Claude(c) => c.rejected(),
            Inner::Codex(c) => c.rejected(),
        }
    }
}
