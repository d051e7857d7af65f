//! OAuth providers: `[oauth.providers.NAME]` in `.meta/config.toml`, each just data (a preset
//! fills the well-known endpoints of a common provider; an `issuer` is looked up by discovery).
//!
//! ```toml
//! [oauth.providers.github]
//! preset = "github"
//! client_id = "Iv1.0123456789abcdef"     # your OAuth app's
//!
//! [oauth.providers.corp]
//! issuer = "https://login.example.com"   # endpoints from .well-known discovery
//! client_id = "metash"
//! scopes = ["openid", "offline_access", "read"]
//! api_bases = ["https://api.example.com/"]
//! ```

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;
use url::Url;

use crate::error::{AuthError, Result};

/// One provider, with everything a flow needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Provider {
    pub name: String,
    pub client_id: String,
    pub issuer: Option<Url>,
    pub authorization_url: Option<Url>,
    pub token_url: Option<Url>,
    pub device_authorization_url: Option<Url>,
    pub revocation_url: Option<Url>,
    pub introspection_url: Option<Url>,
    /// Asked for when the login names none.
    pub scopes: Vec<String>,
    /// The APIs a token of this provider is for: the credential proxy adds it to requests to
    /// these bases only.
    pub api_bases: Vec<Url>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Section {
    preset: Option<String>,
    client_id: Option<String>,
    issuer: Option<String>,
    authorization_url: Option<String>,
    token_url: Option<String>,
    device_authorization_url: Option<String>,
    revocation_url: Option<String>,
    introspection_url: Option<String>,
    #[serde(default)]
    scopes: Option<Vec<String>>,
    #[serde(default)]
    api_bases: Option<Vec<String>>,
}

#[derive(Debug, Default, Deserialize)]
struct OauthSection {
    #[serde(default)]
    providers: BTreeMap<String, Section>,
}

#[derive(Debug, Default, Deserialize)]
struct File {
    #[serde(default)]
    oauth: OauthSection,
}

/// The presets: name, authorization, token, device, revocation, default scopes, API base.
const PRESETS: &[(&str, &str, &str, &str, &str, &str, &str)] = &[
    (
        "github",
        "https://github.com/login/oauth/authorize",
        "https://github.com/login/oauth/access_token",
        "https://github.com/login/device/code",
        "",
        "repo",
        "https://api.github.com/",
    ),
    (
        "google",
        "https://accounts.google.com/o/oauth2/v2/auth",
        "https://oauth2.googleapis.com/token",
        "https://oauth2.googleapis.com/device/code",
        "https://oauth2.googleapis.com/revoke",
        "openid email",
        "https://www.googleapis.com/",
    ),
    (
        "gitlab",
        "https://gitlab.com/oauth/authorize",
        "https://gitlab.com/oauth/token",
        "https://gitlab.com/oauth/authorize_device",
        "https://gitlab.com/oauth/revoke",
        "read_api",
        "https://gitlab.com/api/",
    ),
];

/// The presets' names, for messages.
pub fn preset_names() -> String {
    PRESETS.iter().map(|p| p.0).collect::<Vec<_>>().join(", ")
}

fn url(provider: &str, field: &str, s: &str) -> Result<Url> {
    Url::parse(s).map_err(|e| {
        AuthError::Config(format!("[oauth.providers.{provider}] {field} = {s:?}: {e}"))
    })
}

fn opt_url(provider: &str, field: &str, s: Option<&str>) -> Result<Option<Url>> {
    s.filter(|s| !s.is_empty())
        .map(|s| url(provider, field, s))
        .transpose()
}

impl Provider {
    /// Every provider configured in the project at `root`.
    ///
    /// # Errors
    /// The file does not parse, or a section is wrong (named, with the reason).
    pub fn configured(root: &Path) -> Result<BTreeMap<String, Provider>> {
        let path = root.join(".meta/config.toml");
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
            Err(e) => return Err(AuthError::io(path.display().to_string(), e)),
        };
        let file: File = toml::from_str(&text).map_err(|e| {
            let line = e
                .span()
                .map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1)
                .unwrap_or(1);
            AuthError::Config(format!("{}:{line}: {}", path.display(), e.message()))
        })?;
        file.oauth
            .providers
            .into_iter()
            .map(|(name, s)| Self::from_section(&name, s).map(|p| (name, p)))
            .collect()
    }

    /// Provider `name` of the project at `root`.
    ///
    /// # Errors
    /// Not configured, or configured wrongly.
    pub fn named(root: &Path, name: &str) -> Result<Provider> {
        Self::configured(root)?
            .remove(name)
            .ok_or_else(|| AuthError::UnknownProvider(name.to_string(), preset_names()))
    }

    fn from_section(name: &str, s: Section) -> Result<Provider> {
        let preset = match s.preset.as_deref() {
            Some(p) => Some(PRESETS.iter().find(|x| x.0 == p).ok_or_else(|| {
                AuthError::Config(format!(
                    "[oauth.providers.{name}] preset = {p:?}: not one of {}",
                    preset_names()
                ))
            })?),
            None => None,
        };
        let pick = |own: &Option<String>, from_preset: Option<&str>| {
            own.clone().or(from_preset.map(str::to_string))
        };
        let client_id = s
            .client_id
            .clone()
            .filter(|c| !c.is_empty())
            .ok_or_else(|| {
                AuthError::Config(format!(
                    "[oauth.providers.{name}] needs client_id (your OAuth application's)"
                ))
            })?;
        let p = Provider {
            name: name.to_string(),
            client_id,
            issuer: opt_url(name, "issuer", s.issuer.as_deref())?,
            authorization_url: opt_url(
                name,
                "authorization_url",
                pick(&s.authorization_url, preset.map(|p| p.1)).as_deref(),
            )?,
            token_url: opt_url(
                name,
                "token_url",
                pick(&s.token_url, preset.map(|p| p.2)).as_deref(),
            )?,
            device_authorization_url: opt_url(
                name,
                "device_authorization_url",
                pick(&s.device_authorization_url, preset.map(|p| p.3)).as_deref(),
            )?,
            revocation_url: opt_url(
                name,
                "revocation_url",
                pick(&s.revocation_url, preset.map(|p| p.4)).as_deref(),
            )?,
            introspection_url: opt_url(name, "introspection_url", s.introspection_url.as_deref())?,
            scopes: s.scopes.clone().unwrap_or_else(|| {
                preset
                    .map(|p| p.5.split(' ').map(str::to_string).collect())
                    .unwrap_or_default()
            }),
            api_bases: match &s.api_bases {
                Some(v) => v
                    .iter()
                    .map(|b| url(name, "api_bases", b))
                    .collect::<Result<_>>()?,
                None => preset
                    .map(|p| url(name, "api_bases", p.6))
                    .transpose()?
                    .into_iter()
                    .collect(),
            },
        };
        if p.issuer.is_none() && p.token_url.is_none() {
            return Err(AuthError::Config(format!(
                "[oauth.providers.{name}] needs an issuer (for discovery) or a token_url"
            )));
        }
        Ok(p)
    }

    /// Fills the endpoints this provider does not name from its issuer's discovery document
    /// (`/.well-known/openid-configuration`, else `/.well-known/oauth-authorization-server`).
    pub(crate) fn discovered(mut self, doc: &serde_json::Value) -> Result<Self> {
        let get = |k: &str| doc.get(k).and_then(|v| v.as_str()).map(str::to_string);
        let name = self.name.clone();
        let fill = |slot: &mut Option<Url>, key: &str| -> Result<()> {
            if slot.is_none() {
                *slot = opt_url(&name, key, get(key).as_deref())?;
            }
            Ok(())
        };
        fill(&mut self.authorization_url, "authorization_endpoint")?;
        fill(&mut self.token_url, "token_endpoint")?;
        fill(
            &mut self.device_authorization_url,
            "device_authorization_endpoint",
        )?;
        fill(&mut self.revocation_url, "revocation_endpoint")?;
        fill(&mut self.introspection_url, "introspection_endpoint")?;
        Ok(self)
    }
}
