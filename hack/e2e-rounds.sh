#!/usr/bin/env bash
# make e2e: the four e2e rounds (hack/e2e.sh), FACET_E2E_PARALLEL of them at
# a time (default 2), each on a node of its own: slot 0 is up.sh's default
# node (RUN_DIR /tmp/facet-e2e, the default ports), slot N runs in
# /tmp/facet-e2e-N with every port moved by N*1000 (FACET_PORT_OFFSET,
# hack/cluster/up.sh).
#
# Why side by side: a round keeps 2 cores only about 40 % busy (it waits on
# the kubelet, the API server and the containers: docs/benchmarks.md), so a
# second round fills what the first leaves idle. The rounds are started
# longest first (the gated 1.35.4 round, with the chart's run-once live
# tests and TestKueue); a slot that frees takes the next.
#
# Each round's output goes to a log of its own, printed whole when the round
# ends, so that rounds side by side do not interleave their lines; a line
# says when each starts and ends. Every round runs whether or not another
# failed, and the script fails at the end naming the failed rounds.
#   CHART_ONCE   the chart's live tests only the first round runs (Makefile)
set -uo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${REPO}"
PARALLEL="${FACET_E2E_PARALLEL:-2}"
[[ "${PARALLEL}" =~ ^[1-4]$ ]] || { echo "FACET_E2E_PARALLEL must be 1 to 4, not '${PARALLEL}'" >&2; exit 2; }
CHART_ONCE="${CHART_ONCE:?set CHART_ONCE: the run-once chart live tests, as the Makefile does}"

names=("e2e 1.35.4, DRA alpha gates on" "e2e 1.35.4 stock" "e2e 1.37.2, default gates" "e2e 1.36.3, default gates")
short=("1.35.4 gated" "1.35.4 stock" "1.37.2" "1.36.3")

# round I SLOT: run round I on SLOT's node.
round() {
  local i="$1" slot="$2" dir=/tmp/facet-e2e
  [[ "${slot}" -gt 0 ]] && dir="/tmp/facet-e2e-${slot}"
  local -a e=("FACET_E2E_RUN_DIR=${dir}" "FACET_PORT_OFFSET=$((slot * 1000))")
  [[ "${PARALLEL}" -gt 1 ]] && e+=(FACET_STAGE_BESIDE=1)
  case "${i}" in
    0) ;;
    1) e+=("FACET_FEATURE_GATES=" "FACET_E2E_CHART_SKIP=${CHART_ONCE}") ;;
    2) e+=(FACET_K8S_VERSION=v1.37.2 "FACET_E2E_CHART_SKIP=${CHART_ONCE}") ;;
    3) e+=(FACET_K8S_VERSION=v1.36.3 "FACET_E2E_CHART_SKIP=${CHART_ONCE}") ;;
  esac
  env "${e[@]}" hack/stage.sh "${names[${i}]}" hack/e2e.sh
}

logdir="$(mktemp -d /tmp/facet-e2e-rounds.XXXXXX)"
declare -A pid_round pid_slot
free=()
for ((s = 0; s < PARALLEL; s++)); do free+=("${s}"); done
failed=""
next=0
# set -m: each round in its own process group, so an interrupted make e2e
# stops every round's node (hack/e2e.sh's trap).
set -m
trap 'for p in "${!pid_round[@]}"; do kill -- -"${p}" 2>/dev/null || true; done' EXIT
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
if [[ -n "${failed}" ]]; then
  echo "make e2e: these rounds FAILED: ${failed#, }" >&2
  exit 1
fi
