#!/usr/bin/env bash
# Prints a directory holding the Multi-Cluster Services CRDs every cluster of the bed with nodes
# gets (testbed/dns.sh applies them; the MCS conformance suite and CoreDNS's `multicluster` zone
# need them) and that scripts/render-mcs-crds puts into the chart:
#   multicluster.x-k8s.io_serviceexports.yaml, multicluster.x-k8s.io_serviceimports.yaml
#     as published in the Go module sigs.k8s.io/mcs-api (config/crd/, Apache-2.0), fetched
#     through the Go module proxy at MCS_API_VERSION (versions.env);
#   about.k8s.io_clusterproperties.yaml
#     the project's own testbed/crds/clusterproperty.yaml (KEP-2149; its module is not served).
# Cached beside the bed's binaries, the fetch by version, the folder by version and the hand-written
# file's hash: a second run returns at once and needs no network. Run it outside the bed's network
# namespace (the Go module proxy is not reachable from in there); testbed/bed does.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"
cache=${XCC_CACHE:-$HOME/.cache/cross-cluster-controller}
module=sigs.k8s.io/mcs-api
fetched="$cache/crds/mcs-api-v$MCS_API_VERSION"
upstream=(multicluster.x-k8s.io_serviceexports.yaml multicluster.x-k8s.io_serviceimports.yaml)
own="$here/crds/clusterproperty.yaml"
out="$cache/crds/mcs-v$MCS_API_VERSION-$(sha256sum "$own" | cut -c1-12)"
all=("${upstream[@]}" about.k8s.io_clusterproperties.yaml)

have() { local d=$1 f; shift; for f in "$@"; do [ -s "$d/$f" ] || return 1; done; }
if have "$out" "${all[@]}"; then echo "$out"; exit 0; fi
mkdir -p "$cache/crds"

# 1. the module's CRDs (and its licence), once per version
if ! have "$fetched" "${upstream[@]}" LICENSE; then
  command -v go >/dev/null || { echo "testbed: go is not installed; .ci/run installs it" >&2; exit 1; }
  export GOTOOLCHAIN=local
  work=$(mktemp -d "$cache/crds/fetch.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  echo "testbed: fetching $module v$MCS_API_VERSION (its CRDs)" >&2
  dir=$(cd "$work" && go mod download -json "$module@v$MCS_API_VERSION" |
    sed -n 's/.*"Dir": "\(.*\)",/\1/p')
  [ -d "$dir/config/crd" ] || { echo "testbed: $module v$MCS_API_VERSION has no config/crd/" >&2; exit 1; }
  mkdir -p "$work/out"
  for f in "${upstream[@]}"; do
    cp "$dir/config/crd/$f" "$work/out/$f"
    # the release it came from is the one pinned (the CRDs carry it as a label)
    grep -q "multicluster.x-k8s.io/release-version: \"v$MCS_API_VERSION\"" "$work/out/$f" ||
      { echo "testbed: $f of $module v$MCS_API_VERSION does not carry release-version v$MCS_API_VERSION" >&2; exit 1; }
  done
  cp "$dir/LICENSE" "$work/out/LICENSE"
  chmod u+w "$work/out"/*
  rm -rf "$fetched"
  mv "$work/out" "$fetched"
fi

# 2. the folder of all three (written whole, then renamed: another run may read it); one left
# incomplete by an interrupted run is replaced
[ ! -d "$out" ] || rm -rf "$out"
tmp=$(mktemp -d "$cache/crds/mcs.XXXXXX")
for f in "${upstream[@]}" LICENSE; do cp "$fetched/$f" "$tmp/$f"; done
cp "$own" "$tmp/about.k8s.io_clusterproperties.yaml"
chmod 755 "$tmp"
if ! mv -T "$tmp" "$out" 2>/dev/null; then
  # another run made it first: keep its folder
  rm -rf "$tmp"
fi
have "$out" "${all[@]}" || { echo "testbed: CRDs missing in $out" >&2; exit 1; }
echo "$out"
