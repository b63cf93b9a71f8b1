#!/usr/bin/env bash
# Builds what `make test-k8s` needs from the Go module proxy, cached by version under
# ~/.cache/zygote/k8s (override: ZYGOTE_K8S_CACHE): kube-apiserver and kubectl v1.34.0,
# etcd v3.6.4 (no prebuilt binaries: the module proxy is the only source). The Go module
# and build caches live there too, so a warm rerun takes seconds.
# Prints the directory holding the three binaries (envtest's KUBEBUILDER_ASSETS layout)
# as its last line.
#   ZYGOTE_K8S_CONTROLLER_GEN=1  also build controller-gen (for `make k8s-generate`)
set -euo pipefail

K8S_VERSION=v1.34.0
K8S_STAGING=v0.34.0
ETCD_VERSION=v3.6.4
CONTROLLER_TOOLS_VERSION=v0.19.0

CACHE=${ZYGOTE_K8S_CACHE:-$HOME/.cache/zygote/k8s}
export GOMODCACHE=$CACHE/gomod
export GOCACHE=$CACHE/gocache
export GOTOOLCHAIN=local GOFLAGS=-buildvcs=false CGO_ENABLED=0
BIN=$CACHE/bin/k8s-$K8S_VERSION-etcd-$ETCD_VERSION
mkdir -p "$BIN" "$GOMODCACHE" "$GOCACHE"

log() { printf '\033[1m[k8s-setup]\033[0m %s\n' "$*" >&2; }

# Go: this project's machines come with go1.26 (k8s 1.34 needs 1.24+). Debian 12's own
# golang-go (1.19) is too old to build Kubernetes: say so rather than fail mid-build.
if ! command -v go >/dev/null 2>&1; then
  log "installing Go (Debian's golang-go)"
  apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q golang-go >&2
fi
# shellcheck source=lib/k8s-go.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/k8s-go.sh"
problem=$(k8s_go_problem)
if [ -n "$problem" ]; then
  echo "k8s-setup: $problem" >&2
  exit 1
fi
command -v openssl >/dev/null 2>&1 || {
  log "installing openssl"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q openssl >&2
}

# kube-apiserver and kubectl: k8s.io/kubernetes cannot be `go install`ed (its go.mod
# replaces the staging modules by ./staging), so a scratch module requires it and
# replaces each staging module by its published version.
build_kube() {
  local src=$CACHE/src/kubernetes-$K8S_VERSION
  if [ ! -f "$src/go.sum" ] || ! grep -q kube-apiserver "$src/.done" 2>/dev/null; then
    log "preparing the kubernetes $K8S_VERSION build module"
    rm -rf "$src" && mkdir -p "$src"
    (
      cd "$src"
      cat >go.mod <<MOD
module zygote.dev/k8sbuild

go 1.24.0

require k8s.io/kubernetes $K8S_VERSION
MOD
      go mod download -json k8s.io/kubernetes@$K8S_VERSION >/dev/null
      local kmod
      kmod=$(go mod download -json k8s.io/kubernetes@$K8S_VERSION | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
      # Each `k8s.io/x => ./staging/src/k8s.io/x` becomes `k8s.io/x => k8s.io/x v0.34.0`.
      {
        echo "replace ("
        sed -n 's#^\s*\(k8s.io/[a-z0-9./-]*\) => ./staging/src/.*#\t\1 => \1 '"$K8S_STAGING"'#p' "$kmod"
        echo ")"
      } >>go.mod
      go get k8s.io/kubernetes/cmd/kube-apiserver@$K8S_VERSION >&2
      go get k8s.io/kubernetes/cmd/kubectl@$K8S_VERSION >&2
      echo kube-apiserver >.done
    )
  fi
  local ld="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION \
-X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=34 \
-X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION"
  for cmd in kube-apiserver kubectl; do
    if [ ! -x "$BIN/$cmd" ]; then
      log "building $cmd $K8S_VERSION (kube-apiserver: ~3 min cold on 2 cores)"
      (cd "$src" && go build -p "$(nproc)" -trimpath -ldflags "$ld" -o "$BIN/$cmd.tmp" "k8s.io/kubernetes/cmd/$cmd") >&2
      mv "$BIN/$cmd.tmp" "$BIN/$cmd"
    fi
  done
}

build_etcd() {
  [ -x "$BIN/etcd" ] && return 0
  local src=$CACHE/src/etcd-$ETCD_VERSION
  log "building etcd $ETCD_VERSION"
  rm -rf "$src" && mkdir -p "$src"
  (
    cd "$src"
    cat >go.mod <<MOD
module zygote.dev/etcdbuild

go 1.24.0

require go.etcd.io/etcd/server/v3 $ETCD_VERSION

replace (
	go.etcd.io/etcd/api/v3 => go.etcd.io/etcd/api/v3 $ETCD_VERSION
	go.etcd.io/etcd/client/pkg/v3 => go.etcd.io/etcd/client/pkg/v3 $ETCD_VERSION
	go.etcd.io/etcd/client/v3 => go.etcd.io/etcd/client/v3 $ETCD_VERSION
	go.etcd.io/etcd/pkg/v3 => go.etcd.io/etcd/pkg/v3 $ETCD_VERSION
)
MOD
    go get go.etcd.io/etcd/server/v3@$ETCD_VERSION >&2
    go build -p "$(nproc)" -trimpath -ldflags "-s -w" -o "$BIN/etcd.tmp" go.etcd.io/etcd/server/v3 >&2
  )
  mv "$BIN/etcd.tmp" "$BIN/etcd"
}

build_controller_gen() {
  [ -x "$CACHE/bin/controller-gen-$CONTROLLER_TOOLS_VERSION" ] && return 0
  log "building controller-gen $CONTROLLER_TOOLS_VERSION"
  GOBIN=$CACHE/bin/cg-tmp go install sigs.k8s.io/controller-tools/cmd/controller-gen@$CONTROLLER_TOOLS_VERSION >&2
  mv "$CACHE/bin/cg-tmp/controller-gen" "$CACHE/bin/controller-gen-$CONTROLLER_TOOLS_VERSION"
}

build_etcd
build_kube
if [ "${ZYGOTE_K8S_CONTROLLER_GEN:-0}" = 1 ]; then
  build_controller_gen
fi
log "ready: $BIN"
echo "$BIN"
