use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use metash_store::Store;

/// A fresh project in a temp dir.
pub fn project() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::init(dir.path(), Some("# Project: test\n")).unwrap();
    (dir, store)
}

/// The writer process (a bin target of this crate, built by cargo for its integration tests).
pub fn writer_exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_metash-store-writer"))
}

pub fn spawn_writer(ws: &Path, args: &[&str]) -> Child {
    Command::new(writer_exe())
        .arg(ws)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Bytes of every file under `.meta/` (sorted by path), to prove a refused call changed nothing.
pub fn snapshot(ws: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![ws.join(".meta")];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.file_name().unwrap() != "lock" {
                out.push((p.clone(), std::fs::read(&p).unwrap()));
            }
        }
    }
    out.sort();
    out
}
