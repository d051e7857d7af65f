//! What the PostgreSQL CLI tests share: the real binary, git, and the example project set up
//! on a server (`[store]` on top of the example's config, its agents, its grants).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

pub fn metash(ws: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_metash"))
        .arg("-C")
        .arg(ws)
        .args(args)
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

pub fn ok(ws: &Path, args: &[&str]) -> String {
    let out = metash(ws, args);
    assert!(
        out.status.success(),
        "metash {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

pub fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["-c", "user.name=t", "-c", "user.email=t@localhost"])
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// `[store]` naming `url` and `project`.
pub fn store_toml(url: &str, project: &str) -> String {
    format!("[store]\nurl = \"{url}\"\nproject = \"{project}\"\n")
}

/// Into `ws`: the example's agents and config, with `head` (a `[store]` table, say) on top.
pub fn set_up(ws: &Path, head: &str) {
    std::fs::create_dir_all(ws.join(".meta")).unwrap();
    metash_testkit::greetings::copy_into(ws);
    let example = std::fs::read_to_string(ws.join(".meta/config.toml")).unwrap();
    std::fs::write(ws.join(".meta/config.toml"), format!("{head}\n{example}")).unwrap();
}

/// A git project at `dir/name` initialised on the store `head` names, with `context`, the
/// example's agents and config under `head`, and `grants` given; what `metash init` said.
pub fn project(
    dir: &Path,
    name: &str,
    head: &str,
    context: &str,
    grants: &[(&str, &str)],
) -> (PathBuf, String) {
    let ws = dir.join(name);
    std::fs::create_dir_all(ws.join(".meta")).unwrap();
    git(&ws, &["init", "-q"]);
    git(
        &ws,
        &["commit", "-q", "--allow-empty", "-m", "empty project"],
    );
    std::fs::write(ws.join(".meta/config.toml"), head).unwrap();
    let file = dir.join(format!("{name}-vision.md"));
    std::fs::write(&file, context).unwrap();
    let said = ok(&ws, &["init", "--context", file.to_str().unwrap()]);
    set_up(&ws, head);
    for (agent, cap) in grants {
        ok(&ws, &["consent", "grant", agent, cap]);
    }
    (ws, said)
}

/// The grants the example's script gives.
pub const EXAMPLE_GRANTS: &[(&str, &str)] = &[
    ("executor", "files.read"),
    ("executor", "files.write"),
    ("verifier", "files.read"),
];

/// A clone of `from` at `to`, set up with `head`.
pub fn clone(from: &Path, to: &Path, head: &str) {
    let st = Command::new("git")
        .args(["clone", "-q"])
        .arg(from)
        .arg(to)
        .status()
        .unwrap();
    assert!(st.success(), "git clone");
    set_up(to, head);
}
