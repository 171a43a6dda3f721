{{/* Chart name. */}}
{{- define "ccc.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Fully qualified app name; the release name when it already contains the chart name. */}}
{{- define "ccc.fullname" -}}
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

{{/* Chart name and version for the chart label. */}}
{{- define "ccc.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Common labels. */}}
{{- define "ccc.labels" -}}
helm.sh/chart: {{ include "ccc.chart" . }}
{{ include "ccc.selectorLabels" . }}
app.kubernetes.io/version: {{ include "ccc.imageTag" . | trunc 63 | trimSuffix "-" | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: cross-cluster-controller
{{- end }}

{{/* Selector labels. */}}
{{- define "ccc.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ccc.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Image tag: values or the chart's appVersion. */}}
{{- define "ccc.imageTag" -}}
{{- default .Chart.AppVersion .Values.image.tag }}
{{- end }}

{{/* ServiceAccount of the controller (the local writer). */}}
{{- define "ccc.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "ccc.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* "true" when a static remote kubeconfig is mounted (remoteKubeconfig.existingSecret or
create), else empty: by default the remotes come from the Secrets remoteSecretSelector selects. */}}
{{- define "ccc.staticRemote" -}}
{{- if or .Values.remoteKubeconfig.create .Values.remoteKubeconfig.existingSecret }}
{{- print "true" }}
{{- end }}
{{- end }}

{{/* Secret holding the static remote's kubeconfig (key `kubeconfig`); empty without one. */}}
{{- define "ccc.remoteKubeconfigSecret" -}}
{{- if .Values.remoteKubeconfig.create }}
{{- printf "%s-remote-kubeconfig" (include "ccc.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- else if .Values.remoteKubeconfig.existingSecret }}
{{- .Values.remoteKubeconfig.existingSecret }}
{{- end }}
{{- end }}

{{/* ClusterRole(Binding) of the remote reader: the name `cross-cluster-controller remote-access`
looks for (`<serviceAccount>-<namespace>`), so that it reuses these instead of creating its own. */}}
{{- define "ccc.remoteReaderRoleName" -}}
{{- printf "%s-%s" .Values.remoteReader.serviceAccountName .Release.Namespace | trunc 253 }}
{{- end }}

{{/* Secret and key holding the Sentry DSN; empty when Sentry is off. */}}
{{- define "ccc.sentrySecret" -}}
{{- if .Values.sentry.existingSecret }}
{{- .Values.sentry.existingSecret }}
{{- else if .Values.sentry.dsn }}
{{- printf "%s-sentry" (include "ccc.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "ccc.sentrySecretKey" -}}
{{- if .Values.sentry.existingSecret }}
{{- .Values.sentry.existingSecretKey }}
{{- else }}
{{- print "dsn" }}
{{- end }}
{{- end }}

{{/* The hub's namespace of the ClusterProfiles: clusterProfiles.namespace, else the release's. */}}
{{- define "ccc.profilesNamespace" -}}
{{- default .Release.Namespace .Values.clusterProfiles.namespace }}
{{- end }}

{{/* The ConfigMap holding the access-provider file of clusterProfiles. */}}
{{- define "ccc.clusterProfilesConfigMap" -}}
{{- printf "%s-cluster-profiles" (include "ccc.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The access-provider file (--clusterprofile-provider-file): {"providers": [...]}. */}}
{{- define "ccc.providerFile" -}}
{{- dict "providers" .Values.clusterProfiles.providers | toPrettyJson }}
{{- end }}

{{/* Lease name: values or the full name. */}}
{{- define "ccc.leaseName" -}}
{{- default (include "ccc.fullname" .) .Values.leaseName }}
{{- end }}

{{/* Checks of combinations the schema cannot express well. */}}
{{- define "ccc.validate" -}}
{{- if and .Values.remoteKubeconfig.create .Values.remoteKubeconfig.existingSecret }}
{{- fail "remoteKubeconfig: set either existingSecret or create=true, not both" }}
{{- end }}
{{- if and .Values.remoteKubeconfig.create (not .Values.remoteKubeconfig.content) }}
{{- fail "remoteKubeconfig.create=true needs remoteKubeconfig.content (use --set-file remoteKubeconfig.content=PATH)" }}
{{- end }}
{{- if not (or .Values.remoteSecretSelector (include "ccc.staticRemote" .) .Values.remoteContext .Values.clusterProfiles.enabled) }}
{{- fail "no remote cluster: set remoteSecretSelector (remotes from labelled Secrets), remoteKubeconfig.existingSecret, remoteKubeconfig.create=true or clusterProfiles.enabled=true" }}
{{- end }}
{{- if and .Values.clusterProfiles.enabled (not .Values.clusterProfiles.providers) }}
{{- fail "clusterProfiles.enabled=true needs clusterProfiles.providers (the exec plugin of each access provider: the daemon refuses a provider file that names none)" }}
{{- end }}
{{- if and .Values.sentry.dsn .Values.sentry.existingSecret }}
{{- fail "sentry: set either dsn or existingSecret, not both" }}
{{- end }}
{{- if and .Values.mcs.clusterName (not .Values.mcs.enabled) }}
{{- fail "mcs.clusterName is --local-cluster-name of the MCS path: it needs mcs.enabled=true" }}
{{- end }}
{{- if and .Values.remoteReader.enabled .Values.serviceAccount.create (eq (include "ccc.serviceAccountName" .) .Values.remoteReader.serviceAccountName) }}
{{- fail "remoteReader.serviceAccountName must differ from the controller's ServiceAccount" }}
{{- end }}
{{- end }}

{{/* PromQL label matchers (no braces) that pick this release's series: prometheusRule.selector,
else the labels the Prometheus Operator gives the targets of the chart's ServiceMonitor. */}}
{{- define "ccc.seriesSelector" -}}
{{- if .Values.prometheusRule.selector }}
{{- .Values.prometheusRule.selector }}
{{- else }}
{{- printf "job=%q,namespace=%q" (printf "%s-metrics" (include "ccc.fullname" .)) .Release.Namespace }}
{{- end }}
{{- end }}

{{/* A byte count as the daemon reads it: "64Mi" as it is, a number without an exponent. */}}
{{- define "ccc.bytes" -}}
{{- if kindIs "string" . }}{{ . }}{{ else }}{{ . | int64 }}{{ end }}
{{- end }}
