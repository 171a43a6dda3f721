#!/usr/bin/env bash
# The Cluster Inventory API (ClusterProfile, KEP-4322, multicluster.x-k8s.io/v1alpha1) for tests:
# prints ONE folder (nothing else on stdout) holding
#   multicluster.x-k8s.io_clusterprofiles.yaml  the ClusterProfile CRD (config/crd/bases/, as is)
#   secretreader-plugin                         the reference exec credential plugin, built here
#   LICENSE                                     upstream's (Apache-2.0)
# from kubernetes-sigs/cluster-inventory-api at the commit pinned below:
#
#   testbed/inventory.sh [--offline]
#
# The source, in this order:
# 1. $XCC_CLUSTER_INVENTORY, when set: the operator's choice (like XCC_MCS_SUITE), so only its
#    layout is checked (every file named in testbed/inventory.sha256), not its content;
# 2. else ../shared/cluster-inventory beside the repository, where it exists (our CI's snapshot:
#    see its PROVENANCE.md), verified against testbed/inventory.sha256;
# 3. else a git checkout of the pinned commit in the cache ($XCC_CACHE, default
#    ~/.cache/cross-cluster-controller/cluster-inventory-api/<commit>), fetched with git on first
#    use from https://github.com/kubernetes-sigs/cluster-inventory-api (its Go module is not
#    served by the Go module proxy) and verified every time: its HEAD must be the pinned commit
#    and the files used must have the sums pinned in testbed/inventory.sha256.
#
# The plugin is built from a copy of exactly those files (shared/ is read-only in CI; go may
# write), with GOTOOLCHAIN=local CGO_ENABLED=0, -trimpath, stripped (-s -w), dependencies from
# the Go module proxy (33 to 52 s here on two cores, about 4 minutes on busy ones), outside the
# bed's network namespace, into $cache/bin/cluster-inventory-<commit>-<hash12>: the hash covers
# the sums of the files used, the Go version and the build flags. That folder is written whole,
# then renamed (another run may be reading it): a second run returns at once and needs no network.
#
# --offline (inside the bed's namespace, where nothing can be fetched or built; XCC_TESTBED_INSIDE
# set implies it): only the cache is used; what is missing fails with one line naming what to run
# outside first. Never a skip.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
cache=${XCC_CACHE:-$HOME/.cache/cross-cluster-controller}
die() { echo "inventory: $*" >&2; exit 1; }
log() { echo "inventory: $*" >&2; }

# the pinned upstream commit (2026-05-18, after v0.1.2), the commit of shared/cluster-inventory
COMMIT=8375ac2
URL=https://github.com/kubernetes-sigs/cluster-inventory-api
sums=$here/inventory.sha256
crd=config/crd/bases/multicluster.x-k8s.io_clusterprofiles.yaml
plugin_pkg=./plugins/secretreader/cmd/plugin
build_flags=(-trimpath -buildvcs=false "-ldflags=-s -w")

offline=false
[ -z "${XCC_TESTBED_INSIDE:-}" ] || offline=true
case ${1:-} in
  --offline) offline=true ;;
  "") ;;
  *) die "unknown argument '$1' (--offline)" ;;
esac
outside="run testbed/inventory.sh outside the bed's network namespace first (scripts/test does)"

# the files used, as the sums name them
mapfile -t files < <(sed 's/^[0-9a-f]*  //' "$sums")
[ "${#files[@]}" -gt 0 ] || die "testbed/inventory.sha256 names no file"

# Why FOLDER does not hold every file used (and false), or nothing (and true).
laid_out() {
  local f missing=()
  for f in "${files[@]}"; do [ -f "$1/$f" ] || missing+=("$f"); done
  [ "${#missing[@]}" -eq 0 ] || { echo "it lacks ${missing[*]}"; return 1; }
}
# Why FOLDER's files differ from the pinned sums (and false), or nothing (and true).
pinned_sums() {
  local bad
  if ! bad=$(cd "$1" && sha256sum --quiet --strict -c "$sums" 2>&1); then
    echo "its files differ from testbed/inventory.sha256: $(echo "$bad" | paste -sd " ")"
    return 1
  fi
}
# Why CHECKOUT is not the pinned commit with the pinned files (and false), or nothing (and true).
verified() {
  local head
  head=$(git -C "$1" rev-parse HEAD 2>/dev/null) || { echo "no git checkout"; return 1; }
  case $head in
    "$COMMIT"*) ;;
    *) echo "its HEAD is $head, not the pinned $COMMIT"; return 1 ;;
  esac
  pinned_sums "$1"
}

# 1. the source
checkout=$cache/cluster-inventory-api/$COMMIT
if [ -n "${XCC_CLUSTER_INVENTORY:-}" ]; then
  [ -d "$XCC_CLUSTER_INVENTORY" ] || die "XCC_CLUSTER_INVENTORY=$XCC_CLUSTER_INVENTORY is not a folder"
  why=$(laid_out "$XCC_CLUSTER_INVENTORY") ||
    die "XCC_CLUSTER_INVENTORY=$XCC_CLUSTER_INVENTORY does not hold the cluster-inventory-api snapshot ($why)"
  src=$(cd "$XCC_CLUSTER_INVENTORY" && pwd)
elif [ -d "$repo/../shared/cluster-inventory" ]; then
  src=$(cd "$repo/../shared/cluster-inventory" && pwd)
  why=$(laid_out "$src" && pinned_sums "$src") ||
    die "$src is not the pinned snapshot ($why): set XCC_CLUSTER_INVENTORY to use it anyway"
elif [ -d "$checkout/.git" ]; then
  why=$(verified "$checkout") ||
    die "the cached checkout $checkout is not the pinned snapshot ($why): delete it, or set XCC_CLUSTER_INVENTORY"
  src=$checkout
else
  $offline && die "no cluster-inventory-api: XCC_CLUSTER_INVENTORY is not set, there is no ../shared/cluster-inventory, and $checkout is not fetched: $outside"
  command -v git >/dev/null ||
    die "git is not installed: install it, or set XCC_CLUSTER_INVENTORY to a checkout of $URL at $COMMIT"
  # the whole history (commits and trees; blobs on checkout): a short pin is resolved and
  # checked against what the server sent, never taken on its word
  mkdir -p "$cache/cluster-inventory-api"
  fetch=$(mktemp -d "$cache/cluster-inventory-api/fetch.XXXXXX")
  # shellcheck disable=SC2064
  trap "rm -rf '$fetch'" EXIT
  fail() {
    die "cannot fetch $URL at $COMMIT with git ($1): set XCC_CLUSTER_INVENTORY to a checkout of it"
  }
  if ! err=$(GIT_TERMINAL_PROMPT=0 git clone --quiet --no-checkout --filter=blob:none "$URL" "$fetch/repo" 2>&1); then
    fail "$(echo "$err" | grep -v '^\s*$' | tail -1 | sed 's/^fatal: //')"
  fi
  full=$(git -C "$fetch/repo" rev-parse --verify --quiet "$COMMIT^{commit}") || fail "no commit $COMMIT there"
  if ! err=$(git -C "$fetch/repo" -c advice.detachedHead=false checkout --quiet "$full" 2>&1); then
    fail "$(echo "$err" | tail -1 | sed 's/^fatal: //')"
  fi
  why=$(verified "$fetch/repo") || die "the fetched $URL at $COMMIT is not the pinned snapshot ($why)"
  if ! mv -T "$fetch/repo" "$checkout" 2>/dev/null; then
    # another run fetched it first: use (and verify) its checkout
    why=$(verified "$checkout") ||
      die "the cached checkout $checkout is not the pinned snapshot ($why): delete it, or set XCC_CLUSTER_INVENTORY"
  fi
  rm -rf "$fetch"
  trap - EXIT
  log "fetched $URL at $full into $checkout"
  src=$checkout
fi

# 2. the folder, keyed by what it is built from: the sums of the files used (as they are in the
# source, so an unverified XCC_CLUSTER_INVENTORY that differs gets a folder of its own), the Go
# version and the build flags
command -v go >/dev/null || die "go is not installed"
export GOTOOLCHAIN=local CGO_ENABLED=0
key=$( (cd "$src" && sha256sum "${files[@]}"; go version; echo "${build_flags[*]}") |
  sha256sum | cut -c1-12)
out=$cache/bin/cluster-inventory-$COMMIT-$key
all=(multicluster.x-k8s.io_clusterprofiles.yaml secretreader-plugin LICENSE)
have() { local f; for f in "${all[@]}"; do [ -s "$out/$f" ] || return 1; done; [ -x "$out/secretreader-plugin" ]; }
if have; then echo "$out"; exit 0; fi
$offline && die "the secretreader plugin of $src is not built ($out is missing), and nothing is built inside the bed's namespace: $outside"

# 3. the build, from a copy of the files used, into a folder written whole and then renamed
mkdir -p "$cache/bin"
work=$(mktemp -d "$cache/bin/cluster-inventory.build.XXXXXX")
# shellcheck disable=SC2064
trap "rm -rf '$work'" EXIT
mkdir "$work/src" "$work/out"
(cd "$src" && tar -cf - "${files[@]}") | (cd "$work/src" && tar -xf -)
chmod -R u+w "$work/src"
log "building the secretreader plugin from $src at $COMMIT (under a minute to 4 minutes on two cores when cold)"
start=$SECONDS
(cd "$work/src" && go build "${build_flags[@]}" -o "$work/out/secretreader-plugin" "$plugin_pkg") >&2 ||
  die "building the secretreader plugin from $src failed (see the lines above)"
log "built in $((SECONDS - start)) s"
cp "$work/src/$crd" "$work/out/multicluster.x-k8s.io_clusterprofiles.yaml"
cp "$work/src/LICENSE" "$work/out/LICENSE"
chmod 755 "$work/out"
# an incomplete folder (an interrupted run's, or one changed by hand) is replaced
if [ -d "$out" ] && ! have; then rm -rf "$out"; fi
if ! mv -T "$work/out" "$out" 2>/dev/null; then
  # another run made it first: keep its folder
  :
fi
rm -rf "$work"
trap - EXIT
have || die "the plugin folder $out is incomplete"
echo "$out"
