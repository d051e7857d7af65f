//! Provider typing (seed 003 section 5.1), `getHarnessCapabilities()` and the [`Registry`] a
//! [`crate::Harness`] looks frontends up in: the built-ins, plus any a caller registers.

use std::sync::Arc;

use metash_protocol::{
    FrontendCapability, HarnessCapabilities, HarnessContinuationRef, HarnessFrontend,
    ProviderCapabilities, ProviderDomain,
};

use super::{builtin, Frontend, FrontendRef};
use crate::error::{HarnessError, Result};
use crate::programs::{program_version, Programs};

/// The frontends a [`crate::Harness`] runs: the built-ins unless one is replaced.
#[derive(Clone, Default)]
pub struct Registry {
    added: Vec<FrontendRef>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ids: Vec<_> = self.added.iter().map(|a| a.info().id.as_str()).collect();
        f.debug_struct("Registry").field("added", &ids).finish()
    }
}

impl Registry {
    /// The built-in frontends ([`builtin`]).
    pub fn builtin() -> Self {
        Self::default()
    }

    /// This registry with `frontend` serving its id (a later one wins).
    #[must_use]
    pub fn with(mut self, frontend: impl Frontend + 'static) -> Self {
        self.added.push(Arc::new(frontend));
        self
    }

    /// The frontend serving `id`.
    pub fn get(&self, id: HarnessFrontend) -> &dyn Frontend {
        match self.added.iter().rev().find(|f| f.info().id == id) {
            Some(f) => f.as_ref(),
            None => builtin(id),
        }
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
    Registry::builtin().capabilities(programs)
}

impl Registry {
    /// `getHarnessCapabilities()` for this registry.
    pub fn capabilities(&self, programs: &Programs) -> HarnessCapabilities {
        let providers = [ProviderDomain::Anthropic, ProviderDomain::Openai]
            .into_iter()
            .map(|provider| ProviderCapabilities {
                provider,
                frontends: HarnessFrontend::ALL
                    .into_iter()
                    .filter(|f| f.provider() == provider)
                    .map(|frontend| {
                        let info = self.get(frontend).info();
                        let path = info.program.and_then(|p| programs.get(p));
                        FrontendCapability {
                            frontend,
                            kind: info.kind,
                            installed: info.program.is_none() || path.is_some(),
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
    check_model_of(builtin(frontend).info(), model)
}

/// [`check_model`] for any frontend's facts.
///
/// # Errors
/// `ModelNotSupported`.
pub fn check_model_of(info: &super::FrontendInfo, model: Option<&str>) -> Result<()> {
    let Some(model) = model else { return Ok(()) };
    let m = model.to_ascii_lowercase();
    let openai_like = ["gpt-", "o1", "o3", "o4", "codex-", "chatgpt"]
        .iter()
        .any(|p| m.starts_with(p));
    let bad = match info.provider() {
        _ if info.any_model => false,
        ProviderDomain::Anthropic => openai_like || model.trim().is_empty(),
        ProviderDomain::Openai => m.starts_with("claude") || model.trim().is_empty(),
    };
    if bad {
        return Err(HarnessError::ModelNotSupported(format!(
            "model {model:?} is not served by {} (provider {})",
            info.id.as_str(),
            info.provider().as_str()
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
