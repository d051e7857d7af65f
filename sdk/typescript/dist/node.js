// The agent's channel on Node: stdin read ahead line by line (so revocations apply on arrival),
// stdout written with backpressure, files through `node:fs`.
import { mkdir, writeFile } from "node:fs/promises";
import { dirname, isAbsolute, join } from "node:path";
import { runAgentOn } from "./agent.js";
import { LineQueue, LineWriter } from "./lines.js";
/** A channel over a pair of Node streams. */
export function nodeChannel(input, output) {
    let screen = () => true;
    const queue = new LineQueue(input, (line) => screen(line));
    const writer = new LineWriter(output);
    return {
        next: (timeoutMs) => queue.next(timeoutMs),
        write: (value) => writer.write(value),
        async writeFile(workspace, path, data) {
            const full = isAbsolute(path) ? path : join(workspace, path);
            await mkdir(dirname(full), { recursive: true });
            await writeFile(full, data);
            return full;
        },
        screenOnArrival(s) {
            screen = s;
        },
    };
}
/**
 * Runs the agent loop on stdin/stdout: `handler` is called once per `input`; `done` is sent after
 * it returns (with `status: "error"` and an `error` event when it throws). Resolves when the host
 * sends `shutdown` or closes stdin.
 */
export function runAgent(handler, options = {}) {
    const channel = nodeChannel(options.input ?? process.stdin, options.output ?? process.stdout);
    return runAgentOn(channel, handler, options);
}
