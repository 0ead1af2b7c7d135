#!/usr/bin/env bash
# Builds Kubernetes components of one version, next to etcd, and prints the
# bin dir on the last line of stdout: kube-apiserver and kube-scheduler for the
# scale benchmark (hack/scale, `make bench-scale`), and with FACET_K8S_COMPONENTS
# also kube-controller-manager and the kubelet for the local node on that
# version (FACET_K8S_VERSION, hack/cluster/up.sh).
#
#   hack/build-k8s.sh v1.35.4   the local node's binaries (hack/build-tools.sh)
#   hack/build-k8s.sh v1.36.3   hack/tools/k8s-1.36 (its go.mod pins the version)
#   FACET_K8S_COMPONENTS="kube-apiserver kube-controller-manager kube-scheduler kubelet" \
#     hack/build-k8s.sh v1.36.3
#
# Other versions need their own tools module, hack/tools/k8s-<major.minor>,
# with k8s.io/kubernetes at that version and its staging modules replaced by
# the matching v0.<minor>.<patch> releases, and a `tool` line for each
# component built from it (go get -tool k8s.io/kubernetes/cmd/<name>@<version>
# adds the go.sum entries its packages need). hack/build-tools.sh is left as
# it is: its cache key hashes the script, so editing it would rebuild every
# binary of the local node.
#
# Environment:
#   FACET_K8S_COMPONENTS  the components to build (default "kube-apiserver
#                         kube-scheduler"); each is built once per bin dir, so
#                         asking for more later adds to the same cache entry
#   FACET_CACHE           cache root (default $HOME/.cache/facet)
#   FACET_BUILD_JOBS      go build -p (default 2)
#
# The binaries go to ${FACET_CACHE:-$HOME/.cache/facet}/bin/k8s-<version>-<hash>/,
# keyed on the tools module and this script; a cold build is minutes per
# binary on 2 cores (docs/design/local-cluster.md has the measured times).
# Progress goes to stderr.
set -euo pipefail

HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VERSION="${1:?usage: $0 vMAJOR.MINOR.PATCH [--print-bin-dir]}"
log() { echo "[build-k8s] $*" >&2; }

# etcd (and everything of 1.35.4) comes from hack/build-tools.sh.
if [[ "${2:-}" == --print-bin-dir ]]; then
  TOOLS_BIN="$("${HACK_DIR}/build-tools.sh" --print-bin-dir)"
else
  TOOLS_BIN="$("${HACK_DIR}/build-tools.sh" | tail -n1)"
fi
if [[ "${VERSION}" == v1.35.4 ]]; then
  echo "${TOOLS_BIN}"
  exit 0
fi

COMPONENTS="${FACET_K8S_COMPONENTS:-kube-apiserver kube-scheduler}"
for name in ${COMPONENTS}; do
  case "${name}" in
    kube-apiserver|kube-controller-manager|kube-scheduler|kubelet) ;;
    *) echo "FACET_K8S_COMPONENTS: unknown component '${name}'" >&2; exit 2 ;;
  esac
done

minor="${VERSION#v}"; minor="${minor%.*}"
MOD_DIR="${HACK_DIR}/tools/k8s-${minor}"
if [[ ! -f "${MOD_DIR}/go.mod" ]]; then
  echo "no tools module for ${VERSION}: create ${MOD_DIR}/go.mod (see hack/tools/k8s-1.36)" >&2
  exit 2
fi
if ! grep -qE "k8s.io/kubernetes ${VERSION}( |\$)" "${MOD_DIR}/go.mod"; then
  echo "${MOD_DIR}/go.mod does not require k8s.io/kubernetes ${VERSION}" >&2
  exit 2
fi
for name in ${COMPONENTS}; do
  if ! grep -qE "^\s+k8s.io/kubernetes/cmd/${name}\$" "${MOD_DIR}/go.mod"; then
    echo "${MOD_DIR}/go.mod has no tool line for ${name}: go get -tool k8s.io/kubernetes/cmd/${name}@${VERSION}" >&2
    exit 2
  fi
done
key="$({ cat "${MOD_DIR}/go.mod" "${MOD_DIR}/go.sum" "${BASH_SOURCE[0]}"; go env GOVERSION GOOS GOARCH; } | sha256sum | cut -c1-12)"
BIN_DIR="${FACET_CACHE:-$HOME/.cache/facet}/bin/k8s-${VERSION}-${key}"
if [[ "${2:-}" == --print-bin-dir ]]; then
  echo "${BIN_DIR}"
  exit 0
fi
mkdir -p "${BIN_DIR}"
ln -sf "${TOOLS_BIN}/etcd" "${BIN_DIR}/etcd"

ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X ${pkg}.gitVersion=${VERSION} -X ${pkg}.gitMajor=1 -X ${pkg}.gitMinor=${minor#1.}"
  ldflags+=" -X ${pkg}.gitTreeState=clean -X ${pkg}.buildDate=1970-01-01T00:00:00Z"
done
export CGO_ENABLED=0
export GOFLAGS="-p=${FACET_BUILD_JOBS:-2} -buildvcs=false -trimpath -mod=readonly"
for name in ${COMPONENTS}; do
  if [[ -x "${BIN_DIR}/${name}" ]]; then
    log "${name} ${VERSION}: cached"
    continue
  fi
  log "building ${name} ${VERSION} ..."
  start=${SECONDS}
  tmp="${BIN_DIR}/.${name}.tmp.$$"
  (cd "${MOD_DIR}" && go build -ldflags "${ldflags}" -o "${tmp}" "k8s.io/kubernetes/cmd/${name}") || { rm -f "${tmp}"; exit 1; }
  mv -f "${tmp}" "${BIN_DIR}/${name}"
  log "${name} ${VERSION} built in $((SECONDS - start))s"
done
echo "${BIN_DIR}"
