#!/usr/bin/env bash
# Stops the local cluster that hack/cluster/up.sh started in RUN_DIR and removes
# its transient state. Safe to run when nothing is running, or twice.
#
# Usage:
#   hack/cluster/down.sh            # RUN_DIR defaults to ${FACET_RUN_DIR:-/tmp/facet-run}
#   hack/cluster/down.sh --quiet    # as called by up.sh
#
# What it does, in order:
#   1. stops the kubelets first (so they restart nothing), then the runtime's
#      containers (runc kill/delete, for RUNTIME=containerd), then the added
#      nodes' plugins and fake CRIs (hack/cluster/add-node.sh), then every
#      component by the pid in RUN_DIR/pids (TERM, then KILL after 10s);
#   2. kills leftover containerd shims that belong to this RUN_DIR's containerd;
#   3. unmounts everything mounted under RUN_DIR (kubelet volumes, containerd
#      snapshots and sandbox shm), deepest first;
#   4. removes RUN_DIR's state but keeps RUN_DIR/logs for post-mortems
#      (up.sh truncates them). It refuses to delete while anything is still
#      mounted below RUN_DIR, so a stuck mount can never make rm reach the host.
set -euo pipefail

RUN_DIR="${RUN_DIR:-${FACET_RUN_DIR:-/tmp/facet-run}}"
QUIET=0
[[ "${1:-}" == "--quiet" ]] && QUIET=1

log() { [[ ${QUIET} == 1 ]] || echo "[down] $*"; }

case "${RUN_DIR}" in
  /*) ;;
  *) echo "RUN_DIR must be an absolute path: ${RUN_DIR}" >&2; exit 2 ;;
esac
if [[ "${RUN_DIR}" == / || ! -d "${RUN_DIR}" ]]; then
  log "nothing to do: ${RUN_DIR} does not exist"
  exit 0
fi
RUN_DIR="$(cd "${RUN_DIR}" && pwd -P)"
PIDS="${RUN_DIR}/pids"

# is_ours NAME PID: the pid is alive and still runs the binary we started (a
# stale pid file must never make us kill an unrelated process that reused it).
is_ours() {
  local name="$1" pid="$2" exe
  [[ "${pid}" =~ ^[0-9]+$ ]] || return 1
  exe="$(readlink "/proc/${pid}/exe" 2>/dev/null)" || return 1
  exe="${exe% (deleted)}"  # the binary may have been rebuilt meanwhile
  case "${name}" in
    fakecri|etcd|kube-*|kubelet|containerd) [[ "${exe##*/}" == "${name}" ]] ;;
    facet-plugin) [[ "${exe##*/}" == facet-kubeletplugin ]] ;;
    *) return 1 ;;
  esac
}

# stop NAME [PIDS_DIR]: TERM, wait up to 10s, then KILL.
stop() {
  local name="$1" pidfile="${2:-${PIDS}}/$1.pid" pid
  [[ -f "${pidfile}" ]] || return 0
  pid="$(cat "${pidfile}")"
  if is_ours "${name}" "${pid}"; then
    kill -TERM "${pid}" 2>/dev/null || true
    for _ in $(seq 1 50); do
      is_ours "${name}" "${pid}" || break
      sleep 0.2
    done
    if is_ours "${name}" "${pid}"; then
      log "${name} (pid ${pid}) ignored TERM; killing"
      kill -KILL "${pid}" 2>/dev/null || true
      sleep 0.2
    fi
    log "stopped ${name} (pid ${pid}${2:+, ${2#"${RUN_DIR}"/}})"
  fi
  rm -f "${pidfile}"
}

# 1. The kubelets first: otherwise they restart what we stop.
stop kubelet
for node_pids in "${RUN_DIR}"/nodes/*/pids; do
  [[ -d "${node_pids}" ]] || continue
  stop kubelet "${node_pids}"
done

# Containers of RUNTIME=containerd: kill them through runc directly (works even
# when containerd is already gone). up.sh sets runc's root to containerd/runc;
# the shim adds the namespace.
RUNC_ROOT="${RUN_DIR}/containerd/runc/k8s.io"
if [[ -d "${RUNC_ROOT}" ]] && command -v runc >/dev/null; then
  for id in $(runc --root "${RUNC_ROOT}" list -q 2>/dev/null); do
    runc --root "${RUNC_ROOT}" kill "${id}" KILL 2>/dev/null || true
  done
  sleep 0.5
  for id in $(runc --root "${RUNC_ROOT}" list -q 2>/dev/null); do
    runc --root "${RUNC_ROOT}" delete --force "${id}" 2>/dev/null || true
  done
fi

# Added nodes' plugins and fake CRIs, while the API server still answers.
for node_pids in "${RUN_DIR}"/nodes/*/pids; do
  [[ -d "${node_pids}" ]] || continue
  stop facet-plugin "${node_pids}"
  stop fakecri "${node_pids}"
done

for name in containerd fakecri kube-scheduler kube-controller-manager kube-apiserver etcd; do
  stop "${name}"
done

# 2. Shims of this RUN_DIR's containerd (matched by its socket on their command
#    line) outlive containerd; end them by pid.
SOCK="${RUN_DIR}/containerd/containerd.sock"
for p in /proc/[0-9]*; do
  # (processes may vanish meanwhile: silence the redirection error too)
  cmdline="$( { tr '\0' ' ' <"${p}/cmdline"; } 2>/dev/null)" || continue
  if [[ "${cmdline}" == *containerd-shim-runc-v2* && "${cmdline}" == *" -address ${SOCK} "* ]]; then
    log "killing leftover shim ${p#/proc/}"
    kill -KILL "${p#/proc/}" 2>/dev/null || true
  fi
done

# facet-mps processes that test/e2e started on RUN_DIR's MPS directory and
# left (a killed test binary), then the MPS control daemons (the simulated
# driver root's stand-in) they, or the chart's facet-mps, started under
# RUN_DIR: only a live process that is the control program is killed.
for p in /proc/[0-9]*; do
  cmdline="$( { tr '\0' ' ' <"${p}/cmdline"; } 2>/dev/null)" || continue
  if [[ "${cmdline}" == *facet-mps* && "${cmdline}" == *"--mps-dir ${RUN_DIR}/"* ]]; then
    log "killing leftover facet-mps ${p#/proc/}"
    kill -KILL "${p#/proc/}" 2>/dev/null || true
  fi
done
for pidfile in "${RUN_DIR}"/mps*/*/pipe/nvidia-cuda-mps-control.pid; do
  [[ -f "${pidfile}" ]] || continue
  pid="$(cat "${pidfile}" 2>/dev/null || true)"
  [[ "${pid}" =~ ^[0-9]+$ ]] || continue
  cmdline="$( { tr '\0' ' ' <"/proc/${pid}/cmdline"; } 2>/dev/null)" || continue
  if [[ "${cmdline}" == *nvidia-cuda-mps-control* ]]; then
    log "killing leftover MPS control daemon ${pid}"
    kill -KILL "${pid}" 2>/dev/null || true
  fi
done

# 3. Unmount everything below RUN_DIR, deepest first. Mountinfo escapes spaces
#    as \040; RUN_DIR is expected to have none.
mounts_below() {
  awk -v d="${RUN_DIR}/" 'index($5, d) == 1 { print $5 }' /proc/self/mountinfo | sort -r
}
for _ in 1 2 3; do
  m="$(mounts_below)"
  [[ -z "${m}" ]] && break
  while read -r mp; do
    umount "${mp}" 2>/dev/null || umount -l "${mp}" 2>/dev/null || true
  done <<<"${m}"
done
if [[ -n "$(mounts_below)" ]]; then
  echo "[down] still mounted below ${RUN_DIR}; not deleting state:" >&2
  mounts_below >&2
  exit 1
fi

# The kubelet writes /var/log/containers symlinks into our pod-logs dir: drop ours.
if [[ -d /var/log/containers ]]; then
  find /var/log/containers -maxdepth 1 -type l -lname "${RUN_DIR}/*" -delete 2>/dev/null || true
fi

# 4. Transient state; the logs stay.
find "${RUN_DIR}" -mindepth 1 -maxdepth 1 ! -name logs -exec rm -rf --one-file-system {} +
log "cluster in ${RUN_DIR} is down (logs kept in ${RUN_DIR}/logs)"
