//! pi-coding-agent (`pi-sdk`), driven in its JSON mode. Provider config goes into its agent dir
//! (`models.json`); a resume passes the session file's full path, which pi honours from any cwd
//! (a bare id from another cwd makes pi ask to fork and exit doing nothing).

use std::path::{Path, PathBuf};

use crate::error::{HarnessError, Result};
use crate::fsutil::{ensure_dir, write_atomic};
use crate::programs::{Program, Programs};
use crate::request::{BuildProcessInvocationSpecRequest, Materialized};

pub(crate) fn agent_dir(asp_home: &Path) -> PathBuf {
    asp_home.join(super::INFO.state_dir).join("agent")
}

pub(crate) fn materialize(req: &BuildProcessInvocationSpecRequest) -> Result<Materialized> {
    let dir = req.asp_home.join(super::INFO.state_dir);
    let agent = agent_dir(&req.asp_home);
    ensure_dir(&agent)?;
    let mut m = Materialized::default();
    m.env.insert("PI_OFFLINE".to_string(), "1".to_string());
    m.env.insert("PI_TELEMETRY".to_string(), "0".to_string());
    m.env.insert(
        "PI_CODING_AGENT_DIR".to_string(),
        agent.to_string_lossy().into_owned(),
    );
    if req.options.isolated_home {
        let home = dir.join("home");
        ensure_dir(&home)?;
        m.env
            .insert("HOME".to_string(), home.to_string_lossy().into_owned());
        m.home = Some(home);
    }
    if let Some(ep) = &req.options.endpoint {
        let model = req.model.clone().unwrap_or_else(|| "default".to_string());
        let doc = serde_json::json!({
            "providers": {
                ep.name(): {
                    "baseUrl": ep.base_url,
                    "api": "openai-completions",
                    "apiKey": ep.api_key_env.clone().unwrap_or_else(|| super::INFO.key_env.to_string()),
                    "compat": { "supportsDeveloperRole": false, "supportsReasoningEffort": false },
                    "models": [ { "id": model } ]
                }
            }
        });
        let mut bytes = serde_json::to_vec_pretty(&doc).unwrap_or_default();
        bytes.push(b'\n');
        let path = agent.join("models.json");
        write_atomic(&path, &bytes)?;
        m.provider_config = Some(path);
    }
    Ok(m)
}

pub(crate) fn argv(
    req: &BuildProcessInvocationSpecRequest,
    m: &Materialized,
    programs: &Programs,
    _warnings: &mut Vec<String>,
) -> Result<Vec<String>> {
    let mut a = vec![programs.argv0(Program::Pi)];
    // Interactive: pi's own terminal UI (a control plane hosts it on a pty).
    if req.interaction_mode != metash_protocol::InteractionMode::Interactive {
        a.extend(["-p".into(), "--mode".into(), "json".into()]);
    }
    if let Some(ep) = &req.options.endpoint {
        a.extend(["--provider".to_string(), ep.name().to_string()]);
    }
    if let Some(model) = &req.model {
        a.extend(["--model".to_string(), model.clone()]);
    }
    if let Some(key) = req.continuation_key() {
        let agent = m
            .env
            .get("PI_CODING_AGENT_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| agent_dir(&req.asp_home));
        let file = pi_session_file(&agent, key).ok_or_else(|| {
            HarnessError::ContinuationNotFound(format!(
                "no pi session {key} under {}",
                agent.display()
            ))
        })?;
        a.extend(["--session".to_string(), file.to_string_lossy().into_owned()]);
    }
    if let Some(sp) = &req.options.system_prompt {
        a.extend(["--system-prompt".to_string(), sp.clone()]);
    }
    if let Some(sp) = &req.options.append_system_prompt {
        a.extend(["--append-system-prompt".to_string(), sp.clone()]);
    }
    if let Some(p) = &req.prompt {
        a.push(p.clone());
    }
    Ok(a)
}

/// Finds the session file whose name ends with `_<id>.jsonl` under the agent dir's `sessions/`.
pub fn pi_session_file(agent_dir: &Path, id: &str) -> Option<PathBuf> {
    // Exactly `<timestamp>_<id>.jsonl` (pi's naming): a key that is only part of another
    // session's id, or of its timestamp, must not resume that session.
    let suffix = format!("_{id}.jsonl");
    crate::fsutil::find_file(&agent_dir.join("sessions"), |n| n.ends_with(&suffix))
}
