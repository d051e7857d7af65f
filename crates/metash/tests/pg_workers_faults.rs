#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Issue 17's fault test. A plan of 200 small tasks with dependencies is run by a coordinator
//! (`metash run --workers`) and four `metash worker`s, one of them in a network namespace of its
//! own that reaches the server over a veth link, as another machine would. Meanwhile the test:
//! - kills random workers with SIGKILL (at least 30 times), starting each again;
//! - cuts the namespaced worker's link for longer than a lease;
//! - restarts PostgreSQL once;
//! - runs two of the workers under one name, as a worker started twice would;
//! - runs one worker with its clock two hours ahead (libfaketime), as another machine's may be.
//!
//! The plan must end with every task complete exactly once, its commit in git, the log's hash
//! chain verifying, and no turn's completion recorded twice. The figures are printed.
#![cfg(target_os = "linux")]

#[path = "support/pg_project.rs"]
mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use metash_testkit::postgres::{prerequisites, Postgres};
use serde_json::Value;
use support::{clone, git, metash, ok, project, store_toml, EXAMPLE_GRANTS};

const TASKS: usize = 200;
const KILLS: usize = 30;
const LEASE_S: &str = "3";
/// Debian's libfaketime (package `faketime`, installed by scripts/setup).
const FAKETIME_LIB: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";
/// Far longer than the plan takes (about a minute here): past it, something is stuck.
const DEADLINE: Duration = Duration::from_secs(600);

fn run(cmd: &str, args: &[&str]) -> Result<(), String> {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .map_err(|e| format!("{cmd}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{cmd} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// A network namespace joined to this one by a veth pair: 10.231.N.1 here, .2 there.
struct Netns {
    name: String,
    here: String,
}

impl Netns {
    fn make(n: u32) -> Result<Self, String> {
        let tag = std::process::id() % 100_000;
        let ns = Self {
            name: format!("metash-w{tag}"),
            here: format!("mtw{tag}a"),
        };
        let there = format!("mtw{tag}b");
        run("ip", &["netns", "add", &ns.name])?;
        run(
            "ip",
            &[
                "link", "add", &ns.here, "type", "veth", "peer", "name", &there,
            ],
        )?;
        run("ip", &["link", "set", &there, "netns", &ns.name])?;
        run(
            "ip",
            &["addr", "add", &format!("10.231.{n}.1/24"), "dev", &ns.here],
        )?;
        run("ip", &["link", "set", &ns.here, "up"])?;
        let inside = |args: &[&str]| {
            let mut all = vec!["netns", "exec", &ns.name, "ip"];
            all.extend_from_slice(args);
            run("ip", &all)
        };
        inside(&["addr", "add", &format!("10.231.{n}.2/24"), "dev", &there])?;
        inside(&["link", "set", &there, "up"])?;
        inside(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    fn link(&self, up: bool) {
        run(
            "ip",
            &["link", "set", &self.here, if up { "up" } else { "down" }],
        )
        .unwrap();
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = run("ip", &["link", "del", &self.here]);
        let _ = run("ip", &["netns", "del", &self.name]);
    }
}

/// 200 tasks in one phase; each after its parent in a binary tree (depth 8).
fn context() -> String {
    let tasks: Vec<Value> = (0..TASKS)
        .map(|i| {
            let deps: Vec<String> = if i == 0 {
                vec![]
            } else {
                vec![format!("t{:03}", (i - 1) / 2)]
            };
            // Every tenth task needs a worker that offers `big` (w3 and w4 do).
            let labels: Vec<&str> = if i % 10 == 0 { vec!["big"] } else { vec![] };
            serde_json::json!({"id": format!("t{i:03}"), "title": format!("task {i}"),
                               "dependencies": deps, "labels": labels})
        })
        .collect();
    format!(
        "# Fan-out\n\nMany small tasks.\n\n```plan\n{}\n```\n",
        serde_json::json!({"phases": [tasks]})
    )
}

/// One worker: its clone, and (for one) the namespace it runs in.
struct Slot {
    id: String,
    ws: PathBuf,
    netns: Option<String>,
    big: bool,
    /// This machine's clock is off by this much (libfaketime), as another machine's may be.
    skew: Option<&'static str>,
    child: Option<Child>,
}

impl Slot {
    fn start(&mut self) {
        let mut cmd = match &self.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns])
                    .arg(env!("CARGO_BIN_EXE_metash"));
                c
            }
            None => {
                let mut c = Command::new(env!("CARGO_BIN_EXE_metash"));
                // libfaketime preloaded into the worker itself (the `faketime` command would
                // be the process the test kills, and leave the worker running).
                if let Some(skew) = self.skew {
                    c.env("LD_PRELOAD", FAKETIME_LIB)
                        .env("FAKETIME", skew)
                        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
                }
                c
            }
        };
        let child = cmd
            .arg("-C")
            .arg(&self.ws)
            .args([
                "worker",
                "--id",
                &self.id,
                "--slots",
                "2",
                "--lease-seconds",
                LEASE_S,
            ])
            .args(if self.big {
                &["--labels", "big"][..]
            } else {
                &[]
            })
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        self.child = Some(child);
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The four workers: their clones, names, namespace, labels and clock.
fn workers(dir: &Path, coord: &Path, local_url: &str, far_url: &str, ns: &str) -> Vec<Slot> {
    (1..=4)
        .map(|i| {
            let ws = dir.join(format!("w{i}"));
            let far = i == 4;
            clone(
                coord,
                &ws,
                &store_toml(if far { far_url } else { local_url }, "fanout"),
            );
            Slot {
                // Two processes share the name w1, as a worker started twice would.
                id: format!("w{}", if i == 2 { 1 } else { i }),
                ws,
                netns: far.then(|| ns.to_string()),
                big: i >= 3,
                skew: (i == 3).then_some("+7200"),
                child: None,
            }
        })
        .collect()
}

/// The coordinator runs (again after the database restart takes it down, as an operator would
/// run it again); `done` is set when it ends. Its last failure, if it gave up.
fn coordinator(
    coord: &Path,
    done: &Arc<AtomicBool>,
    runs: &Arc<AtomicUsize>,
) -> std::thread::JoinHandle<String> {
    let (coord, done, runs) = (coord.to_path_buf(), Arc::clone(done), Arc::clone(runs));
    std::thread::spawn(move || {
        let mut last = String::new();
        for _ in 0..8 {
            runs.fetch_add(1, Ordering::SeqCst);
            let out = metash(&coord, &["run", "--workers", "--jobs", "16"]);
            if out.status.success() {
                done.store(true, Ordering::SeqCst);
                return String::new();
            }
            last = String::from_utf8_lossy(&out.stderr).into_owned();
            std::thread::sleep(Duration::from_secs(1));
        }
        done.store(true, Ordering::SeqCst);
        last
    })
}

/// Until `done`: a random worker killed and started again every 0.3-0.7 s; the far worker's
/// link cut for 5 s at 6 s; the server restarted at 14 s. The kills, and what else happened.
fn chaos(
    done: &AtomicBool,
    coord: &Path,
    ns: &Netns,
    server: &mut Postgres,
    slots: &mut [Slot],
) -> (usize, Vec<String>) {
    let started = Instant::now();
    let (mut kills, mut seed) = (0usize, u64::from(std::process::id()));
    let mut events = Vec::new();
    while !done.load(Ordering::SeqCst) {
        assert!(
            started.elapsed() < DEADLINE,
            "the plan did not finish in {DEADLINE:?}: {}",
            ok(coord, &["status"])
        );
        std::thread::sleep(Duration::from_millis(300 + next(&mut seed) % 400));
        let t = started.elapsed().as_secs_f64();
        if events.is_empty() && t >= 6.0 {
            // The far worker is cut off for longer than a lease.
            ns.link(false);
            std::thread::sleep(Duration::from_secs(5));
            ns.link(true);
            events.push(format!("link cut 5 s at {t:.1} s"));
        }
        if events.len() == 1 && t >= 14.0 {
            server.stop();
            server.restart().unwrap();
            events.push(format!("postgres restarted at {t:.1} s"));
        }
        let i = usize::try_from(next(&mut seed) % 4).unwrap_or(0);
        slots[i].kill();
        slots[i].start();
        kills += 1;
    }
    (kills, events)
}

/// A small deterministic sequence for the chaos (no crate needed).
fn next(seed: &mut u64) -> u64 {
    *seed = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    *seed >> 33
}

#[test]
fn two_hundred_tasks_survive_kills_a_partition_and_a_database_restart() {
    let bin = match prerequisites() {
        Ok(b) => b,
        Err(why) => return metash_testkit::skip("workers fault test", &why),
    };
    // SAFETY: geteuid has no arguments and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return metash_testkit::skip("workers fault test", "network namespaces need root");
    }
    if !Path::new(FAKETIME_LIB).is_file() {
        return metash_testkit::skip(
            "workers fault test",
            "libfaketime is missing (scripts/setup)",
        );
    }
    let net = 10 + std::process::id() % 200;
    let ns = Netns::make(net).unwrap();
    let mut server = Postgres::start(&bin).unwrap();
    server
        .listen_also(&format!("10.231.{net}.1"), &format!("10.231.{net}.0/24"))
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let local_url = server.url("postgres");
    let head = store_toml(&local_url, "fanout");
    let (coord, _) = project(dir.path(), "coordinator", &head, &context(), EXAMPLE_GRANTS);
    let far_url = format!("postgres://metash@10.231.{net}.1:{}/postgres", server.port);
    let mut slots = workers(dir.path(), &coord, &local_url, &far_url, &ns.name);
    for s in &mut slots {
        s.start();
    }

    let done = Arc::new(AtomicBool::new(false));
    let runs = Arc::new(AtomicUsize::new(0));
    let coordinator = coordinator(&coord, &done, &runs);
    let started = Instant::now();
    let (kills, events) = chaos(&done, &coord, &ns, &mut server, &mut slots);
    let failure = coordinator.join().unwrap();
    for s in &mut slots {
        s.kill();
    }
    let elapsed = started.elapsed();
    assert!(failure.is_empty(), "the coordinator gave up: {failure}");
    assert!(
        kills >= KILLS,
        "only {kills} kills happened before the plan ended"
    );
    assert_eq!(
        events.len(),
        2,
        "the partition and the restart happened: {events:?}"
    );

    check_the_plan(&coord, &local_url);
    let mut db = metash_store::pg::Db::open(&local_url, None).unwrap();
    let count = |db: &mut metash_store::pg::Db, kind: &str| -> i64 {
        db.client()
            .query_one(
                "SELECT count(*) FROM metash.log WHERE project = 'fanout' AND kind = $1",
                &[&kind],
            )
            .unwrap()
            .get(0)
    };
    println!(
        "fault test: {TASKS} tasks in {:.1} s; {kills} SIGKILLs; {}; coordinator runs {}; \
         turns queued {}, completed {}, refused {}, withdrawn {}, lease expiries {}",
        elapsed.as_secs_f64(),
        events.join(", "),
        runs.load(Ordering::SeqCst),
        count(&mut db, "tasks_enqueued"),
        count(&mut db, "task_completed"),
        count(&mut db, "task_completion_refused"),
        count(&mut db, "tasks_cancelled"),
        count(&mut db, "leases_expired"),
    );
}

/// Every task complete once, merged, with its one commit in git; every turn's completion
/// recorded at most once; the chain verifying.
fn check_the_plan(coord: &Path, url: &str) {
    let status: Value = serde_json::from_str(&ok(coord, &["--json", "status"])).unwrap();
    assert_eq!(status["halt"]["reason"], "complete", "{status}");
    let tasks = status["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), TASKS);
    for t in tasks {
        assert_eq!(t["status"], "complete", "{t}");
        assert_eq!(t["merged"], true, "{t}");
        let commits = t["commits"].as_array().unwrap();
        assert_eq!(commits.len(), 1, "one commit per task: {t}");
        let sha = commits[0].as_str().unwrap();
        git(coord, &["merge-base", "--is-ancestor", sha, "HEAD"]);
        let id = t["id"].as_str().unwrap();
        let file = git(coord, &["show", &format!("HEAD:tasks/{id}.txt")]);
        assert_eq!(file.trim(), t["title"].as_str().unwrap());
    }
    let verified = ok(coord, &["log", "verify"]);
    assert!(verified.contains("hash chain intact"), "{verified}");
    let mut db = metash_store::pg::Db::open(url, None).unwrap();
    let twice: i64 = db
        .client()
        .query_one(
            "SELECT count(*) FROM (
                 SELECT line::jsonb -> 'data' ->> 'task' AS qid FROM metash.log
                 WHERE project = 'fanout' AND kind = 'task_completed'
                 GROUP BY 1 HAVING count(*) > 1) AS d",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(twice, 0, "no turn's completion recorded twice");
    // Labels: every turn of a task that needs `big` was run by a worker offering it.
    let wrong: i64 = db
        .client()
        .query_one(
            "SELECT count(*) FROM metash.log WHERE project = 'fanout' AND kind = 'task_completed'
               AND (line::jsonb -> 'data' ->> 'task') ~ '^t[0-9]{2}0#'
               AND (line::jsonb ->> 'agent') NOT IN ('w3', 'w4')",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(wrong, 0, "a task needing `big` ran on a worker without it");
    let by: Vec<(String, i64)> = db
        .client()
        .query(
            "SELECT line::jsonb ->> 'agent', count(*) FROM metash.log
             WHERE project = 'fanout' AND kind = 'task_completed' GROUP BY 1 ORDER BY 1",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    println!("turns completed per worker: {by:?}");
    assert!(
        by.iter().any(|(w, n)| w == "w3" && *n > 0),
        "the worker with the skewed clock did its share: {by:?}"
    );
    let pending: i64 = db
        .client()
        .query_one(
            "SELECT count(*) FROM metash.pending WHERE project = 'fanout'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(pending, 0, "every completion chained");
}
