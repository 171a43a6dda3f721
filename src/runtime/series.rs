//! The series of one remote, which leave the page with it. Counters and histograms by remote live
//! in a [`PerRemote`] family: [`Departed::forget`] drops a departed remote's series and keeps
//! out any a late increment would bring back. Gauges by remote are not stored at all: the
//! [`RemoteGauges`] collector reads them, when scraped, from the set of remotes, so a remote
//! that is not in the set has none.
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::hash::Hash;
use std::sync::Arc;

use parking_lot::RwLock;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::{MetricType, TypedMetric};

/// The labels of a gauge by remote (the same names as `metrics::ByRemote`, which this file
/// cannot import: `metrics.rs` imports it).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ByRemote {
    remote: String,
}

/// The labels of `xcc_export_conflicts`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ByRemoteKind {
    remote: String,
    kind: &'static str,
}

fn by_remote(r: &RemoteReading) -> ByRemote {
    ByRemote {
        remote: r.remote.clone(),
    }
}

/// A label set that names a remote (or `local`, which never departs).
pub trait RemoteLabel {
    fn remote(&self) -> &str;
}

/// The remotes that left and have not joined again: their series are never on the page.
#[derive(Clone, Debug, Default)]
pub struct Departed(Arc<RwLock<HashSet<String>>>);

impl Departed {
    pub fn contains(&self, remote: &str) -> bool {
        self.0.read().contains(remote)
    }

    pub fn insert(&self, remote: &str) {
        self.0.write().insert(remote.to_string());
    }

    pub fn remove(&self, remote: &str) {
        self.0.write().remove(remote);
    }
}

/// A metric family by remote: prometheus-client's `Family` (which cannot drop the series of one
/// remote), with the series of departed remotes left off the page and [`PerRemote::forget`].
pub struct PerRemote<L, M> {
    series: Arc<RwLock<HashMap<L, M>>>,
    new: fn() -> M,
    departed: Departed,
}

impl<L, M> Clone for PerRemote<L, M> {
    fn clone(&self) -> Self {
        Self {
            series: Arc::clone(&self.series),
            new: self.new,
            departed: self.departed.clone(),
        }
    }
}

impl<L, M> fmt::Debug for PerRemote<L, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PerRemote({} series)", self.series.read().len())
    }
}

impl<L: Clone + Hash + Eq + RemoteLabel, M: Clone + Default> PerRemote<L, M> {
    pub fn new(departed: &Departed) -> Self {
        Self::with(departed, M::default)
    }
}

impl<L: Clone + Hash + Eq + RemoteLabel, M: Clone> PerRemote<L, M> {
    /// A family whose series are made by `new` (a histogram's buckets).
    pub fn with(departed: &Departed, new: fn() -> M) -> Self {
        Self {
            series: Arc::default(),
            new,
            departed: departed.clone(),
        }
    }

    /// The series of `labels`, created (at 0) if missing. The metric shares its value with the
    /// family, as prometheus-client's metrics do when cloned.
    pub fn get_or_create(&self, labels: &L) -> M {
        if let Some(m) = self.series.read().get(labels) {
            return m.clone();
        }
        self.series
            .write()
            .entry(labels.clone())
            .or_insert_with(self.new)
            .clone()
    }

    /// Drops every series of `remote`.
    pub fn forget(&self, remote: &str) {
        self.series.write().retain(|l, _| l.remote() != remote);
    }

    fn shown(&self, l: &L) -> bool {
        !self.departed.contains(l.remote())
    }
}

impl<L, M> TypedMetric for PerRemote<L, M>
where
    M: TypedMetric,
{
    const TYPE: MetricType = M::TYPE;
}

impl<L, M> EncodeMetric for PerRemote<L, M>
where
    L: Clone + Hash + Eq + RemoteLabel + EncodeLabelSet,
    M: Clone + EncodeMetric + TypedMetric,
{
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), fmt::Error> {
        let series = self.series.read();
        for (labels, m) in series.iter().filter(|(l, _)| self.shown(l)) {
            m.encode(encoder.encode_family(labels)?)?;
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        M::TYPE
    }

    fn is_empty(&self) -> bool {
        !self.series.read().keys().any(|l| self.shown(l))
    }
}

/// What one remote's gauges read now, taken from the set of remotes at each scrape.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RemoteReading {
    pub remote: String,
    /// Services it exports in the mirrored namespaces
    pub followers: i64,
    /// per conflict kind, followers on which its export loses a conflict now
    pub export_conflicts: Vec<(&'static str, i64)>,
    pub up: bool,
    pub over_budget: bool,
    /// None until its watches completed a listing
    pub seconds_since_list: Option<f64>,
    /// None while unknown
    pub credential_expiry: Option<i64>,
    /// None without an outage policy
    pub stale: Option<bool>,
    /// None without the MCS API
    pub mcs_name_refused: Option<bool>,
    /// None without the data-path probe
    pub cut_off: Option<bool>,
    /// its followers held at a write limit now
    pub write_limited: i64,
}

/// The gauge families [`RemoteGauges`] publishes: (name, help). Registered families are listed
/// in `registry.register` calls; these are the rest (`tests/reference.rs` counts both).
pub const REMOTE_GAUGES: [(&str, &str); 10] = [
    (
        "followers",
        "Leaders this remote exports (each mirrored into one local follower, merged with other remotes' exports of the same namespace/name)",
    ),
    (
        "export_conflicts",
        "Followers on which this remote's export loses a conflict with an older exported Service, by kind",
    ),
    ("remote_up", "1 while every watch of the remote is healthy"),
    (
        "remote_over_budget",
        "1 while the remote is over its budget (Services, endpoints or cached bytes): its caches are dropped, its followers kept, and it is read again after a back-off",
    ),
    (
        "remote_seconds_since_list",
        "Seconds since the remote's watches last completed a full listing",
    ),
    (
        "remote_credential_expiry_timestamp_seconds",
        "When the remote's credential expires (its token's exp, its client certificate's notAfter), Unix seconds; absent when unknown",
    ),
    (
        "remote_stale",
        "1 while the outage policy marks this remote's endpoints not ready (stale_after passed); only for a remote with the policy",
    ),
    (
        "mcs_name_refused",
        "1 while the MCS cluster name this remote claims is refused because another cluster (or the local one) holds it; its exports wait",
    ),
    (
        "remote_cut_off",
        "1 while the data-path probe finds this remote's endpoints unreachable (every probe failed for probe_after): they are published as not ready; only for a remote with the probe",
    ),
    (
        "remote_write_limited",
        "Followers held at a write limit now because of this remote: its leader's labels over --remote-max-label-bytes (the follower's labels kept as they were), or its slices or ports over --remote-max-slices-per-service or --remote-max-ports-per-service (what the follower has of it kept as it was)",
    ),
];

type Read = Box<dyn Fn() -> Vec<RemoteReading> + Send + Sync>;

/// The per-remote gauges, read when scraped from whatever [`RemoteGauges::read_with`] was given
/// (nothing until then).
#[derive(Clone, Default)]
pub struct RemoteGauges(Arc<RwLock<Option<Read>>>);

impl fmt::Debug for RemoteGauges {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("RemoteGauges")
    }
}

impl RemoteGauges {
    /// Where the readings come from (the set of remotes): called at each scrape.
    pub fn read_with(&self, read: impl Fn() -> Vec<RemoteReading> + Send + Sync + 'static) {
        *self.0.write() = Some(Box::new(read));
    }

    fn readings(&self) -> Vec<RemoteReading> {
        self.0
            .read()
            .as_ref()
            .map(|read| read())
            .unwrap_or_default()
    }
}

/// One gauge family's series: (labels, value).
type Series<L, N> = Vec<(L, N)>;

fn gauge<L: EncodeLabelSet, N: Copy>(
    e: &mut DescriptorEncoder,
    (name, help): (&str, &str),
    series: Series<L, N>,
) -> Result<(), fmt::Error>
where
    ConstGauge<N>: EncodeMetric,
{
    if series.is_empty() {
        return Ok(());
    }
    let mut family = e.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, value) in &series {
        ConstGauge::new(*value).encode(family.encode_family(labels)?)?;
    }
    Ok(())
}

impl Collector for RemoteGauges {
    fn encode(&self, mut e: DescriptorEncoder) -> Result<(), fmt::Error> {
        let r = self.readings();
        let by = |f: fn(&RemoteReading) -> Option<i64>| -> Series<ByRemote, i64> {
            r.iter()
                .filter_map(|x| f(x).map(|v| (by_remote(x), v)))
                .collect()
        };
        let [
            followers,
            conflicts,
            up,
            budget,
            since,
            expiry,
            stale,
            mcs,
            cut,
            limited,
        ] = REMOTE_GAUGES;
        gauge(&mut e, followers, by(|x| Some(x.followers)))?;
        let per_kind = r.iter().flat_map(|x| {
            x.export_conflicts.iter().map(|(kind, n)| {
                let remote = x.remote.clone();
                (ByRemoteKind { remote, kind }, *n)
            })
        });
        gauge(&mut e, conflicts, per_kind.collect())?;
        gauge(&mut e, up, by(|x| Some(i64::from(x.up))))?;
        gauge(&mut e, budget, by(|x| Some(i64::from(x.over_budget))))?;
        let since_list: Series<ByRemote, f64> = r
            .iter()
            .filter_map(|x| Some((by_remote(x), x.seconds_since_list?)))
            .collect();
        gauge(&mut e, since, since_list)?;
        gauge(&mut e, expiry, by(|x| x.credential_expiry))?;
        gauge(&mut e, stale, by(|x| x.stale.map(i64::from)))?;
        gauge(&mut e, mcs, by(|x| x.mcs_name_refused.map(i64::from)))?;
        gauge(&mut e, cut, by(|x| x.cut_off.map(i64::from)))?;
        gauge(&mut e, limited, by(|x| Some(x.write_limited)))
    }
}
