//! Finding the harness programs and their versions. Resolution order, first hit wins:
//! `METASH_CLAUDE_BIN` / `METASH_CODEX_BIN` / `METASH_PI_BIN`; then `METASH_TOOLS_DIR` or the
//! workspace's `.tools/` (where `scripts/setup` installs the npm packages); then `PATH`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// The programs a CLI or SDK frontend spawns.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Programs {
    pub claude: Option<PathBuf>,
    pub codex: Option<PathBuf>,
    pub pi: Option<PathBuf>,
}

/// Which program a frontend needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Program {
    Claude,
    Codex,
    Pi,
}

impl Program {
    pub fn name(self) -> &'static str {
        match self {
            Self::Claude => "claude",
            Self::Codex => "codex",
            Self::Pi => "pi",
        }
    }

    fn env_var(self) -> &'static str {
        match self {
            Self::Claude => "METASH_CLAUDE_BIN",
            Self::Codex => "METASH_CODEX_BIN",
            Self::Pi => "METASH_PI_BIN",
        }
    }

    /// Where `npm install` puts it under a `node_modules` dir. Native binaries first: they start
    /// faster than the Node shims and need no Node.
    fn in_node_modules(self) -> &'static [&'static str] {
        match self {
            Self::Claude => &["@anthropic-ai/claude-code/bin/claude.exe", ".bin/claude"],
            Self::Codex => &[
                "@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex",
                "@openai/codex-linux-arm64/vendor/aarch64-unknown-linux-musl/bin/codex",
                ".bin/codex",
            ],
            Self::Pi => &[".bin/pi"],
        }
    }
}

impl Programs {
    /// Looks the programs up as the module doc says. `workspace` is the project root whose
    /// `.tools/` may hold them.
    pub fn discover(workspace: Option<&Path>) -> Self {
        let tools = std::env::var_os("METASH_TOOLS_DIR")
            .map(PathBuf::from)
            .or_else(|| workspace.map(|w| w.join(".tools")));
        let find = |p: Program| find_program(p, tools.as_deref());
        Self {
            claude: find(Program::Claude),
            codex: find(Program::Codex),
            pi: find(Program::Pi),
        }
    }

    /// Only the given tools dir (a `.tools` holding `node_modules`), no env or PATH: what tests use.
    pub fn in_tools_dir(tools: &Path) -> Self {
        let find = |p: Program| {
            p.in_node_modules()
                .iter()
                .map(|rel| tools.join("node_modules").join(rel))
                .find(|c| is_executable(c))
                .map(canonical)
        };
        Self {
            claude: find(Program::Claude),
            codex: find(Program::Codex),
            pi: find(Program::Pi),
        }
    }

    pub fn get(&self, p: Program) -> Option<&Path> {
        match p {
            Program::Claude => self.claude.as_deref(),
            Program::Codex => self.codex.as_deref(),
            Program::Pi => self.pi.as_deref(),
        }
    }

    /// The path for argv[0]: the resolved program, or its bare name when not installed (the spec
    /// is still useful to a control plane that has it on its own PATH).
    pub fn argv0(&self, p: Program) -> String {
        self.get(p)
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_else(|| p.name().to_string())
    }
}

fn find_program(p: Program, tools: Option<&Path>) -> Option<PathBuf> {
    if let Some(v) = std::env::var_os(p.env_var()) {
        let path = PathBuf::from(v);
        if is_executable(&path) {
            return Some(canonical(path));
        }
    }
    if let Some(tools) = tools {
        for rel in p.in_node_modules() {
            let c = tools.join("node_modules").join(rel);
            if is_executable(&c) {
                return Some(canonical(c));
            }
        }
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(p.name()))
        .find(|c| is_executable(c))
        .map(canonical)
}

/// Resolves `..` and symlinks: npm's `.bin/` entries are symlinks, and Node resolves a script's
/// modules from the path it is given, lexically, so a path through a symlinked dir would break.
fn canonical(path: PathBuf) -> PathBuf {
    std::fs::canonicalize(&path).unwrap_or(path)
}

/// Whether `path` is a file this user could run (the mode's execute bits on Unix).
pub fn is_executable(path: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(path)
            .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            .unwrap_or(false)
    }
    // Windows marks programs by extension, not by a mode bit.
    #[cfg(not(unix))]
    {
        path.is_file()
    }
}

/// `PROGRAM --version`, first line, with stdin null and a 15 s bound (a CLI that tries the network
/// on start must not hang the capability query).
pub fn program_version(path: &Path) -> Option<String> {
    let mut child = Command::new(path)
        .arg("--version")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
        .env("PI_OFFLINE", "1")
        .spawn()
        .ok()?;
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    }
    let out = child.wait_with_output().ok()?;
    // pi prints its version on stderr.
    let version = [&out.stdout, &out.stderr].into_iter().find_map(|bytes| {
        let text = String::from_utf8_lossy(bytes);
        text.lines()
            .map(str::trim)
            .find(|l| !l.is_empty())
            .map(str::to_string)
    });
    version
}
