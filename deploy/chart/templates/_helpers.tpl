{{- define "turnpike.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "turnpike.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "turnpike.selector" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "turnpike.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "turnpike.secretName" -}}
{{- .Values.secrets.existingSecret | default (printf "%s-secrets" (include "turnpike.fullname" .)) -}}
{{- end -}}

{{- define "turnpike.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- .Values.serviceAccount.name | default (include "turnpike.fullname" .) -}}
{{- else -}}
{{- .Values.serviceAccount.name | default "default" -}}
{{- end -}}
{{- end -}}

{{/* Environment every process gets: secrets by reference, the S3 settings. */}}
{{- define "turnpike.env" -}}
- name: TURNPIKE_CONFIG
  value: /etc/turnpike/turnpike.toml
- name: TURNPIKE_SIGNING_KEY
  valueFrom:
    secretKeyRef:
      name: {{ include "turnpike.secretName" . }}
      key: signing-key
- name: TURNPIKE_CONNECTION_KEY
  valueFrom:
    secretKeyRef:
      name: {{ include "turnpike.secretName" . }}
      key: connection-key
      optional: true
- name: TURNPIKE_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "turnpike.secretName" . }}
      key: database-url
      optional: true
- name: AWS_ACCESS_KEY_ID
  valueFrom:
    secretKeyRef:
      name: {{ include "turnpike.secretName" . }}
      key: aws-access-key-id
      optional: true
- name: AWS_SECRET_ACCESS_KEY
  valueFrom:
    secretKeyRef:
      name: {{ include "turnpike.secretName" . }}
      key: aws-secret-access-key
      optional: true
- name: AWS_REGION
  value: {{ .Values.external.s3.region | quote }}
{{- with .Values.external.s3.endpoint }}
- name: AWS_ENDPOINT
  value: {{ . | quote }}
{{- end }}
{{- if .Values.external.s3.allowHttp }}
- name: AWS_ALLOW_HTTP
  value: "true"
{{- end }}
{{- end -}}

{{/* Probes on the admin port. */}}
{{- define "turnpike.probes" -}}
startupProbe:
  httpGet: { path: /livez, port: admin }
  periodSeconds: 2
  failureThreshold: 60
livenessProbe:
  httpGet: { path: /livez, port: admin }
  periodSeconds: 10
  failureThreshold: 3
readinessProbe:
  httpGet: { path: /readyz, port: admin }
  periodSeconds: 5
  failureThreshold: 2
{{- end -}}
