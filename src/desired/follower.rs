//! One remote's exported Service and its slices -> the follower objects.
use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{Endpoints, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;

use super::containment::Refused;
use super::limits::{LabelsHeld, WriteLimits};
use super::options::{EXPORT_VALUE, Options, Skip};
use super::slices::Group;
use super::{endpoints, meta, service, slices};

/// Everything the local cluster should hold for one remote leader.
#[derive(Clone, Debug, PartialEq)]
pub struct Follower {
    /// The selectorless follower Service.
    pub service: Service,
    /// Follower EndpointSlices, sorted by name; empty in [`EndpointsMode::Endpoints`], for
    /// ExternalName exported Services and for exported Services without endpoints.
    pub slices: Vec<EndpointSlice>,
    /// The follower core/v1 Endpoints; `None` in [`EndpointsMode::Slices`] and for ExternalName
    /// exported Services.
    pub endpoints: Option<Endpoints>,
    /// the remote labels not copied (reserved prefixes, the operator's lists, the label
    /// limit), by why
    pub refused_labels: Refused,
    /// the leader's labels are over `--remote-max-label-bytes`: the Service's labels are kept
    /// as they were
    pub labels_held: Option<LabelsHeld>,
}

/// Remote exported Service (must carry `<key>=true`) plus ALL remote EndpointSlices of it ->
/// the desired local objects.
///
/// Slices whose namespace or `kubernetes.io/service-name` label name another Service are
/// ignored. Slices and Endpoints get no ownerReferences here: see [`set_slice_owner`].
pub fn follower(
    remote: &Service,
    remote_slices: &[&EndpointSlice],
    opts: &Options,
) -> Result<Follower, Skip> {
    let exported = remote
        .metadata
        .labels
        .as_ref()
        .and_then(|labels| labels.get(&opts.label_key));
    if exported.map(String::as_str) != Some(EXPORT_VALUE) {
        return Err(Skip::NotExported {
            label: opts.export_selector(),
        });
    }
    let name = non_empty(remote.metadata.name.as_deref()).ok_or(Skip::MissingName)?;
    let namespace =
        non_empty(remote.metadata.namespace.as_deref()).ok_or(Skip::MissingNamespace)?;

    let (service, refused_labels, labels_held) =
        service::desired_service(remote, name, namespace, opts);
    meta::validate(&service.metadata)?;
    let limits = &opts.containment.limits;
    let service_ports = service
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_ref())
        .map_or(0, Vec::len);

    if service::is_external_name(&service) {
        if !opts.allow_external_name {
            return Err(Skip::ExternalNameRefused);
        }
        within_limits(limits, service_ports, &[])?;
        return Ok(Follower {
            service,
            slices: Vec::new(),
            endpoints: None,
            refused_labels,
            labels_held,
        });
    }

    let relevant: Vec<&EndpointSlice> = remote_slices
        .iter()
        .copied()
        .filter(|slice| slices::belongs_to(slice, name, namespace))
        .collect();
    let groups = slices::group_endpoints(&relevant);
    // judged in every endpoints mode: kube-controller-manager mirrors our Endpoints into as
    // many slices as they have port sets
    within_limits(limits, service_ports, &groups)?;

    let mut desired_slices = Vec::new();
    if opts.endpoints_mode.writes_slices() {
        desired_slices = slices::desired_slices(&groups, name, namespace, opts);
        for slice in &desired_slices {
            meta::validate(&slice.metadata)?;
        }
    }

    let mut desired_endpoints = None;
    if opts.endpoints_mode.writes_endpoints() {
        let ep = endpoints::desired_endpoints(&groups, name, namespace, opts);
        meta::validate(&ep.metadata)?;
        desired_endpoints = Some(ep);
    }

    Ok(Follower {
        service,
        slices: desired_slices,
        endpoints: desired_endpoints,
        refused_labels,
        labels_held,
    })
}

/// Err when one remote's export of a Service is over the port or the slice limit: the ports
/// of its Service (`service_ports`), the distinct ports and the follower slices of its
/// endpoints (`groups`).
fn within_limits(limits: &WriteLimits, service_ports: usize, groups: &[Group]) -> Result<(), Skip> {
    let ports = service_ports as u64;
    if limits.ports_over(ports) {
        return Err(Skip::TooManyPorts {
            ports,
            limit: limits.ports,
            what: "its Service",
        });
    }
    let distinct: BTreeSet<_> = groups.iter().flat_map(|g| g.ports.iter()).collect();
    let ports = distinct.len() as u64;
    if limits.ports_over(ports) {
        return Err(Skip::TooManyPorts {
            ports,
            limit: limits.ports,
            what: "its EndpointSlices",
        });
    }
    let slices = slices::slice_count(groups);
    if limits.slices_over(slices) {
        return Err(Skip::TooManySlices {
            slices,
            limit: limits.slices,
        });
    }
    Ok(())
}

fn non_empty(value: Option<&str>) -> Option<&str> {
    value.filter(|v| !v.is_empty())
}
