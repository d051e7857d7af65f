//! Seed 002's `input.context_refs`: what the caller points the agent at, resolved by the host
//! before the agent starts, so the agent gets only references that exist and that it may use.
//!
//! | ref | resolves when | the agent fetches it with |
//! | --- | --- | --- |
//! | `file:PATH` | PATH is inside the workspace, outside metash's state, and exists | its own file grants (relative to its workspace) |
//! | `artifact:ID` | a saved artifact has that id | `state_get {key: ID, scope: "artifact"}` (only refs of this spawn) |
//! | `kv:KEY` | its own namespace holds KEY | `state_get {key: KEY, scope: "agent"}` (`memory` grant) |
//! | `scratchpad:KEY` | the scratchpad holds KEY | `state_get {key: KEY, scope: "scratchpad"}` (`memory` grant) |
//!
//! A reference that does not resolve refuses the spawn, naming it: an agent is never sent after
//! something that is not there.

use std::path::{Component, Path};

use base64::Engine as _;
use serde_json::{json, Value};

use crate::error::{HostError, Result};
use crate::host::Host;

/// The largest artifact handed back through `state_get` (bigger ones: by a file grant).
const MAX_ARTIFACT_BYTES: u64 = 1024 * 1024;

/// Each ref checked and normalised, in order.
///
/// # Errors
/// [`HostError::InvalidRequest`] naming the first reference that does not resolve.
pub(crate) fn resolve(
    host: &Host,
    agent: &str,
    workspace: &Path,
    refs: &[String],
) -> Result<Vec<String>> {
    refs.iter()
        .map(|r| resolve_one(host, agent, workspace, r))
        .collect()
}

fn resolve_one(host: &Host, agent: &str, workspace: &Path, r: &str) -> Result<String> {
    let bad = |why: &str| HostError::InvalidRequest(format!("context_refs: `{r}` {why}"));
    let (kind, what) = r
        .split_once(':')
        .ok_or_else(|| bad("is not KIND:VALUE (file, artifact, kv or scratchpad)"))?;
    match kind {
        "file" => {
            let rel = Path::new(what);
            let plain = rel
                .components()
                .all(|c| matches!(c, Component::Normal(_) | Component::CurDir));
            let named = rel.components().any(|c| matches!(c, Component::Normal(_)));
            if !named || !plain {
                return Err(bad(
                    "must be a path inside the workspace, relative, without `..`",
                ));
            }
            let full = workspace.join(rel);
            if host.is_hidden(&full) {
                return Err(bad(
                    "is inside metash's state directory, which no agent sees",
                ));
            }
            if !full.exists() {
                return Err(bad("does not exist"));
            }
            let clean: std::path::PathBuf = rel
                .components()
                .filter(|c| matches!(c, Component::Normal(_)))
                .collect();
            Ok(format!("file:{}", clean.display()))
        }
        "artifact" => {
            let known = host
                .store()
                .artifacts()
                .list()?
                .iter()
                .any(|a| a.id == what);
            if known {
                Ok(r.to_string())
            } else {
                Err(bad("is not a saved artifact (`metash artifacts list`)"))
            }
        }
        "kv" | "scratchpad" => {
            let kv = if kind == "kv" {
                host.store().kv(agent)?
            } else {
                host.store().scratchpad()
            };
            match kv.get(what)? {
                Some(_) => Ok(r.to_string()),
                None => Err(bad("is not stored")),
            }
        }
        _ => Err(bad(
            "has an unknown kind (file, artifact, kv or scratchpad)",
        )),
    }
}

/// An artifact's content for `state_get` with scope `artifact`: text as a string, anything else
/// as `{"base64": …}`; only artifacts this spawn was given.
///
/// # Errors
/// Not among `refs`, too large, or unreadable.
pub(crate) fn artifact_value(host: &Host, refs: &[String], id: &str) -> Result<Value> {
    if !refs.iter().any(|r| r.strip_prefix("artifact:") == Some(id)) {
        return Err(HostError::InvalidRequest(format!(
            "artifact `{id}` is not among this spawn's context_refs"
        )));
    }
    let path = host.store().artifacts().dir().join(id);
    let size = std::fs::metadata(&path)
        .map_err(|e| HostError::InvalidRequest(format!("artifact `{id}`: {e}")))?
        .len();
    if size > MAX_ARTIFACT_BYTES {
        return Err(HostError::InvalidRequest(format!(
            "artifact `{id}` has {size} bytes, more than the {MAX_ARTIFACT_BYTES} state_get \
             returns; read it through a file grant"
        )));
    }
    let bytes = std::fs::read(&path)
        .map_err(|e| HostError::InvalidRequest(format!("artifact `{id}`: {e}")))?;
    Ok(match String::from_utf8(bytes) {
        Ok(text) => Value::String(text),
        Err(e) => {
            json!({"base64": base64::engine::general_purpose::STANDARD.encode(e.into_bytes())})
        }
    })
}
