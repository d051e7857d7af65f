//! Claude Code (`claude-code`, and `agent-sdk` which drives the same program headless in
//! stream-json mode, as the Agent SDK itself does). Flags and resume rules: HARNESSES.md.

use std::path::{Path, PathBuf};

use metash_protocol::InteractionMode;

use crate::error::Result;
use crate::fsutil::{ensure_dir, write_atomic};
use crate::programs::{Program, Programs};
use crate::request::{safe_name, BuildProcessInvocationSpecRequest, Materialized};

pub(crate) fn materialize(req: &BuildProcessInvocationSpecRequest) -> Result<Materialized> {
    let dir = req.asp_home.join(super::STATE_DIR);
    let run_dir = dir.join("sessions").join(safe_name(&req.cp_session_id));
    let mut m = Materialized::default();
    for (k, v) in [
        ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1"),
        ("DISABLE_TELEMETRY", "1"),
        ("DISABLE_AUTOUPDATER", "1"),
        ("DISABLE_ERROR_REPORTING", "1"),
        // Interactive sessions otherwise look up the release CDN and the plugin marketplace.
        ("DISABLE_INSTALLATION_CHECKS", "1"),
        ("CLAUDE_CODE_DISABLE_OFFICIAL_MARKETPLACE_AUTOINSTALL", "1"),
    ] {
        m.env.insert(k.to_string(), v.to_string());
    }
    if req.options.isolated_home {
        let home = dir.join("home");
        // CLAUDE_CONFIG_DIR too, so a CLAUDE_CONFIG_DIR in the caller's environment cannot point the
        // harness (and its sessions) elsewhere.
        let config = home.join(".claude");
        ensure_dir(&config)?;
        // Skips the first-run onboarding an interactive session would show. Claude keeps its own
        // state in this file afterwards, so it is only amended, never replaced.
        let state = config.join(".claude.json");
        // A key the caller handed this isolated harness is approved, as the interactive CLI would
        // otherwise stop to ask "use this API key?" (Claude stores its last 20 characters).
        let key = req.env.get("ANTHROPIC_API_KEY").map(String::as_str);
        write_state(
            &state,
            req.options.trust_cwd.then_some(req.cwd.as_path()),
            key,
        )?;
        m.env
            .insert("HOME".to_string(), home.to_string_lossy().into_owned());
        m.env.insert(
            "CLAUDE_CONFIG_DIR".to_string(),
            config.to_string_lossy().into_owned(),
        );
        m.home = Some(home);
    }
    if let Some(ep) = &req.options.endpoint {
        m.env
            .insert("ANTHROPIC_BASE_URL".to_string(), ep.base_url.clone());
    }
    // A subscription sign-in: Claude Code then sends `Authorization: Bearer` and the OAuth beta
    // header, with the placeholder the credential proxy replaces.
    if let Some(sign_in) = &req.options.sign_in {
        m.env.insert(
            "CLAUDE_CODE_OAUTH_TOKEN".to_string(),
            sign_in.placeholder.clone(),
        );
    }
    if req.options.skip_permissions {
        m.env.insert("IS_SANDBOX".to_string(), "1".to_string());
    }
    if let Some(servers) = &req.options.mcp_servers {
        let path = run_dir.join("mcp.json");
        let doc = serde_json::json!({ "mcpServers": servers });
        let mut bytes = serde_json::to_vec_pretty(&doc).unwrap_or_default();
        bytes.push(b'\n');
        write_atomic(&path, &bytes)?;
        m.mcp_config = Some(path);
    }
    if let Some(sp) = &req.options.system_prompt {
        let path = run_dir.join("system-prompt.md");
        write_atomic(&path, sp.as_bytes())?;
        m.system_prompt_file = Some(path);
    }
    Ok(m)
}

/// Creates or amends Claude's state file: onboarding done, the given API key approved, and the
/// cwd trusted when asked.
/// A fresh aspHome always gets the same bytes.
fn write_state(path: &Path, trust: Option<&Path>, api_key: Option<&str>) -> Result<()> {
    let mut doc: serde_json::Value = std::fs::read(path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_else(|| serde_json::json!({}));
    let before = doc.clone();
    if let Some(obj) = doc.as_object_mut() {
        obj.insert("hasCompletedOnboarding".into(), true.into());
        obj.insert("bypassPermissionsModeAccepted".into(), true.into());
    }
    if let Some(k) = api_key {
        let chars: Vec<char> = k.chars().collect();
        let tail: String = chars[chars.len().saturating_sub(20)..].iter().collect();
        if !doc["customApiKeyResponses"].is_object() {
            doc["customApiKeyResponses"] = serde_json::json!({"approved": [], "rejected": []});
        }
        let approved = &mut doc["customApiKeyResponses"]["approved"];
        if !approved.is_array() {
            *approved = serde_json::json!([]);
        }
        if let Some(list) = approved.as_array_mut() {
            if !list.iter().any(|v| v.as_str() == Some(tail.as_str())) {
                list.push(tail.into());
            }
        }
    }
    if let Some(cwd) = trust {
        let key = cwd.to_string_lossy().into_owned();
        if !doc["projects"].is_object() {
            doc["projects"] = serde_json::json!({});
        }
        if !doc["projects"][&key].is_object() {
            doc["projects"][&key] = serde_json::json!({});
        }
        doc["projects"][&key]["hasTrustDialogAccepted"] = true.into();
    }
    if path.exists() && doc == before {
        return Ok(());
    }
    let mut bytes = serde_json::to_vec_pretty(&doc).unwrap_or_default();
    bytes.push(b'\n');
    write_atomic(path, &bytes)
}

pub(crate) fn argv(
    req: &BuildProcessInvocationSpecRequest,
    m: &Materialized,
    programs: &Programs,
    warnings: &mut Vec<String>,
) -> Result<Vec<String>> {
    let o = &req.options;
    let mut a = vec![programs.argv0(Program::Claude)];
    let headless = req.interaction_mode != InteractionMode::Interactive;
    if headless {
        a.extend(["-p", "--output-format", "stream-json", "--verbose"].map(String::from));
        if o.include_partial_messages {
            a.push("--include-partial-messages".to_string());
        }
    }
    if let Some(key) = req.continuation_key() {
        a.extend(["--resume".to_string(), key.to_string()]);
    } else if let Some(id) = &o.session_id {
        a.extend(["--session-id".to_string(), id.clone()]);
    }
    if let Some(model) = &req.model {
        a.extend(["--model".to_string(), model.clone()]);
    }
    if o.skip_permissions {
        a.push("--dangerously-skip-permissions".to_string());
    } else {
        if let Some(mode) = &o.permission_mode {
            a.extend(["--permission-mode".to_string(), mode.clone()]);
        }
        if let Some(tool) = &o.permission_prompt_tool {
            a.extend(["--permission-prompt-tool".to_string(), tool.clone()]);
        }
    }
    if let Some(path) = &m.system_prompt_file {
        a.extend([
            "--system-prompt-file".to_string(),
            path.to_string_lossy().into_owned(),
        ]);
    }
    if let Some(text) = &o.append_system_prompt {
        a.extend(["--append-system-prompt".to_string(), text.clone()]);
    }
    if let Some(path) = &m.mcp_config {
        a.extend([
            "--mcp-config".to_string(),
            path.to_string_lossy().into_owned(),
        ]);
        a.push("--strict-mcp-config".to_string());
    }
    for dir in &o.extra_dirs {
        a.extend(["--add-dir".to_string(), dir.to_string_lossy().into_owned()]);
    }
    if !o.allowed_tools.is_empty() {
        a.extend(["--allowedTools".to_string(), o.allowed_tools.join(",")]);
    }
    if !o.disallowed_tools.is_empty() {
        a.extend([
            "--disallowedTools".to_string(),
            o.disallowed_tools.join(","),
        ]);
    }
    if let Some(b) = o.max_budget_usd {
        if headless {
            a.extend(["--max-budget-usd".to_string(), b.to_string()]);
        } else {
            warnings.push("claude honours --max-budget-usd only with -p; not passed".to_string());
        }
    }
    if let Some(t) = o.max_turns {
        a.extend(["--max-turns".to_string(), t.to_string()]);
    }
    if let Some(prompt) = &req.prompt {
        // `--` ends the options, so a variadic flag (`--add-dir`, `--mcp-config`) cannot swallow
        // the prompt and a prompt starting with `-` stays a prompt.
        a.push("--".to_string());
        a.push(prompt.clone());
    }
    Ok(a)
}

/// Claude's project directory name for a cwd: every character but ASCII letters and digits
/// becomes `-` (`/work/a.b` → `-work-a-b`).
pub fn claude_project_dir(cwd: &Path) -> String {
    cwd.to_string_lossy()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect()
}

/// Where Claude keeps a conversation started from `cwd`: under its config dir
/// (`CLAUDE_CONFIG_DIR`, by default `$HOME/.claude`).
pub fn claude_session_file(config_dir: &Path, cwd: &Path, key: &str) -> PathBuf {
    config_dir
        .join("projects")
        .join(claude_project_dir(cwd))
        .join(format!("{key}.jsonl"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::SignInOptions;

    #[test]
    fn a_sign_in_gives_claude_the_placeholder_token() {
        let dir = tempfile::tempdir().expect("dir");
        let mut req = BuildProcessInvocationSpecRequest::new(
            metash_protocol::HarnessFrontend::ClaudeCode,
            dir.path(),
            dir.path(),
        );
        req.options.isolated_home = true;
        req.options.sign_in = Some(SignInOptions {
            placeholder: "ph".into(),
            ..SignInOptions::default()
        });
        let m = materialize(&req).expect("materialize");
        assert_eq!(
            m.env.get("CLAUDE_CODE_OAUTH_TOKEN").map(String::as_str),
            Some("ph")
        );
        assert!(!m.env.contains_key("ANTHROPIC_API_KEY"));
    }
}
