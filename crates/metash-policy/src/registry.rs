//! The agent registry: discovers `manifest.toml` files in the project (`.meta/agents/*/`) and in the
//! user's config dir (`$XDG_CONFIG_HOME/metash/agents/*/`, default `~/.config/metash/agents/*/`),
//! validates them, resolves `entry` relative to the manifest, and records each agent as Registered
//! (seed 002 lifecycle) in the store's log once per new or changed manifest.
//!
//! The directories are parameters so tests never read the real home; [`AgentDirs::from_env`] is the
//! one place that looks at the environment, and it takes the lookup as a function.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use metash_protocol::LogKind;

use metash_protocol::Manifest;
use metash_store::{NewEvent, Store, StoreError};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::capability::Capability;
use crate::error::{PolicyError, Result};
use crate::manifest;

/// Where an agent was found. A project agent shadows a user agent of the same id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    Project,
    User,
}

/// The directories holding one sub-directory per agent.
#[derive(Debug, Clone)]
pub struct AgentDirs {
    pub project: PathBuf,
    pub user: Option<PathBuf>,
}

impl AgentDirs {
    /// `workspace/.meta/agents` and, when given, `config_home/metash/agents`.
    pub fn new(workspace: &Path, config_home: Option<&Path>) -> Self {
        Self {
            project: workspace.join(".meta").join("agents"),
            user: config_home.map(|c| c.join("metash").join("agents")),
        }
    }

    /// XDG: `$XDG_CONFIG_HOME` if set and absolute, else `$HOME/.config`; `var` is the environment
    /// lookup (pass `std::env::var_os` in the binary, a map in tests).
    pub fn from_env(workspace: &Path, var: impl Fn(&str) -> Option<OsString>) -> Self {
        let config = var("XDG_CONFIG_HOME")
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
            .or_else(|| var("HOME").map(|h| PathBuf::from(h).join(".config")));
        Self::new(workspace, config.as_deref())
    }
}

/// A valid, registered agent.
#[derive(Debug, Clone)]
pub struct Agent {
    /// The name of the directory holding the manifest: stable, file-name safe, used everywhere.
    pub id: String,
    pub source: Source,
    pub manifest_path: PathBuf,
    /// `entry`, resolved against the manifest's directory.
    pub entry_path: PathBuf,
    pub manifest: Manifest,
    /// SHA-256 of the manifest's bytes: a changed manifest is registered again.
    pub sha256: String,
    /// What the manifest declares, parsed (see [`manifest::declared`]).
    pub declared: Vec<Capability>,
}

impl Agent {
    /// Loads one manifest file; the agent's id is its directory's name.
    ///
    /// # Errors
    /// I/O, [`PolicyError::Manifest`] with every diagnostic, or an id that is not a safe name.
    pub fn load(path: &Path, source: Source) -> Result<Self> {
        let (m, bytes) = manifest::load(path)?;
        let dir = path.parent().unwrap_or(Path::new("."));
        let id = dir
            .file_name()
            .and_then(|n| n.to_str())
            .filter(|n| valid_id(n))
            .ok_or_else(|| {
                PolicyError::Invalid(format!(
                    "{}: the agent's directory name is its id and may hold only letters, digits and - _ . (not starting with `.`)",
                    path.display()
                ))
            })?
            .to_string();
        Ok(Self {
            id,
            source,
            manifest_path: path.to_path_buf(),
            entry_path: dir.join(&m.entry),
            declared: manifest::declared(&m),
            sha256: hex::encode(Sha256::digest(&bytes)),
            manifest: m,
        })
    }
}

fn valid_id(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 200
        && !n.starts_with('.')
        && n.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// A manifest that was found but is not usable, with why.
#[derive(Debug, Clone)]
pub struct Invalid {
    pub manifest_path: PathBuf,
    pub source: Source,
    pub error: String,
}

#[derive(Debug, Clone, Default)]
pub struct Registry {
    agents: BTreeMap<String, Agent>,
    invalid: Vec<Invalid>,
}

impl Registry {
    /// Scans both directories. Never fails as a whole: unreadable or invalid manifests are listed
    /// in [`Registry::invalid`] so one broken agent does not hide the others.
    pub fn discover(dirs: &AgentDirs) -> Self {
        let mut reg = Self::default();
        // User first, so a project agent of the same id replaces it.
        for (dir, source) in [
            (dirs.user.as_deref(), Source::User),
            (Some(dirs.project.as_path()), Source::Project),
        ] {
            let Some(dir) = dir else { continue };
            for path in manifest_files(dir) {
                match Agent::load(&path, source) {
                    Ok(agent) => {
                        reg.agents.insert(agent.id.clone(), agent);
                    }
                    Err(e) => reg.invalid.push(Invalid {
                        manifest_path: path,
                        source,
                        error: e.to_string(),
                    }),
                }
            }
        }
        reg
    }

    /// A registry of the given agents (tests, benchmarks, hosts that load manifests themselves).
    pub fn from_agents(agents: impl IntoIterator<Item = Agent>) -> Self {
        Self {
            agents: agents.into_iter().map(|a| (a.id.clone(), a)).collect(),
            invalid: Vec::new(),
        }
    }

    pub fn get(&self, id: &str) -> Option<&Agent> {
        self.agents.get(id)
    }

    pub fn agents(&self) -> impl Iterator<Item = &Agent> {
        self.agents.values()
    }

    pub fn invalid(&self) -> &[Invalid] {
        &self.invalid
    }

    /// Appends an `agent_registered` event for each agent whose manifest is new or changed since
    /// the last registration (tracked in `.meta/registry.json`), so the ledger shows
    /// registrations once, not on every scan. Returns the ids registered now.
    ///
    /// # Errors
    /// Store errors (lock timeout, I/O).
    pub fn record(&self, store: &Store) -> Result<Vec<String>> {
        let doc = store.read_doc(REGISTRY_DOC)?;
        let mut registered = Vec::new();
        for agent in self.agents.values() {
            if known_sha(&doc, &agent.id) == Some(agent.sha256.as_str()) {
                continue;
            }
            let result = store.update_doc(REGISTRY_DOC, |doc| {
                if known_sha(doc, &agent.id) == Some(agent.sha256.as_str()) {
                    return Err(StoreError::Rejected(ALREADY.into()));
                }
                let ts = crate::clock::rfc3339(chrono::Utc::now());
                if !doc.is_object() {
                    *doc = json!({"agents": {}});
                }
                if !doc["agents"].is_object() {
                    doc["agents"] = json!({});
                }
                doc["agents"][&agent.id] = json!({
                    "sha256": agent.sha256,
                    "manifest": agent.manifest_path,
                    "registered_at": ts,
                });
                Ok(NewEvent::new(
                    LogKind::AgentRegistered,
                    Some(&agent.id),
                    json!({
                        "id": agent.id,
                        "name": agent.manifest.name,
                        "version": agent.manifest.version,
                        "schema_version": agent.manifest.schema_version,
                        "sandbox": agent.manifest.sandbox,
                        "source": agent.source,
                        "manifest": agent.manifest_path,
                        "entry": agent.entry_path,
                        "sha256": agent.sha256,
                        "capabilities": agent.declared.iter().map(|c| c.to_string()).collect::<Vec<_>>(),
                    }),
                ))
            });
            match result {
                Ok(_) => registered.push(agent.id.clone()),
                Err(StoreError::Rejected(m)) if m == ALREADY => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(registered)
    }
}

const REGISTRY_DOC: &str = "registry";
const ALREADY: &str = "already registered";

fn known_sha<'a>(doc: &'a Value, id: &str) -> Option<&'a str> {
    doc.get("agents")?.get(id)?.get("sha256")?.as_str()
}

/// `dir/*/manifest.toml`, sorted; a missing dir has none.
fn manifest_files(dir: &Path) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = rd
        .filter_map(|e| e.ok())
        .map(|e| e.path().join("manifest.toml"))
        .filter(|p| p.is_file())
        .collect();
    out.sort();
    out
}
