//! What the UI's tests and benches share: a fresh project and `metash ui` serving it on its own
//! runtime, paced appends, a checkpoint, git, and where the browser and its driver are.
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

/// Calls `each(i)` for `i` in `0..n`, `rate` times a second (each at its due time, never early).
pub fn paced(n: usize, rate: u32, mut each: impl FnMut(usize)) {
    let gap = std::time::Duration::from_secs(1) / rate;
    let start = std::time::Instant::now();
    for i in 0..n {
        let due = start + gap * i as u32;
        if let Some(wait) = due.checked_duration_since(std::time::Instant::now()) {
            std::thread::sleep(wait);
        }
        each(i);
    }
}

/// A `decision_required` checkpoint with `options`.
pub fn checkpoint(message: &str, options: &[&str]) -> metash_protocol::CheckpointSignal {
    metash_protocol::CheckpointSignal {
        kind: metash_protocol::host::CheckpointTag::Checkpoint,
        reason: metash_protocol::CheckpointReason::DecisionRequired,
        message: message.into(),
        options: options.iter().map(|o| o.to_string()).collect(),
        resume_id: None,
    }
}

/// git in `dir` with a fixed identity; its trimmed stdout.
pub fn git(dir: &std::path::Path, args: &[&str]) -> String {
    let out = std::process::Command::new("git")
        .current_dir(dir)
        .args(["-c", "user.name=t", "-c", "user.email=t@localhost"])
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Playwright's core library (under `.tools`) and Debian's Chromium, or why not.
pub fn browser_tools() -> Result<(PathBuf, PathBuf), String> {
    let tools = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.tools");
    if !tools
        .join("node_modules/playwright-core/package.json")
        .is_file()
    {
        return Err("playwright-core is not installed under .tools (run scripts/setup)".into());
    }
    let chromium = ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .ok_or("Debian's chromium is not installed (run scripts/setup)")?;
    std::process::Command::new("node")
        .arg("--version")
        .output()
        .map_err(|e| format!("node: {e}"))?;
    Ok((tools, chromium))
}

/// Two projects under one directory, `alpha` and `team/beta`, beta waiting on a checkpoint
/// ("Deploy beta?"): the directory (kept while this lives), its path, and beta's checkpoint.
pub fn two_projects() -> (
    tempfile::TempDir,
    PathBuf,
    metash_protocol::PendingCheckpoint,
) {
    let dir = tempfile::tempdir().unwrap();
    let top = dir.path().canonicalize().unwrap();
    for p in ["alpha", "team/beta"] {
        std::fs::create_dir_all(top.join(p)).unwrap();
        metash_store::Store::init(&top.join(p), None).unwrap();
    }
    let beta = metash_store::Store::open(&top.join("team/beta")).unwrap();
    let signal = checkpoint("Deploy beta?", &["yes", "no"]);
    let cp = metash_host::checkpoint::raise(&beta, "deployer", &signal).unwrap();
    (dir, top, cp)
}
