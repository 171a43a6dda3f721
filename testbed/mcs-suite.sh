#!/usr/bin/env bash
# Finds the upstream MCS API conformance suite (the `conformance/` folder of
# kubernetes-sigs/mcs-api at the commit pinned below) and prints its folder:
#
#   testbed/mcs-suite.sh [--offline]
#
# 1. $XCC_MCS_SUITE, when set (it must hold the suite: conformance_suite.go);
# 2. else ../shared/mcs-conformance beside the repository, where it exists (our CI's snapshot:
#    see its PROVENANCE.md);
# 3. else a git checkout of the pinned commit in the cache ($XCC_CACHE, default
#    ~/.cache/cross-cluster-controller/mcs-api/<commit>), fetched with git on first use from
#    https://github.com/kubernetes-sigs/mcs-api (the whole repository: the suite's go.mod
#    replaces sigs.k8s.io/mcs-api with `..`, its root). The checkout is verified every time: its
#    HEAD must be the pinned commit and the suite's sources must have the pinned sha256 sums
#    (testbed/mcs-suite.sha256).
#
# --offline (inside the bed's namespace, where nothing can be fetched; XCC_TESTBED_INSIDE set
# implies it): step 3 only uses the cache. Without the network git fails, and so does this, with
# one line naming what to set (XCC_MCS_SUITE); never a skip.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
cache=${XCC_CACHE:-$HOME/.cache/cross-cluster-controller}
die() { echo "mcs-suite: $*" >&2; exit 1; }

# the pinned upstream commit: master of 2026-05-07 (conformance tag v0.5.0 plus longer pod
# start-up timeouts, kubernetes-sigs/mcs-api#154), the commit of shared/mcs-conformance
COMMIT=ded161a
URL=https://github.com/kubernetes-sigs/mcs-api
sums=$here/mcs-suite.sha256

offline=false
[ -z "${XCC_TESTBED_INSIDE:-}" ] || offline=true
case ${1:-} in
  --offline) offline=true ;;
  "") ;;
  *) die "unknown argument '$1' (--offline)" ;;
esac

if [ -n "${XCC_MCS_SUITE:-}" ]; then
  [ -f "$XCC_MCS_SUITE/conformance_suite.go" ] ||
    die "XCC_MCS_SUITE=$XCC_MCS_SUITE holds no MCS conformance suite (no conformance_suite.go)"
  cd "$XCC_MCS_SUITE" && pwd
  exit 0
fi
if [ -f "$repo/../shared/mcs-conformance/conformance_suite.go" ]; then
  cd "$repo/../shared/mcs-conformance" && pwd
  exit 0
fi

# Why CHECKOUT is not the pinned suite (and false), or nothing (and true): its HEAD must be the
# pinned commit and the suite's sources must have the pinned sums.
verified() {
  local head bad
  head=$(git -C "$1" rev-parse HEAD 2>/dev/null) || { echo "no git checkout"; return 1; }
  case $head in
    "$COMMIT"*) ;;
    *) echo "its HEAD is $head, not the pinned $COMMIT"; return 1 ;;
  esac
  if ! bad=$(cd "$1/conformance" && sha256sum --quiet -c "$sums" 2>&1); then
    echo "its sources differ from testbed/mcs-suite.sha256: $(echo "$bad" | tr '\n' ' ')"
    return 1
  fi
}

checkout=$cache/mcs-api/$COMMIT
if [ -d "$checkout/.git" ]; then
  why=$(verified "$checkout") || die "the cached checkout $checkout is not the pinned suite ($why): delete it, or set XCC_MCS_SUITE"
  echo "$checkout/conformance"
  exit 0
fi
$offline && die "no MCS conformance suite: XCC_MCS_SUITE is not set, there is no ../shared/mcs-conformance, and $checkout is not fetched (run testbed/mcs-suite.sh outside the bed first; scripts/test does)"
command -v git >/dev/null || die "git is not installed: install it, or set XCC_MCS_SUITE to a checkout of $URL's conformance/ at $COMMIT"

# the whole history (commits and trees; blobs on checkout): a short pin is resolved and checked
# against what the server sent, never taken on its word
mkdir -p "$cache/mcs-api"
work=$(mktemp -d "$cache/mcs-api/fetch.XXXXXX")
# shellcheck disable=SC2064
trap "rm -rf '$work'" EXIT
fail() {
  die "cannot fetch the MCS conformance suite ($URL at $COMMIT) with git ($1): set XCC_MCS_SUITE to its conformance/ folder"
}
if ! err=$(GIT_TERMINAL_PROMPT=0 git clone --quiet --no-checkout --filter=blob:none "$URL" "$work/mcs-api" 2>&1); then
  fail "$(echo "$err" | grep -v '^\s*$' | tail -1 | sed 's/^fatal: //')"
fi
full=$(git -C "$work/mcs-api" rev-parse --verify --quiet "$COMMIT^{commit}") || fail "no commit $COMMIT there"
if ! err=$(git -C "$work/mcs-api" -c advice.detachedHead=false checkout --quiet "$full" 2>&1); then
  fail "$(echo "$err" | tail -1 | sed 's/^fatal: //')"
fi
why=$(verified "$work/mcs-api") || die "the fetched $URL at $COMMIT is not the pinned suite ($why)"
mv "$work/mcs-api" "$checkout"
echo "mcs-suite: fetched $URL at $full into $checkout" >&2
echo "$checkout/conformance"
