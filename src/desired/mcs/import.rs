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
use super::readiness::{self, ENDPOINTS_ANNOTATION, EndpointCounts, Marks};
use super::types::{
    CLUSTER_SET_IP, ClusterStatus, MCS_API_VERSION, ServiceExportSpec, ServiceImport,
    ServiceImportSpec, ServiceImportStatus, ServicePort,
};
use super::{
    COPIED_ANNOTATIONS_ANNOTATION, COPIED_LABELS_ANNOTATION, DERIVED_SERVICE_ANNOTATION,
    HOLDER_ANNOTATION, MCS_SERVICE_NAME_LABEL, OWNER_LABEL,
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
    /// Each exporting cluster's endpoints as published (counted whether or not `slices` are
    /// derived yet), as the ServiceImport's [`ENDPOINTS_ANNOTATION`] tells them (see
    /// `readiness`; [`Import::mark_endpoints`] adds the marks).
    pub endpoints: EndpointCounts,
}

impl Import {
    /// Flags the exporting clusters whose endpoints are published not ready (`marks`, by the
    /// name they go by: cut off by the data-path probe, stale by the outage policy), in
    /// `endpoints` and on the ServiceImport's annotation.
    pub fn mark_endpoints(&mut self, marks: &BTreeMap<String, Marks>) {
        readiness::mark(&mut self.endpoints, marks);
        readiness::annotate(&mut self.service_import, &self.endpoints);
    }
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
/// any: the first gives the holder of the import's properties (see `judge`) and the uid the
/// derived objects are owned by (a ServiceImport that is not ours gives neither, so nothing of
/// the key is derived), the second the clusterset IPs (`spec.ips`, with `spec.ipFamilies` read
/// from them, so both agree in length and order). The desired ServiceImport records the
/// winner as the holder ([`HOLDER_ANNOTATION`]).
pub fn import(
    namespace: &str,
    name: &str,
    exports: &[ClusterExport<'_>],
    live_import: Option<&ServiceImport>,
    live_derived: Option<&Service>,
) -> Result<Option<Import>, McsError> {
    let judgement = judge(namespace, name, exports, holder(live_import))?;
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

    let (labels, mut annotations, dropped) = import_metadata(&winner.export.spec, &derived);
    annotations.insert(HOLDER_ANNOTATION.to_string(), winner.cluster.to_string());

    let mut clusters: Vec<ClusterStatus> = judgement
        .members
        .iter()
        .map(|e| ClusterStatus {
            cluster: e.cluster.to_string(),
        })
        .collect();
    clusters.sort();

    let mut service_import = ServiceImport {
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

    // built for every cluster, so the import tells its endpoints from its first write
    let built = endpoint_slices(&judgement, &service_import.spec, namespace, name, &derived);
    let clusters = service_import
        .status
        .as_ref()
        .map(|s| s.clusters.as_slice());
    let endpoints = readiness::count(clusters.unwrap_or_default(), &built);
    readiness::annotate(&mut service_import, &endpoints);

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
            owned(built, &owner),
        ),
        None => (None, Vec::new()),
    };

    Ok(Some(Import {
        service_import,
        derived: derived_service,
        slices: derived_slices,
        conflicts: judgement.conflicts.clone(),
        dropped,
        endpoints,
    }))
}

/// The holder of the import's properties a live ServiceImport of ours records, if any.
pub(crate) fn holder(live_import: Option<&ServiceImport>) -> Option<&str> {
    live_import
        .filter(|si| import_is_ours(si))?
        .metadata
        .annotations
        .as_ref()?
        .get(HOLDER_ANNOTATION)
        .map(String::as_str)
}

/// A key no export may set on the ServiceImport, label or annotation: a reserved prefix
/// (`kubernetes.io`, `k8s.io`, `x-k8s.io` and their subdomains, ours), the rule a remote's
/// labels pass in the label mode.
fn reserved(key: &str) -> bool {
    crate::desired::containment::reserved(key, crate::desired::DEFAULT_LABEL_KEY)
}

/// The ServiceImport's labels and annotations: the winning export's `exportedLabels` and
/// `exportedAnnotations`, less what the API server would refuse, what carries a reserved
/// prefix or what would pass for ours (listed in the third part), with ours on top and a
/// record of the keys copied.
fn import_metadata(
    exported: &ServiceExportSpec,
    derived: &str,
) -> (StringMap, StringMap, Vec<String>) {
    let mut dropped = Vec::new();
    let mut labels: StringMap = exported
        .exported_labels
        .iter()
        .filter(|(k, v)| {
            let ok =
                meta::validate_label(k, v).is_ok() && k.as_str() != OWNER_LABEL && !reserved(k);
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
        ENDPOINTS_ANNOTATION,
        HOLDER_ANNOTATION,
    ];
    let mut annotations: StringMap = exported
        .exported_annotations
        .iter()
        .filter(|(k, _)| {
            // a key ending like our record of copied labels would be taken for it
            let ok = meta::validate_qualified_name(k).is_ok()
                && !ours.contains(&k.as_str())
                && !reserved(k)
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
/// again: only a cluster's own endpoints are its. Built without their owner (see [`owned`]).
fn endpoint_slices(
    judgement: &Judgement<'_, '_>,
    spec: &ServiceImportSpec,
    namespace: &str,
    name: &str,
    derived: &str,
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
        out.extend(slices::build_slices(
            &groups,
            derived,
            e.cluster,
            namespace,
            &labels,
            &StringMap::new(),
        ));
    }
    out.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    out
}

/// The slices owned by the ServiceImport.
fn owned(mut built: Vec<EndpointSlice>, owner: &OwnerReference) -> Vec<EndpointSlice> {
    for slice in &mut built {
        slice.metadata.owner_references = Some(vec![owner.clone()]);
    }
    built
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
mod tests;
