#!/usr/bin/env bash
# make e2e: the four e2e rounds (hack/e2e.sh), FACET_E2E_PARALLEL of them at
# a time (default 4: all at once), each on a node of its own: slot 0 is
# up.sh's default node (RUN_DIR /tmp/facet-e2e, the default ports), slot N
# runs in /tmp/facet-e2e-N with every port moved by N*1000
# (FACET_PORT_OFFSET, hack/cluster/up.sh).
#
# Why side by side: a round keeps 2 cores only about 40 % busy (it waits on
# the kubelet, the API server and the containers: docs/benchmarks.md), and
# two rounds with the unit tests beside them still left the cores a third
# idle once the unit tests ended (73 % busy over a whole make test,
# /proc/stat). The rounds start longest first (the gated 1.35.4 round, with
# the most tests and TestKueue); a slot that frees takes the next.
#
# Each round's output goes to a log of its own, printed whole when the round
# ends, so that rounds side by side do not interleave their lines; a line
# says when each starts and ends. Every round runs whether or not another
# failed, and the script fails at the end naming the failed rounds.
#
# What every round needs alike is built once, here: test/e2e's test binary
# before the first round starts, and the simulator image with the chart's
# two test binaries beside the rounds (niced), which each round waits for
# before its chart live tests (hack/e2e.sh: FACET_E2E_TESTBIN,
# FACET_E2E_CHART_BUILD_PID). A round built them for itself before: four
# links of each and four image builds, on two cores that the rounds side by
# side keep busy.
#   CHART_ONCE          the chart's live tests only the 1.36.3 round runs (Makefile):
#                       the gated 1.35.4 round, with TestKueue and the most
#                       tests, is the longest without them
#   FACET_E2E_MULTINODE 1: also run the multinode round (hack/multinode.sh),
#                       last, in the first slot that frees (make test)
set -uo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${REPO}"
PARALLEL="${FACET_E2E_PARALLEL:-4}"
[[ "${PARALLEL}" =~ ^[1-4]$ ]] || { echo "FACET_E2E_PARALLEL must be 1 to 4, not '${PARALLEL}'" >&2; exit 2; }
CHART_ONCE="${CHART_ONCE:?set CHART_ONCE: the run-once chart live tests, as the Makefile does}"

names=("e2e 1.35.4, DRA alpha gates on" "e2e 1.35.4 stock" "e2e 1.37.2, default gates" "e2e 1.36.3, default gates")
short=("1.35.4 gated" "1.35.4 stock" "1.37.2" "1.36.3")
if [[ "${FACET_E2E_MULTINODE:-}" == 1 ]]; then
  names+=("multinode (10 nodes)")
  short+=("multinode")
fi

# round I SLOT: run round I on SLOT's node.
round() {
  local i="$1" slot="$2" dir=/tmp/facet-e2e
  [[ "${slot}" -gt 0 ]] && dir="/tmp/facet-e2e-${slot}"
  local -a e=("FACET_E2E_RUN_DIR=${dir}" "FACET_PORT_OFFSET=$((slot * 1000))")
  [[ "${PARALLEL}" -gt 1 ]] && e+=(FACET_STAGE_BESIDE=1)
  case "${i}" in
    0) e+=("FACET_E2E_CHART_SKIP=${CHART_ONCE}") ;;
    1) e+=("FACET_FEATURE_GATES=" "FACET_E2E_CHART_SKIP=${CHART_ONCE}") ;;
    2) e+=(FACET_K8S_VERSION=v1.37.2 "FACET_E2E_CHART_SKIP=${CHART_ONCE}") ;;
    3) e+=(FACET_K8S_VERSION=v1.36.3) ;;
    4)
      env "${e[@]}" hack/stage.sh "${names[${i}]}" hack/multinode.sh
      return
      ;;
  esac
  env "${e[@]}" hack/stage.sh "${names[${i}]}" hack/e2e.sh
}

logdir="$(mktemp -d /tmp/facet-e2e-rounds.XXXXXX)"
export FACET_E2E_TESTBIN="${logdir}/bin"
mkdir -p "${FACET_E2E_TESTBIN}"
# test/e2e's binary first: each round runs it a minute in.
if ! hack/stage.sh "build test/e2e's test binary" go test -c -o "${FACET_E2E_TESTBIN}/e2e.test" ./test/e2e/; then
  echo "make e2e: test/e2e does not build" >&2
  exit 1
fi
# The rounds' chart live tests need these a few minutes in. nice 5: as
# hack/e2e.sh built the image beside its round.
export FACET_E2E_CHART_BUILD_RC="${logdir}/chart-build.rc"
set -m
(
  rc=0
  FACET_STAGE_BESIDE=1 hack/stage.sh "build image-sim and the chart's test binaries (beside the rounds)" nice -n 5 bash -c '
    set -e
    hack/image.sh --sim >/dev/null
    cd test/helm
    go test -c -o "${FACET_E2E_TESTBIN}/helm.test" .
    go test -c -o "${FACET_E2E_TESTBIN}/helm-install.test" ./install' >"${logdir}/chart-build.log" 2>&1 || rc=$?
  echo "${rc}" >"${FACET_E2E_CHART_BUILD_RC}"
) &
chart_build=$!
set +m
export FACET_E2E_CHART_BUILD_PID="${chart_build}"
declare -A pid_round pid_slot
free=()
for ((s = 0; s < PARALLEL; s++)); do free+=("${s}"); done
failed=""
next=0
# set -m: each round in its own process group, so an interrupted make e2e
# stops every round's node (hack/e2e.sh's trap).
set -m
trap 'kill -- -"${chart_build}" 2>/dev/null || true; for p in "${!pid_round[@]}"; do kill -- -"${p}" 2>/dev/null || true; done' EXIT
while [[ ${next} -lt ${#names[@]} || ${#pid_round[@]} -gt 0 ]]; do
  while [[ ${next} -lt ${#names[@]} && ${#free[@]} -gt 0 ]]; do
    slot="${free[0]}"
    free=("${free[@]:1}")
    echo "[e2e] round ${short[${next}]}: start on node slot ${slot} ($(date -u +%H:%M:%S) UTC; log ${logdir}/${next}.log)"
    round "${next}" "${slot}" >"${logdir}/${next}.log" 2>&1 &
    pid_round[$!]="${next}"
    pid_slot[$!]="${slot}"
    next=$((next + 1))
  done
  rc=0
  wait -n -p done_pid "${!pid_round[@]}" || rc=$?
  i="${pid_round[${done_pid}]}"
  echo "==== round ${short[${i}]} ($(date -u +%H:%M:%S) UTC): its log ===="
  cat "${logdir}/${i}.log"
  if [[ ${rc} -ne 0 ]]; then
    echo "[e2e] round ${short[${i}]}: FAILED (exit ${rc})"
    failed="${failed}, ${short[${i}]}"
  else
    echo "[e2e] round ${short[${i}]}: ok"
  fi
  free+=("${pid_slot[${done_pid}]}")
  unset "pid_round[${done_pid}]" "pid_slot[${done_pid}]"
done
trap - EXIT
wait "${chart_build}" || true
echo "==== the build of image-sim and the chart's test binaries: its log ===="
cat "${logdir}/chart-build.log"
if [[ "$(cat "${FACET_E2E_CHART_BUILD_RC}" 2>/dev/null)" != 0 ]]; then
  echo "[e2e] the build of image-sim and the chart's test binaries FAILED"
  failed="${failed}, that build"
fi
if [[ -n "${failed}" ]]; then
  echo "make e2e: these rounds FAILED: ${failed#, }" >&2
  exit 1
fi
