"""The agent helper against a scripted host over real OS pipes (the agent loop runs in a thread)."""

import json
import os
import threading
import time

import pytest

from metash_sdk import PROTOCOL_VERSION, AgentError, run_agent

START = {
    "type": "start",
    "agent_id": "a1",
    "config": {"resume_data": {"checkpoint_id": "c1", "user_input": "ship"}},
    "capabilities": ["files.read"],
}


class Host:
    """The host's ends of the agent's stdin and stdout."""

    def __init__(self, handler, on_shutdown=None):
        to_r, self.to_agent = os.pipe()
        self.from_agent, from_w = os.pipe()
        self.agent_in = os.fdopen(to_r, "rb", buffering=0)
        self.agent_out = os.fdopen(from_w, "wb")
        self.read = os.fdopen(self.from_agent, "rb")
        self.seen = []
        self.error = None

        def loop():
            try:
                run_agent(handler, on_shutdown, input=self.agent_in, output=self.agent_out)
            except BaseException as e:  # surfaced by finish()
                self.error = e
            finally:
                self.agent_out.close()

        self.thread = threading.Thread(target=loop, daemon=True)
        self.thread.start()

    def send(self, msg):
        self.raw(json.dumps({"schema_version": PROTOCOL_VERSION, **msg}))

    def raw(self, line):
        os.write(self.to_agent, line.encode() + b"\n")

    def until(self, kind):
        """Reads the agent's messages up to the first of type `kind` (or error code `kind`)."""
        for line in self.read:
            msg = json.loads(line)
            self.seen.append(msg)
            if msg["type"] == kind or msg.get("code") == kind:
                return msg
        raise AssertionError(f"the agent never wrote {kind}; it wrote {self.seen}")

    def finish(self):
        os.close(self.to_agent)
        self.thread.join(10)
        for line in self.read:
            self.seen.append(json.loads(line))
        if self.error:
            raise self.error
        return self.seen


def test_an_input_gets_its_output_and_one_done():
    def handler(s, i):
        assert s.context.agent_id == "a1"
        assert s.granted("files.read")
        assert s.resume_data["user_input"] == "ship"
        s.output("text/plain", f"you said: {i.prompt}")

    h = Host(handler)
    h.send(START)
    h.send({"type": "input", "agent_id": "a1", "prompt": "hi"})
    out = h.finish()
    assert [m["type"] for m in out] == ["output", "done"]
    assert out[0]["chunk_id"] == "i1s1:0" and out[0]["data"] == "you said: hi"
    assert all(m["schema_version"] == "0.1" for m in out)


def test_big_output_is_split_on_character_boundaries():
    big = "é" * 20000
    h = Host(lambda s, i: s.output("text/plain", big))
    h.send(START)
    h.send({"type": "input", "agent_id": "a1", "prompt": "x"})
    chunks = [m for m in h.finish() if m["type"] == "output"]
    assert [c["chunk_id"] for c in chunks] == ["i1s1:0", "i1s1:1", "i1s1:2"]
    assert all(len(c["data"].encode()) <= 16 * 1024 for c in chunks)
    assert "".join(c["data"] for c in chunks) == big


def test_consent_answers_in_order_and_a_refusal_carries_code_and_hint():
    answers = []

    def handler(s, i):
        answers.append(s.request_consent("network:api.github.com", "fetch", 600))
        answers.append(s.request_consent("files.write", "save"))
        assert s.granted("network:api.github.com")

    h = Host(handler)
    h.send(START)
    h.send({"type": "input", "agent_id": "a1", "prompt": "go"})
    assert h.until("consent_request")["duration_s"] == 600
    h.send({"type": "consent_grant", "capability": "network:api.github.com", "expires_at": "2030-01-01T00:00:00Z"})
    h.until("consent_request")
    h.send({"type": "error", "code": "consent_denied", "message": "no", "hint": "later"})
    h.finish()
    assert answers[0].granted and answers[0].expires_at == "2030-01-01T00:00:00Z"
    assert not answers[1].granted
    assert (answers[1].code, answers[1].message, answers[1].hint) == ("consent_denied", "no", "later")


def test_a_revocation_is_heard_while_waiting_and_a_wait_can_time_out():
    results = []
    heard = []

    def handler(s, i):
        s.on_revoke(heard.append)
        s.request_consent("memory", "remember", 60)
        s.output("text/plain", "waiting")
        results.append(s.until_revoked("memory", 10))
        s.context.capabilities.append("network")
        started = time.monotonic()
        results.append(s.until_revoked("network", 0.05))
        results.append(time.monotonic() - started < 5)

    h = Host(handler)
    h.send(START)
    h.send({"type": "input", "agent_id": "a1", "prompt": "go"})
    h.until("consent_request")
    h.send({"type": "consent_grant", "capability": "memory"})
    h.until("output")
    h.send({"type": "consent_revoke", "capability": "memory"})
    h.until("done")
    h.finish()
    assert results == [True, False, True]
    assert heard == ["memory"]


def test_state_reads_wait_for_their_value_and_a_refusal_raises():
    seen = []

    def handler(s, i):
        s.kv.set("last", {"n": 1})
        seen.append(s.kv.get("last"))
        seen.append(s.scratchpad.get("missing", "none"))
        with pytest.raises(AgentError) as e:
            s.kv.get("x")
        seen.append(e.value.code)

    h = Host(handler)
    h.send(START)
    h.send({"type": "input", "agent_id": "a1", "prompt": "go"})
    assert h.until("state_update") == {
        "schema_version": "0.1",
        "type": "state_update",
        "key": "last",
        "value": {"n": 1},
        "scope": "agent",
    }
    h.until("state_get")
    h.send({"type": "state_value", "key": "last", "value": {"n": 1}, "found": True, "scope": "agent"})
    assert h.until("state_get")["scope"] == "scratchpad"
    h.send({"type": "state_value", "key": "missing", "value": None, "found": False})
    h.until("state_get")
    h.send({"type": "error", "code": "state_denied", "message": "no memory grant"})
    h.finish()
    assert seen == [{"n": 1}, "none", "state_denied"]


def test_a_checkpoint_ends_the_invocation_and_a_raise_becomes_error_and_done():
    calls = []

    def handler(s, i):
        calls.append(i.prompt)
        if len(calls) == 1:
            s.checkpoint("decision_required", "pick one", ["a", "b"])
        else:
            raise RuntimeError("boom")

    h = Host(handler)
    h.send(START)
    h.send({"type": "input", "agent_id": "a1", "prompt": "1"})
    h.send({"type": "input", "agent_id": "a1", "prompt": "2"})
    out = h.finish()
    assert [m["type"] for m in out] == ["checkpoint", "error", "done"]
    assert out[0]["options"] == ["a", "b"]
    assert (out[1]["code"], out[1]["message"], out[2]["status"]) == ("agent_error", "boom", "error")


def test_another_version_or_a_bad_line_is_refused_and_shutdown_runs_its_hook():
    inputs = []
    h = Host(lambda s, i: inputs.append(i), on_shutdown=lambda s: s.kv.set("k", 1))
    h.raw(json.dumps({"schema_version": "0.2", "type": "input", "agent_id": "a1", "prompt": "future"}))
    h.raw("{not json")
    h.send({"type": "shutdown", "grace_ms": 500})
    out = h.finish()
    assert inputs == []
    assert [m.get("code", m["type"]) for m in out] == ["unsupported_version", "bad_message", "state_update"]
    assert "0.2" in out[0]["message"] and "0.1" in out[0]["message"]
