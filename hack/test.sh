#!/usr/bin/env bash
# make test: every suite, with the CPU-bound ones beside the e2e rounds.
#
# The e2e rounds (make e2e: four real nodes, one after another) keep 2 cores
# only about a third busy: they wait on the kubelet, the API server and the
# containers (measured: 40 % over the 1.37.2 round, docs/benchmarks.md). The
# unit tests and the allocator matrix need no node and are CPU-bound, so
# they run beside the rounds, niced below them (and below the builds the
# rounds wait for: hack/e2e.sh, .ci/run), instead of before them.
# Their output goes to a log that is printed when they end; the multinode
# round (fixed ports, like the e2e node) comes after the e2e rounds.
#
# Exit status: non-zero if any suite failed. Stages print their wall time
# (hack/stage.sh); the ones beside the rounds are marked so in .ci/run's
# table.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${REPO}"
MAKE="${MAKE:-make}"
log="$(mktemp /tmp/facet-test-beside.XXXXXX)"

# set -m: the suites beside get their own process group, so an interrupted
# make test stops them too.
set -m
(
  FACET_STAGE_BESIDE=1 hack/stage.sh "unit and allocator matrix (beside the e2e rounds)" \
    nice -n 17 "${MAKE}" --no-print-directory unit allocator-matrix
) >"${log}" 2>&1 &
beside=$!
set +m
trap 'kill -- -"${beside}" 2>/dev/null || true' EXIT

# The multinode round runs whether or not an e2e round failed: every
# suite reports before make test fails.
rc=0
"${MAKE}" --no-print-directory e2e || rc=$?
"${MAKE}" --no-print-directory multinode || rc=$?
brc=0
wait "${beside}" || brc=$?
trap - EXIT
echo "== unit tests and allocator matrix (ran beside the e2e rounds; ${log}):"
cat "${log}"
if [[ ${brc} -ne 0 ]]; then
  echo "make test: the unit tests or the allocator matrix FAILED (exit ${brc}); see above" >&2
  [[ ${rc} -ne 0 ]] || rc=${brc}
fi
exit "${rc}"
