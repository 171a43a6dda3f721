# shellcheck shell=bash
# One node for a cluster of the test bed (sourced by testbed/bed; see `testbed/bed node NAME`).
#
# A node is containerd (Debian's, with runc) and a kubelet of the pinned Kubernetes version, both
# plain processes recorded and signalled by PID and start time like the rest of the bed (proc.sh).
# They run in a mount namespace of the node's own (kept by a bind mount on $nd/mntns), so that:
#   - the container root filesystems, the kubelet's volume mounts and the shims' sockets
#     (a tmpfs on /run/containerd there) never appear on the host and go with the namespace;
#   - kubelet finds the kernel tunables it insists on (vm.overcommit_memory=1, kernel.panic=10,
#     kernel.panic_on_oops=1, ...) as files bound over /proc/sys in that namespace only: left to
#     itself it would rewrite them for the whole machine (protectKernelDefaults: false) or refuse
#     to start (true). The host's values are never changed.
# The network namespace is the host's: pods use hostNetwork (no pod network, no kube-proxy), and
# the node's address is 127.0.0.1.
#
# Layout under $dir/NAME/node: containerd.toml, containerd/ (root, state, socket), cni/ (a
# loopback-only conflist, enough for the CRI to report NetworkReady), kubelet.yaml,
# kubelet.kubeconfig, kubelet/ (--root-dir), logs/ (pod logs), sysctl/, mntns, ports.

# The sandbox image every pod's pause container runs; built locally (no registry here).
NODE_PAUSE_IMAGE=testbed.invalid/pause:1

node_dir() { echo "$dir/$1/node"; }
node_name() { echo "$1-node"; }
is_node_cluster() { [ -f "$dir/$1/with-node" ]; }

containerd_bin() { command -v containerd || echo /usr/bin/containerd; }

node_need_packages() {
  local missing=()
  for t in containerd ctr runc buildah nsenter unshare gcc; do command -v "$t" >/dev/null || missing+=("$t"); done
  [ -x /usr/lib/cni/loopback ] || missing+=(/usr/lib/cni/loopback)
  [ ${#missing[@]} -eq 0 ] ||
    die "a node needs ${missing[*]}: apt-get install -y containerd runc containernetworking-plugins buildah gcc libc6-dev util-linux (.ci/run does)"
}

node_ports() {
  local f
  f="$(node_dir "$1")/ports"
  [ -f "$f" ] || echo "kubelet=$(free_port) kubelet_healthz=$(free_port)" >"$f"
  # shellcheck disable=SC1090
  source <(tr ' ' '\n' <"$f")
}

# The kubelet's client certificate (the node identity the Node authorizer knows), its serving
# certificate (valid for 127.0.0.1, so the apiserver verifies it), and the apiserver's client
# certificate for kubelets (logs, exec, port-forward), all signed by the cluster's CA.
make_node_pki() {
  local c=$1 p="$dir/$1/pki" n
  n=$(node_name "$c")
  [ -f "$p/apiserver-kubelet-client.crt" ] && return 0
  (
    cd "$p"
    sign() { # NAME SUBJECT EXTENSIONS
      openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "$2" \
        -keyout "$1.key" -out "$1.csr" 2>/dev/null
      printf '%b' "$3" >"$1.ext"
      openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 \
        -extfile "$1.ext" -out "$1.crt" 2>/dev/null
      rm -f "$1.csr" "$1.ext"
    }
    sign kubelet-client "/O=system:nodes/CN=system:node:$n" 'extendedKeyUsage=clientAuth\n'
    sign kubelet-serving "/CN=$n" "subjectAltName=IP:127.0.0.1,DNS:$n,DNS:localhost\nextendedKeyUsage=serverAuth\n"
    sign apiserver-kubelet-client "/O=system:masters/CN=$c-apiserver-kubelet-client" 'extendedKeyUsage=clientAuth\n'
  )
}

write_node_config() {
  local c=$1 nd p="$dir/$1/pki" n
  nd=$(node_dir "$c")
  n=$(node_name "$c")
  ports "$c"
  node_ports "$c"
  mkdir -p "$nd/containerd" "$nd/cni" "$nd/kubelet" "$nd/logs" "$nd/sysctl"
  cat >"$nd/containerd.toml" <<EOF
version = 2
root = "$nd/containerd/root"
state = "$nd/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "$nd/containerd/containerd.sock"
[ttrpc]
  address = "$nd/containerd/containerd.sock.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "$nd/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$NODE_PAUSE_IMAGE"
  # root here lacks CAP_SYS_RESOURCE: a negative oom_score_adj is refused and runc fails
  restrict_oom_score_adj = true
  enable_selinux = false
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$nd/cni"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "$(command -v runc)"
        # cgroup v1 host, no systemd: the cgroupfs driver (kubelet's cgroupDriver matches)
        SystemdCgroup = false
EOF
  # written once: containerd watches the directory and would read it half-written on a restart
  [ -f "$nd/cni/10-loopback.conflist" ] || cat >"$nd/cni/10-loopback.conflist" <<EOF
{"cniVersion": "1.0.0", "name": "testbed-loopback", "plugins": [{"type": "loopback"}]}
EOF
  cat >"$nd/kubelet.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: $c
  cluster: {server: "https://127.0.0.1:$apiserver", certificate-authority: "$p/ca.crt"}
users:
- name: $n
  user: {client-certificate: "$p/kubelet-client.crt", client-key: "$p/kubelet-client.key"}
contexts:
- name: $n
  context: {cluster: $c, user: $n}
current-context: $n
EOF
  cat >"$nd/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix://$nd/containerd/containerd.sock
address: 127.0.0.1
port: $kubelet
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $kubelet_healthz
tlsCertFile: $p/kubelet-serving.crt
tlsPrivateKeyFile: $p/kubelet-serving.key
# the apiserver's client certificate (O=system:masters) is checked against the cluster's CA;
# what it may do is asked of the apiserver (SubjectAccessReview), as on a real node
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $p/ca.crt}
authorization:
  mode: Webhook
# cgroup v1, no systemd: cgroupfs; no QoS cgroup tree (hugetlb, net_cls, perf_event are not
# mounted here), so nothing to enforce node allocatable on
cgroupDriver: cgroupfs
failCgroupV1: false
cgroupsPerQOS: false
enforceNodeAllocatable: []
# the namespace's /proc/sys holds the values kubelet wants (see testbed/node.sh)
protectKernelDefaults: true
# the host's iptables are not the bed's to change
makeIPTablesUtilChains: false
failSwapOn: false
podLogsDir: $nd/logs
# the disk is shared with others: neither evict pods nor collect images because of its fill
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
maxPods: 30
serializeImagePulls: false
EOF
}

# The node's mount namespace: created once, kept until `bed down` unmounts it.
node_ns_ready() { grep -q " $(node_dir "$1")/mntns " /proc/self/mountinfo; }

make_node_ns() {
  local c=$1 nd f v
  nd=$(node_dir "$c")
  node_ns_ready "$c" && return 0
  touch "$nd/mntns"
  mkdir -p /run/containerd
  unshare --mount="$nd/mntns" --propagation private true
  in_node_ns "$c" mount -t tmpfs -o mode=0711 testbed-node /run/containerd
  # the values kubelet's setupKernelTunables wants, as files bound over /proc/sys in here only
  for f in vm/overcommit_memory=1 vm/panic_on_oom=0 kernel/panic=10 kernel/panic_on_oops=1 \
    kernel/keys/root_maxkeys=1000000 kernel/keys/root_maxbytes=25000000; do
    v=${f#*=}
    f=${f%=*}
    echo "$v" >"$nd/sysctl/${f//\//.}"
    in_node_ns "$c" mount --bind "$nd/sysctl/${f//\//.}" "/proc/sys/$f"
  done
}

in_node_ns() { local c=$1; shift; nsenter --mount="$(node_dir "$c")/mntns" -- "$@"; }

# The pause program, compiled static and packaged from scratch, cached by its source's hash.
pause_archive() {
  local src="$here/node/pause.c" cache=${XCC_CACHE:-$HOME/.cache/cross-cluster-controller} sum out
  sum=$(sha256sum "$src" | cut -c1-16)
  out="$cache/images/pause-$sum.tar"
  if [ ! -f "$out" ]; then
    mkdir -p "$cache/images"
    local w
    w=$(mktemp -d "$cache/images/build.XXXXXX")
    gcc -static -Os -o "$w/pause" "$src" >&2 || { rm -rf "$w"; die "compiling $src failed"; }
    build_image "$w" "$NODE_PAUSE_IMAGE" "$w/pause" 65535 "$w/pause.tar" || { rm -rf "$w"; die "packaging the pause image failed"; }
    mv "$w/pause.tar" "$out"
    rm -rf "$w"
  fi
  echo "$out"
}

# build_image WORKDIR REF BINARY UID ARCHIVE [ARG...]: an image FROM scratch holding BINARY as
# /NAME (its entrypoint, with ARGs), the shared libraries it links (none for a static one) at
# their paths, user UID:UID; written as an OCI archive. buildah with vfs storage in WORKDIR.
build_image() {
  local w=$1 ref=$2 binary=$3 uid=$4 archive=$5 ctr_id lib name
  shift 5
  name=/$(basename "$binary")
  local b=(buildah --storage-driver vfs --root "$w/storage" --runroot "$w/run")
  ctr_id=$("${b[@]}" from scratch) || return 1
  "${b[@]}" copy "$ctr_id" "$binary" "$name" >/dev/null || return 1
  # a dynamic binary takes its libraries (and loader) along: path => resolved file
  for lib in $(ldd "$binary" 2>/dev/null | grep -o '/[^ ]*' || true); do
    "${b[@]}" copy "$ctr_id" "$(readlink -f "$lib")" "$lib" >/dev/null || return 1
  done
  local ep
  ep=$(python3 -c 'import json,sys; print(json.dumps(sys.argv[1:]))' "$name" "$@")
  "${b[@]}" config --entrypoint "$ep" --cmd '' --user "$uid:$uid" "$ctr_id" || return 1
  "${b[@]}" commit -q "$ctr_id" "$ref" >/dev/null || return 1
  "${b[@]}" push -q "$ref" "oci-archive:$archive:$ref" || return 1
  "${b[@]}" rm "$ctr_id" >/dev/null || true
}

node_ctr() { local c=$1; shift; ctr --address "$(node_dir "$c")/containerd/containerd.sock" -n k8s.io "$@"; }

# import_image CLUSTER ARCHIVE: into the node's containerd (k8s.io namespace, what the CRI sees),
# under the name the archive carries.
import_image() {
  node_ctr "$1" images import --no-unpack=false "$2" >/dev/null ||
    die "importing $2 into the node of '$1' failed"
}

# node_addresses CLUSTER: the node's addresses once it has registered. kubelet refuses a loopback
# --node-ip ("nodeIP can't be loopback address", logged at every status update) and then leaves
# status.addresses as they are; the bed sets them to InternalIP 127.0.0.1 (where the kubelet
# listens, and the IP SAN of its serving certificate) and Hostname, so hostNetwork pods get
# 127.0.0.1 as their IP and the apiserver reaches the kubelet. No other address of this machine
# is used: the node's traffic stays on loopback.
node_addresses() {
  local c=$1 n k
  n=$(node_name "$c")
  k=("$bin/kubectl" --kubeconfig "$dir/$c/admin.kubeconfig")
  "${k[@]}" get node "$n" -o jsonpath='{.status.addresses[?(@.type=="InternalIP")].address}' 2>/dev/null |
    grep -qx 127.0.0.1 && return 0
  "${k[@]}" get node "$n" >/dev/null 2>&1 || return 1
  "${k[@]}" patch node "$n" --subresource status --type merge \
    -p "{\"status\":{\"addresses\":[{\"type\":\"InternalIP\",\"address\":\"127.0.0.1\"},{\"type\":\"Hostname\",\"address\":\"$n\"}]}}" >/dev/null 2>&1
}

wait_node_ready() {
  local c=$1 nd n deadline=$((SECONDS + ${XCC_TESTBED_NODE_TIMEOUT:-120})) st=""
  nd=$(node_dir "$c")
  n=$(node_name "$c")
  node_ports "$c"
  while :; do
    # the kubelet itself answers (a Ready condition can be left over from before a restart)
    if curl -sf --max-time 2 "http://127.0.0.1:$kubelet_healthz/healthz" >/dev/null 2>&1 &&
      node_addresses "$c"; then
      st=$("$bin/kubectl" --kubeconfig "$dir/$c/admin.kubeconfig" get node "$n" \
        -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null || true)
      [ "$st" = True ] && return 0
    fi
    for part in containerd kubelet; do
      part_running "$c" $part && continue
      echo "testbed: $part of the node of '$c' exited; last lines of $nd/$part.log:" >&2
      tail -n 20 "$nd/$part.log" >&2
      exit 1
    done
    if [ $SECONDS -ge $deadline ]; then
      echo "testbed: node $n of '$c' not Ready in time (Ready=${st:-absent}); last lines of $nd/kubelet.log:" >&2
      tail -n 20 "$nd/kubelet.log" >&2
      exit 1
    fi
    sleep 0.3
  done
}

start_node() {
  local c=$1 nd
  nd=$(node_dir "$c")
  node_need_packages
  mkdir -p "$nd"
  make_node_pki "$c"
  write_node_config "$c"
  make_node_ns "$c"
  if ! part_running "$c" containerd; then
    setsid nsenter --mount="$nd/mntns" -- "$(containerd_bin)" --config "$nd/containerd.toml" \
      >>"$nd/containerd.log" 2>&1 </dev/null 9>&- &
    proc_record $! "$nd/containerd.pid"
    local deadline=$((SECONDS + 30))
    until node_ctr "$c" version >/dev/null 2>&1; do
      proc_alive "$nd/containerd.pid" || { tail -n 15 "$nd/containerd.log" >&2; die "containerd of '$c' exited during start-up"; }
      [ $SECONDS -lt $deadline ] || { tail -n 15 "$nd/containerd.log" >&2; die "containerd of '$c' not answering in 30s"; }
      sleep 0.1
    done
  fi
  node_ctr "$c" images ls -q | grep -qx "$NODE_PAUSE_IMAGE" || import_image "$c" "$(pause_archive)"
  if ! part_running "$c" kubelet; then
    setsid nsenter --mount="$nd/mntns" -- "$bin/kubelet" --root-dir "$nd/kubelet" \
      --config "$nd/kubelet.yaml" --kubeconfig "$nd/kubelet.kubeconfig" \
      --cert-dir "$nd/kubelet/pki" --hostname-override "$(node_name "$c")" --node-ip 127.0.0.1 \
      >>"$nd/kubelet.log" 2>&1 </dev/null 9>&- &
    proc_record $! "$nd/kubelet.pid"
  fi
  wait_node_ready "$c"
}

# stop_node CLUSTER SIGNAL: the kubelet, then containerd. The pods' containers keep running under
# their shims, as when a real node's agents restart; start_node picks them up again.
stop_node() {
  signal_part "$1" kubelet "$2"
  signal_part "$1" containerd "$2"
}

# remove_node CLUSTER: every container of the node, its processes and its mount namespace, so the
# node's directory can be deleted. Containers go through containerd when it answers; whatever is
# left (containerd killed before) is found by the shims' command lines, which name this node's
# socket: the shims' children (each container's first process) and the shims get SIGKILL.
remove_node() {
  local c=$1 nd sock t pid child
  nd=$(node_dir "$c")
  [ -d "$nd" ] || return 0
  sock="$nd/containerd/containerd.sock"
  signal_part "$c" kubelet TERM
  if part_running "$c" containerd; then
    for t in $(node_ctr "$c" tasks ls -q 2>/dev/null); do
      node_ctr "$c" tasks kill -a -s SIGKILL "$t" >/dev/null 2>&1 || true
    done
    for t in $(node_ctr "$c" tasks ls -q 2>/dev/null); do
      node_ctr "$c" tasks rm -f "$t" >/dev/null 2>&1 || true
    done
    for t in $(node_ctr "$c" containers ls -q 2>/dev/null); do
      node_ctr "$c" containers rm "$t" >/dev/null 2>&1 || true
    done
  fi
  signal_part "$c" containerd TERM
  for pid in $(pgrep -f -- "-address $sock" 2>/dev/null || true); do
    proc_record "$pid" "$nd/shim.pid"
    proc_is "$nd/shim.pid" /usr/bin/containerd-shim-runc-v2 "-address $sock" || continue
    for child in $(pgrep -P "$pid" 2>/dev/null || true); do
      # still the shim's child (not a recycled PID) when signalled
      [ "$(proc_ppid "$child")" = "$pid" ] || continue
      kill -KILL "$child" 2>/dev/null || true
    done
    proc_signal "$nd/shim.pid" /usr/bin/containerd-shim-runc-v2 "-address $sock" KILL
  done
  rm -f "$nd/shim.pid"
  # containerd removes a task's cgroups (/k8s.io/ID in every v1 hierarchy) when the task is
  # deleted; after a SIGKILL it could not: remove those of this node's tasks (the ids are the
  # directories of containerd's task state), once empty. rmdir never removes a cgroup in use.
  local ids=() id cg deadline=$((SECONDS + 10))
  for id in "$nd"/containerd/state/io.containerd.runtime.v2.task/k8s.io/*; do
    [ -d "$id" ] && ids+=("$(basename "$id")")
  done
  for id in "${ids[@]}"; do
    for cg in /sys/fs/cgroup/*/k8s.io/"$id"; do
      [ -d "$cg" ] || continue
      until rmdir "$cg" 2>/dev/null; do
        [ $SECONDS -lt $deadline ] || { log "cgroup $cg still in use; left in place"; break; }
        sleep 0.1
      done
    done
  done
  rmdir /sys/fs/cgroup/*/k8s.io 2>/dev/null || true
  if node_ns_ready "$c"; then umount "$nd/mntns" || umount -l "$nd/mntns"; fi
}
