//! The only writer to the local cluster. Every write checks that this replica holds the Lease
//! right before it is sent, honours dry run, is logged on one line and counted.
//! Replaces carry the resourceVersion they were computed from and deletes carry a uid
//! precondition, so an object replaced meanwhile is never overwritten or deleted.
use std::fmt::Debug;
use std::sync::Arc;

use kube::api::{DeleteParams, PostParams, Preconditions};
use kube::core::NamespaceResourceScope;
use kube::{Api, Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::info;

use crate::error::{Error, Result};
use crate::lease::Leadership;
use crate::metrics::{Metrics, labels};

pub const FIELD_MANAGER: &str = "cross-cluster-controller";

#[derive(Clone)]
pub struct Writer {
    client: Client,
    leader: Leadership,
    dry_run: bool,
    metrics: Arc<Metrics>,
}

/// What a write did.
pub enum Written<K> {
    Done(K),
    /// dry run: nothing was sent
    Skipped,
}

pub trait Local:
    Resource<Scope = NamespaceResourceScope, DynamicType = ()>
    + k8s_openapi::Resource
    + Clone
    + Debug
    + Serialize
    + DeserializeOwned
{
}
impl<K> Local for K where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + k8s_openapi::Resource
        + Clone
        + Debug
        + Serialize
        + DeserializeOwned
{
}

impl Writer {
    pub fn new(client: Client, leader: Leadership, dry_run: bool, metrics: Arc<Metrics>) -> Self {
        Self {
            client,
            leader,
            dry_run,
            metrics,
        }
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Ok(true): send it; Ok(false): dry run; Err: not the leader.
    fn gate<K: Local>(&self, verb: &str, ns: &str, name: &str) -> Result<bool> {
        if !self.leader.is_leader() {
            return Err(Error::NotLeader);
        }
        if self.dry_run {
            info!(
                kind = K::KIND,
                namespace = ns,
                name,
                verb,
                "dry run: would {verb}"
            );
            return Ok(false);
        }
        Ok(true)
    }

    fn count<K: Local>(&self, verb: &str) {
        self.metrics
            .writes
            .get_or_create(&labels([("kind", K::KIND), ("verb", verb)]))
            .inc();
    }

    fn pp() -> PostParams {
        PostParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        }
    }

    pub async fn create<K: Local>(&self, obj: &K) -> Result<Written<K>> {
        let ns = obj.namespace().unwrap_or_default();
        let name = obj.name_any();
        if !self.gate::<K>("create", &ns, &name)? {
            return Ok(Written::Skipped);
        }
        let created = Api::<K>::namespaced(self.client.clone(), &ns)
            .create(&Self::pp(), obj)
            .await?;
        self.count::<K>("create");
        info!(kind = K::KIND, namespace = %ns, name = %name, "created");
        Ok(Written::Done(created))
    }

    pub async fn replace<K: Local>(&self, obj: &K) -> Result<Written<K>> {
        let ns = obj.namespace().unwrap_or_default();
        let name = obj.name_any();
        if obj.resource_version().is_none() {
            return Err(Error::Config(format!(
                "refusing to replace {} {ns}/{name} without a resourceVersion",
                K::KIND
            )));
        }
        if !self.gate::<K>("update", &ns, &name)? {
            return Ok(Written::Skipped);
        }
        let updated = Api::<K>::namespaced(self.client.clone(), &ns)
            .replace(&name, &Self::pp(), obj)
            .await?;
        self.count::<K>("update");
        info!(kind = K::KIND, namespace = %ns, name = %name, "updated");
        Ok(Written::Done(updated))
    }

    /// Deletes exactly the object with this uid; already gone counts as done.
    pub async fn delete<K: Local>(&self, ns: &str, name: &str, uid: &str, why: &str) -> Result<()> {
        if !self.gate::<K>("delete", ns, name)? {
            return Ok(());
        }
        let dp = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(uid.to_string()),
                resource_version: None,
            }),
            ..DeleteParams::background()
        };
        match Api::<K>::namespaced(self.client.clone(), ns)
            .delete(name, &dp)
            .await
        {
            Ok(_) => {
                self.count::<K>("delete");
                info!(
                    kind = K::KIND,
                    namespace = ns,
                    name,
                    reason = why,
                    "deleted"
                );
                Ok(())
            }
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}
