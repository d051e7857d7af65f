//! The two ACP agents scripts/setup installs (`@zed-industries/claude-code-acp`, which wraps
//! Claude Code's SDK, and `@zed-industries/codex-acp`, which wraps Codex) as `frontend = "acp"`
//! roles against a loopback model. Each speaks its wrapped CLI's wire protocol to the model, so
//! tests script it with that CLI's [`Cli`] helpers.

use std::path::{Path, PathBuf};

use crate::cli::Cli;

/// An ACP agent installed under `.tools` by scripts/setup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcpAgent {
    ClaudeCode,
    Codex,
}

impl AcpAgent {
    pub const ALL: [AcpAgent; 2] = [AcpAgent::ClaudeCode, AcpAgent::Codex];

    /// The npm launcher's name (under `.tools/node_modules/.bin`).
    pub fn name(self) -> &'static str {
        match self {
            AcpAgent::ClaudeCode => "claude-code-acp",
            AcpAgent::Codex => "codex-acp",
        }
    }

    /// The CLI whose wire protocol the agent speaks to its model.
    pub fn wire(self) -> Cli {
        match self {
            AcpAgent::ClaudeCode => Cli::Claude,
            AcpAgent::Codex => Cli::Codex,
        }
    }

    /// The agent's launcher as an absolute path, when it is installed.
    pub fn bin(self) -> Option<PathBuf> {
        let bin = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../.tools/node_modules/.bin")
            .join(self.name());
        bin.exists().then(|| bin.canonicalize().expect("launcher"))
    }

    /// [`AcpAgent::bin`], or a skip (a failure under CI) saying the agent is not installed.
    pub fn installed(self, test: &str) -> Option<PathBuf> {
        let bin = self.bin();
        if bin.is_none() {
            crate::skip(
                test,
                &format!(
                    "@zed-industries/{} is not installed under .tools (run scripts/setup)",
                    self.name()
                ),
            );
        }
        bin
    }

    /// The agent's argv. codex-acp reads its endpoint only from its own `-c` configuration,
    /// so it is named there through `${METASH_MODEL_BASE_URL}` (docs/acp.md); Codex's own
    /// sandbox is off (metash's is the boundary) and its plain shell tool on.
    pub fn command(self, bin: &Path, base_url: &str) -> Vec<String> {
        let bin = bin.display().to_string();
        match self {
            AcpAgent::ClaudeCode => vec![bin],
            AcpAgent::Codex => [
                bin.as_str(),
                "-c",
                "model_provider=\"metash\"",
                "-c",
                &format!(
                    "model_providers.metash={{name=\"metash\", base_url=\"{base_url}\", \
                     env_key=\"OPENAI_API_KEY\", wire_api=\"responses\"}}"
                ),
                "-c",
                "model=\"gpt-5.1-codex\"",
                "-c",
                "approval_policy=\"never\"",
                "-c",
                "sandbox_mode=\"danger-full-access\"",
                "-c",
                "analytics.enabled=false",
                "-c",
                "check_for_update_on_startup=false",
                "-c",
                "features.unified_exec=false",
            ]
            .iter()
            .map(|a| a.to_string())
            .collect(),
        }
    }

    /// A `[roles.NAME]` table running this agent (at `bin`) against the loopback model at
    /// `base`, its key in METASH_TEST_CLI_KEY.
    pub fn role(self, name: &str, bin: &Path, base: &str) -> String {
        let command: Vec<String> = self
            .command(bin, "${METASH_MODEL_BASE_URL}")
            .iter()
            .map(|a| format!("{a:?}"))
            .collect();
        let (provider, model, url) = match self {
            AcpAgent::ClaudeCode => ("anthropic", "claude-sonnet-4-5", base.to_string()),
            AcpAgent::Codex => ("openai", "gpt-5.1-codex", format!("{base}/v1")),
        };
        format!(
            "[roles.{name}]\nfrontend = \"acp\"\nprovider = \"{provider}\"\ncommand = [{}]\n\
             model_smart = \"{model}\"\nbase_url = \"{url}\"\napi_key_env = \"METASH_TEST_CLI_KEY\"\n",
            command.join(", ")
        )
    }
}

/// `cmd` as one word for `bash -c`: Claude Code's Bash tool (inside claude-code-acp) rewrites a
/// piped command line, which breaks the `{ …; }` group every scripted command is wrapped in;
/// quoted, the line reaches bash as written.
fn quoted_for_bash(cmd: &str) -> String {
    format!("bash -c '{}' 2>&1", cmd.replace('\'', "'\\''"))
}

impl AcpAgent {
    /// [`Cli::scripted_run`] for the agent's wire: the same plan, work and
    /// [`crate::cli::META_PROBES`], each command run through `bash -c` for claude-code-acp
    /// ([`quoted_for_bash`]).
    pub fn scripted_run(self, body: &str) -> String {
        let cli = self.wire();
        let reply = cli.scripted_run(body);
        if self != AcpAgent::ClaudeCode {
            return reply;
        }
        // The reply is one SSE stream; its tool input's `command`, if any, is quoted anew.
        let Some(cmd) = tool_command(&reply) else {
            return reply;
        };
        let id = reply
            .split("\"id\":\"toolu_")
            .nth(1)
            .and_then(|r| r.split('"').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        cli.shell(id, body, &quoted_for_bash(&cmd))
    }
}

/// The `command` of the Bash tool use in a scripted Anthropic SSE reply.
fn tool_command(sse: &str) -> Option<String> {
    sse.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<serde_json::Value>(d).ok())
        .find_map(|v| {
            let partial = v["delta"]["partial_json"].as_str()?;
            let input: serde_json::Value = serde_json::from_str(partial).ok()?;
            input["command"].as_str().map(str::to_string)
        })
}
