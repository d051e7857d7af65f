//! metash's own API clients as frontends: `anthropic-api`, `openai-responses`, `openai-chat`.
//! Each speaks one wire ([`Wire`], its client in `crate::api`); the turn around it (transcript,
//! events) is shared in [`super::api_turn`].

use metash_protocol::{FrontendKind, HarnessFrontend};

use super::api_turn::{self, Wire};
use super::{Frontend, FrontendInfo, KeyHeader, Turn, TurnFuture};
use crate::api::{anthropic, chat, openai};

/// One API client.
pub struct ApiClient {
    info: FrontendInfo,
    wire: Wire,
}

const fn api(
    id: HarnessFrontend,
    upstream: &'static str,
    key_env: &'static str,
    role_key_env: Option<&'static str>,
    default_model: Option<&'static str>,
) -> FrontendInfo {
    let anthropic = matches!(id, HarnessFrontend::AnthropicApi);
    FrontendInfo {
        id,
        kind: FrontendKind::Api,
        program: None,
        state_dir: "api",
        upstream,
        base_url_env: if anthropic {
            "ANTHROPIC_BASE_URL"
        } else {
            "OPENAI_BASE_URL"
        },
        key_env,
        role_key_env,
        fixed_key_env: None,
        key_header: if anthropic {
            KeyHeader::XApiKey
        } else {
            KeyHeader::Bearer
        },
        default_model,
        // Local chat servers serve whatever model names they load.
        any_model: matches!(id, HarnessFrontend::OpenaiChat),
        permission_prompt: false,
    }
}

pub static ANTHROPIC_API: ApiClient = ApiClient {
    info: api(
        HarnessFrontend::AnthropicApi,
        anthropic::DEFAULT_BASE_URL,
        anthropic::DEFAULT_KEY_ENV,
        Some(anthropic::DEFAULT_KEY_ENV),
        Some("claude-sonnet-4-5"),
    ),
    wire: Wire::Anthropic,
};

pub static OPENAI_RESPONSES: ApiClient = ApiClient {
    info: api(
        HarnessFrontend::OpenaiResponses,
        openai::DEFAULT_BASE_URL,
        openai::DEFAULT_KEY_ENV,
        Some(openai::DEFAULT_KEY_ENV),
        Some("gpt-5.1"),
    ),
    wire: Wire::Responses,
};

/// Local OpenAI-compatible servers usually take no key, so a role needs none.
pub static OPENAI_CHAT: ApiClient = ApiClient {
    info: api(
        HarnessFrontend::OpenaiChat,
        chat::DEFAULT_BASE_URL,
        chat::DEFAULT_KEY_ENV,
        None,
        None,
    ),
    wire: Wire::Chat,
};

impl Frontend for ApiClient {
    fn info(&self) -> &FrontendInfo {
        &self.info
    }

    fn run_turn<'a>(&'a self, turn: Turn<'a, '_>) -> TurnFuture<'a> {
        Box::pin(api_turn::run(&self.info, self.wire, turn))
    }
}
