#!/usr/bin/env bash
# Starts a real, single-node Kubernetes (v1.35.4, or v1.36.3 or v1.37.2 with
# FACET_K8S_VERSION) on this machine, all on 127.0.0.1:
#   etcd, kube-apiserver, kube-controller-manager, kube-scheduler, a container
#   runtime (containerd 2 + runc, or an in-memory fake CRI) and the kubelet
#   (node name "localhost"), with Facet's DRA feature gates on (1.35) or
#   Kubernetes' default gates (1.36, 1.37).
# No DRA driver is started: Facet's kubelet plugin registers separately through
# $RUN_DIR/kubelet/plugins_registry and writes CDI specs into $RUN_DIR/cdi.
#
# Usage:
#   RUNTIME=containerd hack/cluster/up.sh     # real containers, CDI applied by containerd
#   RUNTIME=fake       hack/cluster/up.sh     # fake CRI, logs CDI devices per container
#   source "$RUN_DIR/env.sh"; kubectl get nodes
#   hack/cluster/down.sh
#
# Environment:
#   RUN_DIR       all state, logs and pids (default ${FACET_RUN_DIR:-/tmp/facet-run})
#   RUNTIME       containerd | fake (default fake)
#   READY_TIMEOUT seconds to wait for each component and for the node (default 120)
#   FACET_FEATURE_GATES  replaces the default DRA feature gates below
#   FACET_K8S_VERSION    v1.35.4 (default) | v1.36.3 | v1.37.2: the version of
#                 kube-apiserver, kube-controller-manager, kube-scheduler and
#                 the kubelet; kubectl, etcd and the runtime stay those of
#                 hack/build-tools.sh
#
# Needs root (the kubelet and containerd mount things) and the Debian packages of
# hack/apt-packages.txt (hack/install-deps.sh). Builds the binaries on first use
# (hack/build-tools.sh, ~10 minutes cold; for 1.36 and 1.37 hack/build-k8s.sh
# too, 9+ minutes more each on 2 busy cores: docs/design/local-cluster.md). Ports are the defaults (2379/2380,
# 6443, 10250/10248, 10257, 10259) plus FACET_PORT_OFFSET (default 0): nodes
# with their own RUN_DIR and offset run side by side (make e2e's rounds).
# Background and traps: docs/design/local-cluster.md.
set -Eeuo pipefail  # -E: the ERR trap below also fires inside functions

CLUSTER_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
HACK_DIR="$(cd "${CLUSTER_DIR}/.." && pwd)"

RUN_DIR="${RUN_DIR:-${FACET_RUN_DIR:-/tmp/facet-run}}"
RUNTIME="${RUNTIME:-fake}"
READY_TIMEOUT="${READY_TIMEOUT:-120}"
K8S_VERSION="${FACET_K8S_VERSION:-v1.35.4}"
# Every port the node listens on, moved by FACET_PORT_OFFSET so that two
# nodes (each with its own RUN_DIR) can run on one machine. add-node.sh's
# extra kubelets use 10250+100*INDEX: offsets are multiples of 1000.
PORT_OFFSET="${FACET_PORT_OFFSET:-0}"
[[ "${PORT_OFFSET}" =~ ^[0-9]+$ ]] || { echo "FACET_PORT_OFFSET must be a number, not '${PORT_OFFSET}'" >&2; exit 2; }
ETCD_PORT=$((2379 + PORT_OFFSET))
ETCD_PEER_PORT=$((2380 + PORT_OFFSET))
APISERVER_PORT=$((6443 + PORT_OFFSET))
KUBELET_PORT=$((10250 + PORT_OFFSET))
KUBELET_HEALTHZ_PORT=$((10248 + PORT_OFFSET))
CONTROLLER_MANAGER_PORT=$((10257 + PORT_OFFSET))
SCHEDULER_PORT=$((10259 + PORT_OFFSET))

case "${K8S_VERSION}" in
  v1.35.4)
    # Alpha DRA features Facet's resource model needs (docs/design/resource-model.md §1); each
    # exists in v1.35.4 pkg/features/kube_features.go. Every component gets them:
    # the apiserver drops gated fields otherwise, the scheduler ignores them, the
    # controller-manager and kubelet act on them.
    # FACET_FEATURE_GATES replaces the list (e.g. to test with a gate off); set
    # and empty, it is stock Kubernetes 1.35: every alpha gate off.
    FEATURE_GATES="${FACET_FEATURE_GATES-DRAPartitionableDevices=true,DRAConsumableCapacity=true,DRAExtendedResource=true,DRADeviceTaints=true}"
    # With the DRA gates on, KEP-4680's ResourceHealthStatus (alpha in 1.35)
    # too, for the apiserver (the pod status field) and the kubelet (it asks
    # the plugin for device health); stock 1.35 has it off.
    NODE_GATES="${FEATURE_GATES}"
    if [[ -n "${FEATURE_GATES}" ]]; then NODE_GATES+=",ResourceHealthStatus=true"; fi
    ;;
  v1.36.3)
    # Kubernetes' defaults: v1.36.3 pkg/features/kube_features.go has the four
    # DRA gates Facet cares about beta and on (DRAPartitionableDevices,
    # DRAConsumableCapacity, DRADeviceTaints, DRAExtendedResource), and
    # ResourceHealthStatus beta and on. FACET_FEATURE_GATES, set, is passed to
    # every component as it is.
    FEATURE_GATES="${FACET_FEATURE_GATES-}"
    NODE_GATES="${FEATURE_GATES}"
    ;;
  v1.37.2)
    # Kubernetes' defaults: v1.37.2 pkg/features/kube_features.go has
    # DRADeviceTaints and DRAExtendedResource GA (DRAExtendedResource locked
    # on), DRAPartitionableDevices and DRAConsumableCapacity still beta and
    # on, ResourceHealthStatus beta and on, and DRAResourceClaimDeviceStatus
    # GA and locked on. FACET_FEATURE_GATES, set, is passed to every
    # component as it is (a locked gate set to its opposite stops them).
    FEATURE_GATES="${FACET_FEATURE_GATES-}"
    NODE_GATES="${FEATURE_GATES}"
    ;;
  *) echo "FACET_K8S_VERSION must be v1.35.4, v1.36.3 or v1.37.2, not '${K8S_VERSION}'" >&2; exit 2 ;;
esac

T0=${SECONDS}
log() { printf '[up %3ds] %s\n' "$((SECONDS - T0))" "$*"; }

case "${RUNTIME}" in
  containerd|fake) ;;
  *) echo "RUNTIME must be 'containerd' or 'fake', not '${RUNTIME}'" >&2; exit 2 ;;
esac
if [[ "$(id -u)" != 0 ]]; then
  echo "up.sh must run as root (the kubelet and containerd mount filesystems)" >&2
  exit 1
fi
case "${RUN_DIR}" in
  /*) ;;
  *) echo "RUN_DIR must be an absolute path: ${RUN_DIR}" >&2; exit 2 ;;
esac

# --- inotify limits --------------------------------------------------------------
# Every kubelet, containerd and controller-runtime manager watches files
# through inotify instances, and the kernel's default allows a user 128.
# make test runs four nodes beside the multinode round's ten kubelets (with
# their plugins and fake CRIs) and Kueue: at 128 a kubelet's plugin watcher
# or Kueue's certificate watcher fails with "too many open files" (seen in
# make test of 2026-11-29). Raised, never lowered, as kind asks of its hosts
# (kind's known issues, "Pod errors due to too many open files").
raise_sysctl() {
  local key="$1" want="$2" have
  have="$(cat "/proc/sys/${key//.//}" 2>/dev/null || echo 0)"
  if (( have < want )); then
    echo "${want}" >"/proc/sys/${key//.//}" ||
      { echo "up.sh: cannot raise ${key} from ${have} to ${want}; nodes may fail with 'too many open files'" >&2; return 0; }
    log "raised ${key} from ${have} to ${want}"
  fi
}
raise_sysctl fs.inotify.max_user_instances 1024
raise_sysctl fs.inotify.max_user_watches 524288

# --- prerequisites -----------------------------------------------------------
need=(openssl curl ss setsid base64)
[[ "${RUNTIME}" == containerd ]] && need+=(runc gcc)
for c in "${need[@]}"; do
  command -v "${c}" >/dev/null || { echo "missing '${c}': run hack/install-deps.sh" >&2; exit 1; }
done
CNI_BIN_DIR=/usr/lib/cni
if [[ "${RUNTIME}" == containerd && ! -x "${CNI_BIN_DIR}/loopback" ]]; then
  echo "missing ${CNI_BIN_DIR}/loopback: run hack/install-deps.sh (containernetworking-plugins)" >&2
  exit 1
fi

# Builds of the same binaries wait for each other (flock), per version:
# .ci/run builds the next round's Kubernetes while a round runs, and several
# checkouts share the cache.
BUILD_LOCKS="${FACET_CACHE:-$HOME/.cache/facet}/bin"
mkdir -p "${BUILD_LOCKS}"
log "building/locating binaries (hack/build-tools.sh)"
BIN_DIR="$(flock "${BUILD_LOCKS}/.build-tools.lock" "${HACK_DIR}/build-tools.sh" | tail -n1)"
[[ -x "${BIN_DIR}/kubelet" ]] || { echo "build-tools.sh gave no usable bin dir: ${BIN_DIR}" >&2; exit 1; }
KUBECTL="${BIN_DIR}/kubectl"
# K8S_BIN_DIR: the control plane and the kubelet; BIN_DIR: everything else.
K8S_BIN_DIR="${BIN_DIR}"
if [[ "${K8S_VERSION}" != v1.35.4 ]]; then
  log "building/locating Kubernetes ${K8S_VERSION} (hack/build-k8s.sh)"
  K8S_BIN_DIR="$(FACET_K8S_COMPONENTS="kube-apiserver kube-controller-manager kube-scheduler kubelet" \
    flock "${BUILD_LOCKS}/.build-k8s-${K8S_VERSION}.lock" "${HACK_DIR}/build-k8s.sh" "${K8S_VERSION}" | tail -n1)"
  [[ -x "${K8S_BIN_DIR}/kubelet" ]] || { echo "build-k8s.sh gave no usable bin dir: ${K8S_BIN_DIR}" >&2; exit 1; }
fi

# A previous run may be left behind (crash, interrupted test): clean it first.
RUN_DIR="${RUN_DIR}" "${CLUSTER_DIR}/down.sh" --quiet

# Someone else's cluster (or a run whose RUN_DIR is gone) would make ours fail
# in confusing ways; refuse clearly instead.
for port in "${ETCD_PORT}" "${ETCD_PEER_PORT}" "${APISERVER_PORT}" "${KUBELET_HEALTHZ_PORT}" "${KUBELET_PORT}" "${CONTROLLER_MANAGER_PORT}" "${SCHEDULER_PORT}"; do
  if ss -Hltn "sport = :${port}" 2>/dev/null | grep -q .; then
    echo "port ${port} is already in use:" >&2
    ss -Hltnp "sport = :${port}" >&2 || true
    echo "another cluster is running (different RUN_DIR?); stop it with RUN_DIR=<its dir> hack/cluster/down.sh, or give this one another FACET_PORT_OFFSET" >&2
    exit 1
  fi
done

T_START=${SECONDS}  # after build and cleanup: what "time to Ready" measures

PKI="${RUN_DIR}/pki"
LOGS="${RUN_DIR}/logs"
PIDS="${RUN_DIR}/pids"
KUBELET_ROOT="${RUN_DIR}/kubelet"
CDI_DIR="${RUN_DIR}/cdi"
CDI_LOG="${LOGS}/fakecri-cdi.jsonl"
mkdir -p "${PKI}" "${LOGS}" "${PIDS}" "${CDI_DIR}" "${RUN_DIR}/etcd" \
  "${KUBELET_ROOT}/plugins/gpu.facet.dev" "${KUBELET_ROOT}/plugins_registry" \
  "${KUBELET_ROOT}/certs" "${KUBELET_ROOT}/volume-plugins" "${RUN_DIR}/pod-logs"
chmod 700 "${RUN_DIR}/etcd" "${PKI}"
# down.sh keeps the previous run's logs for post-mortems; start this run clean.
rm -f "${LOGS}"/*.log "${LOGS}"/*.jsonl

# --- failure handling and processes (hack/cluster/lib.sh) -------------------
FAIL_PREFIX="[up]"
CLEANUP="RUN_DIR=${RUN_DIR} ${CLUSTER_DIR}/down.sh"
# shellcheck source=hack/cluster/lib.sh
source "${CLUSTER_DIR}/lib.sh"
trap 'fail "${CURRENT:-up.sh}" "command failed at line ${LINENO}: ${BASH_COMMAND}"' ERR

# --- certificates --------------------------------------------------------------
# EC P-256 keys: fast to generate, accepted everywhere (incl. service-account signing).
CURRENT=pki
log "generating certificates in ${PKI}"
newkey() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }
# sign_with CA NAME SUBJECT EXT: key + CSR + cert signed by CA, valid 1 year.
sign_with() {
  local ca="$1" name="$2" subj="$3" ext="$4"
  newkey "${PKI}/${name}.key"
  openssl req -new -key "${PKI}/${name}.key" -subj "${subj}" -out "${PKI}/${name}.csr" 2>/dev/null
  printf '%s\n' "${ext}" >"${PKI}/${name}.ext"
  openssl x509 -req -in "${PKI}/${name}.csr" -CA "${PKI}/${ca}.crt" -CAkey "${PKI}/${ca}.key" \
    -CAcreateserial -days 365 -sha256 -extfile "${PKI}/${name}.ext" -out "${PKI}/${name}.crt" 2>/dev/null
  rm -f "${PKI}/${name}.csr" "${PKI}/${name}.ext"
}
sign() { sign_with ca "$@"; }
# new_ca NAME CN: a self-signed CA.
new_ca() {
  newkey "${PKI}/$1.key"
  openssl req -x509 -new -key "${PKI}/$1.key" -subj "/CN=$2" -days 365 -sha256 \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -out "${PKI}/$1.crt" 2>/dev/null
}
new_ca ca facet-local-ca
CLIENT_EXT="basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth"
# 10.0.0.1 is the "kubernetes" service IP (first of --service-cluster-ip-range).
sign apiserver "/CN=kube-apiserver" "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,IP:127.0.0.1,IP:10.0.0.1"
sign admin "/O=system:masters/CN=facet-admin" "${CLIENT_EXT}"
# The apiserver's client cert towards the kubelet (logs, exec).
sign apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" "${CLIENT_EXT}"
# The kubelet's own identity, so the Node authorizer applies as on a real node.
sign kubelet "/O=system:nodes/CN=system:node:localhost" "${CLIENT_EXT}"
# The controller-manager's own identity, as kubeadm gives it: its bootstrap
# role (system:kube-controller-manager), and each controller its own
# service account (--use-service-account-credentials), so that requests of
# the resourceclaim controller reach admission as
# system:serviceaccount:kube-system:resource-claim-controller, as on a
# kubeadm cluster (the chart's webhooks skip that user's claims).
sign controller-manager "/CN=system:kube-controller-manager" "${CLIENT_EXT}"
# Front-proxy (requestheader) CA and client: without them the
# extension-apiserver-authentication ConfigMap lacks requestheader-client-ca-file
# and the controller-manager and scheduler log "missing content for CA bundle"
# errors forever.
new_ca front-proxy-ca facet-front-proxy-ca
sign_with front-proxy-ca front-proxy-client "/CN=front-proxy-client" "${CLIENT_EXT}"
newkey "${PKI}/sa.key"
openssl pkey -in "${PKI}/sa.key" -pubout -out "${PKI}/sa.pub" 2>/dev/null

# kubeconfig NAME CERT: a kubeconfig with embedded credentials.
kubeconfig() {
  local out="$1" cert="$2"
  cat >"${out}" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: facet-local
  cluster:
    server: https://127.0.0.1:${APISERVER_PORT}
    certificate-authority-data: $(base64 -w0 "${PKI}/ca.crt")
users:
- name: ${cert}
  user:
    client-certificate-data: $(base64 -w0 "${PKI}/${cert}.crt")
    client-key-data: $(base64 -w0 "${PKI}/${cert}.key")
contexts:
- name: facet-local
  context:
    cluster: facet-local
    user: ${cert}
current-context: facet-local
EOF
  chmod 600 "${out}"
}
ADMIN_KUBECONFIG="${RUN_DIR}/admin.kubeconfig"
kubeconfig "${ADMIN_KUBECONFIG}" admin
kubeconfig "${RUN_DIR}/kubelet.kubeconfig" kubelet
kubeconfig "${RUN_DIR}/controller-manager.kubeconfig" controller-manager
k() { "${KUBECTL}" --kubeconfig "${ADMIN_KUBECONFIG}" "$@"; }

# --- etcd ------------------------------------------------------------------------
log "starting etcd"
# --unsafe-no-fsync: the data is thrown away with the run; fsync only slows tests.
start etcd "${BIN_DIR}/etcd" \
  --name facet --data-dir "${RUN_DIR}/etcd" \
  --listen-client-urls "http://127.0.0.1:${ETCD_PORT}" --advertise-client-urls "http://127.0.0.1:${ETCD_PORT}" \
  --listen-peer-urls "http://127.0.0.1:${ETCD_PEER_PORT}" --initial-advertise-peer-urls "http://127.0.0.1:${ETCD_PEER_PORT}" \
  --initial-cluster "facet=http://127.0.0.1:${ETCD_PEER_PORT}" \
  --unsafe-no-fsync --log-level warn
wait_for etcd "healthy" curl -fsS "http://127.0.0.1:${ETCD_PORT}/health"

# --- kube-apiserver --------------------------------------------------------------
log "starting kube-apiserver"
# --enable-aggregator-routing: the API server calls admission webhooks at
# their Services' endpoints, not at the ClusterIP, which nothing routes here
# (no kube-proxy); so the chart's webhook Deployment (on the host's network)
# is reachable through its Service.
start kube-apiserver "${K8S_BIN_DIR}/kube-apiserver" \
  --etcd-servers="http://127.0.0.1:${ETCD_PORT}" \
  --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port="${APISERVER_PORT}" \
  --endpoint-reconciler-type=none \
  --enable-aggregator-routing=true \
  --authorization-mode=Node,RBAC \
  --client-ca-file="${PKI}/ca.crt" \
  --tls-cert-file="${PKI}/apiserver.crt" --tls-private-key-file="${PKI}/apiserver.key" \
  --service-account-issuer=https://kubernetes.default.svc.cluster.local \
  --service-account-key-file="${PKI}/sa.pub" \
  --service-account-signing-key-file="${PKI}/sa.key" \
  --service-cluster-ip-range=10.0.0.0/24 \
  --kubelet-client-certificate="${PKI}/apiserver-kubelet-client.crt" \
  --kubelet-client-key="${PKI}/apiserver-kubelet-client.key" \
  --kubelet-preferred-address-types=Hostname \
  --requestheader-client-ca-file="${PKI}/front-proxy-ca.crt" \
  --requestheader-allowed-names=front-proxy-client \
  --requestheader-username-headers=X-Remote-User \
  --requestheader-group-headers=X-Remote-Group \
  --requestheader-extra-headers-prefix=X-Remote-Extra- \
  --proxy-client-cert-file="${PKI}/front-proxy-client.crt" \
  --proxy-client-key-file="${PKI}/front-proxy-client.key" \
  --allow-privileged=true \
  --feature-gates="${NODE_GATES}" \
  --v=1
wait_for kube-apiserver "/readyz ok" k get --raw /readyz

# --- controller-manager and scheduler ----------------------------------------
log "starting kube-controller-manager and kube-scheduler"
# Default controllers ("*") include resourceclaim-controller, which turns
# ResourceClaimTemplates into ResourceClaims. --root-ca-file feeds the
# kube-root-ca.crt ConfigMap that every pod's service-account volume needs.
start kube-controller-manager "${K8S_BIN_DIR}/kube-controller-manager" \
  --kubeconfig="${RUN_DIR}/controller-manager.kubeconfig" \
  --authentication-kubeconfig="${RUN_DIR}/controller-manager.kubeconfig" --authorization-kubeconfig="${RUN_DIR}/controller-manager.kubeconfig" \
  --use-service-account-credentials=true \
  --bind-address=127.0.0.1 --secure-port="${CONTROLLER_MANAGER_PORT}" --leader-elect=false \
  --controllers='*' \
  --root-ca-file="${PKI}/ca.crt" \
  --service-account-private-key-file="${PKI}/sa.key" \
  --cluster-signing-cert-file="${PKI}/ca.crt" --cluster-signing-key-file="${PKI}/ca.key" \
  --feature-gates="${FEATURE_GATES}" \
  --v=1
start kube-scheduler "${K8S_BIN_DIR}/kube-scheduler" \
  --kubeconfig="${ADMIN_KUBECONFIG}" \
  --authentication-kubeconfig="${ADMIN_KUBECONFIG}" --authorization-kubeconfig="${ADMIN_KUBECONFIG}" \
  --bind-address=127.0.0.1 --secure-port="${SCHEDULER_PORT}" --leader-elect=false \
  --feature-gates="${FEATURE_GATES}" \
  --v=1

# --- container runtime ---------------------------------------------------------
if [[ "${RUNTIME}" == containerd ]]; then
  CTRD="${RUN_DIR}/containerd"
  CRI_SOCK="${CTRD}/containerd.sock"
  mkdir -p "${CTRD}/root" "${CTRD}/state" "${CTRD}/runc" "${RUN_DIR}/cni/net.d"
  # Loopback-only CNI: pods use hostNetwork, nothing leaves 127.0.0.1; a
  # config must exist or containerd reports NetworkReady=false.
  cat >"${RUN_DIR}/cni/net.d/10-loopback.conflist" <<'EOF'
{"cniVersion": "1.0.0", "name": "facet-loopback", "plugins": [{"type": "loopback"}]}
EOF
  cp "${CLUSTER_DIR}/runc-wrapper.sh" "${CTRD}/runc-wrapper"
  chmod 755 "${CTRD}/runc-wrapper"
  # containerd 2 config (version 3). enable_cdi + cdi_spec_dirs make containerd
  # apply the CDI specs Facet writes. The sandbox image is the one images.sh
  # builds (containerd 2.2 would otherwise want pause:3.10.1 from the network).
  cat >"${CTRD}/config.toml" <<EOF
version = 3
root = "${CTRD}/root"
state = "${CTRD}/state"

[grpc]
  address = "${CRI_SOCK}"

[ttrpc]
  address = "${CRI_SOCK}.ttrpc"

# NRI's socket in this node's directory, not /var/run/nri/nri.sock: NRI
# removes the socket and binds it anew at start, so make e2e's rounds, whose
# containerds start side by side, took it from each other and, starting at
# the same moment, failed ("bind: address already in use").
[plugins.'io.containerd.nri.v1.nri']
  socket_path = "${CTRD}/nri.sock"

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "registry.k8s.io/pause:3.10"

[plugins.'io.containerd.cri.v1.runtime']
  enable_cdi = true
  cdi_spec_dirs = ["${CDI_DIR}"]
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["${CNI_BIN_DIR}"]
    conf_dir = "${RUN_DIR}/cni/net.d"
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "${CTRD}/runc-wrapper"
        Root = "${CTRD}/runc"
        SystemdCgroup = false
EOF
  log "starting containerd"
  # PATH: containerd finds containerd-shim-runc-v2 there.
  start containerd env PATH="${BIN_DIR}:${PATH}" "${BIN_DIR}/containerd" --config "${CTRD}/config.toml"
  wait_for containerd "serving" "${BIN_DIR}/ctr" --address "${CRI_SOCK}" version
  CURRENT=images
  log "loading images (hack/images.sh)"
  "${HACK_DIR}/images.sh" --load "${BIN_DIR}/ctr" "${CRI_SOCK}" >/dev/null
  RUNTIME_NAME=containerd
else
  CRI_SOCK="${RUN_DIR}/fakecri.sock"
  mkdir -p "${RUN_DIR}/fakecri-imagefs"
  : >"${CDI_LOG}"
  log "starting fake CRI (CDI log: ${CDI_LOG})"
  start fakecri "${BIN_DIR}/fakecri" --socket "${CRI_SOCK}" --cdi-log "${CDI_LOG}" \
    --image-fs "${RUN_DIR}/fakecri-imagefs" \
    --images "facet.local/busybox:1,registry.k8s.io/pause:3.10"
  wait_for fakecri "serving" test -S "${CRI_SOCK}"
  RUNTIME_NAME=fakecri
fi

# --- kubelet -----------------------------------------------------------------------
# Settings this kind of host needs (docs/design/local-cluster.md): cgroup v1 allowed, no
# QoS cgroups or node-allocatable enforcement, swap tolerated, cgroupfs driver;
# webhook authn/authz off, x509 client CA on (the apiserver's kubelet client
# cert); everything it writes under RUN_DIR where it can be told so. Image GC
# off (imageGC thresholds 100%): our images cannot be pulled again. Eviction
# thresholds low so a busy CI disk does not evict test pods.
cat >"${RUN_DIR}/kubelet-config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: ${KUBELET_PORT}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: ${KUBELET_HEALTHZ_PORT}
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: false
  x509:
    clientCAFile: ${PKI}/ca.crt
authorization:
  mode: AlwaysAllow
containerRuntimeEndpoint: unix://${CRI_SOCK}
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
failSwapOn: false
podLogsDir: ${RUN_DIR}/pod-logs
volumePluginDir: ${KUBELET_ROOT}/volume-plugins
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: "100Mi"
  nodefs.available: "1%"
  imagefs.available: "1%"
  nodefs.inodesFree: "1%"
featureGates:
$(tr ',' '\n' <<<"${NODE_GATES}" | sed -e 's/^/  /' -e 's/=/: /')
EOF
log "starting kubelet"
start kubelet "${K8S_BIN_DIR}/kubelet" \
  --config="${RUN_DIR}/kubelet-config.yaml" \
  --kubeconfig="${RUN_DIR}/kubelet.kubeconfig" \
  --root-dir="${KUBELET_ROOT}" --cert-dir="${KUBELET_ROOT}/certs" \
  --hostname-override=localhost \
  --v=2
wait_for kubelet "healthz ok" curl -fsS "http://127.0.0.1:${KUBELET_HEALTHZ_PORT}/healthz"

wait_for kubelet "node localhost Ready" node_ready localhost k
READY_AT=$((SECONDS - T_START))

# Pods are rejected until the default ServiceAccount exists, and their token
# volume waits for kube-root-ca.crt: wait here so the first test pod is not slow.
wait_for kube-controller-manager "default ServiceAccount and kube-root-ca.crt" \
  k get -n default serviceaccount/default configmap/kube-root-ca.crt
alive kube-scheduler || fail kube-scheduler "process exited"

# --- environment for tests and the demo --------------------------------------------
env_vars=(
  KUBECONFIG="${ADMIN_KUBECONFIG}"
  FACET_RUN_DIR="${RUN_DIR}"
  FACET_BIN_DIR="${BIN_DIR}"
  FACET_RUNTIME="${RUNTIME}"
  FACET_FEATURE_GATES="${FEATURE_GATES}"
  FACET_K8S_VERSION="${K8S_VERSION}"
  FACET_K8S_BIN_DIR="${K8S_BIN_DIR}"  # kube-apiserver, kube-controller-manager, kube-scheduler, kubelet
  FACET_CDI_DIR="${CDI_DIR}"
  FACET_KUBELET_ROOT="${KUBELET_ROOT}"
  FACET_CRI_SOCKET="${CRI_SOCK}"
  FACET_PORT_OFFSET="${PORT_OFFSET}"
  FACET_APISERVER_PORT="${APISERVER_PORT}"
)
if [[ "${RUNTIME}" == fake ]]; then
  env_vars+=(FACET_CDI_LOG="${CDI_LOG}")
fi
write_env "${RUN_DIR}/env.sh" "Written by hack/cluster/up.sh; source it to use the local cluster." "${env_vars[@]}"
# shellcheck disable=SC2016 # expanded where env.sh is sourced
echo 'export PATH="'"${BIN_DIR}"':${PATH}"' >>"${RUN_DIR}/env.sh"

rss_total=0
rss_line=""
for c in etcd kube-apiserver kube-controller-manager kube-scheduler "${RUNTIME_NAME}" kubelet; do
  kb="$(ps -o rss= -p "$(cat "${PIDS}/${c}.pid")" 2>/dev/null | tr -d ' ' || echo 0)"
  rss_total=$((rss_total + ${kb:-0}))
  rss_line+=" ${c}=$(( ${kb:-0} / 1024 ))MiB"
done
log "RSS:${rss_line} total=$((rss_total / 1024))MiB"
log "cluster up: node localhost Ready ${READY_AT}s from certificates to Ready (up.sh total $((SECONDS - T0))s); Kubernetes ${K8S_VERSION}, runtime ${RUNTIME}"
echo "  source ${RUN_DIR}/env.sh && kubectl get nodes"
echo "  stop: RUN_DIR=${RUN_DIR} ${CLUSTER_DIR}/down.sh"
