#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The README's first path ("With a real agent (start here)"), run as a newcomer runs it: its code
//! block read from README.md and executed line by line by bash, on a terminal (a pseudo-terminal
//! made here, so the first run's consent question is asked and answered as a person would), in a
//! fresh HOME and a fresh directory, with the real Claude Code CLI against a loopback model that
//! speaks Anthropic's wire protocol. `$EDITOR` is a script that writes the project's vision, as a
//! person would in their editor. The one line not run is `cargo install --path crates/metash`
//! (a release build of the workspace): the test puts the `metash` it was built with on `PATH`
//! instead. The run must complete, with every task's file at HEAD, and `git status` must show only
//! what a newcomer expects of `.meta/`.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use metash_testkit::anthropic::ModelServer;
use metash_testkit::cli::Cli;

const KEY: &str = "sk-ant-readme-newcomer-0123456789abcdef";
const TOKEN: &str = "sk-ant-oat01-readme-newcomer-subscription-0123456789";

/// The README's first code block under "With a real agent".
fn first_path() -> Vec<String> {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md"))
        .expect("README.md");
    let section = readme
        .split("## With a real agent")
        .nth(1)
        .expect("the README has a 'With a real agent' section");
    let block = section
        .split("```sh\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("its first sh block");
    block.lines().map(str::to_string).collect()
}

/// `$EDITOR`: writes a real context into the file it is given.
fn editor(dir: &Path) -> PathBuf {
    let path = dir.join("editor.sh");
    std::fs::write(
        &path,
        "#!/bin/sh\ncat > \"$1\" <<'EOF'\n# Project: Greeter\n\n## Vision\n\nThree small text files, \
         for a newcomer's first run.\n\n## Tech Stack\n\n- Language: plain text\n\n## Current Phase \
         Focus\n\nPhase 1: write a.txt, b.txt and c.txt.\nEOF\n",
    )
    .unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    path
}

/// `PATH` for the newcomer: `metash` (as `cargo install` would put it), the CLI, the system.
fn path_with_metash(dir: &Path, tools: &Path) -> String {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_metash"), bin.join("metash")).unwrap();
    format!(
        "{}:{}:/usr/local/bin:/usr/bin:/bin",
        bin.display(),
        tools.join("node_modules/.bin").display()
    )
}

/// Runs `script` with bash on a fresh terminal; answers each consent question "allow for a
/// day", as the newcomer does once. Returns the exit status and what the terminal showed.
fn on_terminal(script: &str, cwd: &Path, env: &[(&str, String)]) -> (i32, String) {
    let (master, tty) = metash_testkit::pty::open();
    let slave = File::options().read(true).write(true).open(&tty).unwrap();
    let mut cmd = Command::new("bash");
    cmd.args(["-euc", script])
        .current_dir(cwd)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdin(Stdio::from(slave.try_clone().unwrap()))
        .stdout(Stdio::from(slave.try_clone().unwrap()))
        .stderr(Stdio::from(slave));
    // SAFETY: setsid and ioctl only, between fork and exec: the terminal becomes bash's own.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            libc::ioctl(0, libc::TIOCSCTTY, 0);
            Ok(())
        });
    }
    let mut child = cmd.spawn().unwrap();
    drop(cmd);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mut reader = master.try_clone().unwrap();
    let sink = Arc::clone(&seen);
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let ended = Arc::clone(&done);
    // Reads until the script has ended: a read that fails (EIO while no process holds the
    // terminal's other side for a moment) is tried again, so no output is lost to it.
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while !ended.load(std::sync::atomic::Ordering::SeqCst) {
            match reader.read(&mut buf) {
                Ok(n) if n > 0 => sink.lock().unwrap().extend_from_slice(&buf[..n]),
                _ => std::thread::sleep(Duration::from_millis(10)),
            }
        }
    });
    let mut writer = master;
    let (mut answered, deadline) = (0, Instant::now() + Duration::from_secs(600));
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "the first path did not finish");
        let text = String::from_utf8_lossy(&seen.lock().unwrap()).into_owned();
        if text.matches("[d] deny > ").count() > answered {
            writer.write_all(b"s 86400\n").unwrap();
            answered += 1;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    std::thread::sleep(Duration::from_millis(200));
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let _ = writer.as_raw_fd();
    let text = String::from_utf8_lossy(&seen.lock().unwrap()).into_owned();
    (status.code().unwrap_or(-1), text)
}

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// How the newcomer's Claude Code reaches its model.
enum Auth {
    /// `ANTHROPIC_API_KEY`.
    Key,
    /// A subscription: `CLAUDE_CODE_OAUTH_TOKEN` (from `claude setup-token`).
    Subscription,
}

/// The README's first path with `auth`; the secret must reach the model server and nothing else.
fn newcomer(test: &str, auth: Auth) {
    let Some(tools) = Cli::Claude.installed(test) else {
        return;
    };
    let server = ModelServer::start(|c| Cli::Claude.scripted_run(&c.text()));
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let work = dir.path().join("work");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::create_dir_all(&work).unwrap();
    let lines = first_path();
    assert!(
        lines[0].starts_with("cargo install --path crates/metash"),
        "the README's first line changed: {}",
        lines[0]
    );
    let script = lines[1..].join("\n");
    let (secret_var, secret) = match auth {
        Auth::Key => ("ANTHROPIC_API_KEY", KEY),
        Auth::Subscription => ("CLAUDE_CODE_OAUTH_TOKEN", TOKEN),
    };
    let env = [
        ("HOME", home.display().to_string()),
        ("PATH", path_with_metash(dir.path(), &tools)),
        ("TERM", "xterm".to_string()),
        ("EDITOR", editor(dir.path()).display().to_string()),
        (secret_var, secret.to_string()),
        ("ANTHROPIC_BASE_URL", server.base.clone()),
    ];
    let (code, shown) = on_terminal(&script, &work, &env);
    assert_eq!(code, 0, "the first path failed:\n{shown}");
    assert!(shown.contains("the project is complete"), "{shown}");
    assert!(!shown.contains(secret), "the secret was shown");
    let project = work.join("my-project");
    for t in ["a", "b", "c"] {
        assert_eq!(
            git(&project, &["show", &format!("HEAD:{t}.txt")]).trim(),
            format!("{t}-from-Claude-Code")
        );
    }
    // What a newcomer sees of `.meta/`: what they wrote and may commit, nothing of the runtime.
    let status = git(
        &project,
        &["status", "--porcelain", "--untracked-files=all"],
    );
    let mut untracked: Vec<&str> = status.lines().collect();
    untracked.sort_unstable();
    assert_eq!(
        untracked,
        [
            "?? .meta/.gitignore",
            "?? .meta/config.toml",
            "?? .meta/context.md"
        ],
        "{status}"
    );
    let posts = server.posts();
    // The planner got the vision the editor wrote; every request carried the real secret, in
    // the form its sign-in uses (the CLI itself held only a placeholder).
    assert!(posts
        .iter()
        .any(|p| p.text().contains("Three small text files")));
    for p in &posts {
        match auth {
            Auth::Key => assert_eq!(p.header("x-api-key"), Some(KEY)),
            Auth::Subscription => {
                assert_eq!(
                    p.header("authorization"),
                    Some(format!("Bearer {TOKEN}").as_str())
                );
            }
        }
    }
    for f in metash_testkit::procs::files_under(&project) {
        let text = std::fs::read(&f).unwrap_or_default();
        assert!(
            !String::from_utf8_lossy(&text).contains(secret),
            "{} holds the secret",
            f.display()
        );
    }
}

#[test]
fn the_readme_first_path_with_claude_code_and_a_key() {
    newcomer(
        "the_readme_first_path_with_claude_code_and_a_key",
        Auth::Key,
    );
}

#[test]
fn the_readme_first_path_with_claude_code_and_a_subscription_token() {
    newcomer(
        "the_readme_first_path_with_claude_code_and_a_subscription_token",
        Auth::Subscription,
    );
}
