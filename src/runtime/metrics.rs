//! The metric registry. Label values are bounded: remote cluster names (configured), kinds,
//! verbs, outcomes and reason categories; never an object name.
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

pub struct Metrics {
    registry: Registry,
    pub reconciles: Family<ByOutcome, Counter>,
    pub writes: Family<ByKindVerb, Counter>,
    pub skipped: Family<ByRemoteReason, Counter>,
    pub addresses_refused: Family<ByRemoteReason, Counter>,
    pub conflicts: Family<ByRemoteKind, Counter>,
    pub sweeps: Family<ByRemoteOutcome, Counter>,
    pub sweep_deletions: Counter,
    pub followers: Family<ByRemote, Gauge>,
    pub leader: Gauge,
    pub remote_up: Family<ByRemote, Gauge>,
    pub over_budget: Family<ByRemote, Gauge>,
    pub since_list: Family<ByRemote, Gauge<f64, std::sync::atomic::AtomicU64>>,
    pub lag: Family<ByRemote, Histogram>,
    pub events_suppressed: Counter,
    pub watch_requests: Family<ByWatch, Counter>,
    pub panics: Counter,
    pub export_conflicts: Family<ByRemoteKind, Gauge>,
    pub remote_stale: Family<ByRemote, Gauge>,
    pub remote_stale_transitions: Family<ByRemoteTo, Counter>,
    pub remote_changes: Family<ByChange, Counter>,
    pub remote_secrets_refused: Gauge,
    pub credential_expiry: Family<ByRemote, Gauge>,
    pub credential_renewals: Family<ByRemoteOutcome, Counter>,
    pub mcs_name_refused: Family<ByRemote, Gauge>,
    pub labels_refused: Family<ByRemoteReason, Counter>,
    pub taken_over: Family<ByRemote, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("xcc");
        let m = Metrics {
            reconciles: Family::default(),
            writes: Family::default(),
            skipped: Family::default(),
            addresses_refused: Family::default(),
            conflicts: Family::default(),
            sweeps: Family::default(),
            sweep_deletions: Counter::default(),
            followers: Family::default(),
            leader: Gauge::default(),
            remote_up: Family::default(),
            over_budget: Family::default(),
            since_list: Family::default(),
            // 1 ms .. ~33 s
            lag: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.001, 2.0, 16))
            }),
            events_suppressed: Counter::default(),
            watch_requests: Family::default(),
            panics: Counter::default(),
            export_conflicts: Family::default(),
            remote_stale: Family::default(),
            remote_stale_transitions: Family::default(),
            remote_changes: Family::default(),
            remote_secrets_refused: Gauge::default(),
            credential_expiry: Family::default(),
            mcs_name_refused: Family::default(),
            credential_renewals: Family::default(),
            labels_refused: Family::default(),
            taken_over: Family::default(),
            registry: Registry::default(),
        };
        registry.register(
            "reconciles",
            "Reconcile passes (one per local follower key) by outcome",
            m.reconciles.clone(),
        );
        registry.register(
            "writes",
            "Writes to the local cluster by kind and verb",
            m.writes.clone(),
        );
        registry.register(
            "skipped",
            "Remote objects not mirrored, by reason",
            m.skipped.clone(),
        );
        registry.register(
            "addresses_refused",
            "Remote endpoint addresses kept out of local objects (a local network's, outside the remote's allowed CIDRs, FQDN, ...), by remote and reason, counted at each pass that refused them",
            m.addresses_refused.clone(),
        );
        registry.register(
            "conflicts",
            "Same-named local objects that are not our followers, left untouched",
            m.conflicts.clone(),
        );
        registry.register(
            "sweeps",
            "Sweeper runs by outcome (done, aborted)",
            m.sweeps.clone(),
        );
        registry.register(
            "sweep_deletions",
            "Followers deleted by the sweeper",
            m.sweep_deletions.clone(),
        );
        registry.register(
            "followers",
            "Leaders this remote exports (each mirrored into one local follower, merged with other remotes' exports of the same namespace/name)",
            m.followers.clone(),
        );
        registry.register(
            "leader",
            "1 while this replica holds the Lease",
            m.leader.clone(),
        );
        registry.register(
            "remote_up",
            "1 while every watch of the remote is healthy",
            m.remote_up.clone(),
        );
        registry.register(
            "remote_over_budget",
            "1 while the remote is over its budget (Services, endpoints or cached bytes): its caches are dropped, its followers kept, and it is read again after a back-off",
            m.over_budget.clone(),
        );
        registry.register(
            "remote_seconds_since_list",
            "Seconds since the remote's watches last completed a full listing",
            m.since_list.clone(),
        );
        registry.register(
            "propagation_lag_seconds",
            "Remote change seen by the watch until the local write is done",
            m.lag.clone(),
        );
        registry.register(
            "events_suppressed",
            "Kubernetes Events not sent because the same one was sent recently",
            m.events_suppressed.clone(),
        );
        registry.register(
            "watch_requests",
            "List pages and watch starts sent by the watches, by cluster (local or the remote), kind and request",
            m.watch_requests.clone(),
        );
        registry.register(
            "reconcile_panics",
            "Reconciles that panicked (the key is released and retried with back-off)",
            m.panics.clone(),
        );
        registry.register(
            "remote_stale",
            "1 while the outage policy marks this remote's endpoints not ready (stale_after passed)",
            m.remote_stale.clone(),
        );
        registry.register(
            "remote_stale_transitions",
            "Outage policy transitions by remote: marked (endpoints set not ready), restored",
            m.remote_stale_transitions.clone(),
        );
        registry.register(
            "export_conflicts",
            "Followers on which this remote's export loses a conflict with an older exported Service, by kind",
            m.export_conflicts.clone(),
        );
        registry.register(
            "remote_changes",
            "Remotes joined, rotated, left, and Secrets refused as remotes",
            m.remote_changes.clone(),
        );
        registry.register(
            "remote_secrets_refused",
            "Remote Secrets that are not a remote now (each named on /readyz)",
            m.remote_secrets_refused.clone(),
        );
        registry.register(
            "remote_credential_expiry_timestamp_seconds",
            "When the remote's credential expires (its token's exp, its client certificate's notAfter), Unix seconds; absent when unknown",
            m.credential_expiry.clone(),
        );
        registry.register(
            "remote_credential_renewals",
            "Renewals of the remote's token by outcome (renewed, failed)",
            m.credential_renewals.clone(),
        );
        registry.register(
            "mcs_name_refused",
            "1 while the MCS cluster name this remote claims is refused because another cluster (or the local one) holds it; its exports wait",
            m.mcs_name_refused.clone(),
        );
        registry.register(
            "labels_refused",
            "Remote labels not copied onto local objects, by remote and reason (reserved, denied, not_allowed), counted at each pass that builds a follower",
            m.labels_refused.clone(),
        );
        registry.register(
            "followers_taken_over",
            "Followers a local user took over (a selector, kubectl apply, another field manager owning the spec), left alone; counted once per follower while the daemon runs",
            m.taken_over.clone(),
        );
        let build: Family<ByVersion, Gauge> = Family::default();
        build
            .get_or_create(&ByVersion::new(env!("CARGO_PKG_VERSION")))
            .set(1);
        registry.register("build_info", "Build information", build);
        Metrics { registry, ..m }
    }
}

/// The kinds and verbs the writer counts.
const KINDS: [&str; 4] = ["Service", "EndpointSlice", "Endpoints", "Lease"];
const VERBS: [&str; 3] = ["create", "update", "delete"];
/// Kinds the writer only ever creates (`--create-namespaces`, Events).
const CREATED_ONLY: [&str; 2] = ["Namespace", "Event"];
/// Kinds the writer only ever updates (a remote Secret's renewed token).
const UPDATED_ONLY: [&str; 1] = ["Secret"];

impl Metrics {
    /// A registry with the writer's series at 0; [`Metrics::init_remote`] adds a remote's.
    pub fn new() -> Self {
        let m = Self::default();
        for outcome in crate::desired::Outcome::LABELS {
            touch(&m.reconciles, ByOutcome::new(outcome));
        }
        for change in ["joined", "rotated", "left", "refused"] {
            touch(&m.remote_changes, ByChange::new(change));
        }
        for kind in KINDS {
            for verb in VERBS {
                touch(&m.writes, ByKindVerb::new(kind, verb));
            }
        }
        for kind in CREATED_ONLY {
            touch(&m.writes, ByKindVerb::new(kind, "create"));
        }
        for kind in UPDATED_ONLY {
            touch(&m.writes, ByKindVerb::new(kind, "update"));
        }
        m
    }

    /// Puts at 0 the write series the Multi-Cluster Services API adds (`--mcs`): ServiceImports
    /// and their status, the local ServiceExports' status.
    pub fn init_mcs(&self) {
        for verb in ["create", "update", "update_status", "delete"] {
            touch(&self.writes, ByKindVerb::new("ServiceImport", verb));
        }
        touch(
            &self.writes,
            ByKindVerb::new("ServiceExport", "update_status"),
        );
    }

    /// Puts at 0 every counter series of a remote whose labels are known in advance, as
    /// Prometheus advises: a counter then reads 0 before its first increment (so `increase()`
    /// and `absent()` alerts work from the start) instead of being missing from the page.
    pub fn init_remote(&self, remote: &str) {
        use crate::desired::Skip;
        use crate::desired::{NAMESPACE_MISSING, NAMESPACE_PROTECTED};
        for kind in crate::desired::ConflictKind::LABELS {
            drop(
                self.export_conflicts
                    .get_or_create(&ByRemoteKind::new(remote, kind)),
            );
        }
        for reason in Skip::REASONS
            .iter()
            .copied()
            .chain([NAMESPACE_MISSING, NAMESPACE_PROTECTED])
        {
            touch(&self.skipped, ByRemoteReason::new(remote, reason));
        }
        for reason in crate::desired::containment::LabelRefusal::LABELS {
            touch(&self.labels_refused, ByRemoteReason::new(remote, reason));
        }
        touch(&self.taken_over, ByRemote::new(remote));
        for kind in KINDS {
            touch(&self.conflicts, ByRemoteKind::new(remote, kind));
        }
        for &reason in crate::desired::addresses::Refusal::REASONS {
            touch(&self.addresses_refused, ByRemoteReason::new(remote, reason));
        }
        for outcome in ["renewed", "failed"] {
            touch(
                &self.credential_renewals,
                ByRemoteOutcome::new(remote, outcome),
            );
        }
        for outcome in ["done", "aborted"] {
            touch(&self.sweeps, ByRemoteOutcome::new(remote, outcome));
        }
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        // writing into a String cannot fail
        let _ = encode(&mut out, &self.registry);
        out
    }
}

/// Creates the series at 0 if it does not exist.
fn touch<L: Clone + std::hash::Hash + Eq>(family: &Family<L, Counter>, l: L) {
    drop(family.get_or_create(&l));
}

macro_rules! label_set {
    ($(#[$doc:meta])* $name:ident { $($field:ident),+ }) => {
        $(#[$doc])*
        #[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
        pub struct $name {
            $(pub $field: String,)+
        }

        impl $name {
            pub fn new($($field: impl AsRef<str>),+) -> Self {
                Self { $($field: $field.as_ref().to_string(),)+ }
            }
        }
    };
}

// The label sets of our families: a label's name is a field, so a misspelt one does not compile.
label_set!(ByVersion { version });
label_set!(ByOutcome { outcome });
label_set!(ByChange { change });
label_set!(ByKindVerb { kind, verb });
label_set!(ByRemote { remote });
label_set!(ByRemoteKind { remote, kind });
label_set!(ByRemoteReason { remote, reason });
label_set!(ByRemoteOutcome { remote, outcome });
label_set!(ByRemoteTo { remote, to });
label_set!(
    /// A watch's requests: which cluster, which kind, list or watch.
    ByWatch { cluster, kind, request }
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::desired::Outcome;
    use crate::desired::Skip;

    #[test]
    fn every_counter_family_is_published_at_zero_before_its_first_increment() {
        let m = Metrics::new();
        m.init_remote("east");
        let text = m.render();
        for family in [
            "reconciles",
            "writes",
            "skipped",
            "conflicts",
            "sweeps",
            "sweep_deletions",
            "reconcile_panics",
        ] {
            assert!(
                text.contains(&format!("# TYPE xcc_{family} counter")),
                "{family} missing:\n{text}"
            );
        }
        assert!(text.contains("xcc_writes_total{kind=\"Endpoints\",verb=\"delete\"} 0"));
        assert!(text.contains("xcc_writes_total{kind=\"Secret\",verb=\"update\"} 0"));
        assert!(text.contains("xcc_sweeps_total{remote=\"east\",outcome=\"aborted\"} 0"));
        assert!(text.contains("xcc_skipped_total{remote=\"east\",reason=\"NamespaceMissing\"} 0"));
        assert!(text.contains("xcc_reconciles_total{outcome=\"error\"} 0"));
        assert!(text.contains("xcc_export_conflicts{remote=\"east\",kind=\"port\"} 0"));
    }

    #[test]
    fn the_seeded_label_values_are_the_ones_the_code_uses() {
        let skips = [
            Skip::NotExported {
                label: String::new(),
            },
            Skip::MissingName,
            Skip::MissingNamespace,
            Skip::LabelsInvalid {
                key: String::new(),
                message: String::new(),
            },
            Skip::AnnotationsInvalid {
                key: String::new(),
                message: String::new(),
            },
            Skip::AnnotationsTooLarge { size: 0, limit: 0 },
        ];
        for s in &skips {
            assert!(Skip::REASONS.contains(&s.reason()), "{}", s.reason());
        }
        let outcomes = [
            Outcome::Applied,
            Outcome::Deleted,
            Outcome::Unchanged,
            Outcome::Skipped("x"),
            Outcome::Conflict,
            Outcome::NotReady,
        ];
        for o in &outcomes {
            assert!(Outcome::LABELS.contains(&o.label()), "{}", o.label());
        }
    }

    #[test]
    fn renders_prometheus_text_with_prefix() {
        let m = Metrics::default();
        m.writes
            .get_or_create(&ByKindVerb::new("Service", "create"))
            .inc();
        let text = m.render();
        assert!(
            text.contains("xcc_writes_total{kind=\"Service\",verb=\"create\"} 1"),
            "{text}"
        );
        assert!(text.contains("xcc_build_info{version="), "{text}");
    }
}
