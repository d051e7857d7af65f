export * from "./agent.js";
export { nodeChannel, runAgent, type NodeRunOptions } from "./node.js";
export * from "./rpc.js";
export type * from "./protocol.js";
