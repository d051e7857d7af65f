//! The model credential of a CLI role never reaches the CLI: the CLI gets a placeholder and a
//! base URL on a per-spawn credential proxy (`metash_runtime::credential`), which drops whatever
//! auth the CLI sends and adds the real credential only on the way to the role's endpoint. The
//! credential is a model key, or the user's subscription sign-in (Claude Code's `claude login` or
//! `CLAUDE_CODE_OAUTH_TOKEN`, Codex's `codex login`), which the proxy also renews when it expires.
//! It stays in this process: not in the CLI's environment, files, arguments, nor in any event.

use std::sync::Arc;

use metash_harness::{Endpoint, KeyHeader, SignInOptions};
use metash_runtime::credential::signin::{SignIn, SignInKind};
use metash_runtime::credential::{
    AuthStyle, CredentialProxy, CredentialSource, Mount, ProxyConfig, Recorder, Route, Secret,
    StaticSource, UsageTap,
};

use crate::config::{Access, Role};
use crate::error::{HostError, Result};
use crate::host::Host;

/// What the CLI is given instead of the key or token.
pub const PLACEHOLDER: &str = "metash-placeholder-the-real-key-stays-in-metash";

const ROUTE: &str = "model";

/// Codex's model requests go under this prefix on the proxy; its ChatGPT account requests
/// (`chatgpt_base_url`) go under [`ACCOUNT_PREFIX`], which no route serves.
const CODEX_PREFIX: &str = "/codex";
const ACCOUNT_PREFIX: &str = "/chatgpt-account";

/// A started proxy and what the CLI gets.
pub struct Started {
    pub proxy: CredentialProxy,
    /// The CLI's endpoint: a base URL on the proxy.
    pub endpoint: Endpoint,
    /// The variables that get [`PLACEHOLDER`] (where the CLI reads its key or token, and where
    /// metash read it).
    pub placeholders: Vec<String>,
    /// A subscription sign-in: the placeholder sign-in the harness gives the CLI.
    pub sign_in: Option<SignInOptions>,
}

/// What the proxy reports to besides the log: the turn's usage meter and its tape.
#[derive(Default)]
pub struct Hooks {
    pub tap: Option<Arc<dyn UsageTap>>,
    /// Receives every exchange, redacted (the placeholder too): the turn's tape (docs/replay.md).
    pub recorder: Option<Arc<dyn Recorder>>,
}

/// Starts the proxy for one spawn of a CLI role (or a sandboxed command, a session) and says what
/// the CLI gets. `None` when the role has nothing to protect (no key, no sign-in). `hooks.tap`
/// sees every model response as it streams (the turn's usage is read there); `hooks.recorder`
/// gets every exchange, redacted (the turn's tape).
///
/// # Errors
/// The role's `auth` cannot be met, a sign-in cannot be read, or the proxy cannot start (a bad
/// `base_url` is named).
pub fn start_recorded(
    host: &Host,
    agent: &str,
    role: &Role,
    hooks: Hooks,
) -> Result<Option<Started>> {
    let env = |k: &str| host.env_var(k);
    let access = role
        .access(&env)
        .map_err(|e| HostError::Config(format!("role `{agent}`: {e}")))?;
    match access {
        // Nothing passes a proxy, so nothing was recorded and a replay would reach the network.
        Access::None if host.replaying().is_some() => Err(HostError::Config(format!(
            "role `{agent}` has no model credential, so its turns pass no credential proxy and \
             cannot be replayed"
        ))),
        Access::None => Ok(None),
        Access::Key(var) => start_key(host, agent, role, hooks, var),
        Access::SignIn(s) => start_sign_in(host, agent, role, hooks, &s).map(Some),
    }
}

/// What no tape may hold, whichever role's turn it records: the placeholder, and every model
/// key metash read for any configured role (a key one model echoed can reach another role's
/// prompt, docs/replay.md). Values shorter than 8 bytes are left out: masking them would mask
/// ordinary text.
pub(crate) fn secrets(host: &Host) -> Vec<String> {
    let mut out = vec![PLACEHOLDER.to_string()];
    for role in host.config().roles.values() {
        let info = metash_harness::frontend::info(role.frontend);
        let vars = role.key_env().into_iter().chain([info.key_env.to_string()]);
        for key in vars.filter_map(|v| host.env_var(&v)) {
            if key.len() >= 8 && !out.contains(&key) {
                out.push(key);
            }
        }
    }
    out
}

/// Refuses a role whose key variable is unset, or whose `auth` cannot be met, before anything
/// is spent (the sign-in itself is read only when a spawn starts).
///
/// # Errors
/// [`HostError::Config`] naming the variable, or how to sign in.
pub fn preflight(host: &Host, name: &str, role: &Role) -> Result<()> {
    let frontend = role.frontend_name();
    let access = role
        .access(&|k: &str| host.env_var(k))
        .map_err(|e| HostError::Config(format!("role `{name}` ({frontend}): {e}")))?;
    if let Access::Key(var) = access {
        // A replay answers from the tape: no key is needed.
        if host.replaying().is_none() && host.env_var(&var).is_none_or(|v| v.is_empty()) {
            let or = match role.sign_in_cli() {
                Some(cli) if role.auth.is_none() => format!(
                    " (or sign the CLI in instead: {})",
                    crate::config::no_sign_in(cli)
                ),
                _ => String::new(),
            };
            return Err(HostError::Config(format!(
                "role `{name}` ({frontend}) needs the environment variable {var}, which is not \
                 set{or}"
            )));
        }
    }
    Ok(())
}

/// The role's `base_url`, else `env_var` (the variable the CLI itself would read, such as
/// `ANTHROPIC_BASE_URL`: a proxy or local server the user already points their CLI at), else
/// the provider's own endpoint.
fn upstream(host: &Host, role: &Role, env_var: Option<&str>, default: &str) -> String {
    role.base_url
        .clone()
        .or_else(|| {
            env_var
                .and_then(|v| host.env_var(v))
                .filter(|u| !u.trim().is_empty())
        })
        .unwrap_or_else(|| default.to_string())
        .trim_end_matches('/')
        .to_string()
}

fn serve(
    host: &Host,
    agent: &str,
    route: Route,
    source: Arc<dyn CredentialSource>,
    hooks: Hooks,
) -> Result<(CredentialProxy, String)> {
    let mut config = ProxyConfig::new(vec![route]);
    config.agent = Some(agent.to_string());
    config.tap = hooks.tap;
    config.recorder = hooks.recorder;
    config.replay = host.replaying().cloned();
    config.redact = secrets(host);
    let proxy = CredentialProxy::start(config, source, host.event_sink())
        .map_err(|e| HostError::Config(format!("role `{agent}`: {e}")))?;
    let base_url = proxy
        .base_url(ROUTE)
        .ok_or_else(|| HostError::Other("the credential proxy lost its route".into()))?;
    Ok((proxy, base_url))
}

fn start_key(
    host: &Host,
    agent: &str,
    role: &Role,
    hooks: Hooks,
    var: String,
) -> Result<Option<Started>> {
    // A replay asks for no credential: the proxy answers from the tape and holds a placeholder.
    let key = match host.replaying() {
        Some(_) => Some(PLACEHOLDER.to_string()),
        None => host.env_var(&var).filter(|k| !k.is_empty()),
    };
    let Some(key) = key else {
        return Ok(None);
    };
    let info = metash_harness::frontend::info(role.frontend);
    let auth = match info.key_header {
        KeyHeader::XApiKey => AuthStyle::XApiKey,
        KeyHeader::Bearer => AuthStyle::Bearer,
    };
    // metash's own API clients never read `ANTHROPIC_BASE_URL`/`OPENAI_BASE_URL`: sent through
    // the proxy (a recorded turn), they reach the upstream they reach without it.
    let env_base = role.runs_cli().then_some(info.base_url_env);
    let route = Route {
        id: ROUTE.into(),
        mount: Mount::WholePort,
        upstream: upstream(host, role, env_base, info.upstream),
        auth,
    };
    let source = StaticSource::new().with(ROUTE, Secret::new(key));
    let (proxy, base_url) = serve(host, agent, route, Arc::new(source), hooks)?;
    // Where the CLI looks for its key: Claude Code reads only its own variable; Codex and pi read
    // the variable their provider config names.
    let cli_var = info
        .fixed_key_env
        .map_or_else(|| var.clone(), str::to_string);
    let endpoint = Endpoint {
        base_url,
        api_key_env: Some(cli_var.clone()),
        provider_name: None,
    };
    // The variable metash read the key from is overwritten too: the CLI inherits metash's
    // environment, and must not find the key under its own name either.
    let mut placeholders = vec![cli_var];
    if !placeholders.contains(&var) {
        placeholders.push(var);
    }
    Ok(Some(Started {
        proxy,
        endpoint,
        placeholders,
        sign_in: None,
    }))
}

/// A subscription: the proxy's source reads (and renews) the sign-in; the CLI gets a
/// placeholder sign-in in the form it expects.
fn start_sign_in(
    host: &Host,
    agent: &str,
    role: &Role,
    hooks: Hooks,
    sign_in: &SignIn,
) -> Result<Started> {
    let info = metash_harness::frontend::info(role.frontend);
    let source = sign_in
        .source(ROUTE, &|k: &str| host.env_var(k))
        .map_err(|e| HostError::Config(format!("role `{agent}`: {e}")))?;
    let codex = sign_in.kind == SignInKind::CodexLogin;
    // `OPENAI_BASE_URL` names the API a key is for, not the ChatGPT backend a sign-in uses.
    let env_base = (!codex).then_some(info.base_url_env);
    let route = Route {
        id: ROUTE.into(),
        mount: if codex {
            Mount::Prefix(CODEX_PREFIX.into())
        } else {
            Mount::WholePort
        },
        upstream: upstream(host, role, env_base, sign_in.default_upstream()),
        auth: sign_in.auth_style(),
    };
    let (proxy, base_url) = serve(host, agent, route, Arc::new(source), hooks)?;
    let options = SignInOptions {
        placeholder: PLACEHOLDER.to_string(),
        plan: if codex { sign_in.plan.clone() } else { None },
        chatgpt_base_url: codex.then(|| format!("http://{}{ACCOUNT_PREFIX}/", proxy.addr())),
    };
    // Claude Code reads its sign-in from this variable (the harness sets it as well); the user's
    // own value is overwritten like a key's. Codex reads its placeholder `auth.json`.
    let placeholders = if codex {
        Vec::new()
    } else {
        vec![metash_runtime::credential::signin::CLAUDE_TOKEN_ENV.to_string()]
    };
    Ok(Started {
        proxy,
        endpoint: Endpoint {
            base_url,
            api_key_env: None,
            provider_name: None,
        },
        placeholders,
        sign_in: Some(options),
    })
}
