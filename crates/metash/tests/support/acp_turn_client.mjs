// An editor in metash acp's `turn` mode, through the official TypeScript SDK
// (@agentclientprotocol/sdk, pinned in scripts/setup). Used by tests/acp_agent.rs.
//
// Usage: node acp_turn_client.mjs TOOLS_DIR METASH SCENARIO PROJECT
//   turns:  session/new (its modes recorded), session/set_mode to `run`, to `turn`, and to an
//           unknown mode (its error recorded); then two prompts in turn mode, every consent
//           question allowed; the checkout recorded after each.
//   cancel: a prompt whose first executor spawn's tool call is followed by session/cancel
//           (questions asked meanwhile answered `cancelled`); the checkout recorded; then a
//           second prompt in the same session, every question allowed.
//   refuse: one prompt, every consent question denied.
//   waiting: a prompt in `run` mode whose checkpoint (the planner's language question) is left
//           for later; then `turn` mode and a prompt: the checkpoint is asked again and answered
//           `french`, every consent question allowed.
// Prints one JSON summary line on stdout.

import { spawn, execFileSync } from "node:child_process";
import { createRequire } from "node:module";
import { existsSync } from "node:fs";
import { Readable, Writable } from "node:stream";
import { pathToFileURL } from "node:url";

const [tools, metash, scenario, project] = process.argv.slice(2);
const require = createRequire(`${tools}/package.json`);
const acp = await import(pathToFileURL(require.resolve("@agentclientprotocol/sdk")).href);

const PROMPTS = ["Write a note that greets the reader.", "Add a second note, a farewell."];
const summary = {
  scenario, modes: null, setModes: [], badModeError: null, stopReasons: [], texts: [],
  toolCalls: [], toolUpdates: [], plans: [], permissions: [], checkouts: [],
};
let sessionId = null;
let ctxRef = null;
let cancelSent = false;
let cancelling = false;

const agent = spawn(metash, ["acp"], { stdio: ["pipe", "pipe", "inherit"] });
setTimeout(() => {
  console.error(`timed out; so far: ${JSON.stringify(summary)}`);
  agent.kill();
  process.exit(2);
}, 600_000).unref();
const stream = acp.ndJsonStream(Writable.toWeb(agent.stdin), Readable.toWeb(agent.stdout));

// The checkout: commits on HEAD, files tracked, changes to tracked files, a merge in progress,
// the task branches and worktrees metash has.
function checkout() {
  const git = (...a) => execFileSync("git", ["-C", project, ...a], { encoding: "utf8" }).trim();
  return {
    commits: Number(git("rev-list", "--count", "HEAD")),
    files: git("ls-files").split("\n").filter(Boolean),
    tracked: git("status", "--porcelain", "--untracked-files=no"),
    merging: existsSync(`${project}/.git/MERGE_HEAD`),
    branches: git("branch", "--list", "metash/task/*").split("\n").map((b) => b.trim()).filter(Boolean),
    worktrees: git("worktree", "list", "--porcelain").split("\n").filter((l) => l.startsWith("worktree ")).length,
  };
}

const app = acp.client({ name: "metash-acp-turn-test" })
  .onNotification("session/update", ({ params }) => {
    const u = params.update;
    if (u.sessionUpdate === "plan") summary.plans.push(u.entries);
    else if (u.sessionUpdate === "agent_message_chunk") summary.texts.push(u.content.text);
    else if (u.sessionUpdate === "tool_call") summary.toolCalls.push(u);
    else if (u.sessionUpdate === "tool_call_update") summary.toolUpdates.push(u);
    if (scenario === "cancel" && !cancelSent && u.sessionUpdate === "tool_call"
        && u.kind === "execute" && u.title.startsWith("executor:")) {
      cancelSent = true;
      cancelling = true;
      ctxRef.notify("session/cancel", { sessionId });
    }
  })
  .onRequest("session/request_permission", ({ params }) => {
    if (cancelling) {
      summary.permissions.push({ title: params.toolCall.title, chosen: "cancelled" });
      return { outcome: { outcome: "cancelled" } };
    }
    const checkpoint = params.toolCall.toolCallId.startsWith("checkpoint-");
    const kind = scenario === "refuse" ? "reject_once" : "allow_always";
    let chosen = params.options.find((o) => o.kind === kind)?.optionId;
    if (checkpoint) {
      const later = !summary.permissions.some((p) => p.checkpoint);
      chosen = later ? "later" : params.options.find((o) => o.name === "french")?.optionId;
    }
    summary.permissions.push({ checkpoint, title: params.toolCall.title, chosen });
    return { outcome: { outcome: "selected", optionId: chosen } };
  });

async function prompt(ctx, text) {
  const r = await ctx.request("session/prompt", { sessionId, prompt: [{ type: "text", text }] });
  summary.stopReasons.push(r.stopReason);
  cancelling = false;
  summary.checkouts.push(checkout());
}

await app.connectWith(stream, async (ctx) => {
  ctxRef = ctx;
  await ctx.request("initialize", {
    protocolVersion: 1,
    clientCapabilities: { fs: { readTextFile: false, writeTextFile: false }, terminal: false },
  });
  const s = await ctx.request("session/new", { cwd: project, mcpServers: [] });
  sessionId = s.sessionId;
  summary.modes = s.modes;
  if (scenario === "turns") {
    for (const modeId of ["run", "turn"]) {
      await ctx.request("session/set_mode", { sessionId, modeId });
      summary.setModes.push(modeId);
    }
    try {
      await ctx.request("session/set_mode", { sessionId, modeId: "bogus" });
    } catch (e) {
      summary.badModeError = { code: e.code, message: e.message };
    }
  }
  if (scenario === "waiting") {
    await ctx.request("session/set_mode", { sessionId, modeId: "run" });
    await prompt(ctx, "Build the greetings project.");
    await ctx.request("session/set_mode", { sessionId, modeId: "turn" });
    summary.textsBeforeTurn = summary.texts.length;
    await prompt(ctx, PROMPTS[0]);
  } else {
    await prompt(ctx, PROMPTS[0]);
    if (scenario !== "refuse") await prompt(ctx, PROMPTS[1]);
  }
});
agent.stdin.end();
await new Promise((resolve) => agent.on("exit", resolve));
console.log(JSON.stringify(summary));
