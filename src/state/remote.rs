//! What one remote cluster looks like, as its watches have seen it.
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::jiff::Timestamp;
use parking_lot::RwLock;

use super::cache::{Cache, CacheError, GroupKey, by_name, by_service_label};
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
    /// what its credential says (expiry), set once when it joins (see [`crate::remotes::credentials`])
    pub credential: std::sync::OnceLock<Credential>,
    /// its part in the Multi-Cluster Services API (`--mcs`)
    pub mcs: Option<Arc<super::mcs::McsCluster>>,
    /// which of its addresses may reach a local object (see `desired::addresses`)
    pub addresses: crate::desired::addresses::AddressPolicy,
}

impl RemoteState {
    pub fn new(name: &str, opts: Options, namespaces: Vec<String>) -> Self {
        Self {
            name: name.into(),
            opts,
            namespaces,
            services: RwLock::new(Cache::new(by_name::<Service>)),
            slices: RwLock::new(Cache::new(by_service_label::<EndpointSlice>)),
            foreign_slices: RwLock::new(Cache::new(by_service_label::<EndpointSlice>)),
            stale_after: None,
            marked: AtomicBool::new(false),
            credential: std::sync::OnceLock::new(),
            mcs: None,
            addresses: Default::default(),
        }
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

    /// Whether the outage policy marks this remote's endpoints not ready now.
    pub fn is_marked(&self) -> bool {
        self.marked.load(Ordering::SeqCst)
    }

    pub fn ready(&self) -> bool {
        self.services.read().ready()
            && self.slices.read().ready()
            && self.foreign_slices.read().ready()
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
