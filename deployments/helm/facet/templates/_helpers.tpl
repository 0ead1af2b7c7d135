{{/* Names, labels and the plugin's computed paths. */}}

{{- define "facet.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "facet.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "facet.selectorLabels" -}}
app.kubernetes.io/name: {{ include "facet.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "facet.labels" -}}
{{ include "facet.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: facet
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "facet.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}
{{- end }}

{{/* HAMi-core's image: by digest when one is set (docs/operations.md,
"Pinning HAMi-core"). */}}
{{- define "facet.hamiCoreImage" -}}
{{- $i := .Values.kubeletPlugin.hamiCore.image -}}
{{- if $i.digest -}}
{{ $i.repository }}@{{ $i.digest }}
{{- else -}}
{{ $i.repository }}:{{ $i.tag }}
{{- end }}
{{- end }}

{{/*
facet.restrictedSecurityContext: a container's security context as Pod
Security's "restricted" profile asks, but for the user, .user: no privilege
escalation, no capability, the runtime's seccomp profile, a read-only root
filesystem. .user is 0 only where a root-owned host directory is written
(each caller says why); the image's own default user is 65532.
*/}}
{{- define "facet.restrictedSecurityContext" -}}
allowPrivilegeEscalation: false
capabilities:
  drop: [ALL]
readOnlyRootFilesystem: true
seccompProfile:
  type: RuntimeDefault
runAsUser: {{ .user }}
runAsGroup: {{ .user }}
runAsNonRoot: {{ ne (int .user) 0 }}
{{- end }}

{{- define "facet.pluginServiceAccount" -}}
{{- .Values.kubeletPlugin.serviceAccount.name | default (printf "%s-kubelet-plugin" (include "facet.fullname" .)) }}
{{- end }}

{{- define "facet.webhookName" -}}
{{- printf "%s-webhook" (include "facet.fullname" .) }}
{{- end }}

{{/* The host's driver root, clean. */}}
{{- define "facet.driverRoot" -}}
{{- .Values.kubeletPlugin.driver.root | clean }}
{{- end }}

{{/*
Where the plugin's container mounts the driver root (--container-driver-root):
a directory of its own, since the host's / cannot be mounted at /.
*/}}
{{- define "facet.containerDriverRoot" -}}
/driver-root
{{- end }}

{{/*
libnvidia-ml.so.1 as the plugin's container sees it: the host path of
driver.nvmlLibrary moved under the container's driver root; empty lets the
plugin find it there.
*/}}
{{- define "facet.nvmlLibrary" -}}
{{- with .Values.kubeletPlugin.driver.nvmlLibrary }}
{{- $lib := . | clean }}
{{- $root := include "facet.driverRoot" $ }}
{{- $prefix := ternary "/" (printf "%s/" $root) (eq $root "/") }}
{{- if not (hasPrefix $prefix $lib) }}
{{- fail (printf "kubeletPlugin.driver.nvmlLibrary %s is not under kubeletPlugin.driver.root %s: the plugin reads the driver's files only through its mount of the driver root" $lib $root) }}
{{- end }}
{{- printf "%s/%s" (include "facet.containerDriverRoot" $) (trimPrefix $prefix $lib) }}
{{- end }}
{{- end }}

{{/*
The host path of nvidia-cdi-hook the specs name: driver.nvidiaCDIHookPath, or
the installed copy, or the NVIDIA Container Toolkit package's.
*/}}
{{- define "facet.cdiHookPath" -}}
{{- $p := .Values.kubeletPlugin }}
{{- $installed := printf "%s/nvidia-cdi-hook" ($p.nvidiaCDIHook.hostDir | clean) }}
{{- $path := $p.driver.nvidiaCDIHookPath | default (ternary $installed "/usr/bin/nvidia-cdi-hook" $p.nvidiaCDIHook.install) | clean }}
{{- if and $p.nvidiaCDIHook.install (ne $path $installed) }}
{{- fail (printf "kubeletPlugin.driver.nvidiaCDIHookPath is %s, but kubeletPlugin.nvidiaCDIHook.install puts Facet's nvidia-cdi-hook at %s: leave the path empty to use the installed one, or set nvidiaCDIHook.install=false to use the node's own" $path $installed) }}
{{- end }}
{{- $path }}
{{- end }}

{{/*
Where the plugin's container mounts the host directory of nvidia-cdi-hook,
to check at start that the hook runs: a directory of its own, since the
host's may be /usr/bin.
*/}}
{{- define "facet.containerCDIHookDir" -}}
/host-nvidia-cdi-hook
{{- end }}

{{/* <devRoot>/dev, the directory the plugin reads device nodes from. */}}
{{- define "facet.devDir" -}}
{{- printf "%s/dev" .Values.kubeletPlugin.driver.devRoot | clean }}
{{- end }}

{{/*
facet.groupAffinity: the pod affinity of node group .name (values .group):
the common affinity's required node selector terms, each ANDed with one of
the GPU node terms (the group's gpuNodeSelectorTerms when it has the key,
else the common ones; none: no GPU rule) and with the group's rule. Group
"default" matches nodes without the label or with the value "default".
*/}}
{{- define "facet.groupAffinity" -}}
{{- $root := .root }}
{{- $p := $root.Values.kubeletPlugin }}
{{- $label := $p.nodeGroupLabel }}
{{- $affinity := deepCopy ($p.affinity | default dict) }}
{{- $na := $affinity.nodeAffinity | default dict }}
{{- $req := $na.requiredDuringSchedulingIgnoredDuringExecution | default dict }}
{{- $userTerms := $req.nodeSelectorTerms | default (list dict) }}
{{- $gpuTerms := $p.gpuNodeSelectorTerms }}
{{- if hasKey .group "gpuNodeSelectorTerms" }}
{{- $gpuTerms = .group.gpuNodeSelectorTerms }}
{{- end }}
{{- $gpuTerms = $gpuTerms | default (list dict) }}
{{- $groupExprs := list (dict "key" $label "operator" "In" "values" (list .name)) }}
{{- if eq .name "default" }}
{{- $groupExprs = list (dict "key" $label "operator" "DoesNotExist") (dict "key" $label "operator" "In" "values" (list "default")) }}
{{- end }}
{{- $terms := list }}
{{- range $ut := $userTerms }}
{{- range $gt := $gpuTerms }}
{{- range $ge := $groupExprs }}
{{- $t := deepCopy $ut }}
{{- $_ := set $t "matchExpressions" (concat ($ut.matchExpressions | default list) ($gt.matchExpressions | default list) (list $ge)) }}
{{- with concat ($ut.matchFields | default list) ($gt.matchFields | default list) }}
{{- $_ := set $t "matchFields" . }}
{{- end }}
{{- $terms = append $terms $t }}
{{- end }}
{{- end }}
{{- end }}
{{- $_ := set $req "nodeSelectorTerms" $terms }}
{{- $_ := set $na "requiredDuringSchedulingIgnoredDuringExecution" $req }}
{{- $_ := set $affinity "nodeAffinity" $na }}
{{- toYaml $affinity }}
{{- end }}

{{/* The pod mutator's extended resource table, as the webhook reads it. */}}
{{- define "facet.extendedResourceMap" -}}
{{- toYaml .Values.admission.webhook.mutatePods.extendedResourceMap }}
{{- end }}

{{/*
facet.extendedResourceMatch: a CEL predicate on a resource name k that is
true for every name the table maps, so that the pod webhook's
matchCondition sends exactly the pods the webhook may rewrite.
*/}}
{{- define "facet.extendedResourceMatch" -}}
{{- $t := .Values.admission.webhook.mutatePods.extendedResourceMap }}
{{- $names := list }}
{{- $prefixes := list }}
{{- range $t.devices }}
{{- if hasSuffix "*" .resource }}
{{- $prefixes = append $prefixes (trimSuffix "*" .resource) }}
{{- else }}
{{- $names = append $names .resource }}
{{- end }}
{{- end }}
{{- range $v := $t.vgpus }}
{{- range $f := list "count" "memory" "cores" "memoryPercentage" }}
{{- with index $v $f }}
{{- $names = append $names . }}
{{- end }}
{{- end }}
{{- end }}
{{- $terms := list }}
{{- if $names }}
{{- $quoted := list }}
{{- range $names | uniq | sortAlpha }}
{{- $quoted = append $quoted (printf "'%s'" .) }}
{{- end }}
{{- $terms = append $terms (printf "k in [%s]" (join ", " $quoted)) }}
{{- end }}
{{- range $prefixes | uniq | sortAlpha }}
{{- $terms = append $terms (printf "k.startsWith('%s')" .) }}
{{- end }}
{{- if $terms }}{{ join " || " $terms }}{{ else }}false{{ end }}
{{- end }}

{{/*
facet.webhookTLSMode: admission.webhook.tls.mode with auto resolved, once
per render. auto keeps the mode the release already uses, recorded on its
ValidatingWebhookConfiguration (annotation gpu.facet.dev/webhook-tls-mode;
a configuration of an earlier chart without it: certManager where it has
cert-manager's inject-ca-from annotation, else selfSigned), so that
cert-manager appearing or going never switches a release by itself; a
release without one (an install, or `helm template`, which looks nothing
up) gets certManager where the cluster serves cert-manager.io/v1, else
selfSigned.
*/}}
{{- define "facet.webhookTLSMode" -}}
{{- $tls := .Values.admission.webhook.tls }}
{{- if not (hasKey $tls "resolvedMode") }}
{{- $mode := $tls.mode }}
{{- if eq $mode "auto" }}
{{- $name := include "facet.webhookName" . }}
{{- $vwc := lookup "admissionregistration.k8s.io/v1" "ValidatingWebhookConfiguration" "" $name }}
{{- $recorded := "" }}
{{- if $vwc }}
{{- $ann := $vwc.metadata.annotations | default dict }}
{{- $recorded = index $ann "gpu.facet.dev/webhook-tls-mode" | default (ternary "certManager" "selfSigned" (hasKey $ann "cert-manager.io/inject-ca-from")) }}
{{- end }}
{{- if has $recorded (list "certManager" "selfSigned") }}
{{- $mode = $recorded }}
{{- if and (eq $mode "certManager") (not (.Capabilities.APIVersions.Has "cert-manager.io/v1")) }}
{{- fail (printf "admission.webhook.tls.mode=auto: this release's webhook certificate comes from cert-manager (ValidatingWebhookConfiguration %s, annotation gpu.facet.dev/webhook-tls-mode), but the cluster no longer serves cert-manager.io/v1. auto does not switch a release's mode by itself: set admission.webhook.tls.mode=selfSigned (or secret) to switch, or reinstall cert-manager" $name) }}
{{- end }}
{{- else }}
{{- $mode = ternary "certManager" "selfSigned" (.Capabilities.APIVersions.Has "cert-manager.io/v1") }}
{{- end }}
{{- end }}
{{- $_ := set $tls "resolvedMode" $mode }}
{{- end }}
{{- $tls.resolvedMode }}
{{- end }}

{{/*
facet.webhookSelfSignedTLS: the selfSigned mode's CA bundle, serving
certificate and key, base64 PEM, and the serving certificate's notAfter
(RFC 3339, UTC), in a dict (ca, cert, key, notAfter); made once per render
and kept in the values, since the webhook's and the pod mutator's
configurations both carry the CA.
The Secret a previous release made is kept while its annotation
gpu.facet.dev/not-after is more than selfSigned.renewBeforeDays away. Else
(fewer days left, or a Secret of an earlier chart without the annotation,
or none) a new CA and certificate are made, valid validityDays (at most a
year). Helm cannot parse a certificate, so the chart records notAfter when
it makes one: the time before genCA plus validityDays, seconds cut, never
later than the certificate's own. On a renewal the bundle keeps the
previous CA after the new one: the webhook serves the old certificate
until the kubelet refreshes its Secret volume (a minute or so), and the API
server trusts both meanwhile; the renewal after drops it.
*/}}
{{- define "facet.webhookSelfSignedTLS" -}}
{{- $tls := .Values.admission.webhook.tls }}
{{- if not (hasKey $tls "generated") }}
{{- $name := include "facet.webhookName" . }}
{{- $days := int $tls.selfSigned.validityDays }}
{{- $renewBefore := int $tls.selfSigned.renewBeforeDays }}
{{- if ge $renewBefore $days }}
{{- fail (printf "admission.webhook.tls.selfSigned.renewBeforeDays (%d) must be less than validityDays (%d): every upgrade would renew the certificate" $renewBefore $days) }}
{{- end }}
{{- $old := lookup "v1" "Secret" .Release.Namespace (printf "%s-tls" $name) }}
{{- $data := dict }}
{{- $ann := dict }}
{{- if $old }}
{{- $data = $old.data | default dict }}
{{- $ann = $old.metadata.annotations | default dict }}
{{- end }}
{{- $notAfter := index $ann "gpu.facet.dev/not-after" | default "" }}
{{- $keep := false }}
{{- if and (index $data "ca.crt") (index $data "tls.crt") (index $data "tls.key") $notAfter }}
{{- $t := toDate "2006-01-02T15:04:05Z07:00" $notAfter }}
{{- $keep = gt $t.Unix (add (now).Unix (mul $renewBefore 86400)) }}
{{- end }}
{{- if $keep }}
{{- $_ := set $tls "generated" (dict "ca" (index $data "ca.crt") "cert" (index $data "tls.crt") "key" (index $data "tls.key") "notAfter" $notAfter) }}
{{- else }}
{{- $start := now }}
{{- $ca := genCA (printf "%s-ca" $name) $days }}
{{- $svc := printf "%s.%s.svc" $name .Release.Namespace }}
{{- $cert := genSignedCert $svc nil (list $svc (printf "%s.cluster.local" $svc)) $days $ca }}
{{- $bundle := $ca.Cert }}
{{- with index $data "ca.crt" }}
{{- with regexFind "(?s)-----BEGIN CERTIFICATE-----.*?-----END CERTIFICATE-----" (b64dec .) }}
{{- $bundle = printf "%s\n%s\n" (trimSuffix "\n" $ca.Cert) . }}
{{- end }}
{{- end }}
{{- $end := dateModify (printf "+%dh" (mul $days 24)) $start }}
{{- $_ := set $tls "generated" (dict "ca" ($bundle | b64enc) "cert" ($cert.Cert | b64enc) "key" ($cert.Key | b64enc) "notAfter" ($end.UTC.Format "2006-01-02T15:04:05Z")) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
facet.webhookNamespaceSelector: a webhook's namespaceSelector, from a dict
of exclude (namespace names), selector (matchLabels, matchExpressions) and
namespace (the release's, always excluded: the webhook's own pods and the
chart's objects there never wait on it). kubernetes.io/metadata.name is set
by the API server on every namespace and cannot be changed, so the
exclusion cannot be undone by relabelling.
*/}}
{{- define "facet.webhookNamespaceSelector" -}}
{{- with .selector.matchLabels }}
matchLabels:
  {{- toYaml . | nindent 2 }}
{{- end }}
matchExpressions:
- key: kubernetes.io/metadata.name
  operator: NotIn
  values:
  {{- range (append .exclude .namespace) | uniq }}
  - {{ . }}
  {{- end }}
{{- with .selector.matchExpressions }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
facet.webhookNotClaimController: the matchCondition that skips the claims
the resourceclaim controller makes from a pod's ResourceClaimTemplate
(admission.webhook.resourceClaimControllerUsers). request.userInfo is set
by the API server from the request's credentials, so no field of a
hand-written claim (the resource.kubernetes.io/pod-claim-name annotation,
an ownerReference to a pod) can make it skip the webhook. Empty when the
list is.
*/}}
{{- define "facet.webhookNotClaimController" -}}
{{- with .Values.admission.webhook.resourceClaimControllerUsers }}
- name: notByResourceClaimController
  expression: >-
    !(request.userInfo.username in {{ toJson . }})
{{- end }}
{{- end }}

{{/*
facet.imexPodTemplate: the IMEX daemons' pod template (a PodTemplateSpec),
from which facet-controller makes each ComputeDomain's DaemonSet, adding
the domain's nodeSelector and facet-imex's domain arguments
(pkg/cluster/computedomain DaemonSet). The driver root is mounted as
facet-mps mounts it (mps.yaml): at /driver-root where it is the host's /,
else the host's / at /host (--host-root), the driver root under it.
*/}}
{{- define "facet.imexPodTemplate" -}}
{{- $p := .Values.kubeletPlugin }}
{{- $i := .Values.computeDomains.imex }}
{{- $root := include "facet.driverRoot" . }}
{{- $ctrRoot := include "facet.containerDriverRoot" . }}
{{- $hostRoot := "" }}
{{- if ne $root "/" }}
{{- $hostRoot = "/host" }}
{{- $ctrRoot = printf "%s%s" $hostRoot $root }}
{{- end }}
{{- $state := "/run/facet-imex" }}
{{- /* The plugin's tolerations, every node group's too: a daemon runs
where the plugin prepared a channel. */}}
{{- $tolerations := $p.tolerations | default list }}
{{- range $name, $g := $p.nodeGroups }}
{{- if $g }}
{{- range $g.tolerations }}
{{- if not (has . $tolerations) }}
{{- $tolerations = append $tolerations . }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- $tolerations = concat $tolerations ($i.tolerations | default list) }}
metadata:
  labels:
    {{- include "facet.selectorLabels" . | nindent 4 }}
    app.kubernetes.io/component: imex
spec:
  serviceAccountName: {{ include "facet.fullname" . }}-imex
  # The peer list is the nodes' InternalIPs, where nvidia-imex listens
  # (port 50000): the daemon is in the host's network.
  hostNetwork: true
  {{- with $i.priorityClassName }}
  priorityClassName: {{ . }}
  {{- end }}
  {{- with .Values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  terminationGracePeriodSeconds: 30
  containers:
  - name: imex
    image: {{ include "facet.image" . }}
    imagePullPolicy: {{ .Values.image.pullPolicy }}
    command: [facet-imex]
    args:
    - --driver-root={{ $ctrRoot }}
    {{- with $hostRoot }}
    - --host-root={{ . }}
    {{- end }}
    - --state-dir={{ $state }}
    {{- if $i.simulate }}
    - --simulate
    {{- end }}
    - -v={{ $i.logVerbosity }}
    env:
    - name: NODE_NAME
      valueFrom:
        fieldRef: {fieldPath: spec.nodeName}
    {{- with $i.extraEnv }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
    securityContext:
      # nvidia-imex opens the driver's devices and runs chrooted into the
      # driver root.
      privileged: true
      runAsUser: 0
      runAsGroup: 0
    readinessProbe:
      exec: {command: [facet-imex, probe, "--state-dir={{ $state }}"]}
      periodSeconds: 5
      timeoutSeconds: 10
      failureThreshold: 1
    {{- with $i.resources }}
    resources:
      {{- toYaml . | nindent 6 }}
    {{- end }}
    volumeMounts:
    - name: state
      mountPath: {{ $state }}
    - name: driver-root
      mountPath: {{ $hostRoot | default $ctrRoot }}
      readOnly: true
      mountPropagation: HostToContainer
  volumes:
  - name: state
    emptyDir: {}
  - name: driver-root
    hostPath:
      path: {{ ternary $root "/" (eq $hostRoot "") }}
      type: Directory
{{- end }}
