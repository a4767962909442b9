{{/* The chart's name, or nameOverride. */}}
{{- define "farm-apiserver.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Objects' names: fullnameOverride, else the release's name when it holds the chart's name (so
`helm install farm-apiserver` names everything as `kubectl apply -k manifests` does), else
<release>-<chart>.
*/}}
{{- define "farm-apiserver.fullname" -}}
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

{{/* The Pods' selector: the kustomize install's. */}}
{{- define "farm-apiserver.selectorLabels" -}}
app.kubernetes.io/name: {{ include "farm-apiserver.name" . }}
{{- end }}

{{- define "farm-apiserver.labels" -}}
{{ include "farm-apiserver.selectorLabels" . }}
app.kubernetes.io/part-of: farm
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The `helm test` objects' labels: a name of their own, so no selector of the server's
(Service, PodDisruptionBudget, NetworkPolicy, the test's own FarmPod wait) matches them. */}}
{{- define "farm-apiserver.testLabels" -}}
app.kubernetes.io/name: {{ include "farm-apiserver.name" . }}-test
app.kubernetes.io/component: test
app.kubernetes.io/part-of: farm
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The Secret holding tls.crt and tls.key (and ca.crt, but with existingSecret). */}}
{{- define "farm-apiserver.tlsSecret" -}}
{{- if eq .Values.tls.mode "existingSecret" }}
{{- required "tls.existingSecret: the name of a kubernetes.io/tls Secret in the release's namespace" .Values.tls.existingSecret }}
{{- else }}
{{- include "farm-apiserver.fullname" . }}-tls
{{- end }}
{{- end }}

{{/* The names the aggregator may dial; it verifies <service>.<namespace>.svc. */}}
{{- define "farm-apiserver.dnsNames" -}}
{{- $svc := include "farm-apiserver.fullname" . }}
{{- $ns := .Release.Namespace }}
{{- list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.cluster.local" $svc $ns) | toJson }}
{{- end }}

{{/* A container of the `helm test` Pod: kubectl with the arguments it is given. */}}
{{- define "farm-apiserver.testContainer" -}}
image: "{{ .Values.tests.image.repository }}:{{ .Values.tests.image.tag }}"
imagePullPolicy: {{ .Values.tests.image.pullPolicy }}
command: [kubectl]
env:
  # kubectl's discovery cache, on the Pod's one writable directory.
  - name: HOME
    value: /tmp
volumeMounts:
  - name: tmp
    mountPath: /tmp
securityContext:
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  capabilities:
    drop: ["ALL"]
resources:
  requests:
    cpu: 10m
    memory: 32Mi
  limits:
    memory: 128Mi
{{- end }}
