//! Issue 30 parts 1 and 4: no agent writes any `.git` directory or the main checkout, and grants
//! never come from agent-written files. Each hostile agent proves it ran (a marker it writes
//! where it may), then tries to plant git configuration, a hook or a task branch: every try fails
//! and the repository is as it was. A rewritten worktree `.git` file widens nothing for the next
//! spawn there. A planner (read-only spawn) writes nothing of the project.

use std::path::{Path, PathBuf};

use metash_host::{SpawnRequest, Spawner, WorkspaceAccess};
use metash_protocol::AgentStatus;

use super::common::{native_agent_exe, native_unavailable, Project};

pub(super) fn git(dir: &Path, args: &[&str]) -> String {
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["-c", "user.name=t", "-c", "user.email=t@t"])
        .args(args)
        .output()
        .expect("git runs");
    assert!(out.status.success(), "git {args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A project that is a git repository with one commit, and its canonical root.
pub(super) fn git_project() -> (Project, PathBuf) {
    let p = Project::new();
    let root = p.path().canonicalize().expect("root");
    git(&root, &["init", "-q", "-b", "main"]);
    std::fs::write(root.join("README"), "hello\n").expect("readme");
    std::fs::write(root.join(".git/info/exclude"), ".meta\n").expect("exclude");
    git(&root, &["add", "README"]);
    git(&root, &["commit", "-q", "-m", "init"]);
    (p, root)
}

/// What an agent could change in `.git` and metash or the user would act on.
pub(super) fn git_state(root: &Path) -> (String, String, Vec<String>) {
    let config = std::fs::read_to_string(root.join(".git/config")).expect("config");
    let refs = git(root, &["for-each-ref", "--format=%(refname) %(objectname)"]);
    let hooks = std::fs::read_dir(root.join(".git/hooks"))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| !n.ends_with(".sample"))
                .collect()
        })
        .unwrap_or_default();
    (config, refs, hooks)
}

fn git_program() -> String {
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|d| d.join("git"))
        .find(|p| p.is_file())
        .map(|p| p.display().to_string())
        .expect("git on PATH")
}

fn spawn(host: &metash_host::Host, agent: &str, msg: &str, access: WorkspaceAccess) -> String {
    let mut req = SpawnRequest::new(agent, "", msg);
    req.access = access;
    let r = host.spawn_agent(&req).expect("spawn");
    assert_eq!(r.status, AgentStatus::Success, "{msg}: {r:?}");
    r.data
}

/// (a) A native agent with `files.write` on the project and `process.spawn:git`.
#[test]
fn a_native_agent_with_write_and_git_cannot_change_dot_git() {
    if let Some(why) = native_unavailable() {
        metash_testkit::skip("native agent and .git", &why);
        return;
    }
    let (p, root) = git_project();
    let caps = ["files.read", "files.write", "process.spawn:git"];
    p.agent("n", "native", &native_agent_exe(), &caps);
    let host = p.host(&["native", "files.read", "files.write", "process.spawn:git"]);
    let before = git_state(&root);
    let run = |m: &str| spawn(&host, "n", m, WorkspaceAccess::ReadWrite);
    let at = |rel: &str| root.join(rel).display().to_string();
    // It ran, with write access to the project: the marker is there.
    assert_eq!(run(&format!("try write {}", at("marker.txt"))), "OK ");
    assert_eq!(
        std::fs::read_to_string(root.join("marker.txt")).expect("marker"),
        "forged"
    );
    // Git runs there and reads the repository (a positive control for the tries below).
    let git = git_program();
    let head = run(&format!(
        "run {git} -C {} rev-parse -q --verify HEAD",
        root.display()
    ));
    assert_eq!(head, "exit 0", "git could not read the repository");
    for t in [
        format!("try write {}", at(".git/config")),
        format!("try write {}", at(".git/hooks/pre-commit")),
        format!("try write {}", at(".git/refs/heads/planted")),
        format!("try write {}", at(".git/info/attributes")),
        format!("try rename {} {}", at(".git"), at("moved-git")),
        format!("try rename {} {}", at(".git/config"), at("moved-config")),
        format!("try hardlink {} {}", at(".git/config"), at("linked-config")),
    ] {
        let out = run(&t);
        assert!(out.starts_with("DENIED"), "`{t}` must fail: {out}");
    }
    let root_s = root.display().to_string();
    for args in [
        format!("-C {root_s} config core.fsmonitor /tmp/planted-fsmonitor"),
        format!("-C {root_s} update-ref refs/heads/metash/task/t1 HEAD"),
        format!("-C {root_s} config core.hooksPath /tmp"),
    ] {
        let out = run(&format!("run {git} {args}"));
        assert!(
            out.starts_with("exit ") && out != "exit 0",
            "git {args}: {out}"
        );
    }
    assert_eq!(git_state(&root), before, "the repository changed");
    assert!(root.join(".git").is_dir() && !root.join("moved-git").exists());
    let started = p.log_data("agent_started");
    let protected = &started.last().expect("started")["protected"];
    assert_eq!(protected["via"], "mount-namespace", "{protected}");
    assert!(
        protected["paths"]
            .as_array()
            .is_some_and(|a| a.iter().any(|x| x == &root_s_git(&root))),
        "{protected}"
    );
}

fn root_s_git(root: &Path) -> serde_json::Value {
    serde_json::json!(root.join(".git").display().to_string())
}

/// (d) A planner's spawn is read-only: the same agent, granted `files.write`, writes nothing of
/// the project (and says so: the answer proves it ran).
#[test]
fn a_read_only_spawn_of_a_native_agent_writes_nothing_in_the_project() {
    if let Some(why) = native_unavailable() {
        metash_testkit::skip("read-only native spawn", &why);
        return;
    }
    let (p, root) = git_project();
    p.agent(
        "n",
        "native",
        &native_agent_exe(),
        &["files.read", "files.write"],
    );
    let host = p.host(&["native", "files.read", "files.write"]);
    let before = git_state(&root);
    let run = |m: &str| spawn(&host, "n", m, WorkspaceAccess::ReadOnly);
    let at = |rel: &str| root.join(rel).display().to_string();
    // It ran and reads the project.
    assert_eq!(run(&format!("try read {}", at("README"))), "OK hello\n");
    for t in [
        format!("try write {}", at("planted.txt")),
        format!("try write {}", at("README")),
        format!("try write {}", at(".git/config")),
        format!("try rename {} {}", at("README"), at("moved")),
    ] {
        let out = run(&t);
        assert!(out.starts_with("DENIED"), "`{t}` must fail: {out}");
    }
    assert!(!root.join("planted.txt").exists() && !root.join("moved").exists());
    assert_eq!(
        std::fs::read_to_string(root.join("README")).expect("readme"),
        "hello\n"
    );
    assert_eq!(git_state(&root), before);
    let started = p.log_data("agent_started");
    assert_eq!(
        started.last().expect("started")["workspace_access"],
        "read-only"
    );
}

/// One WASI preview-1 file attempt of [`wat_tries`].
enum Try<'a> {
    /// Open (creating it when `create`, appending when `append`) and write `text`.
    Write {
        path: &'a str,
        create: bool,
        append: bool,
        text: &'a str,
    },
    /// Create a directory.
    Mkdir(&'a str),
}

/// A WASM agent that makes each try under its workspace preopen (fd 3) and outputs `N=OK;` or
/// `N=DENIED;` for the Nth.
fn wat_tries(tries: &[Try<'_>]) -> String {
    let out = |s: &str| {
        metash_testkit::wasm::agent_msg(&format!(
            r#"{{"type":"output","agent_id":"w","chunk_id":"c","content_type":"text/plain","data":"{s}"}}"#
        )) + "\n"
    };
    let esc = |s: &str| s.bytes().map(|b| format!("\\{b:02x}")).collect::<String>();
    let (mut data, mut body, mut at) = (String::new(), String::new(), 256usize);
    let mut put = |s: &str, data: &mut String| {
        data.push_str(&format!("(data (i32.const {at}) \"{}\")\n", esc(s)));
        let here = (at, s.len());
        at += s.len() + 8;
        here
    };
    for (i, t) in tries.iter().enumerate() {
        let (ok, ok_n) = put(&out(&format!("{i}=OK;")), &mut data);
        let (no, no_n) = put(&out(&format!("{i}=DENIED;")), &mut data);
        let attempt = match t {
            Try::Write {
                path,
                create,
                append,
                text,
            } => {
                let (p, pn) = put(path, &mut data);
                let (x, xn) = put(text, &mut data);
                format!(
                    "(if (i32.eqz (call $path_open (i32.const 3) (i32.const 1) (i32.const {p}) \
                     (i32.const {pn}) (i32.const {}) (i64.const 64) (i64.const 0) (i32.const {}) \
                     (i32.const 16))) (then (i32.store (i32.const 32) (i32.const {x})) \
                     (i32.store (i32.const 36) (i32.const {xn})) (local.set $r (call $fd_write \
                     (i32.load (i32.const 16)) (i32.const 32) (i32.const 1) (i32.const 40)))) \
                     (else (local.set $r (i32.const 1))))",
                    i32::from(*create),
                    i32::from(*append)
                )
            }
            Try::Mkdir(path) => {
                let (p, pn) = put(path, &mut data);
                format!(
                    "(local.set $r (call $mkdir (i32.const 3) (i32.const {p}) (i32.const {pn})))"
                )
            }
        };
        body.push_str(&format!(
            "{attempt}\n(if (i32.eqz (local.get $r)) (then (call $emit (i32.const {ok}) \
             (i32.const {ok_n}))) (else (call $emit (i32.const {no}) (i32.const {no_n}))))\n"
        ));
    }
    let (done, done_n) = put(
        &(metash_testkit::wasm::agent_msg(r#"{"type":"done"}"#) + "\n"),
        &mut data,
    );
    format!(
        r#"(module
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "path_open" (func $path_open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "path_create_directory" (func $mkdir (param i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  {data}
  (func $emit (param $ptr i32) (param $len i32)
    (i32.store (i32.const 0) (local.get $ptr))
    (i32.store (i32.const 4) (local.get $len))
    (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8))))
  (func (export "_start") (local $r i32)
    {body}
    (call $emit (i32.const {done}) (i32.const {done_n}))))
"#
    )
}

/// (b) A WASM agent with `files.write` on the project: its marker lands, nothing in `.git` does.
/// Read-only (a planner's spawn), not even the marker does.
#[test]
fn a_wasm_agent_with_write_on_the_project_cannot_change_dot_git() {
    let (p, root) = git_project();
    let tries = [
        Try::Write {
            path: "marker.txt",
            create: true,
            append: false,
            text: "ran",
        },
        Try::Write {
            path: ".git/config",
            create: false,
            append: true,
            text: "\n[core]\n\tfsmonitor = /tmp/planted-fsmonitor\n",
        },
        Try::Write {
            path: ".git/hooks/pre-commit",
            create: true,
            append: false,
            text: "#!/bin/sh\n",
        },
        Try::Write {
            path: ".git/info/attributes",
            create: true,
            append: false,
            text: "* filter=planted\n",
        },
        Try::Mkdir(".git/refs/heads/metash"),
    ];
    std::fs::write(root.join("w.wat"), wat_tries(&tries)).expect("wat");
    p.agent(
        "w",
        "wasm",
        &root.join("w.wat"),
        &["files.read", "files.write"],
    );
    let host = p.host(&["files.read", "files.write"]);
    let before = git_state(&root);
    let out = spawn(&host, "w", "go", WorkspaceAccess::ReadWrite);
    assert_eq!(out, "0=OK;1=DENIED;2=DENIED;3=DENIED;4=DENIED;", "{out}");
    assert_eq!(
        std::fs::read_to_string(root.join("marker.txt")).expect("marker"),
        "ran"
    );
    assert_eq!(git_state(&root), before, "the repository changed");
    assert!(!root.join(".git/info/attributes").exists());
    assert!(!root.join(".git/refs/heads/metash").exists());
    std::fs::remove_file(root.join("marker.txt")).expect("rm marker");
    let out = spawn(&host, "w", "go", WorkspaceAccess::ReadOnly);
    assert_eq!(
        out, "0=DENIED;1=DENIED;2=DENIED;3=DENIED;4=DENIED;",
        "{out}"
    );
    assert!(
        !root.join("marker.txt").exists(),
        "a read-only spawn wrote the project"
    );
    assert_eq!(git_state(&root), before);
}
