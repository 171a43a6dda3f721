# shellcheck shell=bash
# CoreDNS in every cluster of the bed with nodes (sourced by testbed/bed).
#
# The binary is built from its Go module (testbed/build.sh node, version in versions.env), packed
# FROM scratch like every image of the bed (user 65532) and imported into each node. It runs as
# the Deployment kube-system/coredns behind the Service kube-system/kube-dns at the cluster's DNS
# address (10.(96+C).0.10, the kubelets' clusterDNS). It serves cluster.local from the API only:
# no forward plugin, no upstream (the bed has no route out). Unprivileged, so it listens on 1053;
# the Service maps port 53 there.
#
# It also serves clusterset.local (the Multi-Cluster Services zone, KEP-1645) from ServiceImports
# and the EndpointSlices labelled multicluster.kubernetes.io/service-name (`multicluster
# clusterset.local` of the kubernetes plugin): `<svc>.<ns>.svc.clusterset.local` answers the
# ServiceImport's spec.ips. So every cluster with nodes gets the MCS CRDs (testbed/mcs-crds.sh:
# ServiceExport, ServiceImport, ClusterProperty) in the same apply as CoreDNS, which would never
# become ready without them (it lists ServiceImports at start). CoreDNS 1.12.2 watches
# multicluster.x-k8s.io/v1alpha1: the v0.5.x CRDs serve it beside v1beta1 (the storage version,
# which the MCS conformance suite and implementations use) with the same schema and no conversion
# webhook, so both read the same objects (docs/testing.md).

DNS_IMAGE="testbed.invalid/coredns:v$COREDNS_VERSION"

# coredns_archive: the CoreDNS image as an OCI archive, cached by version
coredns_archive() {
  local cache=${XCC_CACHE:-$HOME/.cache/cross-cluster-controller} out w
  out="$cache/images/coredns-v$COREDNS_VERSION.tar"
  if [ ! -f "$out" ]; then
    mkdir -p "$cache/images"
    w=$(mktemp -d "$cache/images/build.XXXXXX")
    cp "$bin/coredns-v$COREDNS_VERSION" "$w/coredns"
    build_image "$w" "$DNS_IMAGE" "$w/coredns" 65532 "$w/coredns.tar" -conf /etc/coredns/Corefile ||
      { rm -rf "$w"; die "packaging the CoreDNS image failed"; }
    mv "$w/coredns.tar" "$out"
    rm -rf "$w"
  fi
  echo "$out"
}

# start_dns CLUSTER: the image on every node, and the objects with the MCS CRDs before them (one
# apply; idempotent). Not waited for: a test that resolves names waits for kube-system/coredns to
# be available.
start_dns() {
  local c=$1 i f
  for i in $(node_indexes "$c"); do
    node_ctr "$c" "$i" images ls -q | grep -qx "$DNS_IMAGE" || import_image "$c" "$(coredns_archive)" "$i"
  done
  [ -n "${mcs_crds:-}" ] && [ -d "$mcs_crds" ] || die "the MCS CRDs are missing (testbed/mcs-crds.sh)"
  {
    for f in "$mcs_crds"/*.yaml; do
      echo "---"
      cat "$f"
    done
    echo "---"
    dns_manifest "$c"
  } | "$bin/kubectl" --kubeconfig "$dir/$c/admin.kubeconfig" apply -f - >/dev/null ||
    die "applying the MCS CRDs and CoreDNS to '$c' failed"
}

# dns_corefile: CoreDNS's configuration (the ConfigMap's Corefile)
dns_corefile() {
  cat <<'EOF'
.:1053 {
    errors
    health :8080
    ready :8181
    kubernetes cluster.local clusterset.local in-addr.arpa ip6.arpa {
        pods insecure
        multicluster clusterset.local
        fallthrough in-addr.arpa ip6.arpa
    }
    cache 5
    loadbalance
}
EOF
}

dns_manifest() {
  cat <<EOF
apiVersion: v1
kind: ServiceAccount
metadata: {name: coredns, namespace: kube-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "testbed:coredns"}
rules:
- apiGroups: [""]
  resources: [endpoints, services, pods, namespaces]
  verbs: [list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
# the clusterset.local zone (multicluster): ServiceImports, read at CoreDNS's version v1alpha1
- apiGroups: [multicluster.x-k8s.io]
  resources: [serviceimports]
  verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "testbed:coredns"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "testbed:coredns"}
subjects: [{kind: ServiceAccount, name: coredns, namespace: kube-system}]
---
apiVersion: v1
kind: ConfigMap
metadata: {name: coredns, namespace: kube-system}
data:
  Corefile: |
$(dns_corefile | sed 's/^/    /')
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: coredns, namespace: kube-system, labels: {k8s-app: kube-dns}}
spec:
  replicas: 1
  selector: {matchLabels: {k8s-app: kube-dns}}
  template:
    # a changed Corefile replaces the pod (CoreDNS reads it once, at start)
    metadata: {labels: {k8s-app: kube-dns}, annotations: {testbed/corefile: "$(dns_corefile | sha256sum | cut -c1-16)"}}
    spec:
      serviceAccountName: coredns
      dnsPolicy: Default
      securityContext: {runAsNonRoot: true, runAsUser: 65532, seccompProfile: {type: RuntimeDefault}}
      containers:
      - name: coredns
        image: $DNS_IMAGE
        imagePullPolicy: Never
        ports:
        - {name: dns, containerPort: 1053, protocol: UDP}
        - {name: dns-tcp, containerPort: 1053, protocol: TCP}
        readinessProbe: {httpGet: {path: /ready, port: 8181}, periodSeconds: 2}
        livenessProbe: {httpGet: {path: /health, port: 8080}, periodSeconds: 10}
        securityContext: {allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, capabilities: {drop: [ALL]}}
        volumeMounts: [{name: config, mountPath: /etc/coredns, readOnly: true}]
      volumes: [{name: config, configMap: {name: coredns}}]
---
apiVersion: v1
kind: Service
metadata: {name: kube-dns, namespace: kube-system, labels: {k8s-app: kube-dns}}
spec:
  clusterIP: $(dns_ip "$1")
  selector: {k8s-app: kube-dns}
  ports:
  - {name: dns, port: 53, targetPort: 1053, protocol: UDP}
  - {name: dns-tcp, port: 53, targetPort: 1053, protocol: TCP}
EOF
}
