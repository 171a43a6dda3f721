//! One follower for a Service several remotes export (the same namespace/name): the union of
//! their ports by name and per-remote EndpointSlices, with Service-level conflicts (type,
//! ExternalName target, session affinity) resolved by one rule that no remote's timestamp can
//! game: the remote the live follower records as its origin (`origin-cluster`, the winner this
//! daemon observed first) keeps winning for as long as it exports; only without one (no follower
//! yet, or its origin no longer exports) does the oldest exported Service (creationTimestamp, then
//! cluster name) win, as the MCS API resolves export conflicts. Every loser is reported.
use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::containment::Refused;
use super::follower::{Follower, follower};
use super::limits::LabelsHeld;
use super::options::{Options, Skip};
use super::{endpoints, service, slices};

/// One remote's export of the key: its exported Service and every slice of it.
pub struct Export<'a> {
    /// this remote's options (its name and cluster id)
    pub opts: &'a Options,
    pub exported: &'a Service,
    pub slices: Vec<&'a EndpointSlice>,
    /// the outage policy marks this remote's endpoints not ready (see `crate::remotes::outage`)
    pub stale: bool,
}

/// What a losing export conflicts on. Bounded: usable as a metric label.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ConflictKind {
    /// ClusterIP vs headless vs ExternalName (or two ExternalName targets)
    Type,
    /// the same port name with another port or protocol, or a port that cannot be added
    Port,
    /// session affinity or its timeout
    SessionAffinity,
}

impl ConflictKind {
    pub const LABELS: [&'static str; 3] = ["type", "port", "session_affinity"];

    pub fn label(self) -> &'static str {
        match self {
            ConflictKind::Type => "type",
            ConflictKind::Port => "port",
            ConflictKind::SessionAffinity => "session_affinity",
        }
    }
}

/// A losing export's difference from the follower.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conflict {
    /// the remote whose export lost
    pub cluster: String,
    /// the remote whose exported Service is the oldest
    pub winner: String,
    pub kind: ConflictKind,
    pub detail: String,
}

/// The follower of several exports.
#[derive(Debug, Default)]
pub struct Merged {
    /// None when no export could be mirrored
    pub follower: Option<Follower>,
    /// remotes recorded on the follower: every export mirrored, and the held ones
    pub contributors: BTreeSet<String>,
    /// remotes whose exported Service cannot be mirrored, with why (their slices are left as they are)
    pub skipped: Vec<(String, Skip)>,
    pub conflicts: Vec<Conflict>,
    /// each mirrored remote's labels that were not copied, by why
    pub refused_labels: Vec<(String, Refused)>,
    /// the winner, when its labels are over `--remote-max-label-bytes` (the follower Service's
    /// labels are then kept as they were; only the winner's labels are ever copied)
    pub labels_held: Option<(String, LabelsHeld)>,
}

/// The recorded origin first; then oldest first; an exported Service without a creationTimestamp
/// sorts last; ties by cluster name.
fn rank_key<'a>(
    e: &'a Export<'_>,
    origin: Option<&str>,
) -> (bool, bool, Option<&'a Time>, &'a str) {
    let created = e.exported.metadata.creation_timestamp.as_ref();
    let name = e.opts.cluster_name.as_str();
    (origin != Some(name), created.is_none(), created, name)
}

/// The remote a live follower records as the origin of its Service-level fields.
fn recorded_origin<'a>(live: Option<&'a Service>, opts: &Options) -> Option<&'a str> {
    live?
        .metadata
        .annotations
        .as_ref()?
        .get(&opts.origin_cluster_annotation())
        .map(String::as_str)
}

/// Pure: the follower of `exports`. `held` are remotes the follower records whose state cannot
/// be read now (not connected, not listed yet): they stay recorded, and while any is, the live
/// follower's ports are kept (those remotes' endpoints may use them).
pub fn merge(
    exports: &[Export<'_>],
    held: &BTreeSet<String>,
    live: Option<&Service>,
    opts: &Options,
) -> Merged {
    let mut out = Merged::default();
    // a stale remote's endpoints, marked not ready (owned copies; the caches are not touched)
    let marked: Vec<Vec<EndpointSlice>> = exports
        .iter()
        .map(|e| {
            if e.stale {
                e.slices.iter().map(|s| not_ready(s)).collect()
            } else {
                Vec::new()
            }
        })
        .collect();
    let inputs: Vec<Vec<&EndpointSlice>> = exports
        .iter()
        .zip(&marked)
        .map(|(e, m)| {
            if e.stale {
                m.iter().collect()
            } else {
                e.slices.clone()
            }
        })
        .collect();
    let mut order: Vec<(&Export<'_>, &Vec<&EndpointSlice>)> = exports.iter().zip(&inputs).collect();
    let origin = recorded_origin(live, opts);
    order.sort_by(|a, b| rank_key(a.0, origin).cmp(&rank_key(b.0, origin)));
    let mut parts: Vec<(&Export<'_>, &[&EndpointSlice], Follower)> = Vec::new();
    for (e, input) in order {
        match follower(e.exported, input, e.opts) {
            Ok(f) => {
                if !f.refused_labels.is_empty() {
                    let refused = f.refused_labels.clone();
                    out.refused_labels
                        .push((e.opts.cluster_name.clone(), refused));
                }
                parts.push((e, input, f))
            }
            Err(skip) => out.skipped.push((e.opts.cluster_name.clone(), skip)),
        }
    }
    let Some(((first, _, winner), rest)) = parts.split_first() else {
        return out;
    };
    let winner_name = &first.opts.cluster_name;
    out.labels_held = winner
        .labels_held
        .clone()
        .map(|held| (winner_name.clone(), held));
    let mut svc = winner.service.clone();
    let mut slices_out = winner.slices.clone();
    out.contributors.insert(winner_name.clone());
    let spec = svc.spec.get_or_insert_with(ServiceSpec::default);
    for (e, _, f) in rest {
        let cluster = &e.opts.cluster_name;
        out.contributors.insert(cluster.clone());
        let theirs = f.service.spec.clone().unwrap_or_default();
        let found = absorb(spec, &theirs);
        let fits = !found.iter().any(|(k, _)| *k == ConflictKind::Type);
        out.conflicts
            .extend(found.into_iter().map(|(kind, detail)| Conflict {
                cluster: cluster.clone(),
                winner: winner_name.clone(),
                kind,
                detail,
            }));
        // an ExternalName follower has no endpoints; any other can take theirs
        if fits || !service::is_external_name(&winner.service) {
            slices_out.extend(f.slices.iter().cloned());
        }
    }
    out.contributors.extend(held.iter().cloned());
    if !held.is_empty()
        && let Some(live_spec) = live.and_then(|l| l.spec.as_ref())
    {
        keep_ports(spec, live_spec);
    }
    let list = out
        .contributors
        .iter()
        .cloned()
        .collect::<Vec<_>>()
        .join(",");
    svc.metadata
        .annotations
        .get_or_insert_default()
        .insert(opts.origin_clusters_annotation(), list.clone());
    slices_out.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let endpoints = winner.endpoints.as_ref().map(|_| {
        let relevant: Vec<&EndpointSlice> = parts
            .iter()
            .flat_map(|(_, input, _)| input.iter().copied())
            .filter(|s| slices::belongs_to(s, &svc_name(&svc), &svc_namespace(&svc)))
            .collect();
        let groups = slices::group_endpoints(&relevant);
        let mut ep = endpoints::desired_endpoints(
            &groups,
            &svc_name(&svc),
            &svc_namespace(&svc),
            first.opts,
        );
        ep.metadata
            .annotations
            .get_or_insert_default()
            .insert(opts.origin_clusters_annotation(), list.clone());
        ep
    });
    out.follower = Some(Follower {
        service: svc,
        slices: slices_out,
        endpoints,
        refused_labels: Refused::new(),
        labels_held: winner.labels_held.clone(),
    });
    out
}

/// Pure: a remote slice with every endpoint not ready and not serving (terminating kept): what
/// the outage policy makes of a stale remote's endpoints.
pub fn not_ready(slice: &EndpointSlice) -> EndpointSlice {
    let mut s = slice.clone();
    for e in &mut s.endpoints {
        let c = e.conditions.get_or_insert_with(Default::default);
        c.ready = Some(false);
        c.serving = Some(false);
    }
    s
}

fn svc_name(s: &Service) -> String {
    s.metadata.name.clone().unwrap_or_default()
}

fn svc_namespace(s: &Service) -> String {
    s.metadata.namespace.clone().unwrap_or_default()
}

/// ClusterIP, headless, or ExternalName with its target.
fn class(spec: &ServiceSpec) -> String {
    if spec.type_.as_deref() == Some("ExternalName") {
        format!(
            "ExternalName {}",
            spec.external_name.as_deref().unwrap_or("")
        )
    } else if spec.cluster_ip.as_deref() == Some("None") {
        "headless".to_string()
    } else {
        "ClusterIP".to_string()
    }
}

fn affinity(spec: &ServiceSpec) -> (String, Option<i32>) {
    let kind = spec
        .session_affinity
        .clone()
        .filter(|a| !a.is_empty())
        .unwrap_or_else(|| "None".to_string());
    let timeout = (kind == "ClientIP").then(|| {
        spec.session_affinity_config
            .as_ref()
            .and_then(|c| c.client_ip.as_ref())
            .and_then(|c| c.timeout_seconds)
            .unwrap_or(10800)
    });
    (kind, timeout)
}

fn protocol(p: &ServicePort) -> &str {
    p.protocol.as_deref().unwrap_or("TCP")
}

fn describe(p: &ServicePort) -> String {
    format!(
        "{:?} {}/{}",
        p.name.as_deref().unwrap_or(""),
        p.port,
        protocol(p)
    )
}

/// Why a port cannot join `ports`, if it cannot.
pub(crate) fn port_conflict(ports: &[ServicePort], p: &ServicePort) -> Option<Option<String>> {
    let name = p.name.as_deref().unwrap_or("");
    if let Some(q) = ports
        .iter()
        .find(|q| q.name.as_deref().unwrap_or("") == name)
    {
        let same = q.port == p.port && protocol(q) == protocol(p);
        // the same port: nothing to add, no conflict
        return Some((!same).then(|| format!("{} vs {}", describe(p), describe(q))));
    }
    if let Some(q) = ports
        .iter()
        .find(|q| q.port == p.port && protocol(q) == protocol(p))
    {
        return Some(Some(format!("{} vs {}", describe(p), describe(q))));
    }
    let unnamed = name.is_empty()
        || ports
            .iter()
            .any(|q| q.name.as_deref().unwrap_or("").is_empty());
    if unnamed && !ports.is_empty() {
        return Some(Some(format!(
            "{}: a Service with several ports must name each",
            describe(p)
        )));
    }
    None
}

/// Takes what fits of another export's spec into the winner's; returns what did not.
fn absorb(spec: &mut ServiceSpec, theirs: &ServiceSpec) -> Vec<(ConflictKind, String)> {
    let mut found = Vec::new();
    let (ours_class, their_class) = (class(spec), class(theirs));
    if ours_class != their_class {
        found.push((ConflictKind::Type, format!("{their_class} vs {ours_class}")));
        return found;
    }
    if affinity(spec) != affinity(theirs) {
        found.push((
            ConflictKind::SessionAffinity,
            format!("{:?} vs {:?}", affinity(theirs), affinity(spec)),
        ));
    }
    let ports = spec.ports.get_or_insert_default();
    for p in theirs.ports.iter().flatten() {
        match port_conflict(ports, p) {
            Some(Some(why)) => found.push((ConflictKind::Port, why)),
            Some(None) => {}
            None => ports.push(p.clone()),
        }
    }
    if ports.is_empty() {
        spec.ports = None;
    }
    found
}

/// Keeps the live follower's ports that the merge dropped and that still fit.
fn keep_ports(spec: &mut ServiceSpec, live: &ServiceSpec) {
    if spec.type_.as_deref() == Some("ExternalName") {
        return;
    }
    let ports = spec.ports.get_or_insert_default();
    for p in live.ports.iter().flatten() {
        if port_conflict(ports, p).is_none() {
            ports.push(ServicePort {
                node_port: None,
                ..p.clone()
            });
        }
    }
    if ports.is_empty() {
        spec.ports = None;
    }
}

#[cfg(test)]
mod tests;
