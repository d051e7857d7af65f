//! The model key of a CLI role never reaches the CLI: the CLI gets a placeholder key and a base
//! URL on a per-spawn credential proxy (`metash_runtime::credential`), which drops whatever auth
//! the CLI sends and adds the real key only on the way to the role's endpoint. The key stays in
//! this process: not in the CLI's environment, files, arguments, nor in any event.

use std::sync::Arc;

use metash_harness::{Endpoint, KeyHeader};
use metash_runtime::credential::{
    AuthStyle, CredentialProxy, Mount, ProxyConfig, Route, Secret, StaticSource, UsageTap,
};

use crate::config::Role;
use crate::error::{HostError, Result};
use crate::host::Host;

/// What the CLI is given instead of the key.
pub const PLACEHOLDER: &str = "metash-placeholder-the-real-key-stays-in-metash";

const ROUTE: &str = "model";

/// A started proxy, the endpoint the CLI gets, and the variables that get the placeholder.
pub type Started = (CredentialProxy, Endpoint, Vec<String>);

/// Starts the proxy for one spawn of a CLI role and says what the CLI gets: the endpoint on the
/// proxy, and the variables that get the placeholder (the one the CLI reads its key from, and
/// the one metash read it from). `None` when the role has no key to protect. `tap` sees every
/// model response as it streams (the turn's usage is read there).
///
/// # Errors
/// The proxy cannot start (a bad `base_url` is named).
pub fn start(
    host: &Host,
    agent: &str,
    role: &Role,
    tap: Option<Arc<dyn UsageTap>>,
) -> Result<Option<Started>> {
    let Some(var) = role.key_env() else {
        return Ok(None);
    };
    let Some(key) = host.env_var(&var).filter(|k| !k.is_empty()) else {
        return Ok(None);
    };
    let info = metash_harness::frontend::info(role.frontend);
    let auth = match info.key_header {
        KeyHeader::XApiKey => AuthStyle::XApiKey,
        KeyHeader::Bearer => AuthStyle::Bearer,
    };
    let upstream = role
        .base_url
        .clone()
        .unwrap_or_else(|| info.upstream.to_string());
    let mut config = ProxyConfig::new(vec![Route {
        id: ROUTE.into(),
        mount: Mount::WholePort,
        upstream: upstream.trim_end_matches('/').to_string(),
        auth,
    }]);
    config.agent = Some(agent.to_string());
    config.tap = tap;
    let source = StaticSource::new().with(ROUTE, Secret::new(key));
    let proxy = CredentialProxy::start(config, Arc::new(source), host.event_sink())
        .map_err(|e| HostError::Config(format!("role `{agent}`: {e}")))?;
    let base_url = proxy
        .base_url(ROUTE)
        .ok_or_else(|| HostError::Other("the credential proxy lost its route".into()))?;
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
    let mut vars = vec![cli_var];
    if !vars.contains(&var) {
        vars.push(var);
    }
    Ok(Some((proxy, endpoint, vars)))
}
