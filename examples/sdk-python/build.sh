#!/usr/bin/env bash
# Builds the example agent into DEST (default: ./build), ready to install as a metash agent: its
# manifest and agent.pyz, one file holding agent.py and metash_sdk (a zipapp: the native sandbox
# lets the agent read its own directory and the Python install only); echo.pyz is the smallest
# agent, built the same way. PYTHON picks the interpreter that builds it (default python3).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dest=${1:-$here/build}
python=${PYTHON:-python3}
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
# pip builds a source tree in place (build/, *.egg-info): build a copy, so builds running at the
# same time never share one.
mkdir -p "$stage/sdk" "$stage/app"
cp -r "$here/../../sdk/python/pyproject.toml" "$here/../../sdk/python/README.md" "$here/../../sdk/python/src" "$stage/sdk/"
"$python" -m pip install --quiet --disable-pip-version-check --no-compile --target "$stage/app" "$stage/sdk"
rm -rf "$stage"/app/*.dist-info
mkdir -p "$dest"
# One zipapp per agent (echo.pyz is the smallest agent): the SDK plus the agent as __main__.
for agent in agent echo; do
  cp "$here/$agent.py" "$stage/app/__main__.py"
  "$python" -m zipapp "$stage/app" --python "/usr/bin/env python3" --output "$dest/$agent.pyz"
done
cp "$here/manifest.toml" "$dest/"
echo "built $dest"
