#!/usr/bin/env bash
# Builds the binaries of Facet's local Kubernetes 1.35 node (hack/cluster/up.sh):
#   kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl  (hack/tools)
#   fakecri                                                                (hack/tools/fakecri)
#   etcd                                                                   (hack/tools/etcd)
#   containerd ctr containerd-shim-runc-v2                                 (hack/tools/containerd)
#
# They go to a cache directory OUTSIDE the checkout, keyed on the tool modules and
# this script, so the ~10 minute cold build is paid once per machine:
#   ${FACET_CACHE:-$HOME/.cache/facet}/bin/<hash>/
#
# Usage:
#   hack/build-tools.sh                  build what is missing; last line of stdout is the bin dir
#   hack/build-tools.sh --print-bin-dir  print the bin dir only (builds nothing)
#   hack/build-tools.sh --check          exit 0 if everything is built, 1 otherwise (builds nothing)
#
# Environment:
#   FACET_CACHE        cache root (default $HOME/.cache/facet)
#   FACET_BUILD_JOBS   go build -p (default 2: 2 cores; more only adds memory pressure)
#
# Progress goes to stderr, so `BIN=$(hack/build-tools.sh)` captures just the bin dir.
set -euo pipefail

HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
TOOLS_DIR="${HACK_DIR}/tools"

K8S_VERSION="v1.35.4"
CONTAINERD_VERSION="v2.2.9"

# The cache key: everything that decides what gets built. The go.sum files pin
# every dependency; the go.mod files carry the replaces and tool lists; the
# sources of our two tiny mains; this script (flags, ldflags); the Go version.
cache_key() {
  {
    for f in go.mod go.sum fakecri/main.go \
             etcd/go.mod etcd/go.sum etcd/main.go \
             containerd/go.mod containerd/go.sum; do
      printf '%s\n' "$f"
      cat "${TOOLS_DIR}/${f}"
    done
    cat "${BASH_SOURCE[0]}"
    go env GOVERSION GOOS GOARCH
  } | sha256sum | cut -c1-12
}

BIN_DIR="${FACET_CACHE:-$HOME/.cache/facet}/bin/$(cache_key)"

# name | module dir | package | kind (k8s / plain / containerd)
TARGETS=(
  "etcd|etcd|.|plain"
  "fakecri|.|./fakecri|plain"
  "kubectl|.|k8s.io/kubernetes/cmd/kubectl|k8s"
  "kube-apiserver|.|k8s.io/kubernetes/cmd/kube-apiserver|k8s"
  "kube-controller-manager|.|k8s.io/kubernetes/cmd/kube-controller-manager|k8s"
  "kube-scheduler|.|k8s.io/kubernetes/cmd/kube-scheduler|k8s"
  "kubelet|.|k8s.io/kubernetes/cmd/kubelet|k8s"
  "containerd|containerd|github.com/containerd/containerd/v2/cmd/containerd|containerd"
  "containerd-shim-runc-v2|containerd|github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2|containerd"
  "ctr|containerd|github.com/containerd/containerd/v2/cmd/ctr|containerd"
)

missing() {
  local t name
  for t in "${TARGETS[@]}"; do
    name="${t%%|*}"
    [[ -x "${BIN_DIR}/${name}" ]] || echo "${name}"
  done
}

case "${1:-}" in
  --print-bin-dir) echo "${BIN_DIR}"; exit 0 ;;
  --check) [[ -z "$(missing)" ]]; exit $? ;;
  "") ;;
  *) echo "usage: $0 [--print-bin-dir|--check]" >&2; exit 2 ;;
esac

log() { echo "[build-tools] $*" >&2; }

if [[ -z "$(missing)" ]]; then
  log "all binaries up to date in ${BIN_DIR}"
  echo "${BIN_DIR}"
  exit 0
fi

mkdir -p "${BIN_DIR}"

# Without the stamp every binary says v0.0.0-master and `kubectl version`
# fails to parse it. Both the component-base and the client-go copies are read.
K8S_LDFLAGS="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  K8S_LDFLAGS+=" -X ${pkg}.gitVersion=${K8S_VERSION}"
  K8S_LDFLAGS+=" -X ${pkg}.gitMajor=1 -X ${pkg}.gitMinor=35"
  K8S_LDFLAGS+=" -X ${pkg}.gitTreeState=clean"
  K8S_LDFLAGS+=" -X ${pkg}.buildDate=1970-01-01T00:00:00Z"
done
CONTAINERD_LDFLAGS="-s -w -X github.com/containerd/containerd/v2/version.Version=${CONTAINERD_VERSION}"

# 2 cores and 24 GiB: -p=2 keeps the peak (~2 GB for the kubelet/apiserver link)
# well inside memory while still using both cores. Static, cgo-free binaries:
# they only need the kernel, and the pure-Go resolver reads /etc/hosts for
# "localhost" (the kubelet's node name). no_btrfs: containerd's btrfs
# snapshotter needs cgo and libbtrfs headers, and we use overlayfs.
export CGO_ENABLED=0
export GOFLAGS="-p=${FACET_BUILD_JOBS:-2} -buildvcs=false -trimpath"
# Read-only module mode: the go.sum files are the pinned truth.
export GOFLAGS="${GOFLAGS} -mod=readonly"

total_start=${SECONDS}
to_build=$(missing | wc -l)
n=0
for t in "${TARGETS[@]}"; do
  IFS='|' read -r name moddir pkg kind <<<"${t}"
  if [[ -x "${BIN_DIR}/${name}" ]]; then
    log "${name}: cached"
    continue
  fi
  n=$((n + 1))
  case "${kind}" in
    k8s) ldflags="${K8S_LDFLAGS}"; tags="" ;;
    containerd) ldflags="${CONTAINERD_LDFLAGS}"; tags="no_btrfs" ;;
    *) ldflags="-s -w"; tags="" ;;
  esac
  log "(${n}/${to_build}) building ${name} ..."
  start=${SECONDS}
  # Heartbeat: a cold kube-apiserver build is minutes of silence otherwise.
  ( while sleep 30; do log "    ... still building ${name} ($((SECONDS - start))s)"; done ) &
  ticker=$!
  tmp="${BIN_DIR}/.${name}.tmp.$$"
  if ! (cd "${TOOLS_DIR}/${moddir}" && go build -tags "${tags}" -ldflags "${ldflags}" -o "${tmp}" "${pkg}"); then
    kill "${ticker}" 2>/dev/null || true
    rm -f "${tmp}"
    log "FAILED to build ${name} after $((SECONDS - start))s"
    exit 1
  fi
  kill "${ticker}" 2>/dev/null || true
  wait "${ticker}" 2>/dev/null || true
  mv -f "${tmp}" "${BIN_DIR}/${name}"  # atomic: a half-built binary is never "cached"
  log "(${n}/${to_build}) ${name} built in $((SECONDS - start))s"
done

log "done in $((SECONDS - total_start))s: ${BIN_DIR}"
"${BIN_DIR}/kubectl" version --client 2>/dev/null | sed 's/^/[build-tools] /' >&2 || true
echo "${BIN_DIR}"
