#!/usr/bin/env bash
# Builds the probe guest ELF and prints its absolute path as the last stdout line.
# Cargo's own output goes to stderr.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"
cargo build --release --locked --target x86_64-unknown-none "$@" >&2
echo "$here/target/x86_64-unknown-none/release/zygote-probe"
