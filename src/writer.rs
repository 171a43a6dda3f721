//! The only writer to the local cluster. Every write checks that this replica holds the Lease
//! right before it is sent, honours dry run, is logged on one line and counted.
//! Replaces carry the resourceVersion they were computed from and deletes carry a uid
//! precondition, so an object replaced meanwhile is never overwritten or deleted.
//! Every request has a deadline: one left unanswered is abandoned as failed, and its key retried
//! (a create that did land then meets AlreadyExists and takes the update path).
use std::fmt::Debug;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

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
    /// a request not answered within this fails (the client's timeouts bound each connection
    /// attempt and each read, not a whole answer that trickles in or a stalled stream)
    deadline: Duration,
}

/// The deadline of a write unless [`Writer::with_deadline`] sets another.
const DEADLINE: Duration = Duration::from_secs(60);

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
            deadline: DEADLINE,
        }
    }

    pub fn with_deadline(self, deadline: Duration) -> Self {
        Self { deadline, ..self }
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

    /// The request, failed as a timeout if it is not answered within the deadline.
    async fn send<K: Local, T>(
        &self,
        verb: &str,
        ns: &str,
        name: &str,
        request: impl Future<Output = kube::Result<T>>,
    ) -> Result<kube::Result<T>> {
        tokio::time::timeout(self.deadline, request)
            .await
            .map_err(|_| {
                Error::Timeout(format!(
                    "{verb} {} {ns}/{name}: no answer within {:?}",
                    K::KIND,
                    self.deadline
                ))
            })
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
        let api = Api::<K>::namespaced(self.client.clone(), &ns);
        let created = self
            .send::<K, _>("create", &ns, &name, api.create(&Self::pp(), obj))
            .await??;
        self.count::<K>("create");
        info!(kind = K::KIND, namespace = %ns, name = %name, "created");
        Ok(Written::Done(created))
    }

    /// Reads one local object live (what a create refused as existing holds), within the
    /// deadline; None when it does not exist.
    pub async fn get<K: Local>(&self, ns: &str, name: &str) -> Result<Option<K>> {
        let api = Api::<K>::namespaced(self.client.clone(), ns);
        Ok(self
            .send::<K, _>("get", ns, name, api.get_opt(name))
            .await??)
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
        let api = Api::<K>::namespaced(self.client.clone(), &ns);
        let updated = self
            .send::<K, _>("update", &ns, &name, api.replace(&name, &Self::pp(), obj))
            .await??;
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
        let api = Api::<K>::namespaced(self.client.clone(), ns);
        match self
            .send::<K, _>("delete", ns, name, api.delete(name, &dp))
            .await?
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{self, ApiServer, created, leadership, ok, run, status};
    use k8s_openapi::api::core::v1::Service;
    use serde_json::json;

    const SERVICES: &str = "/api/v1/namespaces/shop/services";
    const WEB: &str = "/api/v1/namespaces/shop/services/web";

    /// A writer over a mock API server; the returned sender keeps the published leadership.
    fn writer(
        leader: bool,
        dry_run: bool,
    ) -> (
        Writer,
        ApiServer,
        tokio::sync::watch::Sender<Option<std::time::Instant>>,
    ) {
        let (client, api) = fixtures::client("local");
        let (tx, leadership) = leadership(leader);
        let w = Writer::new(client, leadership, dry_run, Arc::new(Metrics::default()));
        (w, api, tx)
    }

    fn web(resource_version: Option<&str>) -> Service {
        fixtures::obj(json!({
            "metadata": {"namespace": "shop", "name": "web", "uid": "uid-web",
                         "resourceVersion": resource_version},
            "spec": {"ports": [{"port": 80}]},
        }))
    }

    fn writes(w: &Writer, verb: &str) -> u64 {
        w.metrics
            .writes
            .get_or_create(&labels([("kind", "Service"), ("verb", verb)]))
            .get()
    }

    /// Create, replace and delete of `svc`, with no request expected.
    async fn every_verb(
        w: &Writer,
        api: &ApiServer,
        svc: &Service,
    ) -> (
        Result<Written<Service>>,
        Result<Written<Service>>,
        Result<()>,
    ) {
        run(
            &[api],
            async {
                (
                    w.create(svc).await,
                    w.replace(svc).await,
                    w.delete::<Service>("shop", "web", "uid-web", "test").await,
                )
            },
            async {},
        )
        .await
    }

    #[tokio::test]
    async fn a_replica_that_is_not_the_leader_sends_nothing() {
        let (w, api, _lease) = writer(false, false);
        let svc = web(Some("7"));
        let (create, replace, delete) = every_verb(&w, &api, &svc).await;
        assert!(matches!(create, Err(Error::NotLeader)));
        assert!(matches!(replace, Err(Error::NotLeader)));
        assert!(matches!(delete, Err(Error::NotLeader)));
        assert_eq!(writes(&w, "create") + writes(&w, "update"), 0);
    }

    #[tokio::test]
    async fn an_ended_election_task_refuses_writes() {
        // the sender dropped: the election task is gone, whatever deadline it last published
        let (w, api, lease) = writer(true, false);
        drop(lease);
        let created = run(&[&api], w.create(&web(None)), async {}).await;
        assert!(matches!(created, Err(Error::NotLeader)));
    }

    #[tokio::test]
    async fn a_write_left_unanswered_fails_at_its_deadline_and_counts_nothing() {
        let (w, api, _lease) = writer(true, false);
        let w = w.with_deadline(std::time::Duration::from_millis(200));
        let created = run(&[&api], w.create(&web(None)), async {
            api.expect_hang(fixtures::post(SERVICES)).await;
        })
        .await;
        assert!(
            matches!(&created, Err(Error::Timeout(m)) if m.contains("create Service shop/web")),
            "the key is freed and retried, not held for ever"
        );
        assert_eq!(writes(&w, "create"), 0);
        let read = run(&[&api], w.get::<Service>("shop", "web"), async {
            api.expect_hang(fixtures::get(WEB)).await;
        })
        .await;
        assert!(matches!(read, Err(Error::Timeout(_))));
    }

    #[tokio::test]
    async fn dry_run_sends_nothing() {
        let (w, api, _lease) = writer(true, true);
        let svc = web(Some("7"));
        let (create, replace, delete) = every_verb(&w, &api, &svc).await;
        assert!(matches!(create, Ok(Written::Skipped)));
        assert!(matches!(replace, Ok(Written::Skipped)));
        assert!(delete.is_ok());
    }

    #[tokio::test]
    async fn create_posts_with_our_field_manager_and_passes_a_409_to_the_caller() {
        let (w, api, _lease) = writer(true, false);
        let svc = web(None);
        let done = run(&[&api], w.create(&svc), async {
            let sent = api
                .expect(
                    fixtures::post(SERVICES).query("fieldManager", FIELD_MANAGER),
                    created(json!({"metadata": {"namespace": "shop", "name": "web",
                                   "uid": "new-uid", "resourceVersion": "1"}})),
                )
                .await;
            assert_eq!(sent.body["metadata"]["name"], "web");
        })
        .await;
        match done {
            Ok(Written::Done(s)) => assert_eq!(s.metadata.uid.as_deref(), Some("new-uid")),
            _ => panic!("the created Service is returned"),
        }
        assert_eq!(writes(&w, "create"), 1);

        // AlreadyExists is the caller's decision (look before touching): not swallowed here
        let conflict = run(&[&api], w.create(&svc), async {
            api.expect(fixtures::post(SERVICES), status(409, "AlreadyExists"))
                .await;
        })
        .await;
        assert_eq!(conflict.err().and_then(|e| e.api_code()), Some(409));
        assert_eq!(writes(&w, "create"), 1, "a refused write is not counted");
    }

    #[tokio::test]
    async fn replace_puts_the_resource_version_it_was_computed_from() {
        let (w, api, _lease) = writer(true, false);
        let svc = web(Some("7"));
        let done = run(&[&api], w.replace(&svc), async {
            let sent = api
                .expect(
                    fixtures::put(WEB).query("fieldManager", FIELD_MANAGER),
                    ok(json!({"metadata": {"namespace": "shop", "name": "web",
                              "uid": "uid-web", "resourceVersion": "8"}})),
                )
                .await;
            assert_eq!(
                sent.body["metadata"]["resourceVersion"], "7",
                "the PUT is a compare-and-swap on the version it was computed from"
            );
        })
        .await;
        assert!(matches!(done, Ok(Written::Done(_))));
    }

    #[tokio::test]
    async fn replace_without_a_resource_version_is_refused_before_any_request() {
        let (w, api, _lease) = writer(true, false);
        let refused = run(&[&api], w.replace(&web(None)), async {}).await;
        assert!(matches!(refused, Err(Error::Config(_))));
    }

    #[tokio::test]
    async fn delete_carries_the_uid_precondition_and_404_counts_as_done() {
        let (w, api, _lease) = writer(true, false);
        let delete = || w.delete::<Service>("shop", "web", "uid-web", "test");
        let done = run(&[&api], delete(), async {
            let sent = api
                .expect(
                    fixtures::delete(WEB),
                    ok(
                        json!({"kind": "Status", "apiVersion": "v1", "status": "Success",
                              "code": 200, "metadata": {}}),
                    ),
                )
                .await;
            assert_eq!(sent.body["preconditions"]["uid"], "uid-web");
            assert_eq!(sent.body["propagationPolicy"], "Background");
        })
        .await;
        assert!(done.is_ok());
        assert_eq!(writes(&w, "delete"), 1);

        let gone = run(&[&api], delete(), async {
            api.expect(fixtures::delete(WEB), status(404, "NotFound"))
                .await;
        })
        .await;
        assert!(gone.is_ok(), "already gone is done");

        // another object now holds the name: the precondition fails, and that is an error
        let replaced = run(&[&api], delete(), async {
            api.expect(fixtures::delete(WEB), status(409, "Conflict"))
                .await;
        })
        .await;
        assert_eq!(replaced.err().and_then(|e| e.api_code()), Some(409));
        assert_eq!(writes(&w, "delete"), 1);
    }
}
