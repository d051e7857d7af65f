// A client for the host's JSON-RPC 2.0 (`metash serve --stdio`, docs/host-rpc.md): an orchestrator
// in TypeScript drives metash with it. Requests run concurrently on the server and are matched by
// id; every event the host makes durable arrives as an `event` notification.
import { spawn } from "node:child_process";
import { LineQueue, LineWriter } from "./lines.js";
/** A JSON-RPC error from the host: `code` and `kind` as in docs/host-rpc.md ("Errors"). */
export class RpcError extends Error {
    code;
    kind;
    constructor(code, message, kind) {
        super(message);
        this.code = code;
        this.kind = kind;
        this.name = "RpcError";
    }
}
export class MetashClient {
    child;
    nextId = 1;
    pending = new Map();
    listeners = [];
    writer;
    closed;
    /** The server closed its output: every call fails at once. */
    ended = false;
    /** Starts `metash -C WORKSPACE serve --stdio --quiet` and connects to it. */
    static start(options) {
        const args = ["-C", options.workspace, "serve", "--stdio", "--quiet", ...(options.serveArgs ?? [])];
        const child = spawn(options.metash ?? "metash", args, {
            stdio: ["pipe", "pipe", "inherit"],
            env: options.env ?? process.env,
        });
        return new MetashClient(child.stdout, child.stdin, child);
    }
    /** A client over any pair of streams (a server started some other way). */
    constructor(input, output, child) {
        this.child = child;
        this.writer = new LineWriter(output);
        const queue = new LineQueue(input, (line) => this.dispatch(line));
        // Nothing is queued (dispatch takes every line); next() resolves at end of input.
        this.closed = queue.next().then(() => {
            this.ended = true;
            this.failAll(new RpcError(-32000, "the metash server closed the connection", "closed"));
        });
    }
    dispatch(line) {
        let msg;
        try {
            msg = JSON.parse(line);
        }
        catch {
            return false;
        }
        if (msg.method === "event" && msg.id === undefined) {
            for (const l of this.listeners)
                l(msg.params);
            return false;
        }
        if (typeof msg.id !== "number")
            return false;
        const p = this.pending.get(msg.id);
        if (!p)
            return false;
        this.pending.delete(msg.id);
        if (msg.error)
            p.reject(new RpcError(msg.error.code, msg.error.message, msg.error.data?.kind ?? null));
        else
            p.resolve(msg.result);
        return false;
    }
    failAll(e) {
        for (const p of this.pending.values())
            p.reject(e);
        this.pending.clear();
    }
    /** Calls any method by name (the typed methods below are this with their parameters). */
    async call(method, params = {}) {
        if (this.ended)
            throw new RpcError(-32000, "the metash server closed the connection", "closed");
        const id = this.nextId++;
        const answer = new Promise((resolve, reject) => {
            this.pending.set(id, { resolve: resolve, reject });
        });
        try {
            await this.writer.write({ jsonrpc: "2.0", id, method, params });
        }
        catch (e) {
            this.pending.delete(id);
            throw new RpcError(-32000, `could not send to the metash server: ${e.message}`, "closed");
        }
        return answer;
    }
    /** Every event the host makes durable (the log's record, `seq` gapless); returns an unsubscribe. */
    subscribe(listener) {
        this.listeners.push(listener);
        return () => {
            this.listeners = this.listeners.filter((l) => l !== listener);
        };
    }
    /** Waits for the first event that `match` accepts (events before the call are not seen). */
    waitForEvent(match, timeoutMs = 30_000) {
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
    spawnAgent(params) {
        return this.call("spawnAgent", { ...params });
    }
    /** Atomic `update_state` at a dotted path (`variables.retry_count`); the session's new revision. */
    updateState(key, value) {
        return this.call("updateState", { key, value });
    }
    getState(key) {
        return this.call("getState", key === undefined ? {} : { key });
    }
    logProgress(message, level = "info") {
        return this.call("logProgress", { message, level });
    }
    pendingCheckpoint() {
        return this.call("pendingCheckpoint");
    }
    /** Answers the pending checkpoint (an option, its 1-based number, or free text); the next spawn gets it once. */
    answerCheckpoint(answer, checkpointId) {
        return this.call("answerCheckpoint", checkpointId === undefined ? { answer } : { answer, checkpoint_id: checkpointId });
    }
    pendingConsent() {
        return this.call("pendingConsent");
    }
    answerConsent(id, answer, durationS) {
        return this.call("answerConsent", durationS === undefined ? { id, answer } : { id, answer, duration_s: durationS });
    }
    suspendAgent(agent) {
        return this.call("suspendAgent", { agent });
    }
    resumeAgent(agent) {
        return this.call("resumeAgent", { agent });
    }
    /** Ends input (the server answers what is in flight, then exits) and waits for it to exit. */
    async close() {
        const child = this.child;
        child?.stdin?.end();
        await this.closed;
        if (!child)
            return null;
        if (child.exitCode !== null)
            return child.exitCode;
        return new Promise((resolve) => child.once("exit", (code) => resolve(code)));
    }
}
