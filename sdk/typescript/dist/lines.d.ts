import type { Readable, Writable } from "node:stream";
/** Reads lines from a stream into a queue; `next()` waits for one (or `null` at end of input). */
export declare class LineQueue {
    private readonly onLine?;
    private lines;
    private waiters;
    private ended;
    /** `onLine` sees every line as it arrives, before it is queued; returning false drops it. */
    constructor(input: Readable, onLine?: ((line: string) => boolean) | undefined);
    private push;
    /**
     * The next line, or `null` at end of input. With `timeoutMs`, `undefined` when none came in
     * time (the line, if it comes later, stays queued for the next call).
     */
    next(timeoutMs?: number): Promise<string | null | undefined>;
}
/** Writes one JSON value per line, waiting for the stream to drain when its buffer is full. A
 * write to a stream that ended or failed rejects (never throws from an `error` event). */
export declare class LineWriter {
    private readonly out;
    private failure;
    constructor(out: Writable);
    write(value: unknown): Promise<void>;
}
