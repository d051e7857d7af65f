use std::path::{Path, PathBuf};

use metash_host::{Host, HostOptions, Terminal};

pub struct Project {
    pub dir: tempfile::TempDir,
}

impl Project {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        metash_store::Store::init(dir.path(), Some("# Project: host tests\n")).unwrap();
        Self { dir }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Registers an agent: `.meta/agents/<id>/manifest.toml` pointing at `entry`.
    pub fn agent(&self, id: &str, sandbox: &str, entry: &Path, caps: &[&str]) {
        let dir = self.path().join(".meta/agents").join(id);
        std::fs::create_dir_all(&dir).unwrap();
        let caps: Vec<String> = caps.iter().map(|c| format!("{c:?}")).collect();
        std::fs::write(
            dir.join("manifest.toml"),
            format!(
                "schema_version = \"0.1\"\nname = \"{id}\"\nversion = \"0.1.0\"\nentry = {entry:?}\n\
                 sandbox = \"{sandbox}\"\ncapabilities = [{}]\nresources.mem = \"256Mi\"\n",
                caps.join(", ")
            ),
        )
        .unwrap();
    }

    pub fn config(&self, toml: &str) {
        std::fs::write(self.path().join(".meta/config.toml"), toml).unwrap();
    }

    /// A host that answers consent from `yes_to` only (as scripts and CI do).
    pub fn host(&self, yes_to: &[&str]) -> Host {
        Host::open(
            self.path(),
            HostOptions {
                terminal: Terminal::Silent,
                yes_to: yes_to.iter().map(|c| c.parse().unwrap()).collect(),
                ..HostOptions::default()
            },
        )
        .unwrap()
    }

    /// Every logged record, oldest first.
    pub fn records(&self) -> Vec<metash_protocol::LogRecord> {
        let store = metash_store::Store::open(self.path()).unwrap();
        store.log().read_all().unwrap()
    }

    /// The `data` of every logged event of `kind`, oldest first.
    pub fn log_data(&self, kind: &str) -> Vec<serde_json::Value> {
        let records = self.records().into_iter();
        records.filter(|r| r.kind == kind).map(|r| r.data).collect()
    }

    pub fn log_kinds(&self) -> Vec<String> {
        let records = self.records().into_iter();
        records.map(|r| r.kind.to_string()).collect()
    }
}

pub fn native_agent_exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_metash-host-test-agent"))
}

/// Why native agents cannot run here, if they cannot (printed by the tests that skip). Asks the
/// kernel, as the runtime's sandbox does.
pub fn native_unavailable() -> Option<String> {
    let abi = metash_runtime::native::isolate::landlock_abi();
    if abi < 4 {
        return Some(format!(
            "Landlock ABI {abi} < 4: the native sandbox cannot be applied here"
        ));
    }
    None
}

/// The `.tools` directory holding `cli`, when it and the native sandbox are both available here
/// (otherwise a skip, a failure under CI).
pub fn cli_ready(cli: metash_testkit::cli::Cli, test: &str) -> Option<PathBuf> {
    let tools = cli.installed(test)?;
    if let Some(why) = native_unavailable() {
        metash_testkit::skip(test, &why);
        return None;
    }
    Some(tools)
}

pub use metash_testkit::procs::live_processes_under;
pub use metash_testkit::wasm::{agent_msg as msg, wat_agent};

/// No lock held (a 100 ms-timeout write goes through) and no per-spawn directory left behind.
pub fn assert_clean(ws: &Path) {
    let store = metash_store::Store::open(ws)
        .unwrap()
        .with_lock_timeout(std::time::Duration::from_millis(100));
    store
        .update_state("variables.cleanup_probe", serde_json::json!(true))
        .unwrap();
    let spawns = ws.join(".meta/spawns");
    let left: Vec<_> = std::fs::read_dir(&spawns)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "spawn directories left behind: {left:?}");
}

/// Waits (at most 20 s) until `f` holds.
pub fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while std::time::Instant::now() < until {
        if f() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    panic!("timed out waiting for {what}");
}

/// Asks through the store, as another process (`metash agent suspend`) would, and waits for the
/// running host's answer: whether it changed anything.
pub fn ask_control(ws: &Path, agent: &str, want: metash_host::control::Want) -> bool {
    let store = metash_store::Store::open(ws).unwrap();
    let seq = metash_host::control::request(&store, agent, want)
        .unwrap()
        .seq;
    let mut answer = None;
    wait_for("the running host's answer", || {
        answer = metash_host::control::answer(&store, agent, seq);
        answer.is_some()
    });
    answer.unwrap()
}
