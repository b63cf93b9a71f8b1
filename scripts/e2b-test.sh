#!/usr/bin/env bash
# E2B compatibility (issue 35): E2B's UNCHANGED SDKs — Python e2b==2.63.0 (a venv made by
# scripts/e2b-venv.sh) and npm e2b@2.51.0 (sdk/e2b-compat/js, node from
# scripts/e2b-node.sh) — against a private zygoted on loopback, through the three variables
# a user sets:
#   E2B_API_URL=http://127.0.0.1:<api port>/e2b  E2B_API_KEY=<daemon token>
#   E2B_SANDBOX_URL=http://127.0.0.1:<proxy port>
# (and E2B_VOLUME_API_URL=$E2B_API_URL for the volume content API, served there too)
# The sandboxes use E2B's default template `base` (guest/rootfs/recipes/base.recipe: bash,
# python3, node, git, curl, user `user`), built first from its recipe (seconds when the
# debootstrap tree is cached in ~/.cache/zygote/debootstrap). Needs target/release/zygoted
# and the guest kernel; skips (exit 0, with the reason) without qemu-system-x86_64.
#
#   ZYGOTED=/path/to/zygoted      daemon binary (default target/release/zygoted)
#   E2B_TEST_DAEMON_URL=<url> E2B_TEST_PROXY_URL=<url> E2B_TEST_TOKEN=<token>
#                                 test a daemon that runs elsewhere instead (the nested
#                                 lane's, on the kvm runtime) and start none
#   E2B_TEST_TEMPLATE=<image>     the image the tests create sandboxes from (base, E2B's default)
#   extra arguments               go to pytest, and only pytest runs (default: every
#                                 sdk/e2b-compat/test_e2b_*.py, then the JS suite)
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
T0=$(date +%s)
say() { printf '== [%4ss] %s\n' "$(($(date +%s) - T0))" "$*"; }
die() { echo "e2b-test: $*" >&2; exit 1; }

REMOTE=${E2B_TEST_DAEMON_URL:-}
DAEMON=${ZYGOTED:-$ROOT/target/release/zygoted}
[ -n "$REMOTE" ] || [ -x "$DAEMON" ] || die "no $DAEMON: build it first (cargo build --release -p zygote-daemon)"
command -v curl >/dev/null || die "curl not found"
if [ -z "$REMOTE" ] && ! command -v qemu-system-x86_64 >/dev/null; then
    echo "skipping e2b-test: qemu-system-x86_64 is not on PATH, so no sandbox can boot"
    exit 0
fi

PY=$(bash "$ROOT/scripts/e2b-venv.sh") || die "setting up the E2B SDK venv failed"
NODE=""
if [ $# -eq 0 ]; then
    NODE=$(bash "$ROOT/scripts/e2b-node.sh") || die "setting up E2B's JS SDK failed"
fi
TEMPLATE=${E2B_TEST_TEMPLATE:-base}

STATE=$(mktemp -d "${TMPDIR:-/tmp}/zygote-e2b-test.XXXXXX")
DAEMON_PID=""
URL=""
TOKEN=""
# shellcheck source=lib/private-daemon.sh
. "$ROOT/scripts/lib/private-daemon.sh"

cleanup() {
    local status=$?
    if [ -n "$REMOTE" ]; then
        rm -rf "$STATE"
        say "done (exit $status)"
        exit "$status"
    fi
    stop_daemon
    finish_private_daemon e2b-test "$status"
    status=$?
    say "done (exit $status)"
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [ -n "$REMOTE" ]; then
    URL=$REMOTE PROXY=${E2B_TEST_PROXY_URL:?with E2B_TEST_DAEMON_URL} TOKEN=${E2B_TEST_TOKEN:?}
    say "testing the daemon at $URL (proxy $PROXY)"
else
say "starting zygoted ($DAEMON, qemu runtime, state $STATE)"
ZYGOTE_LOG=${ZYGOTE_LOG:-warn} "$DAEMON" --listen 127.0.0.1:0 --proxy-listen 127.0.0.1:0 \
    --runtime qemu --state-dir "$STATE/daemon" \
    >"$STATE/zygoted.out" 2>"$STATE/zygoted.log" </dev/null &
DAEMON_PID=$!
wait_for_daemon 60
PROXY=""
for _ in $(seq 50); do
    PROXY=$(sed -n 's/^zygoted proxy listening on //p' "$STATE/zygoted.out" | head -n1)
    [ -n "$PROXY" ] && break
    sleep 0.1
done
[ -n "$PROXY" ] || die "the daemon announced no proxy"
fi

if [ -n "$REMOTE" ]; then
    # Its host may have no recipes or package mirror (the nested lane's L1 gets the image
    # in its cache): the daemon finds the template on the first create.
    say "image $TEMPLATE: the remote daemon's own"
else
say "image $TEMPLATE (built from its recipe if missing)"
curl -sS -N --fail-with-body -H "Authorization: Bearer $TOKEN" -H 'Content-Type: application/json' \
    -d "{\"name\": \"$TEMPLATE\"}" "$URL/v1/images/build" >"$STATE/build.ndjson" \
    || die "building image $TEMPLATE failed: $(tail -c 2000 "$STATE/build.ndjson")"
grep -q '"error"' "$STATE/build.ndjson" && die "building image $TEMPLATE: $(grep '"error"' "$STATE/build.ndjson")"
fi

# The code interpreter's tests boot E2B's code-interpreter-v1 (zygote's code-interpreter image).
if [ $# -eq 0 ] || printf '%s\n' "$@" | grep -q code_interpreter; then
    say "image code-interpreter (built from its recipe if missing)"
    curl -sS -N --fail-with-body -H "Authorization: Bearer $TOKEN" -H 'Content-Type: application/json' \
        -d '{"name": "code-interpreter"}' "$URL/v1/images/build" >"$STATE/build-ci.ndjson" \
        || die "building image code-interpreter failed: $(tail -c 2000 "$STATE/build-ci.ndjson")"
    grep -q '"error"' "$STATE/build-ci.ndjson" \
        && die "building image code-interpreter: $(grep '"error"' "$STATE/build-ci.ndjson")"
fi

export E2B_API_URL="$URL/e2b" E2B_API_KEY="$TOKEN" E2B_SANDBOX_URL="$PROXY" E2B_TEST_TEMPLATE="$TEMPLATE"
export E2B_VOLUME_API_URL="$E2B_API_URL"
say "E2B Python SDK $("$PY" -c 'import importlib.metadata as m; print(m.version("e2b"))'): $E2B_API_URL, $E2B_SANDBOX_URL"
[ $# -gt 0 ] || set -- "$ROOT"/sdk/e2b-compat/test_e2b_*.py
FAILED=0
timeout --kill-after=10 1800 "$PY" -m pytest -q -rs -p no:cacheprovider --durations=5 "$@" || FAILED=1
if [ -n "$NODE" ]; then
    JS="$ROOT/sdk/e2b-compat/js"
    say "E2B JS SDK $("$NODE" -p "require('$JS/node_modules/e2b/package.json').version") on node $("$NODE" --version)"
    (cd "$JS" && timeout --kill-after=10 900 "$NODE" --test --test-reporter=spec --test-concurrency=1 ./*.test.mjs) \
        || FAILED=1
fi
exit "$FAILED"
