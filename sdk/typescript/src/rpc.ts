// A client for the host's JSON-RPC 2.0 (`metash serve --stdio`, docs/host-rpc.md): an orchestrator
// in TypeScript drives metash with it. Requests run concurrently on the server and are matched by
// id; every event the host makes durable arrives as an `event` notification.

import { spawn, type ChildProcess } from "node:child_process";
import type { Readable, Writable } from "node:stream";

import { LineQueue, LineWriter } from "./lines.js";
import type { AgentResponse, LogRecord, ModelHint, PendingCheckpoint, ResumeData } from "./protocol.js";

/** A JSON-RPC error from the host: `code` and `kind` as in docs/host-rpc.md ("Errors"). */
export class RpcError extends Error {
  constructor(readonly code: number, message: string, readonly kind: string | null) {
    super(message);
    this.name = "RpcError";
  }
}

export interface SpawnAgentParams {
  agent_name: string;
  system_prompt?: string;
  user_message: string;
  options?: { model_hint?: ModelHint; timeout_seconds?: number; max_tokens?: number };
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

type Pending = { resolve: (v: unknown) => void; reject: (e: Error) => void };

export class MetashClient {
  private nextId = 1;
  private pending = new Map<number, Pending>();
  private listeners: Array<(r: LogRecord) => void> = [];
  private readonly writer: LineWriter;
  private closed: Promise<void>;
  /** The server closed its output: every call fails at once. */
  private ended = false;

  /** Starts `metash -C WORKSPACE serve --stdio --quiet` and connects to it. */
  static start(options: ConnectOptions): MetashClient {
    const args = ["-C", options.workspace, "serve", "--stdio", "--quiet", ...(options.serveArgs ?? [])];
    const child = spawn(options.metash ?? "metash", args, {
      stdio: ["pipe", "pipe", "inherit"],
      env: options.env ?? process.env,
    });
    return new MetashClient(child.stdout!, child.stdin!, child);
  }

  /** A client over any pair of streams (a server started some other way). */
  constructor(input: Readable, output: Writable, private readonly child?: ChildProcess) {
    this.writer = new LineWriter(output);
    const queue = new LineQueue(input, (line) => this.dispatch(line));
    // Nothing is queued (dispatch takes every line); next() resolves at end of input.
    this.closed = queue.next().then(() => {
      this.ended = true;
      this.failAll(new RpcError(-32000, "the metash server closed the connection", "closed"));
    });
  }

  private dispatch(line: string): boolean {
    let msg: { id?: number; method?: string; params?: unknown; result?: unknown; error?: { code: number; message: string; data?: { kind?: string } } };
    try {
      msg = JSON.parse(line);
    } catch {
      return false;
    }
    if (msg.method === "event" && msg.id === undefined) {
      for (const l of this.listeners) l(msg.params as LogRecord);
      return false;
    }
    if (typeof msg.id !== "number") return false;
    const p = this.pending.get(msg.id);
    if (!p) return false;
    this.pending.delete(msg.id);
    if (msg.error) p.reject(new RpcError(msg.error.code, msg.error.message, msg.error.data?.kind ?? null));
    else p.resolve(msg.result);
    return false;
  }

  private failAll(e: Error): void {
    for (const p of this.pending.values()) p.reject(e);
    this.pending.clear();
  }

  /** Calls any method by name (the typed methods below are this with their parameters). */
  async call<T = unknown>(method: string, params: Record<string, unknown> = {}): Promise<T> {
    if (this.ended) throw new RpcError(-32000, "the metash server closed the connection", "closed");
    const id = this.nextId++;
    const answer = new Promise<T>((resolve, reject) => {
      this.pending.set(id, { resolve: resolve as (v: unknown) => void, reject });
    });
    try {
      await this.writer.write({ jsonrpc: "2.0", id, method, params });
    } catch (e) {
      this.pending.delete(id);
      throw new RpcError(-32000, `could not send to the metash server: ${(e as Error).message}`, "closed");
    }
    return answer;
  }

  /** Every event the host makes durable (the log's record, `seq` gapless); returns an unsubscribe. */
  subscribe(listener: (record: LogRecord) => void): () => void {
    this.listeners.push(listener);
    return () => {
      this.listeners = this.listeners.filter((l) => l !== listener);
    };
  }

  /** Waits for the first event that `match` accepts (events before the call are not seen). */
  waitForEvent(match: (record: LogRecord) => boolean, timeoutMs = 30_000): Promise<LogRecord> {
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        off();
        reject(new Error(`no matching event within ${timeoutMs} ms`));
      }, timeoutMs);
      const off = this.subscribe((r) => {
        if (match(r)) {
          clearTimeout(timer);
          off();
          resolve(r);
        }
      });
    });
  }

  /** seed 000's `spawn_agent`: a failure, timeout or checkpoint is a result (`status`), not an error. */
  spawnAgent(params: SpawnAgentParams): Promise<AgentResponse> {
    return this.call("spawnAgent", { ...params });
  }

  /** Atomic `update_state` at a dotted path (`variables.retry_count`); the session's new revision. */
  updateState(key: string, value: unknown): Promise<{ revision: number }> {
    return this.call("updateState", { key, value });
  }

  getState<T = unknown>(key?: string): Promise<T> {
    return this.call("getState", key === undefined ? {} : { key });
  }

  logProgress(message: string, level: "info" | "warn" | "error" = "info"): Promise<{ seq: number }> {
    return this.call("logProgress", { message, level });
  }

  pendingCheckpoint(): Promise<PendingCheckpoint | null> {
    return this.call("pendingCheckpoint");
  }

  /** Answers the pending checkpoint (an option, its 1-based number, or free text); the next spawn gets it once. */
  answerCheckpoint(answer: string, checkpointId?: string): Promise<ResumeData> {
    return this.call("answerCheckpoint", checkpointId === undefined ? { answer } : { answer, checkpoint_id: checkpointId });
  }

  pendingConsent(): Promise<ConsentQuestion[]> {
    return this.call("pendingConsent");
  }

  answerConsent(id: string, answer: "allow_once" | "allow_for" | "deny", durationS?: number): Promise<{ id: string; answer: string }> {
    return this.call("answerConsent", durationS === undefined ? { id, answer } : { id, answer, duration_s: durationS });
  }

  suspendAgent(agent: string): Promise<Record<string, unknown>> {
    return this.call("suspendAgent", { agent });
  }

  resumeAgent(agent: string): Promise<Record<string, unknown>> {
    return this.call("resumeAgent", { agent });
  }

  /** Ends input (the server answers what is in flight, then exits) and waits for it to exit. */
  async close(): Promise<number | null> {
    const child = this.child;
    child?.stdin?.end();
    await this.closed;
    if (!child) return null;
    if (child.exitCode !== null) return child.exitCode;
    return new Promise((resolve) => child.once("exit", (code) => resolve(code)));
  }
}
