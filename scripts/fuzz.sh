#!/usr/bin/env bash
# Fuzz the virtio descriptor-chain handling (virtio-blk requests, virtio-vsock packets)
# and the image-layer applier (tar entries, whiteouts, sparse entries, links) for a
# bounded time per target.
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET=60] [TARGET...]
#       targets: blk_chain vsock_chain (crates/vmm/fuzz), layer_apply (crates/oci/fuzz)
#
# With cargo-fuzz installed (scripts/setup.sh) this runs libFuzzer on a nightly
# toolchain if one is installed, else on stable with RUSTC_BOOTSTRAP=1 (cargo-fuzz
# needs -Z flags). Without cargo-fuzz it falls back to the seeded randomized tests
# (same entry points, structure-aware random inputs) with an iteration count scaled
# to the time budget. Exit status: non-zero when a crash or invariant failure is found.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
secs="${1:-60}"
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(blk_chain vsock_chain layer_apply)

# The crate whose fuzz/ directory holds a target.
crate_of() {
  case "$1" in
    blk_chain | vsock_chain) echo vmm ;;
    layer_apply) echo oci ;;
    *)
      echo "fuzz: unknown target $1" >&2
      exit 2
      ;;
  esac
}

if cargo fuzz --help >/dev/null 2>&1; then
  if rustup run nightly rustc --version >/dev/null 2>&1; then
    toolchain=(+nightly)
    export_env=()
  else
    toolchain=()
    export_env=(RUSTC_BOOTSTRAP=1)
  fi
  for t in "${targets[@]}"; do
    dir="crates/$(crate_of "$t")/fuzz"
    echo "fuzz: $t for ${secs}s (cargo-fuzz ${toolchain[*]:-stable+RUSTC_BOOTSTRAP})"
    mkdir -p "$dir/corpus/$t"
    (cd "$dir" && env "${export_env[@]}" cargo "${toolchain[@]}" fuzz run "$t" "corpus/$t" -- \
      -max_total_time="$secs" -max_len=65536 -rss_limit_mb=2048 -print_final_stats=1)
  done
else
  seed="${ZYGOTE_FUZZ_SEED:-$(date +%s)}"
  vmm=() oci=()
  for t in "${targets[@]}"; do
    case "$(crate_of "$t")" in
      vmm) vmm+=("$t") ;;
      oci) oci+=("$t") ;;
    esac
  done
  if [ ${#vmm[@]} -gt 0 ]; then
    # About 1500 iterations per target-second in a debug build on the 2-core dev machine.
    iters=$((secs * 1500))
    echo "fuzz: cargo-fuzz not installed; seeded randomized test of ${vmm[*]}, $iters iterations per target"
    ZYGOTE_FUZZ_ITERS="$iters" ZYGOTE_FUZZ_SEED="$seed" \
      cargo test -p zygote-vmm --lib devices::virtio::fuzzing -- --nocapture
  fi
  if [ ${#oci[@]} -gt 0 ]; then
    # About 300 layer sets per second in a release build (the profile the project's
    # tests share; every run makes and removes a small tree, on /dev/shm when there).
    iters=$((secs * 300))
    echo "fuzz: cargo-fuzz not installed; seeded randomized test of ${oci[*]}, $iters iterations"
    ZYGOTE_FUZZ_ITERS="$iters" ZYGOTE_FUZZ_SEED="$seed" \
      cargo test --release -p zygote-oci --lib fuzzing::tests::random -- --nocapture
  fi
fi
