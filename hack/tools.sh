#!/usr/bin/env bash
# Every pinned tool that `make test` and `.ci/run` need, in one place:
#
#   hack/tools.sh            build what is missing (make tools), in the order
#                            the test rounds need it, and print the cache table
#   hack/tools.sh --status   print which caches are warm and which cold
#                            (builds nothing; .ci/run prints it at its start)
#
# The builds are the ones .ci/run runs, with the same scripts, keys and
# locks, so a `make tools` started on a new machine (for example in a second
# terminal, while you read the code) is never repeated by a later
# `make test` or `.ci/run`, and one of them started while it runs waits for
# the build it needs rather than building it twice. The order is the
# rounds': the 1.35.4 node (round 1), Kueue (end of round 2), Kubernetes
# 1.36.3 (round 3) and 1.37.2 (round 4), then golangci-lint, deepcopy-gen
# and promtool (test/promrules' TestRules). A cold `make tools` is about 7,300 CPU seconds, an hour on
# 2 idle cores (docs/benchmarks.md, "Why a cold run does not fit in 60
# minutes"); niced, so the machine stays usable.
#
# The build scripts hash themselves into their cache keys: editing
# hack/build-tools.sh, hack/build-k8s.sh or hack/build-kueue.sh makes every
# machine's next run cold.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${REPO}"
CACHE="${FACET_CACHE:-$HOME/.cache/facet}"
locks="${CACHE}/bin"
# The Kubernetes versions of make e2e's rounds after 1.35.4 (Makefile), and
# the components their local node runs (hack/cluster/up.sh).
K8S_ROUNDS="v1.36.3 v1.37.2"
K8S_COMPONENTS="kube-apiserver kube-controller-manager kube-scheduler kubelet"
GOLANGCI_LINT_VERSION="$(awk '$1 == "GOLANGCI_LINT_VERSION" { print $3 }' Makefile)"
PROMETHEUS_VERSION="$(awk '$1 == "github.com/prometheus/prometheus" { print $2 }' test/promrules/go.mod)"

# status prints one line per cache: warm or cold, and where it is.
status() {
  local dir v c state
  state=warm
  hack/build-tools.sh --check || state=cold
  printf '%-5s  %-46s %s\n' "${state}" "Kubernetes 1.35.4, etcd, containerd" "$(hack/build-tools.sh --print-bin-dir)"
  dir="$(hack/build-kueue.sh --print-bin-dir)"
  state=cold
  [[ -x "${dir}/kueue" && -d "${dir}/crds" ]] && state=warm
  printf '%-5s  %-46s %s\n' "${state}" "Kueue" "${dir}"
  for v in ${K8S_ROUNDS}; do
    dir="$(FACET_K8S_COMPONENTS="${K8S_COMPONENTS}" hack/build-k8s.sh "${v}" --print-bin-dir)"
    state=warm
    for c in ${K8S_COMPONENTS}; do
      [[ -x "${dir}/${c}" ]] || state=cold
    done
    printf '%-5s  %-46s %s\n' "${state}" "Kubernetes ${v#v}" "${dir}"
  done
  state=cold
  [[ -x "${CACHE}/bin/golangci-lint-${GOLANGCI_LINT_VERSION}" ]] && state=warm
  printf '%-5s  %-46s %s\n' "${state}" "golangci-lint ${GOLANGCI_LINT_VERSION}" "${CACHE}/bin"
  state=cold
  [[ -x "${CACHE}/bin/promtool-${PROMETHEUS_VERSION}" ]] && state=warm
  printf '%-5s  %-46s %s\n' "${state}" "promtool ${PROMETHEUS_VERSION}" "${CACHE}/bin"
  # The Go build cache has no key to look up: an empty one is the telling
  # case (a new machine), and Facet's own packages build in a minute anyway.
  dir="$(go env GOCACHE)"
  state=warm
  [[ -n "$(find "${dir}" -maxdepth 1 -name '[0-9a-f][0-9a-f]' -print -quit 2>/dev/null)" ]] || state=cold
  printf '%-5s  %-46s %s\n' "${state}" "Go build cache" "${dir}"
}

case "${1:-}" in
  --status) status; exit 0 ;;
  "") ;;
  *) echo "usage: $0 [--status]" >&2; exit 2 ;;
esac

mkdir -p "${locks}"
stage() { hack/stage.sh "$@"; }
stage "tools build (Kubernetes 1.35.4, etcd, containerd)" \
  flock "${locks}/.build-tools.lock" nice -n 10 hack/build-tools.sh >/dev/null
stage "tools build (Kueue)" \
  flock "${locks}/.build-kueue.lock" nice -n 10 hack/build-kueue.sh >/dev/null
for v in ${K8S_ROUNDS}; do
  FACET_K8S_COMPONENTS="${K8S_COMPONENTS}" stage "tools build (Kubernetes ${v})" \
    flock "${locks}/.build-k8s-${v}.lock" nice -n 10 hack/build-k8s.sh "${v}" >/dev/null
done
stage "lint build (golangci-lint)" nice -n 10 make --no-print-directory lint-tool
stage "codegen build (deepcopy-gen)" nice -n 10 make --no-print-directory codegen-tool
stage "promtool build" nice -n 10 make --no-print-directory promtool-tool
status
