//! The three coding CLIs as a loopback model sees them: which wire protocol each speaks, how a
//! conversation's tool results are counted, and how to ask each for a shell command. Tests script
//! multi-step tool use with this, one answer per request.

use serde_json::json;

use crate::anthropic::{sse_text, sse_tool_use_with};
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

    /// The `.tools` directory when this CLI is installed there (by scripts/setup), or the
    /// directory `METASH_TEST_CLI_TOOLS` names: `scripts/test-newest-clis` installs the newest
    /// releases there, laid out the same way, so the same tests run against both.
    pub fn tools(self) -> Option<std::path::PathBuf> {
        let tools = match std::env::var_os("METASH_TEST_CLI_TOOLS") {
            Some(dir) => std::path::PathBuf::from(dir),
            None => std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.tools"),
        };
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

    /// [`Cli::tools`], or a skip (a failure under CI) saying the CLI is not installed.
    pub fn installed(self, test: &str) -> Option<std::path::PathBuf> {
        let tools = self.tools();
        if tools.is_none() {
            crate::skip(
                test,
                &format!(
                    "{} is not installed under .tools (run scripts/setup)",
                    self.name()
                ),
            );
        }
        tools
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
        self.shell_with_usage(id, body, cmd, 20)
    }

    /// [`Cli::shell`] reporting `output_tokens` of usage for the answer.
    pub fn shell_with_usage(self, id: usize, body: &str, cmd: &str, output_tokens: u64) -> String {
        let v: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
        let offered = openai::offered_tools(&v);
        let has = |n: &str| offered.iter().any(|t| t == n);
        match self {
            Cli::Claude => sse_tool_use_with(
                &format!("toolu_{id}"),
                "Bash",
                &json!({"command": cmd, "description": "run"}),
                output_tokens,
            ),
            Cli::Codex => {
                let (name, args) = if has("shell_command") {
                    ("shell_command", json!({"command": cmd}))
                } else if has("exec_command") {
                    ("exec_command", json!({"cmd": cmd}))
                } else {
                    ("shell", json!({"command": ["bash", "-c", cmd]}))
                };
                openai::responses_function_call_with(
                    &format!("call_{id}"),
                    name,
                    &args.to_string(),
                    output_tokens,
                )
            }
            Cli::Pi => openai::chat_tool_call_with(
                &format!("call_{id}"),
                "bash",
                &json!({"command": cmd}).to_string(),
                output_tokens,
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

const TASKS: [&str; 3] = ["a", "b", "c"];

fn task_of(body: &str) -> Option<usize> {
    TASKS
        .iter()
        .position(|t| body.contains(&format!("Task {t}: Write {t}.txt")))
}

/// What an executor in a task worktree (`.meta/worktrees/<id>`, so `../..` is `.meta/`) tries
/// against metash's state after its work, one shell call each: (name, command). Every one must
/// fail. The last looks for a real key (`sk-real…`) in every process's environment and command
/// line it can read (the pattern is written so it does not match itself).
pub const META_PROBES: &[(&str, &str)] = &[
    ("list", "ls -A ../.. 2>&1 | head -c 150"),
    ("read_log", "cat ../../events.jsonl 2>&1 | head -c 150"),
    ("write_consent", "echo '{}' > ../../consent.json 2>&1"),
    ("plant_cache", "echo x > ../../cache/wasm/planted.cwasm 2>&1"),
    // In TMPDIR (the spawn's own), so nothing is left in the worktree to commit.
    ("symlink", "ln -s \"$PWD/../../session.json\" \"$TMPDIR/link.json\"; cat \"$TMPDIR/link.json\" 2>&1 | head -c 150"),
    ("hardlink", "ln \"$PWD/../../session.json\" \"$TMPDIR/hard.json\" 2>&1"),
    ("git_read", "git --work-tree=../.. status --short 2>&1 | head -c 150"),
    ("git_change", "git -C ../.. add -A 2>&1 | head -c 150"),
    ("key", "cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' '\\n' | grep -c 'sk-rea[l]'"),
];

/// Which scripted step a tool's output comes from: (task index, step, the rest of the output),
/// step 0 being the work and `k` the `META_PROBES[k - 1]`. Each scripted command first prints
/// `@TASK.STEP@` (CLIs number their tool calls their own way, so the id cannot tell).
pub fn scripted_step(output: &str) -> Option<(usize, usize, &str)> {
    let rest = output.split_once('@')?.1;
    let (mark, rest) = rest.split_once('@')?;
    let (t, s) = mark.split_once('.')?;
    Some((t.parse().ok()?, s.parse().ok()?, rest))
}

impl Cli {
    /// A whole run scripted for this CLI as planner, executor and verifier: the planner plans
    /// `a`, `b` and `c` (after both) in phase 1 and nothing after; each executor writes
    /// `<task>.txt` and runs git with one shell call, tries each of [`META_PROBES`], then
    /// reports; the verifier passes. Each command's output says its task and step
    /// ([`scripted_step`]).
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
        let Some(index) = task_of(body) else {
            return cli.text("ok");
        };
        let task = TASKS[index];
        let work = format!(
            "echo {task}-from-{} > {task}.txt && git status --short && echo GIT-OK",
            cli.name().replace(' ', "-")
        );
        let done = cli.results(body);
        let cmd = match done {
            0 => Some(work),
            k => META_PROBES.get(k - 1).map(|(_, c)| c.to_string()),
        };
        match cmd {
            Some(cmd) => cli.shell(
                index * 100 + done,
                body,
                // One stream: a CLI may read stdout and stderr apart and lose the order (or the
                // tail of one) when a command ends at once.
                &format!("{{ echo '@{index}.{done}@'; {cmd}; }} 2>&1"),
            ),
            None => cli.text(&format!("wrote {task}.txt")),
        }
    }
}
