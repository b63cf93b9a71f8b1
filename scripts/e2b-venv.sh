#!/usr/bin/env bash
# Creates (or updates, when the pins below change) a venv with E2B's UNCHANGED Python SDK
# at the pinned version, for the E2B compatibility tests (scripts/e2b-test.sh), and
# prints the venv's python. Lives under ${ZYGOTE_CACHE_DIR:-~/.cache/zygote}/venv/e2b-<pins> so
# it is shared across worktrees and never inside the repository.
set -euo pipefail
# websockets: zygote's own SDK imports it; bench/e2b_sdk.py runs both SDKs from this venv.
# e2b-code-interpreter: its unchanged SDK for sdk/e2b-compat/test_e2b_code_interpreter.py
# (2.11.5 needs e2b>=2.55.1,<3: the pinned e2b fits).
PINS="e2b==2.63.0 e2b-code-interpreter==2.11.5 pytest==8.3.5 websockets==15.0.1"
CACHE=${ZYGOTE_CACHE_DIR:-$HOME/.cache/zygote}
stamp=$(printf '%s' "$PINS" | sha256sum | cut -c1-16)
# One venv per pin set: worktrees (or branches) with different pins never reinstall
# each other's venv under a running test.
VENV="$CACHE/venv/e2b-$stamp"
if [ "$(cat "$VENV/.zygote-stamp" 2>/dev/null)" != "$stamp" ]; then
    echo "e2b-venv: installing $PINS into $VENV" >&2
    [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV" >&2
    # shellcheck disable=SC2086
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check $PINS >&2
    echo "$stamp" >"$VENV/.zygote-stamp"
fi
echo "$VENV/bin/python"
