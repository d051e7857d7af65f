import type { AgentEvent, CheckpointReason, LogRecord, ResumeData } from "./protocol.js";
/**
 * How an agent talks to the host: lines in, JSON values out, files in its workspace. Node's is
 * stdio and `node:fs` (`runAgent` from `@metash/sdk`); a WASI component's is `wasi:cli` streams
 * and `wasi:filesystem` (the same `runAgent`, resolved to `@metash/sdk/wasi` when bundled for
 * WASM). Nothing else in the agent helper depends on the platform.
 */
export interface Channel {
    /** The next line from the host; `null` at end of input; `undefined` when `timeoutMs` passed
     * (a channel that cannot time out just waits). */
    next(timeoutMs?: number): Promise<string | null | undefined>;
    /** Writes one JSON value as one line. */
    write(value: unknown): Promise<void>;
    /** Writes a file (an absolute path the agent was given, or one relative to the workspace). */
    writeFile(workspace: string, path: string, data: string): Promise<string>;
    /** A channel that reads ahead (Node's) calls `screen` on each line the moment it arrives, so a
     * revocation applies even while the handler is busy; `false` drops the line. */
    screenOnArrival?(screen: (line: string) => boolean): void;
}
/** The event protocol version this SDK speaks; a message with another is refused. */
export declare const PROTOCOL_VERSION = "0.1";
/** What the host's `start` said: who the agent is and what it was granted. */
export interface Context {
    agentId: string;
    /** Present only with `files.read`/`files.write`: `/workspace` in WASM, the real path natively. */
    workspace?: string | null;
    /** The spawn's config: `system_prompt`, `resume_data`, `task_id`, `options`. */
    config: Record<string, unknown>;
    /** The capabilities granted now (kept current as grants and revocations arrive). */
    capabilities: string[];
}
/** One `invoke(input)`. */
export interface Input {
    prompt: string;
    /** `file:…`, `artifact:…`, `kv:…`, `scratchpad:…`: resolved by the host before the start. */
    contextRefs: string[];
}
/** The host's answer to `requestConsent`. */
export type Consent = {
    granted: true;
    capability: string;
    expiresAt: string | null;
} | {
    granted: false;
    capability: string;
    code: string;
    message: string;
    hint: string | null;
};
/** Where `state_get`/`state_update` go: the agent's own KV, the shared scratchpad, the session. */
export type StateScope = "agent" | "scratchpad" | "session" | "artifact";
/** The host refused something (`state_denied`, …) or went away before answering. */
export declare class AgentError extends Error {
    readonly code: string;
    readonly hint?: string | null | undefined;
    constructor(code: string, message: string, hint?: string | null | undefined);
}
/** A revocation as the agent hears it: the capability is already gone from `granted()`. */
export interface Revocation {
    capability: string;
    expiresAt: string | null;
}
type Handler = (session: Session, input: Input) => Promise<void> | void;
export interface RunOptions {
    /** seed 002's `shutdown()` hook: flush state with `session.kv.set` here. */
    onShutdown?: (session: Session) => Promise<void> | void;
}
/** KV access in one scope: `get` answers `undefined` when nothing is stored. */
export interface StateView {
    get(key: string): Promise<unknown>;
    set(key: string, value: unknown): Promise<void>;
}
export declare class Session {
    private readonly channel;
    private streams;
    private invocation;
    /** The invocation was ended by the handler (`done` or `checkpoint`). */
    ended: boolean;
    private revokeListeners;
    readonly context: Context;
    /** Lines are screened by the channel as they arrive (else when read). */
    private readonly screened;
    /** @internal */
    constructor(channel: Channel);
    /** Whether `capability` is granted now (the host enforces it anyway; this is for fallbacks). */
    granted(capability: string): boolean;
    /** Called the moment a grant is revoked or expires (before any other reading). */
    onRevoke(listener: (r: Revocation) => void): void;
    /** The answer to this agent's last checkpoint, delivered once to the next spawn. */
    get resumeData(): ResumeData | null;
    /** Writes any event, framed with the protocol version. */
    send(event: AgentEvent): Promise<void>;
    /** One output card, split into chunks of at most 16 KiB (`"<stream>:<seq>"` ids). */
    output(contentType: string, data: string): Promise<void>;
    /** One chunk of a stream the agent numbers itself (for output produced as it computes). */
    outputChunk(stream: string, seq: number, contentType: string, data: string): Promise<void>;
    /** Writes `data` to `path` in the workspace (relative to it, or absolute inside it), the same
     * way natively and in WASM; returns the path the agent sees (for `artifact`). Needs
     * `files.write`. */
    writeFile(path: string, data: string): Promise<string>;
    /** Announces a file the agent wrote in its workspace; the host copies it to the artifact store. */
    artifact(id: string, kind: string, path: string, previewHint?: string): Promise<void>;
    /** Reports an error; the invocation still ends with `done`. */
    error(code: string, message: string, hint?: string): Promise<void>;
    /** Ends the invocation (the SDK sends `done` itself when the handler returns without one). */
    done(status?: "success" | "error", summary?: string): Promise<void>;
    /** Stops for a human (seed 000's checkpoint); ends the invocation. The answer comes to the
     * next spawn as `session.resumeData`. */
    checkpoint(reason: CheckpointReason, message: string, options?: string[], resumeId?: string): Promise<void>;
    /** Asks the user, through the host, for `capability` and waits for the answer. */
    requestConsent(capability: string, reason: string, durationS?: number): Promise<Consent>;
    /** Reads what is stored under `key` (`undefined` when nothing is); an empty key reads the
     * whole namespace. Throws `AgentError` `state_denied` without a `memory` grant. */
    stateGet(key: string, scope?: StateScope): Promise<unknown>;
    /** Persists a value through the host (the only way agents persist state). */
    stateUpdate(key: string, value: unknown, scope?: StateScope): Promise<void>;
    /** The agent's own key-value memory (needs `memory`). */
    readonly kv: StateView;
    /** The scratchpad shared by the project's agents (needs `memory`). */
    readonly scratchpad: StateView;
    /**
     * The host's next message: an answer, a `consent_revoke`, or an `error` notice of an action
     * it refused. `null` at end of input; with `timeoutMs`, `undefined` when none came in time.
     */
    recv(timeoutMs?: number): Promise<AgentEvent | null | undefined>;
    /** Waits until `capability` is revoked (or `timeoutMs` passes: false). */
    untilRevoked(capability: string, timeoutMs: number): Promise<boolean>;
    /** @internal Checks one line from the host before anyone reads it: the version first, then
     * grants and revocations applied at once. False drops the line. */
    screen(line: string): boolean;
    /** @internal */
    begin(): void;
}
/**
 * The agent loop over `channel`: `handler` is called once per `input`; `done` is sent after it
 * returns (with `status: "error"` and an `error` event when it throws). Resolves when the host
 * sends `shutdown` or closes its input. `runAgent` is this over the platform's channel.
 */
export declare function runAgentOn(channel: Channel, handler: Handler, options?: RunOptions): Promise<void>;
export type { Handler };
/** A log record as the host's JSON-RPC notifications carry it (re-exported for convenience). */
export type { LogRecord };
