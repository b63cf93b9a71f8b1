#!/usr/bin/env bash
# Installs everything zygote needs to build and test on Debian 12.
# Idempotent: each step checks before it installs, so reruns take seconds.
set -euo pipefail

APT_PACKAGES=(
  build-essential pkg-config bc flex bison libelf-dev libssl-dev cpio xz-utils
  qemu-system-x86 linux-source-6.1 busybox-static debootstrap musl-tools
  e2fsprogs xfsprogs btrfs-progs util-linux iproute2 python3-venv
  qemu-utils nftables iperf3
  fonts-dejavu-core  # text in `zygote bench ... --plot` pictures (read at run time)
  docker-registry skopeo umoci  # OCI image tests: a real registry on loopback, images made by the tests
  apache2-utils  # htpasswd: the tests' registry with Basic auth
  openssl  # the tests' registry token server signs with it
  chromium  # the web console's browser tests (scripts/console-test.sh, headless via playwright-core)
)
RUST_TARGETS=(x86_64-unknown-none x86_64-unknown-linux-musl)
RUST_COMPONENTS=(rustfmt clippy)

log() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing Debian packages: ${missing[*]}"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  log "Debian packages present"
fi
# node + npm for the TypeScript SDK and E2B's JS SDK tests. A host that has them (e.g.
# a newer node from elsewhere) keeps its own; scripts/e2b-node.sh fetches a node new
# enough for E2B's SDK when this one (Debian 12: 18) is older.
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  log "installing Debian packages: nodejs npm"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends nodejs npm
fi

if ! command -v rustup >/dev/null 2>&1; then
  echo "rustup not found: install Rust with rustup first" >&2
  exit 1
fi
installed_targets=$(rustup target list --installed)
for target in "${RUST_TARGETS[@]}"; do
  if ! grep -qx "$target" <<<"$installed_targets"; then
    log "adding Rust target $target"
    rustup target add "$target"
  fi
done
installed_components=$(rustup component list --installed)
for comp in "${RUST_COMPONENTS[@]}"; do
  if ! grep -q "^$comp" <<<"$installed_components"; then
    log "adding Rust component $comp"
    rustup component add "$comp"
  fi
done
log "done"

# Fuzzing (scripts/fuzz.sh: virtio chains, agent frames, layers, packs) needs cargo-fuzz. Opt-in because it
# compiles for minutes: ZYGOTE_SETUP_FUZZ=1 scripts/setup.sh. scripts/fuzz.sh uses a
# nightly toolchain when one is installed, else stable with RUSTC_BOOTSTRAP=1, and
# without cargo-fuzz falls back to the seeded randomized test.
if [ "${ZYGOTE_SETUP_FUZZ:-0}" = 1 ] && ! cargo fuzz --help >/dev/null 2>&1; then
  log "installing cargo-fuzz"
  cargo install --locked cargo-fuzz
fi
