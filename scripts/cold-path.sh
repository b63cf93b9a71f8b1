#!/usr/bin/env bash
# The cold path, on every `make test`: what a new user's first commands do, in a HOME
# that has nothing in it (no ~/.cache/zygote, ~/.local/state, ~/.config), so that a
# directory nobody creates, or a file only a warm machine has, fails CI instead of
# failing a new user (issue 32). Only the guest kernel, an input-keyed output that
# takes minutes to build, is linked in from the warm cache.
#
# Steps: `zygote image build minimal`, `zygote run -- true`, then a daemon on its
# default state directory: create, exec, branch, snapshot, pack export and import, a
# sandbox from the imported snapshot, a sandbox from a user recipe the daemon builds on
# first use, rm. About half a minute.
#
# Needs `make build` (target/release/zygote) and a built guest kernel (make guest).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ZYGOTE=$ROOT/target/release/zygote
T0=$(date +%s)
say() { printf '== [cold-path %3ss] %s\n' "$(($(date +%s) - T0))" "$*"; }
die() { echo "cold-path: $*" >&2; exit 1; }

[ -x "$ZYGOTE" ] || die "no $ZYGOTE: run make build first"

# The warm kernel, from the user's cache (built there if missing).
kernel=$(bash "$ROOT/guest/kernel/build.sh" 2>/dev/null | tail -n1) ||
    die "guest/kernel/build.sh failed: run make guest"
kernel_cache=$(dirname "$(dirname "$kernel")")

# Rust stays where it is: the image build compiles the agent with cargo.
export RUSTUP_HOME=${RUSTUP_HOME:-$HOME/.rustup}
export CARGO_HOME=${CARGO_HOME:-$HOME/.cargo}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/zygote-cold.XXXXXX")
DAEMON_PID=""
cleanup() {
    local status=$?
    if [ -n "$DAEMON_PID" ] && kill -0 "$DAEMON_PID" 2>/dev/null; then
        kill -TERM "$DAEMON_PID" 2>/dev/null
        wait "$DAEMON_PID" 2>/dev/null || true
    fi
    if [ "$status" -ne 0 ] && [ -s "$WORK/zygoted.log" ]; then
        echo "--- zygoted log (last 30 lines)" >&2
        tail -n 30 "$WORK/zygoted.log" >&2
    fi
    rm -rf "$WORK"
    exit "$status"
}
trap cleanup EXIT

export HOME=$WORK/home
mkdir "$HOME"
unset ZYGOTE_CACHE_DIR ZYGOTE_STATE_DIR XDG_STATE_HOME XDG_CONFIG_HOME XDG_CACHE_HOME \
    ZYGOTE_URL ZYGOTE_TOKEN ZYGOTE_PREBUILT
mkdir -p "$HOME/.cache/zygote"
ln -s "$kernel_cache" "$HOME/.cache/zygote/kernel"
cd "$WORK"

say "zygote image build minimal (HOME=$HOME: nothing cached but the kernel)"
"$ZYGOTE" image build minimal >"$WORK/build.log" 2>&1 || {
    tail -n 20 "$WORK/build.log" >&2
    die "zygote image build minimal failed on an empty cache"
}
say "zygote run --image minimal -- true"
"$ZYGOTE" run --image minimal -- true || die "zygote run failed on an empty cache"

say "zygote serve on its default state directory (~/.local/state/zygote, not there yet)"
"$ZYGOTE" serve --listen 127.0.0.1:0 --proxy-listen none >"$WORK/zygoted.out" 2>"$WORK/zygoted.log" &
DAEMON_PID=$!
url=""
for _ in $(seq 300); do
    url=$(sed -n 's/^zygoted listening on //p' "$WORK/zygoted.out" | head -n1)
    [ -n "$url" ] && break
    kill -0 "$DAEMON_PID" 2>/dev/null || die "zygoted exited during start-up"
    sleep 0.1
done
[ -n "$url" ] || die "zygoted did not start within 30 s"
export ZYGOTE_URL=$url
field() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }
id=$("$ZYGOTE" create --image minimal --json | field 'd["sandboxes"][0]["id"]') ||
    die "zygote create failed on a fresh daemon"
out=$("$ZYGOTE" exec "$id" -- sh -c 'echo cold-$((20+22)) | tee /root/mark') || die "zygote exec failed"
[ "$out" = "cold-42" ] || die "zygote exec printed '$out', not cold-42"
say "branch, snapshot, pack export and import, create from the snapshot"
child=$("$ZYGOTE" branch "$id" -c 1 --json | field 'd["children"][0]') || die "zygote branch failed"
[ "$("$ZYGOTE" exec "$child" -- cat /root/mark)" = "cold-42" ] || die "the branch child lacks the parent's file"
snap=$("$ZYGOTE" snapshot create "$id" --json | field 'd["id"]') || die "zygote snapshot create failed"
"$ZYGOTE" snapshot export "$snap" -o "$WORK/snap.pack" 2>/dev/null || die "zygote snapshot export failed"
imported=$("$ZYGOTE" snapshot import "$WORK/snap.pack" --json | field 'd["id"]') ||
    die "zygote snapshot import failed"
restored=$("$ZYGOTE" create --snapshot "$imported" --json | field 'd["sandboxes"][0]["id"]') ||
    die "zygote create --snapshot failed"
[ "$("$ZYGOTE" exec "$restored" -- cat /root/mark)" = "cold-42" ] ||
    die "the sandbox from the imported snapshot lacks the snapshot's file"
say "create --image <a recipe not built yet>: the daemon builds it on first use"
mkdir -p "$HOME/.config/zygote/recipes"
printf 'DESCRIPTION="cold-path: built by the first create that names it"\nBASE=busybox\nSIZE_MIB=64\n' \
    >"$HOME/.config/zygote/recipes/firstuse.recipe"
fresh=$("$ZYGOTE" create --image firstuse --json | field 'd["sandboxes"][0]["id"]') ||
    die "zygote create --image firstuse did not build the recipe on first use"
[ "$("$ZYGOTE" exec "$fresh" -- echo built)" = "built" ] || die "the first-use image does not run"
"$ZYGOTE" rm "$id" "$child" "$restored" "$fresh" >/dev/null || die "zygote rm failed"
say "ok: image build, run, and a daemon's create/exec/branch/snapshot/pack/rm work from an empty HOME"
