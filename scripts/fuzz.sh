#!/usr/bin/env bash
# Fuzz the virtio descriptor-chain handling (virtio-blk requests, virtio-vsock packets)
# and snapshot pack import for a bounded time per target.
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET=60] [TARGET...]
#   targets: blk_chain vsock_chain (crates/vmm/fuzz), pack_import (crates/oci/fuzz)
#
# With cargo-fuzz installed (scripts/setup.sh) this runs libFuzzer on a nightly
# toolchain if one is installed, else on stable with RUSTC_BOOTSTRAP=1 (cargo-fuzz
# needs -Z flags). Without cargo-fuzz it falls back to the seeded randomized test
# (same entry points, structure-aware random inputs) with an iteration count scaled
# to the time budget. Exit status: non-zero when a crash or invariant failure is found.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
secs="${1:-60}"
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(blk_chain vsock_chain pack_import)
fuzz_dir() { case "$1" in pack_import) echo crates/oci/fuzz ;; *) echo crates/vmm/fuzz ;; esac; }

if cargo fuzz --help >/dev/null 2>&1; then
  if rustup run nightly rustc --version >/dev/null 2>&1; then
    toolchain=(+nightly)
    export_env=()
  else
    toolchain=()
    export_env=(RUSTC_BOOTSTRAP=1)
  fi
  for t in "${targets[@]}"; do
    echo "fuzz: $t for ${secs}s (cargo-fuzz ${toolchain[*]:-stable+RUSTC_BOOTSTRAP})"
    (cd "$(fuzz_dir "$t")" && mkdir -p "corpus/$t" &&
      env "${export_env[@]}" cargo "${toolchain[@]}" fuzz run "$t" "corpus/$t" -- \
        -max_total_time="$secs" -max_len=65536 -rss_limit_mb=2048 -print_final_stats=1)
  done
else
  # About 1500 iterations per target-second in a debug build on the 2-core dev machine.
  iters=$((secs * 1500))
  echo "fuzz: cargo-fuzz not installed; seeded randomized test, $iters iterations per target"
  seed="${ZYGOTE_FUZZ_SEED:-$(date +%s)}"
  if [[ " ${targets[*]} " =~ " blk_chain " || " ${targets[*]} " =~ " vsock_chain " ]]; then
    ZYGOTE_FUZZ_ITERS="$iters" ZYGOTE_FUZZ_SEED="$seed" \
      cargo test -p zygote-vmm --lib devices::virtio::fuzzing -- --nocapture
  fi
  if [[ " ${targets[*]} " =~ " pack_import " ]]; then
    # About 12 uploads per second through a daemon on the 2-core dev machine.
    echo "fuzz: pack_import: $((secs * 12)) uploads (seed $seed)"
    ZYGOTE_FUZZ_ITERS="$((secs * 12))" ZYGOTE_FUZZ_SEED="$seed" \
      cargo test --release -p zygote-daemon --test pack_fuzz -- --nocapture
  fi
fi
