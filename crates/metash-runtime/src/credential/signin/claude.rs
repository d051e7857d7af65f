//! `claude login`'s sign-in: `$CLAUDE_CONFIG_DIR/.credentials.json` (default `~/.claude`), as
//! Claude Code writes it on Linux:
//!
//! ```json
//! {"claudeAiOauth": {"accessToken": "…", "refreshToken": "…", "expiresAt": 1767225600000,
//!                    "scopes": ["user:inference", …], "subscriptionType": "max"}}
//! ```
//!
//! Renewed as Claude Code does it: 5 minutes before `expiresAt`, a JSON `refresh_token` grant
//! with its public client id and the login's scopes, under its lock (`.oauth_refresh.lock` in the
//! config directory, and the older `<dir>.lock` beside it), the file re-read under the lock (a
//! CLI or another metash may have renewed it meanwhile) and rewritten with the new tokens.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};
use tokio::sync::Mutex;

use super::common::{self, DirLock};
use super::{Env, SignIn, SignInError, SignInKind};
use crate::credential::secret::{Grant, Secret, SourceError};

/// Anthropic's OAuth token endpoint (Claude Code's `TOKEN_URL`).
pub(super) const TOKEN_URL: &str = "https://platform.claude.com/v1/oauth/token";
/// Claude Code's public OAuth client id.
const CLIENT_ID: &str = "9d1c250a-e61b-44d9-88ed-5944d1962f5e";
/// The scopes Claude Code asks for when renewing a claude.ai login that names no client.
const DEFAULT_SCOPES: [&str; 5] = [
    "user:profile",
    "user:inference",
    "user:sessions:claude_code",
    "user:mcp_servers",
    "user:file_upload",
];
/// Claude Code renews this long before `expiresAt`.
const MARGIN_MS: i64 = 5 * 60 * 1000;
const FILE: &str = ".credentials.json";

/// `claude login`'s credentials file, when it exists.
pub(super) fn detect(env: Env<'_>) -> Result<Option<SignIn>, SignInError> {
    let Some(dir) = config_dir(env) else {
        return Ok(None);
    };
    let path = dir.join(FILE);
    if !path.exists() {
        return Ok(None);
    }
    let tokens = Tokens::read(&path)?;
    Ok(Some(SignIn {
        kind: SignInKind::ClaudeLogin,
        path: Some(path),
        plan: tokens.subscription,
    }))
}

/// Where Claude Code keeps its files: `CLAUDE_CONFIG_DIR`, else `~/.claude`.
fn config_dir(env: Env<'_>) -> Option<PathBuf> {
    env("CLAUDE_CONFIG_DIR")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            env("HOME")
                .filter(|h| !h.is_empty())
                .map(|h| Path::new(&h).join(".claude"))
        })
}

/// The `claudeAiOauth` entry.
struct Tokens {
    access: Secret,
    refresh: Option<Secret>,
    expires_at: Option<i64>,
    scopes: Vec<String>,
    client_id: Option<String>,
    subscription: Option<String>,
}

impl Tokens {
    fn read(path: &Path) -> Result<Self, SignInError> {
        Self::from_doc(&common::read_json(path)?).map_err(|reason| SignInError::File {
            path: path.to_path_buf(),
            reason,
        })
    }

    fn from_doc(doc: &Value) -> Result<Self, String> {
        let o = &doc["claudeAiOauth"];
        let access = o["accessToken"]
            .as_str()
            .filter(|t| !t.is_empty())
            .ok_or("has no claudeAiOauth.accessToken: sign in again with `claude login`")?;
        Ok(Self {
            access: Secret::new(access),
            refresh: o["refreshToken"]
                .as_str()
                .filter(|t| !t.is_empty())
                .map(Secret::new),
            expires_at: o["expiresAt"].as_i64(),
            scopes: o["scopes"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(Value::as_str)
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default(),
            client_id: o["clientId"].as_str().map(str::to_string),
            subscription: o["subscriptionType"].as_str().map(str::to_string),
        })
    }

    /// Within Claude Code's margin of `expiresAt` (a token without one never expires).
    fn due(&self, now_ms: i64) -> bool {
        self.expires_at
            .is_some_and(|at| now_ms.saturating_add(MARGIN_MS) >= at)
    }

    /// The scopes a renewal asks for: a claude.ai login without its own client gets Claude
    /// Code's defaults and whatever it held besides; any other keeps its own.
    fn renewal_scopes(&self) -> Vec<String> {
        let claude_ai =
            self.scopes.iter().any(|s| s == "user:inference") || self.subscription.is_some();
        if !(claude_ai && self.client_id.is_none()) {
            return self.scopes.clone();
        }
        let mut out: Vec<String> = DEFAULT_SCOPES.iter().map(|s| s.to_string()).collect();
        for s in &self.scopes {
            if !out.contains(s) {
                out.push(s.clone());
            }
        }
        out
    }
}

/// The sign-in the proxy serves: the tokens as last read, renewed when due.
pub(super) struct ClaudeLogin {
    path: PathBuf,
    token_url: String,
    http: reqwest::Client,
    state: Mutex<State>,
    rejected: common::Rejected,
    /// A refresh token the endpoint refused for good.
    refused: common::Refused,
}

struct State {
    tokens: Tokens,
}

impl ClaudeLogin {
    pub(super) fn open(path: PathBuf, token_url: String) -> Result<Self, SignInError> {
        let tokens = Tokens::read(&path)?;
        let http = common::http_client().map_err(|reason| SignInError::File {
            path: path.clone(),
            reason,
        })?;
        Ok(Self {
            path,
            token_url,
            http,
            state: Mutex::new(State { tokens }),
            rejected: Default::default(),
            refused: Default::default(),
        })
    }

    pub(super) fn current(&self, route: &str) -> Result<Secret, SourceError> {
        self.state
            .try_lock()
            .map(|s| s.tokens.access.clone())
            .map_err(|_| common::renewing(route))
    }

    pub(super) fn rejected(&self) {
        self.rejected.mark();
    }

    /// The current token, renewed first when due (or refused by the upstream since).
    pub(super) async fn grant(&self, route: &str) -> Result<Grant, SourceError> {
        let mut state = self.state.lock().await;
        let forced = self.rejected.take();
        if forced || state.tokens.due(common::now_ms()) {
            let stale = state.tokens.access.clone();
            state.tokens =
                self.renew(&stale, forced)
                    .await
                    .map_err(|reason| SourceError::Unavailable {
                        route: route.to_string(),
                        reason: format!("claude login ({}): {reason}", self.path.display()),
                    })?;
        }
        Ok(Grant::from(state.tokens.access.clone()))
    }

    /// Fresh tokens: the file's, when someone renewed it since `stale`; else from the token
    /// endpoint, written back to the file. Under Claude Code's lock.
    async fn renew(&self, stale: &Secret, forced: bool) -> Result<Tokens, String> {
        let usable = |t: &Tokens| t.access.expose() != stale.expose() && !t.due(common::now_ms());
        let on_disk = Tokens::read(&self.path).map_err(|e| e.to_string())?;
        if usable(&on_disk) {
            return Ok(on_disk);
        }
        let dir = self
            .path
            .parent()
            .ok_or("the credentials file has no directory")?;
        let lock = DirLock::acquire(&lock_paths(dir)).await?;
        let mut doc = common::read_json(&self.path).map_err(|e| e.to_string())?;
        let on_disk = Tokens::from_doc(&doc)?;
        if usable(&on_disk) || !(forced || on_disk.due(common::now_ms())) {
            return Ok(on_disk);
        }
        let refresh = on_disk.refresh.as_ref().ok_or(
            "the token has expired and the login holds no refresh token: run `claude login`",
        )?;
        self.refused.check(refresh, "claude login")?;
        let body = json!({
            "grant_type": "refresh_token",
            "refresh_token": refresh.expose(),
            "client_id": on_disk.client_id.as_deref().unwrap_or(CLIENT_ID),
            "scope": on_disk.renewal_scopes().join(" "),
        });
        let answer = self
            .refused
            .post(&self.http, &self.token_url, &body, refresh)
            .await?;
        let access = answer["access_token"]
            .as_str()
            .filter(|t| !t.is_empty())
            .ok_or("the token endpoint gave no access_token")?;
        let entry = &mut doc["claudeAiOauth"];
        entry["accessToken"] = access.into();
        if let Some(r) = answer["refresh_token"].as_str().filter(|t| !t.is_empty()) {
            entry["refreshToken"] = r.into();
        }
        if let Some(secs) = answer["expires_in"].as_i64() {
            entry["expiresAt"] = common::now_ms()
                .saturating_add(secs.saturating_mul(1000))
                .into();
        }
        if let Some(scope) = answer["scope"].as_str() {
            entry["scopes"] = scope.split_whitespace().collect::<Vec<_>>().into();
        }
        common::write_json_atomic(&self.path, &doc)?;
        drop(lock);
        Tokens::from_doc(&doc)
    }
}

/// Claude Code's two lock directories for a config directory: `<dir>/.oauth_refresh.lock`, then
/// the older `<realpath(dir)>.lock`.
fn lock_paths(dir: &Path) -> Vec<PathBuf> {
    let real = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let mut legacy = real.into_os_string();
    legacy.push(".lock");
    vec![dir.join(".oauth_refresh.lock"), PathBuf::from(legacy)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renewal_scopes_follow_claude_code() {
        let doc = json!({"claudeAiOauth": {"accessToken": "a", "scopes": ["user:inference", "x:y"],
                         "subscriptionType": "max"}});
        let t = Tokens::from_doc(&doc).expect("tokens");
        let s = t.renewal_scopes();
        assert_eq!(s[..5], DEFAULT_SCOPES.map(String::from));
        assert_eq!(s.last().map(String::as_str), Some("x:y"));
        let doc =
            json!({"claudeAiOauth": {"accessToken": "a", "scopes": ["org:x"], "clientId": "c"}});
        assert_eq!(
            Tokens::from_doc(&doc).expect("t").renewal_scopes(),
            vec!["org:x"]
        );
    }

    #[test]
    fn due_is_five_minutes_early_and_never_without_expiry() {
        let doc = json!({"claudeAiOauth": {"accessToken": "a", "expiresAt": 1_000_000}});
        let t = Tokens::from_doc(&doc).expect("t");
        assert!(!t.due(1_000_000 - MARGIN_MS - 1));
        assert!(t.due(1_000_000 - MARGIN_MS));
        let doc = json!({"claudeAiOauth": {"accessToken": "a"}});
        assert!(!Tokens::from_doc(&doc).expect("t").due(i64::MAX));
        assert!(Tokens::from_doc(&json!({"claudeAiOauth": {}})).is_err());
    }

    #[test]
    fn lock_paths_are_the_clis() {
        let d = tempfile::tempdir().expect("dir");
        let p = lock_paths(d.path());
        assert_eq!(p[0], d.path().join(".oauth_refresh.lock"));
        let real = std::fs::canonicalize(d.path()).expect("real");
        assert_eq!(p[1].to_string_lossy(), format!("{}.lock", real.display()));
    }
}
