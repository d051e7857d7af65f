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

    pub fn log_kinds(&self) -> Vec<String> {
        metash_store::Store::open(self.path())
            .unwrap()
            .log()
            .read_all()
            .unwrap()
            .into_iter()
            .map(|r| r.kind)
            .collect()
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

/// Pids of live processes whose command line contains `needle` (zombies excluded).
pub fn live_processes(needle: &str) -> Vec<i32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let zombie = stat
            .rsplit(')')
            .next()
            .is_some_and(|r| r.trim_start().starts_with('Z'));
        if !zombie
            && String::from_utf8_lossy(&cmd)
                .replace('\0', " ")
                .contains(needle)
        {
            out.push(pid);
        }
    }
    out
}

/// A WASI preview-1 command module that writes `lines` to stdout (each one protocol message)
/// and exits; with `spin`, loops forever after writing them.
pub fn wat_agent(lines: &[&str], spin: bool) -> String {
    let mut data = String::new();
    let mut calls = String::new();
    let mut offset = 64u32;
    for line in lines {
        let bytes = format!("{line}\n");
        let escaped: String = bytes.bytes().map(|b| format!("\\{b:02x}")).collect();
        data.push_str(&format!("(data (i32.const {offset}) \"{escaped}\")\n"));
        calls.push_str(&format!(
            "(i32.store (i32.const 0) (i32.const {offset})) (i32.store (i32.const 4) (i32.const {len}))\n\
             (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))\n",
            len = bytes.len()
        ));
        offset += bytes.len() as u32 + 8;
    }
    let tail = if spin { "(loop $l (br $l))" } else { "" };
    format!(
        "(module\n (import \"wasi_snapshot_preview1\" \"fd_write\" (func $fd_write (param i32 i32 i32 i32) (result i32)))\n\
         (memory (export \"memory\") 1)\n{data}\
         (func (export \"_start\")\n{calls}{tail})\n)\n"
    )
}

pub fn msg(json: &str) -> String {
    format!("{{\"schema_version\":\"0.1\",{}", &json[1..])
}

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
