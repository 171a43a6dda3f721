# shellcheck shell=bash
# The nodes of a cluster of the test bed (sourced by testbed/bed; see `testbed/bed node NAME [COUNT]`).
#
# A node is containerd (Debian's, with runc) and a kubelet of the pinned Kubernetes version, both
# plain processes recorded and signalled by PID and start time like the rest of the bed (proc.sh).
# A cluster has one node or more; node I (1, 2, ...) is NAME-node (I = 1) or NAME-node-I, with its
# own address 127.0.0.I (Linux routes all of 127/8 to lo: a process binds 127.0.0.2 as it binds
# 127.0.0.1), its own directory, ports, certificates, containerd (root, state, socket), mount
# namespace and cgroup root, and every command on a node's processes matches them by a path in
# that node's directory. What nodes (of this bed or another) share is the machine's: its network
# namespace, and /var/log/containers, where each kubelet links its containers' logs under names
# that hold the container's id.
# They run in a mount namespace of the node's own (kept by a bind mount on $nd/mntns), so that:
#   - the container root filesystems, the kubelet's volume mounts and the shims' sockets
#     (a tmpfs on /run/containerd there) never appear on the host and go with the namespace;
#   - kubelet finds the kernel tunables it insists on (vm.overcommit_memory=1, kernel.panic=10,
#     kernel.panic_on_oops=1, ...) as files bound over /proc/sys in that namespace only: left to
#     itself it would rewrite them for the whole machine (protectKernelDefaults: false) or refuse
#     to start (true). The host's values are never changed.
# The kubelet and containerd run in the bed's network namespace (testbed/net.sh; not the
# machine's): host-network pods bind their node's address 127.0.0.I there (and a pod on another
# node binds the same port on its own address). Every other pod is on the pod network: its veth
# and the CNI bridge live in the node's own network namespace ($nd/netns, where containerd's CNI
# plugins run through wrappers), with the node's kube-proxy (nftables) and routes to every other
# node's pod CIDR through the bed's bridge. The kubelet probes pods across that bridge.
# Cgroups (v1, cgroupfs driver): containerd names a task's cgroup <parent>/<container id>, and
# without a parent (what a kubelet with cgroupsPerQOS false passes) /<containerd namespace>/<id>:
# /k8s.io/<id> for every containerd on the machine, one parent shared by all. Each kubelet
# therefore runs the QoS tree (cgroupsPerQOS true) under a cgroupRoot of its own,
# /xcc-testbed-<hash of the node's directory>-<node name> (created by the bed in every v1
# hierarchy: the kubelet requires it to exist): a pod's containers live in
# <root>/kubepods/<qos>/pod<uid>/<id>, the kubelet manages and cleans up only under its root, and
# removing a node removes only cgroups under its root.
#
# Layout under $dir/NAME/node (node 1) or $dir/NAME/node-I: containerd.toml, containerd/ (root,
# state, socket, pods' network namespaces), cni/ (the pod network's conflist), cni-bin/ (plugin
# wrappers), cni-ipam/ (host-local's leases), kubelet.yaml, kubelet.kubeconfig, kubelet/
# (--root-dir), kube-proxy.yaml, kube-proxy.kubeconfig, logs/ (pod logs), sysctl/, mntns, netns,
# ports, and the pidfiles kubelet.pid, containerd.pid and proxy.pid.

# The sandbox image every pod's pause container runs; built locally (no registry here).
NODE_PAUSE_IMAGE=testbed.invalid/pause:1

# node_dir CLUSTER [I], node_name CLUSTER [I], node_ip CLUSTER [I]: of node I (default 1)
node_dir() { if [ "${2:-1}" = 1 ]; then echo "$dir/$1/node"; else echo "$dir/$1/node-$2"; fi; }
node_name() { if [ "${2:-1}" = 1 ]; then echo "$1-node"; else echo "$1-node-$2"; fi; }
node_ip() { echo "127.0.0.${2:-1}"; }
# node_zone CLUSTER [I]: node I's zone, given at registration (the kubelet's --node-labels; a
# zone relabelled on a running node crashed kube-controller-manager 1.34.4's node lifecycle
# controller here): two zones per cluster, odd nodes in <cluster>-a, even ones in <cluster>-b, in
# the region <cluster>, so no two clusters share a zone and a third node shares zone a with the
# first (tests/locality.rs unplugs a node whose zone keeps another node)
node_zone() { if [ $((${2:-1} % 2)) = 1 ]; then echo "$1-a"; else echo "$1-b"; fi; }
# part_of_node BASE I: the name `testbed/bed kill` knows a part of node I by (kubelet, kubelet-2, ...)
part_of_node() { if [ "${2:-1}" = 1 ]; then echo "$1"; else echo "$1-$2"; fi; }
# the cgroup parent of node I's pods (see the header)
node_cgroup_root() {
  local nd
  nd=$(node_dir "$1" "${2:-1}")
  echo "/xcc-testbed-$(printf '%s' "$nd" | sha256sum | cut -c1-8)-$(node_name "$1" "${2:-1}")"
}
is_node_cluster() { [ -f "$dir/$1/with-node" ]; }
# node_count CLUSTER: how many nodes it has (the number in its with-node file; empty means 1)
node_count() {
  local n=""
  [ -f "$dir/$1/with-node" ] && n=$(cat "$dir/$1/with-node")
  echo "${n:-1}"
}
node_indexes() { seq 1 "$(node_count "$1")"; }

containerd_bin() { command -v containerd || echo /usr/bin/containerd; }

node_need_packages() {
  local missing=()
  for t in containerd ctr runc buildah nsenter unshare gcc ip nft conntrack; do command -v "$t" >/dev/null || missing+=("$t"); done
  [ -x /usr/lib/cni/bridge ] && [ -x /usr/lib/cni/host-local ] && [ -x /usr/lib/cni/loopback ] || missing+=(/usr/lib/cni/bridge)
  [ ${#missing[@]} -eq 0 ] ||
    die "a node needs ${missing[*]}: bash scripts/install-prereqs (apt-get install containerd runc containernetworking-plugins buildah gcc libc6-dev util-linux iproute2 nftables conntrack)"
}

node_ports() {
  local f ip
  f="$(node_dir "$1" "$2")/ports"
  ip=$(node_ip "$1" "$2")
  [ -f "$f" ] || echo "kubelet=$(free_port "$ip") kubelet_healthz=$(free_port "$ip")" >"$f"
  # shellcheck disable=SC1090
  source <(tr ' ' '\n' <"$f")
}

# sign_cert PKI_DIR NAME SUBJECT EXTENSIONS: NAME.crt and NAME.key, signed by the cluster's CA.
sign_cert() {
  (
    cd "$1" || exit 1
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "$3" \
      -keyout "$2.key" -out "$2.csr" 2>/dev/null
    printf '%b' "$4" >"$2.ext"
    openssl x509 -req -in "$2.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 \
      -extfile "$2.ext" -out "$2.crt" 2>/dev/null
    rm -f "$2.csr" "$2.ext"
  )
}

# The apiserver's client certificate for kubelets (logs, exec, port-forward), signed by the
# cluster's CA; needed before the apiserver starts.
make_node_pki() {
  local c=$1 p="$dir/$1/pki"
  [ -f "$p/apiserver-kubelet-client.crt" ] ||
    sign_cert "$p" apiserver-kubelet-client "/O=system:masters/CN=$c-apiserver-kubelet-client" 'extendedKeyUsage=clientAuth\n'
  # kube-proxy's identity (bound to system:node-proxier by the bootstrap RBAC)
  [ -f "$p/kube-proxy.crt" ] ||
    sign_cert "$p" kube-proxy "/CN=system:kube-proxy" 'extendedKeyUsage=clientAuth\n'
}

# make_kubelet_pki CLUSTER I: node I's kubelet client certificate (the node identity the Node
# authorizer knows) and serving certificate (valid for the node's address, so the apiserver
# verifies it), NAME-client and NAME-serving in the cluster's pki directory.
make_kubelet_pki() {
  local c=$1 i=$2 p="$dir/$1/pki" n ip
  n=$(node_name "$c" "$i")
  ip=$(node_ip "$c" "$i")
  [ -f "$p/$n-serving.crt" ] && return 0
  sign_cert "$p" "$n-client" "/O=system:nodes/CN=system:node:$n" 'extendedKeyUsage=clientAuth\n'
  sign_cert "$p" "$n-serving" "/CN=$n" "subjectAltName=IP:$ip,DNS:$n\nextendedKeyUsage=serverAuth\n"
}

write_node_config() {
  local c=$1 i=$2 nd p="$dir/$1/pki" n ip
  nd=$(node_dir "$c" "$i")
  n=$(node_name "$c" "$i")
  ip=$(node_ip "$c" "$i")
  ports "$c"
  node_ports "$c" "$i"
  mkdir -p "$nd/containerd" "$nd/kubelet" "$nd/logs" "$nd/sysctl"
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
  stream_server_address = "$ip"
  stream_server_port = "0"
  # pods' network namespaces under the node's state directory, not the machine's /run/netns
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    # wrappers that run /usr/lib/cni's plugins in the node's network namespace (testbed/net.sh)
    bin_dir = "$nd/cni-bin"
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
  write_node_cni "$c" "$i"
  cat >"$nd/kubelet.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: $c
  cluster: {server: "https://127.0.0.1:$apiserver", certificate-authority: "$p/ca.crt"}
users:
- name: $n
  user: {client-certificate: "$p/$n-client.crt", client-key: "$p/$n-client.key"}
contexts:
- name: $n
  context: {cluster: $c, user: $n}
current-context: $n
EOF
  write_proxy_config "$c" "$i"
  cat >"$nd/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix://$nd/containerd/containerd.sock
address: $ip
port: $kubelet
readOnlyPort: 0
healthzBindAddress: $ip
healthzPort: $kubelet_healthz
tlsCertFile: $p/$n-serving.crt
tlsPrivateKeyFile: $p/$n-serving.key
# the apiserver's client certificate (O=system:masters) is checked against the cluster's CA;
# what it may do is asked of the apiserver (SubjectAccessReview), as on a real node
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $p/ca.crt}
authorization:
  mode: Webhook
# cgroup v1, no systemd: cgroupfs; the QoS tree under the node's own root (see the header),
# nothing reserved or enforced on it (the machine is shared)
cgroupDriver: cgroupfs
failCgroupV1: false
cgroupsPerQOS: true
cgroupRoot: $(node_cgroup_root "$c" "$i")
enforceNodeAllocatable: []
# the namespace's /proc/sys holds the values kubelet wants (see testbed/node.sh)
protectKernelDefaults: true
# the host's iptables are not the bed's to change
makeIPTablesUtilChains: false
failSwapOn: false
# CoreDNS (testbed/dns.sh) behind the cluster's DNS Service; no resolv.conf of the machine's
clusterDNS: [$(dns_ip "$c")]
clusterDomain: cluster.local
resolvConf: ""
podLogsDir: $nd/logs
# the disk is shared with others: neither evict pods nor collect images because of its fill
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
maxPods: 30
serializeImagePulls: false
EOF
}

# write_proxy_config CLUSTER I: node I's kube-proxy, in the node's network namespace, reaching its
# API server at the address pods use (the bed's loopback is not the node namespace's). nftables
# mode: one table of its own (ip/ip6 kube-proxy), replaced in one transaction, no iptables backend
# to pick; conntrack tunables left alone (they are the machine's, not the namespace's).
write_proxy_config() {
  local c=$1 i=$2 nd p="$dir/$1/pki"
  nd=$(node_dir "$c" "$i")
  cat >"$nd/kube-proxy.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: $c
  cluster: {server: "https://$(api_ip "$c"):$apiserver", certificate-authority: "$p/ca.crt"}
users:
- name: kube-proxy
  user: {client-certificate: "$p/kube-proxy.crt", client-key: "$p/kube-proxy.key"}
contexts:
- name: kube-proxy
  context: {cluster: $c, user: kube-proxy}
current-context: kube-proxy
EOF
  cat >"$nd/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $nd/kube-proxy.kubeconfig}
hostnameOverride: $(node_name "$c" "$i")
mode: nftables
clusterCIDR: $(cluster_pod_cidr "$c")
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
EOF
}

# Node I's mount namespace: created once, kept until `bed down` unmounts it.
node_ns_ready() { grep -q " $(node_dir "$1" "$2")/mntns " /proc/self/mountinfo; }

make_node_ns() {
  local c=$1 i=$2 nd f v
  nd=$(node_dir "$c" "$i")
  node_ns_ready "$c" "$i" && return 0
  touch "$nd/mntns"
  mkdir -p /run/containerd /var/lib/cni
  unshare --mount="$nd/mntns" --propagation private true
  in_node_ns "$c" "$i" mount -t tmpfs -o mode=0711 testbed-node /run/containerd
  # the CNI library's cache of results
  in_node_ns "$c" "$i" mount -t tmpfs -o mode=0700 testbed-node-cni /var/lib/cni
  # the values kubelet's setupKernelTunables wants, as files bound over /proc/sys in here only
  for f in vm/overcommit_memory=1 vm/panic_on_oom=0 kernel/panic=10 kernel/panic_on_oops=1 \
    kernel/keys/root_maxkeys=1000000 kernel/keys/root_maxbytes=25000000; do
    v=${f#*=}
    f=${f%=*}
    echo "$v" >"$nd/sysctl/${f//\//.}"
    in_node_ns "$c" "$i" mount --bind "$nd/sysctl/${f//\//.}" "/proc/sys/$f"
  done
}

# in_node_ns CLUSTER I COMMAND...
in_node_ns() { local c=$1 i=$2; shift 2; nsenter --mount="$(node_dir "$c" "$i")/mntns" -- "$@"; }

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

# node_ctr CLUSTER I ARG...: ctr on node I's containerd, namespace k8s.io (what the CRI sees)
node_ctr() { local c=$1 i=$2; shift 2; ctr --address "$(node_dir "$c" "$i")/containerd/containerd.sock" -n k8s.io "$@"; }

# import_image CLUSTER ARCHIVE [I]: into node I's containerd, or into every node's when I is
# not given (a pod may be scheduled on any of them), under the name the archive carries.
import_image() {
  local c=$1 archive=$2 i
  for i in ${3:-$(node_indexes "$c")}; do
    node_ctr "$c" "$i" images import --no-unpack=false "$archive" >/dev/null ||
      die "importing $archive into node $(node_name "$c" "$i") of '$c' failed"
  done
}

# node_addresses CLUSTER I: node I's addresses once it has registered. kubelet refuses a loopback
# --node-ip ("nodeIP can't be loopback address", logged at every status update) and then leaves
# status.addresses as they are; the bed sets them to InternalIP 127.0.0.I (where the kubelet
# listens, and the IP SAN of its serving certificate) and Hostname, so hostNetwork pods get
# 127.0.0.I as their IP and the apiserver reaches the kubelet. No other address of this machine
# is used: the node's traffic stays on loopback.
node_addresses() {
  local c=$1 i=$2 n k ip
  n=$(node_name "$c" "$i")
  ip=$(node_ip "$c" "$i")
  k=("$bin/kubectl" --kubeconfig "$dir/$c/admin.kubeconfig")
  "${k[@]}" get node "$n" -o jsonpath='{.status.addresses[?(@.type=="InternalIP")].address}' 2>/dev/null |
    grep -qx "$ip" && return 0
  "${k[@]}" get node "$n" >/dev/null 2>&1 || return 1
  "${k[@]}" patch node "$n" --subresource status --type merge \
    -p "{\"status\":{\"addresses\":[{\"type\":\"InternalIP\",\"address\":\"$ip\"},{\"type\":\"Hostname\",\"address\":\"$n\"}]}}" >/dev/null 2>&1
}

# node_pod_cidr_spec CLUSTER I: the node's pod CIDR (the one its pods' addresses come from, see
# net.sh) in its spec.podCIDR(s), as kube-controller-manager's node IPAM (--allocate-node-cidrs)
# sets it on a real cluster: the daemon reads it as a local network no remote address may be in.
# Set once (the API server refuses a change of a set podCIDR).
node_pod_cidr_spec() {
  local c=$1 i=$2 n cidr k
  n=$(node_name "$c" "$i")
  cidr=$(node_pod_cidr "$c" "$i")
  k=("$bin/kubectl" --kubeconfig "$dir/$c/admin.kubeconfig")
  [ -n "$("${k[@]}" get node "$n" -o jsonpath='{.spec.podCIDR}' 2>/dev/null)" ] && return 0
  "${k[@]}" patch node "$n" --type merge \
    -p "{\"spec\":{\"podCIDR\":\"$cidr\",\"podCIDRs\":[\"$cidr\"]}}" >/dev/null 2>&1
}

wait_node_ready() {
  local c=$1 i=$2 nd n ip deadline=$((SECONDS + ${XCC_TESTBED_NODE_TIMEOUT:-120})) st="" part
  nd=$(node_dir "$c" "$i")
  n=$(node_name "$c" "$i")
  ip=$(node_ip "$c" "$i")
  node_ports "$c" "$i"
  while :; do
    # the kubelet itself answers (a Ready condition can be left over from before a restart)
    if curl -sf --max-time 2 "http://$ip:$kubelet_healthz/healthz" >/dev/null 2>&1 &&
      node_addresses "$c" "$i" && node_pod_cidr_spec "$c" "$i"; then
      st=$("$bin/kubectl" --kubeconfig "$dir/$c/admin.kubeconfig" get node "$n" \
        -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null || true)
      [ "$st" = True ] && return 0
    fi
    for part in containerd kubelet proxy; do
      part_alive "$c" "$(part_of_node $part "$i")" && continue
      echo "testbed: $part of node $n of '$c' exited; last lines of $nd/$part.log:" >&2
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

# inotify_headroom: a kubelet holds 6 inotify instances, an API server 3, containerd 1, and the
# kernel's default allows 128 per user: a suite's dozen clusters, a few with nodes, come close,
# and a kubelet that gets none exits ("Failed to start cAdvisor" err="inotify_init: too many open
# files"). Raise the limit as kind's known issues advise (a kernel limit of this machine, not
# its network); where that is refused, warn with the figure so a failing kubelet is explained.
inotify_headroom() {
  local f=/proc/sys/fs/inotify/max_user_instances want=1024 have
  have=$(cat "$f")
  [ "$have" -ge "$want" ] && return 0
  if echo "$want" >"$f" 2>/dev/null; then
    echo "testbed: fs.inotify.max_user_instances raised from $have to $want (each kubelet holds 6)" >&2
  else
    echo "testbed: fs.inotify.max_user_instances is $have and cannot be raised here; kubelets may exit with 'inotify_init: too many open files'" >&2
  fi
}

# start_node CLUSTER I: node I's containerd (waited for: the pause image is imported) and kubelet
# (not waited for: wait_node_ready, so that the nodes of a cluster start side by side).
start_node() {
  local c=$1 i=$2 nd
  nd=$(node_dir "$c" "$i")
  node_need_packages
  inotify_headroom
  mkdir -p "$nd"
  make_node_pki "$c"
  make_kubelet_pki "$c" "$i"
  write_node_config "$c" "$i"
  make_node_netns "$c" "$i"
  make_node_ns "$c" "$i"
  if ! part_running "$c" "$(part_of_node containerd "$i")"; then
    setsid nsenter --mount="$nd/mntns" -- "$(containerd_bin)" --config "$nd/containerd.toml" \
      >>"$nd/containerd.log" 2>&1 </dev/null 9>&- &
    proc_record $! "$nd/containerd.pid"
    local deadline=$((SECONDS + 30))
    until node_ctr "$c" "$i" version >/dev/null 2>&1; do
      proc_alive "$nd/containerd.pid" || { tail -n 15 "$nd/containerd.log" >&2; die "containerd of node $i of '$c' exited during start-up"; }
      [ $SECONDS -lt $deadline ] || { tail -n 15 "$nd/containerd.log" >&2; die "containerd of node $i of '$c' not answering in 30s"; }
      sleep 0.1
    done
  fi
  node_ctr "$c" "$i" images ls -q | grep -qx "$NODE_PAUSE_IMAGE" || import_image "$c" "$(pause_archive)" "$i"
  if ! part_running "$c" "$(part_of_node kubelet "$i")"; then
    make_node_cgroup "$c" "$i"
    setsid nsenter --mount="$nd/mntns" -- "$bin/kubelet" --root-dir "$nd/kubelet" \
      --config "$nd/kubelet.yaml" --kubeconfig "$nd/kubelet.kubeconfig" \
      --cert-dir "$nd/kubelet/pki" --hostname-override "$(node_name "$c" "$i")" --node-ip "$(node_ip "$c" "$i")" \
      --node-labels "topology.kubernetes.io/zone=$(node_zone "$c" "$i"),topology.kubernetes.io/region=$c" \
      >>"$nd/kubelet.log" 2>&1 </dev/null 9>&- &
    proc_record $! "$nd/kubelet.pid"
  fi
  if ! part_running "$c" "$(part_of_node proxy "$i")"; then
    setsid nsenter --net="$nd/netns" -- "$bin/kube-proxy" --config "$nd/kube-proxy.yaml" \
      >>"$nd/proxy.log" 2>&1 </dev/null 9>&- &
    proc_record $! "$nd/proxy.pid"
  fi
}

# make_node_cgroup CLUSTER I: node I's cgroup root in every v1 hierarchy (the kubelet checks that
# it exists; below it, it creates what it needs).
make_node_cgroup() {
  local root h
  root=$(node_cgroup_root "$1" "$2")
  for h in /sys/fs/cgroup/*/; do
    [ "$h" = /sys/fs/cgroup/unified/ ] && continue
    mkdir -p "$h${root#/}"
  done
}

# start_nodes CLUSTER: every node of the cluster, then waits until each is Ready.
start_nodes() {
  local c=$1 i
  for i in $(node_indexes "$c"); do start_node "$c" "$i"; done
  for i in $(node_indexes "$c"); do wait_node_ready "$c" "$i"; done
}

# stop_node CLUSTER I SIGNAL: node I's kubelet, then its containerd. The pods' containers keep
# running under their shims, as when a real node's agents restart; start_node picks them up again.
stop_node() {
  signal_part "$1" "$(part_of_node proxy "$2")" "$3"
  signal_part "$1" "$(part_of_node kubelet "$2")" "$3"
  signal_part "$1" "$(part_of_node containerd "$2")" "$3"
}

# remove_node CLUSTER I: every container of node I, its processes, cgroups and mount namespace,
# so the node's directory can be deleted. Containers go through containerd when it answers;
# whatever is left (containerd killed before) is found by the shims' command lines, which name
# this node's socket: the shims' children (each container's first process) and the shims get
# SIGKILL. Nothing of another node is matched: its socket and cgroup parent are other paths.
remove_node() {
  local c=$1 i=$2 nd sock t pid child
  nd=$(node_dir "$c" "$i")
  [ -d "$nd" ] || return 0
  sock="$nd/containerd/containerd.sock"
  signal_part "$c" "$(part_of_node proxy "$i")" TERM
  signal_part "$c" "$(part_of_node kubelet "$i")" TERM
  if part_running "$c" "$(part_of_node containerd "$i")"; then
    for t in $(node_ctr "$c" "$i" tasks ls -q 2>/dev/null); do
      node_ctr "$c" "$i" tasks kill -a -s SIGKILL "$t" >/dev/null 2>&1 || true
    done
    for t in $(node_ctr "$c" "$i" tasks ls -q 2>/dev/null); do
      node_ctr "$c" "$i" tasks rm -f "$t" >/dev/null 2>&1 || true
    done
    for t in $(node_ctr "$c" "$i" containers ls -q 2>/dev/null); do
      node_ctr "$c" "$i" containers rm "$t" >/dev/null 2>&1 || true
    done
  fi
  signal_part "$c" "$(part_of_node containerd "$i")" TERM
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
  # containerd removes a task's cgroups (<node's cgroup parent>/ID in every v1 hierarchy) when
  # the task is deleted; after a SIGKILL it could not: remove what is left under this node's
  # parent, deepest first, then the parent. rmdir never removes a cgroup in use.
  local root cg deadline=$((SECONDS + 10))
  root=$(node_cgroup_root "$c" "$i")
  for cg in $(find /sys/fs/cgroup/*"$root" -depth -type d 2>/dev/null || true); do
    until rmdir "$cg" 2>/dev/null; do
      [ $SECONDS -lt $deadline ] || { log "cgroup $cg still in use; left in place"; break; }
      sleep 0.1
    done
  done
  if node_ns_ready "$c" "$i"; then umount "$nd/mntns" || umount -l "$nd/mntns"; fi
  remove_node_netns "$c" "$i"
}
