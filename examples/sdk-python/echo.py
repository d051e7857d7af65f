"""The smallest agent: one output chunk per input. (The SDK benchmark's Python agent.)"""

from metash_sdk import run_agent

def main() -> None:
    run_agent(lambda session, input: session.output("text/plain", f"echo: {input.prompt}"))


if __name__ == "__main__":
    main()
