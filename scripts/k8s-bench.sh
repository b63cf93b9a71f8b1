#!/usr/bin/env bash
# `make bench-k8s`: the measurements of bench/README.md (issue 23) on a loopback cluster:
# claim latency, create-to-running (API server vs daemon), node loss, memory, and many
# Sandboxes across 3 nodes. Extra arguments go to zygote-k8s-bench (e.g. -scale 30).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
ASSETS=$(bash scripts/k8s-setup.sh | tail -n 1)
CACHE=${ZYGOTE_K8S_CACHE:-$HOME/.cache/zygote/k8s}
export GOMODCACHE=$CACHE/gomod GOCACHE=$CACHE/gocache GOTOOLCHAIN=local GOFLAGS=-buildvcs=false
cd k8s
mkdir -p bin
go build -o bin/zygote-controller ./cmd/zygote-controller
go build -o bin/zygote-node ./cmd/zygote-node
go build -o bin/zygote-k8s-bench ./cmd/zygote-k8s-bench
export KUBEBUILDER_ASSETS=$ASSETS ZYGOTED=$ROOT/target/release/zygoted
export ZYGOTE_CONTROLLER=$ROOT/k8s/bin/zygote-controller ZYGOTE_NODE=$ROOT/k8s/bin/zygote-node
exec bin/zygote-k8s-bench "$@"
