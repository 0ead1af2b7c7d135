#!/usr/bin/env bash
# The demo's admission, installed the way test/e2e/admission_test.go does it:
#   - Facet's ValidatingAdmissionPolicies (deployments/admission/policies.yaml,
#     which the chart copies verbatim), where DRAConsumableCapacity is on:
#     on a stock 1.35 API server the capacity requests they check are dropped
#     before admission, so there they would refuse every vGPU share;
#   - facet-webhook as a host process on 127.0.0.1:${FACET_DEMO_WEBHOOK_PORT},
#     with a serving certificate made by openssl, behind a
#     ValidatingWebhookConfiguration shaped like the chart's (one webhook per
#     kind, only objects with a gpu.facet.dev opaque config sent, failurePolicy
#     Fail) but with a url instead of a Service.
# Then it shows the API server refusing a ResourceClaim whose opaque config is
# malformed, with its message.
#   hack/demo-admission.sh start RUN_DIR
#   hack/demo-admission.sh stop RUN_DIR
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cmd="$1"; RUN_DIR="$2"
PORT="${FACET_DEMO_WEBHOOK_PORT:-9443}"
VWC=facet-demo-webhook

# stop ends the demo's facet-webhook: the process listening on PORT, if it is
# a facet-webhook. Its pid file does not survive hack/cluster/up.sh, which
# clears RUN_DIR, so the port is what finds it.
stop() {
  local pid exe
  for pid in $(ss -Hltnp "sport = :${PORT}" 2>/dev/null | grep -o 'pid=[0-9]*' | cut -d= -f2 | sort -u); do
    exe="$(readlink "/proc/${pid}/exe" 2>/dev/null)" || continue
    exe="${exe% (deleted)}"
    [[ "${exe##*/}" == facet-webhook ]] || continue
    kill "${pid}"
    for _ in $(seq 50); do kill -0 "${pid}" 2>/dev/null || break; sleep 0.1; done
    kill -9 "${pid}" 2>/dev/null || true
  done
  rm -f "${RUN_DIR}/pids/facet-webhook.pid"
}

# refused MANIFEST WANT: the server-side dry run of MANIFEST fails with WANT
# in its message.
refused() {
  local out
  out="$(kubectl apply --dry-run=server -f - <<<"$1" 2>&1)" && return 1
  [[ "${out}" == *"$2"* ]]
}

wait_refused() {
  local what="$1" manifest="$2" want="$3"
  for _ in $(seq 120); do
    refused "${manifest}" "${want}" && return 0
    sleep 0.5
  done
  echo "${what}: not enforced after 60 s; the last answer:" >&2
  kubectl apply --dry-run=server -f - <<<"${manifest}" >&2 || true
  return 1
}

# claim NAME REQUEST EXACTLY PARAMETERS: a ResourceClaim with one request
# (EXACTLY as a YAML flow mapping) and an opaque config for it.
claim() {
  cat <<EOF
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: $1, namespace: facet-demo}
spec:
  devices:
    requests:
    - name: $2
      exactly: $3
    config:
    - requests: [$2]
      opaque:
        driver: gpu.facet.dev
        parameters: $4
EOF
}

# vgpu_claim NAME PARAMETERS: a 4 GiB vGPU share with an opaque config.
vgpu_claim() { claim "$1" share '{deviceClassName: vgpu.facet.dev, capacity: {requests: {memory: 4Gi}}}' "$2"; }

# gpu_claim NAME PARAMETERS: a whole GPU with an opaque config.
gpu_claim() { claim "$1" gpu '{deviceClassName: gpu.facet.dev}' "$2"; }

start() {
  stop
  # shellcheck disable=SC1091
  source "${RUN_DIR}/env.sh"
  kubectl apply -f "${REPO}/demo/gpu/namespace.yaml" >/dev/null

  if [[ ",${FACET_FEATURE_GATES}," == *",DRAConsumableCapacity=true,"* ]]; then
    kubectl apply -f "${REPO}/deployments/admission/policies.yaml"
    # A policy takes a moment to reach the API server's admission chain.
    wait_refused "ValidatingAdmissionPolicy resourceclaims.gpu.facet.dev" \
      "$(claim probe share '{deviceClassName: vgpu.facet.dev}' '{apiVersion: gpu.facet.dev/v1alpha1, kind: VgpuConfig}')" \
      "ValidatingAdmissionPolicy 'resourceclaims.gpu.facet.dev'"
  else
    echo "ValidatingAdmissionPolicies: not applied here, as DRAConsumableCapacity is off and the API server drops the capacity requests they check (the chart's, where installed, then refuse vGPU share claims, which cannot work without it)"
  fi

  local dir="${RUN_DIR}/webhook"
  mkdir -p "${dir}" "${RUN_DIR}/logs" "${RUN_DIR}/pids"
  # A CA and a serving certificate for 127.0.0.1, as test/e2e's webhookCerts.
  (
    cd "${dir}"
    openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out ca.key 2>/dev/null
    openssl req -x509 -new -key ca.key -subj /CN=facet-demo-webhook-ca -days 30 -sha256 \
      -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign -out ca.crt
    openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out tls.key 2>/dev/null
    openssl req -new -key tls.key -subj /CN=facet-webhook -out tls.csr
    printf 'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1\n' >tls.ext
    openssl x509 -req -in tls.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 30 -sha256 -extfile tls.ext -out tls.crt 2>/dev/null
  )
  setsid "${REPO}/bin/facet-webhook" --bind-address "127.0.0.1:${PORT}" \
    --tls-cert-file "${dir}/tls.crt" --tls-private-key-file "${dir}/tls.key" -v 2 \
    >"${RUN_DIR}/logs/facet-webhook.log" 2>&1 </dev/null &
  echo $! >"${RUN_DIR}/pids/facet-webhook.pid"
  for _ in $(seq 60); do
    curl -fsS --cacert "${dir}/ca.crt" "https://127.0.0.1:${PORT}/healthz" >/dev/null 2>&1 && break
    sleep 0.5
  done
  curl -fsS --cacert "${dir}/ca.crt" "https://127.0.0.1:${PORT}/healthz" >/dev/null ||
    { echo "facet-webhook does not answer; its log:" >&2; tail -20 "${RUN_DIR}/logs/facet-webhook.log" >&2; exit 1; }

  local ca url webhooks="" kind resource ops configs
  ca="$(base64 -w0 <"${dir}/ca.crt")"
  url="https://127.0.0.1:${PORT}/validate"
  # As the chart registers them: claims and templates on CREATE only (their
  # spec is immutable; an UPDATE is a metadata write such as the
  # scheduler's finalizer, which must not wait on the webhook).
  for kind in resourceclaims:CREATE:'object.spec.devices.?config.orValue([])' \
    resourceclaimtemplates:CREATE:'object.spec.spec.devices.?config.orValue([])' \
    deviceclasses:'CREATE, UPDATE':'object.spec.?config.orValue([])'; do
    resource="${kind%%:*}"; ops="${kind#*:}"; ops="${ops%%:*}"; configs="${kind#*:*:}"
    webhooks+="
- name: ${resource}.gpu.facet.dev
  admissionReviewVersions: [v1]
  sideEffects: None
  failurePolicy: Fail
  timeoutSeconds: 5
  matchPolicy: Equivalent
  clientConfig: {url: \"${url}\", caBundle: ${ca}}
  rules:
  - {apiGroups: [resource.k8s.io], apiVersions: [v1], operations: [${ops}], resources: [${resource}]}
  matchConditions:
  - name: hasFacetConfig
    expression: \"${configs}.exists(c, has(c.opaque) && c.opaque.driver == 'gpu.facet.dev')\""
  done
  kubectl apply -f - <<EOF
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata: {name: ${VWC}}
webhooks:${webhooks}
EOF
  local bad what
  if [[ ",${FACET_FEATURE_GATES}," == *",DRAConsumableCapacity=true,"* ]]; then
    bad="$(vgpu_claim bad-config '{apiVersion: gpu.facet.dev/v1alpha1, kind: VgpuConfig, corePolicy: force}')"
    what="A ResourceClaim whose VgpuConfig misspells coreUtilizationPolicy as corePolicy:"
  else
    # Without consumable capacity a vGPU share cannot be asked for (the
    # chart's policies refuse it first): a whole GPU with NVIDIA's
    # GpuConfig field "sharing", which Facet's GpuConfig does not have.
    bad="$(gpu_claim bad-config '{apiVersion: gpu.facet.dev/v1alpha1, kind: GpuConfig, sharing: {strategy: TimeSlicing}}')"
    what="A ResourceClaim whose GpuConfig carries NVIDIA's sharing field, which Facet's has not:"
  fi
  wait_refused "facet-webhook" "${bad}" 'admission webhook "resourceclaims.gpu.facet.dev" denied the request'

  echo
  echo "${what}"
  sed 's/^/  /' <<<"${bad}"
  echo "kubectl apply answers:"
  if kubectl apply -f - <<<"${bad}" >"${dir}/refusal.txt" 2>&1; then
    echo "  accepted: admission is not working" >&2
    kubectl delete -f - <<<"${bad}" >/dev/null 2>&1 || true
    exit 1
  fi
  sed 's/^/  /' "${dir}/refusal.txt"
}

case "${cmd}" in
  start) start ;;
  stop)
    stop
    if [[ -f "${RUN_DIR}/env.sh" ]]; then
      # shellcheck disable=SC1091
      source "${RUN_DIR}/env.sh"
      kubectl delete validatingwebhookconfiguration "${VWC}" --ignore-not-found --request-timeout=5s >/dev/null 2>&1 || true
    fi
    ;;
  *) echo "usage: $0 start|stop RUN_DIR" >&2; exit 2 ;;
esac
