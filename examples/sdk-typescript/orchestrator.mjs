#!/usr/bin/env node
// @ts-check
// An orchestrator in TypeScript: drives a metash project over JSON-RPC (`metash serve --stdio`).
//   node orchestrator.mjs PROJECT AGENT [MESSAGE]
// It records who is orchestrating in the session, spawns AGENT, answers its checkpoint with the
// first option, spawns it again to hear the answer acted on, and prints a JSON summary.
// `METASH` names the binary (default: `metash` on PATH); `METASH_POLICY` a policy file for the
// spawned agents' consent (nobody can be asked over stdio).
import { MetashClient } from "@metash/sdk";

const [project, agent, message = "hello from the orchestrator"] = process.argv.slice(2);
if (!project || !agent) {
  console.error("usage: orchestrator.mjs PROJECT AGENT [MESSAGE]");
  process.exit(2);
}

const client = MetashClient.start({
  workspace: project,
  metash: process.env.METASH ?? "metash",
  serveArgs: process.env.METASH_POLICY ? ["--policy", process.env.METASH_POLICY] : [],
});
const kinds = new Map();
client.subscribe((record) => kinds.set(record.kind, (kinds.get(record.kind) ?? 0) + 1));

const { revision } = await client.updateState("variables.orchestrator", "typescript");
await client.logProgress(`spawning ${agent}`);
const first = await client.spawnAgent({ agent_name: agent, user_message: message, options: { timeout_seconds: 120 } });
let answered = null;
let second = null;
if (first.status === "checkpoint") {
  const pending = await client.pendingCheckpoint();
  const answer = pending?.signal.options[0] ?? "yes";
  answered = await client.answerCheckpoint(answer, pending?.id);
  second = await client.spawnAgent({ agent_name: agent, user_message: "go on", options: { timeout_seconds: 120 } });
}
const orchestrator = await client.getState("variables.orchestrator");
const code = await client.close();
console.log(JSON.stringify({ revision, first, answered, second, orchestrator, events: Object.fromEntries(kinds), server_exit: code }));
