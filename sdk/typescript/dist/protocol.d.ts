/**
 * Why an agent stopped for a human. The seed names the first two; `human_verify` is the third case
 * users ask for (look at a result and confirm it).
 */
export type CheckpointReason = "decision_required" | "human_action" | "human_verify";
export interface AgentMessageInput {
    schema_version: string;
    agent_id: string;
    context_refs?: string[];
    prompt: string;
    type: "input";
}
export interface AgentMessageOutput {
    schema_version: string;
    agent_id: string;
    chunk_id: string;
    content_type: string;
    data: string;
    type: "output";
}
export interface AgentMessageArtifact {
    schema_version: string;
    id: string;
    kind: string;
    path: string;
    preview_hint?: string | null;
    type: "artifact";
}
export interface AgentMessageConsentRequest {
    schema_version: string;
    capability: string;
    duration_s?: number | null;
    reason: string;
    type: "consent_request";
}
export interface AgentMessageConsentGrant {
    schema_version: string;
    capability: string;
    /**
     * RFC 3339; absent for a grant that lasts one action.
     */
    expires_at?: string | null;
    type: "consent_grant";
}
export interface AgentMessageConsentRevoke {
    schema_version: string;
    capability: string;
    expires_at?: string | null;
    type: "consent_revoke";
}
export interface AgentMessageError {
    schema_version: string;
    code: string;
    hint?: string | null;
    message: string;
    type: "error";
}
export interface AgentMessageStateUpdate {
    schema_version: string;
    key: string;
    /**
     * `session` (the default), `agent` (the agent's KV namespace) or `scratchpad`.
     */
    scope?: string | null;
    type: "state_update";
    value: unknown;
}
/**
 * Agent to host: read back what was stored (seed 002 §7). `key` in the scope (`agent`, the
 * default, or `scratchpad`: both need `memory`; `session`: `variables.*` only); an empty
 * `key` reads the whole namespace as one object (the list of what is stored). Answered by
 * one `state_value`, or an `error` with code `state_denied`.
 */
export interface AgentMessageStateGet {
    schema_version: string;
    key: string;
    scope?: string | null;
    type: "state_get";
}
/**
 * Host to agent: the answer to `state_get`; `value` is `null` and `found` false when nothing
 * is stored under `key`.
 */
export interface AgentMessageStateValue {
    schema_version: string;
    found: boolean;
    key: string;
    scope?: string | null;
    type: "state_value";
    value: unknown;
}
/**
 * Host to agent, first line of every session: the `start(ctx)` hook's context. Native agents get
 * it once per process, WASM agents once per invocation (each invocation is a fresh instance).
 */
export interface AgentMessageStart {
    schema_version: string;
    agent_id: string;
    capabilities?: string[];
    config?: unknown;
    type: "start";
    /**
     * The workspace path as the agent sees it (`/workspace` inside WASM, the real path natively).
     */
    workspace?: string | null;
}
/**
 * Agent to host: the current invocation is finished. Ends the `invoke(input)` stream; without
 * it the host waits until the timeout.
 */
export interface AgentMessageDone {
    schema_version: string;
    /**
     * `success` (the default) or `error`.
     */
    status?: string | null;
    summary?: string | null;
    type: "done";
}
/**
 * Agent to host: seed 000's checkpoint signal, field for field, so a line of seed-000 JSON plus
 * `schema_version` is a valid message. Ends the invocation like `done`.
 */
export interface AgentMessageCheckpoint {
    schema_version: string;
    message: string;
    options?: string[];
    reason: CheckpointReason;
    resume_id?: string | null;
    type: "checkpoint";
}
/**
 * Host to agent: `shutdown()`: flush state and exit; stdin closes right after. The host kills
 * the agent when `grace_ms` has passed.
 */
export interface AgentMessageShutdown {
    schema_version: string;
    grace_ms?: number | null;
    type: "shutdown";
}
/**
 * An event as it travels over an agent's stdio: the version first, then the event.
 */
export type AgentMessage = AgentMessageInput | AgentMessageOutput | AgentMessageArtifact | AgentMessageConsentRequest | AgentMessageConsentGrant | AgentMessageConsentRevoke | AgentMessageError | AgentMessageStateUpdate | AgentMessageStateGet | AgentMessageStateValue | AgentMessageStart | AgentMessageDone | AgentMessageCheckpoint | AgentMessageShutdown;
export type AgentStatus = "success" | "timeout" | "error" | "checkpoint";
export interface ResponseMetadata {
    duration_ms: number;
    tokens_used: number;
}
/**
 * What `spawn_agent` returns. `data` is the raw output, the error message, or (for `checkpoint`)
 * a serialized [`CheckpointSignal`].
 */
export interface AgentResponse {
    data: string;
    metadata: ResponseMetadata;
    status: AgentStatus;
}
/**
 * The literal `"checkpoint"` tag the seed puts in `type`.
 */
export type CheckpointTag = "checkpoint";
/**
 * The JSON an agent emits to pause for a human (seed 000 section 2).
 */
export interface CheckpointSignal {
    message: string;
    /**
     * Empty means free-text input.
     */
    options?: string[];
    reason: CheckpointReason;
    resume_id?: string | null;
    type: CheckpointTag;
}
export type ProviderDomain = "anthropic" | "openai";
export interface HarnessContinuationRef {
    /**
     * Absent until the first successful provider turn.
     */
    key?: string | null;
    provider: ProviderDomain;
}
export interface AgentEventInput {
    agent_id: string;
    context_refs?: string[];
    prompt: string;
    type: "input";
}
export interface AgentEventOutput {
    agent_id: string;
    chunk_id: string;
    content_type: string;
    data: string;
    type: "output";
}
export interface AgentEventArtifact {
    id: string;
    kind: string;
    path: string;
    preview_hint?: string | null;
    type: "artifact";
}
export interface AgentEventConsentRequest {
    capability: string;
    duration_s?: number | null;
    reason: string;
    type: "consent_request";
}
export interface AgentEventConsentGrant {
    capability: string;
    /**
     * RFC 3339; absent for a grant that lasts one action.
     */
    expires_at?: string | null;
    type: "consent_grant";
}
export interface AgentEventConsentRevoke {
    capability: string;
    expires_at?: string | null;
    type: "consent_revoke";
}
export interface AgentEventError {
    code: string;
    hint?: string | null;
    message: string;
    type: "error";
}
export interface AgentEventStateUpdate {
    key: string;
    /**
     * `session` (the default), `agent` (the agent's KV namespace) or `scratchpad`.
     */
    scope?: string | null;
    type: "state_update";
    value: unknown;
}
/**
 * Agent to host: read back what was stored (seed 002 §7). `key` in the scope (`agent`, the
 * default, or `scratchpad`: both need `memory`; `session`: `variables.*` only); an empty
 * `key` reads the whole namespace as one object (the list of what is stored). Answered by
 * one `state_value`, or an `error` with code `state_denied`.
 */
export interface AgentEventStateGet {
    key: string;
    scope?: string | null;
    type: "state_get";
}
/**
 * Host to agent: the answer to `state_get`; `value` is `null` and `found` false when nothing
 * is stored under `key`.
 */
export interface AgentEventStateValue {
    found: boolean;
    key: string;
    scope?: string | null;
    type: "state_value";
    value: unknown;
}
/**
 * Host to agent, first line of every session: the `start(ctx)` hook's context. Native agents get
 * it once per process, WASM agents once per invocation (each invocation is a fresh instance).
 */
export interface AgentEventStart {
    agent_id: string;
    capabilities?: string[];
    config?: unknown;
    type: "start";
    /**
     * The workspace path as the agent sees it (`/workspace` inside WASM, the real path natively).
     */
    workspace?: string | null;
}
/**
 * Agent to host: the current invocation is finished. Ends the `invoke(input)` stream; without
 * it the host waits until the timeout.
 */
export interface AgentEventDone {
    /**
     * `success` (the default) or `error`.
     */
    status?: string | null;
    summary?: string | null;
    type: "done";
}
/**
 * Agent to host: seed 000's checkpoint signal, field for field, so a line of seed-000 JSON plus
 * `schema_version` is a valid message. Ends the invocation like `done`.
 */
export interface AgentEventCheckpoint {
    message: string;
    options?: string[];
    reason: CheckpointReason;
    resume_id?: string | null;
    type: "checkpoint";
}
/**
 * Host to agent: `shutdown()`: flush state and exit; stdin closes right after. The host kills
 * the agent when `grace_ms` has passed.
 */
export interface AgentEventShutdown {
    grace_ms?: number | null;
    type: "shutdown";
}
/**
 * One event of the agent protocol, tagged by `type` with the seed's snake_case names and fields.
 */
export type AgentEvent = AgentEventInput | AgentEventOutput | AgentEventArtifact | AgentEventConsentRequest | AgentEventConsentGrant | AgentEventConsentRevoke | AgentEventError | AgentEventStateUpdate | AgentEventStateGet | AgentEventStateValue | AgentEventStart | AgentEventDone | AgentEventCheckpoint | AgentEventShutdown;
/**
 * Seed 003's envelope. `continuation` is absent until the harness first reports a key and present
 * on every event after that.
 */
export interface AgentEventEnvelope {
    continuation?: HarnessContinuationRef | null;
    cpSessionId: string;
    /**
     * (A missing `Option` already reads as `None`; `default` here would demand `P: Default`.)
     */
    payload?: AgentEvent | null;
    runId: string;
    seq: number;
    ts: string;
}
/**
 * One frontend in `getHarnessCapabilities()`: its typing and whether it can run here.
 */
export interface FrontendCapability {
    frontend: HarnessFrontend;
    installed: boolean;
    kind: FrontendKind;
    program?: string | null;
    version?: string | null;
}
/**
 * How a frontend runs.
 */
export type FrontendKind = "cli" | "sdk" | "api";
export type HarnessFrontend = "agent-sdk" | "pi-sdk" | "claude-code" | "codex-cli" | "anthropic-api" | "openai-responses" | "openai-chat";
/**
 * Seed 003 section 7 (ASP-2): `{provider, frontends, models}` for one provider.
 */
export interface ProviderCapabilities {
    frontends: FrontendCapability[];
    /**
     * Known model names; other names are passed through unless the frontend restricts them.
     */
    models: string[];
    provider: ProviderDomain;
}
export interface HarnessCapabilities {
    providers: ProviderCapabilities[];
}
/**
 * Stable, deterministic error codes of the harness layer (seed 003 names the first four). A
 * control plane matches on these strings, so they never change once shipped.
 */
export type HarnessErrorCode = "model_not_supported" | "unsupported_frontend" | "timeout" | "cancelled" | "invalid_request" | "io" | "provider_mismatch" | "continuation_not_found" | "program_not_found" | "api_error" | "harness_failed";
export interface HarnessEventTurnStarted {
    frontend: HarnessFrontend;
    model?: string | null;
    type: "turn_started";
}
/**
 * The continuation key was observed for the first time in this turn.
 */
export interface HarnessEventContinuationObserved {
    key: string;
    type: "continuation_observed";
}
export interface HarnessEventTextDelta {
    text: string;
    type: "text_delta";
}
/**
 * A complete assistant message.
 */
export interface HarnessEventMessage {
    role: string;
    text: string;
    type: "message";
}
export interface HarnessEventToolCall {
    call: ToolCall;
    type: "tool_call";
}
export interface HarnessEventToolResult {
    id: string;
    is_error?: boolean;
    output: string;
    type: "tool_result";
}
export interface HarnessEventUsage {
    type: "usage";
    usage: Usage;
}
/**
 * A retry of the provider request after a 429/5xx.
 */
export interface HarnessEventRetry {
    attempt: number;
    delay_ms: number;
    status?: number | null;
    type: "retry";
}
export interface HarnessEventError {
    code: HarnessErrorCode;
    message: string;
    status?: number | null;
    type: "error";
}
export interface HarnessEventTurnCompleted {
    result: RunResult;
    type: "turn_completed";
}
/**
 * The payload of a harness event inside seed 003's `BaseEvent` envelope: the harness's own events
 * (Claude stream-json, Codex/pi JSON lines, SSE) mapped to one vocabulary.
 */
export type HarnessEvent = HarnessEventTurnStarted | HarnessEventContinuationObserved | HarnessEventTextDelta | HarnessEventMessage | HarnessEventToolCall | HarnessEventToolResult | HarnessEventUsage | HarnessEventRetry | HarnessEventError | HarnessEventTurnCompleted;
export interface RunError {
    code: HarnessErrorCode;
    message: string;
    /**
     * The provider's HTTP status, when there was one.
     */
    status?: number | null;
}
/**
 * What a turn produced.
 */
export interface RunResult {
    costUsd?: number | null;
    error?: RunError | null;
    /**
     * The final assistant text.
     */
    finalOutput?: string | null;
    stopReason?: string | null;
    success: boolean;
    toolCalls?: ToolCall[];
    usage?: Usage | null;
}
/**
 * A tool call the model asked for (the API clients return it; they do not execute tools).
 */
export interface ToolCall {
    id: string;
    input: unknown;
    name: string;
}
/**
 * Token counts as the provider reported them (Codex's are cumulative across resumed turns).
 */
export interface Usage {
    cacheCreationTokens?: number | null;
    cacheReadTokens?: number | null;
    inputTokens: number;
    outputTokens: number;
}
/**
 * Seed 003's envelope. `continuation` is absent until the harness first reports a key and present
 * on every event after that.
 */
export interface HarnessEventEnvelope {
    continuation?: HarnessContinuationRef | null;
    cpSessionId: string;
    /**
     * (A missing `Option` already reads as `None`; `default` here would demand `P: Default`.)
     */
    payload?: HarnessEvent | null;
    runId: string;
    seq: number;
    ts: string;
}
/**
 * What the record is about: one of the kinds this version writes (a newer metash may write others).
 */
export type LogKind = string;
/**
 * One line of the event log. `hash` is the SHA-256 of the line's bytes before `,"hash":…` and
 * `prev` is the previous record's hash, so editing or dropping any record breaks the chain at that
 * record.
 */
export interface LogRecord {
    /**
     * The agent the event concerns, when there is one (for ledger filtering).
     */
    agent?: string | null;
    data: unknown;
    hash: string;
    kind: LogKind;
    /**
     * Hex SHA-256 of the previous record; 64 zeros for the first.
     */
    prev: string;
    /**
     * The record format's version. Lines written before records carried it have the same
     * format and read as 1; a newer version is refused, naming the file and the record.
     */
    schema_version?: number;
    /**
     * Gapless, starting at 1.
     */
    seq: number;
    /**
     * RFC 3339 UTC timestamp with microseconds.
     */
    ts: string;
}
/**
 * A lifecycle hook a manifest can declare.
 */
export type Hook = "shutdown";
/**
 * CPU and memory quotas (`resources.cpu`, `resources.mem`).
 */
export interface Resources {
    /**
     * Kubernetes-style CPU quantity, e.g. `"500m"`, `"2"` or `"0.5"`.
     */
    cpu?: string | null;
    /**
     * Kubernetes-style memory quantity, e.g. `"512Mi"`, `"1Gi"` or `"1000000"` (bytes).
     */
    mem?: string | null;
}
/**
 * Execution mode: `wasm` (preferred) or `native` (allowed with explicit user consent).
 */
export type SandboxKind = "wasm" | "native";
/**
 * UI integration hints (`ui.hints`).
 */
export interface UiHints {
    /**
     * e.g. `"streaming"`, `"diff"`, `"preview"`.
     */
    hints?: string[];
}
/**
 * An agent's `manifest.toml` (seed 002 section 1). The syntax of capabilities and the other
 * rules the schema cannot say are in `docs/policy.md`.
 */
export interface Manifest {
    /**
     * Declared permissions, e.g. `"files.read"`, `"network:api.github.com"`; default deny.
     */
    capabilities?: string[];
    /**
     * Executable or WASM module, relative to the manifest's directory.
     */
    entry: string;
    /**
     * Lifecycle hooks the agent implements besides `start` and `invoke` (metash's extension of
     * seed 002 §1, for §3's `shutdown()`): with `"shutdown"`, a WASM agent is run once more
     * with a `shutdown` event before it is terminated, to flush its state. Without it nothing
     * runs again (an agent that ignores its input would redo its last work).
     */
    hooks?: Hook[];
    /**
     * Human name, shown in the UI.
     */
    name: string;
    /**
     * External API scopes requested, `PROVIDER:SCOPE`, e.g. `"github:repo"`.
     */
    oauth_scopes?: string[];
    resources?: Resources;
    sandbox: SandboxKind;
    /**
     * Version of the manifest schema; one of [`MANIFEST_SCHEMA_VERSIONS`].
     */
    schema_version: string;
    ui?: UiHints;
    /**
     * The agent's own semantic version, e.g. `"0.1.0"`.
     */
    version: string;
}
export type InteractionMode = "interactive" | "headless" | "nonInteractive";
export type IoMode = "pty" | "pipes" | "inherit";
/**
 * Everything a control plane needs to spawn a CLI harness without parsing a shell string.
 */
export interface ProcessInvocationSpec {
    /**
     * Authoritative; never shell-parsed.
     */
    argv: string[];
    continuation?: HarnessContinuationRef | null;
    /**
     * Absolute.
     */
    cwd: string;
    /**
     * For copy and paste only.
     */
    displayCommand?: string | null;
    /**
     * Only the delta the harness needs; sorted so the same input gives the same bytes.
     */
    env: Record<string, string>;
    frontend: HarnessFrontend;
    interactionMode: InteractionMode;
    ioMode: IoMode;
    provider: ProviderDomain;
}
/**
 * The answer to a checkpoint, passed to the next spawn exactly once.
 */
export interface ResumeData {
    checkpoint_id: string;
    user_input: string;
}
/**
 * Seed 003 section 3.2's response.
 */
export interface RunTurnNonInteractiveResponse {
    /**
     * Set once a key was observed (also when it is the key the turn resumed).
     */
    continuation?: HarnessContinuationRef | null;
    frontend: HarnessFrontend;
    model?: string | null;
    provider: ProviderDomain;
    result: RunResult;
}
/**
 * A raised, unanswered checkpoint.
 */
export interface PendingCheckpoint {
    /**
     * The agent (or `orchestrator`) that raised it.
     */
    agent: string;
    /**
     * The signal's `resume_id`, or one the host generated.
     */
    id: string;
    raisedAt: string;
    signal: CheckpointSignal;
}
export interface Plan {
    currentTaskIdx: number;
    tasks: Task[];
}
export type SessionStatus = "planning" | "executing" | "verifying" | "halted";
export interface Task {
    /**
     * Absent and empty differ in the seed's example, so both round-trip.
     */
    commits?: string[] | null;
    dependencies?: string[];
    id: string;
    status: TaskStatus;
    title: string;
}
export type TaskStatus = "pending" | "complete" | "failed";
/**
 * The session file. Unknown fields are rejected so a typo never silently becomes state; new
 * fields must come with `#[serde(default)]` so files written by older builds still load.
 */
export interface SessionState {
    currentPhase: number;
    gapCount: number;
    /**
     * A checkpoint waiting for a person. Written before it is shown, so a host killed while
     * waiting finds it again.
     */
    pendingCheckpoint?: PendingCheckpoint | null;
    plan?: Plan | null;
    /**
     * An answered checkpoint not yet delivered: the next spawn receives it, exactly once.
     */
    resumeData?: ResumeData | null;
    /**
     * The `seq` of the last log event folded into this state. It is the fencing version: a write
     * is accepted only on top of the revision it was computed from.
     */
    revision?: number;
    /**
     * Absent in seed 001's own example: such a file is read as version 1, and the next write
     * adds the field.
     */
    schema_version?: number;
    sessionId: string;
    status: SessionStatus;
    variables?: Record<string, unknown>;
}
/**
 * Which class of model a model-backed role should use; the host maps it to a concrete model in
 * `.meta/config.toml`.
 */
export type ModelHint = "fast" | "smart";
/**
 * The `options` argument of `spawn_agent`.
 */
export interface SpawnOptions {
    /**
     * What the agent should look at (seed 002's `input.context_refs`; not in seed 000):
     * `file:PATH`, `artifact:ID`, `kv:KEY`, `scratchpad:KEY`. The host checks each resolves
     * before the agent starts and refuses the spawn naming one that does not.
     */
    context_refs?: string[];
    max_tokens?: number | null;
    model_hint?: ModelHint | null;
    /**
     * Seconds; fractional values are allowed so tests can use short deadlines.
     */
    timeout_seconds?: number | null;
}
