#!/usr/bin/env bash
# Builds zygote's kernel from Debian's linux-source-6.1 package: `make tinyconfig` plus
# guest/kernel/zygote.config. One build serves both the sandbox guest (vmlinux, PVH
# entry) and the nested lane's L1 host (bzImage): see the fragment's header.
#
# Result: $CACHE/kernel/<key>/{vmlinux,bzImage,config,info}, where
#   CACHE = $ZYGOTE_CACHE_DIR or ~/.cache/zygote
#   key   = sha256 of (source package name+version, the fragment, this script)
# so any change to the inputs produces a new directory and a cache hit costs only the
# hashing. The last line on stdout is the path of vmlinux (bzImage is beside it);
# progress goes to stderr (condensed), the full make output to <object dir>/build.log.
#
# Usage: build.sh          build (or find in the cache), print the path of vmlinux
#        build.sh --key    print the cache key only
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
self=$here/build.sh
pkg=linux-source-6.1
tarball=/usr/src/$pkg.tar.xz
root=${ZYGOTE_CACHE_DIR:-$HOME/.cache/zygote}
cache=$root/kernel

key_only=0
while [ $# -gt 0 ]; do
  case $1 in
  --key) key_only=1; shift ;;
  *) echo "[kernel] error: unknown argument $1 (usage: build.sh [--key])" >&2; exit 2 ;;
  esac
done
fragments=("$here/zygote.config")
outdir=$cache
targets=(vmlinux bzImage)
say() { printf '[kernel] %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

pkgver=$(dpkg-query -W -f='${Version}' "$pkg" 2>/dev/null) ||
  die "$pkg is not installed (run scripts/setup.sh)"
[ -f "$tarball" ] || die "$tarball missing (reinstall $pkg)"

key=$({ printf 'package %s %s\n' "$pkg" "$pkgver"; cat "${fragments[@]}" "$self"; } |
  sha256sum | cut -c1-64)
out=$outdir/$key
if [ "$key_only" = 1 ]; then
  echo "$key"
  exit 0
fi
# What the last line of stdout names.
product=${targets[0]}

if [ -f "$out/$product" ] && [ -f "$out/info" ]; then
  say "cached: $out"
  echo "$out/$product"
  exit 0
fi

mkdir -p "$cache"
# One builder at a time: the extracted source and the object directory are
# shared between keys so that a fragment change rebuilds incrementally.
exec 9>"$cache/.lock"
if ! flock -n 9; then
  say "waiting for another kernel build to finish"
  flock 9
fi
if [ -f "$out/$product" ] && [ -f "$out/info" ]; then
  say "cached: $out"
  echo "$out/$product"
  exit 0
fi

src=$cache/src/$pkgver
if [ ! -f "$src/.extracted" ]; then
  say "extracting $tarball ($pkg $pkgver)"
  rm -rf "$src"
  mkdir -p "$src"
  tar -xJf "$tarball" -C "$src" --strip-components=1
  touch "$src/.extracted"
fi

build=$cache/build/$pkgver
mkdir -p "$build"
log=$build/build.log
: >"$log"
kmake() { make -C "$src" O="$build" ARCH=x86_64 LOCALVERSION= "$@"; }

say "configuring: tinyconfig + ${fragments[*]##*/}"
kmake tinyconfig >>"$log" 2>&1 || die "make tinyconfig failed (see $log)"
(cd "$build" && "$src/scripts/kconfig/merge_config.sh" -m -O "$build" \
  "$build/.config" "${fragments[@]}") >>"$log" 2>&1 || die "merge_config.sh failed (see $log)"
kmake olddefconfig >>"$log" 2>&1 || die "make olddefconfig failed (see $log)"

# Every option of the fragments must survive olddefconfig; kconfig drops options
# whose dependencies are unmet without failing, which would surface much later
# as a guest that cannot find its disk or network. Where fragments disagree, the
# later one is what must hold (as merge_config.sh applied it).
declare -A wanted=()
order=()
for fragment in "${fragments[@]}"; do
  while IFS= read -r line; do
    case $line in CONFIG_*=*) ;; *) continue ;; esac
    name=${line%%=*}
    [ -n "${wanted[$name]+set}" ] || order+=("$name")
    wanted[$name]=$line
  done <"$fragment"
done
dropped=()
for name in "${order[@]}"; do
  line=${wanted[$name]}
  want=${line#*=}
  have=$(grep -E "^(# )?$name[= ]" "$build/.config" || true)
  if [ "$want" = n ]; then
    case $have in "" | "# $name is not set") ;; *) dropped+=("$line (have: $have)") ;; esac
  elif [ "$have" != "$line" ]; then
    dropped+=("$line (have: ${have:-absent})")
  fi
done
if [ ${#dropped[@]} -gt 0 ]; then
  say "error: these options of ${fragments[*]##*/} did not take effect:"
  printf '[kernel]   %s\n' "${dropped[@]}" >&2
  exit 1
fi

jobs=$(nproc)
say "building ${targets[*]} with -j$jobs (several minutes on 2 cores)"
start=$(date +%s)
# Condense the ~1500 "CC foo.o" lines into one progress line every 50 steps
# (out of the total the previous build took, when known).
total=$(cat "$build/steps-total" 2>/dev/null || echo "?")
set +e
kmake -j"$jobs" "${targets[@]}" 2>&1 | tee -a "$log" | {
  n=0
  while IFS= read -r line; do
    case $line in
    "  "[A-Z]*)
      n=$((n + 1))
      if [ $((n % 50)) -eq 0 ]; then
        read -r _ file _ <<<"$line"
        printf '[kernel] step %d/%s: %s\n' "$n" "$total" "$file" >&2
      fi
      ;;
    esac
  done
  echo "$n" >"$build/steps-count"
}
status=${PIPESTATUS[0]}
set -e
if [ "$status" -ne 0 ]; then
  say "error: make failed; last lines of $log:"
  grep -E 'error|Error' "$log" | tail -n 20 >&2 || true
  tail -n 20 "$log" >&2
  exit 1
fi

# Keep the largest count seen: that of a full build, not of an incremental one.
steps=$(cat "$build/steps-count" 2>/dev/null || echo 0)
if [ "$total" = "?" ] || [ "$steps" -gt "$total" ]; then
  echo "$steps" >"$build/steps-total"
fi
version=$(make -s -C "$src" kernelversion)
release=$(kmake -s kernelrelease)
tmp=$out.tmp.$$
rm -rf "$tmp"
mkdir -p "$tmp"
cp "$build/vmlinux" "$tmp/vmlinux"
cp "$build/arch/x86/boot/bzImage" "$tmp/bzImage"
cp "$build/.config" "$tmp/config"
cat >"$tmp/info" <<EOF
package=$pkg
package_version=$pkgver
kernelversion=$version
kernelrelease=$release
key=$key
EOF
mkdir -p "$outdir"
rm -rf "$out"
mv "$tmp" "$out"
say "built $release in $(($(date +%s) - start))s: $out"
echo "$out/$product"
