//! The MCP proof with the real Claude Code CLI: `metash mcp` is registered with `--mcp-config`,
//! Claude talks to a loopback Anthropic server that answers its first request with a `tool_use`
//! of `mcp__metash__spawn_agent`; the host runs the sub-agent (a model-backed role against the
//! same loopback server), and the next request Claude sends carries the sub-agent's response in
//! its `tool_result`. Skips with a printed reason when the CLI or the `metash` binary is missing.
//! NETWORK RULE: Claude and the sub-agent reach only the loopback server this test starts.

use metash_harness::RunTurnNonInteractiveRequest;
use metash_harness::{CancellationToken, Endpoint, Harness, Program, Programs};
use metash_protocol::HarnessFrontend;
use serde_json::{json, Value};

use super::support::*;

const ORCHESTRATOR_PROMPT: &str = "ORCH-PROMPT: delegate the greeting to a sub-agent.";
const SUB_TASK: &str = "SUBAGENT-TASK-42: say hello";
const SUB_ANSWER: &str = "SUB-AGENT-SAYS-HELLO";
const FINAL: &str = "ORCHESTRATOR-DONE";

/// Claude's request to the model that answers with the tool call, and the one after it.
fn is_tool_result_request(body: &str) -> bool {
    body.contains("\"tool_result\"")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_orchestrates_through_metash_mcp() {
    let programs = Programs::in_tools_dir(&tools_dir());
    if programs.get(Program::Claude).is_none() {
        metash_testkit::skip(
            "claude_code_orchestrates_through_metash_mcp",
            &format!(
                "Claude Code is not installed under {} (run scripts/setup)",
                tools_dir().display()
            ),
        );
        return;
    }
    let Some(metash) = metash_bin() else {
        metash_testkit::skip(
            "claude_code_orchestrates_through_metash_mcp",
            "the metash binary is not built next to this test (cargo build -p metash, or set METASH_BIN)",
        );
        return;
    };

    let model = ModelServer::start(|c| {
        let body = c.text();
        if is_tool_result_request(&body) {
            sse_text(FINAL)
        } else if body.contains("mcp__metash__spawn_agent") && body.contains("ORCH-PROMPT") {
            sse_tool_use(
                "toolu_metash_1",
                "mcp__metash__spawn_agent",
                &json!({"agent_name": "helper", "system_prompt": "You are the helper.",
                        "user_message": SUB_TASK, "options": {"timeout_seconds": 60}}),
            )
        } else if body.contains("SUBAGENT-TASK-42") {
            sse_text(SUB_ANSWER)
        } else {
            // Claude's side requests (titles, summaries): anything short.
            sse_text("ok")
        }
    });
    let project = Project::new();
    project.model_role("helper", &model.base);
    let root = tempfile::tempdir().unwrap();

    let mut req = RunTurnNonInteractiveRequest::new(
        HarnessFrontend::AgentSdk,
        root.path().join("asp"),
        project.path(),
        ORCHESTRATOR_PROMPT,
    );
    req.cp_session_id = "cp-mcp-proof".into();
    req.model = Some("claude-sonnet-4-5".into());
    req.timeout_ms = Some(240_000);
    req.options.isolated_home = true;
    req.options.skip_permissions = true;
    req.options.max_turns = Some(4);
    req.options.endpoint = Some(Endpoint {
        base_url: model.base.clone(),
        api_key_env: None,
        provider_name: None,
    });
    req.env
        .insert("ANTHROPIC_API_KEY".into(), "sk-ant-test-loopback".into());
    req.options.mcp_servers = Some(json!({
        "metash": {
            "command": metash.to_string_lossy(),
            "args": ["-C", project.path().to_string_lossy(), "mcp", "--quiet"],
            "env": {"METASH_TEST_KEY": "sk-test-loopback"}
        }
    }));
    let harness = Harness::new(programs).unwrap();
    let mut events = Vec::new();
    let resp = harness
        .run_turn_non_interactive(&req, &CancellationToken::new(), &mut |e| events.push(e))
        .await
        .unwrap();

    let posts = model.posts();
    let summary: Vec<String> = posts
        .iter()
        .map(|c| {
            let b = c.text();
            format!(
                "{} bytes, tool_result={}, spawn tool={}, sub task={}",
                b.len(),
                is_tool_result_request(&b),
                b.contains("mcp__metash__spawn_agent"),
                b.contains("SUBAGENT-TASK-42")
            )
        })
        .collect();
    assert!(
        resp.result.success,
        "Claude's turn failed: {:?}\nmodel requests: {summary:#?}",
        resp.result
    );

    // The sub-agent ran in the host: its spawn is in the store's log.
    let log = project.log();
    let spawn_end = log
        .iter()
        .find(|r| r["kind"] == "spawn_end" && r["agent"] == "helper")
        .unwrap_or_else(|| panic!("no spawn_end of helper in the log; requests: {summary:#?}"));
    assert_eq!(spawn_end["data"]["status"], "success", "{spawn_end}");
    assert!(log
        .iter()
        .any(|r| r["kind"] == "spawn" && r["agent"] == "helper"));

    // It got its own fresh conversation: the sub task only, with its system prompt.
    let sub: Vec<Value> = posts
        .iter()
        .map(Captured::json)
        .filter(|b| {
            !b.to_string().contains("mcp__metash") && b.to_string().contains("SUBAGENT-TASK-42")
        })
        .collect();
    assert_eq!(sub.len(), 1, "one sub-agent request: {summary:#?}");
    assert_eq!(
        sub[0]["messages"].as_array().unwrap().len(),
        1,
        "{}",
        sub[0]
    );
    assert!(
        !sub[0].to_string().contains("ORCH-PROMPT"),
        "the sub-agent saw the orchestrator's history"
    );
    assert!(sub[0]["system"].to_string().contains("You are the helper."));

    // Its response came back to the model as the tool_result of the tool call.
    let follow_up = posts
        .iter()
        .map(Captured::json)
        .find(|b| is_tool_result_request(&b.to_string()))
        .unwrap_or_else(|| panic!("Claude sent no tool_result; requests: {summary:#?}"));
    let results: Vec<&Value> = follow_up["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["content"].as_array())
        .flatten()
        .filter(|b| b["type"] == "tool_result" && b["tool_use_id"] == "toolu_metash_1")
        .collect();
    assert_eq!(results.len(), 1, "{follow_up}");
    let text = results[0]["content"].to_string();
    assert!(
        text.contains(SUB_ANSWER),
        "the tool_result lacks the sub-agent's answer: {text}"
    );
    assert!(text.contains("success"), "{text}");
    assert_ne!(results[0]["is_error"], json!(true), "{text}");
    assert_eq!(resp.result.final_output.as_deref(), Some(FINAL));
    // Claude ended the MCP server it started.
    let needle = format!("{} mcp", project.path().display());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !live_processes(&needle).is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(
        live_processes(&needle).is_empty(),
        "`metash mcp` outlived Claude"
    );
    eprintln!("model requests: {summary:#?}\ntool_result: {text}");
}
