//! The broker: logs a person in to a provider, keeps the tokens in the vault, hands out a live
//! access token (refreshed before it expires, under the vault's lock, so two processes never
//! spend one refresh token), and logs out (revoking at the provider first, RFC 7009).
//!
//! Each provider's tokens are one vault entry, `oauth:NAME`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use metash_store::atomic::{stamp, Stamp};

use crate::error::{AuthError, Result};
use crate::flow::{self, Granted, Opener};
use crate::provider::Provider;
use crate::secret::Secret;
use crate::vault::{KeyCache, KeyOptions, Vault};

/// An access token is refreshed when it has less than this left (or less than half its life,
/// for short-lived tokens).
pub const REFRESH_MARGIN: Duration = Duration::from_secs(60);

/// One provider's tokens, as sealed in the vault.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Stored {
    access_token: Secret,
    #[serde(default)]
    refresh_token: Option<Secret>,
    /// RFC 3339.
    #[serde(default)]
    expires_at: Option<String>,
    scopes: Vec<String>,
    obtained_at: String,
    /// `pkce` or `device`.
    flow: String,
}

/// What `metash auth list` shows of a login: never a token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TokenInfo {
    pub provider: String,
    pub scopes: Vec<String>,
    pub expires_at: Option<String>,
    pub refreshable: bool,
    pub obtained_at: String,
    pub flow: String,
}

/// How to log in.
pub struct Login {
    /// The provider's default scopes when `None`.
    pub scopes: Option<Vec<String>>,
    pub device: bool,
    pub opener: Opener,
}

/// What logging out did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Logout {
    pub provider: String,
    /// Whether the provider was told (it has a revocation endpoint).
    pub revoked_at_provider: bool,
    pub was_logged_in: bool,
}

pub struct Broker {
    root: PathBuf,
    vault_path: PathBuf,
    keys: KeyOptions,
    /// The vault's key once unlocked: a token asked for reads the file, not the keychain or
    /// Argon2id again.
    key: KeyCache,
    /// Per provider, the entry last read and the vault file's stamp then: while the file is the
    /// same version and the token fresh, a token asked for reads nothing (the credential proxy
    /// asks at every request).
    seen: Mutex<HashMap<String, (Stamp, Stored)>>,
    rt: tokio::runtime::Runtime,
    http: reqwest::Client,
}

fn entry(provider: &str) -> String {
    format!("oauth:{provider}")
}

fn now() -> chrono::DateTime<chrono::Utc> {
    chrono::Utc::now()
}

impl Stored {
    fn from_granted(g: Granted, asked: &[String], flow: &str, previous: Option<&Stored>) -> Self {
        Self {
            access_token: g.access_token,
            // A provider that does not rotate keeps the old refresh token valid.
            refresh_token: g
                .refresh_token
                .or_else(|| previous.and_then(|p| p.refresh_token.clone())),
            expires_at: g
                .expires_in
                .and_then(|d| chrono::Duration::from_std(d).ok())
                .map(|d| (now() + d).to_rfc3339()),
            scopes: g.scopes.unwrap_or_else(|| asked.to_vec()),
            obtained_at: now().to_rfc3339(),
            flow: flow.to_string(),
        }
    }

    fn fresh_for(&self, margin: Duration) -> bool {
        let parse = |t: &str| {
            chrono::DateTime::parse_from_rfc3339(t)
                .ok()
                .map(|d| d.with_timezone(&chrono::Utc))
        };
        let Some(at) = self.expires_at.as_deref().and_then(parse) else {
            return true; // no expiry given: valid until revoked
        };
        let margin = chrono::Duration::from_std(margin).unwrap_or(chrono::Duration::zero());
        let half_life = parse(&self.obtained_at).map_or(margin, |from| (at - from) / 2);
        at > now() + margin.min(half_life)
    }

    fn info(&self, provider: &str) -> TokenInfo {
        TokenInfo {
            provider: provider.to_string(),
            scopes: self.scopes.clone(),
            expires_at: self.expires_at.clone(),
            refreshable: self.refresh_token.is_some(),
            obtained_at: self.obtained_at.clone(),
            flow: self.flow.clone(),
        }
    }
}

impl Broker {
    /// A broker for the project at `root`, with the vault at `vault_path`.
    ///
    /// # Errors
    /// The async runtime or the HTTP client cannot be made.
    pub fn new(root: &Path, vault_path: &Path, keys: KeyOptions) -> Result<Self> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| AuthError::io("starting the async runtime", e))?;
        Ok(Self {
            root: root.to_path_buf(),
            vault_path: vault_path.to_path_buf(),
            keys,
            key: KeyCache::default(),
            seen: Mutex::default(),
            rt,
            http: flow::http_client()?,
        })
    }

    /// Provider `name`, its endpoints completed by discovery when it names an issuer.
    ///
    /// # Errors
    /// Unknown, misconfigured, or its discovery document cannot be had.
    pub fn provider(&self, name: &str) -> Result<Provider> {
        let p = Provider::named(&self.root, name)?;
        let Some(issuer) = p.issuer.clone() else {
            return Ok(p);
        };
        let base = issuer.as_str().trim_end_matches('/').to_string();
        let doc = self.rt.block_on(async {
            for well_known in ["openid-configuration", "oauth-authorization-server"] {
                let url = format!("{base}/.well-known/{well_known}");
                if let Ok(r) = self.http.get(&url).send().await {
                    if r.status().is_success() {
                        if let Ok(bytes) = r.bytes().await {
                            if let Ok(v) = serde_json::from_slice::<serde_json::Value>(&bytes) {
                                return Some(v);
                            }
                        }
                    }
                }
            }
            None
        });
        let doc = doc.ok_or_else(|| {
            AuthError::flow(
                name,
                "discovery",
                format!("no discovery document at {base}/.well-known/"),
            )
        })?;
        p.discovered(&doc)
    }

    fn vault(&self) -> Result<Vault> {
        Vault::open_with(&self.vault_path, &self.keys, &self.key)
    }

    /// Logs in to `provider` and keeps its tokens; what was granted.
    ///
    /// # Errors
    /// The flow failed (said at which step), or the vault.
    pub fn login(&self, provider: &str, how: &Login) -> Result<TokenInfo> {
        let p = self.provider(provider)?;
        let mut vault = self.vault()?;
        let scopes = how.scopes.clone().unwrap_or_else(|| p.scopes.clone());
        let (granted, flow_name) = if how.device {
            (
                self.rt
                    .block_on(flow::device(&self.http, &p, &scopes, &how.opener))?,
                "device",
            )
        } else {
            (
                self.rt
                    .block_on(flow::pkce(&self.http, &p, &scopes, &how.opener))?,
                "pkce",
            )
        };
        let stored = Stored::from_granted(granted, &scopes, flow_name, None);
        let info = stored.info(provider);
        vault.update(|e| e.put(&entry(provider), &stored))?;
        Ok(info)
    }

    /// Every login kept.
    ///
    /// # Errors
    /// The vault.
    pub fn list(&self) -> Result<Vec<TokenInfo>> {
        if !self.vault_path.exists() {
            return Ok(Vec::new());
        }
        let vault = self.vault()?;
        let mut out = Vec::new();
        for name in vault.names() {
            if let Some(provider) = name.strip_prefix("oauth:") {
                if let Some(s) = vault.get::<Stored>(&name)? {
                    out.push(s.info(provider));
                }
            }
        }
        Ok(out)
    }

    /// Revokes the login at the provider (its refresh token, then its access token), then
    /// forgets it. A provider that cannot be reached is an error and nothing is forgotten, so the
    /// person can try again; one with no revocation endpoint is only forgotten, and says so.
    ///
    /// # Errors
    /// The provider refused or could not be reached, or the vault.
    pub fn logout(&self, provider: &str) -> Result<Logout> {
        let p = self.provider(provider)?;
        let mut vault = self.vault()?;
        let Some(stored) = vault.get::<Stored>(&entry(provider))? else {
            return Ok(Logout {
                provider: provider.into(),
                revoked_at_provider: false,
                was_logged_in: false,
            });
        };
        let mut revoked = false;
        if let Some(rt) = &stored.refresh_token {
            revoked |= self.rt.block_on(flow::revoke(&self.http, &p, rt, true))?;
        }
        revoked |= self
            .rt
            .block_on(flow::revoke(&self.http, &p, &stored.access_token, false))?;
        vault.update(|e| Ok(e.remove(&entry(provider))))?;
        Ok(Logout {
            provider: provider.into(),
            revoked_at_provider: revoked,
            was_logged_in: true,
        })
    }

    /// A live access token for `provider`: the kept one while it has more than
    /// [`REFRESH_MARGIN`] left, else a refreshed one. The refresh happens under the vault's lock
    /// after reading the entry again, so a process that waited for another's refresh uses its
    /// result instead of spending the (rotated, now dead) refresh token a second time.
    ///
    /// # Errors
    /// Not logged in; the login expired ([`AuthError::LoginExpired`]: a person must log in
    /// again); the provider or the vault failed.
    pub fn access_token(&self, provider: &str) -> Result<Secret> {
        self.access_token_noting(provider).map(|(s, _)| s)
    }

    /// [`Broker::access_token`], and whether this call refreshed it (for the ledger).
    ///
    /// # Errors
    /// As [`Broker::access_token`].
    pub fn access_token_noting(&self, provider: &str) -> Result<(Secret, bool)> {
        // Taken before the read: a file replaced meanwhile is read again next time.
        let stamp = stamp(&self.vault_path);
        if let Some(token) = self.seen_fresh(provider, stamp) {
            return Ok((token, false));
        }
        let mut vault = self.vault()?;
        let name = entry(provider);
        let stored = vault
            .get::<Stored>(&name)?
            .ok_or_else(|| AuthError::NotLoggedIn(provider.into()))?;
        if stored.fresh_for(REFRESH_MARGIN) {
            let token = stored.access_token.clone();
            if let (Some(stamp), Ok(mut seen)) = (stamp, self.seen.lock()) {
                seen.insert(provider.to_string(), (stamp, stored));
            }
            return Ok((token, false));
        }
        let p = self.provider(provider)?;
        let mut locked = vault.locked()?;
        let current = locked
            .get::<Stored>(&name)?
            .ok_or_else(|| AuthError::NotLoggedIn(provider.into()))?;
        if current.fresh_for(REFRESH_MARGIN) {
            return Ok((current.access_token, false));
        }
        let rt = current
            .refresh_token
            .clone()
            .ok_or_else(|| AuthError::LoginExpired(provider.into()))?;
        let granted = self.rt.block_on(flow::refresh(&self.http, &p, &rt))?;
        let next = Stored::from_granted(granted, &current.scopes, &current.flow, Some(&current));
        locked.put(&name, &next)?;
        Ok((next.access_token, true))
    }

    /// The token already read for `provider`, if the vault file is still that version and the
    /// token still fresh: no file read, no lock, no network, so a caller on an async thread can
    /// ask before handing the slow path ([`Broker::access_token_noting`]) to a thread of its own.
    #[must_use]
    pub fn fresh_token(&self, provider: &str) -> Option<Secret> {
        self.seen_fresh(provider, stamp(&self.vault_path))
    }

    fn seen_fresh(&self, provider: &str, stamp: Option<Stamp>) -> Option<Secret> {
        let stamp = stamp?;
        let seen = self.seen.lock().ok()?;
        let (at, stored) = seen.get(provider)?;
        (*at == stamp && stored.fresh_for(REFRESH_MARGIN)).then(|| stored.access_token.clone())
    }

    /// Whether the provider still holds `token` active (RFC 7662), for `metash auth status`
    /// and the tests.
    ///
    /// # Errors
    /// No introspection endpoint, or the provider failed.
    pub fn introspect(&self, provider: &str, token: &Secret) -> Result<bool> {
        let p = self.provider(provider)?;
        self.rt.block_on(flow::introspect(&self.http, &p, token))
    }
}
