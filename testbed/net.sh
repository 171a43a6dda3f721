# shellcheck shell=bash
# The bed's networks (sourced by testbed/bed; see docs/testing.md, "The bed's network").
#
# Nothing of the bed is ever placed in the machine's own network namespace: the whole bed (etcd,
# API servers, controllers, kubelets, containerds, the tests and the daemon under test) runs in a
# network namespace of the bed's own, $dir/netns, which `bed` creates and enters by itself
# (`bed exec CMD...` and `bed shell` run anything else there). In it, 127.0.0.1 means the same to
# every process of the bed, so kubeconfigs, host-network pods (node I at 127.0.0.I) and the
# tests work as before; and it has no route out: a packet to any address the bed did not make
# fails with "network unreachable" instead of leaving the machine.
#
#   bed namespace ($dir/netns)         lo: 127.0.0.1 (API servers, etcd, kubelets, tests)
#     bed0 (bridge) 10.250.0.1/16      the "VPC router" every node's namespace is wired to
#          + 10.250.C.1/32             the API server of cluster index C-1 (its advertise address:
#                                      the `kubernetes` Service's endpoint, reachable from pods)
#     routes 10.(200+C-1).I.0/24 via 10.250.C.(10+I)   each node's pod CIDR (the peering routes)
#   node namespace ($nd/netns)         one per node: the node's pod network and its kube-proxy
#     eth0 10.250.C.(10+I)/16          veth to bed0; route 10.0.0.0/8 via 10.250.0.1, nothing else
#     cni0 (CNI bridge) 10.(200+C-1).I.1/24, each pod a veth on it (host-local IPAM)
#     kube-proxy's nftables table
#
# Why a namespace per node for the pod network: kube-proxy owns its netfilter table, and the
# kube-proxies of different nodes (and clusters) cannot share one. The kubelet and containerd stay
# in the bed's namespace (where host-network pods keep 127.0.0.I); containerd reaches the node's
# namespace through CNI plugin wrappers ($nd/cni-bin) that enter it before running Debian's
# plugins, so every pod's veth and the bridge live there. A pod's traffic to a ClusterIP is
# DNATed by its node's kube-proxy, then routed: pod CIDRs of different clusters do not overlap, so
# every pod reaches every other pod directly, as across peered VPCs.

bed_netns="$dir/netns"
# the namespace the bed was made from (the machine's, unless made from inside another bed), kept
# so tests can read (never change) it: tests/bed_network.rs
outer_netns="$dir/outer-netns"
BED_BRIDGE=bed0
BED_GATEWAY=10.250.0.1

# in_bed_ns: this process runs in the bed's network namespace
in_bed_ns() {
  grep -q " $bed_netns " /proc/self/mountinfo &&
    [ "$(stat -Lc %i /proc/self/ns/net)" = "$(stat -Lc %i "$bed_netns")" ]
}

# make_bed_ns: the bed's namespace with its loopback and bridge (once; locked against another bed
# command doing the same).
make_bed_ns() {
  (
    exec 8>"$dir/.netns.lock"
    flock 8
    grep -q " $bed_netns " /proc/self/mountinfo && exit 0
    touch "$bed_netns" "$outer_netns"
    grep -q " $outer_netns " /proc/self/mountinfo || mount --bind /proc/self/ns/net "$outer_netns"
    unshare --net="$bed_netns" true
    nsenter --net="$bed_netns" -- bash -c "
      set -e
      ip link set lo up
      ip link add $BED_BRIDGE type bridge
      ip addr add $BED_GATEWAY/16 dev $BED_BRIDGE
      ip link set $BED_BRIDGE up
      sysctl -qw net.ipv4.ip_forward=1"
  ) || die "cannot create the bed's network namespace $bed_netns"
}

# remove_bed_ns: unmounts it (it ends with its last process)
remove_bed_ns() {
  if grep -q " $outer_netns " /proc/self/mountinfo; then umount "$outer_netns" || umount -l "$outer_netns"; fi
  if grep -q " $bed_netns " /proc/self/mountinfo; then umount "$bed_netns" || umount -l "$bed_netns"; fi
}

# The addresses of cluster C (by its index in the bed) and of its node I.
api_ip() { echo "10.250.$(($(cluster_index "$1") + 1)).1"; }
node_bed_ip() { echo "10.250.$(($(cluster_index "$1") + 1)).$((10 + ${2:-1}))"; }
cluster_pod_cidr() { echo "10.$((200 + $(cluster_index "$1"))).0.0/16"; }
node_pod_cidr() { echo "10.$((200 + $(cluster_index "$1"))).${2:-1}.0/24"; }
# a cluster's Service range is a /16 unless `up` recorded another prefix length for it
# (XCC_TESTBED_SERVICE_PREFIX, see testbed/bed)
service_prefix() { cat "$dir/$1/service-prefix" 2>/dev/null || echo 16; }
service_cidr() { echo "10.$((96 + $(cluster_index "$1"))).0.0/$(service_prefix "$1")"; }
service_first_ip() { echo "10.$((96 + $(cluster_index "$1"))).0.1"; }
dns_ip() { echo "10.$((96 + $(cluster_index "$1"))).0.10"; }

# add_api_ip CLUSTER: the API server's address on the bed's bridge
add_api_ip() { ip addr replace "$(api_ip "$1")/32" dev "$BED_BRIDGE"; }

# make_node_netns CLUSTER I: node I's network namespace wired to the bed's bridge, with its route
# to the rest of the bed and the bed's route to its pod CIDR (before the node's mount namespace,
# which must see it mounted).
make_node_netns() {
  local c=$1 i=$2 nd ip veth
  nd=$(node_dir "$c" "$i")
  ip=$(node_bed_ip "$c" "$i")
  veth="n$(cluster_index "$c")-$i"
  if ! grep -q " $nd/netns " /proc/self/mountinfo; then
    touch "$nd/netns"
    unshare --net="$nd/netns" true
  fi
  if ! ip link show "$veth" >/dev/null 2>&1; then
    ip link add "$veth" type veth peer name eth0 netns "$nd/netns"
    ip link set "$veth" master "$BED_BRIDGE" up
    nsenter --net="$nd/netns" -- bash -c "
      set -e
      ip link set lo up
      ip addr add $ip/16 dev eth0
      ip link set eth0 up
      ip route add 10.0.0.0/8 via $BED_GATEWAY
      sysctl -qw net.ipv4.ip_forward=1
      sysctl -qw net.bridge.bridge-nf-call-iptables=1 2>/dev/null || true" ||
      die "cannot wire node $i of '$c' to the bed's network"
  fi
  ip route replace "$(node_pod_cidr "$c" "$i")" via "$ip"
}

# write_node_cni CLUSTER I: the pod network's conflist and the plugin wrappers that run Debian's
# plugins in node I's namespace (containerd runs them from here, in the bed's namespace).
write_node_cni() {
  local c=$1 i=$2 nd p
  nd=$(node_dir "$c" "$i")
  mkdir -p "$nd/cni" "$nd/cni-bin" "$nd/cni-ipam"
  for p in bridge host-local loopback portmap; do
    printf '#!/bin/sh\nexec nsenter --net=%s -- /usr/lib/cni/%s "$@"\n' "$nd/netns" "$p" >"$nd/cni-bin/$p.tmp"
    chmod 755 "$nd/cni-bin/$p.tmp"
    mv "$nd/cni-bin/$p.tmp" "$nd/cni-bin/$p"
  done
  # written once, whole: containerd watches the directory
  [ -f "$nd/cni/10-pods.conflist" ] && return 0
  cat >"$nd/cni/.10-pods.tmp" <<EOF
{"cniVersion": "1.0.0", "name": "testbed-pods", "plugins": [
  {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
   "ipam": {"type": "host-local", "dataDir": "$nd/cni-ipam",
            "ranges": [[{"subnet": "$(node_pod_cidr "$c" "$i")"}]], "routes": [{"dst": "0.0.0.0/0"}]}}
]}
EOF
  mv "$nd/cni/.10-pods.tmp" "$nd/cni/10-pods.conflist"
}

# The peering between two clusters' pod networks, cut and mended (`bed cut A B`, `bed mend A B`):
# an nftables table of the bed's namespace drops what it forwards between A's pods or nodes and
# B's, both ways, as a lost VPC peering or a security group would. Only forwarded packets: the
# API servers (addresses of the bed's own), the kubelets' probes of their pods and the tests
# (which all run in the bed's namespace) still reach every pod, so each cluster sees itself
# healthy while the other's pods time out.
cut_table() {
  local a b
  a=$(cluster_index "$1")
  b=$(cluster_index "$2")
  if [ "$a" -le "$b" ]; then echo "xcc_cut_${a}_$b"; else echo "xcc_cut_${b}_$a"; fi
}
cluster_nets() { echo "{ $(cluster_pod_cidr "$1"), 10.250.$(($(cluster_index "$1") + 1)).0/24 }"; }
cut_between() {
  local t a b
  t=$(cut_table "$1" "$2")
  a=$(cluster_nets "$1")
  b=$(cluster_nets "$2")
  mend_between "$1" "$2"
  nft -f - <<EOF
table ip $t {
  chain forward {
    type filter hook forward priority filter - 10; policy accept;
    ip saddr $a ip daddr $b counter drop
    ip saddr $b ip daddr $a counter drop
  }
}
EOF
}
mend_between() {
  local t
  t=$(cut_table "$1" "$2")
  if nft list table ip "$t" >/dev/null 2>&1; then nft delete table ip "$t"; fi
}

# remove_node_netns CLUSTER I: its route, veth and namespace
remove_node_netns() {
  local c=$1 i=$2 nd
  nd=$(node_dir "$c" "$i")
  ip route del "$(node_pod_cidr "$c" "$i")" 2>/dev/null || true
  ip link del "n$(cluster_index "$c")-$i" 2>/dev/null || true
  if grep -q " $nd/netns " /proc/self/mountinfo; then umount "$nd/netns" || umount -l "$nd/netns"; fi
}
