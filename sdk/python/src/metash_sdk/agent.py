"""The agent side of metash's agent protocol (docs/agent-protocol.md).

An agent reads JSON lines from the host on stdin and writes JSON lines on stdout. `run_agent`
hides the framing; a `Session` is the agent's handle for one invocation, with one method per
thing an agent can say. Standard library only, and no threads, so the same agent runs natively
and as a WASI component (componentize-py).
"""

import json
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Callable, Dict, List, Optional, Union

from .protocol import AgentEvent, CheckpointReason, ResumeData

PROTOCOL_VERSION = "0.1"
"""The event protocol version this SDK speaks; a message with another is refused."""

CHUNK_BYTES = 16 * 1024


class AgentError(Exception):
    """The host refused something (`state_denied`, ...) or went away before answering."""

    def __init__(self, code: str, message: str, hint: Optional[str] = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.hint = hint


@dataclass
class Context:
    """What the host's `start` said: who the agent is and what it was granted."""

    agent_id: str = ""
    workspace: Optional[str] = None
    """Present only with `files.read`/`files.write`: `/workspace` in WASM, the real path natively."""
    config: Dict[str, Any] = field(default_factory=dict)
    """The spawn's config: `system_prompt`, `resume_data`, `task_id`, `options`."""
    capabilities: List[str] = field(default_factory=list)
    """Granted now; kept current as grants and revocations arrive."""


@dataclass
class Input:
    """One `invoke(input)`."""

    prompt: str
    context_refs: List[str] = field(default_factory=list)


@dataclass
class Consent:
    """The host's answer to `Session.request_consent`."""

    granted: bool
    capability: str
    expires_at: Optional[str] = None
    code: Optional[str] = None
    message: Optional[str] = None
    hint: Optional[str] = None


class _Lines:
    """Lines from the host. On a real file descriptor, reads wait with `select` so `recv` can time
    out; elsewhere (WASI without `select`, in-memory streams) they block."""

    def __init__(self, stream: BinaryIO):
        self.stream = stream
        self.buf = b""
        self.eof = False
        self.fd: Optional[int] = None
        self.select: Optional[Callable[..., Any]] = None
        if sys.platform == "wasi":  # a WASI component: blocking reads (no select on stdin)
            return
        try:
            self.fd = stream.fileno()
            import select

            self.select = select.select
        except (AttributeError, OSError, ValueError, ImportError):  # BytesIO and the like
            self.fd = None

    def next(self, timeout: Optional[float]) -> Optional[bytes]:
        """The next line (without its newline); None at end of input. Raises TimeoutError."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            nl = self.buf.find(b"\n")
            if nl >= 0:
                line, self.buf = self.buf[:nl], self.buf[nl + 1 :]
                return line
            if self.eof:
                if self.buf:
                    line, self.buf = self.buf, b""
                    return line
                return None
            if self.fd is None or self.select is None:
                chunk = self.stream.readline()
            else:
                if deadline is not None:
                    left = deadline - time.monotonic()
                    if left <= 0 or not self.select([self.fd], [], [], left)[0]:
                        raise TimeoutError("no message from the host in time")
                chunk = os.read(self.fd, 65536)
            if not chunk:
                self.eof = True
            self.buf += chunk


class StateView:
    """Key-value access in one scope; `get` returns `default` when nothing is stored."""

    def __init__(self, session: "Session", scope: str):
        self._session = session
        self._scope = scope

    def get(self, key: str, default: Any = None) -> Any:
        return self._session.state_get(key, self._scope, default)

    def set(self, key: str, value: Any) -> None:
        self._session.state_update(key, value, self._scope)


class Session:
    """The agent's handle: every method writes one protocol line (or waits for the host's answer)."""

    def __init__(self, lines: _Lines, out: BinaryIO):
        self._lines = lines
        self._out = out
        self._streams = 0
        self._invocation = 0
        self._revoke_listeners: List[Callable[[str], None]] = []
        self.ended = False
        """The handler already ended the invocation (`done` or `checkpoint`)."""
        self.context = Context()
        self.kv = StateView(self, "agent")
        """The agent's own key-value memory (needs `memory`)."""
        self.scratchpad = StateView(self, "scratchpad")
        """The scratchpad shared by the project's agents (needs `memory`)."""

    def granted(self, capability: str) -> bool:
        """Whether `capability` is granted now (the host enforces it anyway; this is for fallbacks)."""
        return capability in self.context.capabilities

    def on_revoke(self, listener: Callable[[str], None]) -> None:
        """Called with the capability when a `consent_revoke` is read (it is already gone)."""
        self._revoke_listeners.append(listener)

    @property
    def resume_data(self) -> Optional[ResumeData]:
        """The answer to this agent's last checkpoint, delivered once to the next spawn."""
        return (self.context.config or {}).get("resume_data")

    def send(self, event: Dict[str, Any]) -> None:
        """Writes any event, framed with the protocol version."""
        if event.get("type") in ("done", "checkpoint"):
            self.ended = True
        line = json.dumps({"schema_version": PROTOCOL_VERSION, **event}, ensure_ascii=False)
        self._out.write(line.encode("utf-8") + b"\n")
        self._out.flush()

    def output(self, content_type: str, data: str) -> None:
        """One output card, in chunks of at most 16 KiB (`"<stream>:<seq>"` ids)."""
        self._streams += 1
        stream = f"i{self._invocation}s{self._streams}"
        for seq, piece in enumerate(_split_utf8(data, CHUNK_BYTES)):
            self.output_chunk(stream, seq, content_type, piece)

    def output_chunk(self, stream: str, seq: int, content_type: str, data: str) -> None:
        """One chunk of a stream the agent numbers itself (output produced as it computes)."""
        self.send(
            {
                "type": "output",
                "agent_id": self.context.agent_id,
                "chunk_id": f"{stream}:{seq}",
                "content_type": content_type,
                "data": data,
            }
        )

    def artifact(self, id: str, kind: str, path: str, preview_hint: Optional[str] = None) -> None:
        """Announces a file written in the workspace; the host copies it to the artifact store."""
        event: Dict[str, Any] = {"type": "artifact", "id": id, "kind": kind, "path": path}
        if preview_hint is not None:
            event["preview_hint"] = preview_hint
        self.send(event)

    def error(self, code: str, message: str, hint: Optional[str] = None) -> None:
        """Reports an error; the invocation still ends with `done`."""
        event: Dict[str, Any] = {"type": "error", "code": code, "message": message}
        if hint is not None:
            event["hint"] = hint
        self.send(event)

    def done(self, status: str = "success", summary: Optional[str] = None) -> None:
        """Ends the invocation (sent for you when the handler returns without one)."""
        event: Dict[str, Any] = {"type": "done", "status": status}
        if summary is not None:
            event["summary"] = summary
        self.send(event)

    def checkpoint(
        self,
        reason: CheckpointReason,
        message: str,
        options: Union[List[str], tuple] = (),
        resume_id: Optional[str] = None,
    ) -> None:
        """Stops for a human (seed 000's checkpoint); ends the invocation. The answer comes to the
        next spawn as `session.resume_data`."""
        event: Dict[str, Any] = {"type": "checkpoint", "reason": reason, "message": message, "options": list(options)}
        if resume_id is not None:
            event["resume_id"] = resume_id
        self.send(event)

    def request_consent(self, capability: str, reason: str, duration_s: Optional[int] = None) -> Consent:
        """Asks the user, through the host, for `capability` and waits for the answer."""
        event: Dict[str, Any] = {"type": "consent_request", "capability": capability, "reason": reason}
        if duration_s is not None:
            event["duration_s"] = duration_s
        self.send(event)
        while True:
            answer = self.recv()
            if answer is None:
                raise AgentError("host_gone", "the host closed stdin before answering the consent request")
            if answer["type"] == "consent_grant":
                return Consent(True, capability, expires_at=answer.get("expires_at"))
            if answer["type"] == "error":
                return Consent(False, capability, code=answer["code"], message=answer["message"], hint=answer.get("hint"))

    def state_get(self, key: str, scope: str = "agent", default: Any = None) -> Any:
        """What is stored under `key` (`default` when nothing is); an empty key reads the whole
        namespace. Raises `AgentError` `state_denied` without a `memory` grant."""
        self.send({"type": "state_get", "key": key, "scope": scope})
        while True:
            answer = self.recv()
            if answer is None:
                raise AgentError("host_gone", "the host closed stdin before answering the state_get")
            if answer["type"] == "state_value" and answer.get("key") == key:
                return answer.get("value") if answer.get("found") else default
            if answer["type"] == "error" and answer.get("code") == "state_denied":
                raise AgentError("state_denied", answer.get("message", ""), answer.get("hint"))

    def state_update(self, key: str, value: Any, scope: str = "agent") -> None:
        """Persists a value through the host (the only way agents persist state)."""
        self.send({"type": "state_update", "key": key, "value": value, "scope": scope})

    def recv(self, timeout: Optional[float] = None) -> Optional[AgentEvent]:
        """The host's next message (an answer, a `consent_revoke`, an `error` notice); None at end
        of input. With `timeout` (seconds), raises TimeoutError when none came in time."""
        while True:
            line = self._lines.next(timeout)
            if line is None:
                return None
            event = self._screen(line)
            if event is not None:
                return event

    def until_revoked(self, capability: str, timeout: float) -> bool:
        """Waits until `capability` is revoked; False when `timeout` seconds pass first."""
        deadline = time.monotonic() + timeout
        while self.granted(capability):
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            try:
                if self.recv(left) is None:
                    return False
            except TimeoutError:
                return False
        return True

    def _screen(self, line: bytes) -> Optional[AgentEvent]:
        """The version first, then grants and revocations applied; None drops the line."""
        if not line.strip():
            return None
        try:
            msg = json.loads(line)
        except ValueError as e:
            self.error("bad_message", f"not JSON: {e}")
            return None
        if not isinstance(msg, dict) or not isinstance(msg.get("type"), str):
            self.error("bad_message", "a message must be an object with a string `type`")
            return None
        if msg.get("schema_version") != PROTOCOL_VERSION:
            self.error(
                "unsupported_version",
                f"schema_version {json.dumps(msg.get('schema_version'))} is not supported "
                f"(this agent speaks {PROTOCOL_VERSION})",
            )
            return None
        cap = msg.get("capability")
        if msg["type"] == "consent_revoke" and isinstance(cap, str):
            self.context.capabilities = [c for c in self.context.capabilities if c != cap]
            for listener in self._revoke_listeners:
                listener(cap)
        elif msg["type"] == "consent_grant" and isinstance(cap, str) and not self.granted(cap):
            self.context.capabilities.append(cap)
        return msg  # type: ignore[return-value]

    def _begin(self) -> None:
        self._invocation += 1
        self._streams = 0
        self.ended = False


def _split_utf8(text: str, limit: int) -> List[str]:
    data = text.encode("utf-8")
    if len(data) <= limit:
        return [text]
    out = []
    start = 0
    while start < len(data):
        end = min(start + limit, len(data))
        while end < len(data) and (data[end] & 0xC0) == 0x80:
            end -= 1
        out.append(data[start:end].decode("utf-8"))
        start = end
    return out


Handler = Callable[[Session, Input], None]


def run_agent(
    handler: Handler,
    on_shutdown: Optional[Callable[[Session], None]] = None,
    input: Optional[BinaryIO] = None,
    output: Optional[BinaryIO] = None,
) -> None:
    """Runs the agent loop: `handler` is called once per `input`; `done` is sent after it returns
    (with `status: "error"` and an `error` event when it raises). Returns when the host sends
    `shutdown` (after `on_shutdown`, seed 002's hook) or closes stdin."""
    session = Session(_Lines(input or sys.stdin.buffer), output or sys.stdout.buffer)
    while True:
        event = session.recv()
        if event is None:
            return
        kind = event["type"]
        if kind == "start":
            session.context = Context(
                agent_id=event["agent_id"],
                workspace=event.get("workspace"),
                config=event.get("config") or {},
                capabilities=list(event.get("capabilities") or []),
            )
        elif kind == "input":
            session._begin()
            status = None
            try:
                handler(session, Input(event["prompt"], list(event.get("context_refs") or [])))
            except Exception as e:  # the agent's failure is reported, not a crash of the loop
                session.error(e.code if isinstance(e, AgentError) else "agent_error", str(e))
                status = "error"
            if not session.ended:
                session.send({"type": "done", **({"status": status} if status else {})})
        elif kind == "shutdown":
            if on_shutdown is not None:
                try:
                    on_shutdown(session)
                except Exception as e:
                    session.error("shutdown_failed", str(e))
            return
