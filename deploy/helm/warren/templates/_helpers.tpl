{{/* Names, labels and the pieces every part's pod shares. */}}

{{- define "warren.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "warren.fullname" -}}
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

{{/* A part's resource name: <fullname>-<part>. */}}
{{- define "warren.part" -}}
{{- printf "%s-%s" (include "warren.fullname" .root) .part | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "warren.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "warren.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: warren
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Labels selecting one part's pods: dict "root" $ "part" "scheduler". */}}
{{- define "warren.selector" -}}
app.kubernetes.io/name: {{ include "warren.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .part }}
{{- end -}}

{{- define "warren.partLabels" -}}
{{ include "warren.labels" .root }}
app.kubernetes.io/component: {{ .part }}
{{- end -}}

{{- define "warren.image" -}}
{{- $repo := required "image.repository is required: the warren image (the chart's README, \"The image\")" .Values.image.repository -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" $repo .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" $repo (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{- define "warren.domain" -}}
{{- required "domain is required: sandboxes answer at https://{port}-{id}.{domain}" .Values.domain -}}
{{- end -}}

{{/* The scheduler Service's in-cluster DNS name. */}}
{{- define "warren.schedulerHost" -}}
{{- printf "%s.%s.svc" (include "warren.part" (dict "root" . "part" "scheduler")) .Release.Namespace -}}
{{- end -}}

{{/* --scheduler for gateways and nodes: the Service (kube-proxy spreads
connections over the replicas; a broken connection is made again to a live
one). */}}
{{- define "warren.schedulerArg" -}}
{{- printf "--scheduler=%s:%v" (include "warren.schedulerHost" .) .Values.ports.schedulerGrpc -}}
{{- end -}}

{{/* Secret names: the internal CA and the scheduler's and gateways'
certificates, the same names whichever internalTLS.mode makes them. */}}
{{- define "warren.caSecret" -}}
{{- if eq .Values.internalTLS.mode "existing" -}}
{{- required "internalTLS.existing.caSecret is required with internalTLS.mode existing" .Values.internalTLS.existing.caSecret -}}
{{- else -}}
{{- printf "%s-internal-ca" (include "warren.fullname" .) -}}
{{- end -}}
{{- end -}}

{{- define "warren.tlsSecret" -}}
{{- $mode := .root.Values.internalTLS.mode -}}
{{- if eq $mode "existing" -}}
{{- $key := printf "%sSecret" .part -}}
{{- required (printf "internalTLS.existing.%s is required with internalTLS.mode existing" $key) (index .root.Values.internalTLS.existing $key) -}}
{{- else -}}
{{- printf "%s-internal-tls" (include "warren.part" .) -}}
{{- end -}}
{{- end -}}

{{- define "warren.checkMode" -}}
{{- $modes := list "cert-manager" "hook" "existing" -}}
{{- if not (has .Values.internalTLS.mode $modes) -}}
{{- fail (printf "internalTLS.mode %q: use cert-manager, hook or existing" .Values.internalTLS.mode) -}}
{{- end -}}
{{- end -}}

{{/* The public (wildcard) certificate's Secret. */}}
{{- define "warren.publicTlsSecret" -}}
{{- if .Values.gateway.publicTLS.existingSecret -}}
{{- .Values.gateway.publicTLS.existingSecret -}}
{{- else -}}
{{- printf "%s-public-tls" (include "warren.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* --blob-store and its options, for the gateways and nodes. */}}
{{- define "warren.blobArgs" -}}
- --blob-store={{ required "blobStore.url is required: the nodes share no disk (docs/blobs.md)" .Values.blobStore.url }}
{{- range .Values.blobStore.options }}
- --blob-store-option={{ . }}
{{- end }}
{{- end -}}

{{- define "warren.blobEnvFrom" -}}
{{- with .Values.blobStore.existingSecret }}
envFrom:
  - secretRef:
      name: {{ . }}
{{- end }}
{{- end -}}

{{/* The internal TLS flags of a part whose certificate is a Secret mounted at /etc/warren/tls. */}}
{{- define "warren.tlsArgs" -}}
- --tls-ca=/etc/warren/tls/ca.crt
- --tls-cert=/etc/warren/tls/tls.crt
- --tls-key=/etc/warren/tls/tls.key
{{- end -}}

{{/* The container security context of the scheduler and gateways. They
run as uid 0 without a single capability: a Kubernetes Secret volume's
files are root's (mode 0400 here), and warren refuses a key file other
accounts may read, so a non-root uid would need fsGroup, which makes the
files group-readable (refused). Root without CAP_DAC_OVERRIDE reads
root's files and nothing else it is not allowed to; the file system is
read-only, privilege escalation off, the runtime's seccomp profile on. */}}
{{- define "warren.restrictedSecurityContext" -}}
runAsUser: 0
runAsGroup: 0
runAsNonRoot: false
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
privileged: false
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* The admin listener's probes. */}}
{{- define "warren.probes" -}}
readinessProbe:
  httpGet:
    path: /readyz
    port: admin
  periodSeconds: 5
  timeoutSeconds: 2
  failureThreshold: 2
livenessProbe:
  httpGet:
    path: /healthz
    port: admin
  periodSeconds: 10
  timeoutSeconds: 5
  failureThreshold: 6
{{- end -}}

{{/* preStop: sleep (the kubelet's own action: no shell needed in the
image), then SIGTERM starts the part's own --shutdown-delay and
--drain-timeout. */}}
{{- define "warren.lifecycle" -}}
lifecycle:
  preStop:
    sleep:
      seconds: {{ .preStopSleepSeconds }}
{{- end -}}

{{/* terminationGracePeriodSeconds: preStop, the shutdown delay and the
drain, plus a margin, so the kubelet never SIGKILLs a part that is still
draining. */}}
{{- define "warren.grace" -}}
{{- add .preStopSleepSeconds .shutdownDelaySeconds .drainTimeoutSeconds (default 5 .stopMarginSeconds) -}}
{{- end -}}

{{- define "warren.spread" -}}
{{- if .values.topologySpreadConstraints }}
topologySpreadConstraints:
  {{- toYaml .values.topologySpreadConstraints | nindent 2 }}
{{- else }}
topologySpreadConstraints:
  - maxSkew: 1
    topologyKey: kubernetes.io/hostname
    whenUnsatisfiable: ScheduleAnyway
    labelSelector:
      matchLabels:
        {{- include "warren.selector" (dict "root" .root "part" .part) | nindent 8 }}
{{- end }}
{{- end -}}

{{- define "warren.scheduling" -}}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- end -}}

{{/* A listen host as it goes before `:PORT` (IPv6 in brackets). */}}
{{- define "warren.hostPort" -}}
{{- if contains ":" . -}}
{{- printf "[%s]" . -}}
{{- else -}}
{{- . -}}
{{- end -}}
{{- end -}}

{{/* The node's certificate, issued by `warren certs` from the cluster CA
for this node's id (the Kubernetes node name folded into [a-z0-9-], 63
at most, as `warren node` folds a host name) and its pod address; with
"once" (the init container) also node.toml (node-id, advertise), with
"renew" (the sidecar) again every RENEW_EVERY seconds. Each file is
replaced by a rename, which the node sees and re-reads. */}}
{{- define "warren.nodeCertScript" -}}
# node-cert.sh once|renew: see the chart's templates/_helpers.tpl.
set -eu
id=$(printf '%s' "$NODE_NAME" | tr 'A-Z' 'a-z' | tr -c 'a-z0-9' '-' | cut -c1-63 | sed -e 's/^-*//' -e 's/-*$//')
case "$POD_IP" in *:*) advertise="[$POD_IP]:$NODE_PORT" ;; *) advertise="$POD_IP:$NODE_PORT" ;; esac
issue() {
  rm -rf "$RUN/new"
  mkdir -p "$RUN/new"
  "$WARREN" certs issue --dir /etc/warren/ca --out "$RUN/new" --role node --name "$id" --host "$POD_IP" --days "$DAYS" >/dev/null
  cp /etc/warren/ca/ca.pem "$RUN/new/ca.crt"
  mv -f "$RUN/new/ca.crt" "$RUN/ca.crt"
  mv -f "$RUN/new/node-$id.key" "$RUN/tls.key"
  mv -f "$RUN/new/node-$id.pem" "$RUN/tls.crt"
  rmdir "$RUN/new"
  echo "node-cert: issued node $id a certificate for $POD_IP ($DAYS days)"
}
if [ "$1" = once ]; then
  issue
  printf 'node-id = "%s"\nadvertise = "%s"\n' "$id" "$advertise" > "$RUN/node.toml.new"
  mv -f "$RUN/node.toml.new" "$RUN/node.toml"
else
  while sleep "$RENEW_EVERY"; do issue; done
fi
{{- end -}}

{{- define "warren.nodeCertEnv" -}}
env:
  - name: NODE_NAME
    valueFrom:
      fieldRef:
        fieldPath: spec.nodeName
  - name: POD_IP
    valueFrom:
      fieldRef:
        fieldPath: status.podIP
  - name: NODE_PORT
    value: {{ .Values.ports.node | quote }}
  - name: WARREN
    value: {{ .Values.image.binary | quote }}
  - name: RUN
    value: /run/warren/node
  - name: DAYS
    value: {{ .Values.internalTLS.node.days | quote }}
  - name: RENEW_EVERY
    value: {{ .Values.internalTLS.node.renewEverySeconds | quote }}
{{- end -}}

{{- define "warren.nodeCertMounts" -}}
- name: node-cert
  mountPath: /etc/warren/node-cert
  readOnly: true
- name: node-run
  mountPath: /run/warren/node
- name: internal-ca
  mountPath: /etc/warren/ca
  readOnly: true
{{- end -}}
