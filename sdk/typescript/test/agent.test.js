// The agent helper against a scripted host over in-memory streams.
import assert from "node:assert/strict";
import { PassThrough } from "node:stream";
import { test } from "node:test";

import { AgentError, PROTOCOL_VERSION, runAgent, runAgentOn } from "../dist/index.js";

/** A host: `send` writes a line to the agent; `lines()` reads what the agent wrote so far. */
function host() {
  const toAgent = new PassThrough();
  const fromAgent = new PassThrough();
  let text = "";
  fromAgent.on("data", (b) => (text += b.toString("utf8")));
  return {
    input: toAgent,
    output: fromAgent,
    send: (msg) => toAgent.write(JSON.stringify({ schema_version: PROTOCOL_VERSION, ...msg }) + "\n"),
    raw: (line) => toAgent.write(line + "\n"),
    end: () => toAgent.end(),
    lines: () => text.split("\n").filter(Boolean).map((l) => JSON.parse(l)),
    /** Resolves when the agent has written a message `match` accepts. */
    until: async (match) => {
      for (let i = 0; i < 500; i++) {
        const found = text.split("\n").filter(Boolean).map((l) => JSON.parse(l)).find(match);
        if (found) return found;
        await new Promise((r) => setTimeout(r, 5));
      }
      throw new Error(`the agent never wrote the message; it wrote: ${text}`);
    },
  };
}

const START = { type: "start", agent_id: "a1", config: { resume_data: { checkpoint_id: "c1", user_input: "ship" } }, capabilities: ["files.read"] };

test("an input gets its output chunks and one done; the context and resume data are read", async () => {
  const h = host();
  const run = runAgent(
    async (s, input) => {
      assert.equal(s.context.agentId, "a1");
      assert.ok(s.granted("files.read"));
      assert.equal(s.resumeData.user_input, "ship");
      await s.output("text/plain", `you said: ${input.prompt}`);
    },
    { input: h.input, output: h.output },
  );
  h.send(START);
  h.send({ type: "input", agent_id: "a1", prompt: "hi" });
  h.end();
  await run;
  const out = h.lines();
  assert.deepEqual(out.map((m) => m.type), ["output", "done"]);
  assert.equal(out[0].chunk_id, "i1s1:0");
  assert.equal(out[0].data, "you said: hi");
  assert.equal(out[0].agent_id, "a1");
  assert.ok(out.every((m) => m.schema_version === "0.1"));
});

test("output over 16 KiB is split on character boundaries and reassembles", async () => {
  const h = host();
  const big = "é".repeat(20_000); // 40,000 bytes
  const run = runAgent((s) => s.output("text/plain", big), { input: h.input, output: h.output });
  h.send(START);
  h.send({ type: "input", agent_id: "a1", prompt: "x" });
  h.end();
  await run;
  const chunks = h.lines().filter((m) => m.type === "output");
  assert.equal(chunks.length, 3);
  assert.deepEqual(chunks.map((c) => c.chunk_id), ["i1s1:0", "i1s1:1", "i1s1:2"]);
  assert.ok(chunks.every((c) => Buffer.byteLength(c.data) <= 16 * 1024));
  assert.equal(chunks.map((c) => c.data).join(""), big);
});

test("consent answers are read in order; a refusal carries the host's code and hint", async () => {
  const h = host();
  const answers = [];
  const run = runAgent(
    async (s) => {
      answers.push(await s.requestConsent("network:api.github.com", "fetch issues", 600));
      answers.push(await s.requestConsent("files.write", "save"));
      assert.ok(s.granted("network:api.github.com"));
    },
    { input: h.input, output: h.output },
  );
  h.send(START);
  h.send({ type: "input", agent_id: "a1", prompt: "go" });
  await h.until((m) => m.type === "consent_request");
  h.send({ type: "consent_grant", capability: "network:api.github.com", expires_at: "2030-01-01T00:00:00Z" });
  h.send({ type: "error", code: "consent_denied", message: "no", hint: "ask later" });
  await h.until((m) => m.type === "done");
  h.end();
  await run;
  assert.deepEqual(answers, [
    { granted: true, capability: "network:api.github.com", expiresAt: "2030-01-01T00:00:00Z" },
    { granted: false, capability: "files.write", code: "consent_denied", message: "no", hint: "ask later" },
  ]);
  const req = h.lines().find((m) => m.type === "consent_request");
  assert.equal(req.duration_s, 600);
});

test("a revocation takes the capability away the moment it arrives, and listeners hear it", async () => {
  const h = host();
  const heard = [];
  let result;
  const run = runAgent(
    async (s) => {
      s.onRevoke((r) => heard.push(r.capability));
      await s.requestConsent("memory", "remember", 60);
      await s.output("text/plain", "waiting");
      result = await s.untilRevoked("memory", 5000);
    },
    { input: h.input, output: h.output },
  );
  h.send(START);
  h.send({ type: "input", agent_id: "a1", prompt: "go" });
  await h.until((m) => m.type === "consent_request");
  h.send({ type: "consent_grant", capability: "memory", expires_at: "2030-01-01T00:00:00Z" });
  await h.until((m) => m.type === "output");
  h.send({ type: "consent_revoke", capability: "memory" });
  await h.until((m) => m.type === "done");
  h.end();
  await run;
  assert.equal(result, true);
  assert.deepEqual(heard, ["memory"]);
});

test("untilRevoked gives up at its deadline", async () => {
  const h = host();
  let result;
  const run = runAgent(
    async (s) => {
      s.context.capabilities.push("memory");
      result = await s.untilRevoked("memory", 50);
    },
    { input: h.input, output: h.output },
  );
  h.send(START);
  h.send({ type: "input", agent_id: "a1", prompt: "go" });
  await h.until((m) => m.type === "done");
  h.end();
  await run;
  assert.equal(result, false);
});

test("state reads wait for their value; a refused read is an AgentError state_denied", async () => {
  const h = host();
  const seen = [];
  const run = runAgent(
    async (s) => {
      await s.kv.set("last", { n: 1 });
      seen.push(await s.kv.get("last"));
      seen.push(await s.scratchpad.get("missing"));
      await assert.rejects(s.kv.get("x"), (e) => e instanceof AgentError && e.code === "state_denied");
    },
    { input: h.input, output: h.output },
  );
  h.send(START);
  h.send({ type: "input", agent_id: "a1", prompt: "go" });
  await h.until((m) => m.type === "state_get" && m.key === "last");
  h.send({ type: "state_value", key: "last", value: { n: 1 }, found: true, scope: "agent" });
  await h.until((m) => m.type === "state_get" && m.key === "missing");
  h.send({ type: "state_value", key: "missing", value: null, found: false, scope: "scratchpad" });
  await h.until((m) => m.type === "state_get" && m.key === "x");
  h.send({ type: "error", code: "state_denied", message: "no memory grant" });
  await h.until((m) => m.type === "done");
  h.end();
  await run;
  assert.deepEqual(seen, [{ n: 1 }, undefined]);
  const update = h.lines().find((m) => m.type === "state_update");
  assert.deepEqual(update, { schema_version: "0.1", type: "state_update", key: "last", value: { n: 1 }, scope: "agent" });
  const scopes = h.lines().filter((m) => m.type === "state_get").map((m) => m.scope);
  assert.deepEqual(scopes, ["agent", "scratchpad", "agent"]);
});

test("a checkpoint ends the invocation without a done; a throw becomes error + done(error)", async () => {
  const h = host();
  let n = 0;
  const run = runAgent(
    async (s) => {
      n += 1;
      if (n === 1) await s.checkpoint("decision_required", "pick one", ["a", "b"]);
      else throw new Error("boom");
    },
    { input: h.input, output: h.output },
  );
  h.send(START);
  h.send({ type: "input", agent_id: "a1", prompt: "1" });
  h.send({ type: "input", agent_id: "a1", prompt: "2" });
  h.end();
  await run;
  const out = h.lines();
  assert.deepEqual(out.map((m) => m.type), ["checkpoint", "error", "done"]);
  assert.deepEqual(out[0].options, ["a", "b"]);
  assert.equal(out[1].code, "agent_error");
  assert.equal(out[1].message, "boom");
  assert.equal(out[2].status, "error");
});

test("another version or a bad line is answered with an error and never acted on; shutdown runs its hook", async () => {
  const h = host();
  let inputs = 0;
  let flushed = false;
  const run = runAgent(
    () => {
      inputs += 1;
    },
    { input: h.input, output: h.output, onShutdown: async (s) => { flushed = true; await s.kv.set("k", 1); } },
  );
  h.raw(JSON.stringify({ schema_version: "0.2", type: "input", agent_id: "a1", prompt: "future" }));
  h.raw("{not json");
  h.send({ type: "shutdown", grace_ms: 500 });
  await run;
  h.end();
  assert.equal(inputs, 0);
  assert.equal(flushed, true);
  const out = h.lines();
  assert.deepEqual(out.map((m) => m.code ?? m.type), ["unsupported_version", "bad_message", "state_update"]);
  assert.match(out[0].message, /0\.2.*0\.1/);
});

test("writeFile writes under the workspace and resolves the path to announce", async () => {
  const { mkdtempSync, readFileSync, rmSync } = await import("node:fs");
  const { tmpdir } = await import("node:os");
  const { join } = await import("node:path");
  const ws = mkdtempSync(join(tmpdir(), "metash-sdk-ws-"));
  try {
    const h = host();
    const run = runAgent(
      async (s) => {
        const path = await s.writeFile("out/notes.md", "# hi\n");
        await s.artifact("notes", "text/markdown", path);
      },
      { input: h.input, output: h.output },
    );
    h.send({ ...START, workspace: ws });
    h.send({ type: "input", agent_id: "a1", prompt: "x" });
    h.end();
    await run;
    const artifact = h.lines().find((m) => m.type === "artifact");
    assert.equal(artifact.path, join(ws, "out/notes.md"));
    assert.equal(readFileSync(artifact.path, "utf8"), "# hi\n");
  } finally {
    rmSync(ws, { recursive: true, force: true });
  }
});

test("any channel drives the same loop; one that does not read ahead is screened on read", async () => {
  const incoming = [
    JSON.stringify({ schema_version: "0.2", type: "input", agent_id: "a1", prompt: "future" }),
    JSON.stringify({ schema_version: "0.1", ...START, capabilities: ["memory"] }),
    JSON.stringify({ schema_version: "0.1", type: "input", agent_id: "a1", prompt: "go" }),
    JSON.stringify({ schema_version: "0.1", type: "consent_revoke", capability: "memory" }),
  ];
  const written = [];
  const channel = {
    next: async () => incoming.shift() ?? null,
    write: async (v) => void written.push(v),
    writeFile: async () => {
      throw new Error("no files here");
    },
  };
  let revoked;
  await runAgentOn(channel, async (s) => {
    revoked = await s.untilRevoked("memory", 1000);
    await assert.rejects(s.writeFile("x", "y"), /no workspace|no files/);
  });
  assert.equal(revoked, true);
  assert.deepEqual(written.map((m) => m.code ?? m.type), ["unsupported_version", "done"]);
});
