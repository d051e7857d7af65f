//! Issue 17's figure: tasks claimed and completed per second by metash's lease protocol (no-op
//! tasks: claim with a fencing token, then a completion that checks the token, appends the
//! hash-chained `task_completed` record and counts down dependents, in one transaction)
//! against a bare `FOR UPDATE SKIP LOCKED` claim/complete loop on the same server, with 1, 2,
//! 4 and 8 workers (one connection each), side by side in one run. Also the bench process's
//! CPU time per task. `cargo bench -p metash-store --bench pg_lease`; `METASH_BENCH_TASKS`
//! sets the tasks per run (2,000). It prints; it does not assert a speed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use metash_store::pg::lease::{self, Outcome, TaskSpec};
use metash_store::pg::{self, Db};
use serde_json::json;

const LEASE: Duration = Duration::from_secs(60);

fn cpu() -> Duration {
    // SAFETY: getrusage fills the struct we pass.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, (t.tv_usec as u32) * 1000);
    tv(u.ru_utime) + tv(u.ru_stime)
}

/// The baseline: one statement claims, one completes.
fn bare_worker(db: &mut Db) -> usize {
    let c = db.client();
    let claim = c
        .prepare(
            "WITH p AS (SELECT id FROM bare WHERE state = 'ready' LIMIT 1 FOR UPDATE SKIP LOCKED)
             UPDATE bare b SET state = 'leased' FROM p WHERE b.id = p.id RETURNING b.id",
        )
        .unwrap();
    let done = c
        .prepare("UPDATE bare SET state = 'done' WHERE id = $1")
        .unwrap();
    let mut n = 0;
    while let Some(row) = c.query_opt(&claim, &[]).unwrap() {
        let id: i32 = row.get(0);
        c.execute(&done, &[&id]).unwrap();
        n += 1;
    }
    n
}

fn metash_worker(c: &mut Db, project: &str, w: usize) -> usize {
    let mut n = 0;
    loop {
        let got = lease::claim(c, project, &format!("w{w}"), &[], 1, LEASE).unwrap();
        let Some(l) = got.into_iter().next() else {
            return n;
        };
        lease::complete(c, project, &l.task, l.token, Outcome::Done, &json!({}), &[]).unwrap();
        n += 1;
    }
}

/// Runs `workers` threads of `work` to the end; (tasks per second, CPU per task).
fn run(
    url: &str,
    workers: usize,
    tasks: usize,
    work: impl Fn(&mut Db, usize) -> usize + Sync,
) -> (f64, Duration) {
    let mut conns: Vec<Db> = (0..workers).map(|_| Db::open(url, None).unwrap()).collect();
    let (t0, c0) = (Instant::now(), cpu());
    let done: usize = std::thread::scope(|s| {
        let hs: Vec<_> = conns
            .iter_mut()
            .enumerate()
            .map(|(w, c)| {
                let work = &work;
                s.spawn(move || work(c, w))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).sum()
    });
    let (wall, used) = (t0.elapsed(), cpu() - c0);
    assert_eq!(done, tasks, "every task once");
    (tasks as f64 / wall.as_secs_f64(), used / tasks as u32)
}

fn main() {
    let bin = match metash_testkit::postgres::prerequisites() {
        Ok(b) => b,
        Err(why) => return metash_testkit::skip("pg lease bench", &why),
    };
    let quick = !std::env::args().any(|a| a == "--bench");
    let tasks: usize = std::env::var("METASH_BENCH_TASKS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if quick { 50 } else { 2000 });
    let server = metash_testkit::postgres::Postgres::start(&bin).unwrap();
    let url = server.url("postgres");
    let mut c = Db::open(&url, None).unwrap();
    c.client()
        .batch_execute("CREATE TABLE bare (id int PRIMARY KEY, state text NOT NULL)")
        .unwrap();
    println!("lease protocol vs bare SKIP LOCKED, {tasks} no-op tasks per run, PostgreSQL on loopback (fsync on)");
    println!("| workers | bare tasks/s | metash tasks/s | metash ÷ bare | bare CPU/task | metash CPU/task |");
    println!("|---|---|---|---|---|---|");
    for (round, workers) in [1usize, 2, 4, 8].into_iter().enumerate() {
        c.client().batch_execute("TRUNCATE bare").unwrap();
        c.client()
            .execute(
                "INSERT INTO bare SELECT g, 'ready' FROM generate_series(1, $1::int) g",
                &[&(tasks as i32)],
            )
            .unwrap();
        let project = format!("bench{round}");
        let specs: Vec<TaskSpec> = (0..tasks)
            .map(|i| TaskSpec {
                id: format!("t{i:05}"),
                deps: vec![],
                labels: vec![],
                payload: json!({}),
            })
            .collect();
        lease::enqueue(&mut c, &project, &specs).unwrap();
        let (bare, bare_cpu) = run(&url, workers, tasks, |c, _| bare_worker(c));
        let (ours, our_cpu) = run(&url, workers, tasks, |c, w| metash_worker(c, &project, w));
        println!(
            "| {workers} | {bare:.0} | {ours:.0} | {:.2} | {} µs | {} µs |",
            ours / bare,
            bare_cpu.as_micros(),
            our_cpu.as_micros()
        );
        assert_eq!(
            pg::log::verify(&mut c, &project).unwrap() as usize,
            tasks + 1
        );
    }
}
