//! Our followers in the local cluster, as the local watches have seen them.
use k8s_openapi::api::core::v1::{Endpoints, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use parking_lot::RwLock;

use super::cache::{Cache, by_name, by_service_label};
use super::networks::Networks;
use super::ready::Signals;
use super::service_ips::{ServiceIps, Shares};

/// Our followers in the local cluster (everything labelled `<key>=follower`).
pub struct LocalState {
    pub services: RwLock<Cache<Service>>,
    pub slices: RwLock<Cache<EndpointSlice>>,
    pub endpoints: RwLock<Cache<Endpoints>>,
    /// the local cluster's own networks, which no remote may claim
    pub networks: Networks,
    /// the ClusterIPs remotes' Services hold of the local Service range
    pub service_ips: ServiceIps,
}

impl Default for LocalState {
    fn default() -> Self {
        Self::new(Networks::new(Vec::new()))
    }
}

impl LocalState {
    pub fn new(networks: Networks) -> Self {
        Self {
            services: RwLock::new(Cache::new(by_name::<Service>)),
            slices: RwLock::new(Cache::new(by_service_label::<EndpointSlice>)),
            endpoints: RwLock::new(Cache::new(by_name::<Endpoints>)),
            networks,
            service_ips: ServiceIps::default(),
        }
    }

    /// With the shares of the local Service range remotes may hold.
    pub fn with_shares(mut self, shares: Shares) -> Self {
        self.service_ips = ServiceIps::new(shares);
        self
    }

    /// Whether every local cache and the local networks have completed a listing: until then a
    /// pass decides nothing (it could not tell a local address from a remote's).
    pub fn ready(&self) -> bool {
        self.followers_ready() && self.networks.ready()
    }

    /// What [`LocalState::ready`] rests on: a waiter wakes at each change of one of them.
    pub fn readiness(&self) -> Signals {
        Signals::new([
            self.services.read().readiness(),
            self.slices.read().readiness(),
            self.endpoints.read().readiness(),
            self.networks.readiness(),
        ])
    }

    /// Whether the caches of our followers have completed a listing (the networks aside).
    pub fn followers_ready(&self) -> bool {
        self.services.read().ready() && self.slices.read().ready() && self.endpoints.read().ready()
    }

    /// The local networks as listed (tests: a cluster with no nodes, ServiceCIDRs or API
    /// server endpoints).
    #[cfg(test)]
    pub fn networks_listed(self) -> Self {
        for part in super::networks::Part::ALL {
            self.networks.listed(part);
        }
        self
    }
}
