#!/usr/bin/env bash
# Runs test/allocator, the slice model through the kube-scheduler's own
# allocator (k8s.io/dynamic-resource-allocation/structured), against each
# Kubernetes minor the README lists as tested: v0.35 is the main module's
# own; for the others the main module is built with a go.mod whose
# k8s.io modules are bumped (go -modfile), generated here from go.mod so it
# never drifts.
#   ALLOCATOR_VERSIONS  the versions to run (default: all below)
#   extra arguments     go test flags, e.g. -run TestMIG
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${REPO}"
VERSIONS="${ALLOCATOR_VERSIONS:-v0.35.4 v0.36.3 v0.37.2}"
MODULES=(k8s.io/api k8s.io/apimachinery k8s.io/client-go k8s.io/component-base k8s.io/dynamic-resource-allocation k8s.io/kubelet)
OUT="${REPO}/_output/allocator-matrix"
mkdir -p "${OUT}"
for v in ${VERSIONS}; do
  main=$(go list -m -f '{{.Version}}' k8s.io/dynamic-resource-allocation)
  if [[ "${v}" == "${main}" ]]; then
    echo "== allocator tests, k8s.io/dynamic-resource-allocation ${v} (go.mod)"
    go test ./test/allocator/ -count=1 -timeout 30m "$@"
    continue
  fi
  mod="${OUT}/go.${v}.mod"
  cp go.mod "${mod}"
  cp go.sum "${mod%.mod}.sum"
  for m in "${MODULES[@]}"; do
    go mod edit -modfile="${mod}" -require="${m}@${v}"
  done
  go mod tidy -modfile="${mod}" >/dev/null
  echo "== allocator tests, k8s.io/dynamic-resource-allocation ${v} (${mod#"${REPO}"/})"
  # GOFLAGS, not -modfile: the tests ask `go list` which allocator they run
  # (test/allocator/version_test.go).
  GOFLAGS="-modfile=${mod}" go test ./test/allocator/ -count=1 -timeout 30m "$@"
done
