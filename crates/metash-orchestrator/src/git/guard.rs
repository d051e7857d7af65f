//! What metash checks in a tree before it merges it, or reverts a commit, into the project's own
//! checkout, and what it never commits from a task's worktree (issue 30).
//!
//! Whatever a task's commit holds, an agent wrote: its executor left it in the worktree, or
//! somebody who could write `.git` made the commit. The main checkout is where metash keeps its
//! state (`.meta/`: policy, prompts, consent, the log) and git its own (`.git/`), so a tree that
//! metash merges may add or change none of:
//!
//! - a path with a component that *names* `.meta` or `.git` on some file system: in any letter
//!   case (macOS and Windows file systems ignore case by default), after Unicode NFC/NFKC
//!   normalisation (APFS and HFS+ compare normalised names), without the code points HFS+ ignores
//!   (git's `is_hfs_dotgit` list), without the trailing dots and spaces NTFS drops, and the 8.3
//!   short names `GIT~1`/`META~1`;
//! - a new submodule (a gitlink, mode 160000): a repository nobody looked at, which a person's
//!   `git submodule update` would fetch and check out;
//! - a symbolic link whose target is absolute, climbs above the checkout's root (`..` counted from
//!   the link's own directory), or passes through a `.meta`/`.git` name: whatever later writes
//!   through it (a person's tool, a later merge) lands outside the project or in metash's state.
//!
//! The diff is libgit2's tree-to-tree diff, in-process (the `git diff-tree --raw` CLI when libgit2
//! cannot open the repository): no filter, driver or textconv runs, and only paths the tree adds
//! or changes count (what the project already holds was put there by its people).

use std::path::Path;

use git2::{Delta, DiffOptions, FileMode, Oid, Repository, Tree};
use unicode_normalization::UnicodeNormalization;

use super::Git;
use crate::error::{OrchestratorError, Result};

/// A name metash never merges, whatever its spelling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reserved {
    Git,
    Meta,
}

impl Reserved {
    pub fn as_str(self) -> &'static str {
        match self {
            Reserved::Git => ".git",
            Reserved::Meta => ".meta",
        }
    }
}

/// Why a path of a tree is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rule {
    /// A component (`component`) is `.git` or `.meta` as some file system sees it.
    ReservedName { component: String, name: Reserved },
    /// A gitlink where the project had none.
    NewSubmodule,
    /// A symbolic link whose target is absolute or climbs above the checkout's root.
    LinkLeaves { target: String },
    /// A symbolic link whose target passes through a `.git` or `.meta` name.
    LinkIntoReserved { target: String, name: Reserved },
}

impl std::fmt::Display for Rule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Rule::ReservedName { component, name } => write!(
                f,
                "its component {component:?} is `{}` on a case-insensitive or Unicode-normalising \
                 file system (metash never merges anything under `.meta/` or `.git/`)",
                name.as_str()
            ),
            Rule::NewSubmodule => f.write_str(
                "a new submodule (gitlink): metash never merges a repository nobody looked at",
            ),
            Rule::LinkLeaves { target } => write!(
                f,
                "a symbolic link to {target:?}, outside the checkout (absolute, or `..` above its root)"
            ),
            Rule::LinkIntoReserved { target, name } => write!(
                f,
                "a symbolic link to {target:?}, into `{}`",
                name.as_str()
            ),
        }
    }
}

/// One refused path of a tree.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {rule}")]
pub struct Refusal {
    pub path: String,
    pub rule: Rule,
}

/// Code points HFS+ ignores in a name (git's `next_hfs_char`): `.g\u{200c}it` is `.git` there.
fn hfs_ignorable(c: char) -> bool {
    matches!(
        c,
        '\u{200c}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{206a}'..='\u{206f}' | '\u{feff}'
    )
}

/// Whether one path component names `.git` or `.meta` on some file system.
pub fn reserved_name(component: &str) -> Option<Reserved> {
    let plain: String = component.chars().filter(|c| !hfs_ignorable(*c)).collect();
    // NFKC also composes canonically (NFC) and maps compatibility forms (fullwidth `．ｍｅｔａ`)
    // to ASCII; a composed form may bring an ignorable code point back, so filter again.
    let normal: String = plain.nfkc().filter(|c| !hfs_ignorable(*c)).collect();
    let trimmed = normal.trim_end_matches(['.', ' ']);
    // Lower case, and upper-then-lower (`ı` is `I` upper-cased: `.gıt` is `.GIT`).
    for folded in [
        trimmed.to_lowercase(),
        trimmed.to_uppercase().to_lowercase(),
    ] {
        match folded.as_str() {
            ".git" | "git~1" => return Some(Reserved::Git),
            ".meta" | "meta~1" => return Some(Reserved::Meta),
            _ => {}
        }
    }
    None
}

/// The first component of `path` (separated by `/`, or `\` as Windows reads it) that names
/// `.git` or `.meta`.
pub fn reserved_in(path: &str) -> Option<Rule> {
    path.split(['/', '\\']).find_map(|c| {
        reserved_name(c).map(|name| Rule::ReservedName {
            component: c.to_string(),
            name,
        })
    })
}

/// Why a symbolic link at `link` (a path in the checkout) pointing at `target` is refused, if it
/// is: the target is absolute, climbs above the root from the link's directory, or passes
/// through a `.git`/`.meta` name.
pub fn link_rule(link: &str, target: &[u8]) -> Option<Rule> {
    let t = String::from_utf8_lossy(target).into_owned();
    let drive = t.as_bytes().get(1) == Some(&b':');
    if t.starts_with(['/', '\\']) || drive {
        return Some(Rule::LinkLeaves { target: t });
    }
    let mut depth = link.trim_end_matches('/').matches(['/', '\\']).count();
    for c in t.split(['/', '\\']) {
        match c {
            "" | "." => {}
            ".." => match depth.checked_sub(1) {
                Some(d) => depth = d,
                None => return Some(Rule::LinkLeaves { target: t }),
            },
            c => {
                if let Some(name) = reserved_name(c) {
                    return Some(Rule::LinkIntoReserved { target: t, name });
                }
                depth += 1;
            }
        }
    }
    None
}

/// Why metash leaves `rel` (a path relative to the worktree `workdir`) out of a task's commit, if
/// it does: a `.git`/`.meta` name at any depth, a nested repository (a directory holding `.git`,
/// which `git add` would make a gitlink), or a symbolic link [`link_rule`] refuses. What the
/// merge guard would refuse is never committed, so an executor's stray `.META/` costs the task
/// nothing but that path. Only `lstat` and `readlink`: nothing in the worktree is followed.
pub fn kept_out(workdir: Option<&Path>, rel: &Path) -> Option<Rule> {
    let s = rel.to_string_lossy();
    if let Some(rule) = reserved_in(&s) {
        return Some(rule);
    }
    let at = workdir?.join(rel);
    let meta = std::fs::symlink_metadata(&at).ok()?;
    if meta.is_dir() {
        // A directory holding `.git` is what `git add` makes a gitlink; any other directory here
        // is a file of `HEAD` the agent replaced by one (its files are added one by one).
        return std::fs::symlink_metadata(at.join(".git"))
            .is_ok()
            .then_some(Rule::NewSubmodule);
    }
    if meta.file_type().is_symlink() {
        let target = std::fs::read_link(&at).ok()?;
        return link_rule(&s, target.as_os_str().as_encoded_bytes());
    }
    None
}

/// The refused paths among those `new` adds or changes against `old` (`None`: the empty tree).
pub fn check_trees(
    repo: &Repository,
    old: Option<&Tree<'_>>,
    new: &Tree<'_>,
) -> std::result::Result<Vec<Refusal>, git2::Error> {
    let mut opts = DiffOptions::new();
    opts.include_typechange(true);
    let diff = repo.diff_tree_to_tree(old, Some(new), Some(&mut opts))?;
    let mut out = Vec::new();
    for d in diff.deltas() {
        if d.status() == Delta::Deleted {
            continue;
        }
        let file = d.new_file();
        let path = String::from_utf8_lossy(file.path_bytes().unwrap_or_default()).into_owned();
        let link = || -> std::result::Result<Option<Rule>, git2::Error> {
            Ok(link_rule(&path, repo.find_blob(file.id())?.content()))
        };
        let rule = match reserved_in(&path) {
            Some(r) => Some(r),
            None if file.mode() == FileMode::Link => link()?,
            None if file.mode() == FileMode::Commit && d.old_file().mode() != FileMode::Commit => {
                Some(Rule::NewSubmodule)
            }
            None => None,
        };
        if let Some(rule) = rule {
            out.push(Refusal { path, rule });
        }
    }
    Ok(out)
}

/// One line of `git diff-tree --raw -z` refused, if it is: `(meta, path)` where meta is
/// `:oldmode newmode oldsha newsha status`; `link` reads a blob.
fn check_raw(
    meta: &str,
    path: &str,
    link: impl Fn(&str) -> Result<Vec<u8>>,
) -> Result<Option<Rule>> {
    let f: Vec<&str> = meta.trim_start_matches(':').split(' ').collect();
    let (Some(old_mode), Some(new_mode), Some(new_id), Some(status)) =
        (f.first(), f.get(1), f.get(3), f.get(4))
    else {
        return Ok(None);
    };
    if status.starts_with('D') {
        return Ok(None);
    }
    if let Some(rule) = reserved_in(path) {
        return Ok(Some(rule));
    }
    Ok(match *new_mode {
        "120000" => link_rule(path, &link(new_id)?),
        "160000" if *old_mode != "160000" => Some(Rule::NewSubmodule),
        _ => None,
    })
}

impl Git {
    /// The paths of `rev` refused in a merge into the checkout at `dir`: those `rev` adds or
    /// changes since its merge base with `HEAD`.
    ///
    /// # Errors
    /// `rev` or `HEAD` does not resolve; git fails.
    pub fn check_merge(&self, dir: &Path, rev: &str) -> Result<Vec<Refusal>> {
        crate::cost::checking(|| self.check_merge_now(dir, rev))
    }

    fn check_merge_now(&self, dir: &Path, rev: &str) -> Result<Vec<Refusal>> {
        let fail = super::libgit::failed(dir, &format!("check {rev}"));
        if let Some(repo) = self.guard_repo(dir) {
            let theirs = repo
                .revparse_single(rev)
                .and_then(|o| o.peel_to_commit())
                .map_err(&fail)?;
            let head = repo
                .head()
                .and_then(|h| h.peel_to_commit())
                .map_err(&fail)?;
            let base = match repo.merge_base(head.id(), theirs.id()) {
                Ok(b) => Some(repo.find_commit(b).and_then(|c| c.tree()).map_err(&fail)?),
                Err(_) => None,
            };
            let new = theirs.tree().map_err(&fail)?;
            return check_trees(&repo, base.as_ref(), &new).map_err(fail);
        }
        let base = self
            .run(dir, &["merge-base", "HEAD", rev])
            .unwrap_or_else(|_| EMPTY_TREE.to_string());
        self.check_raw_diff(dir, &base, rev)
    }

    /// The paths refused in reverting `sha` (a commit with one parent) in `dir`: what the revert
    /// writes is the parent's version of the paths `sha` changed.
    ///
    /// # Errors
    /// `sha` does not resolve to a commit; git fails.
    pub fn check_revert(&self, dir: &Path, sha: &str) -> Result<Vec<Refusal>> {
        crate::cost::checking(|| self.check_revert_now(dir, sha))
    }

    fn check_revert_now(&self, dir: &Path, sha: &str) -> Result<Vec<Refusal>> {
        let fail = super::libgit::failed(dir, &format!("check revert {sha}"));
        if let Some(repo) = self.guard_repo(dir) {
            let oid = Oid::from_str(sha).map_err(&fail)?;
            let commit = repo.find_commit(oid).map_err(&fail)?;
            let new = match commit.parent(0) {
                Ok(p) => Some(p.tree().map_err(&fail)?),
                Err(_) => None,
            };
            let old = commit.tree().map_err(&fail)?;
            return match new {
                Some(new) => check_trees(&repo, Some(&old), &new).map_err(fail),
                None => Ok(Vec::new()),
            };
        }
        self.check_raw_diff(dir, sha, &format!("{sha}^"))
    }

    /// The repository of `dir` in-process: the one metash's git opens, else the project at `dir`
    /// as git would find it (a checkout whose `.git` is a file); `None` when libgit2 cannot.
    fn guard_repo(&self, dir: &Path) -> Option<super::Repo<'_>> {
        self.repo(dir).or_else(|| {
            (dir == self.root)
                .then(|| Repository::open(dir).ok().map(super::Repo::from))
                .flatten()
        })
    }

    /// [`Git::check_merge`] through the git CLI (`diff-tree --raw`: no filter, no textconv).
    fn check_raw_diff(&self, dir: &Path, from: &str, to: &str) -> Result<Vec<Refusal>> {
        let out = self.run(
            dir,
            &[
                "diff-tree",
                "-r",
                "-z",
                "--raw",
                "--no-renames",
                "--no-abbrev",
                from,
                to,
            ],
        )?;
        let mut fields = out.split('\0');
        let mut refusals = Vec::new();
        while let (Some(meta), Some(path)) = (fields.next(), fields.next()) {
            let link = |id: &str| -> Result<Vec<u8>> {
                Ok(self.run(dir, &["cat-file", "blob", id])?.into_bytes())
            };
            if let Some(rule) = check_raw(meta, path, link)? {
                refusals.push(Refusal {
                    path: path.to_string(),
                    rule,
                });
            }
        }
        Ok(refusals)
    }

    /// `git add -A` outside `.meta` through the CLI, less what [`kept_out`] keeps out of a commit,
    /// as the in-process commit does: a path the index staged already (an agent's own commit,
    /// folded into metash's) stays, for the merge guard to judge. The index is compared with
    /// `HEAD` in-process (object ids only: no filter runs); the CLI lists it when libgit2 cannot.
    pub(super) fn add_all_kept(&self, dir: &Path) -> Result<()> {
        let before = self.staged_paths(dir).unwrap_or_default();
        self.run(dir, &["add", "-A", "--", ".", super::EXCLUDE_META])?;
        let after = match self.staged_paths(dir) {
            Some(after) => after,
            None => {
                let out = self.output(
                    dir,
                    &["diff", "--cached", "--name-only", "-z", "--no-renames"],
                )?;
                if !out.status.success() {
                    return Err(self.failed(dir, "diff --cached", &out));
                }
                let listed = String::from_utf8_lossy(&out.stdout).into_owned();
                listed
                    .split('\0')
                    .filter(|p| !p.is_empty())
                    .map(str::to_string)
                    .collect()
            }
        };
        let refused: Vec<&str> = after
            .iter()
            .filter(|p| !before.contains(*p) && kept_out(Some(dir), Path::new(p)).is_some())
            .map(String::as_str)
            .collect();
        if refused.is_empty() {
            return Ok(());
        }
        let mut args = vec!["--literal-pathspecs", "reset", "-q", "--"];
        args.extend(refused);
        self.run(dir, &args).map(drop)
    }

    /// The paths the index of `dir` stages against `HEAD`, read in-process.
    fn staged_paths(&self, dir: &Path) -> Option<std::collections::HashSet<String>> {
        let repo = self.repo(dir)?;
        let head = repo.head().ok()?.peel_to_tree().ok()?;
        let index = repo.index().ok()?;
        let diff = repo
            .diff_tree_to_index(Some(&head), Some(&index), None)
            .ok()?;
        Some(
            diff.deltas()
                .filter_map(|d| d.new_file().path().or(d.old_file().path()))
                .map(|p| p.to_string_lossy().into_owned())
                .collect(),
        )
    }
}

/// Git's empty tree: the base of a tree with no history in common.
const EMPTY_TREE: &str = "4b825dc642cb6eb9a060e54bf8d69288fbee4904";

/// A refusal as the orchestrator's error, naming what was refused.
pub(crate) fn refused(what: &str, refusals: &[Refusal]) -> OrchestratorError {
    OrchestratorError::Refused(describe(what, refusals))
}

/// `what` followed by each refused path and its rule (the first ten).
pub fn describe(what: &str, refusals: &[Refusal]) -> String {
    let mut s = format!("{what}: ");
    let shown: Vec<String> = refusals.iter().take(10).map(ToString::to_string).collect();
    s.push_str(&shown.join("; "));
    if refusals.len() > 10 {
        s.push_str(&format!("; and {} more", refusals.len() - 10));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn git(dir: &Path, args: &[&str]) -> bool {
        std::process::Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(["-c", "user.name=t", "-c", "user.email=t@localhost"])
            .args(args)
            .output()
            .is_ok_and(|o| o.status.success())
    }

    /// The in-process commit (used when no filter driver is configured; the CLI path is what the
    /// suite's runs use on a machine with git-lfs) leaves out the same paths, and keeps what the
    /// index staged already.
    #[cfg(unix)]
    #[test]
    fn the_in_process_commit_leaves_out_what_the_guard_refuses() {
        let Ok(t) = tempfile::tempdir() else { return };
        let d = t.path();
        assert!(git(d, &["init", "-q"]) && git(d, &["commit", "-q", "--allow-empty", "-m", "0"]));
        for dir in [".META", ".Meta", ".met\u{200c}a", "src/.git\u{200d}"] {
            assert!(std::fs::create_dir_all(d.join(dir)).is_ok());
            assert!(std::fs::write(d.join(dir).join("x"), "x").is_ok());
        }
        assert!(std::os::unix::fs::symlink("../..", d.join("up")).is_ok());
        assert!(std::os::unix::fs::symlink("ok.txt", d.join("in")).is_ok());
        let nested = d.join("vendor/lib");
        assert!(std::fs::create_dir_all(&nested).is_ok());
        assert!(
            git(&nested, &["init", "-q"])
                && git(&nested, &["commit", "-q", "--allow-empty", "-m", "n"])
        );
        assert!(std::fs::write(d.join("ok.txt"), "ok").is_ok());
        assert!(std::fs::write(d.join("staged.txt"), "s").is_ok());
        // Staged before metash commits (an agent's own `git add`), in `.META` too: kept.
        assert!(std::fs::write(d.join(".META/staged"), "s").is_ok());
        assert!(git(d, &["add", "-f", ".META/staged"]));
        let Ok(repo) = Repository::open(d) else {
            panic!("open")
        };
        let keep = |w: Option<&Path>, p: &Path| kept_out(w, p).is_some();
        let Ok(Some(commit)) = super::super::libgit::commit_all(&repo, "work", keep) else {
            panic!("a commit")
        };
        let Ok(tree) = repo.find_commit(commit).and_then(|c| c.tree()) else {
            panic!("tree")
        };
        let mut paths = Vec::new();
        let walked = tree.walk(git2::TreeWalkMode::PreOrder, |dir, e| {
            if e.kind() != Some(git2::ObjectType::Tree) {
                paths.push(format!("{dir}{}", e.name().unwrap_or("?")));
            }
            git2::TreeWalkResult::Ok
        });
        assert!(walked.is_ok());
        paths.sort();
        assert_eq!(paths, vec![".META/staged", "in", "ok.txt", "staged.txt"]);
    }

    #[test]
    fn meta_and_git_in_every_spelling() {
        for name in [
            ".meta",
            ".META",
            ".Meta",
            ".met\u{200c}a",
            "\u{feff}.meta",
            ".me\u{202e}ta",
            // Fullwidth letters: NFKC maps them to ASCII.
            ".\u{ff4d}\u{ff45}\u{ff54}\u{ff41}",
            // A fullwidth full stop.
            "\u{ff0e}meta",
            ".meta.",
            ".meta ",
            "META~1",
            ".git",
            ".GIT",
            ".Git",
            ".gi\u{200d}t",
            ".g\u{0131}t", // dotless i: upper-cases to I
            "GIT~1",
        ] {
            assert!(reserved_name(name).is_some(), "{name:?}");
        }
        for name in [
            ".metadata",
            ".github",
            ".gitignore",
            "meta",
            "git",
            "src",
            ".m eta",
            "",
        ] {
            assert_eq!(reserved_name(name), None, "{name:?}");
        }
        assert!(reserved_in("src/.META/x").is_some());
        assert!(reserved_in("a\\.git\\config").is_some());
        assert_eq!(reserved_in("src/meta/x"), None);
    }

    #[test]
    fn links_that_leave_or_reach_into_metash_state() {
        let leaves = |link: &str, target: &str| {
            matches!(
                link_rule(link, target.as_bytes()),
                Some(Rule::LinkLeaves { .. })
            )
        };
        assert!(leaves("up", "../.."));
        assert!(leaves("up", ".."));
        assert!(leaves("a/b/up", "../../.."));
        assert!(leaves("x", "/etc/passwd"));
        assert!(leaves("x", "a/../../b"));
        assert!(leaves("x", "C:\\Windows"));
        assert_eq!(link_rule("a/b/up", b"../../c"), None);
        assert_eq!(link_rule("a/x", b"../b/./c"), None);
        assert_eq!(link_rule("x", b"target.txt"), None);
        assert!(matches!(
            link_rule("x", b"sub/../.META/policy.toml"),
            Some(Rule::LinkIntoReserved {
                name: Reserved::Meta,
                ..
            })
        ));
        assert!(matches!(
            link_rule("a/hooks", b"../.git/hooks"),
            Some(Rule::LinkIntoReserved {
                name: Reserved::Git,
                ..
            })
        ));
    }

    #[test]
    fn raw_diff_lines() {
        let none = |_: &str| -> Result<Vec<u8>> { Ok(Vec::new()) };
        let up = |_: &str| -> Result<Vec<u8>> { Ok(b"../..".to_vec()) };
        let z = "0000000000000000000000000000000000000000";
        let id = "1111111111111111111111111111111111111111";
        let line = |old: &str, new: &str, s: &str| format!(":{old} {new} {z} {id} {s}");
        assert!(check_raw(&line("000000", "100644", "A"), ".Meta/x", none)
            .unwrap_or_default()
            .is_some());
        assert_eq!(
            check_raw(&line("000000", "160000", "A"), "sub", none).unwrap_or_default(),
            Some(Rule::NewSubmodule)
        );
        assert_eq!(
            check_raw(&line("160000", "160000", "M"), "sub", none).unwrap_or_default(),
            None
        );
        assert!(check_raw(&line("000000", "120000", "A"), "up", up)
            .unwrap_or_default()
            .is_some());
        assert_eq!(
            check_raw(&line("100644", "000000", "D"), ".META/x", none).unwrap_or_default(),
            None
        );
    }
}
