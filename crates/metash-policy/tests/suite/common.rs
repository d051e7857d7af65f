//! Fixtures: a project in a temp dir, agents written into it, a prompter that counts its calls.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use chrono::TimeZone;
use metash_policy::{
    AgentDirs, Answer, ConsentPrompter, ConsentQuestion, ManualClock, Policy, Registry,
};
use metash_store::Store;

/// The seed's example manifest, verbatim.
pub const SEED: &str = metash_testkit::SEED_MANIFEST;

pub struct Project {
    pub dir: tempfile::TempDir,
}

impl Project {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("ws")).unwrap();
        Store::init(&dir.path().join("ws"), None).unwrap();
        Self { dir }
    }

    pub fn ws(&self) -> PathBuf {
        self.dir.path().join("ws")
    }

    /// A config home that is not the real one.
    pub fn config_home(&self) -> PathBuf {
        self.dir.path().join("config")
    }

    pub fn dirs(&self) -> AgentDirs {
        AgentDirs::new(&self.ws(), Some(&self.config_home()))
    }

    pub fn store(&self) -> Store {
        Store::open(&self.ws()).unwrap()
    }

    pub fn add_agent(&self, id: &str, manifest: &str) -> PathBuf {
        write_manifest(&self.ws().join(".meta").join("agents").join(id), manifest)
    }

    pub fn add_user_agent(&self, id: &str, manifest: &str) -> PathBuf {
        write_manifest(
            &self.config_home().join("metash").join("agents").join(id),
            manifest,
        )
    }

    /// A policy over the agents on disk, with a manual clock at 2026-01-01T00:00:00Z.
    pub fn policy(&self) -> (Policy, Arc<ManualClock>) {
        let clock = Arc::new(ManualClock::new(
            chrono::Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap(),
        ));
        let reg = Registry::discover(&self.dirs());
        assert!(reg.invalid().is_empty(), "{:?}", reg.invalid());
        (
            Policy::new(self.store(), reg).with_clock(clock.clone()),
            clock,
        )
    }

    pub fn kinds(&self) -> Vec<String> {
        self.store()
            .log()
            .read_all()
            .unwrap()
            .into_iter()
            .map(|r| r.kind.to_string())
            .collect()
    }
}

pub fn write_manifest(dir: &Path, text: &str) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let p = dir.join("manifest.toml");
    std::fs::write(&p, text).unwrap();
    p
}

/// The seed manifest with `capabilities` replaced.
pub fn manifest_with(caps: &[&str], sandbox: &str) -> String {
    let list: Vec<String> = caps.iter().map(|c| format!("\"{c}\"")).collect();
    format!(
        "schema_version = \"0.1\"\nname = \"T\"\nversion = \"0.1.0\"\nentry = \"a.wasm\"\nsandbox = \"{sandbox}\"\ncapabilities = [{}]\n",
        list.join(", ")
    )
}

/// Answers with `answer` and counts how often it was asked.
pub struct Counting {
    pub calls: usize,
    pub answer: Answer,
    pub last: Option<ConsentQuestion>,
}

impl Counting {
    pub fn new(answer: Answer) -> Self {
        Self {
            calls: 0,
            answer,
            last: None,
        }
    }
}

impl ConsentPrompter for Counting {
    fn ask(&mut self, q: &ConsentQuestion) -> Answer {
        self.calls += 1;
        self.last = Some(q.clone());
        self.answer
    }
    fn name(&self) -> &'static str {
        "test"
    }
}
