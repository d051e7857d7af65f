//! What both test files start with: a fresh project and `metash ui` serving it on its own runtime.
#![allow(clippy::unwrap_used, dead_code)]

use std::path::PathBuf;

pub mod client;

/// A project (kept while this lives), the runtime the server runs on, and the server.
pub struct Served {
    pub dir: tempfile::TempDir,
    pub root: PathBuf,
    pub rt: tokio::runtime::Runtime,
    pub served: metash_ui::Served,
}

pub fn serve_new_project() -> Served {
    serve_new_project_with(&metash_ui::UiOptions::default())
}

pub fn serve_new_project_with(options: &metash_ui::UiOptions) -> Served {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    metash_store::Store::init(&root, Some("# ui test\n")).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let served = rt.block_on(metash_ui::serve(&root, options)).unwrap();
    Served {
        dir,
        root,
        rt,
        served,
    }
}

/// The log's `consent_replied` records: who answered which waiting question.
pub fn replies(store: &metash_store::Store) -> Vec<metash_protocol::LogRecord> {
    store
        .log()
        .read_all()
        .unwrap()
        .into_iter()
        .filter(|r| r.kind == metash_protocol::LogKind::ConsentReplied)
        .collect()
}
