// metash's TypeScript SDK on Node: agents (`runAgent`) and orchestrators (`MetashClient`), with
// the protocol's types generated from the JSON Schemas of `metash-protocol`. A WASM build of an
// agent resolves this package to `./wasi.js` instead (the `wasi` export condition).

export * from "./agent.js";
export { nodeChannel, runAgent, type NodeRunOptions } from "./node.js";
export * from "./rpc.js";
export type * from "./protocol.js";
