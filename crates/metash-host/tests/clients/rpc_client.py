#!/usr/bin/env python3
"""A JSON-RPC 2.0 client for metash's host (`metash serve --stdio`: NDJSON, one JSON object per
line), standard library only, and a scenario that exercises it end to end.

Two ways to reach a server:
  rpc_client.py [scenario options]                      the server is at the other end of this
                                                        process's own stdin/stdout (the Rust test
                                                        connects its in-process server there)
  rpc_client.py [scenario options] -- metash -C DIR serve --stdio
                                                        spawn the server and talk over its pipes

Scenario options:
  --spawn-agent NAME        also drive a full spawnAgent of NAME
  --message TEXT            its user_message (default "hello")
  --system TEXT             its system_prompt
  --expect-status STATUS    the AgentResponse status expected (default success)
  --expect-data TEXT        a substring expected in the AgentResponse data

Reports go to stderr; the exit code is 0 when every check passed, 1 otherwise.
"""

import argparse
import json
import os
import queue
import subprocess
import sys
import threading
import time


class RpcError(Exception):
    def __init__(self, error):
        super().__init__(f"{error.get('code')}: {error.get('message')}")
        self.code = error.get("code")
        self.message = error.get("message", "")
        self.data = error.get("data")


class Client:
    """Requests may be in flight concurrently; a reader thread routes responses by id and keeps
    notifications (`{"method": "event", "params": LogRecord}`) in `events`."""

    def __init__(self, reader, writer):
        self._reader = reader
        self._writer = writer
        self._write_lock = threading.Lock()
        self._next_id = 1
        self._waiting = {}
        self._lock = threading.Lock()
        self.events = []
        self._events_changed = threading.Condition()
        self.unmatched = queue.Queue()  # responses with a null id (parse errors, invalid requests)
        self.closed = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for raw in self._reader:
            line = raw.decode("utf-8").strip()
            if not line:
                continue
            try:
                msg = json.loads(line)
            except ValueError:
                print(f"FAIL the server wrote a line that is not JSON: {line[:200]!r}", file=sys.stderr)
                FAILURES.append("non-JSON output")
                continue
            if isinstance(msg, list):
                self.unmatched.put(msg)
            elif "method" in msg and "id" not in msg:
                with self._events_changed:
                    self.events.append(msg)
                    self._events_changed.notify_all()
            else:
                with self._lock:
                    box = self._waiting.pop(msg.get("id"), None)
                (box or self.unmatched).put(msg)
        self.closed.set()

    def send_line(self, text):
        with self._write_lock:
            self._writer.write(text.encode("utf-8") + b"\n")
            self._writer.flush()

    def start(self, method, params=None):
        """Sends a request and returns a queue its response will arrive on."""
        with self._lock:
            rid = self._next_id
            self._next_id += 1
            box = queue.Queue()
            self._waiting[rid] = box
        msg = {"jsonrpc": "2.0", "id": rid, "method": method}
        if params is not None:
            msg["params"] = params
        self.send_line(json.dumps(msg))
        return box

    @staticmethod
    def finish(box, timeout=120):
        msg = box.get(timeout=timeout)
        if "error" in msg:
            raise RpcError(msg["error"])
        return msg["result"]

    def call(self, method, params=None, timeout=120):
        return self.finish(self.start(method, params), timeout)

    def close(self, timeout=60):
        """Ends our side (the server sees EOF, answers what is in flight and ends its output);
        True when the server's output ended in time."""
        with self._write_lock:
            self._writer.flush()
            if self._writer is sys.stdout.buffer:
                os.close(sys.stdout.fileno())  # closing the Python object would keep fd 1 open
            else:
                self._writer.close()
        return self.closed.wait(timeout)

    def notify(self, method, params=None):
        msg = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            msg["params"] = params
        self.send_line(json.dumps(msg))

    def wait_event(self, pred, timeout=30):
        deadline = time.monotonic() + timeout
        with self._events_changed:
            while True:
                for e in self.events:
                    if pred(e["params"]):
                        return e["params"]
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._events_changed.wait(left)


FAILURES = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, file=sys.stderr)
    if not ok:
        FAILURES.append(what)


def expect_error(client, method, params, code, needle, what):
    try:
        client.call(method, params)
        check(False, f"{what}: expected error {code}, got a result")
    except RpcError as e:
        check(e.code == code and needle in e.message, f"{what}: {e.code} {e.message!r}")


def scenario(client, args):
    # updateState / getState round trip, and its event.
    rev = client.call("updateState", {"key": "variables.from_python", "value": {"lang": "python", "n": 1}})
    check(isinstance(rev.get("revision"), int), f"updateState -> revision {rev}")
    got = client.call("getState", {"key": "variables.from_python"})
    check(got == {"lang": "python", "n": 1}, f"getState -> {got}")
    whole = client.call("getState")
    check(whole.get("variables", {}).get("from_python") == got, "getState without key -> whole state")
    ev = client.wait_event(lambda r: r["kind"] == "state_update" and r["data"].get("key") == "variables.from_python")
    check(ev is not None, f"state_update event notification {ev and ev['seq']}")

    # logProgress and its event.
    logged = client.call("logProgress", {"message": "hello from python", "level": "warn"})
    ev = client.wait_event(lambda r: r["kind"] == "progress" and r["data"].get("message") == "hello from python")
    check(ev is not None and ev["seq"] == logged["seq"] and ev["data"]["level"] == "warn",
          f"progress event notification seq {logged}")

    # Bad input: each gets its JSON-RPC error, and the server keeps answering.
    expect_error(client, "noSuchMethod", {}, -32601, "noSuchMethod", "unknown method")
    expect_error(client, "getState", {"key": 7}, -32602, "`key`", "wrong type")
    expect_error(client, "updateState", {"key": "variables.x"}, -32602, "`value`", "missing field")
    expect_error(client, "answerCheckpoint", {"answer": "yes"}, -32002, "no checkpoint is pending",
                 "answer without a pending checkpoint")
    expect_error(client, "spawnAgent", {"agent_name": "no-such-agent-xyz", "user_message": "hi"},
                 -32001, "no-such-agent-xyz", "unknown agent")
    client.send_line('{"jsonrpc": "2.0", "id": 99, "method": ')
    msg = client.unmatched.get(timeout=30)
    check(msg.get("id") is None and msg["error"]["code"] == -32700, f"malformed JSON -> {msg['error']['code']}")
    check(client.call("getState", {"key": "variables.from_python"}) == got, "still serving after bad input")

    if args.spawn_agent:
        params = {"agent_name": args.spawn_agent, "user_message": args.message,
                  "options": {"timeout_seconds": 120}}
        if args.system is not None:
            params["system_prompt"] = args.system
        spawn = client.start("spawnAgent", params)
        # A long spawn must not hold up other requests.
        t0 = time.monotonic()
        client.call("getState", {"key": "variables.from_python"})
        check(True, f"getState answered during the spawn in {1000 * (time.monotonic() - t0):.1f} ms")
        resp = client.finish(spawn, timeout=180)
        check(resp.get("status") == args.expect_status, f"spawnAgent status {resp.get('status')}: {resp.get('data')!r}")
        if args.expect_data is not None:
            check(args.expect_data in resp.get("data", ""), f"spawnAgent data contains {args.expect_data!r}")
        meta = resp.get("metadata", {})
        check(isinstance(meta.get("tokens_used"), int) and isinstance(meta.get("duration_ms"), int),
              f"spawnAgent metadata {meta}")
        ev = client.wait_event(lambda r: r.get("agent") == args.spawn_agent)
        check(ev is not None, f"an event of the spawned agent arrived ({ev and ev['kind']})")
        kinds = sorted({e["params"]["kind"] for e in client.events if e["params"].get("agent") == args.spawn_agent})
        print(f"events of {args.spawn_agent}: {kinds}", file=sys.stderr)


def main():
    argv = sys.argv[1:]
    server_cmd = None
    if "--" in argv:
        i = argv.index("--")
        argv, server_cmd = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--spawn-agent")
    p.add_argument("--message", default="hello")
    p.add_argument("--system")
    p.add_argument("--expect-status", default="success")
    p.add_argument("--expect-data")
    args = p.parse_args(argv)

    proc = None
    if server_cmd:
        proc = subprocess.Popen(server_cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        client = Client(proc.stdout, proc.stdin)
    else:
        client = Client(sys.stdin.buffer, sys.stdout.buffer)
    try:
        scenario(client, args)
    except Exception as e:  # a timeout or a broken server: report, do not hang
        check(False, f"scenario raised {type(e).__name__}: {e}")
    print(f"{len(client.events)} event notifications received", file=sys.stderr)
    check(client.close(), "the server ended its output after our EOF")
    if proc is not None:
        code = proc.wait(timeout=60)
        check(code == 0, f"server exited with {code} on EOF")
    print(f"{'FAILED' if FAILURES else 'PASSED'}: {len(FAILURES)} failure(s)", file=sys.stderr)
    sys.stderr.flush()
    # Not sys.exit: our stdout is closed on purpose, and interpreter shutdown would trip on it.
    os._exit(1 if FAILURES else 0)


if __name__ == "__main__":
    main()
