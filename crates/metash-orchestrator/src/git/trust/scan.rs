//! Reading the repository's executable git configuration, without running any of it: the
//! executable keys ([`super::keys`]) of the repository's own config files (`config`,
//! `config.worktree`, each linked worktree's `config.worktree`, and every file they include,
//! whatever the `includeIf` condition), the hooks (the common directory's `hooks/`, and the
//! directory `core.hooksPath` names) and the attributes files (`info/attributes`, and the file
//! `core.attributesFile` names).
//!
//! Config files are parsed by git itself (`git config --file F --no-includes --list -z`: no
//! include is followed, nothing is run), so a file git reads one way cannot be read another way
//! here. A file whose bytes were parsed before is not parsed again.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Component, Path, PathBuf};
use std::process::{Command, Stdio};

use sha2::{Digest, Sha256};

use super::change::ConfigMap;
use super::keys::executable;
use super::stat::Watch;

/// Includes followed at most this deep (git's own limit is 10).
const MAX_DEPTH: usize = 10;
/// Entries of a hooks directory recorded at most (a `core.hooksPath` can name any directory).
const MAX_HOOKS: usize = 256;

/// Where the repository of a project keeps its metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Layout {
    /// The project: paths inside it are shown relative to it.
    pub root: PathBuf,
    /// The top of the work tree (the directory holding `.git`).
    pub top: PathBuf,
    /// The checkout's git directory.
    pub gitdir: PathBuf,
    /// The common directory (config, hooks, info): the git directory, unless the checkout is
    /// itself a linked worktree.
    pub common: PathBuf,
}

impl Layout {
    /// The repository of `root`, found as git finds it (the nearest `.git` upwards, a directory
    /// or a file naming one), without running git. `None`: not in a repository.
    pub(crate) fn discover(root: &Path) -> Option<Self> {
        let top = root.ancestors().find(|a| a.join(".git").exists())?;
        let dot = top.join(".git");
        let gitdir = if dot.is_dir() {
            dot
        } else {
            let text = std::fs::read_to_string(&dot).ok()?;
            normalize(&top.join(text.trim().strip_prefix("gitdir:")?.trim()))
        };
        let common = std::fs::read_to_string(gitdir.join("commondir"))
            .map(|c| normalize(&gitdir.join(c.trim())))
            .unwrap_or_else(|_| gitdir.clone());
        Some(Self {
            root: root.to_path_buf(),
            top: top.to_path_buf(),
            gitdir,
            common,
        })
    }

    /// How a path is shown: relative to the project when inside it.
    pub(crate) fn label(&self, path: &Path) -> String {
        let path = normalize(path);
        match path.strip_prefix(&self.root) {
            Ok(rel) if !rel.as_os_str().is_empty() => rel.to_string_lossy().into_owned(),
            _ => path.to_string_lossy().into_owned(),
        }
    }

    /// Whether `path` is where agents write: a work tree (the project's or a linked worktree's),
    /// outside the git directories.
    fn agent_writable(&self, path: &Path) -> bool {
        let path = normalize(path);
        if path.starts_with(&self.common) || path.starts_with(&self.gitdir) {
            return false;
        }
        let mut trees = vec![self.top.clone()];
        for admin in sorted_entries(&self.common.join("worktrees")) {
            if let Ok(g) = std::fs::read_to_string(admin.join("gitdir")) {
                if let Some(tree) = Path::new(g.trim()).parent() {
                    trees.push(tree.to_path_buf());
                }
            }
        }
        trees.iter().any(|t| path.starts_with(t))
    }
}

/// `path` without `.` and `..` components (lexically: the files need not exist).
pub(crate) fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// A directory's entries, sorted; none when it cannot be read.
fn sorted_entries(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| rd.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    v.sort();
    v
}

/// One reading of the configuration.
#[derive(Debug, Default)]
pub(crate) struct Scan {
    pub config: ConfigMap,
    /// Hooks and attributes files: label -> digest.
    pub files: BTreeMap<String, String>,
    /// What was read, to notice the next change.
    pub watch: Watch,
    /// Executable configuration that lives where agents write (an include, a hooks directory).
    pub warnings: Vec<String>,
}

/// A config file's executable entries, or why git could not parse it.
type Parsed = Result<Vec<(String, String)>, String>;

/// Reads the configuration; keeps what it parsed, by the bytes parsed.
#[derive(Debug, Default)]
pub(crate) struct Scanner {
    parsed: HashMap<PathBuf, ([u8; 32], Parsed)>,
}

impl Scanner {
    pub(crate) fn scan(&mut self, layout: &Layout) -> Scan {
        let mut s = Scan::default();
        let mut configs = vec![
            layout.common.join("config"),
            layout.common.join("config.worktree"),
        ];
        if layout.gitdir != layout.common {
            configs.push(layout.gitdir.join("config.worktree"));
        }
        let worktrees = layout.common.join("worktrees");
        s.watch.add(&worktrees);
        configs.extend(
            sorted_entries(&worktrees)
                .into_iter()
                .map(|a| a.join("config.worktree")),
        );
        let mut seen = HashSet::new();
        for c in &configs {
            self.config_file(layout, c, 0, &mut seen, &mut s);
        }
        hooks(layout, &layout.common.join("hooks"), &mut s);
        file(
            layout,
            &layout.common.join("info").join("attributes"),
            &mut s,
        );
        for (key, value) in named_paths(&s.config) {
            let path = resolve(&layout.top, &value);
            if layout.agent_writable(&path) {
                s.warnings.push(format!(
                    "{key} = {value} is inside a work tree, where agents write: what git runs \
                     from there can change with any merge"
                ));
            }
            match key.as_str() {
                "core.hookspath" => hooks(layout, &path, &mut s),
                _ => file(layout, &path, &mut s),
            }
        }
        s
    }

    /// Records the executable keys of the config file at `path`, and of the files it includes.
    fn config_file(
        &mut self,
        layout: &Layout,
        path: &Path,
        depth: usize,
        seen: &mut HashSet<PathBuf>,
        s: &mut Scan,
    ) {
        let path = normalize(path);
        if depth > MAX_DEPTH || !seen.insert(path.clone()) {
            return;
        }
        s.watch.add(&path);
        let label = layout.label(&path);
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            Err(e) => {
                set(s, &label, "(unreadable)", e.to_string());
                return;
            }
        };
        let digest: [u8; 32] = Sha256::digest(&bytes).into();
        let parsed = match self.parsed.get(&path) {
            Some((d, p)) if *d == digest => p.clone(),
            _ => {
                let p = parse(&path);
                self.parsed.insert(path.clone(), (digest, p.clone()));
                p
            }
        };
        let entries = match parsed {
            Ok(e) => e,
            Err(_) => {
                set(
                    s,
                    &label,
                    "(does not parse)",
                    format!("sha256:{}", hex(&digest)),
                );
                return;
            }
        };
        let dir = path.parent().unwrap_or(Path::new("/")).to_path_buf();
        for (key, value) in entries {
            let lower = key.to_ascii_lowercase();
            set(s, &label, &key, value.clone());
            let includes = lower == "include.path"
                || (lower.starts_with("includeif.") && lower.ends_with(".path"));
            if includes {
                let target = resolve(&dir, &value);
                if layout.agent_writable(&target) {
                    s.warnings.push(format!(
                        "{label}: {key} = {value} includes a file inside a work tree, where \
                         agents write; metash checks its executable keys, but your own git reads \
                         it as it is"
                    ));
                }
                self.config_file(layout, &target, depth + 1, seen, s);
            }
        }
    }
}

fn set(s: &mut Scan, label: &str, key: &str, value: String) {
    s.config
        .entry(label.to_string())
        .or_default()
        .entry(key.to_string())
        .or_default()
        .push(value);
}

/// `core.hooksPath` and `core.attributesFile` values of the repository's configuration.
fn named_paths(config: &ConfigMap) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for keys in config.values() {
        for (k, values) in keys {
            let k = k.to_ascii_lowercase();
            if k == "core.hookspath" || k == "core.attributesfile" {
                out.extend(values.iter().map(|v| (k.clone(), v.clone())));
            }
        }
    }
    out
}

/// A path as git reads it from config: `~/` is the home directory, a relative path is relative
/// to `base`.
fn resolve(base: &Path, value: &str) -> PathBuf {
    if let Some(rest) = value.strip_prefix("~/") {
        if let Some(home) = std::env::var_os("HOME") {
            return normalize(&PathBuf::from(home).join(rest));
        }
    }
    normalize(&base.join(value))
}

/// The executable entries of one config file, parsed by git (no include followed).
fn parse(path: &Path) -> Parsed {
    let out = Command::new("git")
        .args(["config", "--no-includes", "--list", "-z", "--file"])
        .arg(path)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run git: {e}"))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
    }
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text
        .split('\0')
        .filter(|r| !r.is_empty())
        .map(|r| match r.split_once('\n') {
            Some((k, v)) => (k.to_string(), v.to_string()),
            None => (r.to_string(), String::new()),
        })
        .filter(|(k, v)| executable(k, v))
        .collect())
}

/// Records every entry of a hooks directory but git's `.sample` files (which git never runs):
/// each one's digest, executable or not (a later `chmod +x` makes git run it).
fn hooks(layout: &Layout, dir: &Path, s: &mut Scan) {
    s.watch.add(dir);
    for path in sorted_entries(dir)
        .into_iter()
        .filter(|p| !p.to_string_lossy().ends_with(".sample"))
        .take(MAX_HOOKS)
    {
        s.watch.add(&path);
        s.files.insert(layout.label(&path), digest(&path));
    }
}

/// Records a file's digest when it exists.
fn file(layout: &Layout, path: &Path, s: &mut Scan) {
    s.watch.add(path);
    if std::fs::symlink_metadata(path).is_ok() {
        s.files.insert(layout.label(path), digest(path));
    }
}

/// `sha256:<hex>` of a file's bytes (`, executable` when it may be run), what a symbolic link
/// points to, or what else the path is.
fn digest(path: &Path) -> String {
    let link = std::fs::read_link(path)
        .map(|t| format!("symlink to {}; ", t.display()))
        .unwrap_or_default();
    let what = match std::fs::metadata(path) {
        Err(e) => format!("unreadable ({e})"),
        Ok(m) if m.is_dir() => "a directory".to_string(),
        Ok(m) if m.is_file() => match std::fs::read(path) {
            Ok(bytes) => format!(
                "sha256:{}{}",
                hex(&Sha256::digest(&bytes)),
                if runnable(&m) { ", executable" } else { "" }
            ),
            Err(e) => format!("unreadable ({e})"),
        },
        Ok(_) => "a special file".to_string(),
    };
    format!("{link}{what}")
}

#[cfg(unix)]
fn runnable(m: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::PermissionsExt;
    m.permissions().mode() & 0o111 != 0
}

#[cfg(not(unix))]
fn runnable(_: &std::fs::Metadata) -> bool {
    true
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
