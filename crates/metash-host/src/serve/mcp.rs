//! MCP over stdio with the official Rust SDK (`rmcp`), so an LLM harness such as Claude Code or
//! Codex can act as the orchestrator through metash: tools `spawn_agent`, `update_state`,
//! `get_state`, `log_progress`, `answer_checkpoint`. Inputs have JSON Schemas (derived from the
//! same parameter types JSON-RPC validates with); results are text content, for `spawn_agent` the
//! `AgentResponse` JSON. A host error (unknown agent, rejected key) is a tool result with
//! `isError: true`, so the model reads why; only unreadable arguments are protocol errors.
//!
//! The host's calls block (a spawn can take minutes), so each runs on its own OS thread, outside
//! the async runtime, which keeps serving other requests meanwhile.
//!
//! Two protocol eras on the same stdio server, chosen by how the client opens (MCP 2026-07-28,
//! basic/versioning, "a dual-era server selects its behavior from how the client opens"): an
//! `initialize` request starts a 2025-11-25 (or older) session; a request whose `_meta` carries
//! `io.modelcontextprotocol/protocolVersion` (after an optional `server/discover`) is served
//! statelessly as 2026-07-28. rmcp does the framing, the discover answer and the version checks;
//! this module bounds the versions it may claim and names the server in each modern result.

use std::borrow::Cow;
use std::sync::Arc;

use rmcp::handler::server::tool::ToolCallContext;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CacheScope, CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock,
    Implementation, ListToolsResult, MetaObject, PaginatedRequestParams, ProtocolVersion,
    ResultType, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{tool, tool_handler, tool_router, ErrorData, RoleServer, ServerHandler, ServiceExt};
use serde_json::Value;

use super::params::{
    AnswerCheckpointParams, Checked, GetStateParams, LogProgressParams, SpawnAgentParams,
    UpdateStateParams,
};
use super::service::{CallError, Service};
use crate::{Host, Spawner};

/// The newest MCP revision `metash mcp` speaks. Pinned rather than rmcp's "every version I know",
/// so that a newer rmcp adding a revision does not make metash advertise (in `server/discover`)
/// or accept a revision nobody tested it against (tests/mcp_revisions.rs).
pub const NEWEST_REVISION: ProtocolVersion = ProtocolVersion::V_2026_07_28;

/// The `_meta` key a 2026-07-28 server names itself under in each result (spec, changelog item 2:
/// "servers SHOULD identify themselves in each result's `_meta`").
const SERVER_INFO_META_KEY: &str = "io.modelcontextprotocol/serverInfo";

/// Why the MCP server stopped abnormally.
#[derive(Debug, thiserror::Error)]
pub enum McpError {
    #[error("MCP initialization failed: {0}")]
    Init(String),
    #[error("MCP server failed: {0}")]
    Serve(String),
}

/// The MCP server for one host.
#[derive(Debug, Clone)]
pub struct McpServer {
    service: Service,
}

impl McpServer {
    pub fn new(host: Arc<Host>, spawner: Arc<dyn Spawner>) -> Self {
        Self {
            service: Service::new(host, spawner),
        }
    }

    pub fn from_service(service: Service) -> Self {
        Self { service }
    }

    /// Serves MCP on stdin/stdout until the client disconnects.
    ///
    /// # Errors
    /// The handshake failed or the transport broke.
    pub async fn serve_stdio(self) -> Result<(), McpError> {
        let running = self
            .serve(rmcp::transport::stdio())
            .await
            .map_err(|e| McpError::Init(e.to_string()))?;
        running
            .waiting()
            .await
            .map_err(|e| McpError::Serve(e.to_string()))?;
        Ok(())
    }

    /// Runs a blocking service call on its own thread and turns the outcome into a tool result.
    async fn run(
        &self,
        call: impl FnOnce(&Service) -> Result<Value, CallError> + Send + 'static,
    ) -> Result<CallToolResult, ErrorData> {
        let service = self.service.clone();
        let (tx, rx) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .name("metash-mcp".into())
            .spawn(move || {
                let _ = tx.send(call(&service));
            })
            .map_err(|e| ErrorData::internal_error(format!("cannot start a thread: {e}"), None))?;
        let outcome = rx
            .await
            .map_err(|_| ErrorData::internal_error("the host call panicked", None))?;
        // What reaches the model is redacted like every other output of the host.
        let redactor = self.service.host().redactor();
        Ok(match outcome {
            Ok(value) => CallToolResult::success(vec![ContentBlock::text(
                redactor.redact_str(&text_of(&value)).into_owned(),
            )]),
            Err(e) => CallToolResult::error(vec![ContentBlock::text(
                redactor.redact_str(&e.to_string()).into_owned(),
            )]),
        })
    }
}

/// Strings as themselves, everything else as compact JSON.
fn text_of(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

#[tool_router]
impl McpServer {
    #[tool(
        description = "Spawn a specialised sub-agent (a registered WASM/native agent or a model-backed role) with a fresh conversation and strict limits, and wait for it. Returns the AgentResponse JSON: {status: success|timeout|error|checkpoint, data, metadata: {tokens_used, duration_ms}}."
    )]
    async fn spawn_agent(
        &self,
        Parameters(Checked(p)): Parameters<Checked<SpawnAgentParams>>,
    ) -> Result<CallToolResult, ErrorData> {
        self.run(move |s| s.spawn_agent(p)).await
    }

    #[tool(
        description = "Atomically update one dotted key path of the session state (e.g. variables.retry_count). Returns {revision}."
    )]
    async fn update_state(
        &self,
        Parameters(Checked(p)): Parameters<Checked<UpdateStateParams>>,
    ) -> Result<CallToolResult, ErrorData> {
        self.run(move |s| s.update_state(p)).await
    }

    #[tool(
        description = "Read the session state: the whole state, or the value at a dotted key path."
    )]
    async fn get_state(
        &self,
        Parameters(Checked(p)): Parameters<Checked<GetStateParams>>,
    ) -> Result<CallToolResult, ErrorData> {
        self.run(move |s| s.get_state(p)).await
    }

    #[tool(
        description = "Write a progress line the user can see (level info, warn or error). Returns {seq} of the logged event."
    )]
    async fn log_progress(
        &self,
        Parameters(Checked(p)): Parameters<Checked<LogProgressParams>>,
    ) -> Result<CallToolResult, ErrorData> {
        self.run(move |s| s.log_progress(p)).await
    }

    #[tool(
        description = "Answer the pending checkpoint (a human decision); the answer is passed to the next spawn exactly once. Returns {checkpoint_id, user_input}."
    )]
    async fn answer_checkpoint(
        &self,
        Parameters(Checked(p)): Parameters<Checked<AnswerCheckpointParams>>,
    ) -> Result<CallToolResult, ErrorData> {
        self.run(move |s| s.answer_checkpoint(p)).await
    }
}

/// Whether this request is served statelessly (2026-07-28 and later): its own `_meta` names a
/// revision without the `initialize` handshake. A 2025-11-25 session's requests carry none.
fn is_modern(context: &RequestContext<RoleServer>) -> bool {
    context
        .meta
        .protocol_version()
        .is_some_and(|version| !version.has_initialize())
}

/// The server's name and version, as `initialize` and `server/discover` report it.
fn implementation() -> Implementation {
    Implementation::new("metash", env!("CARGO_PKG_VERSION"))
}

/// Adds `io.modelcontextprotocol/serverInfo` to a result's `_meta`.
fn name_the_server(meta: &mut Option<MetaObject>) {
    if let Ok(value) = serde_json::to_value(implementation()) {
        meta.get_or_insert_default()
            .insert(SERVER_INFO_META_KEY.to_owned(), value);
    }
}

#[tool_handler]
impl ServerHandler for McpServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(implementation())
            .with_instructions(
                "metash host: spawn sub-agents under limits, update and read the session state, \
                 log progress for the user.",
            )
    }

    /// Every known revision up to [`NEWEST_REVISION`]: what `server/discover` lists as
    /// `supportedVersions`, what `initialize` may agree to, and what a per-request version is
    /// checked against (an unlisted one gets `UnsupportedProtocolVersionError`, -32022).
    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        Cow::Borrowed(ProtocolVersion::known_up_to(&NEWEST_REVISION))
    }

    /// The tool list; on 2026-07-28 with the required cache hints (`ttlMs` 0: clients revalidate,
    /// `cacheScope` public: the list is the same for every caller) and the server's name.
    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let modern = is_modern(&context);
        let mut result = ListToolsResult {
            result_type: Some(ResultType::COMPLETE),
            tools: Self::tool_router().list_all(),
            meta: None,
            next_cursor: None,
            ttl_ms: modern.then_some(0),
            cache_scope: modern.then_some(CacheScope::Public),
        };
        if modern {
            name_the_server(&mut result.meta);
        }
        Ok(result)
    }

    /// A tool call through the router; a 2026-07-28 result also names the server.
    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let modern = is_modern(&context);
        let context = ToolCallContext::new(self, request, context);
        let mut response = Self::tool_router().call(context).await?;
        if let (true, CallToolResponse::Complete(result)) = (modern, &mut response) {
            name_the_server(&mut result.meta);
        }
        Ok(response)
    }
}
