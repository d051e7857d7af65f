//! An agent's `artifact` event (seed 002 §7): the file it names is copied into the project's
//! artifact store (`.meta/artifacts/`, under the retention policy of `[artifacts]`), so it
//! outlives the agent's worktree and can be listed, shown and collected. The path is the
//! agent's own: inside WASM, `/workspace/...` is the spawn's workspace. Only a regular file
//! inside that workspace, outside metash's state and within the size limit is taken.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use metash_protocol::{AgentEvent, SandboxKind};

use crate::{Host, HostError, Result};

/// The largest artifact copied (64 MiB): bigger outputs belong in the worktree or the repo.
const MAX_ARTIFACT_BYTES: u64 = 64 << 20;

/// Where an agent works, as its `artifact` paths are read.
pub(super) struct Workspace {
    pub agent: String,
    pub root: PathBuf,
    pub sandbox: SandboxKind,
}

/// Saves the artifact and applies the retention policy; the answer for the agent when refused.
pub(super) fn save(host: &Host, ws: &Workspace, id: &str, path: &str) -> Option<AgentEvent> {
    match copy(host, ws, id, path) {
        Ok(()) => None,
        Err(e) => Some(AgentEvent::Error {
            code: "artifact_refused".into(),
            message: format!("artifact `{id}` ({path}): {e}"),
            hint: Some("name a regular file inside your workspace, at most 64 MiB".into()),
        }),
    }
}

fn copy(host: &Host, ws: &Workspace, id: &str, path: &str) -> Result<()> {
    let file = resolve(ws, path)?;
    if host.is_hidden(&file) {
        return Err(HostError::InvalidRequest(
            "it is inside metash's state directory".into(),
        ));
    }
    let meta = std::fs::metadata(&file)
        .map_err(|e| HostError::InvalidRequest(format!("cannot read it: {e}")))?;
    if !meta.is_file() {
        return Err(HostError::InvalidRequest("it is not a regular file".into()));
    }
    if meta.len() > MAX_ARTIFACT_BYTES {
        return Err(HostError::InvalidRequest(format!(
            "it has {} bytes, more than the {MAX_ARTIFACT_BYTES} an artifact may have",
            meta.len()
        )));
    }
    let bytes = std::fs::read(&file)
        .map_err(|e| HostError::InvalidRequest(format!("cannot read it: {e}")))?;
    host.flush_events()?;
    let artifacts = host.store().artifacts();
    artifacts.put(id, &bytes, Some(&ws.agent))?;
    artifacts.gc(host.config().artifacts.retention(), SystemTime::now())?;
    Ok(())
}

/// The file on the host that the agent's `path` names, resolved (symlinks included) and checked
/// to be inside the spawn's workspace.
fn resolve(ws: &Workspace, path: &str) -> Result<PathBuf> {
    let workspace = ws
        .root
        .canonicalize()
        .map_err(|e| HostError::InvalidRequest(format!("no workspace: {e}")))?;
    let named = Path::new(path);
    let on_host = match ws.sandbox {
        SandboxKind::Wasm => match named.strip_prefix(metash_runtime::wasm::GUEST_WORKSPACE) {
            Ok(rel) => workspace.join(rel),
            Err(_) => workspace.join(named),
        },
        SandboxKind::Native => workspace.join(named),
    };
    let real = on_host
        .canonicalize()
        .map_err(|e| HostError::InvalidRequest(format!("cannot find it: {e}")))?;
    if !real.starts_with(&workspace) {
        return Err(HostError::InvalidRequest(
            "it is outside the agent's workspace".into(),
        ));
    }
    Ok(real)
}
