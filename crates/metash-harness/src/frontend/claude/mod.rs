//! Claude Code: `claude-code` (the CLI) and `agent-sdk` (the same program driven headless in
//! stream-json mode, as the Agent SDK itself does). Both keep their sessions in one state
//! directory, so a key from one resumes in the other. Flags and resume rules: HARNESSES.md.

mod invocation;
mod stream;

use metash_protocol::{FrontendKind, HarnessFrontend};

pub use invocation::{claude_project_dir, claude_session_file};

use super::process::{state_home, ProcessFrontend};
use super::{FrontendInfo, KeyHeader};
use crate::error::Result;
use crate::programs::Program;
use crate::request::Materialized;
use crate::request::RunTurnNonInteractiveRequest;

const STATE_DIR: &str = "claude";

const fn info(id: HarnessFrontend, kind: FrontendKind) -> FrontendInfo {
    FrontendInfo {
        id,
        kind,
        program: Some(Program::Claude),
        state_dir: STATE_DIR,
        upstream: "https://api.anthropic.com",
        base_url_env: "ANTHROPIC_BASE_URL",
        key_env: "ANTHROPIC_API_KEY",
        // The SDK mode is what metash drives with a key; the CLI may use the user's login.
        role_key_env: match kind {
            FrontendKind::Sdk => Some("ANTHROPIC_API_KEY"),
            _ => None,
        },
        fixed_key_env: Some("ANTHROPIC_API_KEY"),
        key_header: KeyHeader::XApiKey,
        default_model: None,
        any_model: false,
        permission_prompt: true,
    }
}

const fn claude(id: HarnessFrontend, kind: FrontendKind) -> ProcessFrontend {
    ProcessFrontend {
        info: info(id, kind),
        materialize: invocation::materialize,
        argv: invocation::argv,
        check_resumable,
        parser: || Box::<stream::ClaudeParser>::default(),
    }
}

pub static AGENT_SDK: ProcessFrontend = claude(HarnessFrontend::AgentSdk, FrontendKind::Sdk);
pub static CLAUDE_CODE: ProcessFrontend = claude(HarnessFrontend::ClaudeCode, FrontendKind::Cli);

/// Claude resumes a session only from the cwd it was started in.
fn check_resumable(req: &RunTurnNonInteractiveRequest, m: &Materialized, key: &str) -> Result<()> {
    let config = state_home(req, m, "CLAUDE_CONFIG_DIR", ".claude")?;
    stream::check_resumable(&config, &req.cwd, key)
}
