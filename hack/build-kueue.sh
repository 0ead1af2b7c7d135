#!/usr/bin/env bash
# Builds Kueue's manager (sigs.k8s.io/kueue/cmd/kueue, pinned in
# hack/tools/kueue/go.mod) for the Kueue tests on the local node (test/kueue,
# hack/kueue.sh) and `FACET_DEMO_KUEUE=1 make demo`, and copies Kueue's CRDs
# out of the same module version (config/components/crd/bases) next to it:
#   ${FACET_CACHE:-$HOME/.cache/facet}/bin/kueue-<version>-<hash>/kueue
#   ${FACET_CACHE:-$HOME/.cache/facet}/bin/kueue-<version>-<hash>/crds/*.yaml
# keyed on the tools module and this script, so the cold build (about 5
# minutes on 2 cores, a ~125 MB binary; docs/kueue.md) is paid once per machine.
#
# Usage:
#   hack/build-kueue.sh                  build what is missing; last line of stdout is the bin dir
#   hack/build-kueue.sh --print-bin-dir  print the bin dir only (builds nothing)
#
# Environment:
#   FACET_CACHE       cache root (default $HOME/.cache/facet)
#   FACET_BUILD_JOBS  go build -p (default 2)
#
# Progress goes to stderr.
set -euo pipefail

HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
MOD_DIR="${HACK_DIR}/tools/kueue"
log() { echo "[build-kueue] $*" >&2; }

VERSION="$(awk '$1 == "sigs.k8s.io/kueue" { print $2 }' "${MOD_DIR}/go.mod")"
[[ -n "${VERSION}" ]] || { echo "${MOD_DIR}/go.mod does not require sigs.k8s.io/kueue" >&2; exit 2; }
key="$({ cat "${MOD_DIR}/go.mod" "${MOD_DIR}/go.sum" "${BASH_SOURCE[0]}"; go env GOVERSION GOOS GOARCH; } | sha256sum | cut -c1-12)"
BIN_DIR="${FACET_CACHE:-$HOME/.cache/facet}/bin/kueue-${VERSION}-${key}"
case "${1:-}" in
  --print-bin-dir) echo "${BIN_DIR}"; exit 0 ;;
  "") ;;
  *) echo "usage: $0 [--print-bin-dir]" >&2; exit 2 ;;
esac

if [[ -x "${BIN_DIR}/kueue" && -d "${BIN_DIR}/crds" ]]; then
  log "kueue ${VERSION}: cached in ${BIN_DIR}"
  echo "${BIN_DIR}"
  exit 0
fi
mkdir -p "${BIN_DIR}"

export CGO_ENABLED=0
export GOFLAGS="-p=${FACET_BUILD_JOBS:-2} -buildvcs=false -trimpath -mod=readonly"
start=${SECONDS}
if [[ ! -x "${BIN_DIR}/kueue" ]]; then
  log "building kueue ${VERSION} ..."
  ( while sleep 60; do log "    ... still building kueue ($((SECONDS - start))s)"; done ) &
  ticker=$!
  trap 'kill "${ticker}" 2>/dev/null || true' EXIT
  tmp="${BIN_DIR}/.kueue.tmp.$$"
  # Kueue's own build stamps its version the same way (Makefile LD_FLAGS).
  (cd "${MOD_DIR}" && go build -ldflags "-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=${VERSION}" \
    -o "${tmp}" sigs.k8s.io/kueue/cmd/kueue) || { rm -f "${tmp}"; exit 1; }
  mv -f "${tmp}" "${BIN_DIR}/kueue"  # atomic: a half-built binary is never "cached"
  log "kueue ${VERSION} built in $((SECONDS - start))s"
fi
src="$(cd "${MOD_DIR}" && go list -m -f '{{.Dir}}' sigs.k8s.io/kueue)"
rm -rf "${BIN_DIR}/.crds.tmp" && mkdir -p "${BIN_DIR}/.crds.tmp"
cp "${src}"/config/components/crd/bases/*.yaml "${BIN_DIR}/.crds.tmp/"
chmod -R u+w "${BIN_DIR}/.crds.tmp"
rm -rf "${BIN_DIR}/crds" && mv "${BIN_DIR}/.crds.tmp" "${BIN_DIR}/crds"
echo "${BIN_DIR}"
