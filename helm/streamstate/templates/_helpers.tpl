{{/* Chart name, truncated to the 63 characters a label value allows. */}}
{{- define "streamstate.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: <release>-<chart> unless the release name already contains the chart name. */}}
{{- define "streamstate.fullname" -}}
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

{{- define "streamstate.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Selector labels: stable for the life of the StatefulSet. */}}
{{- define "streamstate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "streamstate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "streamstate.labels" -}}
helm.sh/chart: {{ include "streamstate.chart" . }}
{{ include "streamstate.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: stream-job
app.kubernetes.io/part-of: streamstate
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "streamstate.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "streamstate.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "streamstate.secretName" -}}
{{- default (include "streamstate.fullname" .) .Values.secret.existingSecret }}
{{- end }}

{{- define "streamstate.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* Fixed paths inside the container: the image's volume and the Secret's mount. */}}
{{- define "streamstate.dataDir" -}}/var/lib/streamstate{{- end }}
{{- define "streamstate.secretsDir" -}}/etc/streamstate/secrets{{- end }}
{{- define "streamstate.schemasDir" -}}/etc/streamstate/schemas{{- end }}

{{/* checkpoint.storage with the chart's default (the per-pod checkpoints volume). */}}
{{- define "streamstate.checkpointStorage" -}}
{{- $storage := .Values.config.checkpoint.storage | default "" }}
{{- if $storage }}
{{- $storage }}
{{- else }}
{{- if not .Values.persistence.checkpoints.enabled }}
{{- fail "config.checkpoint.storage is empty (file:// on the checkpoints volume) but persistence.checkpoints.enabled is false: set an s3:// storage or enable the volume" }}
{{- end }}
{{- printf "file://%s/checkpoints" (include "streamstate.dataDir" .) }}
{{- end }}
{{- end }}

{{/*
A duration of one number and one unit ("500ms", "30s", "2m", "1h") in whole seconds,
rounded up. values.schema.json restricts the chart's durations to this form.
*/}}
{{- define "streamstate.seconds" -}}
{{- $d := toString . }}
{{- if not (regexMatch "^[0-9]+(ms|s|m|h)$" $d) }}
{{- fail (printf "duration %q: use one number and one unit (ms, s, m, h), e.g. 30s" $d) }}
{{- end }}
{{- $n := regexFind "^[0-9]+" $d | int64 }}
{{- $unit := regexFind "[a-z]+$" $d }}
{{- if eq $unit "ms" }}{{ div (add $n 999) 1000 }}
{{- else if eq $unit "s" }}{{ $n }}
{{- else if eq $unit "m" }}{{ mul $n 60 }}
{{- else }}{{ mul $n 3600 }}
{{- end }}
{{- end }}

{{/*
Grace period: SIGTERM ends the current epoch (up to checkpoint.interval), takes a final
checkpoint (bounded by checkpoint.timeout) and exits; shutdownMarginSeconds covers the rest.
*/}}
{{- define "streamstate.terminationGracePeriodSeconds" -}}
{{- $c := .Values.config.checkpoint }}
{{- $min := add (include "streamstate.seconds" $c.interval) (include "streamstate.seconds" $c.timeout) .Values.shutdownMarginSeconds }}
{{- $explicit := .Values.terminationGracePeriodSeconds }}
{{- if kindIs "invalid" $explicit }}
{{- $min }}
{{- else if lt (int64 $explicit) (int64 $min) }}
{{- fail (printf "terminationGracePeriodSeconds %v is below checkpoint.interval + checkpoint.timeout + shutdownMarginSeconds = %v: SIGKILL would cut the final checkpoint" $explicit $min) }}
{{- else }}
{{- int64 $explicit }}
{{- end }}
{{- end }}

{{/* A TOML string (JSON string escapes are valid TOML basic-string escapes). */}}
{{- define "streamstate.tomlString" -}}
{{- toString . | toJson }}
{{- end }}

{{/* A TOML array of strings. */}}
{{- define "streamstate.tomlStrings" -}}
[{{ range $i, $v := . }}{{ if $i }}, {{ end }}{{ include "streamstate.tomlString" $v }}{{ end }}]
{{- end }}

{{/* A TOML table of librdkafka properties (strings). */}}
{{- define "streamstate.tomlProperties" -}}
{{- range $k, $v := . }}
{{ include "streamstate.tomlString" $k }} = {{ include "streamstate.tomlString" $v }}
{{- end }}
{{- end }}

{{/*
streamstate.toml: the shape of config/streamstate.toml. job.instance comes from the pod
index (STREAMSTATE__JOB__INSTANCE), the admin token from the mounted Secret.
*/}}
{{- define "streamstate.config" -}}
{{- $k := .Values.config.kafka -}}
{{- $j := .Values.config.job -}}
{{- $s := .Values.config.state -}}
{{- $c := .Values.config.checkpoint -}}
{{- $r := .Values.config.schema_registry | default dict -}}
{{- $a := .Values.config.avro | default dict -}}
{{- $p := .Values.config.protobuf | default dict -}}
{{- $format := $j.format | default "json" -}}
{{- $outputFormat := $j.output_format | default "json" -}}
{{- /* The binary needs urls in a [schema_registry] that exists: render it only with urls. */ -}}
{{- $registry := and $r.urls true -}}
{{- if and (not $registry) (or (ne $format "json") (ne $outputFormat "json")) -}}
{{- fail "config.job.format or config.job.output_format is not json: set config.schema_registry.urls (the registry the records' schema ids refer to)" -}}
{{- end -}}
{{- if not $registry -}}
{{- range $key := list "username" "ca_file" "request_timeout" "retry_for" "cache_schemas" -}}
{{- $v := index $r $key -}}
{{- if and (not (kindIs "invalid" $v)) (ne (toString $v) "") -}}
{{- fail (printf "config.schema_registry.%s is set but config.schema_registry.urls is empty: set the urls too (or unset it)" $key) -}}
{{- end -}}
{{- end -}}
{{- if or $.Values.secret.schemaRegistryPassword $.Values.secret.schemaRegistryBearerToken -}}
{{- fail "secret.schemaRegistryPassword/schemaRegistryBearerToken is set but config.schema_registry.urls is empty: the job would get a [schema_registry] without urls from the environment" -}}
{{- end -}}
{{- end -}}
{{- if and (eq $outputFormat "avro") (not $a.output_schema_file) -}}
{{- fail "config.job.output_format is avro: set config.avro.output_schema_file (e.g. /etc/streamstate/schemas/output.avsc, from schemas)" -}}
{{- end -}}
{{- $avroKeep := and (hasKey $a "register_output_schema") (kindIs "bool" $a.register_output_schema) (not $a.register_output_schema) -}}
# Rendered by the streamstate Helm chart from .Values.config. job.instance is set per pod
# by STREAMSTATE__JOB__INSTANCE (the StatefulSet pod index).

[kafka]
bootstrap_servers = {{ include "streamstate.tomlString" $k.bootstrap_servers }}
app_id = {{ include "streamstate.tomlString" $k.app_id }}
input_topics = [{{ range $i, $t := $k.input_topics }}{{ if $i }}, {{ end }}{{ include "streamstate.tomlString" $t }}{{ end }}]
output_topic = {{ include "streamstate.tomlString" $k.output_topic }}
{{- if $k.control_topic }}
control_topic = {{ include "streamstate.tomlString" $k.control_topic }}
{{- end }}
dead_letter_topic = {{ include "streamstate.tomlString" $k.dead_letter_topic }}
start_offsets = {{ include "streamstate.tomlString" $k.start_offsets }}
transaction_timeout = {{ include "streamstate.tomlString" $k.transaction_timeout }}
connect_timeout = {{ include "streamstate.tomlString" $k.connect_timeout }}

[kafka.properties]
{{- include "streamstate.tomlProperties" $k.properties }}

[kafka.consumer_properties]
{{- include "streamstate.tomlProperties" $k.consumer_properties }}

[kafka.producer_properties]
{{- include "streamstate.tomlProperties" $k.producer_properties }}

[job]
key = {{ include "streamstate.tomlString" $j.key }}
max_record_bytes = {{ int64 $j.max_record_bytes }}
max_key_bytes = {{ int64 $j.max_key_bytes }}
function = {{ include "streamstate.tomlString" ($j.function | default "rules") }}
{{- if $j.repartition }}
repartition = true
{{- end }}
{{- if $j.timestamp }}
timestamp = {{ include "streamstate.tomlString" $j.timestamp }}
{{- end }}
{{- range $key := list "max_out_of_orderness" "idle_timeout" "state_ttl" "max_event_time_skew" }}
{{- with (index $j $key) }}
{{ $key }} = {{ include "streamstate.tomlString" . }}
{{- end }}
{{- end }}
{{- /* Only when not the default json: an image without these keys still loads the config. */}}
{{- if ne $format "json" }}
format = {{ include "streamstate.tomlString" $format }}
{{- end }}
{{- if ne $outputFormat "json" }}
output_format = {{ include "streamstate.tomlString" $outputFormat }}
{{- end }}
{{- if $registry }}

[schema_registry]
urls = {{ include "streamstate.tomlStrings" $r.urls }}
{{- range $key := list "username" "ca_file" "request_timeout" "retry_for" }}
{{- with (index $r $key) }}
{{ $key }} = {{ include "streamstate.tomlString" . }}
{{- end }}
{{- end }}
{{- if not (kindIs "invalid" $r.cache_schemas) }}
cache_schemas = {{ int64 $r.cache_schemas }}
{{- end }}
{{- end }}
{{- if or $a.reader_schema_file $a.output_schema_file $a.output_schema_files $avroKeep }}

[avro]
{{- range $key := list "reader_schema_file" "output_schema_file" }}
{{- with (index $a $key) }}
{{ $key }} = {{ include "streamstate.tomlString" . }}
{{- end }}
{{- end }}
{{- if $avroKeep }}
register_output_schema = false
{{- end }}
{{- with $a.output_schema_files }}

[avro.output_schema_files]
{{- include "streamstate.tomlProperties" . }}
{{- end }}
{{- end }}
{{- with $p.message }}

[protobuf]
message = {{ include "streamstate.tomlString" . }}
{{- end }}

[state]
backend = {{ include "streamstate.tomlString" $s.backend }}
dir = {{ printf "%s/state" (include "streamstate.dataDir" .) | toJson }}
{{- if not (kindIs "invalid" $s.max_parallelism) }}
max_parallelism = {{ int64 $s.max_parallelism }}
{{- end }}

[checkpoint]
interval = {{ include "streamstate.tomlString" $c.interval }}
storage = {{ include "streamstate.checkpointStorage" . | toJson }}
retained = {{ int64 $c.retained }}
min_pause = {{ include "streamstate.tomlString" $c.min_pause }}
timeout = {{ include "streamstate.tomlString" $c.timeout }}

[admin]
listen = {{ printf "0.0.0.0:%d" (int .Values.admin.port) | toJson }}
token_file = {{ printf "%s/%s" (include "streamstate.secretsDir" .) .Values.secret.keys.adminToken | toJson }}
peer_url = {{ printf "http://%s-{instance}.%s-headless.%s.svc:%d" (include "streamstate.fullname" .) (include "streamstate.fullname" .) .Release.Namespace (int .Values.admin.port) | toJson }}
{{ end }}
