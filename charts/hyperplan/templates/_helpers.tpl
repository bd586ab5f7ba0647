{{/* Name of the chart, overridable. */}}
{{- define "hyperplan.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name of the release's objects: the release name, with the chart name unless it already holds it. */}}
{{- define "hyperplan.fullname" -}}
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

{{- define "hyperplan.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "hyperplan.selectorLabels" -}}
app.kubernetes.io/name: {{ include "hyperplan.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "hyperplan.labels" -}}
helm.sh/chart: {{ include "hyperplan.chart" . }}
{{ include "hyperplan.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "hyperplan.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "hyperplan.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required with serviceAccount.create=false: name the ServiceAccount the operator runs as, which the chart binds its roles to (the namespace's default account is never used)" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "hyperplan.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/*
The pod's affinity: the user's `affinity` value, with two requirements added to every one of its
required node selector terms (or to a new term if there is none): no
`node-restriction.kubernetes.io/hyperplan-pool` label (the static pool hyperplan lends to groups) and no `hyperplan.dev/instance-group` label (a node a
group holds). A drain of such a node would evict the operator. Terms are ORed and the expressions
inside a term ANDed, so adding to each term keeps the user's choice and adds ours to it.
With several replicas (spreadReplicas), a preferred pod anti-affinity puts them on different
nodes where there are such nodes (preferred, so a small cluster still runs them all), unless
the user's affinity brings its own podAntiAffinity.
*/}}
{{- define "hyperplan.affinity" -}}
{{- $affinity := deepCopy (.Values.affinity | default dict) }}
{{- if .Values.avoidLentNodes }}
{{- $ours := list (dict "key" "node-restriction.kubernetes.io/hyperplan-pool" "operator" "DoesNotExist") (dict "key" "hyperplan.dev/instance-group" "operator" "DoesNotExist") }}
{{- $nodeAffinity := get $affinity "nodeAffinity" | default dict }}
{{- $required := get $nodeAffinity "requiredDuringSchedulingIgnoredDuringExecution" | default dict }}
{{- $terms := get $required "nodeSelectorTerms" | default (list dict) }}
{{- $merged := list }}
{{- range $terms }}
{{- $expressions := concat (get . "matchExpressions" | default list) $ours }}
{{- $merged = append $merged (merge (dict "matchExpressions" $expressions) .) }}
{{- end }}
{{- $_ := set $required "nodeSelectorTerms" $merged }}
{{- $_ = set $nodeAffinity "requiredDuringSchedulingIgnoredDuringExecution" $required }}
{{- $_ = set $affinity "nodeAffinity" $nodeAffinity }}
{{- end }}
{{- if and .Values.spreadReplicas (gt (int .Values.replicas) 1) (not (hasKey $affinity "podAntiAffinity")) }}
{{- $term := dict "topologyKey" "kubernetes.io/hostname" "labelSelector" (dict "matchLabels" (include "hyperplan.selectorLabels" . | fromYaml)) }}
{{- $_ := set $affinity "podAntiAffinity" (dict "preferredDuringSchedulingIgnoredDuringExecution" (list (dict "weight" 100 "podAffinityTerm" $term))) }}
{{- end }}
{{- if $affinity }}
{{- toYaml $affinity }}
{{- end }}
{{- end }}
