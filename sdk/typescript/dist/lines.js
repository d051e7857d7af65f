// JSON lines in both directions: the framing shared by the agent protocol (an agent's stdio) and
// the host's JSON-RPC (`metash serve --stdio`). One value per line, UTF-8, `\n`-terminated.
import { createInterface } from "node:readline";
/** Reads lines from a stream into a queue; `next()` waits for one (or `null` at end of input). */
export class LineQueue {
    onLine;
    lines = [];
    waiters = [];
    ended = false;
    /** `onLine` sees every line as it arrives, before it is queued; returning false drops it. */
    constructor(input, onLine) {
        this.onLine = onLine;
        const rl = createInterface({ input, crlfDelay: Infinity });
        rl.on("line", (line) => this.push(line));
        rl.on("close", () => {
            this.ended = true;
            for (const w of this.waiters.splice(0))
                w(null);
        });
    }
    push(line) {
        if (line.trim() === "")
            return;
        if (this.onLine && !this.onLine(line))
            return;
        const waiter = this.waiters.shift();
        if (waiter)
            waiter(line);
        else
            this.lines.push(line);
    }
    /**
     * The next line, or `null` at end of input. With `timeoutMs`, `undefined` when none came in
     * time (the line, if it comes later, stays queued for the next call).
     */
    next(timeoutMs) {
        const queued = this.lines.shift();
        if (queued !== undefined)
            return Promise.resolve(queued);
        if (this.ended)
            return Promise.resolve(null);
        return new Promise((resolve) => {
            let timer;
            const waiter = (line) => {
                if (timer)
                    clearTimeout(timer);
                resolve(line);
            };
            this.waiters.push(waiter);
            if (timeoutMs !== undefined) {
                timer = setTimeout(() => {
                    const i = this.waiters.indexOf(waiter);
                    if (i >= 0)
                        this.waiters.splice(i, 1);
                    resolve(undefined);
                }, timeoutMs);
            }
        });
    }
}
/** Writes one JSON value per line, waiting for the stream to drain when its buffer is full. A
 * write to a stream that ended or failed rejects (never throws from an `error` event). */
export class LineWriter {
    out;
    failure = null;
    constructor(out) {
        this.out = out;
        out.on("error", (err) => {
            this.failure = err;
        });
    }
    write(value) {
        if (this.failure)
            return Promise.reject(this.failure);
        if (this.out.writableEnded || this.out.destroyed) {
            return Promise.reject(new Error("the stream is closed"));
        }
        const text = JSON.stringify(value) + "\n";
        return new Promise((resolve, reject) => {
            const ok = this.out.write(text, (err) => {
                if (err)
                    reject(err);
            });
            if (ok) {
                resolve();
                return;
            }
            const done = (err) => {
                this.out.off("drain", done);
                this.out.off("close", closed);
                if (err)
                    reject(err);
                else
                    resolve();
            };
            const closed = () => done(this.failure ?? new Error("the stream closed before draining"));
            this.out.on("drain", done);
            this.out.on("close", closed);
        });
    }
}
