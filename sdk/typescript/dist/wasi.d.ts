import { type Channel, type Handler, type RunOptions } from "./agent.js";
export * from "./agent.js";
export type * from "./protocol.js";
/** A channel over the component's stdin/stdout and its preopened directories. */
export declare function wasiChannel(): Channel;
/** `runAgent` inside a WASI component: the same loop, over `wasiChannel()`. */
export declare function runAgent(handler: Handler, options?: RunOptions): Promise<void>;
