#!/usr/bin/env bash
# Builds kube-apiserver, kube-controller-manager, kubectl, etcd and helm from the published Go
# modules with this machine's Go toolchain, into a cache keyed by version (outside the repo).
# A second run with the same versions returns at once.
#
#   testbed/build.sh         the control-plane binaries every cluster of the bed runs
#   testbed/build.sh node    those, and kubelet, kube-scheduler and kube-proxy (same module, same
#                            version) and CoreDNS (coredns-vX.Y.Z, from its own module), which only
#                            a cluster with a node (testbed/bed node NAME) needs
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"
cache=${XCC_CACHE:-$HOME/.cache/cross-cluster-controller}
bin="$cache/bin/k8s-v$K8S_VERSION-etcd-v$ETCD_VERSION-helm-v$HELM_VERSION"
want=(kube-apiserver kube-controller-manager kubectl etcd helm)
node_want=(kubelet kube-scheduler kube-proxy)
[ "${1:-}" = node ] && want+=("${node_want[@]}" "coredns-v$COREDNS_VERSION")

have_all() { for b in "${want[@]}"; do [ -x "$bin/$b" ] || return 1; done; }
if have_all; then echo "$bin"; exit 0; fi

command -v go >/dev/null || { echo "testbed: go is not installed; .ci/run installs it" >&2; exit 1; }
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod
mkdir -p "$bin"
work=$(mktemp -d "$cache/build.XXXXXX")
trap 'rm -rf "$work"' EXIT

log() { echo "testbed build: $*" >&2; }

# kube-apiserver, kube-controller-manager and kubectl come from k8s.io/kubernetes, whose go.mod
# replaces every staging module with a local path; a wrapper module replaces them with the
# published v0.Y.Z versions instead. Arguments: the commands (under k8s.io/kubernetes/cmd/).
build_kubernetes() {
  local v=$K8S_VERSION minor_v="v0.${K8S_VERSION#1.}" d="$work/kubernetes" cmds=("$@")
  mkdir -p "$d"
  log "fetching k8s.io/kubernetes v$v"
  local gomod
  gomod=$(cd "$d" && go mod download -json "k8s.io/kubernetes@v$v" | sed -n 's/.*"GoMod": "\(.*\)",/\1/p')
  {
    echo "module xcc-testbed/kubernetes"
    grep -E '^go [0-9]' "$gomod"
    grep -E '^godebug' "$gomod" || true
    echo "require k8s.io/kubernetes v$v"
    # "k8s.io/foo => ./staging/src/k8s.io/foo" becomes "k8s.io/foo => k8s.io/foo v0.Y.Z"
    sed -n 's#^[[:space:]]*\(k8s.io/[^ ]*\) => ./staging/src/.*#replace \1 => \1 '"$minor_v"'#p' "$gomod"
    # tool directives keep the requirement (and its exact version) through go mod tidy
    echo "tool ("
    printf '\tk8s.io/kubernetes/cmd/%s\n' "${cmds[@]}"
    echo ")"
  } >"$d/go.mod"
  local ldflags="-s -w -X k8s.io/component-base/version.gitVersion=v$v \
    -X k8s.io/component-base/version.gitMajor=${v%%.*} \
    -X k8s.io/component-base/version.gitMinor=$(echo "$v" | cut -d. -f2) \
    -X k8s.io/client-go/pkg/version.gitVersion=v$v \
    -X k8s.io/component-base/version.gitTreeState=clean"
  log "building ${cmds[*]} v$v (several minutes when cold)"
  (cd "$d" && go mod tidy >&2 &&
   grep -qE "k8s.io/kubernetes v$v( |$)" go.mod &&
   go build -trimpath -ldflags "$ldflags" -o "$bin/" "${cmds[@]/#/k8s.io/kubernetes/cmd/}")
}

build_etcd() {
  local d="$work/etcd"
  mkdir -p "$d"
  log "building etcd v$ETCD_VERSION"
  (cd "$d" && go mod init xcc-testbed/etcd >/dev/null 2>&1 &&
   go get "go.etcd.io/etcd/server/v3@v$ETCD_VERSION" >/dev/null 2>&1 &&
   go build -trimpath -ldflags "-s -w" -o "$bin/etcd" go.etcd.io/etcd/server/v3)
}

# CoreDNS's go.mod has no replace directives: a wrapper module requiring it builds its main package
# with exactly the versions its go.mod names.
build_coredns() {
  local d="$work/coredns"
  mkdir -p "$d"
  log "building coredns v$COREDNS_VERSION (minutes when cold)"
  (cd "$d" && go mod init xcc-testbed/coredns >/dev/null 2>&1 &&
   go get "github.com/coredns/coredns@v$COREDNS_VERSION" >&2 &&
   go build -trimpath -ldflags "-s -w" -o "$bin/coredns-v$COREDNS_VERSION" github.com/coredns/coredns)
}

build_helm() {
  log "building helm v$HELM_VERSION"
  GOBIN="$bin" go install -trimpath -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=v$HELM_VERSION" \
    "helm.sh/helm/v3/cmd/helm@v$HELM_VERSION"
}

[ -x "$bin/kube-apiserver" ] && [ -x "$bin/kube-controller-manager" ] && [ -x "$bin/kubectl" ] ||
  build_kubernetes kube-apiserver kube-controller-manager kubectl
if [ "${1:-}" = node ]; then
  # CGO_ENABLED=0 as for the others: a static kubelet, nothing to link on the machine
  [ -x "$bin/kubelet" ] && [ -x "$bin/kube-scheduler" ] && [ -x "$bin/kube-proxy" ] || build_kubernetes "${node_want[@]}"
  [ -x "$bin/coredns-v$COREDNS_VERSION" ] || build_coredns
fi
[ -x "$bin/etcd" ] || build_etcd
[ -x "$bin/helm" ] || build_helm
have_all || { echo "testbed build: some binaries are missing in $bin after the build" >&2; exit 1; }
echo "$bin"
