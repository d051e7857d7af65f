#!/usr/bin/env bash
# Builds the example agent into DEST (default: ./build), ready to install as a metash agent:
# its manifest, agent.mjs and notes.mjs (and echo.mjs, the smallest agent), and a copy of
# @metash/sdk in DEST/node_modules (a copy, not a symlink: the native sandbox lets the agent read
# its own directory only).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dest=${1:-$here/build}
mkdir -p "$dest"
cp "$here/manifest.toml" "$here/agent.mjs" "$here/notes.mjs" "$here/echo.mjs" "$dest/"
cd "$dest"
[ -f package.json ] || echo '{"name":"notes-agent","private":true,"type":"module"}' > package.json
npm install --no-audit --no-fund --loglevel=error --install-links "$here/../../sdk/typescript"
echo "built $dest"
