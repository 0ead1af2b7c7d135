#!/usr/bin/env bash
# Starts Facet's kubelet plugin in the background against the node that
# hack/cluster/up.sh runs, on a simulated machine; or stops it.
#   hack/plugin.sh start RUN_DIR MACHINE_FILE [plugin flags...]
#   hack/plugin.sh stop RUN_DIR
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cmd="$1"; RUN_DIR="$2"; shift 2
pidfile="${RUN_DIR}/pids/facet-plugin.pid"

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

case "${cmd}" in
  stop) stop ;;
  start)
    MACHINE="$1"; shift
    stop
    # shellcheck disable=SC1091
    source "${RUN_DIR}/env.sh"
    "${REPO}/hack/sim-node.sh" "${RUN_DIR}" "${MACHINE}" >/dev/null
    mkdir -p "${RUN_DIR}/logs" "${RUN_DIR}/pids"
    # setsid: the plugin outlives the make that started it (and must not
    # hold the e2e lock's fd, see hack/cluster/up.sh's start). unshare: a
    # private mount namespace, where the plugin binds the simulated
    # /proc/driver/nvidia-caps that nvcdi reads for MIG devices.
    setsid unshare --mount --propagation private "${REPO}/bin/facet-kubeletplugin" \
      --node-name localhost \
      --kubeconfig "${KUBECONFIG}" \
      --machine "${MACHINE}" \
      --driver-root "${RUN_DIR}/driver-root" \
      --nvidia-cdi-hook "${REPO}/bin/nvidia-cdi-hook" \
      --cdi-dir "${FACET_CDI_DIR}" \
      --state-dir "${RUN_DIR}/facet-state" \
      --kubelet-registrar-dir "${FACET_KUBELET_ROOT}/plugins_registry" \
      --kubelet-plugins-dir "${FACET_KUBELET_ROOT}/plugins" \
      --hami-library "${RUN_DIR}/hami/libvgpu.so" \
      "$@" >"${RUN_DIR}/logs/facet-plugin.log" 2>&1 < /dev/null 3>&- 9>&- &
    echo $! > "${pidfile}"
    ;;
  *) echo "usage: $0 start|stop RUN_DIR ..." >&2; exit 2 ;;
esac
