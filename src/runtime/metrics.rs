//! The metric registry. Label values are bounded: remote cluster names (configured), kinds,
//! verbs, outcomes and reason categories; never an object name.
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use super::series::{Departed, RemoteLabel};
pub use super::series::{PerRemote, RemoteGauges, RemoteReading};

/// The registry. A family with a remote label is a [`PerRemote`] (counters, histograms: a
/// departed remote's series go, see [`Metrics::forget_remote`]) or one of the gauges
/// [`RemoteGauges`] reads from the set of remotes when scraped.
pub struct Metrics {
    registry: Registry,
    departed: Departed,
    /// the gauges by remote, read at each scrape from what `read_with` is given
    pub remote_gauges: RemoteGauges,
    pub reconciles: Family<ByOutcome, Counter>,
    pub reconcile_duration: Family<ByModeOutcome, Histogram>,
    pub writes: Family<ByKindVerb, Counter>,
    pub write_duration: Family<ByKindVerb, Histogram>,
    pub write_errors: Family<ByKindVerbCode, Counter>,
    pub skipped: PerRemote<ByRemoteReason, Counter>,
    pub addresses_refused: PerRemote<ByRemoteReason, Counter>,
    pub conflicts: PerRemote<ByRemoteKind, Counter>,
    pub sweeps: PerRemote<ByRemoteOutcome, Counter>,
    pub sweep_deletions: Counter,
    pub leader: Gauge,
    pub lag: PerRemote<ByRemote, Histogram>,
    pub events_suppressed: Counter,
    pub watch_requests: PerRemote<ByWatch, Counter>,
    pub panics: Counter,
    pub remote_stale_transitions: PerRemote<ByRemoteTo, Counter>,
    pub remote_changes: Family<ByChange, Counter>,
    pub remote_secrets_refused: Gauge,
    pub remote_profiles_refused: Gauge,
    pub remote_refusals: Family<ByKindReason, Counter>,
    pub credential_renewals: PerRemote<ByRemoteOutcome, Counter>,
    pub probes: PerRemote<ByRemoteOutcome, Counter>,
    pub labels_refused: PerRemote<ByRemoteReason, Counter>,
    pub taken_over: PerRemote<ByRemote, Counter>,
    pub service_updates_deferred: PerRemote<ByRemote, Counter>,
}

/// 1 ms .. ~33 s
fn seconds() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("xcc");
        let gone = Departed::default();
        let m = Metrics {
            remote_gauges: RemoteGauges::default(),
            reconciles: Family::default(),
            reconcile_duration: Family::new_with_constructor(seconds),
            writes: Family::default(),
            write_duration: Family::new_with_constructor(seconds),
            write_errors: Family::default(),
            skipped: PerRemote::new(&gone),
            addresses_refused: PerRemote::new(&gone),
            conflicts: PerRemote::new(&gone),
            sweeps: PerRemote::new(&gone),
            sweep_deletions: Counter::default(),
            leader: Gauge::default(),
            lag: PerRemote::with(&gone, seconds),
            events_suppressed: Counter::default(),
            watch_requests: PerRemote::new(&gone),
            panics: Counter::default(),
            remote_stale_transitions: PerRemote::new(&gone),
            remote_changes: Family::default(),
            remote_secrets_refused: Gauge::default(),
            remote_profiles_refused: Gauge::default(),
            remote_refusals: Family::default(),
            credential_renewals: PerRemote::new(&gone),
            probes: PerRemote::new(&gone),
            labels_refused: PerRemote::new(&gone),
            taken_over: PerRemote::new(&gone),
            service_updates_deferred: PerRemote::new(&gone),
            departed: gone,
            registry: Registry::default(),
        };
        registry.register(
            "reconciles",
            "Reconcile passes (one per local follower key) by outcome",
            m.reconciles.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "Reconcile passes by mode (follower: the label mode; mcs: the Multi-Cluster Services API) and outcome, timed from the pass's start to its end",
            m.reconcile_duration.clone(),
        );
        registry.register(
            "write_duration_seconds",
            "Requests the writer sent to the local cluster by kind and verb, timed until answered (refused and unanswered ones too: a write left unanswered counts its deadline)",
            m.write_duration.clone(),
        );
        registry.register(
            "write_errors",
            "Writes the local cluster refused or left unanswered, by kind, verb and code (the HTTP status, e.g. 403 or 409; timeout; other)",
            m.write_errors.clone(),
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
            "leader",
            "1 while this replica holds the Lease",
            m.leader.clone(),
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
            "remote_stale_transitions",
            "Outage policy transitions by remote: marked (endpoints set not ready), restored",
            m.remote_stale_transitions.clone(),
        );
        registry.register(
            "remote_changes",
            "Remotes joined, rotated, left, and Secrets or ClusterProfiles refused as remotes",
            m.remote_changes.clone(),
        );
        registry.register(
            "remote_secrets_refused",
            "Remote Secrets that are not a remote now (each named on /readyz)",
            m.remote_secrets_refused.clone(),
        );
        registry.register(
            "remote_profiles_refused",
            "ClusterProfiles that are not a remote now (each named on /readyz)",
            m.remote_profiles_refused.clone(),
        );
        registry.register(
            "remote_refusals",
            "Secrets, ClusterProfiles and the static remote refused as remotes, by kind (Secret, ClusterProfile, static) and reason (PinMismatch, NotAUuid, Held, AlreadyRead, ...), counted when an object's refusal is new or its reason changed",
            m.remote_refusals.clone(),
        );
        registry.register(
            "remote_credential_renewals",
            "Renewals of the remote's token by outcome (renewed, failed)",
            m.credential_renewals.clone(),
        );
        registry.register(
            "remote_probes",
            "Data-path probe rounds of a remote with the probe, by outcome: reachable (a TCP connect to one of its endpoints was answered, accepted or refused), unreachable (none was)",
            m.probes.clone(),
        );
        registry.register(
            "labels_refused",
            "Remote labels not copied onto local objects, by remote and reason (reserved, denied, not_allowed, over_limit: the leader's labels over --remote-max-label-bytes), counted at each pass that builds a follower",
            m.labels_refused.clone(),
        );
        registry.register(
            "service_updates_deferred",
            "Follower Service updates left for later because the remote their fields come from had none left (--remote-max-service-updates-per-second); the key comes back when one is due and writes what changed meanwhile once",
            m.service_updates_deferred.clone(),
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
        registry.register_collector(Box::new(m.remote_gauges.clone()));
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
    /// The refusal series of a kind of remote object (`Secret`, `ClusterProfile`) at 0, one per
    /// reason: a source of that kind runs.
    pub fn init_refusals(&self, kind: &str, reasons: &[&str]) {
        for reason in reasons {
            touch(&self.remote_refusals, ByKindReason::new(kind, reason));
        }
    }

    /// A registry with the writer's series at 0; [`Metrics::init_remote`] adds a remote's.
    pub fn new() -> Self {
        let m = Self::default();
        for outcome in crate::desired::Outcome::LABELS {
            touch(&m.reconciles, ByOutcome::new(outcome));
        }
        for change in ["joined", "rotated", "left", "refused"] {
            touch(&m.remote_changes, ByChange::new(change));
        }
        let mut written: Vec<ByKindVerb> = Vec::new();
        for kind in KINDS {
            for verb in VERBS {
                written.push(ByKindVerb::new(kind, verb));
            }
        }
        for kind in CREATED_ONLY {
            written.push(ByKindVerb::new(kind, "create"));
        }
        for kind in UPDATED_ONLY {
            written.push(ByKindVerb::new(kind, "update"));
        }
        for l in written {
            drop(m.write_duration.get_or_create(&l));
            touch(&m.writes, l);
        }
        m.init_passes("follower");
        m
    }

    /// Puts at 0 the pass-duration series of a mode (`follower`, `mcs`): one per outcome a pass
    /// that ran can end with.
    fn init_passes(&self, mode: &str) {
        for outcome in crate::desired::Outcome::LABELS {
            drop(
                self.reconcile_duration
                    .get_or_create(&ByModeOutcome::new(mode, outcome)),
            );
        }
    }

    /// Puts at 0 the write series the Multi-Cluster Services API adds (`--mcs`): ServiceImports
    /// and their status, the local ServiceExports' status.
    pub fn init_mcs(&self) {
        let mut written: Vec<ByKindVerb> = ["create", "update", "update_status", "delete"]
            .into_iter()
            .map(|verb| ByKindVerb::new("ServiceImport", verb))
            .collect();
        written.push(ByKindVerb::new("ServiceExport", "update_status"));
        for l in written {
            drop(self.write_duration.get_or_create(&l));
            touch(&self.writes, l);
        }
        self.init_passes("mcs");
    }

    /// Puts at 0 every counter series of a remote whose labels are known in advance, as
    /// Prometheus advises: a counter then reads 0 before its first increment (so `increase()`
    /// and `absent()` alerts work from the start) instead of being missing from the page.
    pub fn init_remote(&self, remote: &str) {
        use crate::desired::Skip;
        use crate::desired::{
            NAMESPACE_MISSING, NAMESPACE_PROTECTED, PUBLIC_NAME_REFUSED, SERVICE_IPS_LIMITED,
        };
        self.departed.remove(remote);
        for reason in Skip::REASONS.iter().copied().chain([
            NAMESPACE_MISSING,
            NAMESPACE_PROTECTED,
            PUBLIC_NAME_REFUSED,
            SERVICE_IPS_LIMITED,
        ]) {
            touch_remote(&self.skipped, ByRemoteReason::new(remote, reason));
        }
        for reason in crate::desired::containment::LabelRefusal::LABELS {
            touch_remote(&self.labels_refused, ByRemoteReason::new(remote, reason));
        }
        touch_remote(&self.taken_over, ByRemote::new(remote));
        touch_remote(&self.service_updates_deferred, ByRemote::new(remote));
        for kind in KINDS {
            touch_remote(&self.conflicts, ByRemoteKind::new(remote, kind));
        }
        for &reason in crate::desired::addresses::Refusal::REASONS {
            touch_remote(&self.addresses_refused, ByRemoteReason::new(remote, reason));
        }
        for outcome in ["renewed", "failed"] {
            touch_remote(
                &self.credential_renewals,
                ByRemoteOutcome::new(remote, outcome),
            );
        }
        for outcome in ["done", "aborted"] {
            touch_remote(&self.sweeps, ByRemoteOutcome::new(remote, outcome));
        }
    }

    /// A remote left: every series of it goes from the page, now and whatever a late increment
    /// (a pass or a sweep under way) brings back, until a remote of that name joins again. Its
    /// gauges need nothing: they are read from the set of remotes (see [`RemoteGauges`]).
    pub fn forget_remote(&self, remote: &str) {
        self.departed.insert(remote);
        self.skipped.forget(remote);
        self.addresses_refused.forget(remote);
        self.conflicts.forget(remote);
        self.sweeps.forget(remote);
        self.lag.forget(remote);
        self.watch_requests.forget(remote);
        self.remote_stale_transitions.forget(remote);
        self.credential_renewals.forget(remote);
        self.probes.forget(remote);
        self.labels_refused.forget(remote);
        self.taken_over.forget(remote);
        self.service_updates_deferred.forget(remote);
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

/// Creates a remote's series at 0 if it does not exist.
fn touch_remote<L: Clone + std::hash::Hash + Eq + RemoteLabel>(
    family: &PerRemote<L, Counter>,
    l: L,
) {
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
label_set!(ByKindReason { kind, reason });
label_set!(ByKindVerbCode { kind, verb, code });
label_set!(ByRemote { remote });
label_set!(ByRemoteKind { remote, kind });
label_set!(ByRemoteReason { remote, reason });
label_set!(ByRemoteOutcome { remote, outcome });
label_set!(ByRemoteTo { remote, to });
label_set!(
    /// A pass: its mode (`follower`, `mcs`) and how it ended.
    ByModeOutcome { mode, outcome }
);

macro_rules! remote_label {
    ($field:ident: $($name:ident),+) => {
        $(impl RemoteLabel for $name {
            fn remote(&self) -> &str {
                &self.$field
            }
        })+
    };
}
remote_label!(remote: ByRemote, ByRemoteKind, ByRemoteReason, ByRemoteOutcome, ByRemoteTo);
remote_label!(cluster: ByWatch);
label_set!(
    /// A watch's requests: which cluster, which kind, list or watch.
    ByWatch { cluster, kind, request }
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::desired::Outcome;
    use crate::desired::Skip;

    /// One remote's gauges as the set of remotes would give them.
    fn reading(remote: &str) -> RemoteReading {
        RemoteReading {
            remote: remote.into(),
            export_conflicts: vec![("port", 0)],
            stale: Some(false),
            ..RemoteReading::default()
        }
    }

    #[test]
    fn every_counter_family_is_published_at_zero_before_its_first_increment() {
        let m = Metrics::new();
        m.init_remote("east");
        m.remote_gauges.read_with(|| vec![reading("east")]);
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

    /// Every sample line of `remote`'s series on the page.
    fn series_of(text: &str, remote: &str) -> Vec<String> {
        let (r, c) = (
            format!("remote=\"{remote}\""),
            format!("cluster=\"{remote}\""),
        );
        text.lines()
            .filter(|l| !l.starts_with('#') && (l.contains(&r) || l.contains(&c)))
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn a_remote_that_left_has_no_series_left_even_after_a_late_increment() {
        let m = Metrics::new();
        let set = std::sync::Arc::new(parking_lot::RwLock::new(vec!["east", "south"]));
        let read = std::sync::Arc::clone(&set);
        m.remote_gauges
            .read_with(move || read.read().iter().map(|r| reading(r)).collect());
        for remote in ["east", "south"] {
            m.init_remote(remote);
            m.lag.get_or_create(&ByRemote::new(remote)).observe(0.1);
            let to = ByRemoteTo::new(remote, "marked");
            m.remote_stale_transitions.get_or_create(&to).inc();
            let w = ByWatch::new(remote, "Service", "list");
            m.watch_requests.get_or_create(&w).inc();
        }
        let page = m.render();
        let (before, east) = (series_of(&page, "south"), series_of(&page, "east"));
        assert!(before.iter().any(|l| l.starts_with("xcc_export_conflicts")));
        assert!(before.iter().any(|l| l.starts_with("xcc_remote_stale{")));
        assert!(before.iter().any(|l| l.starts_with("xcc_skipped_total")));
        // south leaves the set of remotes, its series are forgotten; a pass under way counts once more
        set.write().retain(|r| *r != "south");
        m.forget_remote("south");
        let late = ByRemoteReason::new("south", "NamespaceMissing");
        m.skipped.get_or_create(&late).inc();
        let text = m.render();
        assert_eq!(series_of(&text, "south"), Vec::<String>::new(), "{text}");
        let mut kept = series_of(&text, "east");
        let mut had = east.clone();
        kept.sort();
        had.sort();
        assert_eq!(kept, had, "east keeps every series");
        // joined again: its series are back, from 0 for those forgotten
        set.write().push("south");
        m.init_remote("south");
        let again = m.render();
        assert!(again.contains("xcc_sweeps_total{remote=\"south\",outcome=\"done\"} 0"));
        assert!(
            again.contains("xcc_remote_up{remote=\"south\"} 0"),
            "{again}"
        );
    }

    #[test]
    fn the_pass_and_write_histograms_are_published_before_their_first_sample() {
        let m = Metrics::new();
        let text = m.render();
        assert!(text.contains("# TYPE xcc_reconcile_duration_seconds histogram"));
        assert!(text.contains(
            "xcc_reconcile_duration_seconds_count{mode=\"follower\",outcome=\"applied\"} 0"
        ));
        assert!(text.contains(
            "xcc_write_duration_seconds_count{kind=\"EndpointSlice\",verb=\"update\"} 0"
        ));
        assert!(
            !text.contains("mode=\"mcs\""),
            "the MCS passes only with --mcs"
        );
        m.init_mcs();
        let text = m.render();
        assert!(
            text.contains("xcc_reconcile_duration_seconds_count{mode=\"mcs\",outcome=\"error\"} 0")
        );
        assert!(text.contains(
            "xcc_write_duration_seconds_count{kind=\"ServiceImport\",verb=\"update_status\"} 0"
        ));
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
            Skip::ExternalNameRefused,
            Skip::TooManyPorts {
                ports: 0,
                limit: 0,
                what: "",
            },
            Skip::TooManySlices {
                slices: 0,
                limit: 0,
            },
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
