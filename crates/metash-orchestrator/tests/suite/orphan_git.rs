//! A run killed while one of its git commands runs: that git finishes on its own, and the next run
//! must not start before it has. Every git child inherits the run lock, so the lock stays taken
//! until the orphan exits, then frees itself. The orphan runs until the test lets it end (a file
//! it waits for), so no step depends on how fast the machine is.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use metash_orchestrator::git::Git;

const CHILD_DIR: &str = "METASH_ORPHAN_GIT_DIR";

/// The orphan git's alias: says it started (the lock is then held by git and this shell), waits
/// until the test writes `release` (at most 60 s, and no longer than the test's directory lives,
/// should the test have failed), and says it is done just before it exits.
const ALIAS: &str = "alias.slow=!touch git-started; i=0; \
     while [ ! -e release ] && [ -e .git ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done; \
     touch git-done";

/// The "run": takes the lock, hands it down, starts a git command that runs until the test lets
/// it end (an alias to a shell loop), and is SIGKILLed by the test meanwhile.
#[test]
#[ignore = "run by orphan_git_holds_the_run_lock_until_it_exits"]
fn orphan_git_child() {
    let Some(dir) = std::env::var_os(CHILD_DIR) else {
        return;
    };
    let dir = Path::new(&dir);
    let lock = metash_store::lock::acquire(&dir.join("run.lock"), Duration::from_secs(1)).unwrap();
    let git = Git::new(dir);
    let _handed = git.handing_down(&lock);
    let _ = git.run(dir, &["-c", ALIAS, "slow"]);
}

#[test]
fn orphan_git_holds_the_run_lock_until_it_exits() {
    let t = tempfile::tempdir().unwrap();
    let d = t.path();
    assert!(Command::new("git")
        .args(["init", "-q"])
        .current_dir(d)
        .status()
        .unwrap()
        .success());
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "suite::orphan_git::orphan_git_child",
            "--ignored",
            "--test-threads=1",
        ])
        .env(CHILD_DIR, d)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Ends the orphan however this test ends.
    struct Release<'a>(&'a Path);
    impl Drop for Release<'_> {
        fn drop(&mut self) {
            let _ = std::fs::write(self.0.join("release"), "");
        }
    }
    let release = Release(d);
    // The run's git has started (and inherited the lock) once its shell wrote the marker.
    let until = Instant::now() + Duration::from_secs(30);
    while !d.join("git-started").exists() {
        assert!(Instant::now() < until, "the run's git never started");
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    // The run is dead; its git (and the shell it started) still holds the lock.
    let busy = metash_store::lock::acquire(&d.join("run.lock"), Duration::from_millis(200));
    assert!(
        busy.is_err(),
        "the lock was free while the killed run's git still ran"
    );
    assert!(!d.join("git-done").exists(), "the orphan ended early");
    // Once that git has exited, the lock is free without anyone releasing it, and not before.
    drop(release);
    let _next = metash_store::lock::acquire(&d.join("run.lock"), Duration::from_secs(30)).unwrap();
    assert!(
        d.join("git-done").exists(),
        "the lock came free before the orphan had finished"
    );
}
