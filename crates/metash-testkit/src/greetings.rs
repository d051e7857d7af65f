//! The example project (`examples/greetings`) for tests: its WASM planner, executor and verifier
//! built from `crates/metash-example-agents` for `wasm32-wasip1`, and the example's files copied
//! into a project, as `examples/greetings/run.sh` does before `metash run`.

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo_root() -> PathBuf {
    // This crate is `crates/metash-testkit`: the workspace is two levels up.
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The example's directory in the repository.
pub fn example_dir() -> PathBuf {
    repo_root().join("examples/greetings")
}

/// Builds the example agents for wasm32-wasip1 (a no-op when they are fresh) and returns their
/// directory. A failed build is a test failure (the target is installed by scripts/setup).
pub fn wasm_agents() -> PathBuf {
    let root = repo_root();
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let dir = target.join("wasm32-wasip1").join("release");
    if fresh(&dir, &root) {
        return dir; // no need to wait for the build lock other cargo processes hold
    }
    let status = Command::new(env!("CARGO"))
        .args([
            "build",
            "-q",
            "--release",
            "-p",
            "metash-example-agents",
            "--target",
            "wasm32-wasip1",
        ])
        .current_dir(&root)
        .status()
        .expect("cargo runs");
    assert!(
        status.success(),
        "building the example agents for wasm32-wasip1 (rustup target add wasm32-wasip1)"
    );
    dir
}

/// The three modules exist and are newer than every source file they are built from.
fn fresh(dir: &Path, root: &Path) -> bool {
    fn newest(path: &Path) -> std::time::SystemTime {
        let mut t = std::time::UNIX_EPOCH;
        for e in std::fs::read_dir(path).into_iter().flatten().flatten() {
            let p = e.path();
            let m = if p.is_dir() {
                newest(&p)
            } else {
                e.metadata().and_then(|m| m.modified()).unwrap_or(t)
            };
            t = t.max(m);
        }
        t
    }
    let sources = [
        "crates/metash-example-agents",
        "crates/metash-agent",
        "crates/metash-protocol",
    ]
    .iter()
    .map(|c| newest(&root.join(c)))
    .max()
    .unwrap_or(std::time::UNIX_EPOCH);
    ["planner", "executor", "verifier"].iter().all(|a| {
        std::fs::metadata(dir.join(format!("{a}.wasm")))
            .and_then(|m| m.modified())
            .is_ok_and(|t| t > sources)
    })
}

/// Into a project whose store exists (`Store::init` with [`context`]): the example's config, the
/// three agents' manifests and modules, and a policy file (returned) that lets the executor read
/// and write its worktree and the verifier read, as the example's script grants.
pub fn copy_into(project: &Path) -> PathBuf {
    let wasm = wasm_agents();
    let example = example_dir();
    std::fs::copy(
        example.join("config.toml"),
        project.join(".meta/config.toml"),
    )
    .expect("copy config.toml");
    for agent in ["planner", "executor", "verifier"] {
        let d = project.join(".meta/agents").join(agent);
        std::fs::create_dir_all(&d).expect("agent dir");
        std::fs::copy(
            example.join("agents").join(agent).join("manifest.toml"),
            d.join("manifest.toml"),
        )
        .expect("copy manifest");
        std::fs::copy(
            wasm.join(format!("{agent}.wasm")),
            d.join(format!("{agent}.wasm")),
        )
        .expect("copy module");
    }
    let policy = project.join(".meta/test-policy.toml");
    std::fs::write(
        &policy,
        "schema_version = \"0.1\"\n\
         [[allow]]\nagent = \"executor\"\ncapability = \"files.write\"\nduration_s = 3600\n\
         [[allow]]\nagent = \"executor\"\ncapability = \"files.read\"\nduration_s = 3600\n\
         [[allow]]\nagent = \"verifier\"\ncapability = \"files.read\"\nduration_s = 3600\n",
    )
    .expect("write policy");
    policy
}

/// The example's `context.md`.
pub fn context() -> String {
    std::fs::read_to_string(example_dir().join("context.md"))
        .expect("examples/greetings/context.md")
}
