import { type ChildProcess } from "node:child_process";
import type { Readable, Writable } from "node:stream";
import type { AgentResponse, LogRecord, ModelHint, PendingCheckpoint, ResumeData } from "./protocol.js";
/** A JSON-RPC error from the host: `code` and `kind` as in docs/host-rpc.md ("Errors"). */
export declare class RpcError extends Error {
    readonly code: number;
    readonly kind: string | null;
    constructor(code: number, message: string, kind: string | null);
}
export interface SpawnAgentParams {
    agent_name: string;
    system_prompt?: string;
    user_message: string;
    options?: {
        model_hint?: ModelHint;
        timeout_seconds?: number;
        max_tokens?: number;
    };
}
/** A consent question waiting for any client (`[host] consent_wait_seconds`). */
export interface ConsentQuestion {
    id: string;
    agent: string;
    capability: string;
    reason: string;
    duration_s: number | null;
    asked_at: string;
    deadline: string;
}
export interface ConnectOptions {
    /** The project (the directory holding `.meta/`). */
    workspace: string;
    /** The `metash` binary (default: `metash` on PATH). */
    metash?: string;
    /** More arguments for `serve`, e.g. `["--policy", "policy.toml"]`. */
    serveArgs?: string[];
    env?: NodeJS.ProcessEnv;
}
export declare class MetashClient {
    private readonly child?;
    private nextId;
    private pending;
    private listeners;
    private readonly writer;
    private closed;
    /** The server closed its output: every call fails at once. */
    private ended;
    /** Starts `metash -C WORKSPACE serve --stdio --quiet` and connects to it. */
    static start(options: ConnectOptions): MetashClient;
    /** A client over any pair of streams (a server started some other way). */
    constructor(input: Readable, output: Writable, child?: ChildProcess | undefined);
    private dispatch;
    private failAll;
    /** Calls any method by name (the typed methods below are this with their parameters). */
    call<T = unknown>(method: string, params?: Record<string, unknown>): Promise<T>;
    /** Every event the host makes durable (the log's record, `seq` gapless); returns an unsubscribe. */
    subscribe(listener: (record: LogRecord) => void): () => void;
    /** Waits for the first event that `match` accepts (events before the call are not seen). */
    waitForEvent(match: (record: LogRecord) => boolean, timeoutMs?: number): Promise<LogRecord>;
    /** seed 000's `spawn_agent`: a failure, timeout or checkpoint is a result (`status`), not an error. */
    spawnAgent(params: SpawnAgentParams): Promise<AgentResponse>;
    /** Atomic `update_state` at a dotted path (`variables.retry_count`); the session's new revision. */
    updateState(key: string, value: unknown): Promise<{
        revision: number;
    }>;
    getState<T = unknown>(key?: string): Promise<T>;
    logProgress(message: string, level?: "info" | "warn" | "error"): Promise<{
        seq: number;
    }>;
    pendingCheckpoint(): Promise<PendingCheckpoint | null>;
    /** Answers the pending checkpoint (an option, its 1-based number, or free text); the next spawn gets it once. */
    answerCheckpoint(answer: string, checkpointId?: string): Promise<ResumeData>;
    pendingConsent(): Promise<ConsentQuestion[]>;
    answerConsent(id: string, answer: "allow_once" | "allow_for" | "deny", durationS?: number): Promise<{
        id: string;
        answer: string;
    }>;
    suspendAgent(agent: string): Promise<Record<string, unknown>>;
    resumeAgent(agent: string): Promise<Record<string, unknown>>;
    /** Ends input (the server answers what is in flight, then exits) and waits for it to exit. */
    close(): Promise<number | null>;
}
