//! Our followers in the local cluster, as the local watches have seen them.
use k8s_openapi::api::core::v1::{Endpoints, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use parking_lot::RwLock;

use super::cache::{Cache, by_name, by_service_label};

/// Our followers in the local cluster (everything labelled `<key>=follower`).
pub struct LocalState {
    pub services: RwLock<Cache<Service>>,
    pub slices: RwLock<Cache<EndpointSlice>>,
    pub endpoints: RwLock<Cache<Endpoints>>,
}

impl Default for LocalState {
    fn default() -> Self {
        Self {
            services: RwLock::new(Cache::new(by_name::<Service>)),
            slices: RwLock::new(Cache::new(by_service_label::<EndpointSlice>)),
            endpoints: RwLock::new(Cache::new(by_name::<Endpoints>)),
        }
    }
}

impl LocalState {
    pub fn ready(&self) -> bool {
        self.services.read().ready() && self.slices.read().ready() && self.endpoints.read().ready()
    }
}
