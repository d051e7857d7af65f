//! `codex login`'s ChatGPT sign-in: `$CODEX_HOME/auth.json` (default `~/.codex`), as Codex
//! writes it:
//!
//! ```json
//! {"OPENAI_API_KEY": null,
//!  "tokens": {"id_token": "<JWT>", "access_token": "<JWT>", "refresh_token": "…", "account_id": "…"},
//!  "last_refresh": "2025-01-01T00:00:00Z"}
//! ```
//!
//! In ChatGPT mode Codex calls the ChatGPT backend (`…/backend-api/codex/responses`) with
//! `Authorization: Bearer <access_token>` and `chatgpt-account-id: <account_id>`. It renews when
//! the access token's `exp` has passed (or, for a token without one, when `last_refresh` is 8
//! days old): a JSON `refresh_token` grant with its public client id at
//! `https://auth.openai.com/oauth/token` (`CODEX_REFRESH_TOKEN_URL_OVERRIDE` replaces it), then
//! `tokens` and `last_refresh` rewritten. Codex re-reads the file before renewing (another
//! process may have done it); so does metash, under an exclusive `flock` on the directory.

use std::path::{Path, PathBuf};

use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::{json, Value};
use tokio::sync::Mutex;

use super::common::{self, Flock};
use super::{Env, SignIn, SignInError, SignInKind};
use crate::credential::secret::{Grant, Secret, SourceError};

/// OpenAI's token endpoint (Codex's `REFRESH_TOKEN_URL`).
pub(super) const TOKEN_URL: &str = "https://auth.openai.com/oauth/token";
/// Codex's public OAuth client id.
const CLIENT_ID: &str = "app_EMoamEEZ73f0CkXaXp7hrann";
/// Renewed this long before the access token's `exp` (Codex waits for `exp`; a request in
/// flight should not cross it).
const MARGIN_S: i64 = 60;
/// Without an `exp`, Codex renews a login this old.
const MAX_AGE_DAYS: i64 = 8;
/// The claim holding the ChatGPT account and plan in Codex's tokens.
const AUTH_CLAIM: &str = "https://api.openai.com/auth";
/// The header the ChatGPT backend reads the account from.
const ACCOUNT_HEADER: &str = "chatgpt-account-id";

/// `codex login`'s `auth.json` in ChatGPT mode, when there is one (an API-key `auth.json` is not
/// a subscription).
pub(super) fn detect(env: Env<'_>) -> Result<Option<SignIn>, SignInError> {
    let home = env("CODEX_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            env("HOME")
                .filter(|h| !h.is_empty())
                .map(|h| Path::new(&h).join(".codex"))
        });
    let Some(path) = home.map(|h| h.join("auth.json")) else {
        return Ok(None);
    };
    if !path.exists() {
        return Ok(None);
    }
    let doc = common::read_json(&path)?;
    let mode = doc["auth_mode"].as_str().map(str::to_ascii_lowercase);
    if doc["tokens"].is_null() || mode.is_some_and(|m| m != "chatgpt") {
        return Ok(None);
    }
    let tokens = Tokens::from_doc(&doc).map_err(|reason| SignInError::File {
        path: path.clone(),
        reason,
    })?;
    Ok(Some(SignIn {
        kind: SignInKind::CodexLogin,
        path: Some(path),
        plan: tokens.plan,
    }))
}

/// `tokens` and `last_refresh`.
struct Tokens {
    access: Secret,
    refresh: Option<Secret>,
    account_id: Option<String>,
    /// The access token's `exp` (seconds), when it is a JWT that has one.
    exp: Option<i64>,
    last_refresh: Option<DateTime<Utc>>,
    plan: Option<String>,
}

impl Tokens {
    fn from_doc(doc: &Value) -> Result<Self, String> {
        let t = &doc["tokens"];
        let access = t["access_token"]
            .as_str()
            .filter(|s| !s.is_empty())
            .ok_or("has no tokens.access_token: sign in again with `codex login`")?;
        let id_claims = t["id_token"]
            .as_str()
            .and_then(common::jwt_payload)
            .map(|p| p[AUTH_CLAIM].clone())
            .unwrap_or(Value::Null);
        Ok(Self {
            exp: common::jwt_payload(access).and_then(|p| p["exp"].as_i64()),
            access: Secret::new(access),
            refresh: t["refresh_token"]
                .as_str()
                .filter(|s| !s.is_empty())
                .map(Secret::new),
            account_id: t["account_id"]
                .as_str()
                .or_else(|| id_claims["chatgpt_account_id"].as_str())
                .map(str::to_string),
            last_refresh: doc["last_refresh"]
                .as_str()
                .and_then(|s| DateTime::parse_from_rfc3339(s).ok())
                .map(|d| d.with_timezone(&Utc)),
            plan: id_claims["chatgpt_plan_type"].as_str().map(str::to_string),
        })
    }

    fn due(&self, now: DateTime<Utc>) -> bool {
        match (self.exp, self.last_refresh) {
            (Some(exp), _) => exp - MARGIN_S <= now.timestamp(),
            (None, Some(at)) => at < now - chrono::Duration::days(MAX_AGE_DAYS),
            (None, None) => false,
        }
    }

    fn grant(&self) -> Grant {
        Grant {
            secret: self.access.clone(),
            headers: self
                .account_id
                .iter()
                .map(|a| (ACCOUNT_HEADER.to_string(), Secret::new(a.clone())))
                .collect(),
        }
    }
}

/// The sign-in the proxy serves: the tokens as last read, renewed when due.
pub(super) struct CodexLogin {
    path: PathBuf,
    token_url: String,
    http: reqwest::Client,
    state: Mutex<Tokens>,
    rejected: common::Rejected,
    /// A refresh token the endpoint refused for good.
    refused: common::Refused,
}

impl CodexLogin {
    pub(super) fn open(path: PathBuf, token_url: String) -> Result<Self, SignInError> {
        let file_err = |reason: String| SignInError::File {
            path: path.clone(),
            reason,
        };
        let tokens = Tokens::from_doc(&common::read_json(&path)?).map_err(file_err)?;
        let http = common::http_client().map_err(file_err)?;
        Ok(Self {
            path,
            token_url,
            http,
            state: Mutex::new(tokens),
            rejected: Default::default(),
            refused: Default::default(),
        })
    }

    pub(super) fn current(&self, route: &str) -> Result<Grant, SourceError> {
        self.state
            .try_lock()
            .map(|t| t.grant())
            .map_err(|_| common::renewing(route))
    }

    pub(super) fn rejected(&self) {
        self.rejected.mark();
    }

    /// The current token and account, the token renewed first when due (or refused since).
    pub(super) async fn grant(&self, route: &str) -> Result<Grant, SourceError> {
        let mut tokens = self.state.lock().await;
        let forced = self.rejected.take();
        if forced || tokens.due(Utc::now()) {
            let stale = tokens.access.clone();
            *tokens =
                self.renew(&stale, forced)
                    .await
                    .map_err(|reason| SourceError::Unavailable {
                        route: route.to_string(),
                        reason: format!("codex login ({}): {reason}", self.path.display()),
                    })?;
        }
        Ok(tokens.grant())
    }

    /// Fresh tokens: the file's, when someone renewed it since `stale`; else from the token
    /// endpoint, written back as Codex writes them.
    async fn renew(&self, stale: &Secret, forced: bool) -> Result<Tokens, String> {
        let dir = self.path.parent().ok_or("auth.json has no directory")?;
        let lock = Flock::acquire(dir).await?;
        let mut doc = common::read_json(&self.path).map_err(|e| e.to_string())?;
        let on_disk = Tokens::from_doc(&doc)?;
        let renewed_elsewhere = on_disk.access.expose() != stale.expose();
        if (renewed_elsewhere && !on_disk.due(Utc::now())) || !(forced || on_disk.due(Utc::now())) {
            return Ok(on_disk);
        }
        let refresh = on_disk.refresh.as_ref().ok_or(
            "the token has expired and the login holds no refresh token: run `codex login`",
        )?;
        self.refused.check(refresh, "codex login")?;
        let body = json!({
            "client_id": CLIENT_ID,
            "grant_type": "refresh_token",
            "refresh_token": refresh.expose(),
        });
        let answer = self
            .refused
            .post(&self.http, &self.token_url, &body, refresh)
            .await?;
        let tokens = &mut doc["tokens"];
        for key in ["id_token", "access_token", "refresh_token"] {
            if let Some(v) = answer[key].as_str().filter(|v| !v.is_empty()) {
                tokens[key] = v.into();
            }
        }
        if answer["access_token"].as_str().is_none_or(str::is_empty) {
            return Err("the token endpoint gave no access_token".into());
        }
        doc["last_refresh"] = Utc::now()
            .to_rfc3339_opts(SecondsFormat::Micros, true)
            .into();
        common::write_json_atomic(&self.path, &doc)?;
        drop(lock);
        Tokens::from_doc(&doc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine;

    fn jwt(payload: &Value) -> String {
        let e = |v: &Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
        format!("{}.{}.sig", e(&json!({"alg": "none"})), e(payload))
    }

    #[test]
    fn tokens_read_the_account_plan_and_expiry() {
        let doc = json!({"tokens": {
            "id_token": jwt(&json!({AUTH_CLAIM: {"chatgpt_account_id": "acct", "chatgpt_plan_type": "pro"}})),
            "access_token": jwt(&json!({"exp": 1000})),
            "refresh_token": "r"}, "last_refresh": "2025-01-01T00:00:00Z"});
        let t = Tokens::from_doc(&doc).expect("tokens");
        assert_eq!(t.account_id.as_deref(), Some("acct"));
        assert_eq!(t.plan.as_deref(), Some("pro"));
        let at = |s: i64| DateTime::from_timestamp(s, 0).expect("time");
        assert!(!t.due(at(1000 - MARGIN_S - 1)));
        assert!(t.due(at(1000 - MARGIN_S)));
        let g = t.grant();
        assert_eq!(g.headers[0].0, ACCOUNT_HEADER);
        assert_eq!(g.headers[0].1.expose(), "acct");
    }

    #[test]
    fn an_opaque_token_is_renewed_after_eight_days() {
        let doc = json!({"tokens": {"access_token": "opaque", "account_id": "a"},
                         "last_refresh": "2025-01-01T00:00:00Z"});
        let t = Tokens::from_doc(&doc).expect("tokens");
        let start = DateTime::parse_from_rfc3339("2025-01-01T00:00:00Z")
            .expect("t")
            .with_timezone(&Utc);
        assert!(!t.due(start + chrono::Duration::days(7)));
        assert!(t.due(start + chrono::Duration::days(9)));
    }
}
