//! `metash migrate` for the documents under `.meta/` (file store only): its own module, so the
//! store's core (`lib.rs`) stays about what every command does.

use std::path::PathBuf;

use crate::{envelope, Result, Store, StoreError};

impl Store {
    /// `metash migrate` for `.meta/`: wraps every document written before documents were
    /// versioned (`.meta/*.json` other than store.json and session.json, and `.meta/kv/*.json`)
    /// in its envelope, under the lock; with `check`, only reports. Returns the documents that
    /// were (or would be) upgraded. session.json is versioned when the store opens; log records
    /// are never rewritten (each hash chains the next) and read as version 1.
    ///
    /// # Errors
    /// A document that does not parse or is newer than this build (nothing is written then).
    pub fn migrate_docs(&self, check: bool) -> Result<Vec<PathBuf>> {
        if self.pg.is_some() {
            // A server's documents were always written in their envelope.
            return Ok(Vec::new());
        }
        let _guard = self.lock()?;
        let mut legacy = Vec::new();
        for dir in [self.meta.clone(), self.meta.join("kv")] {
            let entries = match std::fs::read_dir(&dir) {
                Ok(e) => e,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(StoreError::io(&dir, e)),
            };
            let mut paths: Vec<PathBuf> = entries
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "json") && p.is_file())
                .filter(|p| {
                    !p.file_name()
                        .is_some_and(|n| n == "store.json" || n == "session.json")
                })
                .collect();
            paths.sort();
            for path in paths {
                if let Some(envelope::Doc::Unversioned(data)) = self.read_doc_at(&path)? {
                    legacy.push((path, data));
                }
            }
        }
        if !check {
            for (path, data) in &legacy {
                self.write_json(path, data)?;
            }
        }
        Ok(legacy.into_iter().map(|(p, _)| p).collect())
    }
}
