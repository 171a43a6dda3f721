//! What one remote cluster looks like, as its watches have seen it.
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::jiff::Timestamp;
use parking_lot::RwLock;

use super::budget::{Budget, Judged, Limits, Usage};
use super::cache::{Cache, CacheError, GroupKey, Held, by_name, by_service_label};
use crate::desired::Options;
pub struct RemoteState {
    pub name: Arc<str>,
    pub opts: Options,
    /// namespaces mirrored from this remote (empty: all)
    pub namespaces: Vec<String>,
    pub services: RwLock<Cache<Service>>,
    /// slices carrying the export label (kube-controller-manager copies a Service's labels onto
    /// the slices it makes)
    pub slices: RwLock<Cache<EndpointSlice>>,
    /// slices written by anyone else (a selectorless Service's slices, other controllers'),
    /// which carry only `kubernetes.io/service-name`; see [`Options::foreign_slice_selector`]
    pub foreign_slices: RwLock<Cache<EndpointSlice>>,
    /// the outage policy: after this long unreachable, its endpoints are marked not ready
    pub stale_after: Option<std::time::Duration>,
    /// true while the outage policy marks its endpoints not ready
    pub marked: AtomicBool,
    /// the data-path probe: after every probe of its endpoints failed this long, they are
    /// published as not ready (see `crate::remotes::probe`)
    pub probe_after: Option<std::time::Duration>,
    /// true while the probe finds its data path cut
    pub cut_off: AtomicBool,
    /// what its credential says (expiry), set once when it joins (see [`crate::remotes::credentials`])
    pub credential: std::sync::OnceLock<Credential>,
    /// its part in the Multi-Cluster Services API (`--mcs`)
    pub mcs: Option<Arc<super::mcs::McsCluster>>,
    /// which of its addresses may reach a local object (see `desired::addresses`)
    pub addresses: crate::desired::addresses::AddressPolicy,
    /// how much it may cost, and whether it is over (see [`super::budget`])
    pub budget: Budget,
    /// its followers held at a write limit now (`namespace/name` -> why; see
    /// [`crate::desired::limits`]): at most one entry per Service it exports
    write_limited: parking_lot::Mutex<std::collections::BTreeMap<String, String>>,
    /// how often the follower Services whose fields come from it may be updated
    service_updates: parking_lot::Mutex<super::rate::TokenBucket>,
}

/// What a slice counts against its remote's budget: its endpoints.
fn endpoints(s: &EndpointSlice) -> usize {
    s.endpoints.len()
}

impl RemoteState {
    pub fn new(name: &str, opts: Options, namespaces: Vec<String>) -> Self {
        let rate = opts.containment.limits.service_updates;
        Self {
            name: name.into(),
            opts,
            namespaces,
            services: RwLock::new(Cache::new(by_name::<Service>).lean(|_| 0)),
            slices: RwLock::new(Cache::new(by_service_label::<EndpointSlice>).lean(endpoints)),
            foreign_slices: RwLock::new(
                Cache::new(by_service_label::<EndpointSlice>).lean(endpoints),
            ),
            stale_after: None,
            marked: AtomicBool::new(false),
            probe_after: None,
            cut_off: AtomicBool::new(false),
            credential: std::sync::OnceLock::new(),
            mcs: None,
            addresses: Default::default(),
            budget: Budget::default(),
            write_limited: Default::default(),
            service_updates: parking_lot::Mutex::new(super::rate::TokenBucket::new(rate)),
        }
    }

    /// Takes a token for one update of a follower Service whose fields come from this remote;
    /// Err with how long until one is due (the pass then leaves the Service as it is).
    pub fn take_service_update(&self, now: std::time::Instant) -> Result<(), std::time::Duration> {
        self.service_updates.lock().take(now)
    }

    /// The follower Service updates a second it may cause (0: no limit).
    pub fn service_update_rate(&self) -> u64 {
        self.service_updates.lock().rate()
    }

    /// A pass of `key` found this remote's export of it over a write limit (`why`), or within
    /// them all (None).
    pub fn set_write_limited(&self, key: &str, why: Option<String>) {
        let mut held = self.write_limited.lock();
        match why {
            Some(why) => {
                held.insert(key.to_string(), why);
            }
            None => {
                held.remove(key);
            }
        }
    }

    /// How many of its followers are held at a write limit, and the first of them (by key)
    /// with why: what /readyz shows.
    pub fn write_limited(&self) -> (usize, Option<(String, String)>) {
        let held = self.write_limited.lock();
        let first = held.iter().next().map(|(k, v)| (k.clone(), v.clone()));
        (held.len(), first)
    }

    /// With its budget (see [`super::budget`]).
    pub fn with_budget(mut self, limits: Limits) -> Self {
        self.budget = Budget::new(limits);
        self
    }

    /// What its caches hold now: its labelled Services and their slices, and with the MCS API
    /// its exports and the Services and slices they name.
    pub fn usage(&self) -> Usage {
        let of = |h: Held| Usage {
            services: 0,
            endpoints: h.weight as u64,
            bytes: h.bytes as u64,
        };
        let services = self.services.read().held();
        let slices = self.slices.read().held();
        let foreign = self.foreign_slices.read().held();
        let services = Usage {
            services: services.objects as u64,
            ..of(services)
        };
        let mcs = self.mcs.as_ref().map(|c| c.usage()).unwrap_or_default();
        services + of(slices) + of(foreign) + mcs
    }

    /// Judges its caches against its budget after a watch event; `seen` is the budget's epoch
    /// when the watch last listed. Err when it must stop and list again: the remote went over
    /// budget (now: every cache of it is dropped, or since that watch listed).
    pub fn admit(&self, seen: u64) -> Result<(), String> {
        if self.budget.epoch() != seen {
            return Err(self.over_budget_problem());
        }
        match self.budget.judge(&self.usage(), std::time::Instant::now()) {
            Judged::Within => Ok(()),
            Judged::Tripped(why) => {
                tracing::warn!(remote = %self.name, "over budget ({why}): its caches are dropped, its followers kept; read again after a back-off");
                let why = format!("over budget: {why}");
                self.services.write().evict(why.clone());
                self.slices.write().evict(why.clone());
                self.foreign_slices.write().evict(why.clone());
                if let Some(c) = &self.mcs {
                    c.evict(&why);
                }
                Err(why)
            }
        }
    }

    /// A watch of it completed a listing: once all have, within the budget, it is not over
    /// budget any more.
    pub fn listed(&self) {
        if self.budget.over().is_some()
            && self.ready()
            && self.budget.limits.exceeded(&self.usage()).is_none()
            && self.budget.clear()
        {
            tracing::info!(remote = %self.name, "within budget again: every cache listed");
        }
    }

    /// True while it is over budget.
    pub fn over_budget(&self) -> bool {
        self.budget.over().is_some()
    }

    fn over_budget_problem(&self) -> String {
        let why = self.budget.over().unwrap_or_default();
        format!("over budget: {why}")
    }

    /// With its address policy (its allowed CIDRs; strict mode).
    pub fn with_addresses(mut self, policy: crate::desired::addresses::AddressPolicy) -> Self {
        self.addresses = policy;
        self
    }

    /// Read as an MCS source too (`--mcs`): its name without a ClusterProperty is its name here;
    /// its identity is that name and its cluster id.
    pub fn with_mcs(mut self, mcs: bool, cluster_id: Option<&str>) -> Self {
        self.mcs = mcs.then(|| {
            let who = crate::desired::mcs::Identity::remote(&self.name, cluster_id);
            Arc::new(super::mcs::McsCluster::new(who, &self.name, &self.name))
        });
        self
    }

    /// With the outage policy (see [`crate::remotes::outage`]).
    pub fn with_stale_after(mut self, stale_after: Option<std::time::Duration>) -> Self {
        self.stale_after = stale_after;
        self
    }

    /// With the data-path probe (see `crate::remotes::probe`).
    pub fn with_probe_after(mut self, probe_after: Option<std::time::Duration>) -> Self {
        self.probe_after = probe_after;
        self
    }

    /// Whether its endpoints are published as not ready now: the outage policy marks them, or
    /// the probe finds its data path cut.
    pub fn is_marked(&self) -> bool {
        self.is_stale() || self.is_cut_off()
    }

    /// Whether the outage policy marks it now (its API server unreachable past `stale-after`).
    pub fn is_stale(&self) -> bool {
        self.marked.load(Ordering::SeqCst)
    }

    /// Whether the probe finds its data path cut now.
    pub fn is_cut_off(&self) -> bool {
        self.cut_off.load(Ordering::SeqCst)
    }

    /// Up to `n` addresses of its ready endpoints to probe, with the port of their slice: those
    /// of the `round`-th Service it exports in either mode (labelled, or by a ServiceExport; in
    /// key order, wrapping), a few decoded per round.
    pub fn probe_targets(&self, round: usize, n: usize) -> Vec<std::net::SocketAddr> {
        let mut keys: std::collections::BTreeSet<GroupKey> =
            self.services.read().keys().cloned().collect();
        if let Some(mcs) = &self.mcs {
            keys.extend(mcs.exported());
        }
        let keys: Vec<GroupKey> = keys.into_iter().collect();
        // a few Services decoded per round at most, even when none has a ready endpoint
        for i in 0..keys.len().min(16) {
            let g = &keys[(round + i) % keys.len()];
            let slices = self.probe_slices(g);
            let targets = crate::desired::probe_targets(&slices, n);
            if !targets.is_empty() {
                return targets;
            }
        }
        Vec::new()
    }

    /// The slices of one exported Service to probe: the label mode's, else the MCS watch's of
    /// its namespace (the same slices, when it exports in both modes).
    fn probe_slices(&self, g: &GroupKey) -> Vec<Arc<EndpointSlice>> {
        match self.slices_of(g) {
            Ok(slices) if !slices.is_empty() => slices,
            _ => self
                .mcs
                .as_ref()
                .and_then(|m| m.namespace(&g.0))
                .and_then(|ns| ns.slices.read().group(g).ok())
                .unwrap_or_default(),
        }
    }

    pub fn ready(&self) -> bool {
        self.services.read().ready()
            && self.slices.read().ready()
            && self.foreign_slices.read().ready()
    }

    /// What [`RemoteState::ready`] rests on.
    pub fn readiness(&self) -> Vec<tokio::sync::watch::Receiver<bool>> {
        vec![
            self.services.read().readiness(),
            self.slices.read().readiness(),
            self.foreign_slices.read().readiness(),
        ]
    }

    /// Every remote slice of one Service, from both slice watches (a slice is in at most one of
    /// them, except briefly while its labels change: then it is counted once).
    pub fn slices_of(&self, g: &GroupKey) -> Result<Vec<Arc<EndpointSlice>>, CacheError> {
        let mut all = self.slices.read().group(g)?;
        let foreign = self.foreign_slices.read().group(g)?;
        for s in foreign {
            if !all.iter().any(|a| a.metadata.name == s.metadata.name) {
                all.push(s);
            }
        }
        Ok(all)
    }

    /// None when healthy; otherwise why not, for /readyz.
    pub fn problem(&self) -> Option<String> {
        if let Err(held) = self.budget.hold(std::time::Instant::now()) {
            return Some(held);
        }
        if let Some(why) = self.budget.over() {
            return Some(format!(
                "over budget ({why}): its followers are kept; being read again"
            ));
        }
        // one guard at a time: a second read of a lock this thread already holds can deadlock
        // behind a waiting writer
        let services = self.services.read().problem("Services");
        services
            .or_else(|| self.slices.read().problem("EndpointSlices"))
            .or_else(|| {
                self.foreign_slices
                    .read()
                    .problem("EndpointSlices of other managers")
            })
            .or_else(|| self.mcs.as_ref().and_then(|m| m.problem()))
    }

    /// Seconds since the oldest of this remote's last complete listings.
    pub fn seconds_since_list(&self) -> Option<f64> {
        let a = self.services.read().last_list()?;
        let b = self.slices.read().last_list()?;
        let c = self.foreign_slices.read().last_list()?;
        Some(a.min(b).min(c).elapsed().as_secs_f64())
    }

    /// How many Services it exports in the mirrored namespaces.
    pub fn exported_in_scope(&self) -> usize {
        self.services
            .read()
            .keys()
            .filter(|k| self.in_scope(&k.0))
            .count()
    }

    /// The Services it exports in the mirrored namespaces that no follower may be, their
    /// namespace or name being a top-level domain (`desired::names`), sorted.
    pub fn refused_names(&self) -> Vec<GroupKey> {
        let mut keys: Vec<GroupKey> = self
            .services
            .read()
            .keys()
            .filter(|k| self.in_scope(&k.0) && self.opts.public_name(&k.0, &k.1).is_some())
            .cloned()
            .collect();
        keys.sort();
        keys
    }

    pub fn in_scope(&self, namespace: &str) -> bool {
        crate::desired::in_scope(&self.namespaces, namespace)
    }
}

/// What a remote's credential says about itself (filled in by [`crate::remotes::credentials`]
/// when the remote joins).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Credential {
    /// the earliest of the token's `exp` and the client certificate's notAfter
    pub expiry: Option<Timestamp>,
    /// the token's `iat`
    pub issued: Option<Timestamp>,
    /// the token's `sub` (`system:serviceaccount:<ns>:<name>` for a ServiceAccount)
    pub subject: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::watcher::Event;
    use serde_json::json;

    fn svc(name: &str) -> Service {
        serde_json::from_value(json!({"metadata": {"namespace": "a", "name": name,
                                                   "resourceVersion": "1"}}))
        .unwrap()
    }

    fn listed(state: &RemoteState, services: &[&str]) {
        state.services.write().apply(Event::Init);
        for s in services {
            state.services.write().apply(Event::InitApply(svc(s)));
        }
        state.services.write().apply(Event::InitDone);
        for c in [&state.slices, &state.foreign_slices] {
            c.write().apply(Event::Init);
            c.write().apply(Event::InitDone);
        }
    }

    #[test]
    fn over_budget_every_cache_is_dropped_and_a_listing_within_it_clears_the_state() {
        let limits = Limits {
            services: 2,
            ..Default::default()
        };
        let state = RemoteState::new("east", crate::fixtures::opts(), vec![]).with_budget(limits);
        listed(&state, &["x", "y"]);
        assert_eq!(state.admit(0), Ok(()));
        assert!(state.ready() && !state.over_budget());
        state.services.write().apply(Event::Apply(svc("z")));
        let why = state.admit(0).unwrap_err();
        assert!(why.contains("more than 2 exported Services"), "{why}");
        assert!(state.over_budget());
        assert!(!state.ready(), "it proves nothing now");
        assert_eq!(state.usage(), Usage::default(), "nothing of it is held");
        let problem = state.problem().unwrap();
        assert!(problem.contains("over budget"), "{problem}");
        assert!(problem.contains("followers are kept"), "{problem}");
        // a watch that listed before the drop must list again
        assert!(state.admit(0).is_err());
        // a listing within the budget: clear
        listed(&state, &["x"]);
        state.listed();
        assert!(!state.over_budget());
        assert_eq!(state.admit(state.budget.epoch()), Ok(()));
    }

    #[test]
    fn the_names_refused_are_those_named_like_top_level_domains_in_scope() {
        // namespace "a" is no TLD; "com" and "dev" are
        let state = RemoteState::new("east", crate::fixtures::opts(), vec![]);
        listed(&state, &["web", "com", "dev", "checkout"]);
        let refused = |s: &RemoteState| s.refused_names();
        let key = |n: &str| ("a".to_string(), n.to_string());
        assert_eq!(refused(&state), [key("com"), key("dev")]);
        let allowed = crate::desired::containment::Containment {
            allowed_tld_names: vec!["dev".into()],
            ..Default::default()
        };
        let opts = crate::fixtures::opts().with_containment(allowed);
        let state = RemoteState::new("east", opts, vec!["b".into()]);
        listed(&state, &["com"]);
        assert!(refused(&state).is_empty(), "namespace a is not mirrored");
        let state = RemoteState::new("east", state.opts.clone(), vec![]);
        listed(&state, &["com", "dev"]);
        assert_eq!(refused(&state), [key("com")]);
    }

    #[test]
    fn the_probe_finds_endpoints_of_services_exported_either_way() {
        use crate::fixtures::{loaded, obj};
        let state = RemoteState::new("east", crate::fixtures::opts(), vec![]).with_mcs(true, None);
        listed(&state, &[]);
        assert!(state.probe_targets(0, 3).is_empty(), "nothing exported");
        // exported only by a ServiceExport: its slice is in the MCS watch of its namespace
        let mcs = state.mcs.clone().unwrap();
        loaded(
            &mcs.exports,
            [obj(
                json!({"metadata": {"namespace": "shop", "name": "db"}}),
            )],
        );
        let ns = Arc::new(crate::state::mcs::McsNamespace::new(
            tokio_util::sync::CancellationToken::new(),
        ));
        mcs.namespaces
            .write()
            .insert("shop".into(), Arc::clone(&ns));
        let slice = json!({
            "metadata": {"namespace": "shop", "name": "db-1",
                         "labels": {"kubernetes.io/service-name": "db"}},
            "addressType": "IPv4",
            "ports": [{"name": "sql", "port": 5432, "protocol": "TCP"}],
            "endpoints": [{"addresses": ["10.1.0.7"], "conditions": {"ready": true}},
                          {"addresses": ["10.1.0.8"], "conditions": {"ready": false}}]
        });
        loaded(&ns.slices, [obj(slice)]);
        let want: Vec<std::net::SocketAddr> = vec!["10.1.0.7:5432".parse().unwrap()];
        assert_eq!(state.probe_targets(0, 3), want);
        assert_eq!(
            state.probe_targets(7, 3),
            want,
            "the only key, whatever the round"
        );
    }
}
