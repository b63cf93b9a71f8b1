#!/usr/bin/env bash
# SDK tests: Python (unit + shared vectors + live + MCP + the tree-search
# example) and TypeScript (unit + shared vectors + live).
#
# Installs the SDKs' dependencies (a venv in sdk/python/.venv, npm ci in
# sdk/typescript; both skipped when already up to date), starts ONE zygoted
# on a free localhost port with a temporary state directory for the live
# tests, and stops it at the end. Needs target/release/zygoted (cargo build
# --release --workspace) and the cached minimal image and guest kernel. The
# daemon gets an image cache of its own in the state directory (the kernel and
# the built images linked from ~/.cache/zygote), so what the OCI live tests pull,
# convert and pack goes away with it. Those tests also want docker-registry,
# skopeo, umoci and busybox-static (scripts/setup.sh), and skip without them.
#
#   ZYGOTED=/path/to/zygoted      daemon binary (default target/release/zygoted,
#                                 else `target/release/zygote serve`)
#   ZYGOTE_SDK_RUNTIME=qemu|kvm   force a runtime (default: the daemon picks)
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SDK="$ROOT/sdk"
PY="$SDK/python"
TS="$SDK/typescript"
T0=$(date +%s)

say() { printf '== [%4ss] %s\n' "$(($(date +%s) - T0))" "$*"; }
die() { echo "sdk-test: $*" >&2; exit 1; }

command -v python3 >/dev/null || die "python3 not found"
command -v node >/dev/null || die "node not found"
command -v npm >/dev/null || die "npm not found"
# The daemon: zygoted, or the same server as `zygote serve`.
if [ -n "${ZYGOTED:-}" ]; then
    DAEMON=("$ZYGOTED")
elif [ -x "$ROOT/target/release/zygoted" ]; then
    DAEMON=("$ROOT/target/release/zygoted")
elif "$ROOT/target/release/zygote" serve --help >/dev/null 2>&1; then
    DAEMON=("$ROOT/target/release/zygote" serve)
else
    die "no target/release/zygoted: build it first (cargo build --release --workspace)"
fi
[ -x "${DAEMON[0]}" ] || die "${DAEMON[0]} is not executable"

# --- dependencies (idempotent: stamps record what was installed) --------------

stamp_of() { sha256sum "$@" | sha256sum | cut -c1-16; }

VENV="$PY/.venv"
bash "$ROOT/scripts/sdk-venv.sh" >/dev/null || die "setting up the Python SDK's venv failed"

ts_stamp=$(stamp_of "$TS/package.json" "$TS/package-lock.json")
if [ "$(cat "$TS/node_modules/.zygote-stamp" 2>/dev/null)" != "$ts_stamp" ]; then
    say "installing the TypeScript SDK's dev dependencies (npm ci)"
    (cd "$TS" && npm ci --no-audit --no-fund --loglevel=error) || die "npm ci failed"
    echo "$ts_stamp" >"$TS/node_modules/.zygote-stamp"
fi

say "building the TypeScript SDK (tsc)"
(cd "$TS" && ./node_modules/.bin/tsc -p tsconfig.json && ./node_modules/.bin/tsc -p tsconfig.test.json) \
    || die "tsc failed"

# --- one daemon for the live tests ---------------------------------------------

STATE=$(mktemp -d "${TMPDIR:-/tmp}/zygote-sdk-test.XXXXXX")
DAEMON_PID=""
URL=""
TOKEN=""
FAILED=0

# shellcheck source=lib/private-daemon.sh
. "$ROOT/scripts/lib/private-daemon.sh"

cleanup() {
    local status=$?
    if [ -n "$DAEMON_PID" ] && kill -0 "$DAEMON_PID" 2>/dev/null; then
        # Tests kill what they create; anything left is reported, then removed
        # through the API so the daemon tears the VMs down properly.
        [ -z "$TOKEN" ] || ZYGOTE_URL="$URL" ZYGOTE_TOKEN="$TOKEN" "$VENV/bin/python" - <<'EOF' || status=1
import sys
from zygote import Client, Sandbox
with Client() as c:
    left = c.sandboxes()
    for s in left:
        Sandbox(s.id, client=c).kill()
    snaps = [s for s in c.snapshots() if s.kind != "branch"]
    for s in snaps:
        c.delete_snapshot(s)
if left or snaps:
    print(f"sdk-test: the tests left {len(left)} sandbox(es) and {len(snaps)} snapshot(s) behind", file=sys.stderr)
    sys.exit(1)
EOF
    fi
    stop_daemon
    finish_private_daemon sdk-test "$status"
    status=$?
    say "done (exit $status)"
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The daemon's cache: the user's kernel and built images (linked), its own OCI blobs,
# pulled images and packs.
CACHE=$(link_user_cache)

say "starting zygoted (${DAEMON[*]}, state $STATE)"
runtime_args=()
[ -n "${ZYGOTE_SDK_RUNTIME:-}" ] && runtime_args=(--runtime "$ZYGOTE_SDK_RUNTIME")
ZYGOTE_CACHE_DIR="$CACHE" ZYGOTE_LOG=${ZYGOTE_LOG:-warn} \
    "${DAEMON[@]}" --listen 127.0.0.1:0 --state-dir "$STATE/daemon" "${runtime_args[@]}" \
    >"$STATE/zygoted.out" 2>"$STATE/zygoted.log" </dev/null &
DAEMON_PID=$!
wait_for_daemon 60
say "zygoted at $URL ($(ZYGOTE_URL="$URL" ZYGOTE_TOKEN="$TOKEN" "$VENV/bin/python" -c \
    'from zygote import Client; print(Client().info()["runtime"]["name"], "runtime")'))"

export ZYGOTE_URL="$URL" ZYGOTE_TOKEN="$TOKEN" ZYGOTE_LIVE_REQUIRED=1

# --- the suites (both always run; bounded so a hang cannot stall make test) ------

say "Python SDK: type check (mypy --strict)"
(cd "$PY" && "$VENV/bin/python" -m mypy --strict --cache-dir "$VENV/.mypy_cache" src examples tests) || FAILED=1

say "Python SDK: unit, vectors, live, MCP, tree-search example"
(cd "$PY" && timeout --kill-after=10 900 "$VENV/bin/python" -m pytest -q -rs -p no:cacheprovider --durations=5 tests) || FAILED=1

say "TypeScript SDK: unit, vectors, live"
(cd "$TS" && timeout --kill-after=10 600 node --test --test-reporter=spec build/*.test.js) || FAILED=1

[ "$FAILED" -eq 0 ] || { echo "sdk-test: FAILED" >&2; exit 1; }
