#!/usr/bin/env bash
# `make demo`: a real Kubernetes 1.35 node (containerd 2 applying CDI) with
# Facet's kubelet plugin on a simulated DGX H100, and the demo/ examples
# running on it. The node stays up; `make demo-down` stops it.
#
# With the DRA alpha gates on (the default here): GPUs 0-3 in mig mode, 4-7
# shared; whole GPUs, a MIG instance carved at prepare, three vGPU shares.
# With FACET_FEATURE_GATES= (stock Kubernetes 1.35, every alpha gate off):
# GPUs 0-1 carved all-balanced at start and published as static MIG
# devices, GPU 4 split into vGPU slots, the rest whole GPUs; whole GPUs, the
# smallest MIG instance of at least 3 GiB, and Volcano's and HAMi's vGPU
# requests as slots.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${REPO}"
export RUN_DIR="${RUN_DIR:-/tmp/facet-run}"
export RUNTIME=containerd
MACHINE="${FACET_DEMO_MACHINE:-demo/machines/dgx-h100.yaml}"
T0=${SECONDS}
step() { printf '\n\033[1m==> [%3ds] %s\033[0m\n' "$((SECONDS - T0))" "$*"; }

step "Installing missing system packages"
hack/install-deps.sh
# up.sh restarts the node and clears its pid files: stop a plugin left by
# an earlier demo first, or it would keep running unsupervised.
hack/plugin.sh stop "${RUN_DIR}"
step "Starting the node (the first run builds Kubernetes v1.35, etcd and containerd from Go modules: about 18 minutes on 2 idle cores)"
hack/cluster/up.sh
# shellcheck disable=SC1091
source "${RUN_DIR}/env.sh"
k() { "${FACET_BIN_DIR}/kubectl" "$@"; }

stock=false
[[ ",${FACET_FEATURE_GATES}," == *",DRAPartitionableDevices=true,"* && ",${FACET_FEATURE_GATES}," == *",DRAConsumableCapacity=true,"* ]] || stock=true
if ${stock}; then
  step "Starting facet-kubeletplugin on ${MACHINE}, stock 1.35 shapes (gates: '${FACET_FEATURE_GATES}')"
  hack/plugin.sh start "${RUN_DIR}" "${MACHINE}" --gpu-modes "${FACET_DEMO_GPU_MODES:-0-1=static-mig,4=slots}" \
    --mig-layouts 0-1=all-balanced --gpu-slots "4=1x40Gi/50+2"
  examples=(demo/gpu/ demo/stock/)
  pods=(one-gpu two-gpus mig-3gb volcano-slot hami-slot)
else
  step "Starting facet-kubeletplugin on ${MACHINE}"
  hack/plugin.sh start "${RUN_DIR}" "${MACHINE}" --gpu-modes "${FACET_DEMO_GPU_MODES:-0-3=mig,4-7=shared}"
  examples=(demo/gpu/ demo/mig/one-1g10gb.yaml demo/vgpu/)
  pods=(one-gpu two-gpus one-1g10gb volcano-share notebook shared-by-two-containers)
fi
for _ in $(seq 120); do
  n=$(k get resourceslices --field-selector spec.driver=gpu.facet.dev -o name 2>/dev/null | wc -l)
  [[ "${n}" -gt 0 ]] && break
  sleep 0.5
done
grep -m1 "ResourceSlices published" "${RUN_DIR}/logs/facet-plugin.log" || { echo "no ResourceSlices; plugin log:"; tail -40 "${RUN_DIR}/logs/facet-plugin.log"; exit 1; }
echo "What the plugin detected (also an Event on the Node: kubectl describe node localhost):"
grep -m1 -o 'Cluster DRA features: [^"]*' "${RUN_DIR}/logs/facet-plugin.log" | fold -s -w 100 | sed 's/^/  /'

k get resourceslices -o custom-columns='NAME:.metadata.name,NODE:.spec.nodeName,DRIVER:.spec.driver,DEVICES:.spec.devices[*].name,COUNTERS:.spec.sharedCounters[*].name'
${stock} || echo "(DEVICES <none>: a counter-only slice. It holds the GPUs' counter sets, which the devices in the other slices consume.)"

step "Installing admission: Facet's ValidatingAdmissionPolicies and facet-webhook, and refusing a bad config"
hack/demo-admission.sh start "${RUN_DIR}"

step "Applying DeviceClasses and the demo/ examples"
k apply -f deployments/deviceclasses.yaml
k apply -f demo/gpu/namespace.yaml
for ex in "${examples[@]}"; do k apply -f "${ex}"; done
for p in "${pods[@]}"; do
  k wait -n facet-demo --for=condition=Ready "pod/${p}" --timeout=180s
done

for p in "${pods[@]}"; do
  step "Pod ${p}"
  claim=$(k get pod -n facet-demo "${p}" -o jsonpath='{.status.resourceClaimStatuses[0].resourceClaimName}')
  echo "claim ${claim} allocated:"
  k get resourceclaim -n facet-demo "${claim}" -o jsonpath='{range .status.allocation.devices.results[*]}  {.device} (pool {.pool}, request {.request}){"\n"}{end}'
  uid=$(k get resourceclaim -n facet-demo "${claim}" -o jsonpath='{.metadata.uid}')
  echo "CDI spec ${FACET_CDI_DIR}/gpu.facet.dev-claim_${uid}.json, devices:"
  grep -o "\"name\":\"${uid}-[a-z0-9-]*\"" "${FACET_CDI_DIR}/gpu.facet.dev-claim_${uid}.json" \
    | sed 's/"name":"\(.*\)"/  gpu.facet.dev\/claim=\1/'
  for c in $(k get pod -n facet-demo "${p}" -o jsonpath='{.spec.containers[*].name}'); do
  echo "what container ${c} sees:"
  k exec -n facet-demo "${p}" -c "${c}" -- sh -c '
    echo "  env:";    env | grep -E "^(FACET|NVIDIA|CUDA|GPU_CORE|LIBCUDA)" | sort | sed "s/^/    /"
    echo "  devices:"; ls -l /dev | grep nvidia | sed "s/^/    /"
    echo "  driver mounts:"; grep -E "nvidia|libcuda|vgpu|ld.so.preload" /proc/mounts | cut -d" " -f2 | sed "s/^/    /"
    echo "  nvidia-smi:"; nvidia-smi 2>&1 | sed "s/^/    /"'
  done
done

step "MIG instances carved in the simulated GPUs (facetctl mig-instances, which finds the demo node in RUN_DIR)"
bin/facetctl mig-instances

step "Operations: occupancy, and one GPU fault with its recovery (hack/demo-health.sh)"
hack/demo-health.sh

step "Done in $((SECONDS - T0))s. The node stays up:"
cat <<MSG
  source ${RUN_DIR}/env.sh
  kubectl get resourceslices,resourceclaims -A
  kubectl exec -n facet-demo one-gpu -- env
  tail -f ${RUN_DIR}/logs/facet-plugin.log
  bin/facetctl slices --machine ${MACHINE} --node localhost
Stop it with: make demo-down
MSG
