#!/usr/bin/env bash
# Builds the web console (console/: npm ci when its lock changed, then tsc and esbuild
# into console/dist), which the daemon's build embeds (crates/daemon/build.rs). `make
# build` runs it before cargo. --deps: only the npm ci.
set -euo pipefail
CONSOLE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/console"
command -v npm >/dev/null || { echo "console-build: npm not found (scripts/setup.sh installs it)" >&2; exit 1; }
stamp=$(sha256sum "$CONSOLE/package.json" "$CONSOLE/package-lock.json" | sha256sum | cut -c1-16)
if [ "$(cat "$CONSOLE/node_modules/.zygote-stamp" 2>/dev/null)" != "$stamp" ]; then
    echo "console-build: installing the console's dependencies (npm ci)"
    (cd "$CONSOLE" && npm ci --no-audit --no-fund --loglevel=error)
    echo "$stamp" >"$CONSOLE/node_modules/.zygote-stamp"
fi
[ "${1:-}" = "--deps" ] && exit 0
(cd "$CONSOLE" && npm run build --silent)
