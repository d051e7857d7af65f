#!/usr/bin/env bash
# The example project, end to end, with no model and no API key:
#   builds the WASM planner/executor/verifier (crates/metash-example-agents) and metash,
#   creates a git project in a temp dir with `metash init --context`, installs the agents,
#   runs `metash run` (the planner asks a question: exit 4), answers it with
#   `metash run --answer french` (plans, runs tasks in parallel worktrees, a verification gap and
#   its fix, merges, phase 2, complete), then shows `metash status` and the git history.
# Usage: examples/greetings/run.sh [LANGUAGE]   (english or french; default french)
#   KEEP=1 keeps the project directory; METASH=path uses that metash binary.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
answer="${1:-french}"

cd "$repo"
cargo build -q --release -p metash-example-agents --target wasm32-wasip1
wasm="$repo/target/wasm32-wasip1/release"
if [[ -z "${METASH:-}" ]]; then
  cargo build -q -p metash
  METASH="$repo/target/debug/metash"
fi

project="$(mktemp -d "${TMPDIR:-/tmp}/metash-greetings.XXXXXX")"
if [[ -z "${KEEP:-}" ]]; then trap 'rm -rf "$project"' EXIT; fi
echo "== project: $project"

git -C "$project" init -q
git -C "$project" -c user.name=metash -c user.email=metash@localhost commit -q --allow-empty -m "empty project"
"$METASH" -C "$project" init --context "$here/context.md"
cp "$here/config.toml" "$project/.meta/config.toml"
for agent in planner executor verifier; do
  mkdir -p "$project/.meta/agents/$agent"
  cp "$here/agents/$agent/manifest.toml" "$project/.meta/agents/$agent/"
  cp "$wasm/$agent.wasm" "$project/.meta/agents/$agent/"
done
# The agents may touch their worktree only after the user allowed it.
"$METASH" -C "$project" consent grant executor files.read
"$METASH" -C "$project" consent grant executor files.write
"$METASH" -C "$project" consent grant verifier files.read

echo "== metash run (the planner needs a decision)"
set +e
"$METASH" -C "$project" run </dev/null
code=$?
set -e
if [[ $code -ne 4 ]]; then echo "expected exit 4 (checkpoint), got $code" >&2; exit 1; fi

echo "== metash run --answer $answer"
"$METASH" -C "$project" run --answer "$answer" </dev/null

echo "== metash status"
"$METASH" -C "$project" status
echo "== git log"
git -C "$project" log --oneline --graph
echo "== files"
for f in hello.txt bye.txt README.md shout.txt; do echo "--- $f"; cat "$project/$f"; done
