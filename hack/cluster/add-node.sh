#!/usr/bin/env bash
# Adds a further node to the cluster that hack/cluster/up.sh runs in RUN_DIR:
# its own fake CRI, its own kubelet, and, given a machine file, Facet's
# kubelet plugin on that simulated machine. Several can run beside up.sh's
# node "localhost"; hack/multinode.sh starts three.
#
# Usage:
#   hack/cluster/add-node.sh NAME INDEX [MACHINE_FILE [plugin flags...]]
#   e.g. hack/cluster/add-node.sh node-l4 3 demo/machines/l4x4.yaml --mode exclusive
#   source "$RUN_DIR/nodes/NAME/env.sh"   # this node's paths, after $RUN_DIR/env.sh
#   hack/cluster/down.sh                  # stops every node, this one included
#
# NAME is the Node's name and the plugin's pool. INDEX (1-9, one per node)
# picks the node's ports, all on 127.0.0.1:
#   kubelet 10250+100*INDEX, its healthz 10248+100*INDEX,
#   the plugin's health probes and metrics (--health-addr) 10280+100*INDEX,
#   each plus the cluster's FACET_PORT_OFFSET (from up.sh's env.sh).
# Everything else is per node, under RUN_DIR/nodes/NAME: the kubelet's root
# and certificates, the CRI socket, the CDI spec directory, the plugin's
# state, driver root and HAMi stand-in. Logs go to RUN_DIR/logs/NAME/
# (kubelet.log, fakecri.log, facet-plugin.log, and cdi.jsonl: the CDI devices
# of each container, as in up.sh's RUNTIME=fake).
#
# The node's IP is this host's first global IPv4 address (NODE_IP overrides
# it), shared by all added nodes: the kubelet refuses a loopback node IP, and
# this host cannot have more addresses of its own (docs/design/local-cluster.md,
# "More nodes"). The kubelet still listens on 127.0.0.1 only; the API server
# reaches a kubelet by hostname, which only "localhost" resolves to, so
# `kubectl logs` and `exec` do not reach added nodes. The fake CRI runs no
# containers, except those of Facet's simulator image
# (facet.local/facet:*-sim), which it runs as processes of this host
# (hack/tools/fakecri, exec mode): their output is in logs/NAME/exec/.
#
# Environment: RUN_DIR (as up.sh), READY_TIMEOUT (seconds, default 120),
# NODE_IP. Needs root and a running up.sh cluster; the plugin needs `make build`.
set -Eeuo pipefail

CLUSTER_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "${CLUSTER_DIR}/../.." && pwd)"

if [[ $# -lt 2 ]]; then
  echo "usage: $0 NAME INDEX [MACHINE_FILE [plugin flags...]]" >&2
  exit 2
fi
NAME="$1"; INDEX="$2"; shift 2
MACHINE="${1:-}"; [[ $# -gt 0 ]] && shift
RUN_DIR="${RUN_DIR:-${FACET_RUN_DIR:-/tmp/facet-run}}"
READY_TIMEOUT="${READY_TIMEOUT:-120}"

# A DNS label: it becomes a Node name, a pool name and a directory.
[[ "${NAME}" =~ ^[a-z0-9]([-a-z0-9]*[a-z0-9])?$ && "${NAME}" != localhost ]] ||
  { echo "NAME must be a DNS label other than localhost: ${NAME}" >&2; exit 2; }
[[ "${INDEX}" =~ ^[1-9]$ ]] || { echo "INDEX must be 1-9: ${INDEX}" >&2; exit 2; }
[[ -f "${RUN_DIR}/env.sh" && -f "${RUN_DIR}/kubelet-config.yaml" ]] ||
  { echo "no cluster in ${RUN_DIR}: start it with hack/cluster/up.sh" >&2; exit 1; }
if [[ -n "${MACHINE}" ]]; then
  [[ -f "${MACHINE}" ]] || { echo "no machine file ${MACHINE}" >&2; exit 2; }
  MACHINE="$(cd "$(dirname "${MACHINE}")" && pwd)/$(basename "${MACHINE}")"
fi
# shellcheck disable=SC1091
source "${RUN_DIR}/env.sh"

# FACET_PORT_OFFSET, from the cluster's env.sh: up.sh's node moved, its
# added nodes move with it.
KUBELET_PORT=$((10250 + 100 * INDEX + ${FACET_PORT_OFFSET:-0}))
HEALTHZ_PORT=$((10248 + 100 * INDEX + ${FACET_PORT_OFFSET:-0}))
PLUGIN_PORT=$((10280 + 100 * INDEX + ${FACET_PORT_OFFSET:-0}))
NODE_DIR="${RUN_DIR}/nodes/${NAME}"
LOGS="${RUN_DIR}/logs/${NAME}"
PIDS="${NODE_DIR}/pids"
KUBELET_ROOT="${NODE_DIR}/kubelet"
PKI="${RUN_DIR}/pki"

T0=${SECONDS}
log() { printf '[add-node %s %3ds] %s\n' "${NAME}" "$((SECONDS - T0))" "$*"; }
FAIL_PREFIX="[add-node ${NAME}]"
CLEANUP="RUN_DIR=${RUN_DIR} ${CLUSTER_DIR}/down.sh"
# shellcheck source=hack/cluster/lib.sh
source "${CLUSTER_DIR}/lib.sh"
trap 'fail "${CURRENT:-add-node.sh}" "command failed at line ${LINENO}: ${BASH_COMMAND}"' ERR

[[ ! -e "${NODE_DIR}" ]] || fail add-node.sh "${NODE_DIR} exists: node ${NAME} was added already"
for port in "${KUBELET_PORT}" "${HEALTHZ_PORT}" "${PLUGIN_PORT}"; do
  if ss -Hltn "sport = :${port}" 2>/dev/null | grep -q .; then
    fail add-node.sh "port ${port} (INDEX ${INDEX}) is in use; pick another INDEX"
  fi
done

# The kubelet refuses a loopback node IP and one that is no address of this
# host; without --node-ip it would look its own name up in DNS at every
# status update.
NODE_IP="${NODE_IP:-$(ip -4 -o addr show scope global | awk '{ split($4, a, "/"); print a[1]; exit }')}"
[[ -n "${NODE_IP}" ]] || fail add-node.sh "this host has no global IPv4 address for the node IP; set NODE_IP"

mkdir -p "${LOGS}" "${PIDS}" "${KUBELET_ROOT}/plugins/gpu.facet.dev" "${KUBELET_ROOT}/plugins_registry" \
  "${KUBELET_ROOT}/certs" "${KUBELET_ROOT}/volume-plugins" "${NODE_DIR}/cdi" \
  "${NODE_DIR}/pod-logs" "${NODE_DIR}/fakecri-imagefs"
rm -f "${LOGS}"/*.log "${LOGS}"/*.jsonl
rm -rf "${LOGS}/exec"

# --- the kubelet's identity: CN system:node:NAME, so the Node authorizer
# applies to it as to a real node ------------------------------------------
openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "${NODE_DIR}/kubelet.key" 2>/dev/null
openssl req -new -key "${NODE_DIR}/kubelet.key" -subj "/O=system:nodes/CN=system:node:${NAME}" \
  -out "${NODE_DIR}/kubelet.csr" 2>/dev/null
openssl x509 -req -in "${NODE_DIR}/kubelet.csr" -CA "${PKI}/ca.crt" -CAkey "${PKI}/ca.key" \
  -CAcreateserial -days 365 -sha256 -out "${NODE_DIR}/kubelet.crt" 2>/dev/null \
  -extfile <(printf 'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n')
rm -f "${NODE_DIR}/kubelet.csr"
KC="${NODE_DIR}/kubelet.kubeconfig"
kc() { kubectl --kubeconfig "${KC}" config "$@" >/dev/null; }
kc set-cluster facet-local --server="https://127.0.0.1:${FACET_APISERVER_PORT:-6443}" --certificate-authority="${PKI}/ca.crt" --embed-certs
kc set-credentials "system:node:${NAME}" --client-certificate="${NODE_DIR}/kubelet.crt" \
  --client-key="${NODE_DIR}/kubelet.key" --embed-certs
kc set-context facet-local --cluster=facet-local --user="system:node:${NAME}"
kc use-context facet-local
chmod 600 "${KC}"

# --- fake CRI ---------------------------------------------------------------
# Exec mode for Facet's simulator image: its containers (the IMEX daemon's
# stand-in, facet-imex --simulate) run as processes of this host, from this
# checkout's bin/ (make build), with the cluster's admin kubeconfig (a host
# process cannot read the pod's service account token); their output goes
# to ${LOGS}/exec/. Every other image's containers never run.
CRI_SOCK="${NODE_DIR}/fakecri.sock"
CDI_LOG="${LOGS}/cdi.jsonl"
SIM_IMAGE="facet.local/facet:$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' "${REPO}/deployments/helm/facet/Chart.yaml")-sim"
: >"${CDI_LOG}"
start fakecri "${FACET_BIN_DIR}/fakecri" --socket "${CRI_SOCK}" --cdi-log "${CDI_LOG}" \
  --image-fs "${NODE_DIR}/fakecri-imagefs" --images "facet.local/busybox:1,registry.k8s.io/pause:3.10,${SIM_IMAGE}" \
  --exec-images 'facet.local/facet:*-sim' --exec-bin-dir "${REPO}/bin" --exec-log-dir "${LOGS}/exec" \
  --exec-env "KUBECONFIG=${KUBECONFIG}"
wait_for fakecri "serving" test -S "${CRI_SOCK}"

# --- kubelet: up.sh's configuration, with this node's ports and paths. (Not
# as a --config-dir drop-in: the kubelet's merge drops up.sh's empty
# enforceNodeAllocatable list and defaults it to ["pods"], which then fails
# validation beside cgroupsPerQOS: false.) --------------------------------------
declare -A override=(
  [port]="${KUBELET_PORT}"
  [healthzPort]="${HEALTHZ_PORT}"
  [containerRuntimeEndpoint]="unix://${CRI_SOCK}"
  [podLogsDir]="${NODE_DIR}/pod-logs"
  [volumePluginDir]="${KUBELET_ROOT}/volume-plugins"
)
cp "${RUN_DIR}/kubelet-config.yaml" "${NODE_DIR}/kubelet-config.yaml"
for key in "${!override[@]}"; do
  grep -q "^${key}: " "${NODE_DIR}/kubelet-config.yaml" || fail kubelet "no top-level ${key} in ${RUN_DIR}/kubelet-config.yaml"
  sed -i "s|^${key}: .*|${key}: ${override[${key}]}|" "${NODE_DIR}/kubelet-config.yaml"
done
start kubelet "${FACET_BIN_DIR}/kubelet" \
  --config="${NODE_DIR}/kubelet-config.yaml" \
  --kubeconfig="${KC}" \
  --root-dir="${KUBELET_ROOT}" --cert-dir="${KUBELET_ROOT}/certs" \
  --hostname-override="${NAME}" --node-ip="${NODE_IP}" \
  --v=2
wait_for kubelet "healthz ok" curl -fsS "http://127.0.0.1:${HEALTHZ_PORT}/healthz"
wait_for kubelet "node ${NAME} Ready" node_ready "${NAME}" kubectl

# --- this node's environment, sourced after RUN_DIR/env.sh --------------------
write_env "${NODE_DIR}/env.sh" "Written by hack/cluster/add-node.sh for node ${NAME}; source after ${RUN_DIR}/env.sh." \
  FACET_NODE_NAME="${NAME}" \
  FACET_NODE_DIR="${NODE_DIR}" \
  FACET_CDI_DIR="${NODE_DIR}/cdi" \
  FACET_KUBELET_ROOT="${KUBELET_ROOT}" \
  FACET_CRI_SOCKET="${CRI_SOCK}" \
  FACET_CDI_LOG="${CDI_LOG}" \
  FACET_PLUGIN_HEALTH_ADDR="127.0.0.1:${PLUGIN_PORT}"

# --- Facet's kubelet plugin ----------------------------------------------------
if [[ -n "${MACHINE}" ]]; then
  # A failed start reports the plugin's log, not the kubelet's (lib.sh's fail).
  CURRENT=facet-plugin
  FACET_NODE="${NAME}" "${REPO}/hack/plugin.sh" start "${RUN_DIR}" "${MACHINE}" "$@"
  wait_for facet-plugin "registered with the kubelet, slices published (/readyz)" \
    curl -fsS "http://127.0.0.1:${PLUGIN_PORT}/readyz"
fi
log "node ${NAME} Ready (IP ${NODE_IP}, kubelet 127.0.0.1:${KUBELET_PORT}${MACHINE:+, plugin on $(basename "${MACHINE}") at 127.0.0.1:${PLUGIN_PORT}})"
