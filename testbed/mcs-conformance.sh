#!/usr/bin/env bash
# Runs the upstream MCS API conformance suite (kubernetes-sigs/mcs-api conformance/ at a pinned
# commit, found or fetched by testbed/mcs-suite.sh) against clusters of the test bed:
#
#   testbed/mcs-conformance.sh [--contexts east,west] [--out DIR] [--suite DIR] [--version V]
#                              [--] [FLAG...]
#
#   --contexts  the bed's clusters (contexts of its kubeconfig) to test, the first the "remote"
#               that exports; each must have nodes (testbed/bed node NAME). Default: east,west.
#   --out       where report.yaml, report.html and conformance.log go (default: target/mcs-conformance)
#   --suite     the suite's folder, only read (default: what testbed/mcs-suite.sh finds:
#               $XCC_MCS_SUITE, else shared/mcs-conformance beside the repository, else a git
#               checkout of the pinned commit in the cache, fetched on first use)
#   --version   the implementation's version the report names (default: Cargo.toml's version and
#               the git commit, e.g. 0.1.0+g1234abc, "-dirty" with uncommitted changes)
#   --build-only  only build (or find) the test binary and print its path
#   FLAG...     passed to the test binary as they are: ginkgo's (-ginkgo.label-filter=Required,
#               -ginkgo.focus=..., -ginkgo.v, -ginkgo.timeout=2h) and the suite's
#               (-dns-domain, -skip-verify-eps-managed-by)
#
# Steps: (1) outside the bed's network namespace, where the Go module proxy is reachable, the test
# binary is built from a copy of the suite (`go test -c`, GOTOOLCHAIN=local, CGO_ENABLED=0) and
# cached by a hash of the suite's files and the Go version; (2) the stand-in images the suite
# hard-codes (testbed/mcs-images.sh) are imported into every node of each cluster; (3) the binary
# runs inside the bed's namespace (testbed/bed exec) with the bed's kubeconfig, in --out, where it
# writes its reports. The bed's clusters with nodes already have the MCS CRDs and CoreDNS serving
# clusterset.local (testbed/dns.sh). Exits with the suite's status (non-zero when a spec failed).
#
# Inside the bed's namespace (XCC_TESTBED_INSIDE set: a test run by `testbed/bed exec cargo test`,
# tests/mcs_conformance.rs) nothing can be downloaded, so nothing is built: the cached binary and
# the cached image archives are used (found by the same hashes; it fails with a hint when one is
# missing: run `testbed/mcs-conformance.sh --build-only` and `testbed/mcs-images.sh` outside first,
# as scripts/test does), the images are imported into the nodes, and the binary runs directly.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
cache=${XCC_CACHE:-$HOME/.cache/cross-cluster-controller}
die() { echo "mcs-conformance: $*" >&2; exit 1; }
log() { echo "mcs-conformance: $*" >&2; }

contexts=east,west
out=$repo/target/mcs-conformance
suite=""
version=""
build_only=false
while [ $# -gt 0 ]; do
  case $1 in
    --build-only) build_only=true; shift ;;
    --contexts) contexts=${2:?--contexts needs a value}; shift 2 ;;
    --out) out=${2:?--out needs a value}; shift 2 ;;
    --suite) suite=${2:?--suite needs a value}; shift 2 ;;
    --version) version=${2:?--version needs a value}; shift 2 ;;
    --) shift; break ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) break ;;
  esac
done
# no --suite: the pinned suite, found or fetched (its one line says what to set when it cannot)
if [ -z "$suite" ]; then suite=$(bash "$here/mcs-suite.sh") || exit 1; fi
[ -f "$suite/conformance_suite.go" ] || die "no MCS conformance suite at $suite (--suite or XCC_MCS_SUITE)"
suite=$(cd "$suite" && pwd)
inside=false
[ -z "${XCC_TESTBED_INSIDE:-}" ] || inside=true

# what the report says of the implementation: the project's name, version and home (the chart's
# source), and the organisation owning that repository
project=cross-cluster-controller
url=$(sed -n '/^sources:/{n;s/^ *- *//p}' "$repo/charts/cross-cluster-controller/Chart.yaml")
organization=$(echo "$url" | sed -n 's#^https://github.com/\([^/]*\)/.*#\1#p')
if [ -z "$version" ]; then
  version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$repo/Cargo.toml" | head -1)
  if commit=$(git -C "$repo" rev-parse --short HEAD 2>/dev/null); then
    version="$version+g$commit"
    git -C "$repo" diff --quiet HEAD 2>/dev/null || version="$version-dirty"
  fi
fi

# 1. the test binary, cached by the suite's content (names and bytes), the Go toolchain and the
# build flags (-trimpath: the reports name the suite's files by module path, not by a temporary
# build folder). Upstream's go.mod replaces sigs.k8s.io/mcs-api with `..` (the repository's
# root): then the root is part of the build, and of the key (shared/'s snapshot dropped that
# replace: see its PROVENANCE.md).
command -v go >/dev/null || die "go is not installed"
export GOTOOLCHAIN=local CGO_ENABLED=0
build_flags=(-trimpath)
tree=$suite
if grep -Eq '^replace sigs\.k8s\.io/mcs-api => \.\./?$' "$suite/go.mod"; then tree=$(dirname "$suite"); fi
key=$( (cd "$tree" && find . -path ./.git -prune -o -type f -print0 | LC_ALL=C sort -z |
  xargs -0 sha256sum; go version; echo "${build_flags[*]}") | sha256sum | cut -c1-16)
binary="$cache/mcs-conformance/$key/conformance.test"
if [ ! -x "$binary" ] && $inside; then
  die "the suite's test binary for this suite and Go version is not built ($binary is missing), and nothing can be built inside the bed's namespace: run testbed/mcs-conformance.sh --build-only outside the bed first (scripts/test does)"
fi
if [ ! -x "$binary" ]; then
  mkdir -p "$cache/mcs-conformance"
  work=$(mktemp -d "$cache/mcs-conformance/build.XXXXXX")
  # shellcheck disable=SC2064
  trap "rm -rf '$work'" EXIT
  # a copy: the suite's folder is read-only (and go may write go.sum); with the root it replaces
  # to, the whole tree (its .git left out)
  mkdir "$work/src"
  (cd "$tree" && tar --exclude=./.git -cf - .) | (cd "$work/src" && tar -xf -)
  chmod -R u+w "$work/src"
  build=$work/src${suite#"$tree"}
  log "building the suite's test binary from $suite (about 80 s on two cores when cold)"
  (cd "$build" && go test -c "${build_flags[@]}" -o conformance.test .) >&2 || die "building the suite failed"
  mkdir -p "$(dirname "$binary")"
  mv "$build/conformance.test" "$binary.tmp"
  mv "$binary.tmp" "$binary"
  rm -rf "$work"
  trap - EXIT
fi
log "suite binary: $binary"
if $build_only; then echo "$binary"; exit 0; fi

# 2. the images the suite names, into every node of each cluster (built from Debian packages once)
# (inside the bed only the cached archives: mcs-images.sh --cached names the missing one)
if $inside; then
  images=$(bash "$here/mcs-images.sh" --cached) ||
    die "the stand-in images are not built: run testbed/mcs-images.sh outside the bed first (scripts/test does)"
else
  images=$(bash "$here/mcs-images.sh") || die "building the stand-in images failed"
fi
IFS=, read -r -a clusters <<<"$contexts"
for c in "${clusters[@]}"; do
  while read -r ref archive; do
    err=$(bash "$here/bed" import "$c" "$archive" 2>&1 >/dev/null) ||
      die "importing $ref into the nodes of '$c' failed (is it a cluster of the bed with nodes? testbed/bed node $c): $err"
  done <<<"$images"
  log "images imported into the nodes of '$c': $(cut -d' ' -f1 <<<"$images" | tr '\n' ' ')"
done

# 3. the run, inside the bed's namespace, in the output folder (the suite writes its reports in
# its working directory)
mkdir -p "$out"
out=$(cd "$out" && pwd)
rm -f "$out/report.yaml" "$out/report.html"
eval "$(bash "$here/bed" env)"
log "running the suite on $contexts ($project $version); output in $out"
# no colour codes unless a terminal shows them (conformance.log is plain text); a -ginkgo.no-color
# among the FLAGs, which come later, wins
color=()
[ -t 1 ] || color=(-ginkgo.no-color)
# outside, through `bed exec` into the bed's namespace; inside, directly
enter=(bash "$here/bed" exec)
! $inside || enter=()
set +e
# shellcheck disable=SC2016 # the inner script's $1 and $@ are its own
"${enter[@]}" bash -c 'cd "$1" && shift && exec "$@"' _ "$out" \
  "$binary" -kubeconfig "$XCC_TESTBED_KUBECONFIG" -contexts "$contexts" \
  -organization "$organization" -project "$project" -version "$version" -url "$url" \
  "${color[@]}" "$@" 2>&1 | tee "$out/conformance.log"
status=${PIPESTATUS[0]}
set -e
for f in report.yaml report.html; do [ -f "$out/$f" ] || log "the suite wrote no $f"; done
log "suite exited with status $status; reports: $out/report.yaml $out/report.html"
exit "$status"
