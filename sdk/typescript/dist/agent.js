// The agent side of metash's agent protocol (docs/agent-protocol.md): JSON lines on stdin from
// the host, JSON lines on stdout to it. `runAgent` hides the framing; a `Session` is the agent's
// handle for one invocation, with one method per thing an agent can say.
/** The event protocol version this SDK speaks; a message with another is refused. */
export const PROTOCOL_VERSION = "0.1";
/** The host refused something (`state_denied`, …) or went away before answering. */
export class AgentError extends Error {
    code;
    hint;
    constructor(code, message, hint) {
        super(message);
        this.code = code;
        this.hint = hint;
        this.name = "AgentError";
    }
}
export class Session {
    channel;
    streams = 0;
    invocation = 0;
    /** The invocation was ended by the handler (`done` or `checkpoint`). */
    ended = false;
    revokeListeners = [];
    context = { agentId: "", workspace: null, config: {}, capabilities: [] };
    /** Lines are screened by the channel as they arrive (else when read). */
    screened;
    /** @internal */
    constructor(channel) {
        this.channel = channel;
        this.screened = channel.screenOnArrival !== undefined;
        channel.screenOnArrival?.((line) => this.screen(line));
    }
    /** Whether `capability` is granted now (the host enforces it anyway; this is for fallbacks). */
    granted(capability) {
        return this.context.capabilities.includes(capability);
    }
    /** Called the moment a grant is revoked or expires (before any other reading). */
    onRevoke(listener) {
        this.revokeListeners.push(listener);
    }
    /** The answer to this agent's last checkpoint, delivered once to the next spawn. */
    get resumeData() {
        return this.context.config?.resume_data ?? null;
    }
    /** Writes any event, framed with the protocol version. */
    send(event) {
        if (event.type === "done" || event.type === "checkpoint")
            this.ended = true;
        return this.channel.write({ schema_version: PROTOCOL_VERSION, ...event });
    }
    /** One output card, split into chunks of at most 16 KiB (`"<stream>:<seq>"` ids). */
    async output(contentType, data) {
        this.streams += 1;
        const stream = `i${this.invocation}s${this.streams}`;
        const chunks = splitUtf8(data, 16 * 1024);
        for (let seq = 0; seq < chunks.length; seq++) {
            await this.outputChunk(stream, seq, contentType, chunks[seq]);
        }
    }
    /** One chunk of a stream the agent numbers itself (for output produced as it computes). */
    outputChunk(stream, seq, contentType, data) {
        return this.send({
            type: "output",
            agent_id: this.context.agentId,
            chunk_id: `${stream}:${seq}`,
            content_type: contentType,
            data,
        });
    }
    /** Writes `data` to `path` in the workspace (relative to it, or absolute inside it), the same
     * way natively and in WASM; returns the path the agent sees (for `artifact`). Needs
     * `files.write`. */
    async writeFile(path, data) {
        const workspace = this.context.workspace;
        if (!workspace)
            throw new AgentError("no_workspace", "no workspace was granted (files.write)");
        return this.channel.writeFile(workspace, path, data);
    }
    /** Announces a file the agent wrote in its workspace; the host copies it to the artifact store. */
    artifact(id, kind, path, previewHint) {
        return this.send({ type: "artifact", id, kind, path, preview_hint: previewHint ?? null });
    }
    /** Reports an error; the invocation still ends with `done`. */
    error(code, message, hint) {
        return this.send({ type: "error", code, message, hint: hint ?? null });
    }
    /** Ends the invocation (the SDK sends `done` itself when the handler returns without one). */
    done(status = "success", summary) {
        return this.send({ type: "done", status, summary: summary ?? null });
    }
    /** Stops for a human (seed 000's checkpoint); ends the invocation. The answer comes to the
     * next spawn as `session.resumeData`. */
    checkpoint(reason, message, options = [], resumeId) {
        return this.send({ type: "checkpoint", reason, message, options, resume_id: resumeId ?? null });
    }
    /** Asks the user, through the host, for `capability` and waits for the answer. */
    async requestConsent(capability, reason, durationS) {
        await this.send({ type: "consent_request", capability, reason, duration_s: durationS ?? null });
        for (;;) {
            const event = await this.recv();
            if (event == null)
                throw new AgentError("host_gone", "the host closed stdin before answering the consent request");
            if (event.type === "consent_grant")
                return { granted: true, capability, expiresAt: event.expires_at ?? null };
            if (event.type === "error") {
                return { granted: false, capability, code: event.code, message: event.message, hint: event.hint ?? null };
            }
        }
    }
    /** Reads what is stored under `key` (`undefined` when nothing is); an empty key reads the
     * whole namespace. Throws `AgentError` `state_denied` without a `memory` grant. */
    async stateGet(key, scope = "agent") {
        await this.send({ type: "state_get", key, scope });
        for (;;) {
            const event = await this.recv();
            if (event == null)
                throw new AgentError("host_gone", "the host closed stdin before answering the state_get");
            if (event.type === "state_value" && event.key === key)
                return event.found ? event.value : undefined;
            if (event.type === "error" && event.code === "state_denied") {
                throw new AgentError(event.code, event.message, event.hint);
            }
        }
    }
    /** Persists a value through the host (the only way agents persist state). */
    stateUpdate(key, value, scope = "agent") {
        return this.send({ type: "state_update", key, value, scope });
    }
    /** The agent's own key-value memory (needs `memory`). */
    kv = {
        get: (key) => this.stateGet(key, "agent"),
        set: (key, value) => this.stateUpdate(key, value, "agent"),
    };
    /** The scratchpad shared by the project's agents (needs `memory`). */
    scratchpad = {
        get: (key) => this.stateGet(key, "scratchpad"),
        set: (key, value) => this.stateUpdate(key, value, "scratchpad"),
    };
    /**
     * The host's next message: an answer, a `consent_revoke`, or an `error` notice of an action
     * it refused. `null` at end of input; with `timeoutMs`, `undefined` when none came in time.
     */
    async recv(timeoutMs) {
        for (;;) {
            const line = await this.channel.next(timeoutMs);
            if (line === null || line === undefined)
                return line;
            if (this.screened || this.screen(line))
                return JSON.parse(line);
        }
    }
    /** Waits until `capability` is revoked (or `timeoutMs` passes: false). */
    async untilRevoked(capability, timeoutMs) {
        const deadline = Date.now() + timeoutMs;
        while (this.granted(capability)) {
            const left = deadline - Date.now();
            if (left <= 0)
                return false;
            const event = await this.recv(left);
            if (event === null)
                return false;
        }
        return true;
    }
    /** @internal Checks one line from the host before anyone reads it: the version first, then
     * grants and revocations applied at once. False drops the line. */
    screen(line) {
        let msg;
        try {
            msg = JSON.parse(line);
        }
        catch (e) {
            void this.error("bad_message", `not JSON: ${e.message}`);
            return false;
        }
        if (msg === null || typeof msg !== "object" || typeof msg.type !== "string") {
            void this.error("bad_message", "a message must be an object with a string `type`");
            return false;
        }
        if (msg.schema_version !== PROTOCOL_VERSION) {
            void this.error("unsupported_version", `schema_version ${JSON.stringify(msg.schema_version)} is not supported (this agent speaks ${PROTOCOL_VERSION})`);
            return false;
        }
        const capability = typeof msg.capability === "string" ? msg.capability : null;
        if (msg.type === "consent_revoke" && capability) {
            this.context.capabilities = this.context.capabilities.filter((c) => c !== capability);
            const expiresAt = typeof msg.expires_at === "string" ? msg.expires_at : null;
            for (const l of this.revokeListeners)
                l({ capability, expiresAt });
        }
        else if (msg.type === "consent_grant" && capability && !this.granted(capability)) {
            this.context.capabilities.push(capability);
        }
        return true;
    }
    /** @internal */
    begin() {
        this.invocation += 1;
        this.streams = 0;
        this.ended = false;
    }
}
/** Splits `text` into pieces of at most `max` UTF-8 bytes, never inside a character. */
function splitUtf8(text, max) {
    const bytes = new TextEncoder().encode(text);
    if (bytes.length <= max)
        return [text];
    const decoder = new TextDecoder();
    const out = [];
    let start = 0;
    while (start < bytes.length) {
        let end = Math.min(start + max, bytes.length);
        while (end < bytes.length && (bytes[end] & 0xc0) === 0x80)
            end -= 1;
        out.push(decoder.decode(bytes.subarray(start, end)));
        start = end;
    }
    return out;
}
/**
 * The agent loop over `channel`: `handler` is called once per `input`; `done` is sent after it
 * returns (with `status: "error"` and an `error` event when it throws). Resolves when the host
 * sends `shutdown` or closes its input. `runAgent` is this over the platform's channel.
 */
export async function runAgentOn(channel, handler, options = {}) {
    const session = new Session(channel);
    for (;;) {
        const event = await session.recv();
        if (event === null || event === undefined)
            return;
        if (event.type === "start") {
            Object.assign(session.context, {
                agentId: event.agent_id,
                workspace: event.workspace ?? null,
                config: event.config ?? {},
                capabilities: [...(event.capabilities ?? [])],
            });
        }
        else if (event.type === "input") {
            session.begin();
            let status;
            try {
                await handler(session, { prompt: event.prompt, contextRefs: event.context_refs ?? [] });
            }
            catch (e) {
                const code = e instanceof AgentError ? e.code : "agent_error";
                await session.error(code, e instanceof Error ? e.message : String(e));
                status = "error";
            }
            if (!session.ended)
                await session.send({ type: "done", status: status ?? null, summary: null });
        }
        else if (event.type === "shutdown") {
            try {
                await options.onShutdown?.(session);
            }
            catch (e) {
                await session.error("shutdown_failed", e instanceof Error ? e.message : String(e));
            }
            return;
        }
    }
}
