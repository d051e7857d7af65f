#!/usr/bin/env bash
# Builds the notes agent as a WASI component into DEST (default: ./build-wasm): manifest.toml
# (sandbox = "wasm") and agent.wasm. The same notes.mjs as the native build:
#  1. rolldown bundles a small entry (exporting `wasi:cli/run`, which calls runAgent(notes)) with
#     notes.mjs and @metash/sdk into one module; the `wasi` export condition resolves the SDK to
#     its WASI channel (stdin/stdout as wasi:cli streams, files through wasi:filesystem);
#  2. componentize-js makes it a component of the world in sdk/wit (a WASI 0.2 command), without
#     the HTTP interfaces it would otherwise import.
# ROLLDOWN and COMPONENTIZE_JS name the tools (default: on PATH; npm install rolldown@1.3.2
# @bytecodealliance/componentize-js@0.23.0).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
sdk="$here/../../sdk"
dest=${1:-$here/build-wasm}
rolldown=${ROLLDOWN:-rolldown}
componentize=${COMPONENTIZE_JS:-componentize-js}
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
cp "$here/notes.mjs" "$stage/"
mkdir -p "$stage/node_modules/@metash/sdk"
cp -r "$sdk/typescript/package.json" "$sdk/typescript/dist" "$stage/node_modules/@metash/sdk/"
cat > "$stage/entry.mjs" <<'JS'
import { runAgent } from "@metash/sdk";

import { notes } from "./notes.mjs";

export const run = {
  async run() {
    await runAgent(notes);
  },
};
JS
cat > "$stage/rolldown.config.mjs" <<'JS'
export default {
  input: "entry.mjs",
  platform: "neutral",
  external: [/^wasi:/],
  resolve: { conditionNames: ["wasi", "import", "default"] },
  output: { file: "bundle.mjs", format: "esm" },
};
JS
(cd "$stage" && "$rolldown" -c rolldown.config.mjs >/dev/null)
mkdir -p "$dest"
"$componentize" "$stage/bundle.mjs" --wit "$sdk/wit" --world-name agent \
  --disable http fetch-event -o "$dest/agent.wasm" >/dev/null
cp "$here/manifest.wasm.toml" "$dest/manifest.toml"
echo "built $dest"
