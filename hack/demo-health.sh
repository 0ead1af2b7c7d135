#!/usr/bin/env bash
# The demo's operations part (hack/demo.sh runs it last, on the running
# demo node): facetctl occupancy, then one GPU fault and its recovery.
#   FACET_STATE_DIR  the plugin's --state-dir (default ${RUN_DIR}/facet-state)
#   FACET_DEMO_FAULT_GPU  the GPU to fail (default 7, which no demo pod uses)
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${REPO}"
RUN_DIR="${RUN_DIR:-/tmp/facet-run}"
# shellcheck disable=SC1091
source "${RUN_DIR}/env.sh"
export FACET_STATE_DIR="${FACET_STATE_DIR:-${RUN_DIR}/facet-state}"
GPU="${FACET_DEMO_FAULT_GPU:-7}"
NODE=localhost
T0=${SECONDS}
step() { printf '\n\033[1m==> [health %3ds] %s\033[0m\n' "$((SECONDS - T0))" "$*"; }
k() { "${FACET_BIN_DIR}/kubectl" "$@"; }

elapsed() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }

# wait_event REASON: until the Node has an Event with REASON about GPU
# ${GPU} newer than the step, then print it.
wait_event() {
  local reason=$1 since=$2
  for _ in $(seq 120); do
    msg=$(k get events -A --field-selector "involvedObject.kind=Node,reason=${reason}" \
      -o jsonpath='{range .items[*]}{.lastTimestamp}{"\t"}{.message}{"\n"}{end}' |
      awk -F'\t' -v s="${since}" '$1 >= s' | grep "GPU ${GPU} " | tail -1 || true)
    if [[ -n "${msg}" ]]; then
      echo "  Event ${reason}: ${msg#*$'\t'}" | fold -s -w 110
      return 0
    fi
    sleep 0.5
  done
  echo "no ${reason} event for GPU ${GPU}" >&2
  return 1
}

step "What each GPU holds (facetctl occupancy -o picture)"
bin/facetctl occupancy --node "${NODE}" -o picture

step "A fault: GPU ${GPU} falls off the bus (simulated: facetctl fault inject --gpu ${GPU} --kind lost)"
since=$(date -u +%Y-%m-%dT%H:%M:%SZ)
start=$(date +%s.%N)
bin/facetctl fault inject --gpu "${GPU}" --kind lost
wait_event FacetGPUUnhealthy "${since}"
echo "  out of scheduling $(elapsed "${start}") s after the fault"
echo "  the GPU's devices in the slices now:"
devices=$(k get resourceslices --field-selector spec.driver=gpu.facet.dev -o jsonpath='{range .items[*].spec.devices[*]}{.name}{" "}{.taints[*].key}{"="}{.taints[*].value}{":"}{.taints[*].effect}{"\n"}{end}' |
  grep -E "^gpu-${GPU}( |-)" | sed 's/ =:$/ (untainted)/; s/^/    /' || true)
if [[ -n "${devices}" ]]; then
  head -5 <<<"${devices}"
else
  echo "    none: not published (this cluster has no device taints)"
fi
bin/facetctl occupancy --node "${NODE}" | grep -E "^(NODE|${NODE} +gpu-${GPU} )" || true

step "Recovery: refused while the GPU is lost, honoured after its reset"
since=$(date -u +%Y-%m-%dT%H:%M:%SZ)
bin/facetctl health recover --node "${NODE}" --gpu "${GPU}"
wait_event FacetGPURecoveryFailed "${since}"
echo "  (a reset: facetctl fault clear --gpu ${GPU})"
bin/facetctl fault clear --gpu "${GPU}"
sleep 1
since=$(date -u +%Y-%m-%dT%H:%M:%SZ)
start=$(date +%s.%N)
bin/facetctl health recover --node "${NODE}" --gpu "${GPU}"
wait_event FacetGPURecovered "${since}"
echo "  offered again $(elapsed "${start}") s after the recovery request"
