#!/usr/bin/env bash
# Starts Facet's kubelet plugin in the background against a node of the
# cluster that hack/cluster/up.sh runs, on a simulated machine; or stops or
# restarts it.
#   hack/plugin.sh start RUN_DIR MACHINE_FILE [plugin flags...]
#   hack/plugin.sh stop RUN_DIR
#   hack/plugin.sh restart RUN_DIR    # stop, then start with the last start's arguments
# FACET_NODE names the node (default: up.sh's "localhost"); another node is
# one hack/cluster/add-node.sh added, whose paths and health port come from
# RUN_DIR/nodes/FACET_NODE/env.sh, and whose state lives in that directory.
# Each node also gets facet-mps (the chart's MPS DaemonSet), started with
# its first plugin and left running across plugin restarts and stops, as
# the DaemonSet is; hack/cluster/down.sh stops it.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cmd="$1"; RUN_DIR="$2"; shift 2
NODE="${FACET_NODE:-localhost}"
if [[ "${NODE}" == localhost ]]; then
  NODE_DIR="${RUN_DIR}"
  pidfile="${RUN_DIR}/pids/facet-plugin.pid"
  logfile="${RUN_DIR}/logs/facet-plugin.log"
  append=0
else
  NODE_DIR="${RUN_DIR}/nodes/${NODE}"
  pidfile="${NODE_DIR}/pids/facet-plugin.pid"
  logfile="${RUN_DIR}/logs/${NODE}/facet-plugin.log"
  # An added node's log keeps what came before a restart (add-node.sh
  # starts it empty).
  append=1
fi
argsfile="${NODE_DIR}/facet-plugin.args"

stop() {
  if [[ -f "${pidfile}" ]]; then
    local pid; pid="$(cat "${pidfile}")"
    if kill -0 "${pid}" 2>/dev/null; then
      kill "${pid}"
      for _ in $(seq 50); do kill -0 "${pid}" 2>/dev/null || break; sleep 0.1; done
      kill -9 "${pid}" 2>/dev/null || true
    fi
    rm -f "${pidfile}"
  fi
}

start() {
  MACHINE="$1"; shift
  stop
  # shellcheck disable=SC1091
  source "${RUN_DIR}/env.sh"
  local health=()
  if [[ "${NODE}" != localhost ]]; then
    # shellcheck disable=SC1090
    source "${NODE_DIR}/env.sh"
    # Probes and metrics on the node's own port (add-node.sh's INDEX).
    health=(--health-addr "${FACET_PLUGIN_HEALTH_ADDR}")
  fi
  # restart replays these arguments.
  printf '%s\0' "${MACHINE}" "$@" >"${argsfile}"
  "${REPO}/hack/sim-node.sh" "${NODE_DIR}" "${MACHINE}" >/dev/null
  mkdir -p "$(dirname "${logfile}")" "$(dirname "${pidfile}")"
  local mps_pidfile="${NODE_DIR}/pids/facet-mps.pid"
  if ! { [[ -f "${mps_pidfile}" ]] && kill -0 "$(cat "${mps_pidfile}")" 2>/dev/null; }; then
    # In the host's mount namespace: each GPU's /dev/shm tmpfs it mounts
    # must be where containerd binds it from.
    setsid "${REPO}/bin/facet-mps" --driver-root "${NODE_DIR}/driver-root" --mps-dir "${NODE_DIR}/mps" --shm-size 64Mi \
      >>"$(dirname "${logfile}")/facet-mps.log" 2>&1 < /dev/null 3>&- 9>&- &
    echo $! > "${mps_pidfile}"
  fi
  if [[ ${append} == 0 ]]; then : >"${logfile}"; fi
  # setsid: the plugin outlives the make that started it (and must not
  # hold the e2e lock's fd, see hack/cluster/up.sh's start). unshare: a
  # private mount namespace, where the plugin binds the simulated
  # /proc/driver/nvidia-caps that nvcdi reads for MIG devices.
  setsid unshare --mount --propagation private "${REPO}/bin/facet-kubeletplugin" \
    --node-name "${NODE}" \
    --kubeconfig "${KUBECONFIG}" \
    --machine "${MACHINE}" \
    --driver-root "${NODE_DIR}/driver-root" \
    --nvidia-cdi-hook "${REPO}/bin/nvidia-cdi-hook" \
    --cdi-dir "${FACET_CDI_DIR}" \
    --state-dir "${NODE_DIR}/facet-state" \
    --kubelet-registrar-dir "${FACET_KUBELET_ROOT}/plugins_registry" \
    --kubelet-plugins-dir "${FACET_KUBELET_ROOT}/plugins" \
    --hami-library "${NODE_DIR}/hami/libvgpu.so" \
    --mps-dir "${NODE_DIR}/mps" \
    "${health[@]}" \
    "$@" >>"${logfile}" 2>&1 < /dev/null 3>&- 9>&- &
  echo $! > "${pidfile}"
}

case "${cmd}" in
  stop) stop ;;
  start) start "$@" ;;
  restart)
    [[ -f "${argsfile}" ]] || { echo "no earlier start of node ${NODE}'s plugin in ${RUN_DIR}" >&2; exit 1; }
    mapfile -d '' -t saved <"${argsfile}"
    start "${saved[@]}"
    ;;
  *) echo "usage: $0 start|stop|restart RUN_DIR ..." >&2; exit 2 ;;
esac
