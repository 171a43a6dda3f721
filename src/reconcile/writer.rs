//! The only writer to the local cluster: followers, health Leases, Namespaces and Events all go
//! through it (the election's own Lease does not: see `lease.rs`). Every write checks that this
//! replica holds the Lease right before it is sent, honours dry run, is logged on one line and
//! counted.
//! Replaces carry the resourceVersion they were computed from and deletes carry a uid
//! precondition, so an object replaced meanwhile is never overwritten or deleted.
//! Every request has a deadline: one left unanswered is abandoned as failed, and its key retried
//! (a create that did land then meets AlreadyExists and takes the update path).
//!
//! A dry run sends no write at all: each one is logged as `dry run: would <verb>` and reported
//! as [`Written::Skipped`]. Reads (`get`, `namespace_exists`) are sent in a dry run too.
//!
//! A new kind of write is one small method: name it with a [`Target`] and hand the request to
//! [`Writer::write`], which gates, times (`xcc_write_duration_seconds`: every request sent,
//! answered or not), counts (`xcc_writes_total`: the accepted ones) and logs it.
use std::fmt::Debug;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, ObjectReference};
use kube::api::{DeleteParams, ObjectMeta, PostParams, Preconditions};
use kube::core::NamespaceResourceScope;
use kube::runtime::events::{Event, Recorder, Reporter};
use kube::{Api, Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::{debug, info};

use crate::error::{Error, Result};
use crate::runtime::lease::Leadership;
use crate::runtime::metrics::{ByKindVerb, ByKindVerbCode, Metrics};

pub const FIELD_MANAGER: &str = crate::desired::FIELD_MANAGER;

#[derive(Clone)]
pub struct Writer {
    client: Client,
    leader: Leadership,
    dry_run: bool,
    metrics: Arc<Metrics>,
    /// a request not answered within this fails (the client's timeouts bound each connection
    /// attempt and each read, not a whole answer that trickles in or a stalled stream)
    deadline: Duration,
    events: Recorder,
}

/// The deadline of a write unless [`Writer::with_deadline`] sets another.
const DEADLINE: Duration = Duration::from_secs(60);

/// What a write did.
pub enum Written<K> {
    Done(K),
    /// dry run: nothing was sent
    Skipped,
}

/// One write, as it is gated, logged and counted: `kind` and `verb` are the labels of
/// `xcc_writes_total`.
#[derive(Clone, Copy)]
pub struct Target<'a> {
    pub kind: &'static str,
    pub verb: &'static str,
    pub namespace: &'a str,
    pub name: &'a str,
    /// what the log line of a done write says ("created"); a write that repeats on a timer
    /// (a health Lease renewal) logs at debug level instead of info
    pub done: &'static str,
    pub quiet: bool,
    /// why (a delete's proof, an Event's reason), on both the dry-run and the done line
    pub reason: &'a str,
}

impl Target<'_> {
    fn describe(&self) -> String {
        format!(
            "{} {} {}/{}",
            self.verb, self.kind, self.namespace, self.name
        )
    }
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

fn target<'a, K: Local>(verb: &'static str, ns: &'a str, name: &'a str) -> Target<'a> {
    let done = match verb {
        "create" => "created",
        "update" => "updated",
        _ => "deleted",
    };
    Target {
        kind: K::KIND,
        verb,
        namespace: ns,
        name,
        done,
        quiet: false,
        reason: "",
    }
}

impl Writer {
    pub fn new(client: Client, leader: Leadership, dry_run: bool, metrics: Arc<Metrics>) -> Self {
        let reporter = Reporter {
            controller: FIELD_MANAGER.into(),
            instance: None,
        };
        Self {
            events: Recorder::new(client.clone(), reporter),
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

    /// Who the Events this writer records name as their reporter.
    pub fn with_reporter(self, reporter: Reporter) -> Self {
        let events = Recorder::new(self.client.clone(), reporter);
        Self { events, ..self }
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    pub fn dry_run(&self) -> bool {
        self.dry_run
    }

    /// Whether this replica acts as the leader now (a dry run always does).
    pub fn leads(&self) -> bool {
        self.leader.is_leader()
    }

    /// Ok(true): send it; Ok(false): dry run (logged); Err: this replica does not lead, or acts
    /// as the leader without holding the Lease (an assumed leadership never sends).
    fn gate(&self, t: &Target) -> Result<bool> {
        if !self.leader.is_leader() {
            return Err(Error::NotLeader);
        }
        if self.dry_run {
            let (kind, namespace, name, verb, reason) =
                (t.kind, t.namespace, t.name, t.verb, t.reason);
            info!(kind, namespace, name, verb, reason, "dry run: would {verb}");
            return Ok(false);
        }
        if !self.leader.holds_lease() {
            return Err(Error::NotLeader);
        }
        Ok(true)
    }

    /// The request, failed as a timeout if it is not answered within the deadline.
    async fn send<T>(
        &self,
        what: impl FnOnce() -> String,
        request: impl Future<Output = kube::Result<T>>,
    ) -> Result<kube::Result<T>> {
        tokio::time::timeout(self.deadline, request)
            .await
            .map_err(|_| {
                Error::Timeout(format!("{}: no answer within {:?}", what(), self.deadline))
            })
    }

    /// Every write: gated (Lease, dry run), bounded by the deadline, then counted and logged
    /// once the API server accepted it. `Ok(None)`: dry run, nothing was sent. The request is
    /// a future that sends nothing until polled, so a gated write never leaves the process.
    pub async fn write<T>(
        &self,
        t: Target<'_>,
        request: impl Future<Output = kube::Result<T>>,
    ) -> Result<Option<T>> {
        if !self.gate(&t)? {
            return Ok(None);
        }
        let labels = ByKindVerb::new(t.kind, t.verb);
        let sent = Instant::now();
        let answer = self.send(|| t.describe(), request).await;
        self.metrics
            .write_duration
            .get_or_create(&labels)
            .observe(sent.elapsed().as_secs_f64());
        let code = match &answer {
            Ok(Ok(_)) => None,
            Ok(Err(kube::Error::Api(s))) => Some(s.code.to_string()),
            Ok(Err(_)) => Some("other".to_string()),
            Err(_) => Some("timeout".to_string()),
        };
        if let Some(code) = code {
            self.metrics
                .write_errors
                .get_or_create(&ByKindVerbCode::new(t.kind, t.verb, code))
                .inc();
        }
        let done = answer??;
        self.metrics.writes.get_or_create(&labels).inc();
        let (kind, namespace, name, reason) = (t.kind, t.namespace, t.name, t.reason);
        if t.quiet {
            debug!(kind, namespace, name, reason, "{}", t.done);
        } else {
            info!(kind, namespace, name, reason, "{}", t.done);
        }
        Ok(Some(done))
    }

    fn pp() -> PostParams {
        PostParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        }
    }

    fn written<K>(done: Option<K>) -> Written<K> {
        done.map_or(Written::Skipped, Written::Done)
    }

    pub async fn create<K: Local>(&self, obj: &K) -> Result<Written<K>> {
        let ns = obj.namespace().unwrap_or_default();
        let name = obj.name_any();
        let api = Api::<K>::namespaced(self.client.clone(), &ns);
        let t = target::<K>("create", &ns, &name);
        Ok(Self::written(
            self.write(t, api.create(&Self::pp(), obj)).await?,
        ))
    }

    /// Reads one local object live (what a create refused as existing holds), within the
    /// deadline; None when it does not exist.
    pub async fn get<K: Local>(&self, ns: &str, name: &str) -> Result<Option<K>> {
        let api = Api::<K>::namespaced(self.client.clone(), ns);
        let what = || format!("get {} {ns}/{name}", K::KIND);
        Ok(self.send(what, api.get_opt(name)).await??)
    }

    pub async fn replace<K: Local>(&self, obj: &K) -> Result<Written<K>> {
        self.replace_as(obj, false).await
    }

    /// A replace that repeats on a timer (a health Lease renewal): logged at debug level.
    pub async fn renew<K: Local>(&self, obj: &K) -> Result<Written<K>> {
        self.replace_as(obj, true).await
    }

    async fn replace_as<K: Local>(&self, obj: &K, quiet: bool) -> Result<Written<K>> {
        let ns = obj.namespace().unwrap_or_default();
        let name = obj.name_any();
        if obj.resource_version().is_none() {
            return Err(Error::Unexpected(format!(
                "refusing to replace {} {ns}/{name} without a resourceVersion",
                K::KIND
            )));
        }
        let api = Api::<K>::namespaced(self.client.clone(), &ns);
        let t = Target {
            quiet,
            ..target::<K>("update", &ns, &name)
        };
        let pp = Self::pp();
        let request = api.replace(&name, &pp, obj);
        Ok(Self::written(self.write(t, request).await?))
    }

    /// Writes an object's status subresource (PUT with the resourceVersion read).
    pub async fn replace_status<K: Local>(&self, obj: &K) -> Result<Written<K>> {
        let ns = obj.namespace().unwrap_or_default();
        let name = obj.name_any();
        if obj.resource_version().is_none() {
            return Err(Error::Unexpected(format!(
                "refusing to replace the status of {} {ns}/{name} without a resourceVersion",
                K::KIND
            )));
        }
        let api = Api::<K>::namespaced(self.client.clone(), &ns);
        let t = Target {
            verb: "update_status",
            done: "status updated",
            ..target::<K>("update", &ns, &name)
        };
        let pp = Self::pp();
        let request = api.replace_status(&name, &pp, obj);
        Ok(Self::written(self.write(t, request).await?))
    }

    /// Deletes exactly the object with this uid; already gone counts as done.
    pub async fn delete<K: Local>(&self, ns: &str, name: &str, uid: &str, why: &str) -> Result<()> {
        let dp = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(uid.to_string()),
                resource_version: None,
            }),
            ..DeleteParams::background()
        };
        let api = Api::<K>::namespaced(self.client.clone(), ns);
        let t = Target {
            reason: why,
            ..target::<K>("delete", ns, name)
        };
        match self.write(t, api.delete(name, &dp)).await {
            Ok(_) => Ok(()),
            Err(e) if e.api_code() == Some(404) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Whether a local namespace exists (a read, sent in a dry run too), within the deadline.
    pub async fn namespace_exists(&self, name: &str) -> Result<bool> {
        let api = Api::<Namespace>::all(self.client.clone());
        let what = || format!("get Namespace {name}");
        Ok(self.send(what, api.get_opt(name)).await??.is_some())
    }

    /// Creates a namespace (`--create-namespaces`); AlreadyExists is the caller's to judge.
    pub async fn create_namespace(&self, name: &str) -> Result<Written<Namespace>> {
        let api = Api::<Namespace>::all(self.client.clone());
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                ..Default::default()
            },
            ..Default::default()
        };
        let t = Target {
            kind: <Namespace as k8s_openapi::Resource>::KIND,
            verb: "create",
            namespace: "",
            name,
            done: "created missing namespace",
            quiet: false,
            reason: "a remote exports into it (--create-namespaces)",
        };
        Ok(Self::written(
            self.write(t, api.create(&Self::pp(), &ns)).await?,
        ))
    }

    /// Records an Event about `on` (kube's recorder: a new Event, or a repeat counted on the one
    /// it sent before). Events are writes like any other: a dry run logs them instead.
    pub async fn event(&self, ev: &Event, on: &ObjectReference) -> Result<()> {
        let t = Target {
            kind: "Event",
            verb: "create",
            namespace: on.namespace.as_deref().unwrap_or_default(),
            name: on.name.as_deref().unwrap_or_default(),
            done: "recorded an Event",
            quiet: true,
            reason: &ev.reason,
        };
        self.write(t, self.events.publish(ev, on)).await.map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{self, ApiServer, created, leadership, ok, post, put, run, status};
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::api::core::v1::Service;
    use kube::runtime::events::EventType;
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
            .get_or_create(&ByKindVerb::new("Service", verb))
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

    fn errors(w: &Writer, verb: &str, code: &str) -> u64 {
        w.metrics
            .write_errors
            .get_or_create(&ByKindVerbCode::new("Service", verb, code))
            .get()
    }

    #[tokio::test]
    async fn a_refused_or_unanswered_write_is_counted_by_its_code() {
        let (w, api, _lease) = writer(true, false);
        let w = w.with_deadline(std::time::Duration::from_millis(200));
        let forbidden = run(&[&api], w.create(&web(None)), async {
            api.expect(fixtures::post(SERVICES), fixtures::status(403, "Forbidden"))
                .await;
        })
        .await;
        assert!(forbidden.is_err());
        let unanswered = run(&[&api], w.create(&web(None)), async {
            api.expect_hang(fixtures::post(SERVICES)).await;
        })
        .await;
        assert!(matches!(unanswered, Err(Error::Timeout(_))));
        assert_eq!(
            (errors(&w, "create", "403"), errors(&w, "create", "timeout")),
            (1, 1)
        );
        assert_eq!(writes(&w, "create"), 0, "neither was written");
    }

    const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/shop/leases";
    const LEASE: &str = "/apis/coordination.k8s.io/v1/namespaces/shop/leases/h";
    const NAMESPACES: &str = "/api/v1/namespaces";
    const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/shop/events";

    fn health_lease(resource_version: Option<&str>) -> Lease {
        fixtures::obj(json!({
            "metadata": {"namespace": "shop", "name": "h", "uid": "uid-h",
                         "resourceVersion": resource_version},
            "spec": {"holderIdentity": "me"},
        }))
    }

    fn warning() -> (Event, ObjectReference) {
        let ev = Event {
            type_: EventType::Warning,
            reason: "NotOurFollower".into(),
            note: Some("left untouched".into()),
            action: "Mirror".into(),
            secondary: None,
        };
        let on = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Service".into()),
            namespace: Some("shop".into()),
            name: Some("web".into()),
            ..Default::default()
        };
        (ev, on)
    }

    /// Every other kind of write (Lease create, renew, replace and delete, Namespace create,
    /// Event), with no request expected.
    async fn every_other_write(w: &Writer, api: &ApiServer) -> Vec<Result<bool>> {
        let lease = health_lease(Some("3"));
        let (ev, on) = warning();
        run(
            &[api],
            async {
                let sent = |w: Result<Written<_>>| w.map(|w| matches!(w, Written::Done(_)));
                vec![
                    sent(w.create(&lease).await),
                    sent(w.renew(&lease).await),
                    sent(w.replace(&lease).await),
                    w.delete::<Lease>("shop", "h", "uid-h", "test")
                        .await
                        .map(|()| false),
                    w.create_namespace("shop")
                        .await
                        .map(|w| matches!(w, Written::Done(_))),
                    w.event(&ev, &on).await.map(|()| false),
                ]
            },
            async {},
        )
        .await
    }

    /// Every kind of write, each skipped: nothing reaches the mock API server.
    async fn writes_nothing(w: &Writer, api: &ApiServer) {
        let svc = web(Some("7"));
        let (create, replace, delete) = every_verb(w, api, &svc).await;
        assert!(matches!(create, Ok(Written::Skipped)));
        assert!(matches!(replace, Ok(Written::Skipped)));
        assert!(delete.is_ok());
        for (i, r) in every_other_write(w, api).await.into_iter().enumerate() {
            assert!(matches!(r, Ok(false)), "write #{i}: {r:?}");
        }
    }

    #[tokio::test]
    async fn dry_run_sends_nothing() {
        let (w, api, _lease) = writer(true, true);
        writes_nothing(&w, &api).await;
        assert_eq!(
            w.metrics
                .writes
                .get_or_create(&ByKindVerb::new("Lease", "create"))
                .get(),
            0
        );
    }

    #[tokio::test]
    async fn a_dry_run_with_an_assumed_leadership_sends_nothing_and_reads() {
        // what a --dry-run daemon runs with: no election, acting as the leader
        let (client, api) = fixtures::client("local");
        let metrics = Arc::new(Metrics::default());
        let w = Writer::new(client, Leadership::assumed(), true, metrics);
        writes_nothing(&w, &api).await;
        // reads are sent: a dry run computes from what is there
        let exists = run(&[&api], w.namespace_exists("shop"), async {
            api.expect(
                fixtures::get("/api/v1/namespaces/shop"),
                status(404, "NotFound"),
            )
            .await;
        })
        .await;
        assert!(matches!(exists, Ok(false)));
    }

    #[tokio::test]
    async fn an_assumed_leadership_never_sends_without_dry_run() {
        // defence in depth: a leadership no election granted holds no Lease, so even a writer
        // wired wrongly (dry run off) refuses every write before any request
        let (client, api) = fixtures::client("local");
        let w = Writer::new(
            client,
            Leadership::assumed(),
            false,
            Arc::new(Metrics::default()),
        );
        let svc = web(Some("7"));
        let (create, replace, delete) = every_verb(&w, &api, &svc).await;
        assert!(matches!(create, Err(Error::NotLeader)));
        assert!(matches!(replace, Err(Error::NotLeader)));
        assert!(matches!(delete, Err(Error::NotLeader)));
        for (i, r) in every_other_write(&w, &api).await.into_iter().enumerate() {
            assert!(matches!(r, Err(Error::NotLeader)), "write #{i}: {r:?}");
        }
    }

    #[tokio::test]
    async fn a_replica_that_is_not_the_leader_sends_no_lease_namespace_or_event() {
        let (w, api, _lease) = writer(false, false);
        for (i, r) in every_other_write(&w, &api).await.into_iter().enumerate() {
            assert!(matches!(r, Err(Error::NotLeader)), "write #{i}: {r:?}");
        }
    }

    #[tokio::test]
    async fn leases_namespaces_and_events_are_sent_counted_and_bounded_by_the_deadline() {
        let (w, api, _lease) = writer(true, false);
        let metrics = Arc::clone(&w.metrics);
        let count = |kind: &str, verb: &str| {
            metrics
                .writes
                .get_or_create(&ByKindVerb::new(kind, verb))
                .get()
        };
        let lease = health_lease(Some("3"));
        let reply = || {
            ok(
                json!({"metadata": {"namespace": "shop", "name": "h", "uid": "uid-h",
                                              "resourceVersion": "4"}}),
            )
        };
        run(&[&api], w.create(&health_lease(None)), async {
            let sent = api
                .expect(post(LEASES).query("fieldManager", FIELD_MANAGER), reply())
                .await;
            assert_eq!(sent.body["spec"]["holderIdentity"], "me");
        })
        .await
        .unwrap();
        run(&[&api], w.renew(&lease), async {
            let sent = api.expect(put(LEASE), reply()).await;
            assert_eq!(sent.body["metadata"]["resourceVersion"], "3");
        })
        .await
        .unwrap();
        let delete = w.delete::<Lease>("shop", "h", "uid-h", "its remote left");
        run(&[&api], delete, async {
            let sent = api.expect(fixtures::delete(LEASE), reply()).await;
            assert_eq!(sent.body["preconditions"]["uid"], "uid-h");
        })
        .await
        .unwrap();
        assert_eq!((count("Lease", "create"), count("Lease", "update")), (1, 1));
        assert_eq!(count("Lease", "delete"), 1);

        let ns = run(&[&api], w.create_namespace("shop"), async {
            let sent = api
                .expect(
                    post(NAMESPACES).query("fieldManager", FIELD_MANAGER),
                    created(json!({"metadata": {"name": "shop", "uid": "ns"}})),
                )
                .await;
            assert_eq!(sent.body["metadata"]["name"], "shop");
        })
        .await;
        assert!(matches!(ns, Ok(Written::Done(_))));
        assert_eq!(count("Namespace", "create"), 1);

        let (ev, on) = warning();
        run(&[&api], w.event(&ev, &on), async {
            let sent = api
                .expect(post(EVENTS), crate::fixtures::event_created())
                .await;
            assert_eq!(sent.body["reason"], "NotOurFollower");
        })
        .await
        .unwrap();
        assert_eq!(count("Event", "create"), 1);

        // the write deadline holds for these kinds too
        let w = w.with_deadline(std::time::Duration::from_millis(200));
        let hung = run(&[&api], w.create_namespace("shop"), async {
            api.expect_hang(post(NAMESPACES)).await;
        })
        .await;
        assert!(matches!(&hung, Err(Error::Timeout(m)) if m.contains("create Namespace")));
        let hung = run(&[&api], w.renew(&lease), async {
            api.expect_hang(put(LEASE)).await;
        })
        .await;
        assert!(matches!(&hung, Err(Error::Timeout(m)) if m.contains("update Lease shop/h")));
        assert_eq!(
            count("Namespace", "create"),
            1,
            "a write that timed out is not counted"
        );
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
        assert!(matches!(refused, Err(Error::Unexpected(_))));
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
