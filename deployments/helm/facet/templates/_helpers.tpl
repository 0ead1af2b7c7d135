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
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{- define "facet.pluginServiceAccount" -}}
{{- .Values.kubeletPlugin.serviceAccount.name | default (printf "%s-kubelet-plugin" (include "facet.fullname" .)) }}
{{- end }}

{{- define "facet.webhookName" -}}
{{- printf "%s-webhook" (include "facet.fullname" .) }}
{{- end }}

{{/* The driver root, refusing "/" (see README.md). */}}
{{- define "facet.driverRoot" -}}
{{- $root := .Values.kubeletPlugin.driver.root | clean }}
{{- if eq $root "/" }}
{{- fail "kubeletPlugin.driver.root must not be \"/\": the plugin reads the driver's files at the host paths it writes into the CDI specs, so the driver root is mounted into its container at the same path, which cannot be done for the host's /. Use a driver installed under its own root, such as the GPU Operator's /run/nvidia/driver." }}
{{- end }}
{{- $root }}
{{- end }}

{{- define "facet.nvmlLibrary" -}}
{{- .Values.kubeletPlugin.driver.nvmlLibrary | default (printf "%s/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1" (include "facet.driverRoot" .)) }}
{{- end }}

{{/* <devRoot>/dev, the directory the plugin reads device nodes from. */}}
{{- define "facet.devDir" -}}
{{- printf "%s/dev" .Values.kubeletPlugin.driver.devRoot | clean }}
{{- end }}

{{/*
facet.groupAffinity: the pod affinity of node group .name: the common
affinity, with the group's rule ANDed into every required node selector term.
Group "default" matches nodes without the label or with the value "default".
*/}}
{{- define "facet.groupAffinity" -}}
{{- $root := .root }}
{{- $label := $root.Values.kubeletPlugin.nodeGroupLabel }}
{{- $affinity := deepCopy ($root.Values.kubeletPlugin.affinity | default dict) }}
{{- $na := $affinity.nodeAffinity | default dict }}
{{- $req := $na.requiredDuringSchedulingIgnoredDuringExecution | default dict }}
{{- $userTerms := $req.nodeSelectorTerms | default (list dict) }}
{{- $groupExprs := list (dict "key" $label "operator" "In" "values" (list .name)) }}
{{- if eq .name "default" }}
{{- $groupExprs = list (dict "key" $label "operator" "DoesNotExist") (dict "key" $label "operator" "In" "values" (list "default")) }}
{{- end }}
{{- $terms := list }}
{{- range $ut := $userTerms }}
{{- range $ge := $groupExprs }}
{{- $t := deepCopy $ut }}
{{- $_ := set $t "matchExpressions" (append ($t.matchExpressions | default list) $ge) }}
{{- $terms = append $terms $t }}
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
