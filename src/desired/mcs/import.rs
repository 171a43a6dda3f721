//! The import of one namespace/name in the local cluster: the ServiceImport, its derived
//! Service (what kube-proxy and cluster DNS serve) and one set of EndpointSlices per exporting
//! cluster.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Service, ServicePort as CoreServicePort, ServiceSpec};
use k8s_openapi::api::discovery::v1::{EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use sha2::{Digest, Sha256};

use super::change::{derived_is_ours, import_is_ours};
use super::error::McsError;
use super::judge::{ClusterExport, Conflict, Judgement, import_port, import_type, judge};
use super::types::{
    CLUSTER_SET_IP, ClusterStatus, MCS_API_VERSION, ServiceExportSpec, ServiceImport,
    ServiceImportSpec, ServiceImportStatus, ServicePort,
};
use super::{
    COPIED_ANNOTATIONS_ANNOTATION, COPIED_LABELS_ANNOTATION, DERIVED_SERVICE_ANNOTATION,
    MCS_SERVICE_NAME_LABEL, OWNER_LABEL,
};
use crate::desired::api::{
    CLUSTER_IP_NONE, IPV4, IPV6, PREFER_DUAL_STACK, PROTOCOL_TCP, SINGLE_STACK, TYPE_CLUSTER_IP,
};
use crate::desired::meta::{self, StringMap};
use crate::desired::options::{
    COPIED_LABELS_SUFFIX, MANAGED_BY, MANAGED_BY_LABEL, MCS_SOURCE_CLUSTER_LABEL,
    SERVICE_NAME_LABEL,
};
use crate::desired::slices;

/// Characters of the hash in a derived Service's name (as mcs-api's reference controller).
const DERIVED_HASH_LEN: usize = 10;

/// Everything the local cluster should hold for one imported namespace/name.
#[derive(Clone, Debug, PartialEq)]
pub struct Import {
    /// The desired ServiceImport: metadata and spec (for the object) and `status.clusters` (for
    /// its status subresource).
    pub service_import: ServiceImport,
    /// The derived Service, owned by the ServiceImport; `None` until the live ServiceImport is
    /// ours and has a uid to own it by (create the ServiceImport first).
    pub derived: Option<Service>,
    /// The EndpointSlices of every exporting cluster, owned by the ServiceImport, sorted by
    /// name; empty while `derived` is `None`.
    pub slices: Vec<EndpointSlice>,
    /// What the exports disagree on (the same list their `Conflict` conditions give).
    pub conflicts: Vec<Conflict>,
    /// Exported labels and annotations left out because the API server would refuse them
    /// (`label <key>` or `annotation <key>`), for an Event.
    pub dropped: Vec<String>,
}

/// `derived-<10 characters>`: mcs-api's reference controller's name for the derived Service of
/// `namespace/name` (the first 10 characters of the lowercase base32hex of the sha256 of
/// `<namespace>/<name>`). A valid DNS label whatever the Service is called, and stable.
pub fn derived_name(namespace: &str, name: &str) -> String {
    const ALPHABET: &[u8; 32] = b"0123456789abcdefghijklmnopqrstuv";
    let digest = Sha256::digest(format!("{namespace}/{name}").as_bytes());
    // 10 base32 characters take 50 bits: the first 7 bytes hold them
    let bits = digest
        .iter()
        .take(7)
        .fold(0u64, |acc, b| (acc << 8) | u64::from(*b));
    let hash: String = (0..DERIVED_HASH_LEN)
        .map(|i| {
            let shift = 56 - 5 * (i + 1);
            char::from(ALPHABET[((bits >> shift) & 0x1f) as usize])
        })
        .collect();
    format!("derived-{hash}")
}

/// The ownerReference every derived object carries: the local ServiceImport, as controller.
pub fn import_owner(service_import: &ServiceImport) -> Option<OwnerReference> {
    Some(OwnerReference {
        api_version: MCS_API_VERSION.to_string(),
        kind: "ServiceImport".to_string(),
        name: service_import.metadata.name.clone()?,
        uid: service_import.metadata.uid.clone()?,
        controller: Some(true),
        block_owner_deletion: None,
    })
}

/// The desired import of `namespace/name` from every cluster's export of it (the local
/// cluster's included: it is a source as well as a destination), or `None` when no export is
/// valid (the ServiceImport, if ours, should go; its derived objects follow it by garbage
/// collection).
///
/// `live_import` and `live_derived` are the live local ServiceImport and derived Service, if
/// any: the first gives the uid the derived objects are owned by (a ServiceImport that is not
/// ours gives none, so nothing of the key is derived), the second the clusterset IPs
/// (`spec.ips`, with `spec.ipFamilies` read from them, so both agree in length and order).
pub fn import(
    namespace: &str,
    name: &str,
    exports: &[ClusterExport<'_>],
    live_import: Option<&ServiceImport>,
    live_derived: Option<&Service>,
) -> Result<Option<Import>, McsError> {
    let judgement = judge(namespace, name, exports)?;
    let (Some(winner), Some(spec)) = (judgement.winner(), judgement.winner_spec()) else {
        return Ok(None);
    };
    let derived = derived_name(namespace, name);
    let type_ = import_type(spec);
    let ports = judgement.ports();

    let (ips, ip_families) = if type_ == CLUSTER_SET_IP {
        let ips = live_derived
            .filter(|s| derived_is_ours(s))
            .map(clusterset_ips)
            .unwrap_or_default();
        let families = ips.iter().map(|ip| family_of(ip).to_string()).collect();
        (ips, families)
    } else {
        (Vec::new(), judgement.families())
    };

    let (labels, annotations, dropped) = import_metadata(&winner.export.spec, &derived);

    let mut clusters: Vec<ClusterStatus> = judgement
        .members
        .iter()
        .map(|e| ClusterStatus {
            cluster: e.cluster.to_string(),
        })
        .collect();
    clusters.sort();

    let service_import = ServiceImport {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(namespace.to_string()),
            labels: Some(labels),
            annotations: Some(annotations),
            ..ObjectMeta::default()
        },
        spec: ServiceImportSpec {
            ports,
            ips,
            type_: type_.to_string(),
            session_affinity: spec.session_affinity.clone().unwrap_or_default(),
            session_affinity_config: spec.session_affinity_config.clone(),
            ip_families,
            internal_traffic_policy: spec.internal_traffic_policy.clone(),
            traffic_distribution: spec.traffic_distribution.clone(),
        },
        status: Some(ServiceImportStatus {
            clusters,
            conditions: Vec::new(),
        }),
    };

    let owner = live_import
        .filter(|si| import_is_ours(si))
        .and_then(import_owner);
    let (derived_service, derived_slices) = match owner {
        Some(owner) => (
            Some(derived_service(
                &service_import,
                &judgement,
                &derived,
                owner.clone(),
            )),
            endpoint_slices(
                &judgement,
                &service_import.spec,
                namespace,
                name,
                &derived,
                &owner,
            ),
        ),
        None => (None, Vec::new()),
    };

    Ok(Some(Import {
        service_import,
        derived: derived_service,
        slices: derived_slices,
        conflicts: judgement.conflicts.clone(),
        dropped,
    }))
}

/// The ServiceImport's labels and annotations: the winning export's `exportedLabels` and
/// `exportedAnnotations`, less what the API server would refuse or what would pass for ours
/// (listed in the third part), with ours on top and a record of the keys copied.
fn import_metadata(
    exported: &ServiceExportSpec,
    derived: &str,
) -> (StringMap, StringMap, Vec<String>) {
    let mut dropped = Vec::new();
    let mut labels: StringMap = exported
        .exported_labels
        .iter()
        .filter(|(k, v)| {
            // reserved prefixes (kubernetes.io, k8s.io, x-k8s.io, ours) are never a remote's
            let ok = meta::validate_label(k, v).is_ok()
                && k.as_str() != OWNER_LABEL
                && !crate::desired::containment::reserved(k, crate::desired::DEFAULT_LABEL_KEY);
            if !ok {
                dropped.push(format!("label {k}"));
            }
            ok
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let copied_labels = keys(&labels);
    labels.insert(OWNER_LABEL.to_string(), MANAGED_BY.to_string());
    let ours = [
        DERIVED_SERVICE_ANNOTATION,
        COPIED_LABELS_ANNOTATION,
        COPIED_ANNOTATIONS_ANNOTATION,
    ];
    let mut annotations: StringMap = exported
        .exported_annotations
        .iter()
        .filter(|(k, _)| {
            // a key ending like our record of copied labels would be taken for it
            let ok = meta::validate_qualified_name(k).is_ok()
                && !ours.contains(&k.as_str())
                && !k.ends_with(COPIED_LABELS_SUFFIX);
            if !ok {
                dropped.push(format!("annotation {k}"));
            }
            ok
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if annotations_size(&annotations) > meta::TOTAL_ANNOTATION_SIZE_LIMIT / 2 {
        // the API server refuses more than 256 KiB in all; keep room for ours and others'
        dropped.push("annotations (too large)".to_string());
        annotations.clear();
    }
    let copied_annotations = keys(&annotations);
    annotations.insert(DERIVED_SERVICE_ANNOTATION.to_string(), derived.to_string());
    annotations.insert(COPIED_LABELS_ANNOTATION.to_string(), copied_labels);
    annotations.insert(
        COPIED_ANNOTATIONS_ANNOTATION.to_string(),
        copied_annotations,
    );

    (labels, annotations, dropped)
}

fn annotations_size(map: &StringMap) -> usize {
    map.iter().map(|(k, v)| k.len() + v.len()).sum()
}

fn keys(map: &StringMap) -> String {
    map.keys().map(String::as_str).collect::<Vec<_>>().join(",")
}

/// The allocated clusterIPs of a live derived Service, in its order.
fn clusterset_ips(svc: &Service) -> Vec<String> {
    let Some(spec) = svc.spec.as_ref() else {
        return Vec::new();
    };
    let ips = match &spec.cluster_ips {
        Some(ips) if !ips.is_empty() => ips.clone(),
        _ => spec.cluster_ip.iter().cloned().collect(),
    };
    ips.into_iter()
        .filter(|ip| !ip.is_empty() && ip != CLUSTER_IP_NONE)
        .take(2)
        .collect()
}

fn family_of(ip: &str) -> &'static str {
    if ip.contains(':') { IPV6 } else { IPV4 }
}

fn core_port(p: &ServicePort) -> CoreServicePort {
    CoreServicePort {
        name: (!p.name.is_empty()).then(|| p.name.clone()),
        protocol: Some(p.protocol.clone()),
        app_protocol: p.app_protocol.clone(),
        port: p.port,
        ..CoreServicePort::default()
    }
}

/// The selectorless Service kube-proxy and cluster DNS serve the import by: ClusterIP with the
/// import's ports, affinity and traffic fields, or headless for a Headless import. Its families
/// follow the exports: the winner's primary family pinned first (a clusterset IP of the family
/// the endpoints have), PreferDualStack when the exports carry two.
fn derived_service(
    si: &ServiceImport,
    judgement: &Judgement<'_, '_>,
    derived: &str,
    owner: OwnerReference,
) -> Service {
    let name = si.metadata.name.clone().unwrap_or_default();
    let labels: StringMap = [
        (OWNER_LABEL.to_string(), MANAGED_BY.to_string()),
        (MCS_SERVICE_NAME_LABEL.to_string(), name),
    ]
    .into();
    let ports: Vec<CoreServicePort> = si.spec.ports.iter().map(core_port).collect();
    let mut spec = ServiceSpec {
        type_: Some(TYPE_CLUSTER_IP.to_string()),
        ports: (!ports.is_empty()).then_some(ports),
        ..ServiceSpec::default()
    };
    if si.spec.type_ == CLUSTER_SET_IP {
        let families = judgement.families();
        spec.session_affinity = Some(si.spec.session_affinity.clone()).filter(|a| !a.is_empty());
        spec.session_affinity_config = si.spec.session_affinity_config.clone();
        spec.internal_traffic_policy = si.spec.internal_traffic_policy.clone();
        spec.traffic_distribution = si.spec.traffic_distribution.clone();
        if let Some(primary) = families.first() {
            spec.ip_families = Some(vec![primary.clone()]);
            spec.ip_family_policy = Some(
                if families.len() > 1 {
                    PREFER_DUAL_STACK
                } else {
                    SINGLE_STACK
                }
                .to_string(),
            );
        }
    } else {
        spec.cluster_ip = Some(CLUSTER_IP_NONE.to_string());
    }
    Service {
        metadata: ObjectMeta {
            name: Some(derived.to_string()),
            namespace: si.metadata.namespace.clone(),
            labels: Some(labels),
            owner_references: Some(vec![owner]),
            ..ObjectMeta::default()
        },
        spec: Some(spec),
        status: None,
    }
}

/// One set of slices per exporting cluster, for the derived Service: each cluster's endpoints
/// (addresses, conditions, hostname, zone; nodeName and targetRef name objects of that cluster
/// and are dropped) with those of its slices' ports that its Service shares with the import
/// (see [`shared_ports`]), so kube-proxy sends a port's traffic only to the clusters whose
/// Service has that very port. A ClusterSetIP import drops endpoints left with no port (they
/// would serve nothing); a Headless one keeps them, as DNS answers their addresses and
/// hostnames whatever the ports. Slices we wrote ourselves (either mode) are never exported
/// again: only a cluster's own endpoints are its.
fn endpoint_slices(
    judgement: &Judgement<'_, '_>,
    spec: &ServiceImportSpec,
    namespace: &str,
    name: &str,
    derived: &str,
    owner: &OwnerReference,
) -> Vec<EndpointSlice> {
    let mut out = Vec::new();
    for e in &judgement.members {
        let own: Vec<&EndpointSlice> = e
            .slices
            .iter()
            .copied()
            .filter(|s| slices::belongs_to(s, name, namespace))
            // a slice belongs to the Service by this label (kube-proxy's rule)
            .filter(|s| {
                s.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(SERVICE_NAME_LABEL))
                    .is_some_and(|n| n == name)
            })
            .filter(|s| {
                s.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(MANAGED_BY_LABEL))
                    .is_none_or(|m| m != MANAGED_BY)
            })
            .collect();
        let shared = shared_ports(e, &spec.ports);
        let own: Vec<Cow<'_, EndpointSlice>> =
            own.into_iter().map(|s| only_ports(s, &shared)).collect();
        let own: Vec<&EndpointSlice> = own.iter().map(|s| s.as_ref()).collect();
        let mut groups = slices::group_endpoints(&own);
        if spec.type_ == CLUSTER_SET_IP {
            groups.retain(|g| !g.ports.is_empty());
        }
        let labels: StringMap = BTreeMap::from([
            (MCS_SERVICE_NAME_LABEL.to_string(), name.to_string()),
            (MCS_SOURCE_CLUSTER_LABEL.to_string(), e.cluster.to_string()),
            (SERVICE_NAME_LABEL.to_string(), derived.to_string()),
            (MANAGED_BY_LABEL.to_string(), MANAGED_BY.to_string()),
        ]);
        let mut built = slices::build_slices(
            &groups,
            derived,
            e.cluster,
            namespace,
            &labels,
            &StringMap::new(),
        );
        for slice in &mut built {
            slice.metadata.owner_references = Some(vec![owner.clone()]);
        }
        out.extend(built);
    }
    out.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    out
}

/// The (name, protocol) of each port of the member's Service that is the import's port of that
/// name: same protocol and number. A port that lost to another cluster's of the same name (or
/// of the same protocol and number) is not among them: its endpoints must not answer for the
/// winner's port of that name. Slice ports carry the pods' target numbers, so the Service's
/// ports are compared, not the slice's.
fn shared_ports(e: &ClusterExport<'_>, ports: &[ServicePort]) -> BTreeSet<(String, String)> {
    e.service
        .and_then(|s| s.spec.as_ref())
        .and_then(|s| s.ports.as_ref())
        .into_iter()
        .flatten()
        .map(import_port)
        .filter(|p| {
            ports
                .iter()
                .any(|q| q.name == p.name && q.protocol == p.protocol && q.port == p.port)
        })
        .map(|p| (p.name, p.protocol))
        .collect()
}

/// The slice with only the ports `shared` names; borrowed when it has no other.
fn only_ports<'s>(
    slice: &'s EndpointSlice,
    shared: &BTreeSet<(String, String)>,
) -> Cow<'s, EndpointSlice> {
    let kept = |p: &EndpointPort| {
        let name = p.name.clone().unwrap_or_default();
        let protocol = p
            .protocol
            .clone()
            .unwrap_or_else(|| PROTOCOL_TCP.to_string());
        shared.contains(&(name, protocol))
    };
    let ports = slice.ports.as_deref().unwrap_or_default();
    if ports.iter().all(kept) {
        return Cow::Borrowed(slice);
    }
    let mut owned = slice.clone();
    owned.ports = Some(ports.iter().filter(|p| kept(p)).cloned().collect());
    Cow::Owned(owned)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::desired::mcs::change::{Change, derived_change, import_change, mcs_slice_change};
    use crate::desired::mcs::test_support::*;
    use crate::desired::mcs::types::{HEADLESS, ServiceExport};
    use crate::desired::test_support::endpoint;
    use serde_json::{Value, json};

    /// A slice of `shop/hello` as kube-controller-manager writes it.
    fn kcm_slice(name: &str, address_type: &str, endpoints: Vec<Value>) -> EndpointSlice {
        kcm_slice_with(
            name,
            address_type,
            json!([{"name": "tcp", "port": 42, "protocol": "TCP"},
                   {"name": "udp", "port": 42, "protocol": "UDP"}]),
            endpoints,
        )
    }

    /// A slice of `shop/hello` with these ports (kube-controller-manager writes the Service
    /// ports' names and protocols with the pods' target port numbers).
    fn kcm_slice_with(
        name: &str,
        address_type: &str,
        ports: Value,
        endpoints: Vec<Value>,
    ) -> EndpointSlice {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "shop",
                         "labels": {"kubernetes.io/service-name": "hello",
                                    "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"}},
            "addressType": address_type,
            "ports": ports,
            "endpoints": endpoints,
        }))
        .unwrap()
    }

    /// Each desired slice's source cluster with its ports as `name/protocol/number`.
    fn slice_ports(got: &Import) -> Vec<(String, Vec<String>)> {
        got.slices
            .iter()
            .map(|s| {
                let cluster = crate::desired::mcs::slice_source_cluster(s).unwrap_or_default();
                let ports = s
                    .ports
                    .iter()
                    .flatten()
                    .map(|p| {
                        format!(
                            "{}/{}/{}",
                            p.name.as_deref().unwrap_or(""),
                            p.protocol.as_deref().unwrap_or(""),
                            p.port.unwrap_or_default()
                        )
                    })
                    .collect();
                (cluster.to_string(), ports)
            })
            .collect()
    }

    /// The StrictPortConflict spec of the suite's connectivity.go: cluster 2's hello has only
    /// `tcp` 4242 (targetPort 42) against cluster 1's `tcp` 42 and `udp` 42.
    fn strict_port_conflict(
        b: &Bed,
        east: &Service,
        west: &Service,
        east_slice: &EndpointSlice,
        west_slice: &EndpointSlice,
        ips: &[&str],
    ) -> Import {
        let exports = [
            ClusterExport {
                cluster: "west",
                export: &b.newer,
                service: Some(west),
                slices: vec![west_slice],
            },
            ClusterExport {
                cluster: "east",
                export: &b.older,
                service: Some(east),
                slices: vec![east_slice],
            },
        ];
        if ips.is_empty() {
            let first = import("shop", "hello", &exports, None, None)
                .unwrap()
                .unwrap();
            let live_si = created(&first.service_import);
            import("shop", "hello", &exports, Some(&live_si), None)
                .unwrap()
                .unwrap()
        } else {
            converge(&exports, ips, &["IPv4"])
        }
    }

    /// The live ServiceImport as the API server returns `desired` once created.
    fn created(desired: &ServiceImport) -> ServiceImport {
        let mut si = desired.clone();
        si.metadata.uid = Some("si-uid".into());
        si.metadata.resource_version = Some("7".into());
        si
    }

    /// A live derived Service with these clusterIPs.
    fn live_derived(desired: &Service, ips: &[&str], families: &[&str]) -> Service {
        let mut v = serde_json::to_value(desired).unwrap();
        v["metadata"]["uid"] = json!("derived-uid");
        v["spec"]["clusterIP"] = json!(ips[0]);
        v["spec"]["clusterIPs"] = json!(ips);
        v["spec"]["ipFamilies"] = json!(families);
        v["spec"]["internalTrafficPolicy"] = json!("Cluster");
        serde_json::from_value(v).unwrap()
    }

    struct Bed {
        older: ServiceExport,
        newer: ServiceExport,
    }

    fn bed() -> Bed {
        Bed {
            older: export("east", "2024-01-01T00:00:00Z"),
            newer: export("west", "2024-01-01T00:00:02Z"),
        }
    }

    /// Runs the import to its fixed point as the wiring would: create the ServiceImport, then
    /// the derived Service (which the API server gives `ips`), then fill in the IPs.
    fn converge(exports: &[ClusterExport<'_>], ips: &[&str], families: &[&str]) -> Import {
        let first = import("shop", "hello", exports, None, None)
            .unwrap()
            .unwrap();
        assert!(first.derived.is_none() && first.slices.is_empty());
        let live_si = created(&first.service_import);
        let second = import("shop", "hello", exports, Some(&live_si), None)
            .unwrap()
            .unwrap();
        let derived = second.derived.clone().unwrap();
        let live = live_derived(&derived, ips, families);
        import("shop", "hello", exports, Some(&live_si), Some(&live))
            .unwrap()
            .unwrap()
    }

    #[test]
    fn derived_names_match_the_reference_controller() {
        // computed with mcs-api's derivedName (Go: base32.HexEncoding of sha256)
        assert_eq!(derived_name("shop", "web"), "derived-isrlchlhrq");
        assert_eq!(
            derived_name("mcs-conformance-1", "hello"),
            "derived-ekn3sqmcj3"
        );
        let long = derived_name(&"n".repeat(63), &"s".repeat(63));
        assert_eq!(long.len(), "derived-".len() + 10);
        assert!(meta::is_dns1123_subdomain(&long) && !long.contains('.'));
    }

    #[test]
    fn cluster_ip_export_conformance() {
        let b = bed();
        let svc = hello();
        let ep = kcm_slice("hello-abc", "IPv4", vec![endpoint("10.1.0.5")]);
        let exports = [ClusterExport {
            cluster: "east",
            export: &b.older,
            service: Some(&svc),
            slices: vec![&ep],
        }];
        let got = converge(&exports, &["10.96.7.7"], &["IPv4"]);
        let si = &got.service_import;
        assert_eq!(si.metadata.name.as_deref(), Some("hello"));
        assert_eq!(si.spec.type_, CLUSTER_SET_IP);
        // conformance: ports, affinity and its config, traffic policy as the Service's
        let ports: Vec<(&str, &str, i32)> = si
            .spec
            .ports
            .iter()
            .map(|p| (p.name.as_str(), p.protocol.as_str(), p.port))
            .collect();
        assert_eq!(ports, [("tcp", "TCP", 42), ("udp", "UDP", 42)]);
        assert_eq!(si.spec.session_affinity, "ClientIP");
        assert_eq!(
            si.spec.session_affinity_config,
            svc.spec.as_ref().unwrap().session_affinity_config
        );
        assert_eq!(si.spec.internal_traffic_policy.as_deref(), Some("Cluster"));
        assert_eq!(si.spec.traffic_distribution, None);
        // conformance: one IP per family, in the same order
        assert_eq!(si.spec.ips, ["10.96.7.7"]);
        assert_eq!(si.spec.ip_families, ["IPv4"]);
        let clusters: Vec<&str> = si
            .status
            .as_ref()
            .unwrap()
            .clusters
            .iter()
            .map(|c| c.cluster.as_str())
            .collect();
        assert_eq!(clusters, ["east"]);
        // conformance (optional): the Service's labels and annotations are not exported
        let labels = si.metadata.labels.as_ref().unwrap();
        assert!(!labels.contains_key("dummy-svc"));
        assert_eq!(labels[OWNER_LABEL], MANAGED_BY);
        assert_eq!(
            si.metadata.annotations.as_ref().unwrap()[DERIVED_SERVICE_ANNOTATION],
            derived_name("shop", "hello")
        );

        let derived = got.derived.as_ref().unwrap();
        let spec = derived.spec.as_ref().unwrap();
        assert_eq!(derived.metadata.name, Some(derived_name("shop", "hello")));
        assert_eq!(spec.type_.as_deref(), Some("ClusterIP"));
        assert!(spec.selector.is_none() && spec.cluster_ip.is_none());
        assert_eq!(spec.ports.as_ref().unwrap().len(), 2);
        assert_eq!(spec.session_affinity.as_deref(), Some("ClientIP"));
        assert_eq!(spec.ip_families, Some(vec!["IPv4".to_string()]));
        assert_eq!(spec.ip_family_policy.as_deref(), Some("SingleStack"));
        let owner = &derived.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
            ("ServiceImport", "hello", "si-uid")
        );
        assert_eq!(owner.api_version, "multicluster.x-k8s.io/v1beta1");
        assert!(derived_is_ours(derived));

        // conformance (optional): an MCS slice with the MCS labels, not made by the KCM
        assert_eq!(got.slices.len(), 1);
        let s = &got.slices[0];
        let l = s.metadata.labels.as_ref().unwrap();
        assert_eq!(l[MCS_SERVICE_NAME_LABEL], "hello");
        assert_eq!(l[MCS_SOURCE_CLUSTER_LABEL], "east");
        assert_eq!(l[SERVICE_NAME_LABEL], derived_name("shop", "hello"));
        assert_eq!(l[MANAGED_BY_LABEL], MANAGED_BY);
        assert_eq!(l.len(), 4);
        assert!(s.metadata.annotations.is_none());
        assert_eq!(s.metadata.owner_references.as_ref().unwrap()[0], *owner);
        let name = s.metadata.name.as_deref().unwrap();
        assert!(name.starts_with(&format!("{}-", derived_name("shop", "hello"))));
        assert!(meta::is_dns1123_subdomain(name));
        let e = &s.endpoints[0];
        assert_eq!(e.addresses, ["10.1.0.5"]);
        assert!(e.node_name.is_none() && e.target_ref.is_none());
        assert_eq!(e.zone.as_deref(), Some("zone-a"));
        assert!(got.conflicts.is_empty() && got.dropped.is_empty());
    }

    #[test]
    fn the_fixed_point_writes_nothing() {
        let b = bed();
        let (a, c) = (hello(), hello());
        let (ea, ec) = (
            kcm_slice("hello-a", "IPv4", vec![endpoint("10.1.0.5")]),
            kcm_slice("hello-c", "IPv4", vec![endpoint("10.2.0.5")]),
        );
        let exports = [
            ClusterExport {
                cluster: "east",
                export: &b.older,
                service: Some(&a),
                slices: vec![&ea],
            },
            ClusterExport {
                cluster: "west",
                export: &b.newer,
                service: Some(&c),
                slices: vec![&ec],
            },
        ];
        let got = converge(&exports, &["10.96.7.7"], &["IPv4"]);
        let mut live_si = created(&got.service_import);
        assert_eq!(
            import_change(Some(&live_si), &got.service_import),
            Change::Unchanged
        );
        let derived = got.derived.as_ref().unwrap();
        let live = live_derived(derived, &["10.96.7.7"], &["IPv4"]);
        assert_eq!(derived_change(Some(&live), derived), Change::Unchanged);
        for s in &got.slices {
            let mut live = s.clone();
            live.metadata.resource_version = Some("3".into());
            assert_eq!(mcs_slice_change(Some(&live), s), Change::Unchanged);
        }
        // two clusters: two sets of slices, never the same name
        assert_eq!(got.slices.len(), 2);
        assert_ne!(got.slices[0].metadata.name, got.slices[1].metadata.name);
        // and a second import with the same inputs is the same
        live_si.metadata.resource_version = Some("8".into());
        let again = import("shop", "hello", &exports, Some(&live_si), Some(&live))
            .unwrap()
            .unwrap();
        assert_eq!(again, got);
    }

    #[test]
    fn headless_export_conformance() {
        let b = bed();
        let svc = hello_with(json!({"clusterIP": "None", "clusterIPs": ["None"],
                                    "ipFamilies": ["IPv4", "IPv6"]}));
        let mut ep = endpoint("10.1.0.5");
        ep["hostname"] = json!("hello-ss-0");
        let v4 = kcm_slice("hello-v4", "IPv4", vec![ep]);
        let mut ep6 = endpoint("fd00::5");
        ep6["hostname"] = json!("hello-ss-0");
        let v6 = kcm_slice("hello-v6", "IPv6", vec![ep6]);
        let exports = [ClusterExport {
            cluster: "east",
            export: &b.older,
            service: Some(&svc),
            slices: vec![&v4, &v6],
        }];
        let first = import("shop", "hello", &exports, None, None)
            .unwrap()
            .unwrap();
        let live_si = created(&first.service_import);
        let got = import("shop", "hello", &exports, Some(&live_si), None)
            .unwrap()
            .unwrap();
        let si = &got.service_import;
        assert_eq!(si.spec.type_, HEADLESS);
        // conformance: no clusterset IP for a headless import, but its families
        assert!(si.spec.ips.is_empty());
        assert_eq!(si.spec.ip_families, ["IPv4", "IPv6"]);
        let derived = got.derived.as_ref().unwrap();
        let spec = derived.spec.as_ref().unwrap();
        assert_eq!(spec.cluster_ip.as_deref(), Some("None"));
        assert!(spec.ip_families.is_none() && spec.session_affinity.is_none());
        // a live headless derived Service gives no IPs either
        let live = live_derived(derived, &["None"], &["IPv4", "IPv6"]);
        let again = import("shop", "hello", &exports, Some(&live_si), Some(&live))
            .unwrap()
            .unwrap();
        assert!(again.service_import.spec.ips.is_empty());
        // one slice per address type, hostnames kept for <hostname>.<clusterid>.<svc>...
        let types: Vec<&str> = got.slices.iter().map(|s| s.address_type.as_str()).collect();
        assert_eq!(types.len(), 2);
        assert!(types.contains(&"IPv4") && types.contains(&"IPv6"));
        assert!(
            got.slices
                .iter()
                .all(|s| s.endpoints[0].hostname.as_deref() == Some("hello-ss-0"))
        );
    }

    #[test]
    fn ipv6_cluster_ip_export() {
        let b = bed();
        let svc = hello_with(
            json!({"clusterIP": "fd00:96::42", "clusterIPs": ["fd00:96::42"],
                                    "ipFamilies": ["IPv6"], "ipFamilyPolicy": "SingleStack"}),
        );
        let ep = kcm_slice("hello-v6", "IPv6", vec![endpoint("fd00:1::5")]);
        let exports = [ClusterExport {
            cluster: "east",
            export: &b.older,
            service: Some(&svc),
            slices: vec![&ep],
        }];
        let got = converge(&exports, &["fd00:96::7"], &["IPv6"]);
        assert_eq!(got.service_import.spec.ips, ["fd00:96::7"]);
        assert_eq!(got.service_import.spec.ip_families, ["IPv6"]);
        let spec = got.derived.as_ref().unwrap().spec.as_ref().unwrap();
        assert_eq!(spec.ip_families, Some(vec!["IPv6".to_string()]));
        assert_eq!(spec.ip_family_policy.as_deref(), Some("SingleStack"));
        assert_eq!(got.slices[0].address_type, "IPv6");
    }

    #[test]
    fn dual_stack_ips_follow_the_derived_service_order() {
        let b = bed();
        let svc = hello_with(json!({"clusterIPs": ["10.96.0.42", "fd00:96::42"],
                                    "ipFamilies": ["IPv4", "IPv6"]}));
        let exports = [member("east", &b.older, Some(&svc))];
        let got = converge(&exports, &["10.96.7.7", "fd00:96::7"], &["IPv4", "IPv6"]);
        assert_eq!(got.service_import.spec.ips, ["10.96.7.7", "fd00:96::7"]);
        assert_eq!(got.service_import.spec.ip_families, ["IPv4", "IPv6"]);
        let spec = got.derived.as_ref().unwrap().spec.as_ref().unwrap();
        assert_eq!(spec.ip_family_policy.as_deref(), Some("PreferDualStack"));
        assert_eq!(spec.ip_families, Some(vec!["IPv4".to_string()]));
    }

    #[test]
    fn two_clusters_ports_union_conformance() {
        let b = bed();
        let a = hello();
        let c = hello_with(json!({"ports": [
            {"name": "tcp", "port": 42, "protocol": "TCP"},
            {"name": "stcp", "port": 142, "protocol": "SCTP"}]}));
        let exports = [
            member("west", &b.newer, Some(&c)),
            member("east", &b.older, Some(&a)),
        ];
        let got = converge(&exports, &["10.96.7.7"], &["IPv4"]);
        let names: Vec<&str> = got
            .service_import
            .spec
            .ports
            .iter()
            .map(|p| p.name.as_str())
            .collect();
        assert_eq!(names, ["stcp", "tcp", "udp"]);
        let reasons: Vec<&str> = got.conflicts.iter().map(|c| c.reason.reason()).collect();
        assert_eq!(reasons, ["PortConflict"]);
        let derived_ports = got.derived.unwrap().spec.unwrap().ports.unwrap();
        assert_eq!(derived_ports.len(), 3);
        let clusters = &got.service_import.status.as_ref().unwrap().clusters;
        assert_eq!(clusters.len(), 2);
        assert_eq!(clusters[0].cluster, "east");
    }

    #[test]
    fn a_losing_port_of_the_same_name_reaches_only_the_winner() {
        // conformance (StrictPortConflict): west exports `tcp` 4242 against east's `tcp` 42.
        // Its slice names the port `tcp` with the pods' port 42; carried over, kube-proxy would
        // send the import's tcp/42 to west's pods.
        let b = bed();
        let east = hello();
        let west = hello_with(json!({"ports": [
            {"name": "tcp", "port": 4242, "protocol": "TCP", "targetPort": 42}]}));
        let ea = kcm_slice("hello-a", "IPv4", vec![endpoint("10.1.0.5")]);
        let wa = kcm_slice_with(
            "hello-w",
            "IPv4",
            json!([{"name": "tcp", "port": 42, "protocol": "TCP"}]),
            vec![endpoint("10.2.0.5")],
        );
        let got = strict_port_conflict(&b, &east, &west, &ea, &wa, &["10.96.7.7"]);
        let ports: Vec<(&str, &str, i32)> = got
            .service_import
            .spec
            .ports
            .iter()
            .map(|p| (p.name.as_str(), p.protocol.as_str(), p.port))
            .collect();
        assert_eq!(ports, [("tcp", "TCP", 42), ("udp", "UDP", 42)]);
        let reasons: Vec<&str> = got.conflicts.iter().map(|c| c.reason.reason()).collect();
        assert_eq!(reasons, ["PortConflict"]);
        // west's endpoints serve no port of the import: no slice of west at all
        assert_eq!(
            slice_ports(&got),
            [(
                "east".to_string(),
                vec!["tcp/TCP/42".to_string(), "udp/UDP/42".to_string()]
            )]
        );
        // west still exports hello: it stays in the import's clusters
        let clusters: Vec<&str> = got
            .service_import
            .status
            .as_ref()
            .unwrap()
            .clusters
            .iter()
            .map(|c| c.cluster.as_str())
            .collect();
        assert_eq!(clusters, ["east", "west"]);
    }

    #[test]
    fn a_losing_port_of_another_protocol_is_dropped_and_its_others_kept() {
        // west's `udp` is SCTP: it loses to east's `udp` UDP/42; its `tcp` is east's and stays
        let b = bed();
        let east = hello();
        let west = hello_with(json!({"ports": [
            {"name": "tcp", "port": 42, "protocol": "TCP", "targetPort": 8042},
            {"name": "udp", "port": 42, "protocol": "SCTP", "targetPort": 42}]}));
        let ea = kcm_slice("hello-a", "IPv4", vec![endpoint("10.1.0.5")]);
        let wa = kcm_slice_with(
            "hello-w",
            "IPv4",
            json!([{"name": "tcp", "port": 8042, "protocol": "TCP"},
                   {"name": "udp", "port": 42, "protocol": "SCTP"}]),
            vec![endpoint("10.2.0.5")],
        );
        let got = strict_port_conflict(&b, &east, &west, &ea, &wa, &["10.96.7.7"]);
        let mut got_ports = slice_ports(&got);
        got_ports.sort();
        assert_eq!(
            got_ports,
            [
                (
                    "east".to_string(),
                    vec!["tcp/TCP/42".to_string(), "udp/UDP/42".to_string()]
                ),
                // the same Service port (tcp TCP/42), west's own target port
                ("west".to_string(), vec!["tcp/TCP/8042".to_string()]),
            ]
        );
    }

    #[test]
    fn differently_named_ports_reach_each_only_its_cluster() {
        // conformance (StrictPortConflict): west's `tcp2` 4242 joins the import, its traffic
        // goes only to west, and tcp/42 only to east
        let b = bed();
        let east = hello();
        let west = hello_with(json!({"ports": [
            {"name": "tcp2", "port": 4242, "protocol": "TCP", "targetPort": 42}]}));
        let ea = kcm_slice("hello-a", "IPv4", vec![endpoint("10.1.0.5")]);
        let wa = kcm_slice_with(
            "hello-w",
            "IPv4",
            json!([{"name": "tcp2", "port": 42, "protocol": "TCP"}]),
            vec![endpoint("10.2.0.5")],
        );
        let got = strict_port_conflict(&b, &east, &west, &ea, &wa, &["10.96.7.7"]);
        let names: Vec<&str> = got
            .service_import
            .spec
            .ports
            .iter()
            .map(|p| p.name.as_str())
            .collect();
        assert_eq!(names, ["tcp", "tcp2", "udp"]);
        let mut got_ports = slice_ports(&got);
        got_ports.sort();
        assert_eq!(
            got_ports,
            [
                (
                    "east".to_string(),
                    vec!["tcp/TCP/42".to_string(), "udp/UDP/42".to_string()]
                ),
                ("west".to_string(), vec!["tcp2/TCP/42".to_string()]),
            ]
        );
    }

    #[test]
    fn a_headless_import_keeps_a_losers_endpoints_without_the_conflicting_port() {
        // no kube-proxy for a headless import, but SRV records come from slice ports: west's
        // pods must not answer for east's `tcp`; their addresses and hostnames still answer
        let b = bed();
        let east = hello_with(json!({"clusterIP": "None", "clusterIPs": ["None"]}));
        let west = hello_with(
            json!({"clusterIP": "None", "clusterIPs": ["None"], "ports": [
            {"name": "tcp", "port": 4242, "protocol": "TCP", "targetPort": 42}]}),
        );
        let ea = kcm_slice("hello-a", "IPv4", vec![endpoint("10.1.0.5")]);
        let mut wep = endpoint("10.2.0.5");
        wep["hostname"] = json!("hello-ss-0");
        let wa = kcm_slice_with(
            "hello-w",
            "IPv4",
            json!([{"name": "tcp", "port": 42, "protocol": "TCP"}]),
            vec![wep],
        );
        let got = strict_port_conflict(&b, &east, &west, &ea, &wa, &[]);
        assert_eq!(got.service_import.spec.type_, HEADLESS);
        let mut got_ports = slice_ports(&got);
        got_ports.sort();
        assert_eq!(
            got_ports,
            [
                (
                    "east".to_string(),
                    vec!["tcp/TCP/42".to_string(), "udp/UDP/42".to_string()]
                ),
                ("west".to_string(), vec![]),
            ]
        );
        let west_slice = got
            .slices
            .iter()
            .find(|s| crate::desired::mcs::slice_source_cluster(s) == Some("west"))
            .unwrap();
        assert!(west_slice.ports.is_none());
        assert_eq!(west_slice.endpoints[0].addresses, ["10.2.0.5"]);
        assert_eq!(
            west_slice.endpoints[0].hostname.as_deref(),
            Some("hello-ss-0")
        );
    }

    #[test]
    fn conflicting_type_takes_the_oldest() {
        // conformance: east exported first (ClusterIP), west headless: ClusterSetIP everywhere
        let b = bed();
        let (a, c) = (hello(), hello_with(json!({"clusterIP": "None"})));
        let exports = [
            member("west", &b.newer, Some(&c)),
            member("east", &b.older, Some(&a)),
        ];
        let got = import("shop", "hello", &exports, None, None)
            .unwrap()
            .unwrap();
        assert_eq!(got.service_import.spec.type_, CLUSTER_SET_IP);
        assert_eq!(got.conflicts[0].reason.reason(), "TypeConflict");
    }

    #[test]
    fn session_affinity_and_traffic_fields_come_from_the_winner() {
        let b = bed();
        let a = hello_with(
            json!({"sessionAffinity": "None", "sessionAffinityConfig": null,
                                  "trafficDistribution": "PreferClose",
                                  "internalTrafficPolicy": "Local"}),
        );
        let c = hello();
        let exports = [
            member("east", &b.older, Some(&a)),
            member("west", &b.newer, Some(&c)),
        ];
        let got = converge(&exports, &["10.96.7.7"], &["IPv4"]);
        let spec = &got.service_import.spec;
        assert_eq!(spec.session_affinity, "None");
        assert!(spec.session_affinity_config.is_none());
        assert_eq!(spec.traffic_distribution.as_deref(), Some("PreferClose"));
        assert_eq!(spec.internal_traffic_policy.as_deref(), Some("Local"));
        let derived = got.derived.unwrap().spec.unwrap();
        assert_eq!(derived.traffic_distribution.as_deref(), Some("PreferClose"));
        assert_eq!(derived.internal_traffic_policy.as_deref(), Some("Local"));
        let reasons: Vec<&str> = got.conflicts.iter().map(|c| c.reason.reason()).collect();
        assert_eq!(
            reasons,
            [
                "SessionAffinityConflict",
                "InternalTrafficPolicyConflict",
                "TrafficDistributionConflict"
            ]
        );
    }

    #[test]
    fn no_valid_export_no_import() {
        // conformance: unexported everywhere, or only an ExternalName export
        let b = bed();
        let external = hello_with(
            json!({"type": "ExternalName", "externalName": "example.com",
                                         "clusterIP": null}),
        );
        assert_eq!(import("shop", "hello", &[], None, None), Ok(None));
        let only_external = [member("east", &b.older, Some(&external))];
        assert_eq!(
            import("shop", "hello", &only_external, None, None),
            Ok(None)
        );
        let no_service = [member("east", &b.older, None)];
        assert_eq!(import("shop", "hello", &no_service, None, None), Ok(None));
    }

    #[test]
    fn unexport_of_one_of_two_keeps_the_import_from_the_other() {
        let b = bed();
        let (a, c) = (hello(), hello());
        let (ea, ec) = (
            kcm_slice("hello-a", "IPv4", vec![endpoint("10.1.0.5")]),
            kcm_slice("hello-c", "IPv4", vec![endpoint("10.2.0.5")]),
        );
        let both = [
            ClusterExport {
                cluster: "east",
                export: &b.older,
                service: Some(&a),
                slices: vec![&ea],
            },
            ClusterExport {
                cluster: "west",
                export: &b.newer,
                service: Some(&c),
                slices: vec![&ec],
            },
        ];
        let before = converge(&both, &["10.96.7.7"], &["IPv4"]);
        let after = converge(&both[1..], &["10.96.7.7"], &["IPv4"]);
        let clusters = &after.service_import.status.as_ref().unwrap().clusters;
        assert_eq!(clusters.len(), 1);
        assert_eq!(clusters[0].cluster, "west");
        assert_eq!(after.slices.len(), 1);
        // east's slice is surplus now (its deletion still needs proof east stopped exporting)
        let live: Vec<&EndpointSlice> = before.slices.iter().collect();
        let surplus = crate::desired::mcs::surplus_slices(&live, "hello", &after.slices);
        assert_eq!(surplus.len(), 1);
        assert_eq!(
            crate::desired::mcs::slice_source_cluster(surplus[0]),
            Some("east")
        );
    }

    #[test]
    fn exported_labels_and_annotations_of_the_winner_only() {
        let mut b = bed();
        b.older
            .spec
            .exported_labels
            .insert("dummy-label".into(), "true".into());
        b.older
            .spec
            .exported_annotations
            .insert("dummy-annotation".into(), "true".into());
        b.newer
            .spec
            .exported_labels
            .insert("dummy-label2".into(), "true".into());
        let svc = hello();
        let exports = [
            member("east", &b.older, Some(&svc)),
            member("west", &b.newer, Some(&svc)),
        ];
        let got = import("shop", "hello", &exports, None, None)
            .unwrap()
            .unwrap();
        let m = &got.service_import.metadata;
        let labels = m.labels.as_ref().unwrap();
        assert_eq!(labels["dummy-label"], "true");
        assert!(!labels.contains_key("dummy-label2"));
        let annotations = m.annotations.as_ref().unwrap();
        assert_eq!(annotations["dummy-annotation"], "true");
        assert_eq!(annotations[COPIED_LABELS_ANNOTATION], "dummy-label");
        assert_eq!(
            annotations[COPIED_ANNOTATIONS_ANNOTATION],
            "dummy-annotation"
        );
        assert_eq!(got.conflicts[0].reason.reason(), "LabelsConflict");
    }

    #[test]
    fn refused_exported_metadata_is_dropped_and_ours_cannot_be_overridden() {
        let mut b = bed();
        let l = &mut b.older.spec.exported_labels;
        l.insert("ok".into(), "yes".into());
        l.insert("bad key!".into(), "x".into());
        l.insert("long".into(), "v".repeat(64));
        l.insert(OWNER_LABEL.into(), "someone-else".into());
        let a = &mut b.older.spec.exported_annotations;
        a.insert("note".into(), "x".into());
        a.insert(DERIVED_SERVICE_ANNOTATION.into(), "elsewhere".into());
        a.insert("example.com/copied-labels".into(), "x".into());
        let svc = hello();
        let exports = [member("east", &b.older, Some(&svc))];
        let got = import("shop", "hello", &exports, None, None)
            .unwrap()
            .unwrap();
        let m = &got.service_import.metadata;
        assert_eq!(m.labels.as_ref().unwrap()[OWNER_LABEL], MANAGED_BY);
        assert_eq!(m.labels.as_ref().unwrap()["ok"], "yes");
        assert_eq!(
            m.annotations.as_ref().unwrap()[DERIVED_SERVICE_ANNOTATION],
            derived_name("shop", "hello")
        );
        let mut dropped = got.dropped.clone();
        dropped.sort();
        assert_eq!(
            dropped,
            [
                "annotation example.com/copied-labels",
                "annotation multicluster.kubernetes.io/derived-service",
                "label app.kubernetes.io/managed-by",
                "label bad key!",
                "label long",
            ]
        );
        assert!(meta::validate(m).is_ok());

        let mut huge = bed();
        huge.older
            .spec
            .exported_annotations
            .insert("big".into(), "x".repeat(200 * 1024));
        let exports = [member("east", &huge.older, Some(&svc))];
        let got = import("shop", "hello", &exports, None, None)
            .unwrap()
            .unwrap();
        assert_eq!(got.dropped, ["annotations (too large)"]);
        let annotations = got.service_import.metadata.annotations.unwrap();
        assert!(!annotations.contains_key("big"));
        assert_eq!(annotations[COPIED_ANNOTATIONS_ANNOTATION], "");
    }

    #[test]
    fn a_foreign_service_import_gets_nothing_derived() {
        let b = bed();
        let svc = hello();
        let exports = [member("east", &b.older, Some(&svc))];
        let first = import("shop", "hello", &exports, None, None)
            .unwrap()
            .unwrap();
        let mut foreign = created(&first.service_import);
        foreign
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert(OWNER_LABEL.into(), "another-mcs".into());
        let got = import("shop", "hello", &exports, Some(&foreign), None)
            .unwrap()
            .unwrap();
        assert!(got.derived.is_none() && got.slices.is_empty());
        assert_eq!(
            import_change(Some(&foreign), &got.service_import),
            Change::NotOurs
        );
    }

    #[test]
    fn slices_we_wrote_are_not_exported_again_and_other_services_are_ignored() {
        let b = bed();
        let svc = hello();
        let own = kcm_slice("hello-a", "IPv4", vec![endpoint("10.1.0.5")]);
        let mut mirrored = kcm_slice("hello-m", "IPv4", vec![endpoint("10.9.0.5")]);
        mirrored
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert(MANAGED_BY_LABEL.into(), MANAGED_BY.into());
        let mut other = kcm_slice("web-a", "IPv4", vec![endpoint("10.8.0.5")]);
        other
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert(SERVICE_NAME_LABEL.into(), "web".into());
        let mut unlabelled = kcm_slice("hello-u", "IPv4", vec![endpoint("10.7.0.5")]);
        unlabelled
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .remove(SERVICE_NAME_LABEL);
        let exports = [ClusterExport {
            cluster: "east",
            export: &b.older,
            service: Some(&svc),
            slices: vec![&own, &mirrored, &other, &unlabelled],
        }];
        let got = converge(&exports, &["10.96.7.7"], &["IPv4"]);
        let addresses: Vec<&str> = got
            .slices
            .iter()
            .flat_map(|s| s.endpoints.iter().map(|e| e.addresses[0].as_str()))
            .collect();
        assert_eq!(addresses, ["10.1.0.5"]);
    }

    #[test]
    fn large_exports_are_chunked_at_1000() {
        let b = bed();
        let svc = hello();
        let many: Vec<Value> = (0..2500)
            .map(|i| endpoint(&format!("10.{}.{}.{}", i / 62500, (i / 250) % 250, i % 250)))
            .collect();
        let big = kcm_slice("hello-big", "IPv4", many);
        let exports = [ClusterExport {
            cluster: "east",
            export: &b.older,
            service: Some(&svc),
            slices: vec![&big],
        }];
        let got = converge(&exports, &["10.96.7.7"], &["IPv4"]);
        let sizes: Vec<usize> = got.slices.iter().map(|s| s.endpoints.len()).collect();
        assert_eq!(sizes, [1000, 1000, 500]);
    }

    #[test]
    fn not_ready_and_terminating_endpoints_are_mirrored() {
        let b = bed();
        let svc = hello();
        let mut terminating = endpoint("10.1.0.6");
        terminating["conditions"] = json!({"ready": false, "serving": true, "terminating": true});
        let ep = kcm_slice("hello-a", "IPv4", vec![endpoint("10.1.0.5"), terminating]);
        let exports = [ClusterExport {
            cluster: "east",
            export: &b.older,
            service: Some(&svc),
            slices: vec![&ep],
        }];
        let got = converge(&exports, &["10.96.7.7"], &["IPv4"]);
        let c = got.slices[0].endpoints[1].conditions.as_ref().unwrap();
        assert_eq!(
            (c.ready, c.serving, c.terminating),
            (Some(false), Some(true), Some(true))
        );
    }
}
