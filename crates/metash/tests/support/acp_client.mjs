// An editor, as far as ACP goes: the official TypeScript SDK (@agentclientprotocol/sdk, pinned in
// scripts/setup) drives `metash acp` over stdio. Used by tests/acp_agent.rs.
//
// Usage: node acp_client.mjs TOOLS_DIR METASH SCENARIO PROJECT [NOT_A_PROJECT]
//   run:    initialize (offering fs/read_text_file), session/new, a prompt linking the project's
//           .meta/context.md (read back through fs/read_text_file with an "unsaved" line added);
//           the checkpoint is answered with "french", the first consent question denied, later
//           ones allowed; prompts again until the run ends with end_turn (at most 4 prompts).
//   refuse: one prompt; the checkpoint answered, every consent question denied.
//   cancel: a prompt; after the checkpoint is answered, the first executor spawn's tool call is
//           followed by session/cancel (questions asked meanwhile answered `cancelled`); once the
//           prompt ended, the same session prompts again (the run takes up where it stopped).
// Prints one JSON summary line on stdout.

import { spawn } from "node:child_process";
import { createRequire } from "node:module";
import { execFileSync } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import { Readable, Writable } from "node:stream";
import { pathToFileURL } from "node:url";

const [tools, metash, scenario, project, notProject] = process.argv.slice(2);
const require = createRequire(`${tools}/package.json`);
const acp = await import(pathToFileURL(require.resolve("@agentclientprotocol/sdk")).href);

const UNSAVED = "Unsaved in the editor: greet politely.";
const summary = {
  scenario, stopReasons: [], plans: [], texts: [], toolCalls: [], toolUpdates: [],
  permissions: [], fsReads: [], modes: null, notProjectError: null, initialize: null,
};
let sessionId = null;
let consentAsked = 0;
let cancelSent = false;
let cancelling = false;
let ctxRef = null;

const agent = spawn(metash, ["acp"], { stdio: ["pipe", "pipe", "inherit"] });
// A hung agent fails the test instead of hanging it.
setTimeout(() => {
  console.error(`timed out; so far: ${JSON.stringify(summary)}`);
  agent.kill();
  process.exit(2);
}, 600_000).unref();
const stream = acp.ndJsonStream(Writable.toWeb(agent.stdin), Readable.toWeb(agent.stdout));

function maybeCancel(update) {
  if (scenario !== "cancel" || cancelSent || !ctxRef) return;
  const answered = summary.permissions.some((p) => p.checkpoint);
  if (answered && update.sessionUpdate === "tool_call" && update.kind === "execute") {
    cancelSent = true;
    cancelling = true;
    ctxRef.notify("session/cancel", { sessionId });
  }
}

// The checkout as the cancelled run left it: commits on HEAD, tracked changes, a merge in progress.
function checkout() {
  const git = (...a) => execFileSync("git", ["-C", project, ...a], { encoding: "utf8" }).trim();
  return {
    commits: Number(git("rev-list", "--count", "HEAD")),
    tracked: git("status", "--porcelain", "--untracked-files=no"),
    merging: existsSync(`${project}/.git/MERGE_HEAD`),
  };
}

const app = acp.client({ name: "metash-acp-test" })
  .onNotification("session/update", ({ params }) => {
    const u = params.update;
    if (u.sessionUpdate === "plan") summary.plans.push(u.entries);
    else if (u.sessionUpdate === "agent_message_chunk") summary.texts.push(u.content.text);
    else if (u.sessionUpdate === "tool_call") summary.toolCalls.push(u);
    else if (u.sessionUpdate === "tool_call_update") summary.toolUpdates.push(u);
    maybeCancel(u);
  })
  .onRequest("session/request_permission", ({ params }) => {
    const checkpoint = params.toolCall.toolCallId.startsWith("checkpoint-");
    let chosen;
    if (cancelling) {
      summary.permissions.push({ checkpoint, title: params.toolCall.title, chosen: "cancelled" });
      return { outcome: { outcome: "cancelled" } };
    }
    if (checkpoint) {
      chosen = params.options.find((o) => o.name === "french")?.optionId;
    } else {
      consentAsked += 1;
      const deny = scenario === "refuse" || (scenario === "run" && consentAsked === 1);
      const kind = deny ? "reject_once" : "allow_always";
      chosen = params.options.find((o) => o.kind === kind)?.optionId;
    }
    summary.permissions.push({
      checkpoint, title: params.toolCall.title, kind: params.toolCall.kind,
      options: params.options.map((o) => `${o.kind}:${o.name}`), chosen,
    });
    return { outcome: { outcome: "selected", optionId: chosen } };
  })
  .onRequest("fs/read_text_file", ({ params }) => {
    summary.fsReads.push(params.path);
    return { content: `${readFileSync(params.path, "utf8")}\n${UNSAVED}\n` };
  });

await app.connectWith(stream, async (ctx) => {
  ctxRef = ctx;
  summary.initialize = await ctx.request("initialize", {
    protocolVersion: 1,
    clientCapabilities: { fs: { readTextFile: true, writeTextFile: false }, terminal: false },
  });
  if (notProject) {
    try {
      await ctx.request("session/new", { cwd: notProject, mcpServers: [] });
    } catch (e) {
      summary.notProjectError = { code: e.code, message: e.message };
    }
  }
  const s = await ctx.request("session/new", { cwd: project, mcpServers: [] });
  sessionId = s.sessionId;
  summary.modes = s.modes;
  await ctx.request("session/set_mode", { sessionId, modeId: "run" });
  const prompt = [{ type: "text", text: "Build the greetings project." }];
  if (scenario === "run") {
    prompt.push({
      type: "resource_link", name: "context.md", uri: `file://${project}/.meta/context.md`,
    });
  }
  for (let i = 0; i < 4; i++) {
    const r = await ctx.request("session/prompt", { sessionId, prompt: i ? prompt.slice(0, 1) : prompt });
    summary.stopReasons.push(r.stopReason);
    cancelling = false;
    if (r.stopReason === "cancelled") summary.afterCancel = checkout();
    const again = scenario === "run" ? r.stopReason === "refusal"
      : scenario === "cancel" ? r.stopReason === "cancelled" : false;
    if (!again) break;
  }
});
agent.stdin.end();
await new Promise((resolve) => agent.on("exit", resolve));
console.log(JSON.stringify(summary));
