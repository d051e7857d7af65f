"""A notes agent written with metash_sdk: it greets, asks for `memory` and remembers the prompt
(read back from the host), shares it on the scratchpad, writes a report into its workspace and
announces it as an artifact, notices when `memory` is revoked and falls back, and asks a human
whether to publish (a checkpoint). Spawned again after the answer, it acts on it."""

import os

from metash_sdk import AgentError, Input, Session, run_agent


def notes(session: Session, input: Input) -> None:
    resume = session.resume_data
    if resume:
        session.output("text/plain", f"resumed with answer: {resume['user_input']}")
        return
    session.output("text/markdown", f"# notes (Python)\n\nyou said: {input.prompt}")

    consent = session.request_consent("memory", "remember your last prompt", 600)
    if consent.granted:
        session.kv.set("last_prompt", input.prompt)
        session.output("text/plain", f"kv read back: {session.kv.get('last_prompt')}")
        session.scratchpad.set("notes.python", input.prompt)
        session.output("text/plain", f"scratchpad read back: {session.scratchpad.get('notes.python')}")
    else:
        session.output("text/plain", f"no memory ({consent.code}): not remembering")

    workspace = session.context.workspace
    if workspace and session.granted("files.write"):
        path = os.path.join(workspace, "notes-python.md")
        with open(path, "w", encoding="utf-8") as f:
            f.write(f"# notes\n\n- {input.prompt}\n")
        session.artifact("notes-python", "text/markdown", path)

    if "wait for revoke" in input.prompt and session.granted("memory"):
        session.output("text/plain", "waiting for memory to be revoked")
        if session.until_revoked("memory", 60):
            session.output("text/plain", "memory revoked: falling back to no memory")
            try:
                session.kv.get("last_prompt")
                session.output("text/plain", "kv still readable after revocation")
            except AgentError as e:
                session.output("text/plain", f"kv refused after revocation: {e.code}")

    session.checkpoint("decision_required", "publish the notes?", ["publish", "discard"])


def main() -> None:
    run_agent(notes)


if __name__ == "__main__":
    main()
