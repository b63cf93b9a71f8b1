#!/usr/bin/env bash
# Creates (or updates, when the pinned version below changes) a venv with schemathesis for
# scripts/api-conformance.sh, under the zygote cache ($ZYGOTE_CACHE_DIR, else
# ~/.cache/zygote), and prints its `st` command. Exits 1 with the reason on stderr when
# it cannot (no python3 venv module, PyPI unreachable).
set -euo pipefail
# Pinned: a newer schemathesis may add checks or change generation, which would change
# what `make test` asserts without a change here.
SCHEMATHESIS=schemathesis==4.32.5
VENV="${ZYGOTE_CACHE_DIR:-$HOME/.cache/zygote}/venv/schemathesis"
if [ "$(cat "$VENV/.zygote-stamp" 2>/dev/null)" != "$SCHEMATHESIS" ]; then
    command -v python3 >/dev/null || { echo "python3 not found" >&2; exit 1; }
    echo "api-conformance-venv: installing $SCHEMATHESIS into $VENV" >&2
    rm -rf "$VENV"
    mkdir -p "$(dirname "$VENV")"
    python3 -m venv "$VENV" >&2 || { echo "python3 -m venv failed (Debian: python3-venv)" >&2; exit 1; }
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check "$SCHEMATHESIS" >&2 \
        || { echo "pip could not install $SCHEMATHESIS" >&2; exit 1; }
    echo "$SCHEMATHESIS" >"$VENV/.zygote-stamp"
fi
echo "$VENV/bin/st"
