#!/usr/bin/env bash
# Runs test/multinode on a fresh three-node cluster, then tears it down
# whatever happened. Beside up.sh's node "localhost" (no GPUs), it adds with
# hack/cluster/add-node.sh, all on the fake CRI:
#   node-h100  demo/machines/dgx-h100.yaml       in mig mode
#   node-a100  demo/machines/dgx-a100-80gb.yaml  in shared mode (vGPU shares)
#   node-l4    demo/machines/l4x4.yaml           in exclusive mode (whole GPUs)
# and a simulated GB200 NVL72-class rack (hack/cluster/add-rack.sh 4 4 2):
#   gb200-a1..a4, gb200-b1..b2  demo/machines/gb200-nvl72-tray.yaml in
#   exclusive mode, one fabric cluster, cliques a (4 nodes) and b (2 nodes)
# unless FACET_MULTINODE_RACK=0. Their fake CRIs run Facet's simulator
# image's containers (facet-imex --simulate) as host processes.
# mig and shared mode need the DRA alpha gates, so the cluster runs with
# up.sh's default gates whatever FACET_FEATURE_GATES says.
# Extra arguments go to go test, e.g. -run TestRestart.
# FACET_PORT_OFFSET (a multiple of 1000) moves every port of the cluster,
# the added nodes' too, as for make e2e's side-by-side rounds.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${REPO}"
export RUN_DIR="${FACET_MULTINODE_RUN_DIR:-/tmp/facet-multinode}"
export RUNTIME=fake
unset FACET_FEATURE_GATES

# One cluster per set of ports: FACET_PORT_OFFSET N*1000 is make e2e's
# node slot N (hack/e2e-rounds.sh), whose lock hack/e2e.sh takes for that
# slot's node (/tmp/facet-e2e.lock for slot 0, the default ports).
offset="${FACET_PORT_OFFSET:-0}"
[[ "${offset}" =~ ^[0-9]*000$|^0$ ]] || { echo "FACET_PORT_OFFSET must be a multiple of 1000, not '${offset}'" >&2; exit 2; }
slot_lock=/tmp/facet-e2e.lock
[[ "${offset}" -gt 0 ]] && slot_lock="/tmp/facet-e2e-$((offset / 1000)).lock"
exec 9>"${slot_lock}"
flock 9

if [[ "${offset}" == 0 && -f /tmp/facet-run/pids/kube-apiserver.pid ]] && kill -0 "$(cat /tmp/facet-run/pids/kube-apiserver.pid)" 2>/dev/null; then
  echo "multinode: the demo node is running; stop it first with 'make demo-down'" >&2
  exit 1
fi

T0=${SECONDS}  # after the lock: what a run costs, not how long it waited
trap 'hack/cluster/down.sh >/dev/null 2>&1 || true; echo "[multinode] $((SECONDS - T0))s from cluster start to teardown"' EXIT
hack/cluster/up.sh
hack/cluster/add-node.sh node-h100 1 demo/machines/dgx-h100.yaml --mode mig
hack/cluster/add-node.sh node-a100 2 demo/machines/dgx-a100-80gb.yaml --mode shared
hack/cluster/add-node.sh node-l4 3 demo/machines/l4x4.yaml --mode exclusive
nodes=4
if [[ "${FACET_MULTINODE_RACK:-1}" != 0 ]]; then
  hack/cluster/add-rack.sh 4 4 2
  nodes=10
fi
echo "[multinode] cluster of ${nodes} nodes up in $((SECONDS - T0))s"
# shellcheck disable=SC1091
source "${RUN_DIR}/env.sh"
kubectl apply -f deployments/deviceclasses.yaml >/dev/null
go test ./test/multinode/ -count=1 -v -timeout 20m "$@"
