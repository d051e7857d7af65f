export * from "./agent.js";
export * from "./rpc.js";
export type * from "./protocol.js";
