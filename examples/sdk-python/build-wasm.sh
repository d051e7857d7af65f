#!/usr/bin/env bash
# Builds the example agent as a WASI component into DEST (default: ./build-wasm): manifest.toml
# (sandbox = "wasm") and agent.wasm, made by componentize-py from agent.py and metash_sdk against
# the world in sdk/wit (a WASI 0.2 command). The same agent.py runs natively (build.sh) and here:
# a small wrapper exports `wasi:cli/run` and calls the agent's `main()`. COMPONENTIZE_PY names the
# tool (default: componentize-py on PATH; pip install componentize-py==0.25.1).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dest=${1:-$here/build-wasm}
tool=${COMPONENTIZE_PY:-componentize-py}
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
cp "$here/agent.py" "$stage/agent.py"
cat > "$stage/app.py" <<'PY'
from wit_world import exports

import agent


class Run(exports.Run):
    def run(self) -> None:
        agent.main()
PY
mkdir -p "$dest"
"$tool" --quiet -d "$here/../../sdk/wit" -w agent componentize app \
  -p "$stage" -p "$here/../../sdk/python/src" -o "$dest/agent.wasm"
cp "$here/manifest.wasm.toml" "$dest/manifest.toml"
echo "built $dest"
