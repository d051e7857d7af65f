//! `.meta/artifacts/`: files agents produce, kept under a retention policy (age and total size)
//! that `metash gc` applies, oldest first.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use metash_protocol::LogKind;
use serde::Serialize;
use serde_json::json;

use crate::atomic::write_atomic;
use crate::error::{IoContext, Result};
use crate::log::NewEvent;
use crate::Store;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// Artifacts older than this are removed.
    pub max_age: Duration,
    /// Then the oldest are removed until the rest fit.
    pub max_total_bytes: u64,
}

impl Default for Retention {
    fn default() -> Self {
        Self {
            max_age: Duration::from_secs(30 * 24 * 3600),
            max_total_bytes: 1 << 30,
        }
    }
}

/// One artifact in the store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ArtifactInfo {
    pub id: String,
    pub bytes: u64,
    /// Seconds since the Unix epoch.
    pub modified_unix: u64,
    pub path: PathBuf,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct GcReport {
    pub removed: Vec<String>,
    pub removed_bytes: u64,
    pub kept: usize,
    pub kept_bytes: u64,
}

#[derive(Debug)]
pub struct Artifacts<'a> {
    pub(crate) store: &'a Store,
    pub(crate) dir: PathBuf,
}

impl Artifacts<'_> {
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Saves an artifact atomically and logs it; returns its path.
    pub fn put(&self, name: &str, bytes: &[u8], agent: Option<&str>) -> Result<PathBuf> {
        crate::names::check(name, "artifact name")?;
        std::fs::create_dir_all(&self.dir).at(&self.dir)?;
        let path = self.dir.join(name);
        write_atomic(&path, bytes)?;
        self.store.append(
            LogKind::Artifact,
            agent,
            json!({"id": name, "path": path.to_string_lossy(), "bytes": bytes.len()}),
        )?;
        Ok(path)
    }

    /// The artifacts kept, oldest first: (modified, bytes, path). Temp files are not artifacts.
    fn files(&self) -> Result<Vec<(SystemTime, u64, PathBuf)>> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(crate::StoreError::io(&self.dir, e)),
        };
        let mut files = Vec::new();
        for entry in entries {
            let entry = entry.at(&self.dir)?;
            let meta = entry.metadata().at(&entry.path())?;
            if !meta.is_file() || entry.file_name().to_string_lossy().starts_with('.') {
                continue;
            }
            let modified = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
            files.push((modified, meta.len(), entry.path()));
        }
        files.sort();
        Ok(files)
    }

    /// The artifacts kept now, oldest first.
    ///
    /// # Errors
    /// The directory cannot be read.
    pub fn list(&self) -> Result<Vec<ArtifactInfo>> {
        Ok(self
            .files()?
            .into_iter()
            .map(|(modified, bytes, path)| ArtifactInfo {
                id: path
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                bytes,
                modified_unix: modified
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .map(|d| d.as_secs())
                    .unwrap_or(0),
                path,
            })
            .collect())
    }

    /// Applies `policy` as of `now`; logs a `gc` event when anything was removed.
    pub fn gc(&self, policy: Retention, now: SystemTime) -> Result<GcReport> {
        let _guard = self.store.lock()?;
        let files = self.files()?;
        let mut total: u64 = files.iter().map(|f| f.1).sum();
        let mut report = GcReport::default();
        for (modified, len, path) in &files {
            let age = now.duration_since(*modified).unwrap_or_default();
            if age > policy.max_age || total > policy.max_total_bytes {
                std::fs::remove_file(path).at(path)?;
                total -= len;
                report.removed_bytes += len;
                report.removed.push(
                    path.file_name()
                        .map(|n| n.to_string_lossy().into_owned())
                        .unwrap_or_default(),
                );
            } else {
                report.kept += 1;
                report.kept_bytes += len;
            }
        }
        if !report.removed.is_empty() {
            crate::atomic::sync_dir(&self.dir)?;
            self.store.append_locked(&[NewEvent::new(
                LogKind::Gc,
                None,
                json!({"removed": report.removed, "removed_bytes": report.removed_bytes}),
            )])?;
        }
        Ok(report)
    }
}
