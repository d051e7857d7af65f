#!/usr/bin/env python3
"""An orchestrator in Python: drives a metash project over JSON-RPC (`metash serve --stdio`).

    python3 orchestrator.py PROJECT AGENT [MESSAGE]

It records who is orchestrating in the session, spawns AGENT, answers its checkpoint with the
first option, spawns it again to hear the answer acted on, and prints a JSON summary. `METASH`
names the binary (default: `metash` on PATH); `METASH_POLICY` a policy file for the spawned
agents' consent (nobody can be asked over stdio).
"""

import collections
import json
import os
import sys

from metash_sdk import MetashClient


def main(argv):
    if len(argv) < 2:
        print("usage: orchestrator.py PROJECT AGENT [MESSAGE]", file=sys.stderr)
        return 2
    project, agent = argv[0], argv[1]
    message = argv[2] if len(argv) > 2 else "hello from the orchestrator"
    policy = os.environ.get("METASH_POLICY")
    kinds = collections.Counter()
    with MetashClient.start(
        project,
        metash=os.environ.get("METASH", "metash"),
        serve_args=["--policy", policy] if policy else [],
    ) as client:
        client.subscribe(lambda record: kinds.update([record["kind"]]))
        revision = client.update_state("variables.orchestrator", "python")["revision"]
        client.log_progress(f"spawning {agent}")
        first = client.spawn_agent(agent, message, options={"timeout_seconds": 120})
        answered = second = None
        if first["status"] == "checkpoint":
            pending = client.pending_checkpoint()
            options = pending["signal"]["options"] if pending else []
            answered = client.answer_checkpoint(options[0] if options else "yes", pending and pending["id"])
            second = client.spawn_agent(agent, "go on", options={"timeout_seconds": 120})
        orchestrator = client.get_state("variables.orchestrator")
    print(json.dumps({
        "revision": revision,
        "first": first,
        "answered": answered,
        "second": second,
        "orchestrator": orchestrator,
        "events": dict(kinds),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
