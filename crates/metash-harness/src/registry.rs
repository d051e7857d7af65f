//! Provider typing (seed 003 section 5.1) and `getHarnessCapabilities()`: which frontends exist,
//! which provider each belongs to, and whether its program is installed here.

use metash_protocol::{
    FrontendCapability, HarnessCapabilities, HarnessContinuationRef, HarnessFrontend,
    ProviderCapabilities, ProviderDomain,
};

use crate::error::{HarnessError, Result};
use crate::programs::{program_version, Program, Programs};

/// The program a frontend spawns, or `None` for metash's own API clients.
pub fn frontend_program(frontend: HarnessFrontend) -> Option<Program> {
    match frontend {
        HarnessFrontend::AgentSdk | HarnessFrontend::ClaudeCode => Some(Program::Claude),
        HarnessFrontend::CodexCli => Some(Program::Codex),
        HarnessFrontend::PiSdk => Some(Program::Pi),
        _ => None,
    }
}

fn frontend_kind(frontend: HarnessFrontend) -> &'static str {
    match frontend {
        HarnessFrontend::ClaudeCode | HarnessFrontend::CodexCli => "cli",
        HarnessFrontend::AgentSdk | HarnessFrontend::PiSdk => "sdk",
        _ => "api",
    }
}

/// Models we know by name; others pass through unless [`check_model`] rejects them.
pub fn known_models(provider: ProviderDomain) -> Vec<String> {
    let names: &[&str] = match provider {
        ProviderDomain::Anthropic => &[
            "claude-opus-4-5",
            "claude-sonnet-4-5",
            "claude-haiku-4-5",
            "opus",
            "sonnet",
            "haiku",
        ],
        ProviderDomain::Openai => &["gpt-5.1-codex", "gpt-5.1", "gpt-5-mini", "o4-mini"],
    };
    names.iter().map(|s| s.to_string()).collect()
}

/// `getHarnessCapabilities()`. Runs each installed program's `--version` once.
pub fn get_harness_capabilities(programs: &Programs) -> HarnessCapabilities {
    let providers = [ProviderDomain::Anthropic, ProviderDomain::Openai]
        .into_iter()
        .map(|provider| ProviderCapabilities {
            provider,
            frontends: HarnessFrontend::ALL
                .into_iter()
                .filter(|f| f.provider() == provider)
                .map(|frontend| {
                    let path = frontend_program(frontend).and_then(|p| programs.get(p));
                    FrontendCapability {
                        frontend,
                        kind: frontend_kind(frontend).to_string(),
                        installed: frontend_program(frontend).is_none() || path.is_some(),
                        program: path.map(|p| p.to_string_lossy().into_owned()),
                        version: path.and_then(program_version),
                    }
                })
                .collect(),
            models: known_models(provider),
        })
        .collect();
    HarnessCapabilities { providers }
}

/// Refuses a continuation of the other provider, before anything is materialized or spawned.
///
/// # Errors
/// `ProviderMismatch`.
pub fn check_continuation(
    frontend: HarnessFrontend,
    continuation: Option<&HarnessContinuationRef>,
) -> Result<()> {
    match continuation {
        Some(c) if c.provider != frontend.provider() => Err(HarnessError::ProviderMismatch {
            continuation: c.provider,
            frontend,
        }),
        _ => Ok(()),
    }
}

/// Rejects a model that plainly belongs to the other provider (a `claude-*` model on an OpenAI
/// frontend and vice versa); local chat servers accept any name.
///
/// # Errors
/// `ModelNotSupported`.
pub fn check_model(frontend: HarnessFrontend, model: Option<&str>) -> Result<()> {
    let Some(model) = model else { return Ok(()) };
    let m = model.to_ascii_lowercase();
    let openai_like = ["gpt-", "o1", "o3", "o4", "codex-", "chatgpt"]
        .iter()
        .any(|p| m.starts_with(p));
    let bad = match frontend {
        HarnessFrontend::OpenaiChat | HarnessFrontend::PiSdk => false,
        f if f.provider() == ProviderDomain::Anthropic => openai_like || model.trim().is_empty(),
        _ => m.starts_with("claude") || model.trim().is_empty(),
    };
    if bad {
        return Err(HarnessError::ModelNotSupported(format!(
            "model {model:?} is not served by {} (provider {})",
            frontend.as_str(),
            frontend.provider().as_str()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use metash_protocol::HarnessErrorCode;

    #[test]
    fn every_frontend_is_typed_as_the_seed_says() {
        assert_eq!(
            HarnessFrontend::AgentSdk.provider(),
            ProviderDomain::Anthropic
        );
        assert_eq!(
            HarnessFrontend::ClaudeCode.provider(),
            ProviderDomain::Anthropic
        );
        assert_eq!(HarnessFrontend::PiSdk.provider(), ProviderDomain::Openai);
        assert_eq!(HarnessFrontend::CodexCli.provider(), ProviderDomain::Openai);
    }

    #[test]
    fn mismatch_is_refused_with_a_stable_code() {
        let c = HarnessContinuationRef {
            provider: ProviderDomain::Openai,
            key: Some("t".into()),
        };
        let err = check_continuation(HarnessFrontend::ClaudeCode, Some(&c)).err();
        assert_eq!(
            err.map(|e| e.code()),
            Some(HarnessErrorCode::ProviderMismatch)
        );
        assert!(check_continuation(HarnessFrontend::CodexCli, Some(&c)).is_ok());
        let json = serde_json::to_string(&HarnessErrorCode::ProviderMismatch).ok();
        assert_eq!(json.as_deref(), Some("\"provider_mismatch\""));
        for code in [
            HarnessErrorCode::ContinuationNotFound,
            HarnessErrorCode::ModelNotSupported,
            HarnessErrorCode::UnsupportedFrontend,
        ] {
            let json = serde_json::to_string(&code).unwrap_or_default();
            assert_eq!(json, format!("\"{}\"", code.as_str()));
        }
    }

    #[test]
    fn capabilities_list_both_providers() {
        let caps = get_harness_capabilities(&Programs::default());
        assert_eq!(caps.providers.len(), 2);
        let anthropic = &caps.providers[0];
        assert!(anthropic
            .frontends
            .iter()
            .all(|f| f.frontend.provider() == ProviderDomain::Anthropic));
        let cc = anthropic
            .frontends
            .iter()
            .find(|f| f.frontend == HarnessFrontend::ClaudeCode);
        assert_eq!(cc.map(|f| f.installed), Some(false));
    }

    #[test]
    fn models_of_the_other_provider_are_refused() {
        assert!(check_model(HarnessFrontend::ClaudeCode, Some("gpt-5")).is_err());
        assert!(check_model(HarnessFrontend::CodexCli, Some("claude-sonnet-4-5")).is_err());
        assert!(check_model(HarnessFrontend::OpenaiChat, Some("llama3")).is_ok());
    }
}
