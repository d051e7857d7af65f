//! Git trust (issue 30, part 2): a filter (`.git/config` + `.git/info/attributes`), a
//! `core.fsmonitor` and a `pre-commit` hook planted in the project's repository, each a script
//! that writes a marker OUTSIDE the project when it runs, are never run by metash: not on a first
//! run, a retry, a conflicting merge or a rollback. The run stops naming each changed key and
//! file, and logs a `git_trust` refusal; once a person accepts the change (the library call
//! behind `metash git trust --yes`), metash's git uses the accepted filter again (detection is not
//! a ban), while hooks and fsmonitor stay off whatever is accepted.
//!
//! Each test also shows that what was planted is live: the user's own git runs it.
//!
//! And git-lfs, configured by the user, keeps working: task worktrees and merges get the real
//! contents (libgit2 runs no filter; metash goes through the git CLI when one is configured).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use metash_host::{SpawnRequest, Spawner};
use metash_orchestrator::git::trust;
use metash_orchestrator::{Orchestrator, OrchestratorError, RunOptions, RunOutcome};
use metash_protocol::{AgentResponse, AgentStatus, ResponseMetadata};

use super::common::{git, statuses, Project, Sim};

/// What the planted programs write when they run.
struct Planted {
    _outside: tempfile::TempDir,
    marker: PathBuf,
}

impl Planted {
    /// What ran, one line each (`clean`, `smudge`, `fsmonitor`, `pre-commit`).
    fn ran(&self) -> String {
        std::fs::read_to_string(&self.marker).unwrap_or_default()
    }
}

/// Plants, as a hostile agent or an earlier tool would, in `project`'s repository: a clean and
/// smudge filter on every path, an fsmonitor and a pre-commit hook.
fn plant(project: &Path) -> Planted {
    let outside = tempfile::tempdir().unwrap();
    let marker = outside.path().join("ran");
    let m = marker.display();
    for (key, what) in [("clean", "clean"), ("smudge", "smudge")] {
        let cmd = format!("sh -c 'echo {what} >> {m}; cat'");
        git(project, &["config", &format!("filter.evil.{key}"), &cmd]);
    }
    std::fs::create_dir_all(project.join(".git/info")).unwrap();
    std::fs::write(project.join(".git/info/attributes"), "* filter=evil\n").unwrap();
    let fsmonitor = outside.path().join("fsmonitor.sh");
    script(&fsmonitor, &format!("echo fsmonitor >> {m}\nexit 1"));
    git(
        project,
        &["config", "core.fsmonitor", &fsmonitor.to_string_lossy()],
    );
    script(
        &project.join(".git/hooks/pre-commit"),
        &format!("echo pre-commit >> {m}"),
    );
    Planted {
        _outside: outside,
        marker,
    }
}

fn script(path: &Path, body: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// Every change the refusal names, as `file: key` or `file`.
fn refused(e: &OrchestratorError) -> Vec<String> {
    match e {
        OrchestratorError::GitConfigChanged { changes } => {
            changes.iter().map(trust::Change::what).collect()
        }
        other => panic!("expected a git trust refusal, got: {other}"),
    }
}

/// The refusal names everything `plant` planted, and says how to accept it.
fn assert_names_the_plant(e: &OrchestratorError) {
    let named = refused(e);
    for want in [
        ".git/config: filter.evil.clean",
        ".git/config: filter.evil.smudge",
        ".git/config: core.fsmonitor",
        ".git/hooks/pre-commit",
        ".git/info/attributes",
    ] {
        assert!(named.iter().any(|n| n == want), "{want} not in {named:?}");
    }
    assert!(e.to_string().contains("metash git trust"), "{e}");
}

/// `git_trust` events of the log with this action.
fn trust_events(p: &Project, action: &str) -> usize {
    p.store()
        .log()
        .read_all()
        .unwrap()
        .iter()
        .filter(|r| r.kind == "git_trust" && r.data["action"] == action)
        .count()
}

/// The user's own git in the project (not metash's): it runs what was planted.
fn users_git(dir: &Path, args: &[&str]) {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["-c", "user.name=u", "-c", "user.email=u@localhost"])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Shows that the plant is live: the user's `git status`, `git add` and `git commit` run it.
fn assert_live(p: &Project, planted: &Planted) {
    std::fs::write(p.path().join("users-file.txt"), "mine\n").unwrap();
    users_git(p.path(), &["status", "--short"]);
    users_git(p.path(), &["add", "users-file.txt"]);
    users_git(p.path(), &["commit", "-q", "-m", "the user's commit"]);
    let ran = planted.ran();
    for what in ["fsmonitor", "clean", "pre-commit"] {
        assert!(ran.contains(what), "the planted {what} is live: {ran:?}");
    }
}

/// A tracked file in the project, so that a reset, checkout or revert writes files (through the
/// planted smudge filter, were it run).
fn with_tracked_file(p: &Project) {
    std::fs::write(p.path().join("base.txt"), "base\n").unwrap();
    git(p.path(), &["add", "base.txt"]);
    git(p.path(), &["commit", "-q", "-m", "base"]);
}

fn run(
    p: &Project,
    spawner: &dyn Spawner,
    options: &RunOptions,
) -> Result<RunOutcome, OrchestratorError> {
    let host = p.host();
    let mut orch = Orchestrator::new(&host, spawner).unwrap();
    orch.run(options)
}

#[test]
fn a_project_without_a_record_records_on_its_first_run_and_says_so() {
    let p = Project::new("");
    p.decide("english");
    assert!(!trust::trust_file(p.path()).exists());
    let sim = Sim::new(&p);
    let options = RunOptions {
        max_phases: Some(1),
        ..RunOptions::default()
    };
    run(&p, &sim, &options).unwrap();
    assert!(trust::trust_file(p.path()).exists());
    assert_eq!(trust_events(&p, "recorded"), 1);
    let said = p.store().log().read_all().unwrap().iter().any(|r| {
        r.kind == "progress"
            && r.data["message"].as_str().is_some_and(|m| {
                m.contains("recorded the repository's executable git configuration")
            })
    });
    assert!(said, "the run says it recorded the configuration");
    // A second run finds it unchanged: nothing recorded again, nothing refused.
    run(&p, &sim, &options).unwrap();
    assert_eq!(trust_events(&p, "recorded"), 1);
    assert_eq!(trust_events(&p, "refused"), 0);
}

#[test]
fn planted_before_a_first_run_nothing_runs_and_the_run_names_it() {
    let p = Project::new("");
    p.decide("english");
    with_tracked_file(&p);
    // What `metash init` does.
    trust::record_if_absent(p.path()).unwrap().unwrap();
    let planted = plant(p.path());
    let sim = Sim::new(&p);
    let e = run(&p, &sim, &RunOptions::default()).unwrap_err();
    assert_names_the_plant(&e);
    assert_eq!(planted.ran(), "", "metash ran something planted");
    assert!(sim.spawned().is_empty(), "nothing ran at all");
    assert!(
        !p.path().join(".meta/worktrees").exists(),
        "no worktree was made"
    );
    assert_eq!(trust_events(&p, "refused"), 1);
    // Refused again, as long as it is there.
    assert!(run(&p, &sim, &RunOptions::default()).is_err());
    assert_eq!(planted.ran(), "");
    assert_live(&p, &planted);
}

/// Wraps the simulated agents: on the first spawn `when` matches, runs `act` first (the hostile
/// agent's turn) and, with `fail`, answers with an error instead of the agent.
struct Hostile<'a> {
    sim: &'a Sim,
    when: fn(&SpawnRequest) -> bool,
    act: Box<dyn Fn(&SpawnRequest) + Send + Sync + 'a>,
    fail: bool,
    done: AtomicBool,
}

impl Spawner for Hostile<'_> {
    fn spawn_agent(&self, req: &SpawnRequest) -> metash_host::Result<AgentResponse> {
        if (self.when)(req) && !self.done.swap(true, Ordering::SeqCst) {
            (self.act)(req);
            if self.fail {
                return Ok(AgentResponse {
                    status: AgentStatus::Error,
                    data: "planted, and failed on purpose".into(),
                    metadata: ResponseMetadata::default(),
                });
            }
        }
        self.sim.spawn_agent(req)
    }
}

#[test]
fn planted_mid_run_before_a_retry_nothing_runs_until_a_person_accepts() {
    let p = Project::new("");
    p.decide("english");
    with_tracked_file(&p);
    let sim = Sim::new(&p);
    let planted: Mutex<Option<Planted>> = Mutex::new(None);
    let root = p.path().to_path_buf();
    let hostile = Hostile {
        sim: &sim,
        when: |r| r.agent_name == "executor" && r.task_id.as_deref() == Some("hello"),
        act: Box::new(|r: &SpawnRequest| {
            // The executor changes a tracked file (a reset writes it back, through the filter)
            // and plants; then its attempt fails, and the retry begins with `git reset --hard`.
            let wt = r.workdir.clone().unwrap();
            std::fs::write(wt.join("base.txt"), "changed by the executor\n").unwrap();
            *planted.lock().unwrap() = Some(plant(&root));
        }),
        fail: true,
        done: AtomicBool::new(false),
    };
    let e = run(&p, &hostile, &RunOptions::default()).unwrap_err();
    assert_names_the_plant(&e);
    let planted = planted
        .lock()
        .unwrap()
        .take()
        .expect("the executor planted");
    assert_eq!(planted.ran(), "", "metash ran something planted");
    assert_eq!(trust_events(&p, "refused"), 1);

    // A person looks and accepts (`metash git trust --yes`): the run goes on, and metash's git
    // now uses the accepted filter, but still never a hook or an fsmonitor.
    let review = trust::review(p.path()).unwrap().unwrap();
    assert!(!review.changes.is_empty());
    trust::accept(p.path(), &review).unwrap();
    let options = RunOptions {
        max_phases: Some(1),
        ..RunOptions::default()
    };
    run(&p, &hostile, &options).unwrap();
    let ran = planted.ran();
    assert!(ran.contains("smudge") || ran.contains("clean"), "{ran:?}");
    assert!(
        !ran.contains("fsmonitor") && !ran.contains("pre-commit"),
        "{ran:?}"
    );
    assert!(statuses(&p.state())
        .iter()
        .any(|(id, s)| id == "hello" && s == "complete"));
}

#[test]
fn planted_before_a_conflicting_merge_nothing_runs() {
    let p = Project::new("");
    p.decide("english");
    with_tracked_file(&p);
    let mut sim = Sim::new(&p);
    // Both executors write shared.txt: bringing the second up to date in its worktree conflicts.
    sim.same_file = true;
    sim.planner_script.lock().unwrap().push_back(
        r#"{"tasks": [{"id": "x", "title": "X"}, {"id": "y", "title": "Y"}]}"#.to_string(),
    );
    let planted: Mutex<Option<Planted>> = Mutex::new(None);
    let root = p.path().to_path_buf();
    let hostile = Hostile {
        sim: &sim,
        when: |r| r.agent_name == "verifier" && r.task_id.as_deref() == Some("y"),
        act: Box::new(|_: &SpawnRequest| *planted.lock().unwrap() = Some(plant(&root))),
        fail: false,
        done: AtomicBool::new(false),
    };
    let options = RunOptions {
        jobs: Some(2),
        max_phases: Some(1),
        ..RunOptions::default()
    };
    let e = run(&p, &hostile, &options).unwrap_err();
    assert_names_the_plant(&e);
    let planted = planted
        .lock()
        .unwrap()
        .take()
        .expect("the verifier planted");
    assert_eq!(planted.ran(), "", "metash ran something planted");
    assert!(
        !p.path().join(".git/MERGE_HEAD").exists(),
        "no merge was started"
    );

    // Accepted: the merge queue's conflicting update (in the task's worktree, through the git
    // CLI), the resolution's commit and the landings run with the filter, never the hook or the
    // fsmonitor; the project's checkout never waits mid-merge.
    let review = trust::review(p.path()).unwrap().unwrap();
    trust::accept(p.path(), &review).unwrap();
    let outcome = run(&p, &hostile, &options).unwrap();
    assert!(
        matches!(outcome, RunOutcome::PhaseLimit { .. }),
        "{outcome:?}"
    );
    assert!(!p.path().join(".git/MERGE_HEAD").exists());
    let log = std::fs::read_to_string(p.path().join(".meta/events.jsonl")).unwrap();
    assert!(
        log.contains("conflicts in shared.txt") && log.contains("resolved the conflict"),
        "the update conflicted and was resolved"
    );
    let ran = planted.ran();
    assert!(ran.contains("smudge") || ran.contains("clean"), "{ran:?}");
    assert!(
        !ran.contains("fsmonitor") && !ran.contains("pre-commit"),
        "{ran:?}"
    );
}

#[test]
fn planted_before_a_rollback_nothing_runs_and_nothing_is_undone() {
    let p = Project::new("");
    p.decide("english");
    with_tracked_file(&p);
    let sim = Sim::new(&p);
    let options = RunOptions {
        max_phases: Some(1),
        ..RunOptions::default()
    };
    run(&p, &sim, &options).unwrap();
    let head = git(p.path(), &["rev-parse", "HEAD"]);
    let planted = plant(p.path());
    let host = p.host();
    let orch = Orchestrator::new(&host, &sim).unwrap();
    let plan = orch.rollback_plan("hello").unwrap();
    let e = orch.rollback(&plan, true).unwrap_err();
    assert_names_the_plant(&e);
    assert_eq!(planted.ran(), "", "metash ran something planted");
    assert_eq!(
        git(p.path(), &["rev-parse", "HEAD"]),
        head,
        "nothing reverted"
    );
    assert!(statuses(&p.state())
        .iter()
        .any(|(id, s)| id == "hello" && s == "complete"));
    assert_eq!(trust_events(&p, "refused"), 1);

    // Accepted: the rollback runs, with the accepted filter and without the hook.
    let review = trust::review(p.path()).unwrap().unwrap();
    trust::accept(p.path(), &review).unwrap();
    let orch = Orchestrator::new(&host, &sim).unwrap();
    orch.rollback(&plan, true).unwrap();
    assert_ne!(git(p.path(), &["rev-parse", "HEAD"]), head);
    let ran = planted.ran();
    assert!(ran.contains("smudge") || ran.contains("clean"), "{ran:?}");
    assert!(
        !ran.contains("fsmonitor") && !ran.contains("pre-commit"),
        "{ran:?}"
    );
}

#[test]
fn an_include_into_the_work_tree_is_read_and_reported() {
    let p = Project::new("");
    trust::record_if_absent(p.path()).unwrap().unwrap();
    // `.git/config` includes a file of the work tree, where agents write.
    git(p.path(), &["config", "include.path", "../shared.gitconfig"]);
    std::fs::write(
        p.path().join("shared.gitconfig"),
        "[filter \"x\"]\n\tclean = sh -c 'touch /tmp/never'\n",
    )
    .unwrap();
    let review = trust::review(p.path()).unwrap().unwrap();
    let named: Vec<String> = review.changes.iter().map(trust::Change::what).collect();
    assert!(
        named.contains(&".git/config: include.path".to_string()),
        "{named:?}"
    );
    assert!(
        named.contains(&"shared.gitconfig: filter.x.clean".to_string()),
        "{named:?}"
    );
    assert!(
        review
            .warnings
            .iter()
            .any(|w| w.contains("inside a work tree")),
        "{:?}",
        review.warnings
    );
}

/// git with `HOME` a directory of the test's own (no global config of the machine's user),
/// for the LFS set-up.
fn lfs_git(dir: &Path, home: &Path, args: &[&str]) -> Vec<u8> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["-c", "user.name=t", "-c", "user.email=t@localhost"])
        .args(args)
        .env("HOME", home)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

const LFS_CONTENT: &[u8] = b"the real contents of data.bin, not a pointer\n\x00\x01\x02\xff\n";

/// Records what each executor finds in its worktree's `data.bin`.
struct LfsWatch<'a> {
    sim: &'a Sim,
    seen: Mutex<Vec<(String, Vec<u8>)>>,
}

impl Spawner for LfsWatch<'_> {
    fn spawn_agent(&self, req: &SpawnRequest) -> metash_host::Result<AgentResponse> {
        if req.agent_name == "executor" {
            let wt = req.workdir.clone().unwrap();
            let bytes = std::fs::read(wt.join("data.bin")).unwrap_or_default();
            let task = req.task_id.clone().unwrap_or_default();
            self.seen.lock().unwrap().push((task, bytes));
        }
        self.sim.spawn_agent(req)
    }
}

#[test]
fn lfs_files_have_their_contents_in_task_worktrees_and_after_merges() {
    let test = "lfs_files_have_their_contents_in_task_worktrees_and_after_merges";
    if Command::new("git-lfs").arg("version").output().is_err() {
        metash_testkit::skip(test, "git-lfs is not installed (scripts/setup installs it)");
        return;
    }
    let p = Project::new("jobs = 2");
    p.decide("english");
    let home = tempfile::tempdir().unwrap();
    let g = |args: &[&str]| lfs_git(p.path(), home.path(), args);
    g(&["lfs", "install", "--local"]);
    std::fs::write(
        p.path().join(".gitattributes"),
        "*.bin filter=lfs diff=lfs merge=lfs -text\n",
    )
    .unwrap();
    std::fs::write(p.path().join("data.bin"), LFS_CONTENT).unwrap();
    g(&["add", ".gitattributes", "data.bin"]);
    g(&["commit", "-q", "-m", "data.bin in LFS"]);
    let stored = g(&["cat-file", "-p", "HEAD:data.bin"]);
    assert!(
        stored.starts_with(b"version https://git-lfs"),
        "git stores a pointer"
    );

    let sim = Sim::new(&p);
    let watch = LfsWatch {
        sim: &sim,
        seen: Mutex::new(Vec::new()),
    };
    let options = RunOptions {
        max_phases: Some(1),
        ..RunOptions::default()
    };
    run(&p, &watch, &options).unwrap();
    let seen = watch.seen.lock().unwrap().clone();
    assert!(!seen.is_empty(), "executors ran");
    for (task, bytes) in &seen {
        assert_eq!(
            bytes.as_slice(),
            LFS_CONTENT,
            "task {task}'s worktree holds the real file"
        );
    }
    assert_eq!(
        std::fs::read(p.path().join("data.bin")).unwrap(),
        LFS_CONTENT
    );
    assert_eq!(
        p.file_at_head("hello.txt"),
        "Hello, world!",
        "the tasks were merged"
    );
    let status = g(&["status", "--porcelain", "--", ".", ":(exclude).meta"]);
    assert!(
        status.is_empty(),
        "git status is clean: {}",
        String::from_utf8_lossy(&status)
    );
}
