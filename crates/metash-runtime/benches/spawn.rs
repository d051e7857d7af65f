//! Spawn cost, printed as medians with ratios in one run (`cargo bench -p metash-runtime`): a bare
//! `posix_spawn` of a tiny program, the same through the native sandbox with every restriction on
//! (started as a native agent is: `Sandbox::start`, from the spawner thread, without copying the
//! host), the same under `bwrap --unshare-net` when installed, and a WASM agent's instantiate +
//! run from the module cache; then, in a pass of their own, the fork paths for reference
//! (fork+exec forced by an empty `pre_exec`, directly and through the spawner thread).
//! `METASH_BENCH_ONLY=text` keeps only the rows whose name contains it (and the bare one).
//! Not a timed test: it prints, it does not assert.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use metash_protocol::{Manifest, SandboxKind};
use metash_runtime::native::{ChildIo, NativeProcess, Sandbox};
use metash_runtime::{
    ActionGate, AgentSpec, EventSink, Gate, GateVerdict, GatedAction, NullSink, Runtime,
    RuntimeConfig,
};

const TINY: &str = "/bin/true";

/// A gate that allows everything: the exec gate row measures the supervisor, not a decision.
struct AllowAll;

impl ActionGate for AllowAll {
    fn decide(&self, _agent: &str, _action: &GatedAction<'_>) -> GateVerdict {
        GateVerdict::Allow
    }
}

/// A measured case: its name, one run, and a note for the table.
type Case<'a> = (&'static str, Box<dyn FnMut() + 'a>, String);

fn median(n: usize, mut f: impl FnMut()) -> Duration {
    for _ in 0..(n / 10).max(3) {
        f();
    }
    let mut v: Vec<Duration> = (0..n)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .collect();
    v.sort();
    v[v.len() / 2]
}

/// A sandboxed spawn+wait, started as a native agent is (`Sandbox::start`: from the spawner
/// thread, without copying the host).
fn sandboxed_run(sb: &Sandbox) {
    let mut child = sb.start([ChildIo::Null; 3]).unwrap();
    assert!(child.wait().unwrap().success());
}

fn quiet(cmd: &mut Command) -> &mut Command {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
}

fn manifest(sandbox: SandboxKind) -> Manifest {
    let mut m = Manifest::new("bench", "x", sandbox);
    m.resources.cpu = Some("500m".into());
    m.resources.mem = Some("64Mi".into());
    m
}

const ECHO_WAT: &str = r#"(module
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 64) "{\"schema_version\":\"0.1\",\"type\":\"done\"}\n")
  (func (export "_start")
    (i32.store (i32.const 0) (i32.const 64))
    (i32.store (i32.const 4) (i32.const 39))
    (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))))
"#;

/// A row of the table: the case, its median (none when skipped), a note.
type Row<'a> = (&'a str, Option<Duration>, String);

const SANDBOXED: &str = "native sandbox spawn+wait (all restrictions)";
const GATED: &str = "native sandbox + exec gate";
const BWRAP: &str = "bwrap --unshare-net --ro-bind / /";
const BARE: &str = "bare spawn+wait (posix_spawn)";

/// The machine's load average (`/proc/loadavg`'s first three fields): the ratios move with it.
fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

/// The native spec every sandboxed case uses. No CPU share: 300 spawns in one cgroup with a 500m
/// quota would measure CFS throttling of the loop itself, not the sandbox. Memory and pids
/// cgroups stay on.
fn native_spec(ws: &Path) -> AgentSpec {
    let mut native_manifest = manifest(SandboxKind::Native);
    native_manifest.resources.cpu = None;
    let mut spec = AgentSpec::new("bench", native_manifest, TINY, ws);
    spec.granted = vec!["files.read".into()];
    spec.allow_native = true;
    spec
}

/// bubblewrap, when installed and able to make its namespaces here.
fn bwrap() -> Option<&'static str> {
    ["/usr/bin/bwrap", "/bin/bwrap"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .filter(|b| {
            quiet(Command::new(b).args(["--unshare-net", "--ro-bind", "/", "/", TINY]))
                .status()
                .map(|s| s.success())
                .unwrap_or(false)
        })
}

/// The bare `posix_spawn`, every table's baseline.
fn bare_case<'a>() -> Case<'a> {
    (
        BARE,
        Box::new(|| {
            quiet(&mut Command::new(TINY)).status().unwrap();
        }),
        String::new(),
    )
}

/// The fork paths, for reference (what a spawn cost before `Sandbox::start`), with their own
/// bare case. Measured in a pass of their own: a fork copies the host, and every page the host
/// writes afterwards faults once (copy-on-write) in whichever case runs next, which in one
/// interleaved pass added about 0.05x to the sandboxed row.
fn fork_cases<'a>() -> Vec<Case<'a>> {
    vec![
        bare_case(),
        (
            "bare fork+exec via the spawner thread",
            Box::new(|| {
                let mut c = Command::new(TINY);
                // SAFETY: an empty pre_exec closure; it only forces the fork+exec path.
                unsafe {
                    c.pre_exec(|| Ok(()));
                }
                quiet(&mut c);
                NativeProcess::spawn_command(c).unwrap().wait().unwrap();
            }),
            String::new(),
        ),
        (
            "bare fork+exec (empty pre_exec)",
            Box::new(|| {
                let mut c = Command::new(TINY);
                // SAFETY: an empty pre_exec closure; it only forces the fork+exec path.
                unsafe {
                    c.pre_exec(|| Ok(()));
                }
                quiet(&mut c).status().unwrap();
            }),
            String::new(),
        ),
    ]
}

/// The sandboxed cases (prepared once, and prepared per spawn), or why they are skipped.
fn sandbox_cases<'a>(
    sandbox: &'a metash_runtime::Result<Sandbox>,
    spec: &AgentSpec,
    sink: &Arc<dyn EventSink>,
    cases: &mut Vec<Case<'a>>,
    rows: &mut Vec<Row<'a>>,
) {
    let sb = match sandbox {
        Ok(sb) => sb,
        Err(e) => return rows.push(("native sandbox", None, format!("skipped: {e}"))),
    };
    cases.push((
        SANDBOXED,
        Box::new(move || {
            sandboxed_run(sb);
        }),
        "setsid, pdeathsig, cgroup join, rlimits, caps dropped, no_new_privs, Landlock, seccomp"
            .into(),
    ));
    let (spec, sink) = (spec.clone(), Arc::clone(sink));
    cases.push((
        "native sandbox prepare+spawn+wait",
        Box::new(move || {
            let sb = Sandbox::prepare(&spec, &sink, &metash_runtime::Replier::default()).unwrap();
            sandboxed_run(&sb);
        }),
        "plus building the ruleset, seccomp program and cgroups per agent".into(),
    ));
}

/// The exec gate's case and bubblewrap's, or why they are skipped.
fn other_cases<'a>(
    gated: &'a Result<Sandbox, String>,
    cases: &mut Vec<Case<'a>>,
    rows: &mut Vec<Row<'a>>,
) {
    match gated {
        Ok(sb) => cases.push((
            GATED,
            Box::new(move || {
                sandboxed_run(sb);
            }),
            "all restrictions, plus the exec notify filter, fd handoff and supervisor round trip"
                .into(),
        )),
        Err(e) => rows.push((GATED, None, format!("skipped: {e}"))),
    }
    match bwrap() {
        Some(b) => cases.push((
            BWRAP,
            Box::new(move || {
                quiet(Command::new(b).args(["--unshare-net", "--ro-bind", "/", "/", TINY]))
                    .status()
                    .unwrap();
            }),
            String::new(),
        )),
        None => rows.push((
            "bwrap",
            None,
            "skipped: bubblewrap not installed or cannot create namespaces (apt-get install -y bubblewrap)"
                .into(),
        )),
    }
}

/// The pause after each sample (see [`measure`]): `METASH_BENCH_SETTLE_MS`, 1 ms by default.
fn settle() -> Duration {
    let ms = std::env::var("METASH_BENCH_SETTLE_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    Duration::from_millis(ms)
}

/// Runs the process cases interleaved (one sample of each per round, after 10 warm-up rounds), so
/// a load change on this shared machine hits every case alike and the ratios stay meaningful.
/// Each sample is followed by an untimed pause ([`settle`]).
/// Their medians go in front of `rows`, in order; returns them by name.
fn measure<'a>(
    n: usize,
    mut cases: Vec<Case<'a>>,
    rows: &mut Vec<Row<'a>>,
) -> Vec<(&'a str, Duration)> {
    // `METASH_BENCH_ONLY=text`: only the cases whose name contains it (for a profiler's run).
    if let Ok(only) = std::env::var("METASH_BENCH_ONLY") {
        cases.retain(|(name, _, _)| name.contains(only.as_str()) || *name == BARE);
    }
    let mut samples: Vec<Vec<Duration>> = vec![Vec::new(); cases.len()];
    let pause = settle();
    for round in 0..n + 10 {
        for (i, (_, f, _)) in cases.iter_mut().enumerate() {
            let t = Instant::now();
            f();
            if round >= 10 {
                samples[i].push(t.elapsed());
            }
            // Untimed: what a case leaves behind (a namespace torn down on the keeper thread, an
            // exiting process) finishes here instead of in the next case's time.
            std::thread::sleep(pause);
        }
    }
    let mut medians = Vec::new();
    for ((name, _, note), mut v) in cases.into_iter().zip(samples) {
        v.sort();
        let m = v[v.len() / 2];
        medians.push((name, m));
        rows.insert(medians.len() - 1, (name, Some(m), note));
    }
    medians
}

/// A WASM agent's invoke from a module loaded from the disk cache: its median, and the note.
fn wasm_case(n: usize, dir: &Path, ws: &Path, sink: &Arc<dyn EventSink>) -> (Duration, String) {
    let wat = dir.join("echo.wat");
    std::fs::write(&wat, ECHO_WAT).unwrap();
    let cache = dir.join("cache");
    let wspec = AgentSpec::new("wbench", manifest(SandboxKind::Wasm), &wat, ws);
    let runtime = || {
        Runtime::new(
            RuntimeConfig {
                cache_dir: cache.clone(),
                cache_key: metash_runtime::CacheKey::ephemeral().expect("cache key"),
            },
            Arc::clone(sink),
        )
        .unwrap()
    };
    // Compile once into the disk cache, then a fresh runtime loads it from disk.
    runtime().register(wspec.clone()).unwrap().start().unwrap();
    let rt = runtime();
    let mut agent = rt.register(wspec).unwrap();
    let t = Instant::now();
    let report = agent.start().unwrap();
    let load = t.elapsed();
    assert_eq!(report["module_cache"], "disk");
    let wasm = median(n * 10, || {
        let o = agent.invoke("go", &[], &mut |_| {}).unwrap();
        assert!(matches!(
            o.status,
            metash_runtime::InvocationStatus::Done { .. }
        ));
    });
    (
        wasm,
        format!("first load from the disk cache took {load:?}"),
    )
}

fn print_table(rows: &[Row<'_>], bare: Duration) {
    println!(
        "\n{:<52} {:>12} {:>10}  notes",
        "case (median)", "time", "x bare"
    );
    for (name, d, note) in rows {
        match d {
            Some(d) => println!(
                "{name:<52} {:>9.1} us {:>9.2}x  {note}",
                d.as_secs_f64() * 1e6,
                d.as_secs_f64() / bare.as_secs_f64()
            ),
            None => println!("{name:<52} {:>12} {:>10}  {note}", "-", "-"),
        }
    }
    println!();
}

fn print_targets(medians: &[(&str, Duration)], bare: Duration, wasm: Duration) {
    let get = |name: &str| medians.iter().find(|(n, _)| *n == name).map(|(_, d)| *d);
    if let Some(s) = get(SANDBOXED) {
        let r = s.as_secs_f64() / bare.as_secs_f64();
        println!(
            "target sandboxed <= 1.5x bare: {r:.2}x ({})",
            if r <= 1.5 { "met" } else { "MISSED" }
        );
        if let Some(g) = get(GATED) {
            println!(
                "exec gate cost per spawn: {:+.1} us ({:.2}x the sandboxed spawn)",
                (g.as_secs_f64() - s.as_secs_f64()) * 1e6,
                g.as_secs_f64() / s.as_secs_f64()
            );
        }
        if let Some(b) = get(BWRAP) {
            println!(
                "target sandboxed faster than bwrap: {:.2}x faster ({})",
                b.as_secs_f64() / s.as_secs_f64(),
                if s < b { "met" } else { "MISSED" }
            );
        }
    }
    let w = bare.as_secs_f64() / wasm.as_secs_f64();
    println!(
        "target wasm >= 15x faster than a bare spawn: {w:.1}x ({})",
        if w >= 15.0 { "met" } else { "MISSED" }
    );
}

fn main() {
    let n: usize = std::env::var("METASH_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let sink: Arc<dyn EventSink> = Arc::new(NullSink);
    let mut rows: Vec<Row<'_>> = Vec::new();
    let load_before = load();

    let spec = native_spec(&ws);
    let sandbox = Sandbox::prepare(&spec, &sink, &metash_runtime::Replier::default());
    if let Ok(sb) = &sandbox {
        println!("sandbox: {}", sb.report);
    }
    // The same sandbox with a live gate: a second seccomp filter whose listener the child hands
    // to the host's supervisor thread, which answers the child's own exec of the entry.
    let gated = metash_runtime::native::exec_gate::available().and_then(|()| {
        let mut gspec = spec.clone();
        gspec.gate = Gate(Some(Arc::new(AllowAll)));
        Sandbox::prepare(&gspec, &sink, &metash_runtime::Replier::default())
            .map_err(|e| e.to_string())
    });
    let mut cases = vec![bare_case()];
    sandbox_cases(&sandbox, &spec, &sink, &mut cases, &mut rows);
    other_cases(&gated, &mut cases, &mut rows);
    let medians = measure(n, cases, &mut rows);
    let bare = medians.iter().find(|(n, _)| *n == BARE).unwrap().1;
    let only = std::env::var("METASH_BENCH_ONLY").unwrap_or_default();
    if !only.is_empty() && !"wasm".contains(only.as_str()) {
        return print_table(&rows, bare);
    }
    // Before the WASM case: a fork copies the page tables of everything mapped, and a loaded
    // engine would make the host these rows fork larger than the one the other rows ran in.
    let mut fork_rows = Vec::new();
    let fork_medians = measure(n, fork_cases(), &mut fork_rows);
    let fork_bare = fork_medians.iter().find(|(n, _)| *n == BARE).unwrap().1;
    let (wasm, note) = wasm_case(n, dir.path(), &ws, &sink);
    rows.push((
        "wasm instantiate+run (agent.invoke, cached module)",
        Some(wasm),
        note,
    ));
    print_table(&rows, bare);
    println!("the fork paths, for reference (a pass of their own, after; see `fork_cases`):");
    print_table(&fork_rows, fork_bare);
    println!(
        "load (1, 5, 15 min): {load_before} before, {} after",
        load()
    );
    print_targets(&medians, bare, wasm);
}
