"""The JSON-RPC client against a real `metash serve --stdio` (the binary from `METASH`, else the
workspace's target/debug/metash, which `cargo test` builds). Without one the tests skip, and fail
when CI is set."""

import os
import subprocess
import threading
from pathlib import Path

import pytest

from metash_sdk import MetashClient, RpcError

METASH = os.environ.get("METASH") or str(Path(__file__).resolve().parents[3] / "target/debug/metash")
MISSING = None if Path(METASH).exists() else f"no metash binary at {METASH} (set METASH or run cargo build)"
if MISSING and os.environ.get("CI"):
    raise RuntimeError(f"CI is set and {MISSING}")
needs_metash = pytest.mark.skipif(MISSING is not None, reason=MISSING or "")


@pytest.fixture
def client(tmp_path):
    subprocess.run([METASH, "-C", str(tmp_path), "init"], check=True, capture_output=True)
    c = MetashClient.start(str(tmp_path), metash=METASH)
    yield c
    c.close()


@needs_metash
def test_state_progress_and_notifications_round_trip(client):
    seen = []
    client.subscribe(seen.append)
    events = client.events()
    revision = client.update_state("variables.count", 41)["revision"]
    assert revision >= 1
    assert client.get_state("variables.count") == 41
    assert client.get_state()["variables"]["count"] == 41
    record = events.get(timeout=10)
    assert record["kind"] == "state_update" and record["data"]["key"] == "variables.count"
    seq = client.log_progress("half way", "warn")["seq"]
    while True:
        r = events.get(timeout=10)
        if r["seq"] == seq:
            assert r["kind"] == "progress"
            break
    # Concurrent requests from several threads are matched by id.
    results = {}

    def put(n):
        results[n] = client.update_state(f"variables.n{n}", n)["revision"]

    threads = [threading.Thread(target=put, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(results.values())) == 8
    assert [client.get_state(f"variables.n{n}") for n in range(8)] == list(range(8))
    seqs = [r["seq"] for r in seen]
    assert seqs == sorted(seqs)
    assert client.pending_checkpoint() is None
    assert client.pending_consent() == []
    assert client.close() == 0


@needs_metash
def test_host_errors_are_rpc_errors_with_code_and_kind(client):
    cases = [
        (lambda: client.spawn_agent("ghost", "hi"), -32001, "unknown_agent", "ghost"),
        (lambda: client.answer_checkpoint("yes"), -32002, "rejected", "no checkpoint is pending"),
        (lambda: client.log_progress("x", "loud"), -32602, "invalid_params", "`level` must be one of"),
        (lambda: client.call("noSuchMethod"), -32601, "method_not_found", "noSuchMethod"),
    ]
    for call, code, kind, words in cases:
        with pytest.raises(RpcError) as e:
            call()
        assert (e.value.code, e.value.kind) == (code, kind)
        assert words in e.value.message
    # The server keeps serving after errors.
    assert client.update_state("variables.after", True)["revision"] >= 1
    assert client.close() == 0
    with pytest.raises(RpcError) as e:
        client.get_state()
    assert e.value.kind == "closed"
