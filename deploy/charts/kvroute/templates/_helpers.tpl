{{- define "kvroute.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kvroute.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "kvroute.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "kvroute.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Names of the parts; the EPP's Service is what the pool points at. */}}
{{- define "kvroute.epp" -}}{{ include "kvroute.fullname" . | trunc 59 | trimSuffix "-" }}-epp{{- end -}}
{{- define "kvroute.nats" -}}{{ include "kvroute.fullname" . | trunc 58 | trimSuffix "-" }}-nats{{- end -}}
{{- define "kvroute.natsCluster" -}}{{ include "kvroute.fullname" . | trunc 50 | trimSuffix "-" }}-nats-cluster{{- end -}}
{{- define "kvroute.vllm" -}}{{ include "kvroute.fullname" . | trunc 58 | trimSuffix "-" }}-vllm{{- end -}}
{{- define "kvroute.pool" -}}{{ default (include "kvroute.fullname" .) .Values.pool.name }}{{- end -}}
{{- define "kvroute.model" -}}{{ default .Values.vllm.model .Values.pool.model }}{{- end -}}

{{- define "kvroute.serviceAccount" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "kvroute.epp" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "kvroute.eppSelector" -}}
app.kubernetes.io/name: {{ include "kvroute.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: epp
{{- end -}}

{{- define "kvroute.natsSelector" -}}
app.kubernetes.io/name: {{ include "kvroute.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: nats
{{- end -}}

{{/* The labels that make a pod a member of the pool. */}}
{{- define "kvroute.poolSelector" -}}
{{- if .Values.pool.selector -}}
{{- toYaml .Values.pool.selector -}}
{{- else -}}
kvroute.io/pool: {{ include "kvroute.pool" . }}
{{- end -}}
{{- end -}}

{{/* The label selector string of standalone mode. */}}
{{- define "kvroute.poolSelectorString" -}}
{{- $sel := include "kvroute.poolSelector" . | fromYaml -}}
{{- $parts := list -}}
{{- range $k := keys $sel | sortAlpha -}}
{{- $parts = append $parts (printf "%s=%s" $k (get $sel $k)) -}}
{{- end -}}
{{- join "," $parts -}}
{{- end -}}

{{- define "kvroute.natsURL" -}}
{{- if and .Values.nats.enabled .Values.nats.cluster.enabled -}}
{{- $urls := list -}}
{{- range $i := until (int .Values.nats.cluster.replicas) -}}
{{- $urls = append $urls (printf "nats://%s-%d.%s.%s.svc:%v" (include "kvroute.nats" $) $i (include "kvroute.natsCluster" $) $.Release.Namespace $.Values.nats.port) -}}
{{- end -}}
{{- join "," $urls -}}
{{- else if .Values.nats.enabled -}}
nats://{{ include "kvroute.nats" . }}.{{ .Release.Namespace }}.svc:{{ .Values.nats.port }}
{{- else -}}
{{- required "nats.url is required when nats.enabled is false" .Values.nats.url -}}
{{- end -}}
{{- end -}}

{{- define "kvroute.image" -}}
{{- $tag := default .root.Chart.AppVersion .image.tag -}}
{{ .image.repository }}:{{ $tag }}
{{- end -}}

{{/* The NATS auth callout runs with the chart's own NATS server. */}}
{{- define "kvroute.callout" -}}
{{- if and .Values.nats.enabled .Values.nats.auth.callout -}}true{{- end -}}
{{- end -}}

{{- define "kvroute.natsAuth" -}}{{ include "kvroute.fullname" . | trunc 53 | trimSuffix "-" }}-nats-auth{{- end -}}

{{/* The ServiceAccount of the model-server pods, whose pod-bound tokens
     the callout gives their pod's relay rights. */}}
{{- define "kvroute.relayServiceAccount" -}}
{{- default (printf "%s-relay" (include "kvroute.fullname" . | trunc 57 | trimSuffix "-")) .Values.vllm.serviceAccount.name -}}
{{- end -}}

{{/* Where the projected NATS token is mounted in the EPP and the relays. */}}
{{- define "kvroute.natsTokenDir" -}}/var/run/secrets/kvroute/nats{{- end -}}

{{/* The projected ServiceAccount token a client presents to NATS. */}}
{{- define "kvroute.natsTokenVolume" -}}
- name: nats-token
  projected:
    sources:
    - serviceAccountToken:
        audience: {{ .Values.nats.auth.audience }}
        expirationSeconds: 3600
        path: token
{{- end -}}

{{/* The hardened container security context every container of the
     chart but vLLM's runs with; uid for images that run as root. */}}
{{- define "kvroute.securityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities: {drop: [ALL]}
seccompProfile: {type: RuntimeDefault}
{{- with .uid }}
runAsUser: {{ . }}
runAsGroup: {{ . }}
{{- end }}
{{- end -}}
