//! The three coding CLIs as a loopback model sees them: which wire protocol each speaks, how a
//! conversation's tool results are counted, and how to ask each for a shell command. Tests script
//! multi-step tool use with this, one answer per request.

use serde_json::json;

use crate::anthropic::{sse_text, sse_tool_use};
use crate::openai;

/// The three coding CLIs, each speaking its provider's wire protocol to the loopback model.
#[derive(Debug, Clone, Copy)]
pub enum Cli {
    Claude,
    Codex,
    Pi,
}

impl Cli {
    pub fn name(self) -> &'static str {
        match self {
            Cli::Claude => "Claude Code",
            Cli::Codex => "Codex",
            Cli::Pi => "pi",
        }
    }

    /// The `.tools` directory when this CLI is installed there (by scripts/setup).
    pub fn tools(self) -> Option<std::path::PathBuf> {
        let tools = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.tools");
        let marker = match self {
            Cli::Claude => "node_modules/@anthropic-ai/claude-code/bin/claude.exe",
            Cli::Codex => "node_modules/@openai/codex/bin/codex.js",
            Cli::Pi => "node_modules/@mariozechner/pi-coding-agent/dist/cli.js",
        };
        tools
            .join(marker)
            .exists()
            .then(|| tools.canonicalize().expect("tools"))
    }

    /// A `[roles.NAME]` table for this CLI against `base`, its key in METASH_TEST_CLI_KEY.
    pub fn role(self, name: &str, base: &str) -> String {
        let (frontend, model, url) = match self {
            Cli::Claude => ("agent-sdk", "claude-sonnet-4-5", base.to_string()),
            Cli::Codex => ("codex-cli", "gpt-5.1-codex", format!("{base}/v1")),
            Cli::Pi => ("pi-sdk", "test-model", format!("{base}/v1")),
        };
        format!(
            "[roles.{name}]\nfrontend = \"{frontend}\"\nmodel_smart = \"{model}\"\n\
             base_url = \"{url}\"\napi_key_env = \"METASH_TEST_CLI_KEY\"\n"
        )
    }

    /// How many tool results the conversation in `body` already carries.
    pub fn results(self, body: &str) -> usize {
        let v: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
        let items = match self {
            Cli::Claude => v["messages"].as_array(),
            Cli::Codex => v["input"].as_array(),
            Cli::Pi => v["messages"].as_array(),
        };
        items
            .into_iter()
            .flatten()
            .map(|m| match self {
                Cli::Claude => m["content"]
                    .as_array()
                    .map(|c| c.iter().filter(|b| b["type"] == "tool_result").count())
                    .unwrap_or(0),
                Cli::Codex => usize::from(m["type"] == "function_call_output"),
                Cli::Pi => usize::from(m["role"] == "tool"),
            })
            .sum()
    }

    /// A streamed answer that runs `cmd` in the CLI's shell tool.
    pub fn shell(self, id: usize, body: &str, cmd: &str) -> String {
        let v: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
        let offered = openai::offered_tools(&v);
        let has = |n: &str| offered.iter().any(|t| t == n);
        match self {
            Cli::Claude => sse_tool_use(
                &format!("toolu_{id}"),
                "Bash",
                &json!({"command": cmd, "description": "run"}),
            ),
            Cli::Codex => {
                let (name, args) = if has("shell_command") {
                    ("shell_command", json!({"command": cmd}))
                } else if has("exec_command") {
                    ("exec_command", json!({"cmd": cmd}))
                } else {
                    ("shell", json!({"command": ["bash", "-c", cmd]}))
                };
                openai::responses_function_call(&format!("call_{id}"), name, &args.to_string())
            }
            Cli::Pi => openai::chat_tool_call(
                &format!("call_{id}"),
                "bash",
                &json!({"command": cmd}).to_string(),
            ),
        }
    }

    pub fn text(self, text: &str) -> String {
        match self {
            Cli::Claude => sse_text(text),
            Cli::Codex => openai::responses_text(text),
            Cli::Pi => openai::chat_text(text),
        }
    }
}

fn task_of(body: &str) -> Option<&'static str> {
    ["a", "b", "c"]
        .into_iter()
        .find(|t| body.contains(&format!("Task {t}: Write {t}.txt")))
}

impl Cli {
    /// A whole run scripted for this CLI as planner, executor and verifier: the planner plans
    /// `a`, `b` and `c` (after both) in phase 1 and nothing after; each executor writes
    /// `<task>.txt` and runs git with one shell call, tries `.meta/` from its worktree with a
    /// second, then reports; the verifier passes.
    pub fn scripted_run(self, body: &str) -> String {
        let cli = self;
        if body.contains("You are the planner") {
            let plan = if body.contains("Current State: Phase 1 ") {
                r#"{"tasks": [{"id": "a", "title": "Write a.txt", "dependencies": []}, {"id": "b", "title": "Write b.txt", "dependencies": []}, {"id": "c", "title": "Write c.txt", "dependencies": ["a", "b"]}]}"#
            } else {
                r#"{"tasks": [], "done": true}"#
            };
            return cli.text(plan);
        }
        if body.contains("You are the verifier") {
            return cli.text(r#"{"pass": true, "findings": []}"#);
        }
        let Some(task) = task_of(body) else {
            return cli.text("ok");
        };
        let steps = [
            format!("echo {task}-from-{} > {task}.txt && git status --short && echo GIT-OK", cli.name().replace(' ', "-")),
            "cat ../../events.jsonl 2>&1 | head -c 200; ls ../.. 2>&1 | head -c 200; echo x > ../../planted 2>&1".to_string(),
        ];
        let done = cli.results(body);
        match steps.get(done) {
            Some(cmd) => cli.shell(done, body, cmd),
            None => cli.text(&format!("wrote {task}.txt")),
        }
    }
}
