//! One seam for every way metash drives a model: a [`Frontend`] per harness frontend, each in one
//! module holding everything that differs between them (provider, program, defaults,
//! materialization, argv, resume checks, stream parsing, usage). The rest of the harness, the host
//! and the CLI ask the trait; none of them matches on the frontend to learn a fact about it.
//!
//! Adding a frontend: its wire name in `metash_protocol::HarnessFrontend` (the seed's closed set),
//! one module here implementing [`Frontend`], one line in [`Registry::builtin`]. A test adds one
//! in a single file (`tests/suite/test_frontend.rs`) with [`Registry::with`].

mod api;
pub(crate) mod api_turn;
pub mod claude;
pub mod codex;
pub mod pi;
pub mod process;
pub mod registry;
pub mod spec;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use metash_protocol::{FrontendKind, HarnessFrontend, ProviderDomain, RunResult};
use tokio_util::sync::CancellationToken;

use crate::api::RetryPolicy;
use crate::error::{HarnessError, Result};
use crate::events::Emitter;
use crate::programs::{Program, Programs};
use crate::request::RunTurnNonInteractiveRequest;
use crate::request::{BuildProcessInvocationSpecRequest, Materialized};
use crate::runner::PipedOutcome;

pub use process::{run_process_turn, ProcessFrontend};
pub use registry::Registry;

/// How a frontend's model key travels in an HTTP request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyHeader {
    /// `x-api-key: KEY` (Anthropic).
    XApiKey,
    /// `Authorization: Bearer KEY` (OpenAI and compatible servers).
    Bearer,
}

/// The facts about a frontend that callers need without running it. One `const` per module.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrontendInfo {
    pub id: HarnessFrontend,
    pub kind: FrontendKind,
    /// The program it spawns; `None` for metash's own API clients.
    pub program: Option<Program>,
    /// Its state directory under `aspHome`. Frontends sharing one resume each other's keys.
    pub state_dir: &'static str,
    /// The provider's endpoint, as this frontend's base URL expects it (Anthropic without `/v1`).
    pub upstream: &'static str,
    /// Where the base URL is read from by the program (and written by `metash sandbox`).
    pub base_url_env: &'static str,
    /// The variable the frontend reads its key from unless configured otherwise.
    pub key_env: &'static str,
    /// The variable a role of this frontend must have set unless it names one. `None`: the
    /// program may use its own login (Claude Code, Codex) or the server takes no key.
    pub role_key_env: Option<&'static str>,
    /// `Some`: the program reads its key only from this variable, whatever is configured.
    pub fixed_key_env: Option<&'static str>,
    pub key_header: KeyHeader,
    /// The model used when the request names none (API clients; the CLIs pick their own).
    pub default_model: Option<&'static str>,
    /// Any model name is passed through (local servers, pi's configurable providers).
    pub any_model: bool,
    /// Can ask metash before each tool use (`permissions = "ask"`): Claude Code's
    /// `--permission-prompt-tool`.
    pub permission_prompt: bool,
}

impl FrontendInfo {
    pub fn provider(&self) -> ProviderDomain {
        self.id.provider()
    }

    /// Whether it runs a coding CLI (a process, so a native agent under seed 002).
    pub fn runs_process(&self) -> bool {
        self.program.is_some()
    }
}

/// What one turn works with: the harness's programs and HTTP client, the request, its bounds.
/// `em` numbers the events and stamps the continuation.
pub struct Turn<'a, 'e> {
    pub programs: &'a Programs,
    pub http: &'a reqwest::Client,
    pub retry: RetryPolicy,
    /// Longest silence allowed inside a provider stream.
    pub idle_timeout: Duration,
    pub req: &'a RunTurnNonInteractiveRequest,
    pub timeout: Option<Duration>,
    pub cancel: &'a CancellationToken,
    pub em: &'a mut Emitter<'e>,
}

/// A turn in flight.
pub type TurnFuture<'a> = Pin<Box<dyn Future<Output = Result<RunResult>> + Send + 'a>>;

/// Reads a process frontend's output, one line at a time, into events and the turn's result.
pub trait TurnParser: Send {
    /// One JSON line of the program's stdout (other lines never reach the parser).
    fn line(&mut self, line: &serde_json::Value, em: &mut Emitter<'_>);
    /// The program has exited: the turn's result, failing when its output never finished.
    fn finish(self: Box<Self>, outcome: &PipedOutcome) -> RunResult;
}

/// A harness frontend. Process frontends implement `materialize`, `argv` and `parser` and keep
/// the default `run_turn`; API clients implement `run_turn`.
pub trait Frontend: Send + Sync {
    fn info(&self) -> &FrontendInfo;

    /// Writes what the program needs under `aspHome` (deterministic: same request, same bytes).
    ///
    /// # Errors
    /// `UnsupportedFrontend` for an API client; `Io` when a file cannot be written.
    fn materialize(&self, _req: &BuildProcessInvocationSpecRequest) -> Result<Materialized> {
        Err(not_a_process(self.info().id))
    }

    /// The program's argv for the request (writes nothing).
    ///
    /// # Errors
    /// `UnsupportedFrontend` for an API client; `ProgramNotFound`; `ContinuationNotFound`.
    fn argv(
        &self,
        _req: &BuildProcessInvocationSpecRequest,
        _materialized: &Materialized,
        _programs: &Programs,
        _warnings: &mut Vec<String>,
    ) -> Result<Vec<String>> {
        Err(not_a_process(self.info().id))
    }

    /// Before a resumed turn starts: refuse a key the program would not resume (rather than
    /// let it start a fresh conversation silently).
    ///
    /// # Errors
    /// `ContinuationNotFound`.
    fn check_resumable(
        &self,
        _req: &RunTurnNonInteractiveRequest,
        _materialized: &Materialized,
        _key: &str,
    ) -> Result<()> {
        Ok(())
    }

    /// A fresh parser for one turn's output; `None` for API clients.
    fn parser(&self) -> Option<Box<dyn TurnParser>> {
        None
    }

    /// Runs one turn. The default spawns the program (see [`run_process_turn`]).
    fn run_turn<'a>(&'a self, turn: Turn<'a, '_>) -> TurnFuture<'a> {
        Box::pin(run_process_turn(self, turn))
    }
}

/// A registry entry.
pub type FrontendRef = Arc<dyn Frontend>;

pub(crate) fn not_a_process(id: HarnessFrontend) -> HarnessError {
    HarnessError::UnsupportedFrontend(format!("{} is an API client, not a process", id.as_str()))
}

/// The registry: every built-in frontend, by its wire name. The match is exhaustive, so a new
/// `HarnessFrontend` does not compile until its module is listed here.
pub fn builtin(id: HarnessFrontend) -> &'static dyn Frontend {
    match id {
        HarnessFrontend::AgentSdk => &claude::AGENT_SDK,
        HarnessFrontend::ClaudeCode => &claude::CLAUDE_CODE,
        HarnessFrontend::CodexCli => &codex::CODEX_CLI,
        HarnessFrontend::PiSdk => &pi::PI_SDK,
        HarnessFrontend::AnthropicApi => &api::ANTHROPIC_API,
        HarnessFrontend::OpenaiResponses => &api::OPENAI_RESPONSES,
        HarnessFrontend::OpenaiChat => &api::OPENAI_CHAT,
    }
}

/// A built-in frontend's facts, for callers that need them without a [`Harness`] (the host's
/// role config, the credential proxy, `metash sandbox`).
pub fn info(id: HarnessFrontend) -> FrontendInfo {
    *builtin(id).info()
}
