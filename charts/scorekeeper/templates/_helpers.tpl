{{/* Chart name, truncated to the 63 characters a label value allows. */}}
{{- define "scorekeeper.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: "<release>-<chart>", or the release name alone when it already contains the chart name. */}}
{{- define "scorekeeper.fullname" -}}
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

{{- define "scorekeeper.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Selector labels of the operator pod. Immutable on an existing Deployment: never add to them. */}}
{{- define "scorekeeper.selectorLabels" -}}
app.kubernetes.io/name: {{ include "scorekeeper.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{/* Labels on every object of the release. Worker objects are labelled managed-by=scorekeeper-operator by the
operator itself; these say Helm, so the operator never mistakes its own Deployment for a child. */}}
{{- define "scorekeeper.labels" -}}
helm.sh/chart: {{ include "scorekeeper.chart" . }}
{{ include "scorekeeper.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: scorekeeper
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "scorekeeper.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "scorekeeper.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create=false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* repository:tag or repository@digest; the tag defaults to the chart's appVersion. Argument: an image dict and
the root context, as (list .Values.image $). */}}
{{- define "scorekeeper.image" -}}
{{- $image := index . 0 }}
{{- $root := index . 1 }}
{{- if $image.digest }}
{{- printf "%s@%s" $image.repository $image.digest }}
{{- else }}
{{- printf "%s:%s" $image.repository (default $root.Chart.AppVersion $image.tag) }}
{{- end }}
{{- end }}

{{/*
RBAC. Each rule is here because of an API call the operator makes; tests/chart/test_rbac.py checks both directions
(every call the operator makes is allowed; nothing is granted that no call needs, beyond the documented extras).

Namespaced rules: granted cluster-wide (ClusterRole) or, with operator.watchNamespaces, in each watched namespace.
*/}}
{{- define "scorekeeper.rbac.namespacedRules" -}}
# ScoringModels: kopf lists and watches them and patches its progress annotations; the reconciler reads one
# object at a time and writes the status subresource.
- apiGroups: [scorekeeper.dev]
  resources: [scoringmodels]
  verbs: [get, list, watch, patch]
- apiGroups: [scorekeeper.dev]
  resources: [scoringmodels/status]
  verbs: [patch]
# Children carry blockOwnerDeletion: clusters with OwnerReferencesPermissionEnforcement require this.
- apiGroups: [scorekeeper.dev]
  resources: [scoringmodels/finalizers]
  verbs: [update]
# Children, written by server-side apply: an apply PATCH that creates the object is also authorized as `create`.
# Watched (list, watch) so drift, deletion and rollouts trigger a reconcile.
- apiGroups: [""]
  resources: [configmaps, services]
  verbs: [get, list, watch, create, patch]
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, list, watch, create, patch]
# Optional children: also deleted when the spec stops wanting them (uid-preconditioned DELETE).
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [autoscaling]
  resources: [horizontalpodautoscalers]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [monitoring.coreos.com]
  resources: [servicemonitors]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [keda.sh]
  resources: [scaledobjects]
  verbs: [get, list, watch, create, patch, delete]
# Worker pods: watched for crash loops, OOM kills and scheduling failures; listed by label for status. Never written.
- apiGroups: [""]
  resources: [pods]
  verbs: [list, watch]
# kopf posts Events (warnings and errors only) about the ScoringModels it handles; the reconciler lists the Events
# of worker pods that are not ready (by involvedObject.uid): volume mount/attach failures, probe kills, node scale-up.
- apiGroups: [""]
  resources: [events]
  verbs: [create, list]
{{- end }}

{{/* Cluster-scoped rules kopf needs in every mode: it watches CRDs to notice its resource appearing or changing. */}}
{{- define "scorekeeper.rbac.clusterRules" -}}
- apiGroups: [apiextensions.k8s.io]
  resources: [customresourcedefinitions]
  verbs: [list, watch]
{{- if .Values.operator.watchNamespaces }}
# Namespaced mode: kopf lists and watches namespaces to notice watched ones being created or deleted.
- apiGroups: [""]
  resources: [namespaces]
  verbs: [list, watch]
{{- end }}
{{- end }}

{{/* The comma-separated namespace list the operator reads from SCOREKEEPER_NAMESPACE. */}}
{{- define "scorekeeper.watchNamespaces" -}}
{{- join "," (uniq .Values.operator.watchNamespaces) }}
{{- end }}
