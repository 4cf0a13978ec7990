{{/*
The admission policy's rules (templates/admission.yaml) as JSON: the map
`slurmjob-operator admission-params` prints from the operator's own reading of the same tenants
and settings (operator/slurmjob_operator/site/admission.py says what each key holds; a unit test
renders both and compares them). admission.params, when given, is that map as the CLI printed
it: for tenants the chart cannot read (catalogs.existingConfigMap).
*/}}
{{- define "slurmjob-operator.admissionParams" -}}
{{- if .Values.admission.params }}
{{- toJson .Values.admission.params }}
{{- else }}
{{- $p := dict }}
{{- $tenants := .Values.catalogs.tenants | default list }}
{{- $clusters := list .Values.clusterName }}
{{- range .Values.clusters }}{{ $clusters = append $clusters .name }}{{ end }}
{{- $images := .Values.images }}
{{- $_ := set $p "site/tenancy" (ternary "true" "false" (not (empty $tenants))) }}
{{- $_ = set $p "site/clusters" (join ", " $clusters) }}
{{- $_ = set $p "site/maxTotal" (include "slurmjob-operator.minutes" .Values.walltime.maxTotalTime) }}
{{- $_ = set $p "site/images" (ternary "true" "false" (eq (toString $images.enabled) "true")) }}
{{- $_ = set $p "site/registries" (join ", " (ternary ($images.registries | default list) list (or (eq (toString $images.enabled) "true") (eq (toString $images.verifyArtifacts) "true")))) }}
{{- $_ = set $p "site/mpi" (join ", " (.Values.mpiPlugins | default list)) }}
{{- $keys := list (list "accounts" "accounts") (list "partitions" "partitions") (list "qos" "qos") (list "mounts" "mountSources") (list "maxTime" "maxTimeLimit") (list "maxTotal" "maxTotalTime") }}
{{- range $t := $tenants }}
{{- $name := $t.name }}
{{- $at := printf "tenant/%s/" $name }}
{{- range $t.namespaces }}{{ $_ := set $p (printf "namespace/%s" .) $name }}{{ end }}
{{- $_ := set $p (print $at "clusters") (join ", " (keys ($t.clusters | default dict) | sortAlpha)) }}
{{- $_ = set $p (print $at "default") ($t.defaultCluster | default "" | toString) }}
{{- $_ = set $p (print $at "queue") (ternary "true" "false" (eq (toString $t.requireQueue) "true")) }}
{{- $_ = set $p (print $at "images") (join ", " ($t.imageRegistries | default list)) }}
{{- $others := list }}
{{- range $o := $tenants }}
{{- if ne $o.name $name }}
{{- range ($o.mountSources | default list) }}{{ $others = append $others (include "slurmjob-operator.sourcePath" .) }}{{ end }}
{{- range $c, $s := ($o.clusters | default dict) }}
{{- range (($s | default dict).mountSources | default list) }}{{ $others = append $others (include "slurmjob-operator.sourcePath" .) }}{{ end }}
{{- end }}
{{- end }}
{{- end }}
{{- $_ = set $p (print $at "others") (join ", " ($others | uniq | sortAlpha)) }}
{{- range $keys }}
{{- $_ := set $p (print $at (index . 0)) (include "slurmjob-operator.admissionLimit" (list (index . 1) (get $t (index . 1)))) }}
{{- end }}
{{- range $c, $s := ($t.clusters | default dict) }}
{{- range $keys }}
{{- if hasKey ($s | default dict) (index . 1) }}
{{- $_ := set $p (printf "tenant/%s@%s/%s" $name $c (index . 0)) (include "slurmjob-operator.admissionLimit" (list (index . 1) (get $s (index . 1)))) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- toJson $p }}
{{- end }}
{{- end }}

{{/* One limit of a tenant or a cluster section, (list key value), as the map holds it. */}}
{{- define "slurmjob-operator.admissionLimit" -}}
{{- $key := index . 0 }}{{- $value := index . 1 }}
{{- if or (kindIs "invalid" $value) (eq (toString $value) "") }}
{{- else if or (eq $key "maxTimeLimit") (eq $key "maxTotalTime") }}
{{- include "slurmjob-operator.minutes" $value }}
{{- else if eq $key "mountSources" }}
{{- $out := list }}
{{- range $value }}{{ $out = append $out (include "slurmjob-operator.sourcePath" .) }}{{ end }}
{{- join ", " $out }}
{{- else }}
{{- join ", " $value }}
{{- end }}
{{- end }}

{{/* Minutes of a duration as the operator reads one (90, "90m", "4h", "1d2h30m"). */}}
{{- define "slurmjob-operator.minutes" -}}
{{- $v := toString . | trim }}
{{- if regexMatch "^[0-9]+$" $v }}
{{- atoi $v }}
{{- else }}
{{- $d := regexFind "[0-9]+d" $v | trimSuffix "d" | default "0" | atoi }}
{{- $h := regexFind "[0-9]+h" $v | trimSuffix "h" | default "0" | atoi }}
{{- $m := regexFind "[0-9]+m" $v | trimSuffix "m" | default "0" | atoi }}
{{- add (mul $d 1440) (mul $h 60) $m }}
{{- end }}
{{- end }}

{{/* A mount source as the operator normalises one (`./d//x/` is `d/x`). */}}
{{- define "slurmjob-operator.sourcePath" -}}
{{- $parts := list }}
{{- range splitList "/" (toString .) }}{{ if and . (ne . ".") }}{{ $parts = append $parts . }}{{ end }}{{ end }}
{{- join "/" $parts }}
{{- end }}

{{/* The policies' CEL literals: whether namespaces of no tenant are refused (every watched
namespace is the release's own), and the operator's user name. */}}
{{- define "slurmjob-operator.admissionRefuseUnclaimed" -}}
{{- ternary "true" "false" (or (not (empty .Values.watchNamespaces)) .Values.admission.refuseUnclaimedNamespaces) }}
{{- end }}
{{- define "slurmjob-operator.admissionOperator" -}}
{{- printf "'system:serviceaccount:%s:%s'" .Release.Namespace (include "slurmjob-operator.serviceAccountName" .) }}
{{- end }}

{{/* What the admission values cannot be rendered with. */}}
{{- define "slurmjob-operator.validateAdmission" -}}
{{- if .Values.admission.enabled }}
{{- if and .Values.catalogs.existingConfigMapHasTenants (not .Values.admission.params) }}
{{- fail "admission.params is needed with catalogs.existingConfigMapHasTenants: the chart cannot read that ConfigMap's tenants. Print them with `slurmjob-operator admission-params` (docs/helm.md, \"Admission policies\") and pass its output as a values file, or set admission.enabled=false" }}
{{- end }}
{{- if and .Values.admission.params .Values.catalogs.tenants }}
{{- fail "admission.params is for tenants the chart cannot read (catalogs.existingConfigMap): with catalogs.tenants the chart renders them itself; leave admission.params empty" }}
{{- end }}
{{- $size := len (include "slurmjob-operator.admissionParams" .) }}
{{- if gt $size 100000 }}
{{- fail (printf "admission: the policy's rules are %d characters, more than the 100000 one CEL expression may hold; set admission.enabled=false" $size) }}
{{- end }}
{{- end }}
{{- end }}
