//! The non-interactive consent policy file (TOML), for scripts and CI:
//!
//! ```toml
//! schema_version = "0.1"
//!
//! [[allow]]
//! agent = "*"                  # an agent id, or "*" for all
//! capability = "files.read"    # covers narrower requests (files.read:src/...)
//! duration_s = 3600            # optional: record a grant for this long; absent = allow once
//! sensitive = false            # optional: also answer sensitive actions (default false)
//!
//! [[deny]]
//! agent = "*"
//! capability = "network"
//! ```
//! Deny rules win over allow rules and over `--yes-to`; a request no rule matches is denied.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::capability::Capability;
use crate::error::{PolicyError, Result};
use crate::manifest::line_col;
use crate::question::{Answer, ConsentQuestion};

pub const POLICY_SCHEMA_VERSIONS: &[&str] = &["0.1"];

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    pub agent: String,
    pub capability: Capability,
    #[serde(default)]
    pub duration_s: Option<u64>,
    #[serde(default)]
    pub sensitive: bool,
}

impl Rule {
    fn matches(&self, q: &ConsentQuestion) -> bool {
        (self.agent == "*" || self.agent == q.agent) && self.capability.covers(&q.capability)
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyFile {
    pub schema_version: String,
    #[serde(default)]
    pub allow: Vec<Rule>,
    #[serde(default)]
    pub deny: Vec<Rule>,
    #[serde(skip)]
    pub path: PathBuf,
}

impl PolicyFile {
    /// # Errors
    /// I/O, or [`PolicyError::PolicyFile`] with line and column.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| PolicyError::io(path, e))?;
        Self::parse(path, &text)
    }

    /// # Errors
    /// [`PolicyError::PolicyFile`] with line and column of the problem.
    pub fn parse(path: &Path, text: &str) -> Result<Self> {
        let err = |offset: usize, message: String| {
            let (l, c) = line_col(text, offset);
            PolicyError::PolicyFile {
                path: path.to_path_buf(),
                message: format!("{l}:{c}: {message}"),
            }
        };
        let mut p: PolicyFile = toml_edit::de::from_str(text).map_err(|e| {
            err(
                e.span().map(|s| s.start).unwrap_or(0),
                e.message().trim().to_string(),
            )
        })?;
        if !POLICY_SCHEMA_VERSIONS.contains(&p.schema_version.as_str()) {
            return Err(err(
                0,
                format!(
                    "unsupported schema_version \"{}\"; this build supports {}",
                    p.schema_version,
                    POLICY_SCHEMA_VERSIONS.join(", ")
                ),
            ));
        }
        p.path = path.to_path_buf();
        Ok(p)
    }

    pub(crate) fn denies(&self, q: &ConsentQuestion) -> bool {
        self.deny.iter().any(|r| r.matches(q))
    }

    pub(crate) fn answer(&self, q: &ConsentQuestion) -> Option<Answer> {
        self.allow
            .iter()
            .find(|r| r.matches(q) && (q.sensitive.is_none() || r.sensitive))
            .map(|r| match r.duration_s {
                Some(d) if d > 0 => Answer::AllowFor(d),
                _ => Answer::AllowOnce,
            })
    }
}
