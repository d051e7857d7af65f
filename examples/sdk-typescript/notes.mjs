// @ts-check
// A notes agent written with @metash/sdk: it greets, asks for `memory` and remembers the prompt
// (read back from the host), shares it on the scratchpad, writes a report into its workspace and
// announces it as an artifact, notices when `memory` is revoked and falls back, and asks a human
// whether to publish (a checkpoint). Spawned again after the answer, it acts on it. Nothing here
// is Node-specific: `agent.mjs` runs it natively, `build-wasm.sh` makes it a WASI component.
import { AgentError } from "@metash/sdk";

/** @param {import("@metash/sdk").Session} session @param {import("@metash/sdk").Input} input */
export async function notes(session, input) {
  const resume = session.resumeData;
  if (resume) {
    await session.output("text/plain", `resumed with answer: ${resume.user_input}`);
    return;
  }
  await session.output("text/markdown", `# notes (TypeScript)\n\nyou said: ${input.prompt}`);

  const consent = await session.requestConsent("memory", "remember your last prompt", 600);
  if (consent.granted) {
    await session.kv.set("last_prompt", input.prompt);
    await session.output("text/plain", `kv read back: ${await session.kv.get("last_prompt")}`);
    await session.scratchpad.set("notes.typescript", input.prompt);
    await session.output("text/plain", `scratchpad read back: ${await session.scratchpad.get("notes.typescript")}`);
  } else {
    await session.output("text/plain", `no memory (${consent.code}): not remembering`);
  }

  if (session.context.workspace && session.granted("files.write")) {
    const path = await session.writeFile("notes-typescript.md", `# notes\n\n- ${input.prompt}\n`);
    await session.artifact("notes-typescript", "text/markdown", path);
  }

  if (input.prompt.includes("wait for revoke") && session.granted("memory")) {
    await session.output("text/plain", "waiting for memory to be revoked");
    if (await session.untilRevoked("memory", 60_000)) {
      await session.output("text/plain", "memory revoked: falling back to no memory");
      try {
        await session.kv.get("last_prompt");
        await session.output("text/plain", "kv still readable after revocation");
      } catch (e) {
        if (!(e instanceof AgentError)) throw e;
        await session.output("text/plain", `kv refused after revocation: ${e.code}`);
      }
    }
  }

  await session.checkpoint("decision_required", "publish the notes?", ["publish", "discard"]);
}
