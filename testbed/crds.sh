#!/usr/bin/env bash
# Prints a directory holding the Prometheus Operator's CRDs that the chart's optional monitoring
# objects need (ServiceMonitor, PrometheusRule), as published in the Go module
# github.com/prometheus-operator/prometheus-operator (example/prometheus-operator-crd/), fetched
# through the Go module proxy at the version pinned in versions.env and cached by version beside
# the test bed's binaries. A second run with the same version returns at once.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"
cache=${XCC_CACHE:-$HOME/.cache/cross-cluster-controller}
out="$cache/crds/prometheus-operator-v$PROMETHEUS_OPERATOR_VERSION"
want=(monitoring.coreos.com_servicemonitors.yaml monitoring.coreos.com_prometheusrules.yaml)

have_all() { for f in "${want[@]}"; do [ -s "$out/$f" ] || return 1; done; }
if have_all; then echo "$out"; exit 0; fi

command -v go >/dev/null || { echo "testbed: go is not installed; .ci/run installs it" >&2; exit 1; }
export GOTOOLCHAIN=local
mkdir -p "$cache/crds"
work=$(mktemp -d "$cache/crds/fetch.XXXXXX")
trap 'rm -rf "$work"' EXIT
module=github.com/prometheus-operator/prometheus-operator
echo "testbed: fetching $module v$PROMETHEUS_OPERATOR_VERSION (its CRDs)" >&2
dir=$(cd "$work" && go mod download -json "$module@v$PROMETHEUS_OPERATOR_VERSION" |
  sed -n 's/.*"Dir": "\(.*\)",/\1/p')
[ -d "$dir/example/prometheus-operator-crd" ] ||
  { echo "testbed: $module v$PROMETHEUS_OPERATOR_VERSION has no example/prometheus-operator-crd/" >&2; exit 1; }
mkdir -p "$work/out"
for f in "${want[@]}"; do
  cp "$dir/example/prometheus-operator-crd/$f" "$work/out/$f"
done
chmod u+w "$work/out"/*
rm -rf "$out"
mv "$work/out" "$out"
have_all || { echo "testbed: CRDs missing in $out after the fetch" >&2; exit 1; }
echo "$out"
