#!/usr/bin/env bash
# make test: every suite, with the CPU-bound ones beside the e2e rounds.
#
# A round of make e2e (a real node) alone keeps 2 cores only about a third
# busy: it waits on the kubelet, the API server and the containers
# (measured: 40 % over the 1.37.2 round, docs/benchmarks.md). So make e2e
# runs its rounds side by side (hack/e2e-rounds.sh), the multinode round
# among them (FACET_E2E_MULTINODE=1: last, on the first node slot that
# frees, its ports moved like that slot's), and the unit tests and the
# allocator matrix, which need no node and are CPU-bound, run beside them,
# niced below them (and below the builds the rounds wait for: hack/e2e.sh,
# .ci/run). Their output goes to a log that is printed when they end.
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

# Every round runs whether or not another failed: every suite reports
# before make test fails.
rc=0
FACET_E2E_MULTINODE=1 "${MAKE}" --no-print-directory e2e || rc=$?
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
