// The agent's channel inside a WASI 0.2 component (built with componentize-js against
// `sdk/wit`): stdin and stdout are `wasi:cli` streams, files go through `wasi:filesystem` under
// the workspace preopen. Reads block (a component cannot wait with a timeout here: `recv` and
// `untilRevoked` wait until a message or the end of input). Bundled for WASM, `@metash/sdk`
// resolves to this module (the `wasi` export condition), so an agent's source does not change.

import { getStdin } from "wasi:cli/stdin@0.2.12";
import { getStdout } from "wasi:cli/stdout@0.2.12";
import { getDirectories } from "wasi:filesystem/preopens@0.2.12";
import type { OutputStream } from "wasi:io/streams@0.2.12";

import { runAgentOn, type Channel, type Handler, type RunOptions } from "./agent.js";

export * from "./agent.js";
export type * from "./protocol.js";

/** WASI streams take at most this many bytes per blocking write. */
const WRITE_MAX = 4096;

function writeAll(out: OutputStream, bytes: Uint8Array): void {
  for (let i = 0; i < bytes.length; i += WRITE_MAX) {
    out.blockingWriteAndFlush(bytes.subarray(i, i + WRITE_MAX));
  }
}

/** A channel over the component's stdin/stdout and its preopened directories. */
export function wasiChannel(): Channel {
  const input = getStdin();
  const output = getStdout();
  const encoder = new TextEncoder();
  const decoder = new TextDecoder();
  let buffered = "";
  let ended = false;
  return {
    async next() {
      for (;;) {
        const nl = buffered.indexOf("\n");
        if (nl >= 0) {
          const line = buffered.slice(0, nl);
          buffered = buffered.slice(nl + 1);
          return line;
        }
        if (ended) {
          const rest = buffered;
          buffered = "";
          return rest === "" ? null : rest;
        }
        try {
          buffered += decoder.decode(input.blockingRead(65536n), { stream: true });
        } catch {
          ended = true; // `closed`: the host ended the invocation's input
        }
      }
    },
    async write(value) {
      writeAll(output, encoder.encode(JSON.stringify(value) + "\n"));
    },
    async writeFile(workspace, path, data) {
      const full = path.startsWith("/") ? path : `${workspace.replace(/\/$/, "")}/${path}`;
      const preopen = getDirectories()
        .filter(([, dir]) => full === dir || full.startsWith(dir.replace(/\/$/, "") + "/"))
        .sort((a, b) => b[1].length - a[1].length)[0];
      if (!preopen) throw new Error(`${full} is outside every directory this component was given`);
      const [dir, at] = preopen;
      const relative = full.slice(at.replace(/\/$/, "").length + 1);
      const file = dir.openAt({ symlinkFollow: false }, relative, { create: true, truncate: true }, { write: true });
      writeAll(file.writeViaStream(0n), encoder.encode(data));
      return full;
    },
  };
}

/** `runAgent` inside a WASI component: the same loop, over `wasiChannel()`. */
export function runAgent(handler: Handler, options: RunOptions = {}): Promise<void> {
  return runAgentOn(wasiChannel(), handler, options);
}
