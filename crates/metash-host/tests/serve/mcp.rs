//! MCP: the handshake, the tool list with input schemas, each tool called, and bad arguments,
//! spoken as raw JSON lines over an in-process pipe (what a client such as Claude Code sends).

use std::time::Duration;

use metash_host::serve::mcp::McpServer;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, DuplexStream, Lines};

use super::support::*;

struct McpClient {
    to_server: DuplexStream,
    lines: Lines<BufReader<DuplexStream>>,
    next_id: u64,
}

impl McpClient {
    async fn send(&mut self, msg: Value) {
        let mut line = msg.to_string();
        line.push('\n');
        self.to_server.write_all(line.as_bytes()).await.unwrap();
    }

    async fn request(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await;
        loop {
            let line = tokio::time::timeout(Duration::from_secs(60), self.lines.next_line())
                .await
                .expect("a reply in time")
                .unwrap()
                .expect("the server is still there");
            let msg: Value = serde_json::from_str(&line).unwrap();
            if msg["id"] == json!(id) {
                return msg;
            }
        }
    }

    async fn call_tool(&mut self, name: &str, arguments: Value) -> Value {
        let r = self
            .request("tools/call", json!({"name": name, "arguments": arguments}))
            .await;
        assert!(r.get("error").is_none(), "{name}: {r}");
        r["result"].clone()
    }
}

fn text(result: &Value) -> &str {
    result["content"][0]["text"].as_str().unwrap()
}

#[tokio::test]
async fn mcp_lists_tools_with_schemas_and_serves_them() {
    let p = Project::new();
    let (spawner, release) = FakeSpawner::new();
    let (client_w, server_r) = tokio::io::duplex(1 << 16);
    let (server_w, client_r) = tokio::io::duplex(1 << 16);
    let server = McpServer::new(p.host(), spawner);
    let served = tokio::spawn(async move {
        use rmcp::ServiceExt;
        let running = server.serve((server_r, server_w)).await.unwrap();
        running.waiting().await.unwrap();
    });
    let mut c = McpClient {
        to_server: client_w,
        lines: BufReader::new(client_r).lines(),
        next_id: 0,
    };

    let init = c
        .request(
            "initialize",
            json!({"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "test", "version": "0"}}),
        )
        .await;
    assert_eq!(init["result"]["serverInfo"]["name"], "metash", "{init}");
    assert!(
        init["result"]["capabilities"]["tools"].is_object(),
        "{init}"
    );
    c.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        .await;

    let list = c.request("tools/list", json!({})).await;
    let tools = list["result"]["tools"].as_array().unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
    for want in ["spawn_agent", "update_state", "get_state", "log_progress"] {
        assert!(names.contains(&want), "{names:?}");
    }
    let spawn = tools.iter().find(|t| t["name"] == "spawn_agent").unwrap();
    let schema = &spawn["inputSchema"];
    assert_eq!(schema["type"], "object", "{schema}");
    let mut required: Vec<&str> = schema["required"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    required.sort_unstable();
    assert_eq!(required, ["agent_name", "user_message"], "{schema}");
    for prop in ["agent_name", "system_prompt", "user_message", "options"] {
        assert!(schema["properties"][prop].is_object(), "{prop}: {schema}");
    }
    let update = tools.iter().find(|t| t["name"] == "update_state").unwrap();
    assert!(update["inputSchema"]["properties"]["key"].is_object());
    assert!(update["description"]
        .as_str()
        .unwrap()
        .contains("Atomically"));

    // Each tool, its result as text content.
    let r = c
        .call_tool(
            "update_state",
            json!({"key": "variables.via_mcp", "value": {"ok": true}}),
        )
        .await;
    assert_eq!(r["isError"], false, "{r}");
    assert!(text(&r).contains("\"revision\""));
    let r = c
        .call_tool("get_state", json!({"key": "variables.via_mcp"}))
        .await;
    assert_eq!(text(&r), r#"{"ok":true}"#);
    let r = c
        .call_tool(
            "log_progress",
            json!({"message": "from mcp", "level": "info"}),
        )
        .await;
    assert_eq!(r["isError"], false, "{r}");
    let r = c
        .call_tool(
            "spawn_agent",
            json!({"agent_name": "echo", "system_prompt": "S", "user_message": "U"}),
        )
        .await;
    assert_eq!(r["isError"], false, "{r}");
    let resp: Value = serde_json::from_str(text(&r)).unwrap();
    assert_eq!(resp["status"], "success");
    assert_eq!(resp["data"], "S|U|None");

    // A host error is a tool result the model can read; bad arguments are refused by name.
    let r = c
        .call_tool(
            "spawn_agent",
            json!({"agent_name": "ghost", "user_message": "U"}),
        )
        .await;
    assert_eq!(r["isError"], true, "{r}");
    assert!(text(&r).contains("unknown agent `ghost`"), "{r}");
    let r = c
        .request(
            "tools/call",
            json!({"name": "spawn_agent", "arguments": {"agent_name": "echo", "user_message": 3}}),
        )
        .await;
    let msg = r["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string()
        + r["result"]["content"][0]["text"]
            .as_str()
            .unwrap_or_default();
    assert!(msg.contains("`user_message` must be a string"), "{r}");
    let r = c
        .request(
            "tools/call",
            json!({"name": "no_such_tool", "arguments": {}}),
        )
        .await;
    assert!(
        r.get("error").is_some() || r["result"]["isError"] == true,
        "{r}"
    );
    // Still serving.
    let r = c
        .call_tool("get_state", json!({"key": "variables.via_mcp"}))
        .await;
    assert_eq!(text(&r), r#"{"ok":true}"#);

    // A long spawn does not hold up other tool calls.
    c.send(json!({"jsonrpc": "2.0", "id": 100, "method": "tools/call",
                  "params": {"name": "spawn_agent", "arguments": {"agent_name": "slow", "user_message": "wait"}}}))
        .await;
    let r = c
        .call_tool("get_state", json!({"key": "variables.via_mcp"}))
        .await;
    assert_eq!(text(&r), r#"{"ok":true}"#);
    release.send(()).unwrap();
    loop {
        let line = c.lines.next_line().await.unwrap().unwrap();
        let msg: Value = serde_json::from_str(&line).unwrap();
        if msg["id"] == 100 {
            assert!(text(&msg["result"]).contains("slow done"), "{msg}");
            break;
        }
    }

    // The writes went through the host: in the log like any other.
    let log = p.log();
    assert!(log
        .iter()
        .any(|r| r["kind"] == "progress" && r["data"]["message"] == "from mcp"));
    drop(c);
    tokio::time::timeout(Duration::from_secs(10), served)
        .await
        .expect("the server stops when the client goes")
        .unwrap();
}

/// A server for `host` on an in-process pipe, past the handshake.
async fn connected(host: std::sync::Arc<metash_host::Host>) -> McpClient {
    let (spawner, _release) = FakeSpawner::new();
    let (client_w, server_r) = tokio::io::duplex(1 << 16);
    let (server_w, client_r) = tokio::io::duplex(1 << 16);
    let server = McpServer::new(host, spawner);
    tokio::spawn(async move {
        use rmcp::ServiceExt;
        let running = server.serve((server_r, server_w)).await.unwrap();
        let _ = running.waiting().await;
    });
    let mut c = McpClient {
        to_server: client_w,
        lines: BufReader::new(client_r).lines(),
        next_id: 0,
    };
    c.request(
        "initialize",
        json!({"protocolVersion": "2025-06-18", "capabilities": {},
               "clientInfo": {"name": "test", "version": "0"}}),
    )
    .await;
    c.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        .await;
    c
}

/// What reaches the model through MCP is redacted like every other output: token shapes and
/// the value of the key variable a role names, in results and in error results alike.
#[tokio::test]
async fn mcp_results_are_redacted() {
    let p = Project::new();
    p.model_role("writer", "http://127.0.0.1:9");
    let plain = "plainvalue-no-shape-5678";
    let host = p.host_with_env(&[("METASH_TEST_KEY", plain)]);
    let planted = format!("sk-ant-api03-PLANTEDsecret0002 and {plain}");
    host.update_state(None, "variables.note", json!(planted))
        .unwrap();
    let mut c = connected(host).await;
    let got = c
        .call_tool("get_state", json!({"key": "variables.note"}))
        .await;
    let shown = text(&got);
    assert!(
        !shown.contains("PLANTEDsecret0002") && !shown.contains(plain),
        "{shown}"
    );
    assert_eq!(shown.matches("[REDACTED:").count(), 2, "{shown}");
    let refused = c
        .call_tool("update_state", json!({"key": "status", "value": planted}))
        .await;
    assert_eq!(refused["isError"], true, "{refused}");
    let shown = text(&refused);
    assert!(
        !shown.contains("PLANTEDsecret0002") && !shown.contains(plain),
        "{shown}"
    );
}
