//! Issue 30 part 4 and part 1 for CLI roles: grants never come from agent-written files, and a
//! planner's CLI writes nothing of the project. An executor that rewrote its worktree's `.git`
//! file (`gitdir:` a directory holding a `~/.ssh/id_rsa` stand-in whose `commondir` is `/etc`, or
//! one whose `commondir` is `.meta/`, or `../t2`) gains nothing: the next command confined there
//! (`metash sandbox`'s path, then a real CLI driven by a loopback model) reads neither the key,
//! `/etc/shadow`, any `.meta/` file nor another task's worktree, and proves it ran by its marker.

use std::path::{Path, PathBuf};

use metash_host::{SpawnRequest, Spawner, WorkspaceAccess};
use metash_protocol::AgentStatus;
use metash_testkit::anthropic::ModelServer;
use metash_testkit::cli::Cli;

use super::common::{native_unavailable, Project};
use super::git_protect::{git, git_project, git_state};

const SECRET: &str = "git-protect-cli-secret-8086";

/// What [`Scene::probe`] writes, one try each.
const PROBE_FILES: &[&str] = &[
    "o-key",
    "o-home",
    "o-shadow",
    "o-meta",
    "o-events",
    "o-consent",
    "o-t2",
    "o-t2-ls",
];

/// Two task worktrees made as the orchestrator makes them, `t2` holding a secret, `.meta/` one
/// too, and the places a rewritten `.git` file points at.
struct Scene {
    p: Project,
    root: PathBuf,
    t1: PathBuf,
    _outside: tempfile::TempDir,
    /// A stand-in for the user's home: `.ssh/id_rsa` holds the secret, `commondir` says `/etc`.
    fake_home: PathBuf,
    /// An admin-looking directory whose `commondir` is the project's `.meta`.
    to_meta: PathBuf,
}

impl Scene {
    fn new() -> Self {
        let (p, root) = git_project();
        let wts = root.join(".meta/worktrees");
        for t in ["t1", "t2"] {
            let at = wts.join(t).display().to_string();
            git(&root, &["worktree", "add", "-q", "--detach", &at]);
        }
        std::fs::write(wts.join("t2/secret-t2.txt"), SECRET).expect("t2 secret");
        std::fs::write(root.join(".meta/secret.txt"), SECRET).expect("meta secret");
        let outside = tempfile::tempdir().expect("outside");
        let fake_home = outside
            .path()
            .canonicalize()
            .expect("canonical")
            .join("home");
        std::fs::create_dir_all(fake_home.join(".ssh")).expect("ssh");
        std::fs::write(fake_home.join(".ssh/id_rsa"), SECRET).expect("key");
        std::fs::write(fake_home.join("commondir"), "/etc\n").expect("commondir");
        let to_meta = outside
            .path()
            .canonicalize()
            .expect("canonical")
            .join("to-meta");
        std::fs::create_dir_all(&to_meta).expect("to-meta");
        std::fs::write(
            to_meta.join("commondir"),
            format!("{}\n", root.join(".meta").display()),
        )
        .expect("commondir");
        Self {
            t1: wts.join("t1"),
            p,
            root,
            _outside: outside,
            fake_home,
            to_meta,
        }
    }

    /// The rewrites an executor could make to its worktree's `.git` file.
    fn rewrites(&self) -> Vec<String> {
        vec![
            format!("gitdir: {}\n", self.fake_home.display()),
            format!("gitdir: {}\n", self.to_meta.display()),
            "gitdir: ../t2\n".to_string(),
        ]
    }

    /// The shell probe, run in `t1`: a marker, then every read the rewritten file would have
    /// granted, each into a file of its own in the worktree (which it may write).
    fn probe(&self) -> String {
        let meta = self.root.join(".meta");
        format!(
            "echo ran-$((6*7)) > ran.txt; cat {key} > o-key 2>&1; ls {home} > o-home 2>&1; \
             cat /etc/shadow > o-shadow 2>&1; cat {meta}/secret.txt > o-meta 2>&1; \
             cat {meta}/events.jsonl > o-events 2>&1; cat {meta}/consent.json > o-consent 2>&1; \
             cat ../t2/secret-t2.txt > o-t2 2>&1; ls ../t2 > o-t2-ls 2>&1; cat ran.txt",
            key = self.fake_home.join(".ssh/id_rsa").display(),
            home = self.fake_home.display(),
            meta = meta.display(),
        )
    }

    /// The probe ran (its marker) and read nothing it must not.
    fn check_probe(&self, what: &str) {
        let read = |f: &str| std::fs::read_to_string(self.t1.join(f)).unwrap_or_default();
        assert_eq!(
            read("ran.txt").trim(),
            "ran-42",
            "{what}: the probe did not run"
        );
        let shadow = std::fs::read_to_string("/etc/shadow").unwrap_or_default();
        let shadow_head: String = shadow.chars().take(12).collect();
        let events =
            std::fs::read_to_string(self.root.join(".meta/events.jsonl")).unwrap_or_default();
        let events_head: String = events.chars().take(40).collect();
        for f in PROBE_FILES {
            let o = read(f);
            assert!(!o.contains(SECRET), "{what}: {f} read the secret: {o}");
            assert!(
                shadow_head.is_empty() || !o.contains(&shadow_head),
                "{what}: {f} read /etc/shadow: {o}"
            );
            assert!(
                events_head.is_empty() || !o.contains(&events_head),
                "{what}: {f} read the log: {o}"
            );
            assert!(
                o.contains("denied") || o.contains("No such file"),
                "{what}: {f} was not refused: {o}"
            );
        }
        for f in PROBE_FILES.iter().chain(&["ran.txt"]) {
            let _ = std::fs::remove_file(self.t1.join(f));
        }
    }
}

/// The report of a confinement names none of the places a rewritten `.git` file pointed at.
fn check_report(report: &serde_json::Value, scene: &Scene, what: &str) {
    let paths = report["paths"].as_array().cloned().unwrap_or_default();
    for p in &paths {
        let p = p["path"].as_str().unwrap_or_default();
        let bad = [
            scene.fake_home.as_path(),
            scene.to_meta.as_path(),
            Path::new("/etc"),
            &scene.root.join(".meta/worktrees/t2"),
        ];
        assert!(
            !bad.iter().any(|b| Path::new(p) == *b),
            "{what}: {p} was granted: {report}"
        );
        assert!(
            !Path::new(p).starts_with(scene.root.join(".meta")) || p.ends_with("/t1"),
            "{what}: {p} inside .meta was granted: {report}"
        );
    }
}

/// (c) through `metash sandbox`'s path (the same `RoleConfiner` as a CLI role's spawn).
#[test]
fn a_rewritten_worktree_git_file_widens_nothing_for_the_next_confined_command() {
    if let Some(why) = native_unavailable() {
        metash_testkit::skip("rewritten .git file", &why);
        return;
    }
    let scene = Scene::new();
    scene
        .p
        .config(&Cli::Claude.role("coder", "http://127.0.0.1:9"));
    let host = super::cli_sandbox::cli_host(&scene.p);
    let sh = |script: &str| {
        let argv = ["sh".to_string(), "-c".to_string(), script.to_string()];
        let s = host
            .sandboxed("coder", &scene.t1, &argv, &[])
            .expect("sandboxed");
        let report = s.report.clone();
        assert!(s.status().expect("ran").success(), "{script}");
        report
    };
    // Positive control: with the worktree as git made it, git works there (its admin directory
    // and the common `.git` are granted from the project's own back-pointers), read-only.
    let head = git(&scene.root, &["rev-parse", "HEAD"]);
    let report = sh(
        "git rev-parse HEAD > o-git 2>&1; git update-ref refs/heads/planted HEAD \
                     > o-ref 2>&1; true",
    );
    let out = std::fs::read_to_string(scene.t1.join("o-git")).expect("o-git");
    assert_eq!(out.trim(), head, "git in the worktree");
    let admin = report["paths"].as_array().expect("paths").iter().any(|p| {
        p["path"]
            .as_str()
            .is_some_and(|p| p.contains("/.git/worktrees/t1"))
            && p["write"] == false
    });
    assert!(admin, "no read-only admin directory: {report}");
    assert!(
        !git(&scene.root, &["for-each-ref"]).contains("planted"),
        "a ref was planted"
    );
    let before = git_state(&scene.root);
    for rewrite in scene.rewrites() {
        std::fs::write(scene.t1.join(".git"), &rewrite).expect("rewrite");
        let report = sh(&scene.probe());
        scene.check_probe(&rewrite);
        check_report(&report, &scene, &rewrite);
    }
    assert_eq!(git_state(&scene.root), before);
}

/// Runs `cli` once as role `coder` (the project's `.tools` linked), the loopback model asking for
/// one shell call of `cmd`; the call's output.
fn cli_shell(cli: Cli, tools: &Path, p: &Project, req: SpawnRequest, cmd: &str) -> String {
    let cmd = cmd.to_string();
    let server = ModelServer::start(move |c| {
        let body = c.text();
        if !body.contains("Run the probe.") {
            return cli.text("ok");
        }
        match cli.results(&body) {
            0 => cli.shell(0, &body, &cmd),
            _ => cli.text("probe done"),
        }
    });
    let link = p.path().join(".tools");
    if link.symlink_metadata().is_err() {
        std::os::unix::fs::symlink(tools, &link).expect("link .tools");
    }
    p.config(&cli.role("coder", &server.base));
    let host = super::cli_sandbox::cli_host(p);
    let r = host.spawn_agent(&req).expect("spawn");
    assert_eq!(r.status, AgentStatus::Success, "{r:?}");
    let results = p.log_data("tool_result");
    let last = results
        .last()
        .unwrap_or_else(|| panic!("no tool call ran: {r:?}"));
    last["output"].as_str().unwrap_or_default().to_string()
}

fn request(workdir: Option<PathBuf>, access: WorkspaceAccess) -> SpawnRequest {
    let mut req = SpawnRequest::new("coder", "You are a test.", "Run the probe.");
    req.workdir = workdir;
    req.access = access;
    req.options.timeout_seconds = Some(300.0);
    req
}

/// (c) with a real CLI: the verifier (or a retry) spawned in a worktree whose `.git` file the
/// executor rewrote.
fn real_cli_after_rewrite(cli: Cli, test: &str) {
    let Some(tools) = super::common::cli_ready(cli, test) else {
        return;
    };
    let scene = Scene::new();
    std::fs::write(scene.t1.join(".git"), &scene.rewrites()[0]).expect("rewrite");
    let req = request(Some(scene.t1.clone()), WorkspaceAccess::ReadWrite);
    let out = cli_shell(cli, &tools, &scene.p, req, &scene.probe());
    assert!(out.contains("ran-42"), "{out}");
    scene.check_probe(test);
    let started = scene.p.log_data("agent_started");
    let report = started
        .iter()
        .find(|s| s.get("frontend").is_some())
        .expect("the CLI's sandbox report");
    check_report(report, &scene, test);
}

#[test]
fn claude_code_after_a_rewritten_git_file_reads_nothing_more() {
    let t = "claude_code_after_a_rewritten_git_file_reads_nothing_more";
    real_cli_after_rewrite(Cli::Claude, t);
}

#[test]
fn codex_after_a_rewritten_git_file_reads_nothing_more() {
    real_cli_after_rewrite(
        Cli::Codex,
        "codex_after_a_rewritten_git_file_reads_nothing_more",
    );
}

#[test]
fn pi_after_a_rewritten_git_file_reads_nothing_more() {
    real_cli_after_rewrite(Cli::Pi, "pi_after_a_rewritten_git_file_reads_nothing_more");
}

/// (d) A planner's CLI (a read-only spawn at the project root): its shell ran (the computed
/// marker in its output), and nothing of the project, `.git` included, was written.
fn read_only_planner(cli: Cli, test: &str) {
    let Some(tools) = super::common::cli_ready(cli, test) else {
        return;
    };
    let (p, root) = git_project();
    let before = git_state(&root);
    let cmd = "echo ran-$((6*7)); echo x > planted.txt 2>/dev/null || echo WRITE-REFUSED; \
               echo '[core] fsmonitor = /tmp/planted' >> .git/config 2>/dev/null \
               || echo GIT-REFUSED; mkdir -p .git/refs/heads/metash 2>/dev/null \
               || echo REF-REFUSED";
    let out = cli_shell(
        cli,
        &tools,
        &p,
        request(None, WorkspaceAccess::ReadOnly),
        cmd,
    );
    for want in ["ran-42", "WRITE-REFUSED", "GIT-REFUSED", "REF-REFUSED"] {
        assert!(out.contains(want), "{want}: {out}");
    }
    assert!(!root.join("planted.txt").exists());
    assert_eq!(git_state(&root), before);
    assert!(!root.join(".git/refs/heads/metash").exists());
    let started = p.log_data("agent_started");
    let report = started
        .iter()
        .find(|s| s.get("frontend").is_some())
        .expect("the CLI's sandbox report");
    assert_eq!(report["workspace_access"], "read-only", "{report}");
}

#[test]
fn claude_code_as_planner_writes_nothing_in_the_project() {
    let t = "claude_code_as_planner_writes_nothing_in_the_project";
    read_only_planner(Cli::Claude, t);
}

#[test]
fn codex_as_planner_writes_nothing_in_the_project() {
    read_only_planner(Cli::Codex, "codex_as_planner_writes_nothing_in_the_project");
}

#[test]
fn pi_as_planner_writes_nothing_in_the_project() {
    read_only_planner(Cli::Pi, "pi_as_planner_writes_nothing_in_the_project");
}

/// `metash spawn ROLE` / `metash sandbox` at the project root keep their write access to the
/// project, never to its `.git`: a confined shell writes its marker, and every plant in `.git`
/// (config, hook, `info/attributes`, a ref through git itself) fails.
#[test]
fn a_confined_command_at_the_root_writes_the_project_but_never_dot_git() {
    if let Some(why) = native_unavailable() {
        metash_testkit::skip("confined command at the root", &why);
        return;
    }
    let (p, root) = git_project();
    p.config(&Cli::Claude.role("coder", "http://127.0.0.1:9"));
    let host = super::cli_sandbox::cli_host(&p);
    let before = git_state(&root);
    let plants = [
        "echo '[core] fsmonitor = /tmp/planted' >> .git/config",
        "echo '#!/bin/sh' > .git/hooks/pre-commit",
        "echo '* filter=x' > .git/info/attributes",
        "git update-ref refs/heads/metash/task/t1 HEAD",
        "mv .git moved-git",
    ];
    let mut script = String::from("echo ran-$((6*7)) > marker.txt");
    for (i, plant) in plants.iter().enumerate() {
        script.push_str(&format!(
            "; ({plant}) 2>/dev/null || echo refused-{i} >> refused.txt"
        ));
    }
    let argv = ["sh".to_string(), "-c".to_string(), script.to_string()];
    let s = host
        .sandboxed("coder", &root, &argv, &[])
        .expect("sandboxed");
    let report = s.report.clone();
    assert!(s.status().expect("ran").success());
    let marker = std::fs::read_to_string(root.join("marker.txt")).expect("marker");
    assert_eq!(marker.trim(), "ran-42");
    let refused = std::fs::read_to_string(root.join("refused.txt")).expect("refused");
    assert_eq!(
        refused.lines().count(),
        5,
        "every plant must fail: {refused}"
    );
    assert_eq!(git_state(&root), before, "the repository changed");
    assert!(root.join(".git").is_dir() && !root.join("moved-git").exists());
    assert!(!root.join(".git/info/attributes").exists());
    assert_eq!(report["workspace_access"], "read-write", "{report}");
    assert_eq!(report["protected"]["via"], "mount-namespace", "{report}");
}
