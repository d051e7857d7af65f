import type { Readable, Writable } from "node:stream";
import { type Channel, type Handler, type RunOptions } from "./agent.js";
export interface NodeRunOptions extends RunOptions {
    /** For tests: the host's side (default stdin/stdout). */
    input?: Readable;
    output?: Writable;
}
/** A channel over a pair of Node streams. */
export declare function nodeChannel(input: Readable, output: Writable): Channel;
/**
 * Runs the agent loop on stdin/stdout: `handler` is called once per `input`; `done` is sent after
 * it returns (with `status: "error"` and an `error` event when it throws). Resolves when the host
 * sends `shutdown` or closes stdin.
 */
export declare function runAgent(handler: Handler, options?: NodeRunOptions): Promise<void>;
