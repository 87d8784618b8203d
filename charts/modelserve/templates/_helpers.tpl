{{/* The release's full name: the release name, or "<release>-modelserve" when it lacks the chart name. */}}
{{- define "modelserve.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "modelserve.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "modelserve.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "modelserve.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "modelserve.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "modelserve.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The operator image: repository, then @digest or :tag (default: appVersion). */}}
{{- define "modelserve.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}
{{- end -}}

{{/* The sidecar image; each part falls back to the operator's. */}}
{{- define "modelserve.sidecarImage" -}}
{{- $repository := default .Values.image.repository .Values.sidecar.image.repository -}}
{{- $tag := default (default .Chart.AppVersion .Values.image.tag) .Values.sidecar.image.tag -}}
{{- printf "%s:%s" $repository $tag -}}
{{- end -}}

{{/* The operator's command line (always kopf standalone): liveness, scope (none: all namespaces), verbosity. */}}
{{- define "modelserve.operatorArgs" -}}
- --liveness=http://0.0.0.0:{{ .Values.operator.healthPort }}/healthz
{{- range .Values.operator.watchNamespaces }}
- --namespace={{ . }}
{{- end }}
{{- if eq .Values.operator.logLevel "debug" }}
- --verbose
{{- end }}
{{- end -}}

{{/*
What the operator does in a namespace it serves, verb by verb (no delete anywhere: the garbage
collector removes children through their owner references).
*/}}
{{- define "modelserve.namespacedRules" -}}
# Watch ModelServers (the operator's cache of them); never patch the spec.
- apiGroups: ["serving.modelserve.dev"]
  resources: ["modelservers"]
  verbs: ["get", "list", "watch"]
# Write phase, conditions and endpoint.
- apiGroups: ["serving.modelserve.dev"]
  resources: ["modelservers/status"]
  verbs: ["patch"]
# Children carry blockOwnerDeletion owner references; with the OwnerReferencesPermissionEnforcement
# admission plugin (e.g. OpenShift) setting one needs update on the owner's finalizers.
- apiGroups: ["serving.modelserve.dev"]
  resources: ["modelservers/finalizers"]
  verbs: ["update"]
# Server-side apply (patch; create when absent) of the children; watch them to repair drift at once;
# update puts a child back whole when another manager's edit left it where apply cannot merge.
# The replicas run as a Deployment, or as a LeaderWorkerSet (kubernetes-sigs/lws, installed apart)
# when one spans nodes; delete: a ModelServer moving between the two has its old one deleted (only
# one named after it and owned by it).
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "patch", "update", "delete"]
- apiGroups: ["leaderworkerset.x-k8s.io"]
  resources: ["leaderworkersets"]
  verbs: ["get", "list", "watch", "create", "patch", "update", "delete"]
- apiGroups: [""]
  resources: ["services", "persistentvolumeclaims", "configmaps"]
  verbs: ["get", "list", "watch", "create", "patch", "update"]
# spec.cache.prefetch: a Job per selected node that fetches the model into its node cache.
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["get", "list", "watch", "create", "patch", "update"]
# The generated API-key Secret: created once, never changed or deleted. Its own Secrets (by label)
# are listed and watched as metadata only, to re-create a deleted one at once; the operator asks
# for no Secret's data. (Creating Deployments already lets it mount any Secret of the namespace.)
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["list", "watch", "create"]
# Pods for status (Ready counts, InsufficientGPU, image pull and crash reasons), and patch for two
# annotations: pod-deletion-cost before a scale-down, so the pods serving least go first; the
# adapters list's hash when it changes, so the kubelet refreshes the mounted list at once.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch", "patch"]
# An Event on each status transition (and kopf's own warnings).
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- if .Values.inferencePools.enabled }}
# inferencePools: each namespace's InferencePool (read whole: status.parents, and one not the
# operator's is left alone) and the EndpointSlice of its picker Service (a Service, granted above);
# the garbage collector deletes them with the namespace's last ModelServer.
- apiGroups: ["inference.networking.k8s.io"]
  resources: ["inferencepools"]
  verbs: ["get", "list", "watch", "create", "patch", "update"]
- apiGroups: ["discovery.k8s.io"]
  resources: ["endpointslices"]
  verbs: ["get", "list", "watch", "create", "patch", "update"]
{{- end }}
{{- end -}}

{{/* The endpoint picker's Service each InferencePool leads to: inferencePools.picker.service, else the chart's gateway. */}}
{{- define "modelserve.pickerService" -}}
{{- if .Values.inferencePools.picker.service -}}
{{- .Values.inferencePools.picker.service -}}
{{- else if .Values.gateway.enabled -}}
{{- printf "%s/%s" .Release.Namespace (include "modelserve.gatewayName" .) -}}
{{- else -}}
{{- fail "inferencePools.enabled needs inferencePools.picker.service when gateway.enabled is false" -}}
{{- end -}}
{{- end -}}

{{- define "modelserve.gatewayName" -}}
{{- printf "%s-gateway" (include "modelserve.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "modelserve.gatewaySelectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: gateway
{{- end -}}

{{- define "modelserve.gatewayLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "modelserve.gatewaySelectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* The gateway's base URL, written to every ModelServer's status.gatewayEndpoint: https:// when
it serves TLS (gateway.tls.secretName), with the port when it is not the scheme's own. */}}
{{- define "modelserve.gatewayURL" -}}
{{- $scheme := ternary "https" "http" (include "modelserve.gatewayTLS" . | eq "true") -}}
{{- $default := ternary 443 80 (eq $scheme "https") -}}
{{- $port := "" -}}
{{- if ne (int .Values.gateway.service.port) $default }}{{ $port = printf ":%d" (int .Values.gateway.service.port) }}{{ end -}}
{{- printf "%s://%s.%s.svc.%s%s/v1" $scheme (include "modelserve.gatewayName" .) .Release.Namespace .Values.operator.clusterDomain $port -}}
{{- end -}}

{{/* "true" when the gateway serves HTTPS: a TLS Secret is named. */}}
{{- define "modelserve.gatewayTLS" -}}
{{- if (.Values.gateway.tls | default dict).secretName }}true{{ else }}false{{ end -}}
{{- end -}}

{{/* The gateway's port name (and its Service's, its probes' scheme in upper case). */}}
{{- define "modelserve.gatewayPort" -}}
{{- ternary "https" "http" (include "modelserve.gatewayTLS" . | eq "true") -}}
{{- end -}}

{{/* What the gateway reads, in a namespace it serves: ModelServers and their pods; nothing else. */}}
{{- define "modelserve.gatewayRules" -}}
- apiGroups: ["serving.modelserve.dev"]
  resources: ["modelservers"]
  verbs: ["list", "watch"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch"]
{{- end -}}

{{- define "modelserve.nodeCacheName" -}}
{{- printf "%s-nodecache" (include "modelserve.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "modelserve.nodeCacheSelectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: nodecache
{{- end -}}

{{- define "modelserve.nodeCacheLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "modelserve.nodeCacheSelectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* The node agents' Service, which every model pod's fetch asks (MODELSERVE_NODE_CACHE_URL). */}}
{{- define "modelserve.nodeCacheURL" -}}
{{- printf "http://%s.%s.svc.%s:%d" (include "modelserve.nodeCacheName" .) .Release.Namespace .Values.operator.clusterDomain (int .Values.nodeCache.port) -}}
{{- end -}}

{{/* The operator's headless metrics Service and its ServiceMonitor (serviceMonitor.enabled): the job of its targets. */}}
{{- define "modelserve.operatorMetricsName" -}}
{{- printf "%s-metrics" (include "modelserve.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
