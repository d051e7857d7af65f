//! Secret redaction for ledger views and exports (seed 002 section 9: "exportable; secrets
//! redacted"). Three sources of secrets are recognised:
//!
//! 1. well-known token shapes anywhere in a string: `sk-ant-…`, `sk-…`, `ghp_…` (and `gho_`,
//!    `ghu_`, `ghs_`, `ghr_`), `github_pat_…`, `xox[bpoasr]-…`, AWS `AKIA…`/`ASIA…`, JWTs, the token
//!    after `Bearer `/`Basic `, and `NAME=value` where NAME looks like a secret (`*_KEY`, `*_TOKEN`,
//!    `*_SECRET`, `*PASSWORD*`), as in an env list or a command line;
//! 2. the whole value of an object key named like a secret (`*_key`, `*_token`, `*_secret`,
//!    `password`, `authorization`, `cookie`, ...), and the `value` beside a `key` so named (KV and
//!    state writes), and the `value` of any object marked `"source": "vault"`;
//! 3. values the host knows came from the vault ([`Redactor::with_known_secrets`]).
//!
//! Each secret becomes `[REDACTED:<kind>:<8 hex>]`, the hex a salted SHA-256 of the secret, so equal
//! secrets get equal markers (a reviewer can still see "the same key was used twice") while the
//! salt, kept per project in `.meta/redaction.json`, stops anyone from confirming a guessed secret
//! against an export.

use std::borrow::Cow;
use std::collections::HashSet;

use metash_protocol::LogKind;

use metash_protocol::LogRecord;
use regex::Regex;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::error::{PolicyError, Result};

/// Token shapes. Order matters only for readability: the kind is decided by [`shape_kind`].
const SHAPES: &[&str] = &[
    r"sk-ant-[A-Za-z0-9_\-]{8,}",
    r"sk-[A-Za-z0-9_\-]{16,}",
    r"github_pat_[A-Za-z0-9_]{20,}",
    r"gh[pousr]_[A-Za-z0-9]{20,}",
    r"xox[bpoasr]-[A-Za-z0-9\-]{10,}",
    r"(?:AKIA|ASIA)[0-9A-Z]{16}",
    r"eyJ[A-Za-z0-9_\-]{5,}\.[A-Za-z0-9_\-]{5,}\.[A-Za-z0-9_\-]{5,}",
    r"(?i:bearer|basic)[ \t]+[A-Za-z0-9._~+/=\-]{8,}",
    // `NAME=value`, `NAME: value`, `"NAME": "value"` (JSON inside a string), with an optional
    // auth scheme so `X_API_KEY: Bearer tok` is taken whole and the token cannot slip past.
    r"[A-Za-z0-9_]*(?i:_key|_token|_secret|password|passwd|apikey)\x22?[ \t]*[=:][ \t]*\x22?(?:(?i:bearer|basic|token)[ \t]+)?[^\s\x22',;&]{4,}",
];

/// Kind of a secret by its own shape, so the same secret gets the same marker wherever it is.
pub fn shape_kind(s: &str) -> Option<&'static str> {
    Some(if s.starts_with("sk-ant-") {
        "anthropic_key"
    } else if s.starts_with("sk-") {
        "openai_key"
    } else if s.starts_with("github_pat_") {
        "github_pat"
    } else if s.len() > 4 && s.starts_with("gh") && s.as_bytes().get(3) == Some(&b'_') {
        "github_token"
    } else if s.starts_with("xox") {
        "slack_token"
    } else if s.starts_with("AKIA") || s.starts_with("ASIA") {
        "aws_access_key"
    } else if s.starts_with("eyJ") && s.matches('.').count() == 2 {
        "jwt"
    } else {
        return None;
    })
}

/// Whether an object key names a secret.
pub fn secret_key(key: &str) -> bool {
    let k = key.to_ascii_lowercase().replace('-', "_");
    k.ends_with("_key")
        || k.ends_with("_token")
        || k.ends_with("_secret")
        || k.contains("password")
        || k.contains("passwd")
        || matches!(
            k.as_str(),
            "authorization"
                | "proxy_authorization"
                | "token"
                | "secret"
                | "apikey"
                | "cookie"
                | "set_cookie"
                | "credentials"
        )
}

#[derive(Debug, Clone)]
pub struct Redactor {
    salt: Vec<u8>,
    re: Regex,
    known: HashSet<String>,
}

impl Redactor {
    /// A redactor whose markers are salted with `salt`.
    pub fn new(salt: &[u8]) -> Self {
        let re = Self::pattern(&HashSet::new());
        Self {
            salt: salt.to_vec(),
            re,
            known: HashSet::new(),
        }
    }

    /// Also redacts these exact values (secrets the host fetched from the vault), kind `vault`.
    /// Values shorter than 4 bytes are ignored (they would redact ordinary text).
    pub fn with_known_secrets(mut self, secrets: impl IntoIterator<Item = String>) -> Self {
        self.known
            .extend(secrets.into_iter().filter(|s| s.len() >= 4));
        self.re = Self::pattern(&self.known);
        self
    }

    /// One alternation of every known secret (longest first, so one containing another is
    /// replaced whole) and every shape, so a string is scanned once.
    fn pattern(known: &HashSet<String>) -> Regex {
        let mut lits: Vec<&String> = known.iter().collect();
        lits.sort_by_key(|s| std::cmp::Reverse(s.len()));
        let mut alts: Vec<String> = lits.iter().map(|s| regex::escape(s)).collect();
        alts.extend(SHAPES.iter().map(|s| format!(r"(?-u:\b){s}")));
        match Regex::new(&alts.join("|")) {
            Ok(re) => re,
            // Only a size limit can fail (an enormous known-secret list): fall back to the shapes.
            Err(_) => shapes_only(),
        }
    }

    /// `[REDACTED:<kind>:<8 hex>]` for `secret` (kind from its shape when it has one).
    pub fn marker(&self, secret: &str, default_kind: &str) -> String {
        let kind = if self.known.contains(secret) {
            "vault"
        } else {
            shape_kind(secret).unwrap_or(default_kind)
        };
        let mut h = Sha256::new();
        h.update(&self.salt);
        h.update(secret.as_bytes());
        let digest = h.finalize();
        format!("[REDACTED:{kind}:{}]", hex::encode(&digest[..4]))
    }

    /// `s` with every recognised secret replaced; borrowed when there is none.
    pub fn redact_str<'a>(&self, s: &'a str) -> Cow<'a, str> {
        if !self.re.is_match(s) {
            return Cow::Borrowed(s);
        }
        Cow::Owned(
            self.re
                .replace_all(s, |caps: &regex::Captures<'_>| {
                    let m = caps.get(0).map(|m| m.as_str()).unwrap_or("");
                    self.replace_match(m)
                })
                .into_owned(),
        )
    }

    /// Keeps the prefix of `Bearer X` and `NAME=X` matches, replaces the secret part.
    fn replace_match(&self, m: &str) -> String {
        if self.known.contains(m) || shape_kind(m).is_some() {
            return self.marker(m, "secret");
        }
        let lower = m.get(..6).map(str::to_ascii_lowercase).unwrap_or_default();
        if lower.starts_with("bearer") || lower.starts_with("basic") {
            if let Some(i) = m.find([' ', '\t']) {
                let token = m[i..].trim_start();
                let prefix = &m[..m.len() - token.len()];
                return format!("{prefix}{}", self.marker(token, "token"));
            }
        }
        if let Some(i) = m.find(['=', ':']) {
            let mut value = m[i + 1..].trim_start().trim_start_matches('"');
            let lower = value
                .get(..7)
                .map(str::to_ascii_lowercase)
                .unwrap_or_default();
            for scheme in ["bearer", "basic", "token"] {
                if lower.starts_with(scheme) && value[scheme.len()..].starts_with([' ', '\t']) {
                    value = value[scheme.len()..].trim_start();
                }
            }
            let prefix = &m[..m.len() - value.len()];
            return format!("{prefix}{}", self.marker(value, "secret"));
        }
        self.marker(m, "secret")
    }

    /// Redacts a JSON value in place (see the module doc for the rules).
    pub fn redact_value(&self, v: &mut Value) {
        match v {
            Value::String(s) => {
                if let Cow::Owned(r) = self.redact_str(s) {
                    *s = r;
                }
            }
            Value::Array(a) => a.iter_mut().for_each(|x| self.redact_value(x)),
            Value::Object(o) => {
                let vault = o.get("source").and_then(Value::as_str) == Some("vault");
                let kv_secret = o.get("key").and_then(Value::as_str).is_some_and(|k| {
                    secret_key(k) || k.rsplit(['.', '/']).next().is_some_and(secret_key)
                });
                for (k, x) in o.iter_mut() {
                    if secret_key(k) || (k == "value" && (vault || kv_secret)) {
                        self.redact_whole(x, if vault { "vault" } else { "secret" });
                    } else {
                        self.redact_value(x);
                    }
                }
            }
            _ => {}
        }
    }

    /// Every scalar under `v` becomes a marker.
    fn redact_whole(&self, v: &mut Value, kind: &str) {
        match v {
            Value::Null => {}
            Value::String(s) if s.is_empty() || s.starts_with("[REDACTED:") => {}
            Value::String(s) => *s = self.marker(s, kind),
            Value::Bool(_) | Value::Number(_) => {
                *v = Value::String(self.marker(&v.to_string(), kind))
            }
            Value::Array(a) => a.iter_mut().for_each(|x| self.redact_whole(x, kind)),
            Value::Object(o) => o.values_mut().for_each(|x| self.redact_whole(x, kind)),
        }
    }

    /// A copy of `rec` with its data (and agent, for safety) redacted. `hash`/`prev` are the
    /// original record's, so an export can be matched against the log but not re-verified.
    pub fn redact_record(&self, rec: &LogRecord) -> LogRecord {
        let mut out = rec.clone();
        self.redact_value(&mut out.data);
        if let Some(a) = &out.agent {
            if let Cow::Owned(r) = self.redact_str(a) {
                out.agent = Some(r);
            }
        }
        out
    }
}

fn shapes_only() -> Regex {
    let alts: Vec<String> = SHAPES.iter().map(|s| format!(r"(?-u:\b){s}")).collect();
    #[allow(clippy::expect_used)]
    Regex::new(&alts.join("|")).expect("the constant shape patterns compile (checked by tests)")
}

/// The project's redactor if its salt exists, without creating it: for output paths that must
/// not write to the project (an error message, `log tail`, a server's replies).
///
/// # Errors
/// Store errors reading `.meta/redaction.json`.
pub fn existing_project_redactor(store: &metash_store::Store) -> Result<Option<Redactor>> {
    let doc = store.read_doc(SALT_DOC)?;
    Ok(doc
        .get("salt")
        .and_then(Value::as_str)
        .and_then(|s| hex::decode(s).ok())
        .map(|salt| Redactor::new(&salt)))
}

const SALT_DOC: &str = "redaction";

/// The project's redactor: its salt lives in `.meta/redaction.json`, created (with a
/// `redaction_salt_created` event, never holding the salt) on first use.
///
/// # Errors
/// Store errors.
pub fn project_redactor(store: &metash_store::Store) -> Result<Redactor> {
    const DOC: &str = SALT_DOC;
    let salt = |doc: &Value| {
        doc.get("salt")
            .and_then(Value::as_str)
            .and_then(|s| hex::decode(s).ok())
    };
    if let Some(s) = salt(&store.read_doc(DOC)?) {
        return Ok(Redactor::new(&s));
    }
    let fresh = format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    );
    let mut chosen = None;
    let result = store.update_doc(DOC, |doc| {
        if let Some(s) = salt(doc) {
            chosen = Some(s);
            return Err(metash_store::StoreError::Rejected(ALREADY.into()));
        }
        *doc = serde_json::json!({"salt": fresh});
        Ok(metash_store::NewEvent::new(
            LogKind::RedactionSaltCreated,
            None,
            serde_json::json!({}),
        ))
    });
    match result {
        Ok(_) => {}
        Err(metash_store::StoreError::Rejected(m)) if m == ALREADY => {}
        Err(e) => return Err(PolicyError::from(e)),
    }
    let salt = chosen
        .or_else(|| hex::decode(&fresh).ok())
        .unwrap_or_default();
    Ok(Redactor::new(&salt))
}

const ALREADY: &str = "redaction salt exists";
