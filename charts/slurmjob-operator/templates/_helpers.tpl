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

{{/* A ConfigMap of this chart (dict "root" . "file" "/configmap-<x>.yaml") without the
catalogs the operator re-reads (runtime-registry.yaml and gpu-series.yaml, a cluster's
<name>.runtime-registry.yaml and <name>.gpu-series.yaml): the part read once at start, which
the pod template's checksums cover. */}}
{{- define "slurmjob-operator.readAtStart" -}}
{{- $rendered := include (print .root.Template.BasePath .file) .root | fromYaml }}
{{- $kept := dict }}
{{- range $key, $value := ($rendered.data | default dict) }}
{{- if not (regexMatch "^([a-z0-9-]+[.])?(runtime-registry|gpu-series)[.]yaml$" $key) }}
{{- $_ := set $kept $key $value }}
{{- end }}
{{- end }}
{{- toJson $kept }}
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
# reads the live object before every write, and deletes a finished one whose
# ttlSecondsAfterFinished passed (conditioned on its uid and resourceVersion).
- apiGroups: ["slurmjob.io"]
  resources: ["slurmjobs"]
  verbs: ["get", "list", "watch", "patch", "delete"]
# kopf and the operator write status through the status subresource.
- apiGroups: ["slurmjob.io"]
  resources: ["slurmjobs/status"]
  verbs: ["patch"]
# Phase-change Events from the operator and kopf's own warnings (core/v1 Events only).
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- if .Values.kueue.enabled }}
# Kueue: one Workload per SlurmJob labelled with a LocalQueue, deleted with it (docs/kueue.md).
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# The Workload's ownerReference to its SlurmJob sets blockOwnerDeletion, which clusters that
# enforce owner-reference permissions (OpenShift: OwnerReferencesPermissionEnforcement) allow
# only to whoever may update the owner's finalizers.
- apiGroups: ["slurmjob.io"]
  resources: ["slurmjobs/finalizers"]
  verbs: ["update"]
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
env[].valueFrom.secretKeyRef: the named Secret of the SlurmJob's own namespace, read once per
submission (rbac.secrets). In the Role of each watched namespace, in a Role of each namespace
of secretNamespaces below, or (rbac.secretsClusterWide, an explicit choice) in the ClusterRole.
*/}}
{{- define "slurmjob-operator.secretsRule" -}}
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get"]
{{- end }}

{{/*
The namespaces a cluster-wide install grants `get secrets` in, as a JSON list: the tenants'
(catalogs.tenants: the chart cannot read catalogs.existingConfigMap) and rbac.secretNamespaces.
*/}}
{{- define "slurmjob-operator.secretNamespaces" -}}
{{- $out := list }}
{{- range .Values.catalogs.tenants }}
{{- range .namespaces }}
{{- $out = append $out . }}
{{- end }}
{{- end }}
{{- range .Values.rbac.secretNamespaces }}
{{- $out = append $out . }}
{{- end }}
{{- $out | uniq | sortAlpha | toJson }}
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
{{- $_ = required "image.repository is required: there is no public image. Build it from the repository's Dockerfile and push it to your registry (docker build -t REGISTRY/slurmjob-operator:VERSION . && docker push REGISTRY/slurmjob-operator:VERSION), then set image.repository=REGISTRY/slurmjob-operator" .Values.image.repository }}
{{- $_ = required "podSecurityContext.runAsUser is required: the uid of the Slurm job user that owns storage.root (id <job user> on a Slurm node), with podSecurityContext.runAsGroup its gid; the operator writes staging files the job reads as that user" .Values.podSecurityContext.runAsUser }}
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
{{- if and .Values.watchNamespaces (or .Values.rbac.secretsClusterWide .Values.rbac.secretNamespaces) }}
{{- fail "rbac.secretsClusterWide and rbac.secretNamespaces are for a cluster-wide install: with watchNamespaces the operator reads Secrets in those namespaces only" }}
{{- end }}
{{- if and (not .Values.serviceAccount.create) (not .Values.serviceAccount.name) }}
{{- fail "serviceAccount.name is required when serviceAccount.create is false" }}
{{- end }}
{{- end }}

{{/* The operator container's environment: the Deployment's and the helm test's. */}}
{{- define "slurmjob-operator.env" -}}
{{- $fullname := include "slurmjob-operator.fullname" . }}
{{- $templates := include "slurmjob-operator.templatesEnabled" . }}
{{- $ca := .Values.slurm.caBundle }}
{{- $logs := include "slurmjob-operator.logsServing" . }}
{{- $certMode := include "slurmjob-operator.certMode" . -}}
# kopf names its instance after POD_ID (else $USER, else the passwd entry, which a
# numeric uid without one lacks).
- name: POD_ID
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: SLURMJOB_KUEUE
  value: {{ .Values.kueue.enabled | quote }}
- name: SLURMJOB_LEADER_ELECTION
  value: {{ .Values.leaderElection.enabled | quote }}
{{- if .Values.leaderElection.enabled }}
- name: SLURMJOB_LEASE_NAME
  value: {{ .Values.leaderElection.leaseName | default $fullname | quote }}
- name: SLURMJOB_LEASE_NAMESPACE
  value: {{ .Release.Namespace | quote }}
# The pod's name: a restarted container takes its own Lease back at once.
- name: SLURMJOB_LEASE_IDENTITY
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: SLURMJOB_LEASE_DURATION
  value: {{ .Values.leaderElection.leaseDuration | quote }}
- name: SLURMJOB_LEASE_RENEW_DEADLINE
  value: {{ .Values.leaderElection.renewDeadline | quote }}
- name: SLURMJOB_LEASE_RETRY_PERIOD
  value: {{ .Values.leaderElection.retryPeriod | quote }}
{{- end }}
- name: SLURMJOB_CLUSTER_NAME
  value: {{ .Values.clusterName | quote }}
{{- if .Values.clusters }}
- name: SLURMJOB_CLUSTERS_FILE
  value: /etc/slurmjob/clusters/clusters.yaml
{{- end }}
- name: SLURMJOB_SLURM_REST_URL
  value: {{ .Values.slurm.restUrl | quote }}
- name: SLURMJOB_SLURM_REST_API_VERSION
  value: {{ .Values.slurm.apiVersion | quote }}
{{- with .Values.slurm.user }}
- name: SLURMJOB_SLURM_REST_USER
  value: {{ . | quote }}
{{- end }}
{{- if eq .Values.slurm.auth.mode "signingKey" }}
- name: SLURMJOB_SLURM_JWT_KEY_FILE
  value: /etc/slurmjob/auth/jwt.key
- name: SLURMJOB_SLURM_JWT_LIFESPAN
  value: {{ .Values.slurm.auth.jwtLifespan | quote }}
{{- else }}
- name: SLURMJOB_SLURM_JWT_FILE
  value: /etc/slurmjob/auth/token
{{- end }}
- name: SLURMJOB_SLURM_REST_TIMEOUT
  value: {{ .Values.slurm.timeout | quote }}
- name: SLURMJOB_SLURM_MESSAGE_TIMEOUT
  value: {{ .Values.slurm.messageTimeout | quote }}
- name: SLURMJOB_ABSENCE_MARGIN
  value: {{ .Values.absenceMargin | quote }}
{{- with .Values.slurm.partition }}
- name: SLURMJOB_SLURM_PARTITION
  value: {{ . | quote }}
{{- end }}
- name: SLURMJOB_SLURM_RUNTIME_PROFILE
  value: {{ .Values.slurm.runtimeProfile | quote }}
- name: SLURMJOB_SLURM_TLS_VERIFY
  value: {{ ternary "1" "0" .Values.slurm.tlsVerify | quote }}
{{- if or $ca.configMap.name $ca.secret.name }}
- name: SLURMJOB_SLURM_CA_BUNDLE
  value: /etc/slurmjob/ca/ca.crt
{{- end }}
{{- with .Values.slurm.jobPath }}
- name: SLURMJOB_SLURM_JOB_PATH
  value: {{ . | quote }}
{{- end }}
- name: SLURMJOB_STORAGE_ROOT
  value: {{ .Values.storage.root | quote }}
{{- with .Values.storage.clusterRoot }}
- name: SLURMJOB_SLURM_STORAGE_ROOT
  value: {{ . | quote }}
{{- end }}
{{- with .Values.storage.stagingOwner }}
- name: SLURMJOB_STAGING_OWNER
  value: {{ . | quote }}
{{- end }}
- name: SLURMJOB_RUNTIME_REGISTRY_FILE
  value: /etc/slurmjob/catalogs/runtime-registry.yaml
- name: SLURMJOB_GPU_SERIES_FILE
  value: /etc/slurmjob/catalogs/gpu-series.yaml
{{- if include "slurmjob-operator.tenancy" . }}
- name: SLURMJOB_TENANTS_FILE
  value: /etc/slurmjob/catalogs/tenants.yaml
{{- end }}
{{- if $templates }}
- name: SLURMJOB_TEMPLATES_DIR
  value: /etc/slurmjob/templates
{{- end }}
- name: SLURMJOB_POLL_INTERVAL
  value: {{ .Values.pollInterval | quote }}
- name: SLURMJOB_DELETE_TIMEOUT
  value: {{ .Values.deleteTimeout | quote }}
- name: SLURMJOB_MAX_TOTAL_TIME
  value: {{ .Values.walltime.maxTotalTime | quote }}
- name: SLURMJOB_PROBE_ATTEMPTS
  value: {{ .Values.probe.attempts | quote }}
- name: SLURMJOB_PROBE_CACHE_SECONDS
  value: {{ .Values.probe.cacheSeconds | int64 | quote }}
- name: SLURMJOB_PROBE_AVOID_SECONDS
  value: {{ .Values.probe.avoidSeconds | int64 | quote }}
- name: SLURMJOB_PROBE_CONFIGMAP
  value: {{ .Values.probe.configMap | quote }}
- name: SLURMJOB_PROBE_CAPACITY_BYTES
  value: {{ .Values.probe.capacityBytes | int64 | quote }}
- name: SLURMJOB_PROBE_FLOOR_BYTES
  value: {{ .Values.probe.floorBytes | int64 | quote }}
{{- with .Values.mpiPlugins }}
- name: SLURMJOB_MPI_PLUGINS
  value: {{ join "," . | quote }}
{{- end }}
{{- if .Values.archive.enabled }}
- name: SLURMJOB_ARCHIVE_ROOT
  value: {{ .Values.archive.root | quote }}
- name: SLURMJOB_ARCHIVE_RETENTION_DAYS
  value: {{ .Values.archive.retentionDays | int | quote }}
- name: SLURMJOB_ARCHIVE_MAX_BYTES
  value: {{ .Values.archive.maxBytes | int64 | quote }}
- name: SLURMJOB_ARCHIVE_FILE_MAX_BYTES
  value: {{ .Values.archive.fileMaxBytes | int64 | quote }}
{{- with .Values.archive.entryMaxBytes }}
- name: SLURMJOB_ARCHIVE_ENTRY_MAX_BYTES
  value: {{ . | int64 | quote }}
{{- end }}
{{- end }}
{{- with .Values.images }}
{{- if or .enabled .verifyArtifacts }}
{{- if .enabled }}
- name: SLURMJOB_IMAGES_ENABLED
  value: "true"
{{- end }}
{{- if .verifyArtifacts }}
- name: SLURMJOB_ARTIFACT_VERIFY_JOBS
  value: "true"
{{- end }}
- name: SLURMJOB_IMAGE_CACHE_ROOT
  value: {{ .cache.root | quote }}
{{- with .cache.slurmRoot }}
- name: SLURMJOB_SLURM_IMAGE_CACHE_ROOT
  value: {{ . | quote }}
{{- end }}
- name: SLURMJOB_IMAGE_CACHE_USER
  value: {{ required "images.cacheUser: the Slurm user import jobs run as (the only writer of the cache)" .cacheUser | quote }}
- name: SLURMJOB_IMAGE_CACHE_UID
  value: {{ required "images.cacheUid: the cache user's uid" .cacheUid | int | quote }}
- name: SLURMJOB_IMAGE_IMPORT_PARTITION
  value: {{ required "images.import.partition: the CPU partition import jobs run in" .import.partition | quote }}
{{- with .import.account }}
- name: SLURMJOB_IMAGE_IMPORT_ACCOUNT
  value: {{ . | quote }}
{{- end }}
- name: SLURMJOB_IMAGE_IMPORT_CPUS
  value: {{ .import.cpus | int | quote }}
- name: SLURMJOB_IMAGE_IMPORT_MEMORY_MB
  value: {{ .import.memoryMb | int | quote }}
- name: SLURMJOB_IMAGE_IMPORT_TIME_MINUTES
  value: {{ .import.timeMinutes | int | quote }}
- name: SLURMJOB_IMAGE_IMPORT_TMP
  value: {{ .import.tmp | quote }}
{{- with .import.caFile }}
- name: SLURMJOB_IMAGE_IMPORT_CA_FILE
  value: {{ . | quote }}
{{- end }}
- name: SLURMJOB_IMAGE_IMPORT_RETRIES
  value: {{ .import.retries | int | quote }}
- name: SLURMJOB_IMAGE_IMPORTS_PER_TENANT
  value: {{ .import.perTenant | int | quote }}
- name: SLURMJOB_IMAGE_IMPORTS_MAX
  value: {{ .import.max | int | quote }}
- name: SLURMJOB_IMAGE_TAG_REUSE_SECONDS
  value: {{ .tagReuseSeconds | int | quote }}
- name: SLURMJOB_IMAGE_CACHE_MAX_BYTES
  value: {{ .cache.maxBytes | int64 | quote }}
- name: SLURMJOB_IMAGE_CACHE_SWEEP_SECONDS
  value: {{ .cache.sweepSeconds | int | quote }}
- name: SLURMJOB_IMAGE_CACHE_CHECK_SECONDS
  value: {{ .cache.checkSeconds | int | quote }}
{{- with .cache.floorBytes }}
- name: SLURMJOB_IMAGE_CACHE_FLOOR_BYTES
  value: {{ . | int64 | quote }}
{{- end }}
{{- with .registries }}
- name: SLURMJOB_IMAGE_REGISTRIES
  value: {{ join "," . | quote }}
{{- end }}
{{- end }}
{{- end }}
{{- with .Values.ttlAfterFinished }}
{{- if not (kindIs "invalid" .default) }}
- name: SLURMJOB_TTL_AFTER_FINISHED_DEFAULT
  value: {{ .default | int | quote }}
{{- end }}
{{- if not (kindIs "invalid" .max) }}
- name: SLURMJOB_TTL_AFTER_FINISHED_MAX
  value: {{ .max | int | quote }}
{{- end }}
{{- end }}
- name: SLURMJOB_SUBMIT_CONCURRENCY
  value: {{ .Values.submitConcurrency | quote }}
- name: SLURMJOB_REFRESH_CONCURRENCY
  value: {{ .Values.refreshConcurrency | quote }}
- name: SLURMJOB_LOG_REFRESH
  value: {{ .Values.logRefresh | quote }}
- name: SLURMJOB_STATUS_TAIL_BYTES
  value: {{ .Values.statusTailBytes | quote }}
- name: SLURMJOB_WATCH_PAGE_SIZE
  value: {{ .Values.watchPageSize | quote }}
- name: SLURMJOB_WORKER_IDLE_TIMEOUT
  value: {{ .Values.workerIdleTimeout | quote }}
- name: SLURMJOB_MEMORY_TRIM_INTERVAL
  value: {{ .Values.memoryTrimInterval | quote }}
# Python's objects in the C allocator, so that the trim above gives them back; jemalloc's
# settings when the image preloads it (this chart's image does: Dockerfile), else unused.
- name: PYTHONMALLOC
  value: malloc
- name: MALLOC_CONF
  value: background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0
- name: SLURMJOB_METRICS_PORT
  value: {{ .Values.metrics.port | quote }}
- name: SLURMJOB_METRICS_ADDRESS
  value: {{ .Values.metrics.address | quote }}
- name: SLURMJOB_LISTENER_HEADER_TIMEOUT
  value: {{ .Values.listeners.headerTimeout | quote }}
- name: SLURMJOB_LISTENER_KEEPALIVE
  value: {{ .Values.listeners.keepalive | quote }}
- name: SLURMJOB_LISTENER_WRITE_TIMEOUT
  value: {{ .Values.listeners.writeTimeout | quote }}
- name: SLURMJOB_LISTENER_MAX_CONNECTIONS
  value: {{ .Values.listeners.maxConnections | quote }}
- name: SLURMJOB_LISTENER_MAX_PER_SOURCE
  value: {{ .Values.listeners.maxPerSource | quote }}
# The log API only where its APIService sends requests: 0 closes the port.
- name: SLURMJOB_LOGS_PORT
  value: {{ ternary .Values.logs.port 0 (not (empty $logs)) | quote }}
- name: SLURMJOB_LOGS_ADDRESS
  value: {{ .Values.logs.address | quote }}
- name: SLURMJOB_POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
{{- if $logs }}
- name: SLURMJOB_LOGS_SERVICE
  value: {{ include "slurmjob-operator.logsService" . | quote }}
{{- if eq $certMode "operator" }}
# Its own CA and certificate in this Secret, kept by the leader, the CA bundle
# put into this APIService.
- name: SLURMJOB_LOGS_CERT_SECRET
  value: {{ include "slurmjob-operator.certSecret" . | quote }}
- name: SLURMJOB_LOGS_APISERVICE
  value: v1alpha1.logs.slurmjob.io
{{- else }}
- name: SLURMJOB_LOGS_TLS_CERT_FILE
  value: /etc/slurmjob/logs-tls/tls.crt
- name: SLURMJOB_LOGS_TLS_KEY_FILE
  value: /etc/slurmjob/logs-tls/tls.key
{{- end }}
{{- end }}
# Nothing may be written outside /tmp and the storage root.
- name: PYTHONDONTWRITEBYTECODE
  value: "1"
{{- with .Values.extraEnv }}
{{- toYaml . | nindent 0 }}
{{- end }}
{{- end }}

{{/* The operator container's mounts, and the pod's volumes they name. */}}
{{- define "slurmjob-operator.volumeMounts" -}}
{{- $fullname := include "slurmjob-operator.fullname" . }}
{{- $templates := include "slurmjob-operator.templatesEnabled" . }}
{{- $ca := .Values.slurm.caBundle }}
{{- $logs := include "slurmjob-operator.logsServing" . }}
{{- $certMode := include "slurmjob-operator.certMode" . -}}
- name: tmp
  mountPath: /tmp
- name: storage
  mountPath: {{ .Values.storage.root }}
  {{- with .Values.storage.subPath }}
  subPath: {{ . }}
  {{- end }}
{{- if .Values.archive.enabled }}
- name: archive
  mountPath: {{ .Values.archive.root }}
  {{- with .Values.archive.subPath }}
  subPath: {{ . }}
  {{- end }}
{{- end }}
{{- if or .Values.images.enabled .Values.images.verifyArtifacts }}
- name: image-cache
  mountPath: {{ .Values.images.cache.root }}
  readOnly: true
  {{- with .Values.images.cache.subPath }}
  subPath: {{ . }}
  {{- end }}
{{- end }}
- name: slurm-auth
  mountPath: /etc/slurmjob/auth
  readOnly: true
- name: catalogs
  mountPath: /etc/slurmjob/catalogs
  readOnly: true
{{- if .Values.clusters }}
- name: clusters
  mountPath: /etc/slurmjob/clusters
  readOnly: true
{{- end }}
{{- if or $ca.configMap.name $ca.secret.name }}
- name: ca-bundle
  mountPath: /etc/slurmjob/ca
  readOnly: true
{{- end }}
{{- if $templates }}
- name: templates
  mountPath: /etc/slurmjob/templates
  readOnly: true
{{- end }}
{{- if and $logs (ne $certMode "operator") }}
- name: logs-tls
  mountPath: /etc/slurmjob/logs-tls
  readOnly: true
{{- end }}
{{- with .Values.extraVolumeMounts }}
{{- toYaml . | nindent 0 }}
{{- end }}
{{- end }}

{{- define "slurmjob-operator.volumes" -}}
{{- $fullname := include "slurmjob-operator.fullname" . }}
{{- $templates := include "slurmjob-operator.templatesEnabled" . }}
{{- $ca := .Values.slurm.caBundle }}
{{- $logs := include "slurmjob-operator.logsServing" . }}
{{- $certMode := include "slurmjob-operator.certMode" . -}}
- name: tmp
  emptyDir:
    sizeLimit: {{ .Values.tmpSizeLimit }}
- name: storage
  {{- if .Values.storage.existingClaim }}
  persistentVolumeClaim:
    claimName: {{ .Values.storage.existingClaim }}
  {{- else }}
  hostPath:
    path: {{ .Values.storage.hostPath.path }}
    type: {{ .Values.storage.hostPath.type }}
  {{- end }}
{{- if .Values.archive.enabled }}
- name: archive
  persistentVolumeClaim:
    claimName: {{ required "archive.existingClaim: the PersistentVolumeClaim of the log archive (a volume no compute node mounts)" .Values.archive.existingClaim }}
{{- end }}
{{- if or .Values.images.enabled .Values.images.verifyArtifacts }}
# Read-only: the operator reads what the import jobs recorded; only the cache user writes.
- name: image-cache
  {{- if .Values.images.cache.existingClaim }}
  persistentVolumeClaim:
    claimName: {{ .Values.images.cache.existingClaim }}
    readOnly: true
  {{- else }}
  hostPath:
    path: {{ required "images.cache.hostPath or images.cache.existingClaim: where the image cache is" .Values.images.cache.hostPath }}
    type: Directory
  {{- end }}
{{- end }}
# A Secret volume (not an env var): the kubelet updates the file when the Secret
# changes and the operator re-reads it, so a rotated token needs no restart. The files
# are root-owned; 0444 lets the non-root operator read them without an fsGroup (which
# would make the kubelet chown the whole shared storage volume).
- name: slurm-auth
  secret:
    secretName: {{ .Values.slurm.auth.existingSecret }}
    defaultMode: 0444
    items:
      - key: {{ include "slurmjob-operator.authKey" . }}
        path: {{ ternary "jwt.key" "token" (eq .Values.slurm.auth.mode "signingKey") }}
- name: catalogs
  configMap:
    name: {{ include "slurmjob-operator.catalogsConfigMap" . }}
    items:
      - key: runtime-registry.yaml
        path: runtime-registry.yaml
      - key: gpu-series.yaml
        path: gpu-series.yaml
      {{- if include "slurmjob-operator.tenancy" . }}
      - key: tenants.yaml
        path: tenants.yaml
      {{- end }}
{{- if .Values.clusters }}
# The clusters file and each further cluster's credentials, in one folder:
# /etc/slurmjob/clusters/clusters.yaml and /etc/slurmjob/clusters/<name>/<token|jwt.key>.
- name: clusters
  projected:
    defaultMode: 0444
    sources:
      - configMap:
          name: {{ $fullname }}-clusters
          items:
            - key: clusters.yaml
              path: clusters.yaml
      {{- range .Values.clusters }}
      {{- $name := .name }}
      {{- if .auth }}
      {{- $signing := eq (.auth.mode | default "tokenFile") "signingKey" }}
      - secret:
          name: {{ required "clusters[].auth.existingSecret is required with auth" .auth.existingSecret }}
          items:
            - key: {{ .auth.key | default (ternary "jwt_hs256.key" "token" $signing) }}
              path: {{ $name }}/{{ ternary "jwt.key" "token" $signing }}
      {{- end }}
      {{- $cab := .caBundle | default dict }}
      {{- $cabMap := $cab.configMap | default dict }}
      {{- $cabSecret := $cab.secret | default dict }}
      {{- if and $cabMap.name $cabSecret.name }}
      {{- fail (printf "clusters[%s].caBundle: set only one of configMap.name and secret.name" $name) }}
      {{- end }}
      {{- if $cabMap.name }}
      - configMap:
          name: {{ $cabMap.name }}
          items:
            - key: {{ $cabMap.key | default "ca.crt" }}
              path: {{ $name }}/ca.crt
      {{- else if $cabSecret.name }}
      - secret:
          name: {{ $cabSecret.name }}
          items:
            - key: {{ $cabSecret.key | default "ca.crt" }}
              path: {{ $name }}/ca.crt
      {{- end }}
      {{- $catalogs := .catalogs | default dict }}
      {{- if or $catalogs.runtimes $catalogs.gpuSeries (.templates | default dict).files }}
      - configMap:
          name: {{ $fullname }}-clusters
          items:
            {{- if $catalogs.runtimes }}
            - key: {{ $name }}.runtime-registry.yaml
              path: {{ $name }}/runtime-registry.yaml
            {{- end }}
            {{- if $catalogs.gpuSeries }}
            - key: {{ $name }}.gpu-series.yaml
              path: {{ $name }}/gpu-series.yaml
            {{- end }}
            {{- range $path, $_ := (.templates | default dict).files }}
            - key: {{ $name }}.templates.{{ $path | replace "/" "__" }}
              path: {{ $name }}/templates/{{ $path }}
            {{- end }}
      {{- end }}
      {{- end }}
{{- end }}
{{- if $ca.configMap.name }}
- name: ca-bundle
  configMap:
    name: {{ $ca.configMap.name }}
    items:
      - key: {{ $ca.configMap.key }}
        path: ca.crt
{{- else if $ca.secret.name }}
- name: ca-bundle
  secret:
    secretName: {{ $ca.secret.name }}
    defaultMode: 0444
    items:
      - key: {{ $ca.secret.key }}
        path: ca.crt
{{- end }}
{{- if .Values.templates.existingConfigMap }}
- name: templates
  configMap:
    name: {{ .Values.templates.existingConfigMap }}
    {{- with .Values.templates.items }}
    items:
      {{- toYaml . | nindent 6 }}
    {{- end }}
{{- else if .Values.templates.files }}
- name: templates
  configMap:
    name: {{ $fullname }}-templates
    items:
      {{- range $path, $_ := .Values.templates.files }}
      - key: {{ $path | replace "/" "__" }}
        path: {{ $path }}
      {{- end }}
{{- end }}
{{- if and $logs (ne $certMode "operator") }}
# The log API's certificate (cert-manager's or the admin's Secret): the kubelet
# updates the files when it is renewed, and the operator takes them for new
# connections.
- name: logs-tls
  secret:
    secretName: {{ include "slurmjob-operator.certSecret" . }}
    defaultMode: 0444
    items:
      - key: tls.crt
        path: tls.crt
      - key: tls.key
        path: tls.key
{{- end }}
{{- with .Values.extraVolumes }}
{{- toYaml . | nindent 0 }}
{{- end }}
{{- end }}
