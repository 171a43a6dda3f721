//! The judgement every export of one namespace/name shares, whichever cluster makes it: which
//! exports are valid, which one wins, the union of their ports, and what they conflict on. The
//! export status and the import are both read from it, so a cluster's `Conflict` conditions name
//! the winner its import took.
//!
//! Who wins: the holder, the cluster whose export's properties the live import took (recorded
//! on it, [`HOLDER_ANNOTATION`](super::HOLDER_ANNOTATION)), for as long as its export is a
//! valid member; without one (a first import, or the holder stopped exporting or its export
//! became invalid), the oldest export (KEP-1645). A timestamp is the exporting API server's
//! word, so it decides only between exports that were all there when the import was first
//! written (or lost its holder): a newcomer that claims to be older takes nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::LazyLock;

use k8s_openapi::api::core::v1::{Service, ServiceSpec};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::cluster::is_cluster_name;
use super::error::McsError;
use super::types::{CLUSTER_SET_IP, HEADLESS, ServiceExport, ServicePort};
use crate::desired::api::{
    AFFINITY_CLIENT_IP, AFFINITY_NONE, CLUSTER_IP_NONE, DEFAULT_CLIENT_IP_TIMEOUT, ITP_CLUSTER,
    PROTOCOL_TCP, TYPE_EXTERNAL_NAME,
};
use crate::desired::merge::port_conflict;

/// Cluster names a conflict message lists before it counts the rest.
const NAMES_LISTED: usize = 10;

/// One cluster's export of a namespace/name.
#[derive(Clone, Debug)]
pub struct ClusterExport<'a> {
    /// The name the cluster goes by (see `cluster_name`).
    pub cluster: &'a str,
    pub export: &'a ServiceExport,
    /// The Service of the same namespace/name in that cluster, if there is one.
    pub service: Option<&'a Service>,
    /// That cluster's EndpointSlices of the Service (only the import reads them).
    pub slices: Vec<&'a EndpointSlice>,
}

/// Whether an export can take part in the import (the `Valid` condition).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Validity {
    Valid,
    /// There is no Service of the export's namespace/name.
    NoService,
    /// The Service is an ExternalName Service, which KEP-1645 does not export.
    InvalidServiceType,
}

impl Validity {
    /// The condition reason mcs-api names for it.
    pub fn reason(self) -> &'static str {
        match self {
            Validity::Valid => "Valid",
            Validity::NoService => "NoService",
            Validity::InvalidServiceType => "InvalidServiceType",
        }
    }
}

/// Whether an export can take part in the import, and if not why (the `Valid` condition).
pub fn validity(e: &ClusterExport<'_>) -> Validity {
    match e.service {
        None => Validity::NoService,
        Some(s) if spec_of(Some(s)).type_.as_deref() == Some(TYPE_EXTERNAL_NAME) => {
            Validity::InvalidServiceType
        }
        Some(_) => Validity::Valid,
    }
}

/// A Service-level property the exports disagree on, named as mcs-api names the `Conflict`
/// condition's reasons. Bounded: usable as a metric label.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ConflictReason {
    Type,
    Port,
    SessionAffinity,
    SessionAffinityConfig,
    InternalTrafficPolicy,
    TrafficDistribution,
    IPFamily,
    Labels,
    Annotations,
}

impl ConflictReason {
    /// Every reason, in the order conditions list them.
    pub const ALL: [ConflictReason; 9] = [
        ConflictReason::Type,
        ConflictReason::Port,
        ConflictReason::SessionAffinity,
        ConflictReason::SessionAffinityConfig,
        ConflictReason::InternalTrafficPolicy,
        ConflictReason::TrafficDistribution,
        ConflictReason::IPFamily,
        ConflictReason::Labels,
        ConflictReason::Annotations,
    ];

    /// The `Conflict` condition reason (mcs-api v0.5.0's `ServiceExportReason*Conflict`).
    pub fn reason(self) -> &'static str {
        match self {
            ConflictReason::Type => "TypeConflict",
            ConflictReason::Port => "PortConflict",
            ConflictReason::SessionAffinity => "SessionAffinityConflict",
            ConflictReason::SessionAffinityConfig => "SessionAffinityConfigConflict",
            ConflictReason::InternalTrafficPolicy => "InternalTrafficPolicyConflict",
            ConflictReason::TrafficDistribution => "TrafficDistributionConflict",
            ConflictReason::IPFamily => "IPFamilyConflict",
            ConflictReason::Labels => "LabelsConflict",
            ConflictReason::Annotations => "AnnotationsConflict",
        }
    }

    fn field(self) -> &'static str {
        match self {
            ConflictReason::Type => "type (ClusterSetIP or Headless)",
            ConflictReason::Port => "ports",
            ConflictReason::SessionAffinity => "sessionAffinity",
            ConflictReason::SessionAffinityConfig => "sessionAffinityConfig",
            ConflictReason::InternalTrafficPolicy => "internalTrafficPolicy",
            ConflictReason::TrafficDistribution => "trafficDistribution",
            ConflictReason::IPFamily => "ipFamilies",
            ConflictReason::Labels => "exportedLabels",
            ConflictReason::Annotations => "exportedAnnotations",
        }
    }
}

/// Why the winner wins.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Won {
    /// Its export is the oldest (there is no holder, or the holder is the oldest too).
    Oldest,
    /// It holds the import's properties, and an export that claims to be older came later.
    Held,
}

/// One property the exports disagree on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conflict {
    pub reason: ConflictReason,
    /// The cluster whose value the import takes (the holder, else the oldest export).
    pub winner: String,
    pub won: Won,
    /// The clusters whose value differs from the winner's, sorted.
    pub clusters: Vec<String>,
}

impl Conflict {
    /// A line for the `Conflict` condition: the field, who won and why, who differs.
    pub fn message(&self) -> String {
        let whose = match self.won {
            Won::Oldest => "the oldest export's (cluster {w})",
            Won::Held => "cluster {w}'s, which the import holds (a later export takes nothing)",
        };
        let taken = if self.reason == ConflictReason::Port {
            format!("the import has their union, and where two ports conflict {whose} wins")
        } else {
            format!("the import takes {whose}")
        };
        let (who, verb) = if self.clusters.len() == 1 {
            ("cluster", "differs")
        } else {
            ("clusters", "differ")
        };
        format!(
            "{}: {}; {who} {} {verb}.",
            self.reason.field(),
            taken.replace("{w}", &format!("{:?}", self.winner)),
            listed(&self.clusters),
        )
    }
}

/// The Event API's limit on a note, in bytes.
const NOTE_MAX: usize = 1024;

/// One line for an Event on the ServiceImport: whose properties it takes and why, and which
/// clusters differ on what; `None` without conflicts. At most [`NOTE_MAX`] bytes.
pub fn conflicts_note(conflicts: &[Conflict]) -> Option<String> {
    let first = conflicts.first()?;
    let why = match first.won {
        Won::Oldest => "the oldest export",
        Won::Held => "it holds the import; a later export takes nothing",
    };
    let differing: Vec<String> = conflicts
        .iter()
        .map(|c| format!("{} by {}", c.reason.field(), listed(&c.clusters)))
        .collect();
    let note = format!(
        "the import takes cluster {:?}'s properties ({why}); differing: {}",
        first.winner,
        differing.join("; ")
    );
    Some(cut_at(note, NOTE_MAX))
}

/// At most `max` bytes, cut at a character boundary.
pub(super) fn cut_at(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

/// `"a", "b" and 3 more`
fn listed(names: &[String]) -> String {
    let shown: Vec<String> = names
        .iter()
        .take(NAMES_LISTED)
        .map(|n| format!("{n:?}"))
        .collect();
    let mut out = shown.join(", ");
    if names.len() > NAMES_LISTED {
        out.push_str(&format!(" and {} more", names.len() - NAMES_LISTED));
    }
    out
}

/// The shared verdict on one namespace/name.
#[derive(Debug)]
pub(crate) struct Judgement<'e, 'a> {
    /// The valid exports not being deleted, the holder first, then oldest first: `members[0]`
    /// wins.
    pub(crate) members: Vec<&'e ClusterExport<'a>>,
    pub(crate) conflicts: Vec<Conflict>,
}

impl<'a> Judgement<'_, 'a> {
    pub(crate) fn winner(&self) -> Option<&ClusterExport<'a>> {
        self.members.first().copied()
    }
}

/// Oldest export first (creationTimestamp, as KEP-1645's conflict resolution orders them); an
/// export without one sorts last; ties by cluster name.
fn age_key<'a>(e: &'a ClusterExport<'_>) -> (bool, Option<&'a Time>, &'a str) {
    let created = e.export.metadata.creation_timestamp.as_ref();
    (created.is_none(), created, e.cluster)
}

/// Checks the inputs (cluster names valid and distinct, every export of `namespace/name`) and
/// judges them. `holder` is the cluster the live import records as the holder of its
/// properties, if any (see the module).
pub(crate) fn judge<'e, 'a>(
    namespace: &str,
    name: &str,
    exports: &'e [ClusterExport<'a>],
    holder: Option<&str>,
) -> Result<Judgement<'e, 'a>, McsError> {
    let mut seen = BTreeSet::new();
    let expected = format!("{namespace}/{name}");
    for e in exports {
        if !is_cluster_name(e.cluster) {
            return Err(McsError::InvalidClusterName(e.cluster.to_string()));
        }
        if !seen.insert(e.cluster) {
            return Err(McsError::DuplicateCluster(e.cluster.to_string()));
        }
        let m = &e.export.metadata;
        let found = format!(
            "{}/{}",
            m.namespace.as_deref().unwrap_or(""),
            m.name.as_deref().unwrap_or("")
        );
        if found != expected {
            return Err(McsError::OtherKey {
                cluster: e.cluster.to_string(),
                expected,
                found,
            });
        }
    }
    let mut members: Vec<&ClusterExport<'a>> = exports
        .iter()
        .filter(|e| validity(e) == Validity::Valid)
        .filter(|e| e.export.metadata.deletion_timestamp.is_none())
        .collect();
    members.sort_by(|a, b| age_key(a).cmp(&age_key(b)));
    let won = match holder.and_then(|h| members.iter().position(|e| e.cluster == h)) {
        // the holder keeps what it holds; the others keep their order behind it
        Some(i) if i > 0 => {
            members[..=i].rotate_right(1);
            Won::Held
        }
        _ => Won::Oldest,
    };
    let conflicts = conflicts(&members, won);
    Ok(Judgement { members, conflicts })
}

static EMPTY_SPEC: LazyLock<ServiceSpec> = LazyLock::new(ServiceSpec::default);

/// The Service's spec, or an empty one.
fn spec_of(s: Option<&Service>) -> &ServiceSpec {
    s.and_then(|s| s.spec.as_ref()).unwrap_or(&EMPTY_SPEC)
}

/// A member's Service spec.
fn member_spec<'a>(e: &ClusterExport<'a>) -> &'a ServiceSpec {
    spec_of(e.service)
}

/// [`CLUSTER_SET_IP`] or [`HEADLESS`].
pub(crate) fn import_type(spec: &ServiceSpec) -> &'static str {
    if spec.cluster_ip.as_deref() == Some(CLUSTER_IP_NONE) {
        HEADLESS
    } else {
        CLUSTER_SET_IP
    }
}

fn protocol(p: &k8s_openapi::api::core::v1::ServicePort) -> String {
    p.protocol
        .clone()
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| PROTOCOL_TCP.to_string())
}

/// A Service port as an import port, with the API server's default protocol.
pub(crate) fn import_port(p: &k8s_openapi::api::core::v1::ServicePort) -> ServicePort {
    ServicePort {
        name: p.name.clone().unwrap_or_default(),
        protocol: protocol(p),
        app_protocol: p.app_protocol.clone(),
        port: p.port,
    }
}

fn port_set(spec: &ServiceSpec) -> BTreeSet<ServicePort> {
    spec.ports.iter().flatten().map(import_port).collect()
}

/// sessionAffinity with its default.
pub(crate) fn affinity(spec: &ServiceSpec) -> String {
    spec.session_affinity
        .clone()
        .filter(|a| !a.is_empty())
        .unwrap_or_else(|| AFFINITY_NONE.to_string())
}

/// The ClientIP timeout with its default; None without ClientIP affinity.
fn affinity_timeout(spec: &ServiceSpec) -> Option<i32> {
    (affinity(spec) == AFFINITY_CLIENT_IP).then(|| {
        spec.session_affinity_config
            .as_ref()
            .and_then(|c| c.client_ip.as_ref())
            .and_then(|c| c.timeout_seconds)
            .unwrap_or(DEFAULT_CLIENT_IP_TIMEOUT)
    })
}

fn traffic_policy(spec: &ServiceSpec) -> String {
    spec.internal_traffic_policy
        .clone()
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| ITP_CLUSTER.to_string())
}

fn families(spec: &ServiceSpec) -> BTreeSet<String> {
    spec.ip_families.iter().flatten().cloned().collect()
}

/// The clusters whose `key` differs from the winner's, among those `compared` admits.
fn differing<K: PartialEq>(
    members: &[&ClusterExport<'_>],
    key: impl Fn(&ClusterExport<'_>) -> K,
    compared: impl Fn(&ClusterExport<'_>) -> bool,
) -> Vec<String> {
    let Some((winner, rest)) = members.split_first() else {
        return Vec::new();
    };
    let theirs = key(winner);
    let mut out: Vec<String> = rest
        .iter()
        .filter(|e| compared(e) && key(e) != theirs)
        .map(|e| e.cluster.to_string())
        .collect();
    out.sort();
    out
}

fn conflicts(members: &[&ClusterExport<'_>], won: Won) -> Vec<Conflict> {
    let Some(winner) = members.first() else {
        return Vec::new();
    };
    let all = |_: &ClusterExport<'_>| true;
    let winner_affinity = affinity(member_spec(winner));
    let labels = |e: &ClusterExport<'_>| -> BTreeMap<String, String> {
        e.export.spec.exported_labels.clone()
    };
    let annotations = |e: &ClusterExport<'_>| -> BTreeMap<String, String> {
        e.export.spec.exported_annotations.clone()
    };
    let mut out = Vec::new();
    for reason in ConflictReason::ALL {
        let clusters = match reason {
            ConflictReason::Type => differing(members, |e| import_type(member_spec(e)), all),
            ConflictReason::Port => differing(members, |e| port_set(member_spec(e)), all),
            ConflictReason::SessionAffinity => {
                differing(members, |e| affinity(member_spec(e)), all)
            }
            // only where the affinity agrees: otherwise SessionAffinity says it
            ConflictReason::SessionAffinityConfig => differing(
                members,
                |e| affinity_timeout(member_spec(e)),
                |e| affinity(member_spec(e)) == winner_affinity,
            ),
            ConflictReason::InternalTrafficPolicy => {
                differing(members, |e| traffic_policy(member_spec(e)), all)
            }
            ConflictReason::TrafficDistribution => differing(
                members,
                |e| member_spec(e).traffic_distribution.clone(),
                all,
            ),
            ConflictReason::IPFamily => differing(members, |e| families(member_spec(e)), all),
            ConflictReason::Labels => differing(members, labels, all),
            ConflictReason::Annotations => differing(members, annotations, all),
        };
        if !clusters.is_empty() {
            out.push(Conflict {
                reason,
                winner: winner.cluster.to_string(),
                won,
                clusters,
            });
        }
    }
    out
}

impl Judgement<'_, '_> {
    /// The union of the members' ports, the winner's first, then oldest first (KEP-1645
    /// "Service Port"): a port
    /// whose name is taken, whose protocol and number are taken, or that would leave an unnamed
    /// port beside others is left out. Sorted by name, protocol, number.
    pub(crate) fn ports(&self) -> Vec<ServicePort> {
        let mut union: Vec<k8s_openapi::api::core::v1::ServicePort> = Vec::new();
        for e in &self.members {
            for p in member_spec(e).ports.iter().flatten() {
                if port_conflict(&union, p).is_none() {
                    union.push(p.clone());
                }
            }
        }
        let mut ports: Vec<ServicePort> = union.iter().map(import_port).collect();
        ports.sort();
        ports
    }

    /// The winner's Service spec.
    pub(crate) fn winner_spec(&self) -> Option<&ServiceSpec> {
        self.winner().map(member_spec)
    }

    /// The members' IP families, the winner's first (its primary family leads), at most two.
    pub(crate) fn families(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for e in &self.members {
            for f in member_spec(e).ip_families.iter().flatten() {
                if !out.contains(f) && out.len() < 2 {
                    out.push(f.clone());
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests;
