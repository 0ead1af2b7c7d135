#!/usr/bin/env bash
# Smoke test of a cluster started by hack/cluster/up.sh: a hostNetwork busybox
# pod (imagePullPolicy: Never) reaches Running; with RUNTIME=containerd,
# `kubectl exec` and `kubectl logs` work too. Deletes its pod at the end.
#
# Usage: hack/cluster/smoke.sh     (RUN_DIR as for up.sh)
set -euo pipefail

RUN_DIR="${RUN_DIR:-${FACET_RUN_DIR:-/tmp/facet-run}}"
# shellcheck source=/dev/null
source "${RUN_DIR}/env.sh"

POD="facet-smoke-$$"
log() { echo "[smoke] $*"; }
cleanup() { kubectl delete pod "${POD}" --ignore-not-found --wait=false >/dev/null 2>&1 || true; }
trap cleanup EXIT

t=${SECONDS}
kubectl apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata:
  name: ${POD}
spec:
  hostNetwork: true
  terminationGracePeriodSeconds: 1
  containers:
  - name: bb
    image: facet.local/busybox:1
    imagePullPolicy: Never
    command: [sh, -c, 'echo smoke-log-line; exec sleep 3600']
YAML
if ! kubectl wait --for=condition=Ready "pod/${POD}" --timeout=90s >/dev/null; then
  kubectl describe pod "${POD}" | tail -20
  log "FAILED: pod did not become Ready"
  exit 1
fi
log "pod Running after $((SECONDS - t))s (runtime ${FACET_RUNTIME})"

if [[ "${FACET_RUNTIME}" == containerd ]]; then
  out="$(kubectl exec "${POD}" -- sh -c 'echo exec-ok')"
  [[ "${out}" == exec-ok ]] || { log "FAILED: kubectl exec printed '${out}'"; exit 1; }
  log "kubectl exec ok"
  out=""
  for _ in $(seq 1 25); do
    out="$(kubectl logs "${POD}" 2>/dev/null || true)"
    [[ "${out}" == *smoke-log-line* ]] && break
    sleep 0.2
  done
  [[ "${out}" == *smoke-log-line* ]] || { log "FAILED: kubectl logs printed '${out}'"; exit 1; }
  log "kubectl logs ok"
fi
log "passed"
