//! Codex CLI (`codex-cli`). A custom provider is passed as `-c` overrides (Codex ignores
//! `OPENAI_BASE_URL`) and derived only from the request, so every turn of a thread sees the same
//! provider definition, which `codex exec resume` requires.

use std::path::{Path, PathBuf};

use metash_protocol::InteractionMode;

use super::toml;
use crate::error::Result;
use crate::fsutil::write_atomic;
use crate::programs::{Program, Programs};
use crate::request::{BuildProcessInvocationSpecRequest, Materialized};

/// `-c` overrides for the provider, sandbox, instructions and MCP servers, in a fixed order.
fn overrides(req: &BuildProcessInvocationSpecRequest) -> Vec<(String, String)> {
    let o = &req.options;
    let mut c: Vec<(String, String)> = vec![
        ("analytics.enabled".into(), "false".into()),
        ("check_for_update_on_startup".into(), "false".into()),
    ];
    if let Some(ep) = &o.endpoint {
        let name = toml::key(ep.name());
        c.push(("model_provider".into(), toml::string(ep.name())));
        c.push((
            format!("model_providers.{name}.name"),
            toml::string(ep.name()),
        ));
        c.push((
            format!("model_providers.{name}.base_url"),
            toml::string(&ep.base_url),
        ));
        c.push((
            format!("model_providers.{name}.wire_api"),
            toml::string("responses"),
        ));
        match &o.sign_in {
            // The ChatGPT sign-in in its own CODEX_HOME (a placeholder): the provider uses it.
            Some(_) => c.push((
                format!("model_providers.{name}.requires_openai_auth"),
                "true".into(),
            )),
            None => {
                if let Some(var) = &ep.api_key_env {
                    c.push((format!("model_providers.{name}.env_key"), toml::string(var)));
                }
            }
        }
    }
    if let Some(url) = o.sign_in.as_ref().and_then(|s| s.chatgpt_base_url.as_ref()) {
        c.push(("chatgpt_base_url".into(), toml::string(url)));
    }
    if !o.skip_permissions {
        if let Some(mode) = &o.permission_mode {
            c.push(("sandbox_mode".into(), toml::string(mode)));
        }
    }
    let instructions = match (&o.system_prompt, &o.append_system_prompt) {
        (Some(a), Some(b)) => Some(format!("{a}\n\n{b}")),
        (Some(a), None) | (None, Some(a)) => Some(a.clone()),
        (None, None) => None,
    };
    if let Some(text) = instructions {
        c.push(("developer_instructions".into(), toml::string(&text)));
    }
    if o.trust_cwd && o.isolated_home {
        let cwd = req.cwd.to_string_lossy();
        c.push((
            format!("projects.{}.trust_level", toml::string(&cwd)),
            toml::string("trusted"),
        ));
    }
    if let Some(serde_json::Value::Object(servers)) = &o.mcp_servers {
        for (name, def) in servers {
            c.push((format!("mcp_servers.{}", toml::key(name)), toml::value(def)));
        }
    }
    c
}

pub(crate) fn materialize(req: &BuildProcessInvocationSpecRequest) -> Result<Materialized> {
    let mut m = Materialized::default();
    // A sign-in always gets a CODEX_HOME of its own: the user's holds the real tokens.
    if req.options.isolated_home || req.options.sign_in.is_some() {
        let home = req.asp_home.join(super::INFO.state_dir).join("home");
        // The same overrides as the argv, as a config file: what a person running the
        // displayCommand by hand from this CODEX_HOME also gets.
        let mut doc = String::from("# written by metash; the argv's -c overrides say the same\n");
        for (k, v) in overrides(req) {
            doc.push_str(&format!("{k} = {v}\n"));
        }
        let path = home.join("config.toml");
        write_atomic(&path, doc.as_bytes())?;
        if let Some(sign_in) = &req.options.sign_in {
            let auth = super::signin::placeholder_auth_json(sign_in, chrono::Utc::now());
            let mut bytes = serde_json::to_vec_pretty(&auth).unwrap_or_default();
            bytes.push(b'\n');
            write_atomic(&home.join("auth.json"), &bytes)?;
        }
        m.provider_config = Some(path);
        m.env.insert(
            "CODEX_HOME".to_string(),
            home.to_string_lossy().into_owned(),
        );
        m.env
            .insert("HOME".to_string(), home.to_string_lossy().into_owned());
        m.home = Some(home);
    }
    Ok(m)
}

pub(crate) fn argv(
    req: &BuildProcessInvocationSpecRequest,
    _materialized: &Materialized,
    programs: &Programs,
    warnings: &mut Vec<String>,
) -> Result<Vec<String>> {
    let o = &req.options;
    let headless = req.interaction_mode != InteractionMode::Interactive;
    let key = req.continuation_key();
    let mut a = vec![programs.argv0(Program::Codex)];
    match (headless, key.is_some()) {
        (true, false) => a.push("exec".into()),
        (true, true) => a.extend(["exec".into(), "resume".into()]),
        (false, true) => a.push("resume".into()),
        (false, false) => {}
    }
    if headless {
        a.extend(["--json".into(), "--skip-git-repo-check".into()]);
    }
    for (k, v) in overrides(req) {
        a.extend(["-c".to_string(), format!("{k}={v}")]);
    }
    for f in ["plugins", "apps", "remote_plugin", "in_app_updates"] {
        a.extend(["--disable".to_string(), f.to_string()]);
    }
    if let Some(model) = &req.model {
        a.extend(["-m".to_string(), model.clone()]);
    }
    if o.skip_permissions {
        a.push("--dangerously-bypass-approvals-and-sandbox".into());
    }
    if !o.extra_dirs.is_empty() {
        if key.is_some() {
            warnings.push("codex resume takes no --add-dir; extra dirs not passed".into());
        } else {
            for d in &o.extra_dirs {
                a.extend(["--add-dir".to_string(), d.to_string_lossy().into_owned()]);
            }
        }
    }
    if o.max_budget_usd.is_some() || o.max_turns.is_some() {
        warnings
            .push("codex has no budget or turn limit flags; the caller must enforce them".into());
    }
    if !o.allowed_tools.is_empty() || !o.disallowed_tools.is_empty() {
        warnings.push("codex has no tool allow/deny flags; use permissionMode (sandbox)".into());
    }
    if key.is_some() || req.prompt.is_some() {
        a.push("--".into());
    }
    if let Some(k) = key {
        a.push(k.to_string());
    }
    if let Some(p) = &req.prompt {
        a.push(p.clone());
    }
    Ok(a)
}

/// Finds `$CODEX_HOME/sessions/YYYY/MM/DD/rollout-…-<thread_id>.jsonl`.
pub fn codex_rollout_file(codex_home: &Path, thread_id: &str) -> Option<PathBuf> {
    let suffix = format!("-{thread_id}.jsonl");
    crate::fsutil::find_file(&codex_home.join("sessions"), |n| n.ends_with(&suffix))
}
