// The JSON-RPC client against a real `metash serve --stdio` (the binary from `METASH`, else the
// workspace's target/debug/metash, which `cargo test` builds). Without one the suite skips, and
// fails when CI is set.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

import { MetashClient, RpcError } from "../dist/index.js";

const here = fileURLToPath(new URL(".", import.meta.url));
const metash = process.env.METASH ?? resolve(here, "../../../target/debug/metash");
const why = existsSync(metash) ? null : `no metash binary at ${metash} (set METASH or run cargo build)`;
if (why && process.env.CI) throw new Error(`CI is set and ${why}`);

function project() {
  const dir = mkdtempSync(join(tmpdir(), "metash-sdk-ts-"));
  execFileSync(metash, ["-C", dir, "init"], { stdio: "ignore" });
  return dir;
}

test("state, progress and notifications round-trip through metash serve", { skip: why ?? false }, async () => {
  const dir = project();
  try {
    const client = MetashClient.start({ workspace: dir, metash });
    const seen = [];
    client.subscribe((r) => seen.push(r));
    const updated = client.waitForEvent((r) => r.kind === "state_update" && r.data.key === "variables.count");
    const { revision } = await client.updateState("variables.count", 41);
    assert.ok(revision >= 1);
    assert.equal((await updated).data.value, 41);
    assert.equal(await client.getState("variables.count"), 41);
    const state = await client.getState();
    assert.equal(state.variables.count, 41);
    // The event may come before or after the response: look in what was seen, then wait.
    const progressed = client.waitForEvent((r) => r.kind === "progress");
    const { seq } = await client.logProgress("half way", "warn");
    await progressed;
    const progress = seen.find((r) => r.seq === seq);
    assert.equal(progress.kind, "progress");
    // Concurrent requests are matched by id whatever order they come back in.
    const values = await Promise.all([1, 2, 3, 4, 5].map((n) => client.updateState(`variables.n${n}`, n)));
    assert.equal(new Set(values.map((v) => v.revision)).size, 5);
    assert.deepEqual(await Promise.all([1, 2, 3, 4, 5].map((n) => client.getState(`variables.n${n}`))), [1, 2, 3, 4, 5]);
    // Seqs are gapless and increasing: a client can tell what it has seen.
    const seqs = seen.map((r) => r.seq);
    assert.deepEqual(seqs, [...seqs].sort((a, b) => a - b));
    assert.equal(await client.pendingCheckpoint(), null);
    assert.deepEqual(await client.pendingConsent(), []);
    assert.equal(await client.close(), 0);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("the host's errors arrive as RpcError with their code and kind", { skip: why ?? false }, async () => {
  const dir = project();
  try {
    const client = MetashClient.start({ workspace: dir, metash });
    const expect = async (p, code, kind, words) => {
      await assert.rejects(p, (e) => {
        assert.ok(e instanceof RpcError, String(e));
        assert.equal(e.code, code);
        assert.equal(e.kind, kind);
        assert.match(e.message, words);
        return true;
      });
    };
    await expect(client.spawnAgent({ agent_name: "ghost", user_message: "hi" }), -32001, "unknown_agent", /ghost/);
    await expect(client.answerCheckpoint("yes"), -32002, "rejected", /no checkpoint is pending/);
    await expect(client.logProgress("x", "loud"), -32602, "invalid_params", /`level` must be one of/);
    await expect(client.call("noSuchMethod"), -32601, "method_not_found", /noSuchMethod/);
    await expect(client.updateState("nope.key", 1), -32002, "rejected", /nope/);
    // The server keeps serving after errors.
    assert.equal((await client.updateState("variables.after", true)).revision >= 1, true);
    assert.equal(await client.close(), 0);
    // After close, calls fail instead of hanging.
    await assert.rejects(client.getState(), (e) => e instanceof RpcError && e.kind === "closed");
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
