//! The secret itself and where it comes from. The value is only ever in the host process: the
//! type prints as `<redacted>`, is zeroed when dropped, and is turned into a header value only at
//! the moment a request leaves for the route's upstream.

use std::fmt;
use std::future::Future;
use std::pin::Pin;

use zeroize::Zeroizing;

/// A credential (model API key, OAuth token). Its `Debug` never shows the value and it has no
/// `Display`, so a stray `{:?}` in a log line or an error cannot leak it. The buffer is zeroed on
/// drop; copies the HTTP stack makes for the outgoing header are not (they live only as long as the
/// request).
#[derive(Clone)]
pub struct Secret(Zeroizing<String>);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Self(Zeroizing::new(value.into()))
    }

    /// The value, for building the outgoing header. Named so that a reader sees every use.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl From<String> for Secret {
    fn from(value: String) -> Self {
        Self::new(value)
    }
}

/// Why a credential could not be given. Its text reaches the event log and the agent's 503 body,
/// so it must never contain the secret.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The route has no credential configured (no key in the vault, role without one).
    #[error("no credential for route `{0}`")]
    Missing(String),
    /// The vault or token store failed (locked, unreadable, expired and not refreshable).
    #[error("credential for route `{route}` unavailable: {reason}")]
    Unavailable { route: String, reason: String },
}

/// What the proxy adds to one request: the route's credential in the route's style, and headers
/// that belong with it (a ChatGPT sign-in's account id). The agent's own copies of those headers
/// are dropped first, like its auth.
#[derive(Debug, Clone)]
pub struct Grant {
    pub secret: Secret,
    /// `(lowercase header name, value)`, each replacing whatever the agent sent under that name.
    pub headers: Vec<(String, Secret)>,
}

impl From<Secret> for Grant {
    fn from(secret: Secret) -> Self {
        Self {
            secret,
            headers: Vec::new(),
        }
    }
}

/// A [`Grant`] being worked out (a token refresh may be in flight).
pub type GrantFuture<'a> = Pin<Box<dyn Future<Output = Result<Grant, SourceError>> + Send + 'a>>;

/// Where the proxy gets the secret for a route. The host wires the vault and the role config into
/// it. Called once per forwarded request (so a rotated or refreshed token is picked up), on the
/// proxy's own runtime thread: it must be quick (a lookup in memory, not a network round trip).
pub trait CredentialSource: Send + Sync {
    /// The secret to add on requests to `route` (a [`super::Route::id`]).
    ///
    /// # Errors
    /// No credential for this route; the request is then refused (503) and logged.
    fn credential(&self, route: &str) -> Result<Secret, SourceError>;

    /// What one request to `route` gets: the secret and the headers that go with it. This is
    /// what the proxy asks; it is awaited on the proxy's runtime, so a source that must renew an
    /// expired token (a subscription sign-in) does it here without holding up other requests.
    /// The default: [`Self::credential`], no extra header.
    ///
    /// # Errors
    /// As [`Self::credential`]; also a renewal that failed.
    fn grant<'a>(&'a self, route: &'a str) -> GrantFuture<'a> {
        Box::pin(std::future::ready(self.credential(route).map(Grant::from)))
    }

    /// The upstream refused `route`'s credential (HTTP 401): a source that can renew it does so
    /// before its next grant, as the program it stands in for would. Default: nothing.
    fn rejected(&self, _route: &str) {}

    /// A signal that turns `true` when `route`'s credential is withdrawn (a grant revoked): the
    /// proxy then cuts that route's exchanges in flight, not only the next request. `None` (the
    /// default): never withdrawn while served.
    fn withdrawn(&self, _route: &str) -> Option<tokio::sync::watch::Receiver<bool>> {
        None
    }
}

/// A fixed map from route id to secret: tests, and hosts that resolve keys once at start.
#[derive(Debug, Default, Clone)]
pub struct StaticSource {
    secrets: Vec<(String, Secret)>,
}

impl StaticSource {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds (or replaces) the secret for `route`.
    #[must_use]
    pub fn with(mut self, route: impl Into<String>, secret: Secret) -> Self {
        let route = route.into();
        self.secrets.retain(|(r, _)| *r != route);
        self.secrets.push((route, secret));
        self
    }
}

impl CredentialSource for StaticSource {
    fn credential(&self, route: &str) -> Result<Secret, SourceError> {
        self.secrets
            .iter()
            .find(|(r, _)| r == route)
            .map(|(_, s)| s.clone())
            .ok_or_else(|| SourceError::Missing(route.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_hides_the_value() {
        let s = Secret::new("sk-live-123");
        assert_eq!(format!("{s:?}"), "Secret(<redacted>)");
        let src = StaticSource::new().with("m", s);
        assert!(!format!("{src:?}").contains("sk-live-123"));
        assert_eq!(src.credential("m").map(|s| s.expose().len()).ok(), Some(11));
        assert!(matches!(src.credential("x"), Err(SourceError::Missing(_))));
    }
}
