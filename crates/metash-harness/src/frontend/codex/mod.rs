//! `codex-cli`: OpenAI's Codex CLI, run headless as `codex exec --json`, configured through
//! `-c` overrides and a `CODEX_HOME` under `aspHome`.

mod invocation;
mod signin;
mod stream;
mod toml;

use metash_protocol::{FrontendKind, HarnessFrontend};

pub use invocation::codex_rollout_file;

use super::process::{state_home, ProcessFrontend};
use super::{FrontendInfo, KeyHeader};
use crate::error::Result;
use crate::programs::Program;
use crate::request::Materialized;
use crate::request::RunTurnNonInteractiveRequest;

pub const INFO: FrontendInfo = FrontendInfo {
    id: HarnessFrontend::CodexCli,
    kind: FrontendKind::Cli,
    program: Some(Program::Codex),
    state_dir: "codex",
    upstream: "https://api.openai.com/v1",
    base_url_env: "OPENAI_BASE_URL",
    key_env: "OPENAI_API_KEY",
    // Codex may use the user's ChatGPT login.
    role_key_env: None,
    fixed_key_env: None,
    key_header: KeyHeader::Bearer,
    default_model: None,
    any_model: false,
    permission_prompt: false,
};

pub static CODEX_CLI: ProcessFrontend = ProcessFrontend {
    info: INFO,
    materialize: invocation::materialize,
    argv: invocation::argv,
    check_resumable,
    parser: || Box::<stream::CodexParser>::default(),
};

/// Codex resumes a thread recorded under this `CODEX_HOME` with the same provider definition.
fn check_resumable(req: &RunTurnNonInteractiveRequest, m: &Materialized, key: &str) -> Result<()> {
    let codex_home = state_home(req, m, "CODEX_HOME", ".codex")?;
    let expected = req
        .options
        .endpoint
        .as_ref()
        .map(|e| e.name().to_string())
        .unwrap_or_else(|| "openai".into());
    stream::check_resumable(&codex_home, key, &expected)
}
