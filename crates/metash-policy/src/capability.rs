//! The capability grammar (seed 002 section 2) and what "declared `X` covers requested `Y`" means.
//!
//! ```text
//! capability := category [ ":" scope ]
//! files.read[:PATH]  files.write[:PATH]   PATH relative to the workspace (or absolute), no `..`
//! network[:HOST[:PORT]]                   HOST exact, or `*.example.com` for any subdomain
//! process.spawn[:PROGRAM]                 starting an external process
//! media.preview  codegen  memory  native  no scope
//! oauth:PROVIDER.SCOPE                    scope required, e.g. oauth:github.repo
//! ```
//! An unscoped capability covers every scope of its category; a scoped one covers only requests
//! inside its scope. Parsing is strict so a typo in a manifest is an error, not a silent deny.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

pub use metash_protocol::capability::Category;

/// A parsed capability: category plus optional scope (normalised: hosts lowercased, paths without a
/// trailing `/`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Capability {
    pub category: Category,
    pub scope: Option<String>,
}

impl Capability {
    pub fn new(category: Category, scope: Option<&str>) -> Self {
        Self {
            category,
            scope: scope.map(str::to_string),
        }
    }

    /// Whether this (declared or granted) capability covers `req`.
    pub fn covers(&self, req: &Capability) -> bool {
        if self.category != req.category {
            return false;
        }
        let (mine, theirs) = match (&self.scope, &req.scope) {
            (None, _) => return true,
            (Some(_), None) => return false,
            (Some(a), Some(b)) => (a.as_str(), b.as_str()),
        };
        match self.category {
            Category::Network => host_covers(mine, theirs),
            Category::FilesRead | Category::FilesWrite => path_covers(mine, theirs),
            // `process.spawn:git` names the program wherever it was found; a scope with a `/`
            // names exactly that path.
            Category::ProcessSpawn => {
                mine == theirs || (!mine.contains('/') && theirs.rsplit('/').next() == Some(mine))
            }
            _ => mine == theirs,
        }
    }
}

impl fmt::Display for Capability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.scope {
            Some(s) => write!(f, "{}:{s}", self.category.as_str()),
            None => f.write_str(self.category.as_str()),
        }
    }
}

impl Serialize for Capability {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Capability {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl FromStr for Capability {
    type Err = String;

    /// # Errors
    /// What was expected, with the nearest category name when the category is unknown.
    fn from_str(s: &str) -> Result<Self, String> {
        let (cat, scope) = match s.split_once(':') {
            Some((c, sc)) => (c, Some(sc)),
            None => (s, None),
        };
        let Some(category) = Category::ALL.iter().copied().find(|c| c.as_str() == cat) else {
            let names = Category::names();
            let hint = crate::suggest::nearest(cat, &names)
                .map(|n| format!(" (did you mean `{n}`?)"))
                .unwrap_or_default();
            return Err(format!(
                "unknown capability category `{cat}`{hint}; expected one of {}",
                names.join(", ")
            ));
        };
        let scope = match (category, scope) {
            (_, None) if category == Category::Oauth => {
                return Err(
                    "`oauth` needs a scope: `oauth:PROVIDER.SCOPE`, e.g. `oauth:github.repo`"
                        .into(),
                )
            }
            (_, None) => None,
            (
                Category::MediaPreview | Category::Codegen | Category::Memory | Category::Native,
                Some(_),
            ) => {
                return Err(format!("`{cat}` takes no scope"));
            }
            (Category::Network, Some(h)) => Some(parse_host(h)?),
            (Category::FilesRead | Category::FilesWrite, Some(p)) => Some(parse_path(p)?),
            (Category::ProcessSpawn, Some(p)) => Some(parse_word(p, "a program name")?.to_string()),
            (Category::Oauth, Some(p)) => Some(parse_oauth(p)?),
        };
        Ok(Self { category, scope })
    }
}

fn parse_word<'a>(s: &'a str, what: &str) -> Result<&'a str, String> {
    if s.is_empty() || s.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!("expected {what} without spaces, found `{s}`"));
    }
    Ok(s)
}

/// `api.github.com`, `*.example.com`, `localhost:8080`, `10.0.0.1`; lowercased.
fn parse_host(s: &str) -> Result<String, String> {
    let bad = || {
        format!("expected a host such as `api.github.com`, `*.example.com` or `localhost:8080`, found `{s}`")
    };
    let (host, port) = match s.rsplit_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (s, None),
    };
    if let Some(p) = port {
        if p.parse::<u16>().map(|p| p == 0).unwrap_or(true) {
            return Err(bad());
        }
    }
    let rest = host.strip_prefix("*.").unwrap_or(host);
    if rest.is_empty() || rest.len() > 253 {
        return Err(bad());
    }
    for label in rest.split('.') {
        let ok = !label.is_empty()
            && label.len() <= 63
            && !label.starts_with('-')
            && !label.ends_with('-')
            && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-');
        if !ok {
            return Err(bad());
        }
    }
    Ok(s.to_ascii_lowercase())
}

/// A relative (to the workspace) or absolute path without `.`/`..` components; trailing `/` dropped.
fn parse_path(s: &str) -> Result<String, String> {
    if s.is_empty() || s.chars().any(char::is_control) {
        return Err(format!(
            "expected a path such as `src/` or `/tmp/out`, found `{s}`"
        ));
    }
    if s.split('/').any(|c| c == ".." || c == ".") {
        return Err(format!(
            "a path scope may not contain `.` or `..` components, found `{s}`"
        ));
    }
    let trimmed = s.trim_end_matches('/');
    Ok(if trimmed.is_empty() {
        "/".into()
    } else {
        trimmed.to_string()
    })
}

/// `PROVIDER.SCOPE`, the provider lowercase letters/digits/`-`/`_`.
fn parse_oauth(s: &str) -> Result<String, String> {
    let bad = || {
        format!("expected `oauth:PROVIDER.SCOPE` such as `oauth:github.repo`, found `oauth:{s}`")
    };
    let (provider, scope) = s.split_once('.').ok_or_else(bad)?;
    let provider_ok = !provider.is_empty()
        && provider
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
    if !provider_ok || parse_word(scope, "an OAuth scope").is_err() {
        return Err(bad());
    }
    Ok(s.to_string())
}

/// `*.example.com` covers any subdomain (not the apex); a pattern without a port covers every port.
fn host_covers(pattern: &str, host: &str) -> bool {
    let split = |s: &str| -> (String, Option<String>) {
        match s.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), Some(p.to_string())),
            None => (s.to_string(), None),
        }
    };
    let (ph, pp) = split(pattern);
    let (hh, hp) = split(host);
    if pp.is_some() && pp != hp {
        return false;
    }
    match ph.strip_prefix("*.") {
        Some(suffix) => {
            let dotted = format!(".{suffix}");
            match hh.strip_prefix("*.") {
                // A wildcard request is covered by an equal or wider wildcard.
                Some(sub) => sub == suffix || sub.ends_with(&dotted),
                None => hh.ends_with(&dotted),
            }
        }
        None => ph == hh,
    }
}

/// `docs` covers `docs` and `docs/a/b`, never `docs2`.
fn path_covers(prefix: &str, path: &str) -> bool {
    prefix == "/"
        || path == prefix
        || (path.starts_with(prefix) && path[prefix.len()..].starts_with('/'))
}

/// An OAuth scope as `oauth_scopes` writes it (`github:repo`), as a capability (`oauth:github.repo`).
///
/// # Errors
/// What was expected.
pub fn oauth_scope_capability(scope: &str) -> Result<Capability, String> {
    let (provider, rest) = scope.split_once(':').ok_or_else(|| {
        format!("expected `PROVIDER:SCOPE` such as `github:repo`, found `{scope}`")
    })?;
    format!("oauth:{provider}.{rest}")
        .parse()
        .map_err(|_| format!("expected `PROVIDER:SCOPE` such as `github:repo`, found `{scope}`"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cap(s: &str) -> Capability {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn parses_the_seed_categories_and_scopes() {
        for s in [
            "files.read",
            "files.write:docs",
            "network",
            "network:api.github.com",
            "network:*.example.com",
            "network:localhost:8080",
            "media.preview",
            "codegen",
            "memory",
            "oauth:github.repo",
            "oauth:google.drive.readonly",
            "process.spawn:git",
        ] {
            assert_eq!(cap(s).to_string(), s);
        }
        for bad in [
            "",
            "net",
            "files",
            "oauth",
            "oauth:github",
            "codegen:x",
            "network:",
            "network:a b",
            "network:-x.com",
            "files.read:../etc",
            "network:x.com:0",
        ] {
            assert!(bad.parse::<Capability>().is_err(), "{bad}");
        }
        let e = "netwrok".parse::<Capability>().err().unwrap_or_default();
        assert!(e.contains("did you mean `network`"), "{e}");
    }

    #[test]
    fn coverage() {
        // A program name covers that program wherever it is; a path only that path.
        assert!(cap("process.spawn:git").covers(&cap("process.spawn:/usr/bin/git")));
        assert!(!cap("process.spawn:git").covers(&cap("process.spawn:/usr/bin/gitk")));
        assert!(cap("process.spawn:/usr/bin/git").covers(&cap("process.spawn:/usr/bin/git")));
        assert!(!cap("process.spawn:/usr/bin/git").covers(&cap("process.spawn:/tmp/git")));
        assert!(cap("network").covers(&cap("network:api.github.com")));
        assert!(cap("network:api.github.com").covers(&cap("network:api.github.com")));
        assert!(!cap("network:api.github.com").covers(&cap("network")));
        assert!(!cap("network:api.github.com").covers(&cap("network:evil.com")));
        assert!(cap("network:*.example.com").covers(&cap("network:a.b.example.com")));
        assert!(!cap("network:*.example.com").covers(&cap("network:example.com")));
        assert!(!cap("network:*.example.com").covers(&cap("network:badexample.com")));
        assert!(cap("network:*.example.com").covers(&cap("network:api.example.com:443")));
        assert!(!cap("network:x.com:80").covers(&cap("network:x.com:443")));
        assert!(cap("files.write:docs").covers(&cap("files.write:docs/a.md")));
        assert!(!cap("files.write:docs").covers(&cap("files.write:docs2/a.md")));
        assert!(!cap("files.read").covers(&cap("files.write")));
        assert_eq!(
            oauth_scope_capability("github:repo").ok(),
            Some(cap("oauth:github.repo"))
        );
    }
}
