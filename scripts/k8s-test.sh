#!/usr/bin/env bash
# `make test-k8s`: zygote on Kubernetes against a real control plane on loopback.
# Builds (cached under ~/.cache/zygote/k8s, keyed by version) kube-apiserver, etcd and
# kubectl, then the controller and the node agent, then runs the Go tests: the unit
# tests (placement, pools) and k8s/test/e2e (etcd + kube-apiserver through envtest,
# the CRDs, the controller, three zygoted on the qemu runtime with a node agent each).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
start=$(date +%s)
# Without a Go that builds Kubernetes this suite skips, saying why, unless
# ZYGOTE_K8S_REQUIRED=1.
# shellcheck source=lib/k8s-go.sh
. scripts/lib/k8s-go.sh
why=$(k8s_go_problem)
if [ -n "$why" ]; then
  if [ "${ZYGOTE_K8S_REQUIRED:-0}" = 1 ]; then echo "k8s-test: $why" >&2; exit 1; fi
  echo "k8s-test: SKIPPED: $why"
  exit 0
fi
ASSETS=$(bash scripts/k8s-setup.sh | tail -n 1)
CACHE=${ZYGOTE_K8S_CACHE:-$HOME/.cache/zygote/k8s}
export GOMODCACHE=$CACHE/gomod GOCACHE=$CACHE/gocache GOTOOLCHAIN=local GOFLAGS=-buildvcs=false
cd k8s
mkdir -p bin
go build -o bin/zygote-controller ./cmd/zygote-controller
go build -o bin/zygote-node ./cmd/zygote-node
echo "[k8s-test] tools and binaries ready in $(( $(date +%s) - start ))s"
export KUBEBUILDER_ASSETS=$ASSETS ZYGOTED=$ROOT/target/release/zygoted
export ZYGOTE_CONTROLLER=$ROOT/k8s/bin/zygote-controller ZYGOTE_NODE=$ROOT/k8s/bin/zygote-node
unformatted=$(gofmt -l .)
if [ -n "$unformatted" ]; then echo "gofmt needed: $unformatted" >&2; exit 1; fi
go vet ./...
go test -count=1 ./api/... ./internal/...
go test -count=1 -v -timeout 30m ./test/e2e/ 2>&1 | tee /tmp/zygote-k8s-e2e.log | grep -v '^\s*$'
status=${PIPESTATUS[0]}
echo "[k8s-test] done in $(( $(date +%s) - start ))s"
exit "$status"
