//! Fixtures: a workspace with a secret outside it, manifests, WAT module builder, event helpers.

use std::path::PathBuf;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use metash_protocol::LogKind;

use metash_protocol::{AgentEvent, Manifest, SandboxKind};
use metash_runtime::{
    Agent, AgentSpec, EventSink, MemorySink, Outcome, Recorded, Runtime, RuntimeConfig,
};

pub const SECRET: &str = "TOP-SECRET-OUTSIDE";

pub fn manifest(sandbox: SandboxKind, mem: Option<&str>) -> Manifest {
    let mut m = Manifest::new("test-agent", "agent", sandbox);
    m.resources.cpu = Some("500m".into());
    m.resources.mem = mem.map(str::to_string);
    m
}

/// A temp dir with `workspace/` (holding `inside.txt` and a `link` to the secret) and
/// `outside/secret.txt`.
pub struct Fixture {
    _turn: Turn,
    pub dir: tempfile::TempDir,
    pub sink: Arc<MemorySink>,
    pub rt: Runtime,
}

/// Tests share the process; the flood test measures the process's RSS, so it runs alone
/// (`Fixture::exclusive`) while every other test holds a shared turn.
static TURNS: RwLock<()> = RwLock::new(());

enum Turn {
    Shared(#[allow(dead_code)] RwLockReadGuard<'static, ()>),
    Exclusive(#[allow(dead_code)] RwLockWriteGuard<'static, ()>),
}

impl Fixture {
    pub fn new() -> Self {
        let turn = Turn::Shared(TURNS.read().unwrap_or_else(|p| p.into_inner()));
        Self::with(turn)
    }

    /// A fixture that runs with no other test in the process.
    pub fn exclusive() -> Self {
        let turn = Turn::Exclusive(TURNS.write().unwrap_or_else(|p| p.into_inner()));
        Self::with(turn)
    }

    fn with(turn: Turn) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("workspace");
        let out = dir.path().join("outside");
        std::fs::create_dir_all(&ws).unwrap();
        std::fs::create_dir_all(&out).unwrap();
        std::fs::write(ws.join("inside.txt"), "hello from inside").unwrap();
        std::fs::write(out.join("secret.txt"), SECRET).unwrap();
        std::os::unix::fs::symlink(out.join("secret.txt"), ws.join("link")).unwrap();
        let sink = Arc::new(MemorySink::new());
        let rt = Runtime::new(
            RuntimeConfig {
                cache_dir: dir.path().join("cache"),
                cache_key: metash_runtime::CacheKey::ephemeral().expect("cache key"),
            },
            Arc::clone(&sink) as Arc<dyn EventSink>,
        )
        .unwrap();
        Self {
            _turn: turn,
            dir,
            sink,
            rt,
        }
    }

    pub fn workspace(&self) -> PathBuf {
        self.dir.path().join("workspace")
    }

    pub fn secret_path(&self) -> PathBuf {
        self.dir.path().join("outside").join("secret.txt")
    }

    /// A spec for the native test agent.
    pub fn native(&self, id: &str, granted: &[&str], mem: Option<&str>) -> AgentSpec {
        let mut s = AgentSpec::new(
            id,
            manifest(SandboxKind::Native, mem),
            env!("CARGO_BIN_EXE_metash-test-agent"),
            self.workspace(),
        );
        s.granted = granted.iter().map(|g| g.to_string()).collect();
        s.allow_native = true;
        s.timeout = Duration::from_secs(10);
        s
    }

    /// A spec for a WAT module written into the fixture.
    pub fn wasm(&self, id: &str, wat: &str, granted: &[&str], mem: Option<&str>) -> AgentSpec {
        let path = self.dir.path().join(format!("{id}.wat"));
        std::fs::write(&path, wat).unwrap();
        let mut s = AgentSpec::new(id, manifest(SandboxKind::Wasm, mem), path, self.workspace());
        s.granted = granted.iter().map(|g| g.to_string()).collect();
        s.timeout = Duration::from_secs(10);
        s
    }

    pub fn start(&self, spec: AgentSpec) -> Agent {
        let mut a = self.rt.register(spec).unwrap();
        a.start().unwrap();
        a
    }

    /// Events of `kind` for agent `id`.
    pub fn events(&self, id: &str, kind: LogKind) -> Vec<Recorded> {
        self.sink
            .of_kind(kind)
            .into_iter()
            .filter(|e| e.agent.as_deref() == Some(id))
            .collect()
    }

    /// Whether the log holds the agent's own `error` event with code `denied`.
    pub fn logged_denial(&self, id: &str) -> bool {
        self.events(id, LogKind::AgentEvent)
            .iter()
            .any(|e| e.data["type"] == "error" && e.data["code"] == "denied")
    }
}

/// Invoke and collect every event.
pub fn run(agent: &mut Agent, prompt: &str) -> (Outcome, Vec<AgentEvent>) {
    let mut events = Vec::new();
    let outcome = agent
        .invoke(prompt, &[], &mut |e| events.push(e.clone()))
        .unwrap();
    (outcome, events)
}

/// All output data concatenated.
pub fn text(events: &[AgentEvent]) -> String {
    events
        .iter()
        .filter_map(|e| match e {
            AgentEvent::Output { data, .. } => Some(data.as_str()),
            AgentEvent::Error { message, .. } => Some(message.as_str()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("|")
}

pub use metash_testkit::build_example;

/// Why native tests cannot run here, if they cannot.
pub fn native_unavailable() -> Option<String> {
    let abi = metash_runtime::native::isolate::landlock_abi();
    if abi < 4 {
        return Some(format!(
            "Landlock ABI {abi} < 4 (filesystem + TCP rules needed for the native sandbox)"
        ));
    }
    None
}

macro_rules! require_native {
    () => {
        if let Some(why) = crate::suite::common::native_unavailable() {
            metash_testkit::skip(module_path!(), &why);
            return;
        }
    };
}
pub(crate) use require_native;

/// Escape a string for a WAT data segment.
pub fn wat_bytes(s: &str) -> String {
    s.bytes().map(|b| format!("\\{b:02x}")).collect()
}

pub fn line(json: &str) -> String {
    format!("{json}\n")
}

/// A WASI p1 command module with helpers `$ok`, `$denied`, `$done`, `$bad_version` (each writes one
/// protocol line) and the path `path` at `$path`/`$path_len`; `body` is the `_start` body.
pub fn wat_module(path: &str, body: &str, extra_imports: &str) -> String {
    let ok = line(
        r#"{"schema_version":"0.1","type":"output","agent_id":"w","chunk_id":"r:0","content_type":"text/plain","data":"OK"}"#,
    );
    let denied = line(
        r#"{"schema_version":"0.1","type":"error","code":"denied","message":"the sandbox refused"}"#,
    );
    let done = line(r#"{"schema_version":"0.1","type":"done"}"#);
    let bad = line(r#"{"schema_version":"9.9","type":"done"}"#);
    format!(
        r#"(module
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "path_open" (func $path_open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "environ_sizes_get" (func $environ_sizes_get (param i32 i32) (result i32)))
  {extra_imports}
  (memory (export "memory") 1)
  (data (i32.const 1024) "{ok_b}")
  (data (i32.const 2048) "{denied_b}")
  (data (i32.const 3072) "{done_b}")
  (data (i32.const 3584) "{bad_b}")
  (data (i32.const 4096) "{path_b}")
  (global $path i32 (i32.const 4096))
  (global $path_len i32 (i32.const {path_len}))
  (func $emit (param $ptr i32) (param $len i32)
    (i32.store (i32.const 0) (local.get $ptr))
    (i32.store (i32.const 4) (local.get $len))
    (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8))))
  (func $ok (call $emit (i32.const 1024) (i32.const {ok_len})))
  (func $denied (call $emit (i32.const 2048) (i32.const {denied_len})))
  (func $done (call $emit (i32.const 3072) (i32.const {done_len})))
  (func $bad_version (call $emit (i32.const 3584) (i32.const {bad_len})))
  (func (export "_start") {body}))
"#,
        ok_b = wat_bytes(&ok),
        ok_len = ok.len(),
        denied_b = wat_bytes(&denied),
        denied_len = denied.len(),
        done_b = wat_bytes(&done),
        done_len = done.len(),
        bad_b = wat_bytes(&bad),
        bad_len = bad.len(),
        path_b = wat_bytes(path),
        path_len = path.len(),
    )
}

/// `path_open` on preopen fd 3 following symlinks; `$ok` if it opened, `$denied` if not.
/// `write` asks for create + fd_write rights instead of fd_read.
pub fn wat_open(path: &str, write: bool) -> String {
    let (oflags, rights) = if write { (1, 64) } else { (0, 2) };
    wat_module(
        path,
        &format!(
            "(if (i32.eqz (call $path_open (i32.const 3) (i32.const 1) (global.get $path) (global.get $path_len) (i32.const {oflags}) (i64.const {rights}) (i64.const 0) (i32.const 0) (i32.const 16)))
               (then (call $ok)) (else (call $denied)))
             (call $done)"
        ),
        "",
    )
}

pub fn wat_echo() -> String {
    wat_module("", "(call $ok) (call $done)", "")
}

pub fn wat_spin() -> String {
    wat_module("", "(loop $l (br $l))", "")
}

/// Wait until no live process is in group `pgid`, up to `within`.
pub fn group_gone(pgid: i32, within: Duration) -> bool {
    let start = std::time::Instant::now();
    loop {
        if metash_runtime::native::procs::group_members(pgid).is_empty() {
            return true;
        }
        if start.elapsed() > within {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}
