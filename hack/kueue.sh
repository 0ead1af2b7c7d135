#!/usr/bin/env bash
# Kueue's manager (hack/build-kueue.sh: sigs.k8s.io/kueue v0.17.0) as a host
# process beside the local node (hack/cluster/up.sh), for test/e2e's Kueue
# tests and `FACET_DEMO_KUEUE=1 make demo`:
#   - Kueue's CRDs, from the same module version;
#   - its webhooks served on 127.0.0.1:${FACET_KUEUE_WEBHOOK_PORT} with a
#     certificate for 127.0.0.1 made by openssl (Kueue's internal cert
#     manager off), registered by URL; only those of Kueue's own API, of
#     batch/v1 Jobs and of pods labelled kueue.x-k8s.io/queue-name
#     (hack/kueue-webhooks);
#   - its visibility server off (VisibilityOnDemand=false), no leader
#     election, metrics off (but a metrics certificate at the fixed path
#     /etc/kueue/metrics/certs, bind-mounted in Kueue's own mount
#     namespace: root, as for the node);
#   - the Kueue feature gate DynamicResourceAllocation on, with a
#     deviceClassMappings entry for gpu.facet.dev (as facet.dev/gpu) and per
#     DeviceClass <name>.facet.dev of the files in FACET_KUEUE_CLASSES (e.g.
#     `facetctl classes` output, as facet.dev/<name>). Not every shipped
#     class: Kueue v0.17 takes at most 16 mappings (docs/kueue.md).
#
#   hack/kueue.sh start RUN_DIR    (RUN_DIR/env.sh: the node's kubeconfig and kubectl)
#   hack/kueue.sh stop RUN_DIR
# Log: RUN_DIR/logs/kueue.log.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cmd="${1:?usage: $0 start|stop RUN_DIR}"; RUN_DIR="${2:?usage: $0 start|stop RUN_DIR}"
# Moved with the node's ports (hack/cluster/up.sh, FACET_PORT_OFFSET), so
# that the Kueues of two nodes side by side do not meet.
PORT="${FACET_KUEUE_WEBHOOK_PORT:-$((9445 + ${FACET_PORT_OFFSET:-0}))}"
HEALTH_PORT="${FACET_KUEUE_HEALTH_PORT:-$((9446 + ${FACET_PORT_OFFSET:-0}))}"
log() { echo "[kueue] $*" >&2; }

stop() {
  local pid
  if [[ -f "${RUN_DIR}/pids/kueue.pid" ]]; then
    pid="$(cat "${RUN_DIR}/pids/kueue.pid")"
    if kill "${pid}" 2>/dev/null; then
      for _ in $(seq 100); do kill -0 "${pid}" 2>/dev/null || break; sleep 0.1; done
      kill -9 "${pid}" 2>/dev/null || true
    fi
    rm -f "${RUN_DIR}/pids/kueue.pid"
  fi
  if [[ -f "${RUN_DIR}/env.sh" ]]; then
    # shellcheck disable=SC1091
    source "${RUN_DIR}/env.sh"
    kubectl delete mutatingwebhookconfiguration kueue-mutating-webhook-configuration --ignore-not-found >/dev/null 2>&1 || true
    kubectl delete validatingwebhookconfiguration kueue-validating-webhook-configuration --ignore-not-found >/dev/null 2>&1 || true
  fi
}

# mappings prints the Configuration's deviceClassMappings, or fails where
# Kueue would refuse them.
mappings() {
  local f names
  # A class's name is its metadata's; selectors and configs have none.
  names="$(for f in ${FACET_KUEUE_CLASSES:-}; do
    awk '/^kind: DeviceClass/ {dc=1} /^---/ {dc=0; meta=0} dc && /^metadata:/ {meta=1; next} meta && /^  name: / {print $2; meta=0} meta && /^[^ ]/ {meta=0}' "${f}"
  done | grep '\.facet\.dev$' | grep -vx 'gpu\.facet\.dev' | sort -u)"
  if (($(wc -w <<<"gpu.facet.dev ${names}") > 16)); then
    log "Kueue v0.17 takes at most 16 deviceClassMappings; gpu.facet.dev and FACET_KUEUE_CLASSES name $(wc -w <<<"gpu.facet.dev ${names}") classes"
    return 1
  fi
  echo "  - {name: facet.dev/gpu, deviceClassNames: [gpu.facet.dev]}"
  for f in ${names}; do
    echo "  - {name: facet.dev/${f%.facet.dev}, deviceClassNames: [${f}]}"
  done
}

start() {
  stop
  # shellcheck disable=SC1091
  source "${RUN_DIR}/env.sh"
  local bin dir src
  # The build's lock (.ci/run and hack/e2e.sh build it beside the tests):
  # a build under way is waited for, never started twice.
  local locks="${FACET_CACHE:-$HOME/.cache/facet}/bin"
  mkdir -p "${locks}"
  bin="$(flock "${locks}/.build-kueue.lock" "${REPO}/hack/build-kueue.sh" | tail -n1)"
  dir="${RUN_DIR}/kueue"
  mkdir -p "${dir}/certs" "${RUN_DIR}/logs" "${RUN_DIR}/pids"
  kubectl apply --server-side -f "${bin}/crds" >/dev/null
  kubectl wait --for condition=established --timeout=60s -f "${bin}/crds" >/dev/null
  kubectl create namespace kueue-system --dry-run=client -o yaml | kubectl apply -f - >/dev/null
  (
    cd "${dir}/certs"
    openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out ca.key 2>/dev/null
    openssl req -x509 -new -key ca.key -subj /CN=facet-kueue-ca -days 30 -sha256 \
      -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign -out ca.crt
    openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out tls.key 2>/dev/null
    openssl req -new -key tls.key -subj /CN=kueue-webhook -out tls.csr
    printf 'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1\n' >tls.ext
    openssl x509 -req -in tls.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 30 -sha256 -extfile tls.ext -out tls.crt 2>/dev/null
  )
  local mapped
  mapped="$(mappings)"
  cat >"${dir}/config.yaml" <<EOC
apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
namespace: kueue-system
health: {healthProbeBindAddress: "127.0.0.1:${HEALTH_PORT}"}
metrics: {bindAddress: "0"}
webhook: {host: 127.0.0.1, port: ${PORT}, certDir: "${dir}/certs"}
leaderElection: {leaderElect: false}
internalCertManagement: {enable: false}
integrations:
  frameworks: [batch/job, pod]
resources:
  deviceClassMappings:
${mapped}
EOC
  # With its internal cert manager off, Kueue v0.17 loads a metrics
  # certificate from the fixed path /etc/kueue/metrics/certs (cmd/kueue's
  # main.go), even with metrics off, and exits without one. The webhook's
  # certificate is bind-mounted there in a mount namespace of Kueue's own,
  # so the host's /etc gets only the empty mount point. unshare execs (no
  # --fork): the pid stays Kueue's.
  mkdir -p /etc/kueue/metrics/certs
  setsid unshare --mount --propagation private -- sh -c 'mount --bind "$0" /etc/kueue/metrics/certs && exec "$@"' \
    "${dir}/certs" "${bin}/kueue" --config "${dir}/config.yaml" --kubeconfig "${KUBECONFIG}" \
    --feature-gates DynamicResourceAllocation=true,VisibilityOnDemand=false \
    >"${RUN_DIR}/logs/kueue.log" 2>&1 </dev/null &
  echo $! >"${RUN_DIR}/pids/kueue.pid"
  for _ in $(seq 120); do
    curl -fsS "http://127.0.0.1:${HEALTH_PORT}/readyz" >/dev/null 2>&1 && break
    kill -0 "$(cat "${RUN_DIR}/pids/kueue.pid")" 2>/dev/null || break
    sleep 0.5
  done
  curl -fsS "http://127.0.0.1:${HEALTH_PORT}/readyz" >/dev/null 2>&1 ||
    { log "Kueue is not ready; its log:"; tail -30 "${RUN_DIR}/logs/kueue.log" >&2; exit 1; }
  src="$(cd "${REPO}/hack/tools/kueue" && go list -m -f '{{.Dir}}' sigs.k8s.io/kueue)"
  (cd "${REPO}" && go run ./hack/kueue-webhooks -manifests "${src}/config/components/webhook/manifests.yaml" \
    -url "https://127.0.0.1:${PORT}" -ca "${dir}/certs/ca.crt" -keep batch-v1-job,-v1-pod) >"${dir}/webhooks.yaml"
  kubectl apply -f "${dir}/webhooks.yaml" >/dev/null
  # The webhooks answer once Kueue's own ResourceFlavor webhook does: a
  # server-side dry run goes through it.
  for _ in $(seq 60); do
    kubectl apply --dry-run=server -f - >/dev/null 2>&1 <<EOR && break
apiVersion: kueue.x-k8s.io/v1beta2
kind: ResourceFlavor
metadata: {name: facet-probe}
EOR
    sleep 0.5
  done
  log "Kueue running (pid $(cat "${RUN_DIR}/pids/kueue.pid")), webhooks on 127.0.0.1:${PORT}, log ${RUN_DIR}/logs/kueue.log"
}

case "${cmd}" in
  start) start ;;
  stop) stop ;;
  *) echo "usage: $0 start|stop RUN_DIR" >&2; exit 2 ;;
esac
