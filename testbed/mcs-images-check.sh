#!/usr/bin/env bash
# Checks that the stand-in images of testbed/mcs-images.sh behave as the MCS conformance suite
# needs, with the suite's own commands and parsers read from its sources (the suite
# testbed/mcs-suite.sh finds: socatListenerScript of k8s_objects.go, the nc command of
# ncCommand in conformance_suite.go, addressesRegEx of headless_service_dns.go and srvRecordRegEx
# of clusterip_service_dns.go):
#
#   mcs-images-check.sh rootfs socat|netshoot DIR
#       an unpacked image (mcs-images.sh --check calls this) in network and PID namespaces of its
#       own (loopback only; every process ends with it): socat runs the suite's TCP and UDP
#       listener script and answers `pod ip 127.0.0.1`; nc -4 -v -w reaches a listener and prints
#       its answer; nslookup runs.
#   mcs-images-check.sh bed CONTEXT
#       inside the bed (testbed/bed exec), on a cluster with nodes that has the images and the MCS
#       CRDs: a socat pod behind a Service, a headless Service and two hand-made ServiceImports,
#       and a netshoot pod that runs the suite's commands: nc to the Service by its cluster.local
#       and by its clusterset.local name (the ServiceImport's IP is the Service's), nslookup of A
#       records parsed with addressesRegEx (cluster.local, headless, clusterset.local) and of SRV
#       records parsed with srvRecordRegEx, and the IPv6 path's pipeline (grep, tail, awk) on an A
#       lookup. Its namespace is deleted afterwards.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
suite=$(bash "$here/mcs-suite.sh") || exit 1
[ -f "$suite/k8s_objects.go" ] || { echo "mcs-images-check: no MCS conformance suite at $suite (XCC_MCS_SUITE)" >&2; exit 1; }
die() { echo "mcs-images-check: FAIL: $*" >&2; exit 1; }
ok() { echo "mcs-images-check: ok: $*" >&2; }

# suite_part WHAT [ARG]: a piece of the suite's sources, read (never changed) by a small parser
suite_part() {
  python3 - "$suite" "$@" <<'PY'
import re, sys
suite, what = sys.argv[1], sys.argv[2]
src = lambda f: open(f"{suite}/{f}").read()
if what == "listener":
    # func socatListenerScript(protocol string) string { return `...` + protocol + `...` }
    body = re.search(r"func socatListenerScript\(protocol string\) string \{\n\treturn `(.*?)`\n\}", src("k8s_objects.go"), re.S)
    print(body.group(1).replace("` + protocol + `", sys.argv[3]))
elif what == "nc4":
    # return fmt.Sprintf("echo hi | nc -v -w 2 %s %s %d 2>&1", ipFlag, serviceFQDN, port)
    fmt = re.search(r'return fmt\.Sprintf\("(echo hi \| nc [^"]*)", ipFlag, serviceFQDN, port\)', src("conformance_suite.go"))
    print(fmt.group(1).replace("%s", "{}", 2).replace("%d", "{}").format("-4", sys.argv[3], sys.argv[4]))
elif what == "v6pipe":
    # the IPv6 path's parsing of nslookup's answer: grep '^Address:' | grep -v '#' | tail -1 | awk ...
    pipe = re.search(r"2>&1 (\| grep '\^Address:' \| grep -v '#' \| tail -1 \| awk '\{print \$2\}')", src("conformance_suite.go"))
    print(pipe.group(1))
elif what in ("addresses", "srv"):
    f, name = {"addresses": ("headless_service_dns.go", "addressesRegEx"),
               "srv": ("clusterip_service_dns.go", "srvRecordRegEx")}[what]
    print(re.search(name + r" = regexp\.MustCompile\(`([^`]*)`\)", src(f)).group(1))
PY
}

# parse addresses|srv: the suite's parser on standard input (as its exec reads it: a TTY, CRLF)
parse() {
  python3 -c '
import re, sys
rx, what = re.compile(sys.argv[1]), sys.argv[2]
out = sys.stdin.read().replace("\r\n", "\n").replace("\n", "\r\n")
if what == "addresses":
    print(" ".join(sorted(m.group(1).strip() for m in rx.finditer(out))))
else:
    print(" ".join(f"{int(m.group(1) or 0)}/{m.group(2).rstrip(chr(46))}" for m in rx.finditer(out)))
' "$(suite_part "$1")" "$1"
}

rootfs_check() {
  local name=$1 r=$2
  [ -L "$r/bin/sh" ] || [ -x "$r/bin/sh" ] || die "$r has no /bin/sh"
  local tcp udp
  tcp=$(suite_part listener TCP)
  udp=$(suite_part listener UDP)
  # a network namespace with loopback only, and a PID namespace: the listeners end with it; /proc
  # mounted in the rootfs (in a mount namespace of its own) as in a container, where a shell may
  # behave differently with it (BusyBox's standalone shell runs its applets through /proc/self/exe)
  XCC_R=$r XCC_TCP=$tcp XCC_UDP=$udp XCC_NAME=$name unshare --net --pid --mount --fork bash -c '
    set -euo pipefail
    ip link set lo up
    mkdir -p "$XCC_R/proc"
    mount -t proc proc "$XCC_R/proc"
    run() { env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin "$@"; }
    in_rootfs() { run chroot "$XCC_R" "$@"; }
    if [ "$XCC_NAME" = socat ]; then
      run MY_POD_IPS=127.0.0.1 chroot "$XCC_R" /bin/sh -c "$XCC_TCP" 2>/dev/null &
      run MY_POD_IPS=127.0.0.1 chroot "$XCC_R" /bin/sh -c "$XCC_UDP" 2>/dev/null &
      for _ in $(seq 50); do (exec 3<>/dev/tcp/127.0.0.1/42) 2>/dev/null && break; sleep 0.1; done
      out=$(echo hi | in_rootfs socat -T 2 - TCP:127.0.0.1:42)
      [[ $out == *"pod ip 127.0.0.1"* ]] || { echo "TCP answer: $out" >&2; exit 1; }
      echo "socat TCP listener (the suite'\''s script) answered: ${out%$'\''\r'\''}" >&2
      # the UDP listener may not be bound yet (the TCP one was waited for): a refused datagram
      # is sent again
      for _ in $(seq 20); do
        out=$(echo hi | in_rootfs socat -T 2 - UDP:127.0.0.1:42 2>/dev/null) && break
        sleep 0.2
      done
      [[ $out == *"pod ip 127.0.0.1"* ]] || { echo "UDP answer: $out" >&2; exit 1; }
      echo "socat UDP listener (the suite'\''s script) answered: ${out%$'\''\r'\''}" >&2
    else
      for t in sh nc nslookup grep awk tail; do
        in_rootfs /bin/sh -c "command -v $t" >/dev/null || { echo "no $t on PATH" >&2; exit 1; }
      done
      # the shell finds the real tools on PATH, not BusyBox applets of the same names
      for t in nc nslookup; do
        p=$(in_rootfs /bin/sh -c "command -v $t")
        [ "$(readlink -f "$XCC_R$p")" != "$XCC_R/bin/busybox" ] || { echo "$t is BusyBox'\''s" >&2; exit 1; }
      done
      echo "pod ip 127.0.0.1" | in_rootfs nc -l 127.0.0.1 42 >/dev/null &
      for _ in $(seq 50); do (exec 3<>/dev/tcp/127.0.0.1/42) 2>/dev/null && break; sleep 0.1; done
      # the listener took that probe: a second one for the check
      wait
      echo "pod ip 127.0.0.1" | in_rootfs nc -l 127.0.0.1 42 >/dev/null &
      sleep 0.3
      out=$(in_rootfs /bin/sh -c "echo hi | nc -v -w 2 -4 127.0.0.1 42 2>&1")
      [[ $out == *"succeeded"* && $out == *"pod ip 127.0.0.1"* ]] || { echo "nc printed: $out" >&2; exit 1; }
      echo "nc -v -w 2 -4 printed: $(echo "$out" | tr "\n" " ")" >&2
      v=$(in_rootfs nslookup -version 2>&1)
      [[ $v == nslookup\ 9.* ]] || { echo "nslookup -version: $v" >&2; exit 1; }
      echo "BIND $v" >&2
    fi
  ' || die "the $name rootfs"
  ok "$name rootfs"
}

bed_check() {
  local ctx=$1
  [ -n "${XCC_TESTBED_INSIDE:-}" ] || die "run it in the bed: bash testbed/bed exec bash $0 bed $ctx"
  local kubectl kubeconfig ns
  kubectl="$(bash "$here/build.sh")/kubectl"
  kubeconfig=${XCC_TESTBED_KUBECONFIG:-${XCC_TESTBED_DIR:-$repo/.testbed}/kubeconfig}
  k() { "$kubectl" --kubeconfig "$kubeconfig" --context "$ctx" "$@"; }
  ns=mcs-images-check-$RANDOM$RANDOM
  # shellcheck disable=SC2064
  trap "'$kubectl' --kubeconfig '$kubeconfig' --context '$ctx' delete namespace $ns --wait=false >/dev/null 2>&1 || true" EXIT
  k create namespace "$ns" >/dev/null
  local tcp udp
  tcp=$(suite_part listener TCP | python3 -c 'import json,sys; print(json.dumps(sys.stdin.read()))')
  udp=$(suite_part listener UDP | python3 -c 'import json,sys; print(json.dumps(sys.stdin.read()))')
  # the suite's pods: hello (podContainers) and request (newRequestPod), images as it names them
  k -n "$ns" apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata: {name: hello, labels: {app: hello}}
spec:
  containers:
  - name: hello-tcp
    image: alpine/socat:1.7.4.4
    command: [/bin/sh]
    args: [-c, $tcp]
    env: [{name: MY_POD_IPS, valueFrom: {fieldRef: {fieldPath: status.podIPs}}}]
  - name: hello-udp
    image: alpine/socat:1.7.4.4
    command: [/bin/sh]
    args: [-c, $udp]
    env: [{name: MY_POD_IPS, valueFrom: {fieldRef: {fieldPath: status.podIPs}}}]
---
apiVersion: v1
kind: Pod
metadata: {name: request, labels: {app: request}}
spec:
  containers:
  - name: request
    image: nicolaka/netshoot:v0.15
    args: [/bin/sh, -ec, "while :; do echo '.'; sleep 5 ; done"]
---
apiVersion: v1
kind: Service
metadata: {name: hello}
spec:
  selector: {app: hello}
  ports: [{name: tcp, port: 42, protocol: TCP}, {name: udp, port: 42, protocol: UDP}]
---
apiVersion: v1
kind: Service
metadata: {name: hello-headless}
spec:
  clusterIP: None
  selector: {app: hello}
  ports: [{name: tcp, port: 42, protocol: TCP}]
EOF
  k -n "$ns" wait --for=condition=Ready pod/hello pod/request --timeout=90s >/dev/null ||
    { k -n "$ns" get pods -o wide >&2; k -n "$ns" describe pods >&2; die "the pods did not become Ready"; }
  local pod_ip cluster_ip spare
  pod_ip=$(k -n "$ns" get pod hello -o jsonpath='{.status.podIP}')
  cluster_ip=$(k -n "$ns" get service hello -o jsonpath='{.spec.clusterIP}')
  # an address of the cluster's service range that no Service has: the range's last but one
  spare="$(echo "$cluster_ip" | cut -d. -f1-2).255.254"
  ok "pods Running: hello (socat) $pod_ip behind Service hello $cluster_ip; request (netshoot)"

  # ServiceImports as an MCS implementation would write them (v1beta1, what the suite reads)
  k -n "$ns" apply -f - >/dev/null <<EOF
apiVersion: multicluster.x-k8s.io/v1beta1
kind: ServiceImport
metadata: {name: hello}
spec:
  type: ClusterSetIP
  ips: [$cluster_ip]
  ipFamilies: [IPv4]
  ports: [{name: tcp, port: 42, protocol: TCP}]
---
apiVersion: multicluster.x-k8s.io/v1beta1
kind: ServiceImport
metadata: {name: other}
spec:
  type: ClusterSetIP
  ips: [$spare]
  ipFamilies: [IPv4]
  ports: [{name: tcp, port: 4242, protocol: TCP}]
EOF

  # expect WHAT WANT CMD: CMD (sh -c in the request pod) until its output, parsed as WHAT
  # (raw: contains WANT; addresses or srv: the suite's parser gives exactly WANT), for 30 s
  expect() {
    local what=$1 want=$2 cmd=$3 out got deadline=$((SECONDS + 30))
    while :; do
      out=$(k -n "$ns" exec request -- sh -c "$cmd" 2>&1 || true)
      case $what in
        raw) [[ $out == *"$want"* ]] && got=$want || got="" ;;
        *) got=$(parse "$what" <<<"$out") ;;
      esac
      if [ "$got" = "$want" ]; then ok "$cmd -> ${got:-(nothing)}"; return 0; fi
      [ $SECONDS -lt $deadline ] || { echo "$out" >&2; die "$cmd: wanted '$want', parsed '$got'"; }
      sleep 1
    done
  }
  local local_name="hello.$ns.svc.cluster.local" set_name="hello.$ns.svc.clusterset.local"
  expect raw "pod ip $pod_ip" "$(suite_part nc4 "$local_name" 42)"
  expect addresses "$cluster_ip" "nslookup -type=A $local_name."
  expect addresses "$pod_ip" "nslookup -type=A hello-headless.$ns.svc.cluster.local."
  expect addresses "$cluster_ip" "nslookup -type=A $set_name."
  expect addresses "$spare" "nslookup -type=A other.$ns.svc.clusterset.local."
  expect srv "42/$set_name" "nslookup -type=SRV $set_name."
  expect raw "$cluster_ip" "nslookup -type=A $set_name. 2>&1 $(suite_part v6pipe)"
  expect raw "pod ip $pod_ip" "$(suite_part nc4 "$set_name" 42)"
  # the IPv6 path's pipeline prints exactly the address, nothing else
  local addr
  addr=$(k -n "$ns" exec request -- sh -c "nslookup -type=A $set_name. 2>&1 $(suite_part v6pipe)" | tr -d '\r')
  [ "$addr" = "$cluster_ip" ] || die "the IPv6 path's pipeline printed '$addr', not '$cluster_ip'"
  ok "everything the suite runs in the images works on '$ctx'"
}

case ${1:-} in
  rootfs) rootfs_check "${2:?socat or netshoot}" "${3:?rootfs directory}" ;;
  bed) bed_check "${2:?context}" ;;
  *) echo "usage: $0 rootfs socat|netshoot DIR | bed CONTEXT" >&2; exit 2 ;;
esac
