#!/usr/bin/env bash
# Runs a command as a named stage and prints its wall time, so that a CI run
# (.ci/run) and `make test` say where their minutes go:
#   hack/stage.sh NAME COMMAND [ARG...]   run it; print "[ci] stage NAME: N s"
#   hack/stage.sh --summary FILE          print FILE's stages as a table
#
# FACET_STAGE_LOG, when set, is a file each stage appends a line to (start
# time, depth, seconds, exit status, name); .ci/run sets it and prints the
# table at the end, also when a stage failed. Stages nest (make test's
# rounds inside .ci/run's "test" stage): FACET_STAGE_DEPTH counts the
# levels, and the table indents them. The exit status is the command's.
# FACET_STAGE_BESIDE=1 marks a stage that runs beside others (in the
# background, in parallel): the table shows it "beside", and leaves it out
# of the sum of the top-level stages, which would count its time twice; the
# table's last line is the run's wall clock, from the first stage's start
# to the last one's end.
set -uo pipefail

if [[ "${1:-}" == "--summary" ]]; then
  file="${2:?usage: $0 --summary FILE}"
  [[ -s "${file}" ]] || exit 0
  echo "[ci] stage times (wall clock, seconds; nested stages indented and counted in their parent):"
  printf '[ci]   %-58s %8s  %s\n' "stage" "seconds" "result"
  # Sorted by start (nanoseconds): parents before the stages they contain.
  sort -t $'\t' -k1,1n "${file}" | while IFS=$'\t' read -r _ depth secs rc name beside; do
    indent=$(printf '%*s' $((depth * 2)) '')
    result=ok
    [[ "${rc}" != 0 ]] && result="FAILED (exit ${rc})"
    [[ "${beside:-}" == 1 ]] && result="${result}, beside"
    printf '[ci]   %-58s %8d  %s\n' "${indent}${name}" "${secs}" "${result}"
  done
  total=$(awk -F '\t' '$2 == 0 && $6 != 1 { s += $3 } END { print s + 0 }' "${file}")
  printf '[ci]   %-58s %8d  (%d min %d s)\n' "total of the top-level stages not beside others" "${total}" $((total / 60)) $((total % 60))
  wall=$(awk -F '\t' 'NR == 1 || $1 < first { first = $1 } { end = $1 / 1e9 + $3; if (end > last) last = end } END { printf "%d", last - first / 1e9 }' "${file}")
  printf '[ci]   %-58s %8d  (%d min %d s)\n' "wall clock, first start to last end" "${wall}" $((wall / 60)) $((wall % 60))
  exit 0
fi

name="${1:?usage: $0 NAME COMMAND [ARG...] | --summary FILE}"
shift
depth="${FACET_STAGE_DEPTH:-0}"
start=$(date +%s%N)
echo "[ci] stage ${name}: start ($(date -u +%H:%M:%S) UTC)" >&2
FACET_STAGE_DEPTH=$((depth + 1)) "$@"
rc=$?
secs=$((($(date +%s%N) - start) / 1000000000))
if [[ ${rc} -eq 0 ]]; then
  echo "[ci] stage ${name}: ${secs} s" >&2
else
  echo "[ci] stage ${name}: ${secs} s, FAILED (exit ${rc})" >&2
fi
if [[ -n "${FACET_STAGE_LOG:-}" ]]; then
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "${start}" "${depth}" "${secs}" "${rc}" "${name}" "${FACET_STAGE_BESIDE:-0}" >>"${FACET_STAGE_LOG}"
fi
exit "${rc}"
