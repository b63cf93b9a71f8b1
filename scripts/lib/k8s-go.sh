# shellcheck shell=bash
# The Go that builds Kubernetes 1.34 must be 1.24 or newer (Debian 12's golang-go is
# 1.19). Sourced by k8s-setup.sh (which fails without it) and k8s-test.sh (which skips).

K8S_MIN_GO=1.24

# Prints why this machine's Go cannot build Kubernetes, or nothing when it can.
k8s_go_problem() {
  local gov
  gov=$(go env GOVERSION 2>/dev/null | sed 's/^go//' || true)
  if [ -z "$gov" ]; then
    echo "Go $K8S_MIN_GO or newer is needed to build kube-apiserver (found: no go)"
  elif [ "$(printf '%s\n%s\n' "${gov%%[a-z]*}" "$K8S_MIN_GO" | sort -V | head -n 1)" != "$K8S_MIN_GO" ]; then
    echo "Go $K8S_MIN_GO or newer is needed to build kube-apiserver (found: $gov)"
  fi
}
