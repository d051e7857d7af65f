//! Which backend holds a project's store: the files under `.meta/` (the default, no server), or
//! a PostgreSQL server when `.meta/config.toml` says so:
//!
//! ```toml
//! [store]
//! url = "postgres://metash@db.internal:5432/metash"   # never a password: METASH_STORE_PASSWORD
//! project = "shop"                                    # default: the workspace's directory name
//! ```
//!
//! `METASH_STORE_URL` and `METASH_STORE_PROJECT` stand in for those two keys (`metash worker
//! --store URL --project NAME` sets them for itself and its tasks).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use crate::error::{Result, StoreError};
use crate::pg::store::PgStore;

#[derive(Deserialize)]
struct ConfigFile {
    #[serde(default)]
    store: Option<StoreSection>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StoreSection {
    url: String,
    #[serde(default)]
    project: Option<String>,
}

/// Stands in for `[store] url`.
pub const URL_ENV: &str = "METASH_STORE_URL";
/// Stands in for `[store] project`.
pub const PROJECT_ENV: &str = "METASH_STORE_PROJECT";

/// `.meta/config.toml`'s `[store]`, if it has one.
fn configured(meta: &Path) -> Result<Option<StoreSection>> {
    let path = meta.join("config.toml");
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(StoreError::io(&path, e)),
    };
    if !text.contains("[store]") {
        return Ok(None);
    }
    let file: ConfigFile = toml::from_str(&text).map_err(|e| StoreError::BadFile {
        path: path.clone(),
        line: e.span().map_or(1, |s| {
            text[..s.start.min(text.len())].lines().count().max(1)
        }),
        message: e.message().to_string(),
    })?;
    Ok(file.store)
}

/// The PostgreSQL store `.meta/config.toml` (or the environment) names, connected; `None` for
/// the file backend.
///
/// # Errors
/// A `[store]` table that does not parse (file, line and message), a bad project name, or a
/// server that cannot be reached.
pub(crate) fn postgres(
    workspace: &Path,
    meta: &Path,
    lock_timeout: Duration,
) -> Result<Option<Arc<PgStore>>> {
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let section = match (env(URL_ENV), configured(meta)?) {
        (Some(url), file) => StoreSection {
            url,
            project: env(PROJECT_ENV).or(file.and_then(|f| f.project)),
        },
        (None, Some(mut file)) => {
            file.project = env(PROJECT_ENV).or(file.project);
            file
        }
        (None, None) => return Ok(None),
    };
    let project = match section.project {
        Some(p) => p,
        None => workspace
            .canonicalize()
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .unwrap_or_else(|| "project".into()),
    };
    crate::names::check(&project, "[store] project")?;
    let password = std::env::var(crate::pg::PASSWORD_ENV)
        .ok()
        .filter(|p| !p.is_empty());
    let store = PgStore::connect(&section.url, password, &project, lock_timeout)?;
    Ok(Some(Arc::new(store)))
}
