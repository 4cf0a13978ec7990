{{/* Names and labels shared by every template. */}}

{{- define "slurmjob-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "slurmjob-operator.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "slurmjob-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "slurmjob-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "slurmjob-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "slurmjob-operator.labels" -}}
helm.sh/chart: {{ include "slurmjob-operator.chart" . }}
{{ include "slurmjob-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "slurmjob-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "slurmjob-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "slurmjob-operator.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* Whether the catalogs ConfigMap holds tenants.yaml ("true" or ""). */}}
{{- define "slurmjob-operator.tenancy" -}}
{{- if .Values.catalogs.existingConfigMap -}}
{{- if .Values.catalogs.existingConfigMapHasTenants }}true{{ end -}}
{{- else if .Values.catalogs.tenants -}}
true
{{- end -}}
{{- end }}

{{/* The catalogs ConfigMap: the user's, or the one this chart renders. */}}
{{- define "slurmjob-operator.catalogsConfigMap" -}}
{{- default (printf "%s-catalogs" (include "slurmjob-operator.fullname" .)) .Values.catalogs.existingConfigMap }}
{{- end }}

{{- define "slurmjob-operator.templatesEnabled" -}}
{{- if or .Values.templates.existingConfigMap .Values.templates.files }}true{{ end }}
{{- end }}

{{/* Whether the log API is served ("true" or ""): its APIService on and a port for it. */}}
{{- define "slurmjob-operator.logsServing" -}}
{{- if and .Values.apiService.enabled .Values.logs.port }}true{{ end }}
{{- end }}

{{/* The Service the APIService points at (a DNS-1035 label: 63 characters at most). */}}
{{- define "slurmjob-operator.logsService" -}}
{{- printf "%s-logs" (include "slurmjob-operator.fullname" . | trunc 58 | trimSuffix "-") }}
{{- end }}

{{/* Where the serving certificate comes from: operator (its own Secret, the default),
certManager, or secret (the admin's). */}}
{{- define "slurmjob-operator.certMode" -}}
{{- if .Values.certManager.enabled }}certManager{{ else if .Values.apiService.tls.secretName }}secret{{ else }}operator{{ end }}
{{- end }}

{{/* The Secret holding the serving certificate in each mode. */}}
{{- define "slurmjob-operator.certSecret" -}}
{{- $mode := include "slurmjob-operator.certMode" . }}
{{- if eq $mode "secret" }}
{{- .Values.apiService.tls.secretName }}
{{- else if eq $mode "certManager" }}
{{- printf "%s-logs-tls" (include "slurmjob-operator.fullname" .) }}
{{- else }}
{{- printf "%s-logs-serving-cert" (include "slurmjob-operator.fullname" .) }}
{{- end }}
{{- end }}

{{/* The key of the auth Secret. */}}
{{- define "slurmjob-operator.authKey" -}}
{{- if .Values.slurm.auth.key }}
{{- .Values.slurm.auth.key }}
{{- else if eq .Values.slurm.auth.mode "signingKey" }}
{{- "jwt_hs256.key" }}
{{- else }}
{{- "token" }}
{{- end }}
{{- end }}

{{/*
The RBAC rules, one list for the ClusterRole and every Role. Each rule is a call the operator
makes; see docs/helm.md. Never a wildcard (tests/unit/test_chart_files.py checks).
*/}}
{{- define "slurmjob-operator.rules" -}}
# kopf: watch SlurmJobs, patch its finalizer and progress annotations on them; the operator
# reads the live object before every write.
- apiGroups: ["slurmjob.io"]
  resources: ["slurmjobs"]
  verbs: ["get", "list", "watch", "patch"]
# kopf and the operator write status through the status subresource.
- apiGroups: ["slurmjob.io"]
  resources: ["slurmjobs/status"]
  verbs: ["patch"]
# Phase-change Events from the operator and kopf's own warnings (core/v1 Events only).
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- if .Values.rbac.secrets }}
# env[].valueFrom.secretKeyRef: the referenced Secret is read once per submission.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get"]
{{- end }}
{{- if .Values.kueue.enabled }}
# Kueue: one Workload per SlurmJob labelled with a LocalQueue, deleted with it (docs/kueue.md).
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads/status"]
  verbs: ["patch"]
# Whether a named LocalQueue exists.
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["localqueues"]
  verbs: ["get"]
{{- end }}
{{- end }}

{{/*
Kueue's cluster-scoped kinds the operator reads (kueue.enabled): in the ClusterRole, or in a
ClusterRole of their own with watchNamespaces (a Role cannot grant them).
*/}}
{{- define "slurmjob-operator.kueueClusterRules" -}}
# The value of the WorkloadPriorityClass a SlurmJob names (Kueue's webhook would set it), and
# where an admission's flavor places the job (its nodeLabels).
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloadpriorityclasses", "resourceflavors"]
  verbs: ["get"]
{{- end }}

{{/* Settings that cannot work together fail the render with the value named. */}}
{{- define "slurmjob-operator.validate" -}}
{{- $_ := required "slurm.restUrl is required (the base URL of slurmrestd)" .Values.slurm.restUrl }}
{{- $_ = required "slurm.auth.existingSecret is required (a Secret with the slurmrestd JWT or the jwt_key)" .Values.slurm.auth.existingSecret }}
{{- if and (eq .Values.slurm.auth.mode "signingKey") (not .Values.slurm.user) }}
{{- fail "slurm.user is required with slurm.auth.mode=signingKey (the user the minted tokens are for)" }}
{{- end }}
{{- if and .Values.storage.existingClaim .Values.storage.hostPath.path }}
{{- fail "storage: set only one of existingClaim and hostPath.path" }}
{{- end }}
{{- if not (or .Values.storage.existingClaim .Values.storage.hostPath.path) }}
{{- fail "storage: set storage.existingClaim or storage.hostPath.path (the shared storage root)" }}
{{- end }}
{{- if and .Values.slurm.caBundle.configMap.name .Values.slurm.caBundle.secret.name }}
{{- fail "slurm.caBundle: set only one of configMap.name and secret.name" }}
{{- end }}
{{- if and .Values.catalogs.existingConfigMap .Values.catalogs.tenants }}
{{- fail "catalogs.tenants is not read with catalogs.existingConfigMap: put tenants.yaml into that ConfigMap and set catalogs.existingConfigMapHasTenants" }}
{{- end }}
{{- if and .Values.catalogs.existingConfigMapHasTenants (not .Values.catalogs.existingConfigMap) }}
{{- fail "catalogs.existingConfigMapHasTenants needs catalogs.existingConfigMap (otherwise list the tenants in catalogs.tenants)" }}
{{- end }}
{{- if and .Values.templates.existingConfigMap .Values.templates.files }}
{{- fail "templates: set only one of existingConfigMap and files" }}
{{- end }}
{{- $le := .Values.leaderElection }}
{{- if and $le.enabled (not (and (lt (float64 $le.retryPeriod) (float64 $le.renewDeadline)) (lt (float64 $le.renewDeadline) (float64 $le.leaseDuration)))) }}
{{- fail "leaderElection: retryPeriod < renewDeadline < leaseDuration is required" }}
{{- end }}
{{- if .Values.logs.port }}
{{- if or (eq (int .Values.logs.port) (int .Values.health.port)) (eq (int .Values.logs.port) (int .Values.metrics.port)) }}
{{- fail "logs.port: the log endpoint needs a port of its own (not health.port or metrics.port)" }}
{{- end }}
{{- end }}
{{- if and .Values.certManager.enabled .Values.apiService.tls.secretName }}
{{- fail "certManager.enabled and apiService.tls.secretName: set only one (cert-manager makes the Secret itself)" }}
{{- end }}
{{- if and .Values.apiService.tls.secretName (not .Values.apiService.caBundle) }}
{{- fail "apiService.caBundle is required with apiService.tls.secretName (the PEM of the CA that signed that certificate)" }}
{{- end }}
{{- if and .Values.apiService.caBundle (not .Values.apiService.tls.secretName) }}
{{- fail "apiService.caBundle is read only with apiService.tls.secretName (the operator's own CA and cert-manager's are put into the APIService for you)" }}
{{- end }}
{{- if and (not .Values.serviceAccount.create) (not .Values.serviceAccount.name) }}
{{- fail "serviceAccount.name is required when serviceAccount.create is false" }}
{{- end }}
{{- end }}
