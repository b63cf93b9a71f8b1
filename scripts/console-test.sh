#!/usr/bin/env bash
# The web console's tests (console/README.md): its unit tests under node (the tree
# layout with a 256-child fan-out, the list filter, the event stream's parser and
# client), then the console in Debian's chromium, headless, driven by playwright-core
# (console/test/browser.ts), against a private zygoted on loopback with the qemu runtime
# and a temporary state directory: log in by `zygote ui`'s one-time URL, create a
# sandbox, type in its terminal, branch it into 3, delete a child, a diff from the tree,
# a process's output followed live, the other views, changes made through the API shown
# live from the event stream (its token in a header, never a URL), wrong tokens and
# codes, 1000 sandboxes and a 256-child tree from fixture data. Screenshots go to
# target/console-artifacts/.
#
# Skips (exit 0, saying why) without qemu-system-x86_64 or chromium. Needs
# target/release/zygoted and zygote built with the console (make build) and the cached
# minimal image (make guest).
#   ZYGOTED=/path/to/zygoted   CHROMIUM=/path/to/chromium   ARTIFACTS=DIR
#   CONSOLE_DIST=/abs/console/dist   (development: serve these assets, not the embedded)
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CONSOLE="$ROOT/console"
T0=$(date +%s)
say() { printf '== [%4ss] %s\n' "$(($(date +%s) - T0))" "$*"; }
die() { echo "console-test: $*" >&2; exit 1; }

DAEMON=${ZYGOTED:-$ROOT/target/release/zygoted}
ZYGOTE_BIN="$ROOT/target/release/zygote"
ARTIFACTS=${ARTIFACTS:-$ROOT/target/console-artifacts}
command -v node >/dev/null || die "node not found (scripts/setup.sh installs it)"
[ -x "$DAEMON" ] || die "no $DAEMON: build it first (make build)"
[ -x "$ZYGOTE_BIN" ] || die "no $ZYGOTE_BIN: build it first (make build)"

# --- the console's own dependencies and unit tests (no daemon, no browser) ----------

bash "$ROOT/scripts/console-build.sh" --deps || die "installing the console's dependencies failed"
say "console unit tests (tree layout, list filter, event stream)"
(cd "$CONSOLE" && npm test --silent) || die "the console's unit tests failed"

# --- the browser suite ----------------------------------------------------------------

if ! command -v qemu-system-x86_64 >/dev/null; then
    echo "console-test: skipping the browser suite: qemu-system-x86_64 is not on PATH, so no sandbox can boot"
    exit 0
fi
CHROMIUM=${CHROMIUM:-$(command -v chromium || command -v chromium-browser || true)}
if [ -z "$CHROMIUM" ]; then
    echo "console-test: skipping the browser suite: no chromium (scripts/setup.sh installs Debian's)"
    exit 0
fi

# shellcheck source=lib/private-daemon.sh
. "$ROOT/scripts/lib/private-daemon.sh"
new_private_state console-test
trap 'private_daemon_exit console-test' EXIT
trap 'exit 130' INT TERM

CACHE=$(link_user_cache)
say "starting zygoted ($DAEMON, qemu runtime, state $STATE)"
ZYGOTE_CACHE_DIR="$CACHE" ZYGOTE_LOG=${ZYGOTE_LOG:-info} \
    "$DAEMON" --listen 127.0.0.1:0 --state-dir "$STATE/daemon" --runtime qemu \
    >"$STATE/zygoted.out" 2>"$STATE/zygoted.log" </dev/null &
DAEMON_PID=$!
wait_for_daemon 60
say "zygoted at $URL"

code=$(node -e 'fetch(process.argv[1]).then((r) => console.log(r.status), () => console.log(0))' "$URL/ui/")
[ "$code" = 200 ] || die "$URL/ui/ answered $code: was the daemon built without the console? (make build)"

rm -rf "$ARTIFACTS"
mkdir -p "$ARTIFACTS"
say "the console in $CHROMIUM (screenshots in $ARTIFACTS)"
(cd "$CONSOLE" && ZYGOTE_URL="$URL" ZYGOTE_TOKEN="$TOKEN" ZYGOTE_BIN="$ZYGOTE_BIN" \
    CHROMIUM="$CHROMIUM" ARTIFACTS="$ARTIFACTS" \
    timeout --kill-after=10 900 node build/test/browser.mjs)
status=$?

# The token must not be in the daemon's log, whatever the console did (the pty's
# subprotocol, the login exchange).
if grep -qF "$TOKEN" "$STATE/zygoted.log" "$STATE/zygoted.out"; then
    echo "console-test: the API token appears in the daemon's log" >&2
    status=1
fi
exit "$status"
