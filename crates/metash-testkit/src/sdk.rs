//! The SDKs' example agents (`examples/sdk-typescript`, `examples/sdk-python`), built the way their
//! READMEs say (`build.sh DEST`) into a fresh directory, for the tests and the round-trip bench.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A language with an SDK.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lang {
    TypeScript,
    Python,
}

impl Lang {
    pub const ALL: [Lang; 2] = [Lang::TypeScript, Lang::Python];

    /// `typescript`, `python`: the example directory's suffix.
    pub fn name(self) -> &'static str {
        match self {
            Lang::TypeScript => "typescript",
            Lang::Python => "python",
        }
    }

    /// The built entry of agent `stem` (`agent`, `echo`).
    pub fn entry(self, stem: &str) -> String {
        match self {
            Lang::TypeScript => format!("{stem}.mjs"),
            Lang::Python => format!("{stem}.pyz"),
        }
    }

    /// The example's source directory.
    pub fn example_dir(self) -> PathBuf {
        repo().join("examples").join(format!("sdk-{}", self.name()))
    }
}

/// The repository's root.
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The Python that builds and runs the Python side: the setup script's venv (pip, pytest) when
/// present, else `python3`.
pub fn python() -> PathBuf {
    let venv = repo().join(".tools/py/bin/python");
    if venv.exists() {
        venv
    } else {
        PathBuf::from("python3")
    }
}

/// Why the SDK examples cannot be built here, if they cannot (node, npm, python3 with pip).
pub fn missing() -> Option<String> {
    let python = python().to_string_lossy().into_owned();
    let probes: [(&str, &[&str]); 3] = [
        ("node", &["--version"]),
        ("npm", &["--version"]),
        (&python, &["-m", "pip", "--version"]),
    ];
    for (prog, args) in probes {
        let ok = Command::new(prog)
            .args(args)
            .output()
            .is_ok_and(|o| o.status.success());
        if !ok {
            return Some(format!(
                "`{prog} {}` does not run (Node 20 and Python 3 with pip; scripts/setup)",
                args.join(" ")
            ));
        }
    }
    None
}

/// Builds `lang`'s example into `dest` with its `build.sh`.
///
/// # Errors
/// The build failed: its output.
pub fn build(lang: Lang, dest: &Path) -> Result<(), String> {
    run_build(lang, "build.sh", dest, &[("PYTHON", python())])
}

/// Runs one of the example's build scripts into `dest`, with the variables set.
fn run_build(
    lang: Lang,
    script: &str,
    dest: &Path,
    vars: &[(&str, PathBuf)],
) -> Result<(), String> {
    let out = Command::new("bash")
        .arg(lang.example_dir().join(script))
        .arg(dest)
        .envs(vars.iter().map(|(k, v)| (*k, v)))
        .output()
        .map_err(|e| format!("bash: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{} {script} failed: {}{}",
            lang.name(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// The tools of `lang`'s WASM build, when they are installed: componentize-py from the setup
/// script's venv (or PATH) for Python; rolldown and componentize-js from `.tools` (pinned by the
/// setup script) for TypeScript. The variables `build-wasm.sh` reads them from.
pub fn componentizer(lang: Lang) -> Result<Vec<(&'static str, PathBuf)>, String> {
    let tools: &[(&str, PathBuf)] = match lang {
        Lang::Python => &[(
            "COMPONENTIZE_PY",
            repo().join(".tools/py/bin/componentize-py"),
        )],
        Lang::TypeScript => &[
            ("ROLLDOWN", repo().join(".tools/node_modules/.bin/rolldown")),
            (
                "COMPONENTIZE_JS",
                repo().join(".tools/node_modules/.bin/componentize-js"),
            ),
        ],
    };
    for (_, tool) in tools {
        let runs = Command::new(tool)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());
        if !runs {
            return Err(format!(
                "{} does not run (scripts/setup installs the WASM toolchains)",
                tool.display()
            ));
        }
    }
    Ok(tools.to_vec())
}

/// Builds `lang`'s example as a WASI component into `dest` with its `build-wasm.sh`.
///
/// # Errors
/// A tool is missing, or the build failed: its output.
pub fn build_wasm(lang: Lang, dest: &Path) -> Result<(), String> {
    run_build(lang, "build-wasm.sh", dest, &componentizer(lang)?)
}
