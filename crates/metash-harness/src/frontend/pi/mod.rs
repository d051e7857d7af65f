//! `pi-sdk`: pi-coding-agent in JSON mode, with its provider written into a `models.json` under
//! its agent directory. A resumed key is resolved to its session file when argv is built.

mod invocation;
mod stream;

use metash_protocol::{FrontendKind, HarnessFrontend};

pub use invocation::pi_session_file;

use super::process::{resumes_any, ProcessFrontend};
use super::{FrontendInfo, KeyHeader};
use crate::programs::Program;

pub const INFO: FrontendInfo = FrontendInfo {
    id: HarnessFrontend::PiSdk,
    kind: FrontendKind::Sdk,
    program: Some(Program::Pi),
    state_dir: "pi",
    upstream: "https://api.openai.com/v1",
    base_url_env: "OPENAI_BASE_URL",
    key_env: "OPENAI_API_KEY",
    role_key_env: Some("OPENAI_API_KEY"),
    fixed_key_env: None,
    key_header: KeyHeader::Bearer,
    default_model: None,
    // pi speaks to any OpenAI-compatible server; its models are whatever that serves.
    any_model: true,
    permission_prompt: false,
};

pub static PI_SDK: ProcessFrontend = ProcessFrontend {
    info: INFO,
    materialize: invocation::materialize,
    argv: invocation::argv,
    // pi's argv resolves a resumed key to its session file, or refuses it.
    check_resumable: resumes_any,
    parser: || Box::<stream::PiParser>::default(),
};
