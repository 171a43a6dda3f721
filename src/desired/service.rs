//! The follower Service and its comparison with the live local Service.

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::api::{
    AFFINITY_CLIENT_IP, AFFINITY_NONE, CLUSTER_IP_NONE, DEFAULT_CLIENT_IP_TIMEOUT,
    PREFER_DUAL_STACK, PROTOCOL_TCP, TYPE_CLUSTER_IP, TYPE_EXTERNAL_NAME,
};
use super::containment::Refused;
use super::limits::LabelsHeld;
use super::meta;
use super::options::Options;

/// What to do with the live local follower Service.
#[derive(Clone, Debug, PartialEq)]
pub enum ServiceChange {
    /// Every field we manage already has its desired value: write nothing.
    Unchanged,
    /// The live Service with our fields overwritten, ready for a PUT.
    Update(Box<Service>),
    /// The change cannot be made in place (headless <-> allocated clusterIP, or ExternalName
    /// <-> another type): delete the live Service and create the desired one.
    Recreate,
}

pub(crate) fn desired_service(
    remote: &Service,
    name: &str,
    namespace: &str,
    opts: &Options,
) -> (Service, Refused, Option<LabelsHeld>) {
    let remote_spec = remote.spec.clone().unwrap_or_default();
    let external = remote_spec.type_.as_deref() == Some(TYPE_EXTERNAL_NAME);

    let mut spec = ServiceSpec {
        ports: remote_spec
            .ports
            .as_ref()
            .filter(|ports| !ports.is_empty())
            .map(|ports| ports.iter().map(follower_port).collect()),
        session_affinity: remote_spec.session_affinity.clone(),
        session_affinity_config: remote_spec.session_affinity_config.clone(),
        publish_not_ready_addresses: remote_spec.publish_not_ready_addresses,
        ..ServiceSpec::default()
    };
    if external {
        spec.type_ = Some(TYPE_EXTERNAL_NAME.to_string());
        spec.external_name = remote_spec.external_name.clone();
    } else {
        spec.type_ = Some(TYPE_CLUSTER_IP.to_string());
        if remote_spec.cluster_ip.as_deref() == Some(CLUSTER_IP_NONE) {
            spec.cluster_ip = Some(CLUSTER_IP_NONE.to_string());
        }
        if remote_spec.ip_families.as_ref().map(Vec::len) == Some(2) {
            spec.ip_family_policy = Some(PREFER_DUAL_STACK.to_string());
        }
    }

    let (labels, refused, held) = meta::follower_labels(remote.metadata.labels.as_ref(), opts);
    let mut annotations = meta::origin_annotations(namespace, name, opts);
    if let Some(uid) = remote.metadata.uid.as_ref() {
        annotations.insert(opts.origin_uid_annotation(), uid.clone());
    }
    // over the label limit, no record: the live follower's copied labels and its record of them
    // stay as they were (nothing copied is removed, nothing new is copied)
    if held.is_none() {
        meta::record_copied_labels(&mut annotations, &labels, opts);
    }

    let service = Service {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(namespace.to_string()),
            labels: Some(labels),
            annotations: Some(annotations),
            ..ObjectMeta::default()
        },
        spec: Some(spec),
        status: None,
    };
    (service, refused, held)
}

fn follower_port(port: &ServicePort) -> ServicePort {
    ServicePort {
        name: port.name.clone(),
        port: port.port,
        protocol: port.protocol.clone(),
        app_protocol: port.app_protocol.clone(),
        target_port: port.target_port.clone(),
        node_port: None,
    }
}

pub(crate) fn is_external_name(svc: &Service) -> bool {
    svc.spec.as_ref().and_then(|s| s.type_.as_deref()) == Some(TYPE_EXTERNAL_NAME)
}

fn is_headless(spec: &ServiceSpec) -> bool {
    spec.cluster_ip.as_deref() == Some(CLUSTER_IP_NONE)
}

/// A ServicePort with the API server's defaults applied, ordered for set comparison.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct PortNorm {
    name: String,
    port: i32,
    protocol: String,
    app_protocol: Option<String>,
    target_port: TargetNorm,
}

#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
enum TargetNorm {
    Number(i32),
    Name(String),
}

fn normalise_port(port: &ServicePort) -> PortNorm {
    let target_port = match &port.target_port {
        Some(IntOrString::Int(n)) if *n != 0 => TargetNorm::Number(*n),
        Some(IntOrString::String(s)) if !s.is_empty() => TargetNorm::Name(s.clone()),
        _ => TargetNorm::Number(port.port),
    };
    PortNorm {
        name: port.name.clone().unwrap_or_default(),
        port: port.port,
        protocol: port
            .protocol
            .clone()
            .unwrap_or_else(|| PROTOCOL_TCP.to_string()),
        app_protocol: port.app_protocol.clone(),
        target_port,
    }
}

/// The spec fields we manage, with the API server's defaults applied.
#[derive(Debug, PartialEq)]
struct ManagedSpec {
    type_: String,
    external_name: Option<String>,
    ports: Vec<PortNorm>,
    session_affinity: String,
    client_ip_timeout: Option<i32>,
    publish_not_ready_addresses: bool,
    has_selector: bool,
}

fn managed_spec(spec: &ServiceSpec) -> ManagedSpec {
    let type_ = spec
        .type_
        .clone()
        .unwrap_or_else(|| TYPE_CLUSTER_IP.to_string());
    let external_name = if type_ == TYPE_EXTERNAL_NAME {
        spec.external_name.clone()
    } else {
        None
    };
    let mut ports: Vec<PortNorm> = spec.ports.iter().flatten().map(normalise_port).collect();
    ports.sort();
    let session_affinity = spec
        .session_affinity
        .clone()
        .filter(|a| !a.is_empty())
        .unwrap_or_else(|| AFFINITY_NONE.to_string());
    let client_ip_timeout = (session_affinity == AFFINITY_CLIENT_IP).then(|| {
        spec.session_affinity_config
            .as_ref()
            .and_then(|c| c.client_ip.as_ref())
            .and_then(|c| c.timeout_seconds)
            .unwrap_or(DEFAULT_CLIENT_IP_TIMEOUT)
    });
    ManagedSpec {
        type_,
        external_name,
        ports,
        session_affinity,
        client_ip_timeout,
        publish_not_ready_addresses: spec.publish_not_ready_addresses.unwrap_or(false),
        has_selector: spec.selector.as_ref().is_some_and(|s| !s.is_empty()),
    }
}

/// Compares the live local follower Service with the desired one.
///
/// Only what [`follower`](super::follower) sets is compared, after applying the API server's
/// defaults; labels and annotations others added, the allocated clusterIP(s), ipFamilies,
/// internalTrafficPolicy and other fields we never set are ignored and kept. A selector on the
/// live Service is a difference (it is removed). An unset desired ipFamilyPolicy accepts any
/// live value (the API server defaults it); a set one must match.
pub fn service_change(actual: &Service, desired: &Service) -> ServiceChange {
    let empty = ServiceSpec::default();
    let actual_spec = actual.spec.as_ref().unwrap_or(&empty);
    let desired_spec = desired.spec.as_ref().unwrap_or(&empty);

    let actual_managed = managed_spec(actual_spec);
    let desired_managed = managed_spec(desired_spec);

    let actual_external = actual_managed.type_ == TYPE_EXTERNAL_NAME;
    let desired_external = desired_managed.type_ == TYPE_EXTERNAL_NAME;
    if actual_external != desired_external {
        return ServiceChange::Recreate;
    }
    if !desired_external && is_headless(actual_spec) != is_headless(desired_spec) {
        return ServiceChange::Recreate;
    }

    let family_policy_matches = desired_spec.ip_family_policy.is_none()
        || desired_spec.ip_family_policy == actual_spec.ip_family_policy;
    let unchanged = actual_managed == desired_managed
        && family_policy_matches
        && meta::metadata_matches(&actual.metadata, &desired.metadata);
    if unchanged {
        return ServiceChange::Unchanged;
    }

    let mut updated = actual.clone();
    meta::merge_metadata(&mut updated.metadata, &desired.metadata);
    let spec = updated.spec.get_or_insert_with(ServiceSpec::default);
    if actual_managed.type_ != desired_managed.type_ {
        // Fields only valid for NodePort/LoadBalancer Services; we never set them.
        spec.external_traffic_policy = None;
        spec.health_check_node_port = None;
        spec.allocate_load_balancer_node_ports = None;
        spec.load_balancer_class = None;
        spec.load_balancer_ip = None;
        spec.load_balancer_source_ranges = None;
    }
    spec.type_ = desired_spec.type_.clone();
    spec.external_name = desired_spec.external_name.clone();
    spec.ports = desired_spec.ports.clone();
    spec.selector = None;
    spec.session_affinity = desired_spec.session_affinity.clone();
    spec.session_affinity_config = desired_spec.session_affinity_config.clone();
    spec.publish_not_ready_addresses = desired_spec.publish_not_ready_addresses;
    if desired_spec.ip_family_policy.is_some() {
        spec.ip_family_policy = desired_spec.ip_family_policy.clone();
    }
    ServiceChange::Update(Box::new(updated))
}

#[cfg(test)]
mod tests;
