// metash's TypeScript SDK: agents (`runAgent`) and orchestrators (`MetashClient`), with the
// protocol's types generated from the JSON Schemas of `metash-protocol`.
export * from "./agent.js";
export * from "./rpc.js";
