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
#
# Facet runs as the Helm chart (deployments/helm/facet) would on a real
# cluster: the simulator image (make image-sim) imported into the node's
# containerd, and the chart installed with Helm's Go library
# (test/helm/chartinstall), its DaemonSet's pod serving the claims and its
# hami-core DaemonSet installing the stand-in libvgpu.so. FACET_DEMO_PLUGIN=host
# runs the plugin as a host process instead (hack/plugin.sh), for debugging.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${REPO}"
export RUN_DIR="${RUN_DIR:-/tmp/facet-run}"
export RUNTIME=containerd
MACHINE="${FACET_DEMO_MACHINE:-demo/machines/dgx-h100.yaml}"
PLUGIN="${FACET_DEMO_PLUGIN:-chart}"
[[ "${PLUGIN}" == chart || "${PLUGIN}" == host ]] || { echo "FACET_DEMO_PLUGIN must be chart or host, not ${PLUGIN}" >&2; exit 2; }
CHART_NS=facet-system
T0=${SECONDS}
step() { printf '\n\033[1m==> [%3ds] %s\033[0m\n' "$((SECONDS - T0))" "$*"; }

step "Installing missing system packages"
hack/install-deps.sh
# up.sh restarts the node and clears its pid files: stop a plugin left by
# an earlier demo first, or it would keep running unsupervised.
hack/plugin.sh stop "${RUN_DIR}"
if [[ "${PLUGIN}" == chart ]]; then
  step "Building the simulator image (make image-sim) and Helm's installer (test/helm/chartinstall)"
  hack/image.sh --sim >/dev/null
  (cd test/helm && go build -o "${REPO}/bin/chartinstall" ./chartinstall)
fi
step "Starting the node (the first run builds Kubernetes v1.35, etcd and containerd from Go modules: about 18 minutes on 2 idle cores)"
hack/cluster/up.sh
# shellcheck disable=SC1091
source "${RUN_DIR}/env.sh"
k() { "${FACET_BIN_DIR}/kubectl" "$@"; }

# plugin_log prints the plugin's log so far. Readers that stop early
# (grep -m1, grep -q) take it as a here-string, not through a pipe: under
# pipefail the writer's SIGPIPE would fail the demo.
plugin_log() {
  if [[ "${PLUGIN}" == chart ]]; then
    k logs -n "${CHART_NS}" -l app.kubernetes.io/component=kubelet-plugin -c plugin --tail=-1 2>/dev/null || true
  else
    cat "${RUN_DIR}/logs/facet-plugin.log" 2>/dev/null || true
  fi
}

# start_plugin MODE_VALUES PLUGIN_FLAGS...: the chart with the default node
# group's MODE_VALUES (YAML flow-mapping entries), or the host process with
# the same modes as PLUGIN_FLAGS.
start_plugin() {
  local group="$1"; shift
  if [[ "${PLUGIN}" == host ]]; then
    hack/plugin.sh start "${RUN_DIR}" "${MACHINE}" "$@"
    return
  fi
  hack/sim-node.sh "${RUN_DIR}" "${MACHINE}" >/dev/null
  # The chart mounts the driver root with HostToContainer propagation,
  # which containerd refuses on a private mount.
  # facet-mps mounts each GPU's /dev/shm tmpfs in its MPS directory with
  # Bidirectional propagation, which needs a shared mount too.
  mkdir -p "${RUN_DIR}/mps-chart"
  # facet-mps mounts the host's / at /host, HostToContainer, where the
  # driver root is not / (templates/mps.yaml): / must be a shared mount,
  # as systemd makes a real node's.
  [[ "$(findmnt -n -o PROPAGATION /)" == *shared* ]] || mount --make-rshared /
  for dir in "${RUN_DIR}/driver-root" "${RUN_DIR}/mps-chart"; do
    mountpoint -q "${dir}" || mount --bind "${dir}" "${dir}"
    mount --make-rshared "${dir}"
  done
  "${FACET_BIN_DIR}/ctr" --address "${FACET_CRI_SOCKET}" -n k8s.io images import _output/facet-image-sim.tar >/dev/null
  local tag; tag="$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' deployments/helm/facet/Chart.yaml)-sim"
  cat >"${RUN_DIR}/facet-values.yaml" <<VALUES
# The demo node's values (hack/demo.sh): the simulator image, imported.
image: {repository: facet.local/facet, tag: "${tag}", pullPolicy: Never}
# Applied from deployments/ below, as the examples expect.
deviceClasses: {enabled: false}
admission:
  webhook: {enabled: false}
kubeletPlugin:
  # The node's pods have only a loopback network and there is no
  # kube-proxy: the plugin reaches the API server on the host's 127.0.0.1.
  hostNetwork: true
  extraEnv:
  - {name: KUBERNETES_SERVICE_HOST, value: 127.0.0.1}
  - {name: KUBERNETES_SERVICE_PORT, value: "6443"}
  kubeletDir: "${FACET_KUBELET_ROOT}"
  cdiDir: "${FACET_CDI_DIR}"
  stateDir: "${RUN_DIR}/facet-state"
  # The simulated driver root (read at /driver-root in the plugin's
  # container), and the image's nvidia-cdi-hook installed on the node.
  driver: {root: "${RUN_DIR}/driver-root", devRoot: "${RUN_DIR}/driver-root"}
  nvidiaCDIHook: {install: true, hostDir: "${RUN_DIR}/cdi-hook"}
  # facet-mps's socket and the GPUs' MPS directories, in the run directory.
  mps: {dir: "${RUN_DIR}/mps-chart"}
  # The simulator image plays HAMi's: it holds the stand-in libvgpu.so,
  # which the hami-core DaemonSet installs (chartinstall waits for it).
  hamiCore:
    enabled: true
    hostDir: "${RUN_DIR}/hami"
    image: {repository: facet.local/facet, tag: "${tag}", pullPolicy: Never}
    librarySource: /k8s-vgpu/lib/nvidia/libvgpu.so*
  # The node carries none of the GPU labels of NFD or the GPU Operator: it
  # is the GPU node by name (hack/cluster/up.sh's --hostname-override).
  gpuNodeSelectorTerms:
  - matchExpressions: [{key: kubernetes.io/hostname, operator: In, values: [localhost]}]
  nodeGroups:
    default: {${group}, extraArgs: [--machine=/usr/share/facet/machines/$(basename "${MACHINE}")]}
# facet-controller as the plugin: in the host's network, to the API server
# on the host's 127.0.0.1 (the node's pods have no other way to it).
computeDomains:
  controller:
    hostNetwork: true
    extraEnv:
    - {name: KUBERNETES_SERVICE_HOST, value: 127.0.0.1}
    - {name: KUBERNETES_SERVICE_PORT, value: "6443"}
VALUES
  bin/chartinstall upgrade facet deployments/helm/facet -n "${CHART_NS}" -f "${RUN_DIR}/facet-values.yaml"
}

stock=false
[[ ",${FACET_FEATURE_GATES}," == *",DRAPartitionableDevices=true,"* && ",${FACET_FEATURE_GATES}," == *",DRAConsumableCapacity=true,"* ]] || stock=true
if ${stock}; then
  step "Starting facet-kubeletplugin (${PLUGIN}) on ${MACHINE}, stock 1.35 shapes (gates: '${FACET_FEATURE_GATES}')"
  modes="${FACET_DEMO_GPU_MODES:-0-1=static-mig,4=slots}"
  start_plugin "gpuModes: \"${modes}\", migLayouts: 0-1=all-balanced, gpuSlots: \"4=1x40Gi/50+2\"" \
    --gpu-modes "${modes}" --mig-layouts 0-1=all-balanced --gpu-slots "4=1x40Gi/50+2"
  examples=(demo/gpu/ demo/stock/)
  pods=(one-gpu two-gpus mig-3gb volcano-slot hami-slot)
else
  step "Starting facet-kubeletplugin (${PLUGIN}) on ${MACHINE}"
  modes="${FACET_DEMO_GPU_MODES:-0-3=mig,4-7=shared}"
  start_plugin "gpuModes: \"${modes}\"" --gpu-modes "${modes}"
  examples=(demo/gpu/ demo/mig/one-1g10gb.yaml demo/vgpu/)
  pods=(one-gpu two-gpus one-1g10gb volcano-share notebook shared-by-two-containers)
fi
for _ in $(seq 120); do
  n=$(k get resourceslices --field-selector spec.driver=gpu.facet.dev -o name 2>/dev/null | wc -l)
  [[ "${n}" -gt 0 ]] && break
  sleep 0.5
done
for _ in $(seq 60); do grep -q "ResourceSlices published" <<<"$(plugin_log)" && break; sleep 0.5; done
grep -m1 "ResourceSlices published" <<<"$(plugin_log)" || { echo "no ResourceSlices; plugin log:"; plugin_log | tail -40; exit 1; }
echo "What the plugin detected (also an Event on the Node: kubectl describe node localhost):"
grep -m1 -o 'Cluster DRA features: [^"]*' <<<"$(plugin_log)" | fold -s -w 100 | sed 's/^/  /'

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

if [[ "${FACET_DEMO_KUEUE:-}" == 1 ]]; then
  step "Kueue v0.17.0 beside the node (hack/kueue.sh): a team's quota of one 1g.10gb MIG device, two Jobs (docs/kueue.md)"
  bin/facetctl classes --kubeconfig "${KUBECONFIG}" --share-sizes 2000Mi/20 >"${RUN_DIR}/kueue-classes.yaml"
  k apply -f "${RUN_DIR}/kueue-classes.yaml"
  FACET_KUEUE_CLASSES="${RUN_DIR}/kueue-classes.yaml" hack/kueue.sh start "${RUN_DIR}"
  k apply -f demo/kueue/queue.yaml
  k apply -f demo/kueue/jobs.yaml
  for _ in $(seq 60); do
    [[ "$(k get workloads -n facet-demo -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="QuotaReserved")].status}{" "}{end}')" == *True*False* ||
       "$(k get workloads -n facet-demo -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="QuotaReserved")].status}{" "}{end}')" == *False*True* ]] && break
    sleep 1
  done
  k get workloads -n facet-demo -o custom-columns='WORKLOAD:.metadata.name,RESERVED:.status.conditions[?(@.type=="QuotaReserved")].status,MESSAGE:.status.conditions[?(@.type=="QuotaReserved")].message'
fi

step "Done in $((SECONDS - T0))s. The node stays up:"
cat <<MSG
  source ${RUN_DIR}/env.sh
  kubectl get resourceslices,resourceclaims -A
  kubectl exec -n facet-demo one-gpu -- env
MSG
if [[ "${PLUGIN}" == chart ]]; then
  echo "  kubectl logs -n ${CHART_NS} -l app.kubernetes.io/component=kubelet-plugin -c plugin -f"
  echo "  kubectl get pods -n ${CHART_NS}      # the chart's DaemonSet (values: ${RUN_DIR}/facet-values.yaml)"
else
  echo "  tail -f ${RUN_DIR}/logs/facet-plugin.log"
fi
cat <<MSG
  bin/facetctl slices --machine ${MACHINE} --node localhost
Stop it with: make demo-down
MSG
