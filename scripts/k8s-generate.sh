#!/usr/bin/env bash
# Regenerates k8s/config/crd/bases/*.yaml and k8s/api/v1alpha1/zz_generated.deepcopy.go
# from the Go types' markers with controller-gen (built from the module proxy, cached).
set -euo pipefail
cd "$(dirname "$0")/.."
ZYGOTE_K8S_CONTROLLER_GEN=1 bash scripts/k8s-setup.sh >/dev/null
CACHE=${ZYGOTE_K8S_CACHE:-$HOME/.cache/zygote/k8s}
export GOMODCACHE=$CACHE/gomod GOCACHE=$CACHE/gocache GOTOOLCHAIN=local GOFLAGS=-buildvcs=false
cd k8s
"$CACHE"/bin/controller-gen-v0.19.0 object:headerFile=hack/boilerplate.go.txt paths=./api/... \
  crd:maxDescLen=400 output:crd:artifacts:config=config/crd/bases
echo "regenerated the CRDs and deepcopy code"
