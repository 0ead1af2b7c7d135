#!/usr/bin/env bash
# Runs test/e2e against a fresh real node (hack/cluster/up.sh), then tears
# the node down whatever happened.
#   FACET_E2E_RUNTIME  containerd (default: real containers, CDI applied) | fake
#   FACET_K8S_VERSION  v1.35.4 (default) | v1.36.3 | v1.37.2, and FACET_FEATURE_GATES:
#                      the node's version and gates (hack/cluster/up.sh)
# On the 1.35 rounds, test/e2e's TestKueue starts Kueue's manager beside the
# node (hack/kueue.sh). Without arguments, Kueue is built beside the rest of
# the round (niced; a cold build is minutes and needs no node), and TestKueue
# runs last, after the chart's live tests, so the round does not wait for
# the build; with arguments naming Kueue, it is built first.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${REPO}"
locks="${FACET_CACHE:-$HOME/.cache/facet}/bin"
mkdir -p "${locks}"
kueue_build=""
kueue_last=false
if [[ "${FACET_K8S_VERSION:-v1.35.4}" == v1.35.* ]]; then
  # Its own lock (the one .ci/run's build and hack/kueue.sh take): one build
  # at a time.
  if [[ $# -eq 0 ]]; then
    kueue_last=true
    FACET_STAGE_BESIDE=1 hack/stage.sh "tools build (Kueue, beside the round)" \
      flock "${locks}/.build-kueue.lock" nice -n 10 hack/build-kueue.sh >/dev/null &
    kueue_build=$!
  elif [[ "$*" == *Kueue* ]]; then
    hack/stage.sh "tools build (Kueue)" flock "${locks}/.build-kueue.lock" hack/build-kueue.sh >/dev/null
  fi
fi
# The simulator image (make image-sim, _output/facet-image-sim.tar) is only
# for the chart's live tests at the end of the round, so it is built beside
# test/e2e and waited for before them. Niced by how soon it is needed: the
# image (nice 5) a few minutes into the round, Kueue (nice 10) at its end,
# the unit tests beside make test's rounds (nice 17, hack/test.sh) only when
# they all end; .ci/run's builds for later rounds sit between (12 to 19).
# make e2e builds it once for all its rounds (hack/e2e-rounds.sh), with the
# chart's test binaries: then FACET_E2E_CHART_BUILD_PID is that build and
# FACET_E2E_CHART_BUILD_RC the file its exit status lands in, and the round
# only waits for it.
image_build=""
chart=false
if [[ $# -eq 0 || -n "${FACET_E2E_CHART_RUN:-}" ]]; then
  chart=true
  if [[ -z "${FACET_E2E_CHART_BUILD_PID:-}" ]]; then
    FACET_STAGE_BESIDE=1 hack/stage.sh "build image-sim (beside the round)" \
      nice -n 5 hack/image.sh --sim >/dev/null &
    image_build=$!
  fi
fi
# The test binaries: make e2e compiles them once for all its rounds
# (FACET_E2E_TESTBIN, a directory with e2e.test, helm.test and
# helm-install.test; hack/e2e-rounds.sh); otherwise go test builds them.
# gotest DIR PKG BIN ARGS...: run PKG's tests (DIR, relative to the repo)
# with go test-style ARGS, from the binary when there is one, in the
# package's directory as go test runs them.
gotest() {
  local dir="$1" pkg="$2" bin="$3"
  shift 3
  if [[ -n "${FACET_E2E_TESTBIN:-}" ]]; then
    local -a a=()
    local x
    for x in "$@"; do
      case "${x}" in
        -count=* | -v | -timeout | -run | -skip) a+=("-test.${x#-}") ;;
        -*) echo "hack/e2e.sh: no test-binary form for go test flag ${x}" >&2; return 2 ;;
        *) a+=("${x}") ;;
      esac
    done
    (cd "${dir}" && "${FACET_E2E_TESTBIN}/${bin}" "${a[@]}")
  else
    (cd "${dir}" && go test "${pkg}" "$@")
  fi
}
# chart_live_tests RUN SKIP: test/helm's live tests, one package at a time
# (go test -p 1: the two packages' live tests share the one node).
chart_live_tests() {
  if [[ -z "${FACET_E2E_TESTBIN:-}" ]]; then
    (cd test/helm && go test ./... -p 1 -count=1 -v -timeout 20m -run "$1" -skip "$2")
    return
  fi
  local rc=0
  gotest test/helm . helm.test -count=1 -v -timeout 20m -run "$1" -skip "$2" || rc=1
  gotest test/helm/install . helm-install.test -count=1 -v -timeout 20m -run "$1" -skip "$2" || rc=1
  return "${rc}"
}
export -f gotest chart_live_tests
export RUN_DIR="${FACET_E2E_RUN_DIR:-/tmp/facet-e2e}"
export RUNTIME="${FACET_E2E_RUNTIME:-containerd}"

# One e2e node per run directory at a time: up.sh would tear down a node
# another run is using, so runs of one RUN_DIR wait for each other here.
# Runs with their own FACET_E2E_RUN_DIR and FACET_PORT_OFFSET (make e2e's
# rounds side by side) do not.
exec 9>"${RUN_DIR}.lock"
flock 9

# The demo node uses the default ports.
if [[ "${FACET_PORT_OFFSET:-0}" == 0 && -f /tmp/facet-run/pids/kube-apiserver.pid ]] && kill -0 "$(cat /tmp/facet-run/pids/kube-apiserver.pid)" 2>/dev/null; then
  echo "e2e: the demo node is running; stop it first with 'make demo-down'" >&2
  exit 1
fi

trap 'for b in ${kueue_build} ${image_build}; do kill "${b}" 2>/dev/null || true; done; hack/cluster/down.sh >/dev/null 2>&1 || true' EXIT
# Each part prints its wall time (hack/stage.sh; .ci/run tabulates them).
hack/stage.sh "node up" hack/cluster/up.sh
# shellcheck disable=SC1091
source "${RUN_DIR}/env.sh"
hack/sim-node.sh "${RUN_DIR}" demo/machines/dgx-h100.yaml
# A failed suite does not stop the round: test/e2e, the chart's live tests
# and TestKueue each report, and the round fails at the end (rc).
rc=0
# Extra arguments go to go test, e.g. -run '^$' -bench . for the prepare benchmarks.
if ${kueue_last}; then
  hack/stage.sh "test/e2e" gotest test/e2e . e2e.test -count=1 -v -timeout 30m -skip '^TestKueue$' || rc=1
elif [[ $# -eq 0 ]]; then
  hack/stage.sh "test/e2e" gotest test/e2e . e2e.test -count=1 -v -timeout 30m || rc=1
else
  hack/stage.sh "test/e2e" go test ./test/e2e/ -count=1 -v -timeout 30m "$@" || rc=1
fi
# The chart against the real apiserver: server-side dry run of every
# rendered object, the per-node ResourceSlice policy with a pod-bound token,
# the webhook behind the chart's own configuration, and (test/helm/install)
# `helm install` of the chart with the image of `make image-sim`
# (_output/facet-image-sim.tar; skipped without it) serving the demo's
# claims, and a seamless `helm upgrade`. They run without arguments, or with
# FACET_E2E_CHART_RUN, a -run pattern for them alone:
#   FACET_E2E_CHART_RUN=TestLiveChartUpgrade hack/e2e.sh -run '^$'
# -p 1: the two packages' live tests share the one node (its slices, the
# plugin's directories), so they run one package at a time.
# FACET_E2E_CHART_SKIP, a -skip pattern: make e2e's later rounds leave out
# the live tests whose outcome does not depend on the Kubernetes version
# (docs/contributing.md says which and why).
if ${chart}; then
  if [[ -n "${image_build}" ]]; then
    # tail --pid: stage.sh's shell cannot wait for this one's child. A
    # failed build fails the round here, rather than the tests skipping for
    # want of the image.
    hack/stage.sh "build image-sim: waiting for it" tail --pid="${image_build}" -f /dev/null
    wait "${image_build}"
    image_build=""
  else
    hack/stage.sh "build image-sim and chart tests (make e2e's): waiting for it" tail --pid="${FACET_E2E_CHART_BUILD_PID}" -f /dev/null
    if [[ "$(cat "${FACET_E2E_CHART_BUILD_RC}" 2>/dev/null)" != 0 ]]; then
      echo "e2e: make e2e's build of image-sim and the chart's tests failed (make e2e prints its log)" >&2
      exit 1
    fi
  fi
  hack/stage.sh "chart live tests" chart_live_tests "${FACET_E2E_CHART_RUN:-Live}" "${FACET_E2E_CHART_SKIP:-^$}" || rc=1
fi
if ${kueue_last}; then
  # tail --pid: stage.sh's shell cannot wait for this one's child.
  hack/stage.sh "tools build (Kueue): waiting for it" tail --pid="${kueue_build}" -f /dev/null
  wait "${kueue_build}"
  kueue_build=""
  hack/stage.sh "test/e2e TestKueue" gotest test/e2e . e2e.test -count=1 -v -timeout 30m -run '^TestKueue$' || rc=1
fi
exit "${rc}"
