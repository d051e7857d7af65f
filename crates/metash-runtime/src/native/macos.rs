//! A sketch of the macOS backend: the confinement of a [`ConfineSpec`] as a `sandbox-exec`
//! (Seatbelt) profile. Generated and tested as text on every system; not wired in yet, so macOS
//! still refuses native agents (`refused.rs`) until the profile has been run against real agents
//! on a Mac (docs/portability.md says what is missing).
//!
//! Paths never enter the profile's text: each is a parameter (`sandbox-exec -D P3=/path`) that
//! the profile names with `(param "P3")`, so no path (quotes, parentheses, newlines) can change
//! the profile's meaning. The profile denies by default and allows:
//! - reading and executing the program and its install directories, and the system's read-only
//!   files (the dynamic loader's world: `/usr/lib`, `/System`, `/Library/Apple`…);
//! - reading and writing the workspace and the spec's read-write paths, reading its read-only
//!   paths, except metash's state directories (`require-not`), which stay unreachable;
//! - TCP to the listed loopback ports only (the credential proxy, the allowlist proxy); no other
//!   network, no listening socket, no Unix-domain socket;
//! - forking and executing inside what it may read (Seatbelt applies to the children too).

use std::ffi::OsString;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use super::confine_spec::ConfineSpec;

/// What the system's loader and frameworks need to start any program; read-only.
const SYSTEM_RO: &[&str] = &[
    "/usr/lib",
    "/usr/share",
    "/System",
    "/Library/Apple",
    "/private/etc",
    "/dev/null",
    "/dev/urandom",
    "/dev/random",
];

/// A profile and the parameters it reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Profile {
    pub text: String,
    /// `(name, path)`, passed as `-D name=path`.
    pub params: Vec<(String, PathBuf)>,
}

/// Why a spec has no profile.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProfileError {
    #[error("{0}: a confined path must be absolute (canonicalise it first)")]
    Relative(PathBuf),
    #[error("{0:?}: a confined path may not contain NUL, newline or `=`")]
    Unsafe(PathBuf),
}

/// Collects the parameters as the rules name them.
#[derive(Default)]
struct Params(Vec<(String, PathBuf)>);

impl Params {
    /// `(param "Pn")` for `path`, checked.
    fn add(&mut self, path: &Path) -> Result<String, ProfileError> {
        if !path.is_absolute() {
            return Err(ProfileError::Relative(path.to_path_buf()));
        }
        let text = path.to_string_lossy();
        if text.contains(['\0', '\n', '=']) {
            return Err(ProfileError::Unsafe(path.to_path_buf()));
        }
        let name = format!("P{}", self.0.len());
        self.0.push((name.clone(), path.to_path_buf()));
        Ok(format!("(param \"{name}\")"))
    }

    /// `(subpath (param "Pn"))` for each path, on one line.
    fn subpaths<'a>(
        &mut self,
        paths: impl IntoIterator<Item = &'a Path>,
    ) -> Result<String, ProfileError> {
        let mut out = String::new();
        for p in paths {
            let _ = write!(out, " (subpath {})", self.add(p)?);
        }
        Ok(out)
    }
}

/// The profile for `spec` (its paths already canonical, as `Confinement::prepare` makes them).
///
/// # Errors
/// A relative path, or one that cannot be passed as a parameter.
pub fn profile(spec: &ConfineSpec) -> Result<Profile, ProfileError> {
    let mut p = Params::default();
    let mut t = String::from("(version 1)\n(deny default)\n");
    let hidden = p.subpaths(spec.fence.hidden.iter().map(PathBuf::as_path))?;
    // Every grant below excludes metash's state, whatever it contains.
    let except = |rule: String| -> String {
        if hidden.is_empty() {
            format!("{rule}\n")
        } else {
            format!("(require-all {rule} (require-not (require-any{hidden})))\n")
        }
    };
    let program = p.add(&spec.program)?;
    let program_dirs = p.subpaths(spec.program_dirs.iter().map(PathBuf::as_path))?;
    let system = p.subpaths(SYSTEM_RO.iter().map(Path::new))?;
    let _ = writeln!(
        t,
        "(allow process-fork)\n(allow signal (target same-sandbox))"
    );
    let _ = writeln!(t, "(allow sysctl-read)\n(allow file-read-metadata)");
    let _ = writeln!(
        t,
        "(allow process-exec (literal {program}){program_dirs}{system})"
    );
    let _ = write!(
        t,
        "(allow file-read* {})",
        except(format!(
            "(require-any (literal {program}){program_dirs}{system})"
        ))
    );
    let workspace = p.add(&spec.workspace)?;
    let rw_paths = p.subpaths(
        spec.paths
            .iter()
            .filter(|a| a.write)
            .map(|a| a.path.as_path()),
    )?;
    let ro_paths = p.subpaths(
        spec.paths
            .iter()
            .filter(|a| !a.write)
            .map(|a| a.path.as_path()),
    )?;
    let writable = format!("(require-any (subpath {workspace}){rw_paths})");
    let _ = write!(t, "(allow file-read* file-write* {}", except(writable));
    if !ro_paths.is_empty() {
        let _ = write!(
            t,
            "(allow file-read* {}",
            except(format!("(require-any{ro_paths})"))
        );
    }
    for port in &spec.fence.connect_ports {
        let _ = writeln!(
            t,
            "(allow network-outbound (remote tcp \"localhost:{port}\"))"
        );
    }
    Ok(Profile {
        text: t,
        params: p.0,
    })
}

/// The arguments before the program: `-p PROFILE -D P0=/path …`.
pub fn sandbox_exec_args(profile: &Profile) -> Vec<OsString> {
    let mut args = vec![OsString::from("-p"), OsString::from(&profile.text)];
    for (name, path) in &profile.params {
        let mut kv = OsString::from(format!("{name}="));
        kv.push(path.as_os_str());
        args.push(OsString::from("-D"));
        args.push(kv);
    }
    args
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::native::confine_spec::Fence;
    use crate::spec::PathAccess;

    fn spec() -> ConfineSpec {
        ConfineSpec {
            name: "claude".into(),
            program: "/opt/claude/bin/claude".into(),
            program_dirs: vec!["/opt/claude".into()],
            workspace: "/Users/me/proj/.meta/worktrees/t1".into(),
            paths: vec![
                PathAccess {
                    path: "/Users/me/proj/.git".into(),
                    write: false,
                },
                PathAccess {
                    path: "/tmp/metash-home-t1".into(),
                    write: true,
                },
            ],
            fence: Fence {
                hidden: vec!["/Users/me/proj/.meta".into()],
                connect_ports: vec![41234],
                ..Fence::default()
            },
            env: vec![],
        }
    }

    fn param(p: &Profile, path: &str) -> String {
        let (name, _) = p
            .params
            .iter()
            .find(|(_, v)| v == Path::new(path))
            .unwrap_or_else(|| panic!("{path} is not a parameter: {:?}", p.params));
        format!("(param \"{name}\")")
    }

    #[test]
    fn denies_by_default_and_grants_exactly_the_spec() {
        let p = profile(&spec()).expect("profile");
        let lines: Vec<&str> = p.text.lines().collect();
        assert_eq!(lines[..2], ["(version 1)", "(deny default)"]);
        let ws = param(&p, "/Users/me/proj/.meta/worktrees/t1");
        let home = param(&p, "/tmp/metash-home-t1");
        let git = param(&p, "/Users/me/proj/.git");
        let meta = param(&p, "/Users/me/proj/.meta");
        // Read-write: the workspace and the read-write path, never the state directory.
        let rw = p
            .text
            .split("(allow ")
            .find(|r| r.starts_with("file-read* file-write*"))
            .expect("a read-write rule");
        assert!(rw.contains(&format!("(subpath {ws})")), "{rw}");
        assert!(rw.contains(&format!("(subpath {home})")), "{rw}");
        assert!(!rw.contains(&git), "{rw}");
        assert!(
            rw.contains(&format!("(require-not (require-any (subpath {meta})))")),
            "{rw}"
        );
        // Read-only: .git, also excluding the state directory.
        let ro = p
            .text
            .split("(allow ")
            .filter(|r| r.starts_with("file-read* ("))
            .find(|r| r.contains(&git))
            .expect("a read-only rule for .git");
        assert!(ro.contains(&format!("(subpath {meta})")), "{ro}");
        // Network: the one loopback port, nothing else.
        let net: Vec<&&str> = lines.iter().filter(|l| l.contains("network")).collect();
        assert_eq!(
            net,
            [&"(allow network-outbound (remote tcp \"localhost:41234\"))"]
        );
        assert!(!p.text.contains("network-bind") && !p.text.contains("network*"));
        // No path is spelled in the text.
        assert!(!p.text.contains("/Users/me"), "{}", p.text);
    }

    #[test]
    fn paths_go_as_parameters_so_quotes_cannot_change_the_profile() {
        let mut s = spec();
        s.workspace = PathBuf::from("/tmp/a\") (allow default) (\"");
        let p = profile(&s).expect("profile");
        assert!(!p.text.contains("(allow default)"), "{}", p.text);
        let args = sandbox_exec_args(&p);
        assert_eq!(args[0], "-p");
        assert!(args.iter().any(|a| a
            .to_string_lossy()
            .ends_with("=/tmp/a\") (allow default) (\"")));
    }

    #[test]
    fn relative_and_unsafe_paths_are_refused() {
        let mut s = spec();
        s.workspace = "proj".into();
        assert_eq!(
            profile(&s),
            Err(ProfileError::Relative(PathBuf::from("proj")))
        );
        let mut s = spec();
        s.program = "/opt/x\nallow".into();
        assert!(matches!(profile(&s), Err(ProfileError::Unsafe(_))));
    }

    #[test]
    fn without_state_directories_the_grants_are_plain() {
        let mut s = spec();
        s.fence.hidden.clear();
        s.fence.connect_ports.clear();
        let p = profile(&s).expect("profile");
        assert!(!p.text.contains("require-not"));
        assert!(!p.text.contains("network"));
    }
}
