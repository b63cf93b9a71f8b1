#!/usr/bin/env bash
# Fuzz what zygote reads from hostile sources for a bounded time per target:
#   blk_chain vsock_chain  virtio descriptor chains in guest memory (zygote-vmm)
#   agent_frames           frames from the in-guest agent (zygote-proto's client)
#   layer_apply            image layers: tar entries, whiteouts, sparse files, links (zygote-oci)
#   pack_import            uploaded snapshot packs: archive reader, staging, sparse decoder
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET=60] [TARGET...]
#
# With cargo-fuzz installed (scripts/setup.sh) this runs libFuzzer on a nightly toolchain
# if one is installed, else on stable with RUSTC_BOOTSTRAP=1 (cargo-fuzz needs -Z flags).
# All targets are one crate (fuzz/), built once into ~/.cache/zygote/fuzz-target (keyed by
# cargo's own fingerprints, so a second run rebuilds only what changed). Without cargo-fuzz
# it falls back to the seeded randomized tests of the same entry points, with iteration
# counts scaled to the time budget. Exit status: non-zero when a crash or invariant
# failure is found.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
secs="${1:-60}"
shift || true
targets=("$@")
all=(blk_chain vsock_chain agent_frames layer_apply pack_import)
[ ${#targets[@]} -gt 0 ] || targets=("${all[@]}")
for t in "${targets[@]}"; do
  [[ " ${all[*]} " == *" $t "* ]] || { echo "fuzz: unknown target $t (known: ${all[*]})" >&2; exit 2; }
done
wants() { [[ " ${targets[*]} " == *" $1 "* ]]; }

# libFuzzer flags of a target's own: an allocation past the 16 MiB frame limit is a finding.
flags_of() { case "$1" in agent_frames) echo -malloc_limit_mb=17 ;; esac; }

if cargo fuzz --help >/dev/null 2>&1; then
  if rustup run nightly rustc --version >/dev/null 2>&1; then
    toolchain=(+nightly)
    export_env=()
  else
    toolchain=()
    export_env=(RUSTC_BOOTSTRAP=1)
  fi
  target_dir="${ZYGOTE_CACHE_DIR:-$HOME/.cache/zygote}/fuzz-target"
  mkdir -p "$target_dir"
  cd fuzz
  for t in "${targets[@]}"; do
    echo "fuzz: $t for ${secs}s (cargo-fuzz ${toolchain[*]:-stable+RUSTC_BOOTSTRAP})"
    mkdir -p "corpus/$t"
    # shellcheck disable=SC2046
    env "${export_env[@]}" cargo "${toolchain[@]}" fuzz run --target-dir "$target_dir" \
      "$t" "corpus/$t" -- -max_total_time="$secs" -max_len=65536 -rss_limit_mb=2048 \
      -print_final_stats=1 $(flags_of "$t")
  done
  exit 0
fi

seed="${ZYGOTE_FUZZ_SEED:-$(date +%s)}"
echo "fuzz: cargo-fuzz not installed; seeded randomized tests (seed $seed)"
if wants blk_chain || wants vsock_chain; then
  # About 1500 iterations per target-second in a debug build on the 2-core dev machine.
  ZYGOTE_FUZZ_ITERS=$((secs * 1500)) ZYGOTE_FUZZ_SEED="$seed" \
    cargo test -p zygote-vmm --lib devices::virtio::fuzzing -- --nocapture
fi
if wants agent_frames; then
  # About 10000 frames streams per second in a release build here.
  ZYGOTE_FUZZ_ITERS=$((secs * 10000)) ZYGOTE_FUZZ_SEED="$seed" \
    cargo test --release -p zygote-proto --test agent_frames_fuzz -- --nocapture
fi
if wants layer_apply; then
  # About 300 layer sets per second in a release build (each makes and removes a tree).
  ZYGOTE_FUZZ_ITERS=$((secs * 300)) ZYGOTE_FUZZ_SEED="$seed" \
    cargo test --release -p zygote-oci --lib fuzzing::tests::random -- --nocapture
fi
if wants pack_import; then
  # About 12 uploads per second through a daemon on the 2-core dev machine.
  ZYGOTE_FUZZ_ITERS=$((secs * 12)) ZYGOTE_FUZZ_SEED="$seed" \
    cargo test --release -p zygote-daemon --test pack_fuzz -- --nocapture
fi
