"""A client for the host's JSON-RPC 2.0 (`metash serve --stdio`, docs/host-rpc.md).

An orchestrator in Python drives metash with it. Requests run concurrently on the server and are
matched by id (a reader thread dispatches answers, so calls from several threads are fine);
every event the host makes durable arrives as an `event` notification, given to subscribers.
"""

import json
import queue
import subprocess
import threading
from concurrent.futures import Future
from typing import IO, Any, Callable, Dict, List, Optional, Sequence

from .protocol import AgentResponse, LogRecord, PendingCheckpoint, ResumeData


class RpcError(Exception):
    """A JSON-RPC error from the host: `code` and `kind` as in docs/host-rpc.md ("Errors")."""

    def __init__(self, code: int, message: str, kind: Optional[str]):
        super().__init__(message)
        self.code = code
        self.message = message
        self.kind = kind


class MetashClient:
    """Connected to one `metash serve --stdio`; use `MetashClient.start(workspace)`."""

    def __init__(self, reader: IO[bytes], writer: IO[bytes], process: Optional[subprocess.Popen] = None):
        self._reader = reader
        self._writer = writer
        self._process = process
        self._lock = threading.Lock()
        self._next_id = 1
        self._pending: Dict[int, Future] = {}
        self._listeners: List[Callable[[LogRecord], None]] = []
        self._thread = threading.Thread(target=self._read, name="metash-rpc-reader", daemon=True)
        self._thread.start()

    @classmethod
    def start(
        cls,
        workspace: str,
        metash: str = "metash",
        serve_args: Sequence[str] = (),
        env: Optional[Dict[str, str]] = None,
    ) -> "MetashClient":
        """Starts `metash -C WORKSPACE serve --stdio --quiet [serve_args]` and connects to it."""
        process = subprocess.Popen(
            [metash, "-C", str(workspace), "serve", "--stdio", "--quiet", *serve_args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )
        assert process.stdin is not None and process.stdout is not None
        return cls(process.stdout, process.stdin, process)

    def __enter__(self) -> "MetashClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _read(self) -> None:
        for line in self._reader:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if not isinstance(msg, dict):
                continue
            if msg.get("method") == "event" and "id" not in msg:
                with self._lock:
                    listeners = list(self._listeners)
                for listener in listeners:
                    listener(msg.get("params"))
                continue
            with self._lock:
                future = self._pending.pop(msg.get("id"), None)
            if future is None:
                continue
            error = msg.get("error")
            if error:
                kind = (error.get("data") or {}).get("kind")
                future.set_exception(RpcError(error.get("code", -32000), error.get("message", ""), kind))
            else:
                future.set_result(msg.get("result"))
        with self._lock:
            pending, self._pending = self._pending, {}
        for future in pending.values():
            future.set_exception(RpcError(-32000, "the metash server closed the connection", "closed"))

    def call_async(self, method: str, params: Optional[Dict[str, Any]] = None) -> Future:
        """Sends a request; the Future resolves with its result or raises `RpcError`."""
        future: Future = Future()
        with self._lock:
            request_id = self._next_id
            self._next_id += 1
            self._pending[request_id] = future
            line = json.dumps({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params or {}})
            try:
                self._writer.write(line.encode("utf-8") + b"\n")
                self._writer.flush()
            except (OSError, ValueError) as e:  # closed by us, or the server is gone
                del self._pending[request_id]
                raise RpcError(-32000, f"could not send to the metash server: {e}", "closed") from e
        return future

    def call(self, method: str, params: Optional[Dict[str, Any]] = None, timeout: Optional[float] = None) -> Any:
        """Calls any method by name and waits for its result (the typed methods below are this)."""
        return self.call_async(method, params).result(timeout)

    def subscribe(self, listener: Callable[[LogRecord], None]) -> Callable[[], None]:
        """Every event the host makes durable (the log's record, `seq` gapless). Listeners run on
        the reader thread: keep them short. Returns an unsubscribe function."""
        with self._lock:
            self._listeners.append(listener)

        def unsubscribe() -> None:
            with self._lock:
                if listener in self._listeners:
                    self._listeners.remove(listener)

        return unsubscribe

    def events(self) -> "queue.Queue[LogRecord]":
        """A queue that receives every event from now on (`subscribe` into a `queue.Queue`)."""
        q: "queue.Queue[LogRecord]" = queue.Queue()
        self.subscribe(q.put)
        return q

    def spawn_agent(
        self,
        agent_name: str,
        user_message: str,
        system_prompt: Optional[str] = None,
        options: Optional[Dict[str, Any]] = None,
    ) -> AgentResponse:
        """seed 000's `spawn_agent`: a failure, timeout or checkpoint is a result (`status`)."""
        params: Dict[str, Any] = {"agent_name": agent_name, "user_message": user_message}
        if system_prompt is not None:
            params["system_prompt"] = system_prompt
        if options is not None:
            params["options"] = options
        return self.call("spawnAgent", params)

    def update_state(self, key: str, value: Any) -> Dict[str, int]:
        """Atomic `update_state` at a dotted path (`variables.retry_count`): `{revision}`."""
        return self.call("updateState", {"key": key, "value": value})

    def get_state(self, key: Optional[str] = None) -> Any:
        return self.call("getState", {} if key is None else {"key": key})

    def log_progress(self, message: str, level: str = "info") -> Dict[str, int]:
        return self.call("logProgress", {"message": message, "level": level})

    def pending_checkpoint(self) -> Optional[PendingCheckpoint]:
        return self.call("pendingCheckpoint")

    def answer_checkpoint(self, answer: str, checkpoint_id: Optional[str] = None) -> ResumeData:
        """Answers the pending checkpoint (an option, its 1-based number, or free text)."""
        params = {"answer": answer}
        if checkpoint_id is not None:
            params["checkpoint_id"] = checkpoint_id
        return self.call("answerCheckpoint", params)

    def pending_consent(self) -> List[Dict[str, Any]]:
        return self.call("pendingConsent")

    def answer_consent(self, id: str, answer: str, duration_s: Optional[int] = None) -> Dict[str, str]:
        """`answer`: `allow_once`, `allow_for` (with `duration_s`) or `deny`."""
        params: Dict[str, Any] = {"id": id, "answer": answer}
        if duration_s is not None:
            params["duration_s"] = duration_s
        return self.call("answerConsent", params)

    def suspend_agent(self, agent: str) -> Dict[str, Any]:
        return self.call("suspendAgent", {"agent": agent})

    def resume_agent(self, agent: str) -> Dict[str, Any]:
        return self.call("resumeAgent", {"agent": agent})

    def close(self, timeout: float = 30) -> Optional[int]:
        """Ends input (the server answers what is in flight, then exits); its exit code."""
        try:
            self._writer.close()
        except OSError:
            pass
        self._thread.join(timeout)
        if self._process is None:
            return None
        return self._process.wait(timeout)
