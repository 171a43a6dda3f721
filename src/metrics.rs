//! The metric registry. Label values are bounded: remote cluster names (configured), kinds,
//! verbs, outcomes and reason categories; never an object name.
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

type Labels = Vec<(&'static str, String)>;

pub struct Metrics {
    registry: Registry,
    pub reconciles: Family<Labels, Counter>,
    pub writes: Family<Labels, Counter>,
    pub skipped: Family<Labels, Counter>,
    pub conflicts: Family<Labels, Counter>,
    pub sweeps: Family<Labels, Counter>,
    pub sweep_deletions: Family<Labels, Counter>,
    pub followers: Family<Labels, Gauge>,
    pub leader: Gauge,
    pub remote_up: Family<Labels, Gauge>,
    pub since_list: Family<Labels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    pub lag: Family<Labels, Histogram>,
    pub events_suppressed: Counter,
    pub watch_requests: Family<Labels, Counter>,
    pub panics: Family<Labels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("xcc");
        let m = Metrics {
            reconciles: Family::default(),
            writes: Family::default(),
            skipped: Family::default(),
            conflicts: Family::default(),
            sweeps: Family::default(),
            sweep_deletions: Family::default(),
            followers: Family::default(),
            leader: Gauge::default(),
            remote_up: Family::default(),
            since_list: Family::default(),
            // 1 ms .. ~33 s
            lag: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.001, 2.0, 16))
            }),
            events_suppressed: Counter::default(),
            watch_requests: Family::default(),
            panics: Family::default(),
            registry: Registry::default(),
        };
        registry.register(
            "reconciles",
            "Reconciles by remote and outcome",
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
            "Follower Services held locally, per remote",
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
        let build: Family<Labels, Gauge> = Family::default();
        build
            .get_or_create(&vec![("version", env!("CARGO_PKG_VERSION").to_string())])
            .set(1);
        registry.register("build_info", "Build information", build);
        Metrics { registry, ..m }
    }
}

impl Metrics {
    pub fn render(&self) -> String {
        let mut out = String::new();
        // writing into a String cannot fail
        let _ = encode(&mut out, &self.registry);
        out
    }
}

pub fn labels<const N: usize>(pairs: [(&'static str, &str); N]) -> Labels {
    pairs.iter().map(|(k, v)| (*k, v.to_string())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_prometheus_text_with_prefix() {
        let m = Metrics::default();
        m.writes
            .get_or_create(&labels([("kind", "Service"), ("verb", "create")]))
            .inc();
        let text = m.render();
        assert!(
            text.contains("xcc_writes_total{kind=\"Service\",verb=\"create\"} 1"),
            "{text}"
        );
        assert!(text.contains("xcc_build_info{version="), "{text}");
    }
}
