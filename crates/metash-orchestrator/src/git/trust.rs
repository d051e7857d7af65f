//! Git trust: metash's git runs nothing an agent could have planted.
//!
//! Git runs programs named in the repository's own configuration: filter, diff and merge
//! drivers, textconv, `core.fsmonitor`, hooks, and more ([`keys`]). metash's own git calls turn
//! off hooks and fsmonitor, but a filter or merge driver must keep working as the user set it up
//! (git-lfs), so they cannot simply be turned off. Instead metash records that configuration as
//! a person accepted it (`.meta/git-trust.json`, which no agent can write: `.meta/` is masked
//! from every sandbox), and before every git operation checks that it is still the same: a
//! change (a planted filter, fsmonitor or hook) stops metash before git runs anything, naming
//! each changed key and file, until a person accepts it with `metash git trust`.
//!
//! The check is cheap: a [`stat::Watch`] fingerprint of the files read; the configuration is
//! read again only when one of them changed. docs/orchestrator.md, "Git trust".

pub mod change;
mod keys;
mod scan;
mod stat;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

pub use change::{printable, Change, ChangeKind, ConfigMap};
use scan::{Layout, Scanner};
use stat::Watch;

use crate::error::{OrchestratorError, Result};

/// The trusted snapshot's file in `.meta/`.
pub const TRUST_FILE: &str = "git-trust.json";

/// The snapshot format this build writes and reads.
const SCHEMA_VERSION: u32 = 1;

/// The repository's executable git configuration at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    pub schema_version: u32,
    /// Executable keys by config file (relative to the project when inside it), each with its
    /// values in file order.
    #[serde(default)]
    pub config: ConfigMap,
    /// Hooks and attributes files: the file -> `sha256:<hex>` (`, executable` when git may run
    /// it; `symlink to T; ` first for a link).
    #[serde(default)]
    pub files: BTreeMap<String, String>,
}

impl Snapshot {
    /// What differs from `self` in `newer`, each key and file named.
    pub fn changes_to(&self, newer: &Snapshot) -> Vec<Change> {
        change::diff(&self.config, &newer.config, &self.files, &newer.files)
    }
}

/// `.meta/git-trust.json` of the project at `root`.
pub fn trust_file(root: &Path) -> PathBuf {
    root.join(".meta").join(TRUST_FILE)
}

/// The trusted snapshot; `None` when none was recorded.
///
/// # Errors
/// The file cannot be read, does not parse, or is newer than this build.
pub fn load(root: &Path) -> Result<Option<Snapshot>> {
    let path = trust_file(root);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(OrchestratorError::io(path.display().to_string(), e)),
    };
    let broken = |message: String| OrchestratorError::Config {
        path: path.clone(),
        message: format!(
            "{message}; no git runs here until it reads (after removing it, `metash git \
             trust` shows the configuration and records it anew)"
        ),
    };
    let snap: Snapshot = serde_json::from_slice(&bytes).map_err(|e| broken(e.to_string()))?;
    if snap.schema_version == 0 || snap.schema_version > SCHEMA_VERSION {
        return Err(broken(format!(
            "schema_version {} is not one this build reads (1 to {SCHEMA_VERSION})",
            snap.schema_version
        )));
    }
    Ok(Some(snap))
}

/// Records `snap` as the trusted snapshot (atomically, made durable).
///
/// # Errors
/// `.meta/` is missing or cannot be written.
pub fn save(root: &Path, snap: &Snapshot) -> Result<()> {
    let mut snap = snap.clone();
    snap.schema_version = SCHEMA_VERSION;
    let mut bytes = serde_json::to_vec_pretty(&snap)
        .map_err(|e| OrchestratorError::Refused(format!("cannot encode the snapshot: {e}")))?;
    bytes.push(b'\n');
    metash_store::atomic::write_atomic(&trust_file(root), &bytes)?;
    Ok(())
}

/// What the configuration is now, and where it lives where agents write; `None` outside a
/// repository.
pub fn current(root: &Path) -> Option<(Snapshot, Vec<String>)> {
    let layout = Layout::discover(root)?;
    let scan = Scanner::default().scan(&layout);
    Some((snapshot_of(scan.config, scan.files), scan.warnings))
}

fn snapshot_of(config: ConfigMap, files: BTreeMap<String, String>) -> Snapshot {
    Snapshot {
        schema_version: SCHEMA_VERSION,
        config,
        files,
    }
}

/// The configuration as trusted and as it is, for a person to look at (`metash git trust`).
#[derive(Debug, Clone, Serialize)]
pub struct Review {
    /// `None`: nothing was recorded yet (every entry of `current` shows as added).
    pub trusted: Option<Snapshot>,
    pub current: Snapshot,
    pub changes: Vec<Change>,
    /// Executable configuration inside a work tree (where agents write), changed or not.
    pub warnings: Vec<String>,
}

/// Compares the trusted snapshot with the configuration now; `None` outside a repository.
///
/// # Errors
/// The trusted snapshot cannot be read.
pub fn review(root: &Path) -> Result<Option<Review>> {
    let trusted = load(root)?;
    let Some((current, warnings)) = current(root) else {
        return Ok(None);
    };
    let changes = trusted.clone().unwrap_or_default().changes_to(&current);
    Ok(Some(Review {
        trusted,
        current,
        changes,
        warnings,
    }))
}

/// Records what the person looked at (`review.current`, not a newer state) as trusted.
///
/// # Errors
/// As [`save`].
pub fn accept(root: &Path, review: &Review) -> Result<()> {
    save(root, &review.current)
}

/// Records the snapshot when none is: `metash init`, and the first run of a project made before
/// metash recorded one. The snapshot recorded, or `None` (one exists, or no repository).
///
/// # Errors
/// As [`load`] and [`save`].
pub fn record_if_absent(root: &Path) -> Result<Option<Snapshot>> {
    if load(root)?.is_some() {
        return Ok(None);
    }
    let Some((snap, _)) = current(root) else {
        return Ok(None);
    };
    save(root, &snap)?;
    Ok(Some(snap))
}

/// The data of a `git_trust` event: `action` is `recorded`, `refused` or `accepted`.
pub fn event(action: &str, changes: &[Change], by: &str) -> Value {
    json!({"action": action, "file": format!(".meta/{TRUST_FILE}"), "changes": changes, "by": by})
}

/// What a full check found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Checked {
    /// Nothing was recorded: the configuration as it is now was recorded as trusted.
    Recorded,
    Unchanged,
}

/// Checks a project's configuration against the trusted snapshot before git runs.
#[derive(Debug)]
pub(crate) struct Guard {
    root: PathBuf,
    state: Mutex<GuardState>,
}

#[derive(Debug, Default)]
struct GuardState {
    /// Loaded (or recorded) at the first check.
    trusted: Option<Snapshot>,
    /// Set when the last check found the configuration trusted.
    watch: Option<Watch>,
    scanner: Scanner,
    /// A snapshot was recorded and no full check has reported it yet.
    recorded: bool,
}

impl Guard {
    pub(crate) fn new(root: &Path) -> Self {
        Self {
            root: root.to_path_buf(),
            state: Mutex::new(GuardState::default()),
        }
    }

    /// Before a git operation: a few `stat` calls when nothing changed; otherwise the
    /// configuration is read again and compared.
    ///
    /// # Errors
    /// [`OrchestratorError::GitConfigChanged`] naming each change.
    pub(crate) fn check(&self) -> Result<()> {
        crate::cost::checking(|| {
            let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
            if s.watch.as_ref().is_some_and(Watch::unchanged) {
                return Ok(());
            }
            self.rescan(&mut s)
        })
    }

    /// Reads and compares the whole configuration (at the start of a run, rollback or worker).
    ///
    /// # Errors
    /// As [`Guard::check`]; the trusted snapshot cannot be read or recorded.
    pub(crate) fn verify(&self) -> Result<Checked> {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.watch = None;
        self.rescan(&mut s)?;
        Ok(if std::mem::take(&mut s.recorded) {
            Checked::Recorded
        } else {
            Checked::Unchanged
        })
    }

    fn rescan(&self, s: &mut GuardState) -> Result<()> {
        let Some(layout) = Layout::discover(&self.root) else {
            // Not a repository: git refuses to work here anyway (`Git::ensure_repo`).
            return Ok(());
        };
        let scan = s.scanner.scan(&layout);
        let now = snapshot_of(scan.config, scan.files);
        let mut trusted = match s.trusted.take() {
            Some(t) => t,
            None => self.trusted_or_record(&now, &mut s.recorded)?,
        };
        let mut changes = trusted.changes_to(&now);
        if !changes.is_empty() {
            // A person may have accepted it since (`metash git trust` while this command runs).
            if let Some(newer) = load(&self.root)?.filter(|t| *t != trusted) {
                trusted = newer;
                changes = trusted.changes_to(&now);
            }
        }
        s.trusted = Some(trusted);
        if !changes.is_empty() {
            s.watch = None;
            return Err(OrchestratorError::GitConfigChanged { changes });
        }
        s.watch = Some(scan.watch);
        Ok(())
    }

    /// The recorded snapshot; when there is none, `now`, recorded in `.meta/` (or, for a
    /// repository that is no metash project, kept for this process only).
    fn trusted_or_record(&self, now: &Snapshot, recorded: &mut bool) -> Result<Snapshot> {
        if let Some(t) = load(&self.root)? {
            return Ok(t);
        }
        if self.root.join(".meta").is_dir() {
            save(&self.root, now)?;
            *recorded = true;
        }
        Ok(now.clone())
    }
}
