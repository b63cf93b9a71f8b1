#!/usr/bin/env bash
# `make fresh-check`: the README's two commands, exactly as written, as a new user on a
# fresh machine runs them: a clean clone of this checkout's HEAD, a throw-away HOME with
# nothing cached (no ~/.cache/zygote, cargo registry, Go or npm caches, pip caches, no
# Rust targets beyond the toolchain's own), then `make demo` and `make test`. Prints
# each phase's time (the `== [phase]` markers the Makefile prints) and a summary.
#
# What stays from this machine: Debian's installed packages (they are the system's, and
# apt needs no cache to install them again), the Rust toolchain (copied, with the extra
# targets removed so that scripts/setup.sh has to add them), Python, Node and Go, and
# the machine's registry settings (~/.npmrc, ~/.gitconfig, ~/.config/go/env).
#
#   FRESH_DIR=/path   work there instead of a new directory under $TMPDIR (kept on
#                     failure either way, removed on success unless FRESH_KEEP=1)
#   FRESH_ONLY=demo   stop after `make demo`
#   FRESH_STEPS="demo test-console"   the make targets to run, in order (default
#                     `demo test`): a shorter cold check of one part of `make test`
# Takes an hour or more on 2 cores. Not part of `make test`.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
WORK=${FRESH_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/zygote-fresh.XXXXXX")}
mkdir -p "$WORK"
REAL_HOME=$HOME
T0=$(date +%s)
say() { printf '== [fresh-check %5ss] %s\n' "$(($(date +%s) - T0))" "$*"; }
die() { say "error: $*"; exit 1; }

[ -n "$(git -C "$ROOT" status --porcelain --untracked-files=no)" ] &&
    say "note: uncommitted changes are not in the clone; this checks HEAD ($(git -C "$ROOT" rev-parse --short HEAD))"

say "clean clone of HEAD into $WORK/zygote"
rm -rf "$WORK/zygote" "$WORK/home" "$WORK/shared"
git clone -q "$ROOT" "$WORK/zygote" || die "git clone failed"
# CI runs with ../shared beside the repo.
[ -d "$ROOT/../shared" ] && cp -r "$ROOT/../shared" "$WORK/shared"

home=$WORK/home
mkdir -p "$home/.config"
for f in .npmrc .gitconfig .config/go/env; do
    if [ -f "$REAL_HOME/$f" ]; then
        mkdir -p "$(dirname "$home/$f")"
        cp "$REAL_HOME/$f" "$home/$f"
    fi
done

rustup_home=${RUSTUP_HOME:-$REAL_HOME/.rustup}
say "copying the Rust toolchain ($rustup_home) without the project's extra targets"
cp -a "$rustup_home" "$home/.rustup" || die "copying $rustup_home failed"
export RUSTUP_HOME=$home/.rustup
mkdir -p "$home/.cargo/bin"
for target in x86_64-unknown-none x86_64-unknown-linux-musl; do
    rustup target remove "$target" >/dev/null 2>&1 || true
done

export HOME=$home
export CARGO_HOME=$home/.cargo
# The rustup proxies (cargo, rustc, rustup) from the real ~/.cargo/bin; what `cargo
# install` adds goes to the new CARGO_HOME/bin, first on PATH.
export PATH="$CARGO_HOME/bin:$PATH"
unset ZYGOTE_CACHE_DIR ZYGOTE_STATE_DIR ZYGOTE_K8S_CACHE XDG_CACHE_HOME XDG_STATE_HOME \
    XDG_CONFIG_HOME GOCACHE GOMODCACHE GOPATH npm_config_cache PIP_CACHE_DIR
export CI=true

phases() {
    # `== [phase HH:MM:SS epoch] name` lines -> one line per phase with its duration.
    local log=$1 end=$2
    awk -v end="$end" '
        /^== \[phase / { t=$4; sub(/\]$/, "", t); name=$5
            if (n) { printf "  %-22s %6.1f min\n", prev, (t - start) / 60 }
            n++; prev=name; start=t }
        END { if (n) printf "  %-22s %6.1f min\n", prev, (end - start) / 60 }' "$log"
}

run_step() {
    local name=$1 started status ended
    started=$(date +%s)
    say "$name (log: $WORK/$name.log)"
    (cd "$WORK/zygote" && make "$name" </dev/null) >"$WORK/$name.log" 2>&1
    status=$?
    ended=$(date +%s)
    phases "$WORK/$name.log" "$ended"
    say "make $name: exit $status after $(( (ended - started) / 60 )) min $(( (ended - started) % 60 )) s"
    [ "$status" -eq 0 ] || { tail -n 40 "$WORK/$name.log"; die "make $name failed on a fresh machine"; }
    printf '%s\n' "$(( ended - started ))" >"$WORK/$name.secs"
}

steps=${FRESH_STEPS:-demo test}
[ "${FRESH_ONLY:-}" = demo ] && steps=demo
for step in $steps; do
    run_step "$step"
done
say "fresh machine: make demo $(( $(cat "$WORK/demo.secs") / 60 )) min$(
    [ -f "$WORK/test.secs" ] && printf ', make test %s min' $(( $(cat "$WORK/test.secs") / 60 )))"
if [ "${FRESH_KEEP:-0}" != 1 ]; then
    rm -rf "$WORK"
fi
