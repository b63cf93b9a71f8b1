#!/usr/bin/env bash
# Creates (or updates, when sdk/python/pyproject.toml changed) the Python SDK's venv in
# sdk/python/.venv with the SDK installed editable plus its test and MCP extras, and
# prints the venv's python. Used by scripts/sdk-test.sh and scripts/nested-lane.py.
set -euo pipefail
PY=$(cd "$(dirname "${BASH_SOURCE[0]}")/../sdk/python" && pwd)
VENV="$PY/.venv"
stamp=$(sha256sum "$PY/pyproject.toml" | sha256sum | cut -c1-16)
if [ "$(cat "$VENV/.zygote-stamp" 2>/dev/null)" != "$stamp" ]; then
    echo "sdk-venv: installing the Python SDK and its test dependencies into $VENV" >&2
    [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV" >&2
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e "$PY[test,mcp]" >&2
    echo "$stamp" >"$VENV/.zygote-stamp"
fi
echo "$VENV/bin/python"
