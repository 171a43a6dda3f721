//! Leader election on a coordination.k8s.io/v1 Lease. Only the holder writes.
//!
//! Expiry is judged the way client-go does it: by how long *this* replica has seen the record
//! unchanged on its own monotonic clock, not by comparing another machine's timestamps.
//!
//! The election task publishes not "leader: yes/no" but "may write until <instant>": the start
//! of the last successful renewal plus `renew_deadline`, which is shorter than the lease
//! duration. [`Leadership`] reads it and fails closed: once that instant has passed (the task is
//! stuck, or the API server stopped answering) or the task has ended for any reason (a panic
//! drops the sender), this replica is not the leader and every write is refused, before any
//! other replica may take over.
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::error::Result;
use crate::runtime::metrics::Metrics;
use crate::runtime::supervisor::Supervisor;

#[derive(Clone, Debug)]
pub struct LeaseConfig {
    pub namespace: String,
    pub name: String,
    pub identity: String,
    pub duration: Duration,
}

impl LeaseConfig {
    pub fn renew_deadline(&self) -> Duration {
        self.duration * 2 / 3
    }
    pub fn retry_period(&self) -> Duration {
        (self.duration / 5).max(Duration::from_millis(500))
    }
}

/// What the holder says on the Lease beside the election, for `status` to read: annotations set
/// (`Some`) or removed (`None`) on every round it writes anyway (no write of its own).
pub type Notes = Arc<dyn Fn() -> BTreeMap<String, Option<String>> + Send + Sync>;

/// No notes: the Lease carries the election only.
pub fn no_notes() -> Notes {
    Arc::new(BTreeMap::new)
}

struct Elector {
    api: Api<Lease>,
    cfg: LeaseConfig,
    notes: Notes,
    /// (holder, renewTime, resourceVersion) last seen, and when it was first seen
    observed: Option<(String, Instant)>,
}

fn now() -> MicroTime {
    MicroTime(Timestamp::now())
}

impl Elector {
    fn lease_secs(&self) -> i32 {
        i32::try_from(self.cfg.duration.as_secs()).unwrap_or(i32::MAX)
    }

    /// The notes of this round on the metadata the holder is about to write.
    fn annotate(&self, meta: &mut ObjectMeta) {
        for (key, value) in (self.notes)() {
            match value {
                Some(v) => {
                    meta.annotations
                        .get_or_insert_with(Default::default)
                        .insert(key, v);
                }
                None => {
                    if let Some(a) = meta.annotations.as_mut() {
                        a.remove(&key);
                    }
                }
            }
        }
    }

    /// One round: Ok(true) when we hold the lease afterwards.
    async fn try_acquire_or_renew(&mut self) -> Result<bool> {
        let pp = PostParams::default();
        let Some(mut lease) = self.api.get_opt(&self.cfg.name).await? else {
            let mut lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.cfg.name.clone()),
                    namespace: Some(self.cfg.namespace.clone()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.cfg.identity.clone()),
                    lease_duration_seconds: Some(self.lease_secs()),
                    acquire_time: Some(now()),
                    renew_time: Some(now()),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            self.annotate(&mut lease.metadata);
            return match self.api.create(&pp, &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                Err(e) => Err(e.into()),
            };
        };
        let spec = lease.spec.get_or_insert_with(Default::default);
        let holder = spec.holder_identity.clone().unwrap_or_default();
        if holder != self.cfg.identity {
            let fingerprint = format!(
                "{holder}|{:?}|{:?}",
                spec.renew_time.as_ref().map(|t| t.0),
                lease.metadata.resource_version
            );
            let seen_at = match &self.observed {
                Some((f, at)) if *f == fingerprint => *at,
                _ => {
                    self.observed = Some((fingerprint, Instant::now()));
                    Instant::now()
                }
            };
            let duration = spec
                .lease_duration_seconds
                .and_then(|s| u64::try_from(s).ok())
                .map(Duration::from_secs)
                .unwrap_or(self.cfg.duration);
            if !holder.is_empty() && seen_at.elapsed() < duration {
                return Ok(false);
            }
            spec.holder_identity = Some(self.cfg.identity.clone());
            spec.acquire_time = Some(now());
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        }
        spec.renew_time = Some(now());
        spec.lease_duration_seconds = Some(self.lease_secs());
        self.annotate(&mut lease.metadata);
        // the resourceVersion from the get makes this a compare-and-swap
        match self.api.replace(&self.cfg.name, &pp, &lease).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Gives the lease up on shutdown so another replica takes over at once.
    async fn release(&self) -> Result<()> {
        let Some(mut lease) = self.api.get_opt(&self.cfg.name).await? else {
            return Ok(());
        };
        let Some(spec) = lease.spec.as_mut() else {
            return Ok(());
        };
        if spec.holder_identity.as_deref() != Some(&self.cfg.identity) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(now());
        self.api
            .replace(&self.cfg.name, &PostParams::default(), &lease)
            .await?;
        Ok(())
    }
}

/// Whether this replica may write now, as the election task last published it. Cloned into
/// every place that gates a write; reads fail closed.
///
/// A dry run takes no part in the election: its leadership is *assumed* ([`Leadership::assumed`]),
/// so it computes everything as if it led, while no Lease says so and the writer sends nothing
/// on its behalf ([`Leadership::holds_lease`] is false).
#[derive(Clone, Debug)]
pub struct Leadership(Claim);

#[derive(Clone, Debug)]
enum Claim {
    /// published by the election task
    Elected(watch::Receiver<Option<Instant>>),
    /// a dry run: acts as the leader, holds no Lease
    Assumed,
}

impl Leadership {
    /// True while this replica acts as the leader: an elected one while the last renewal's
    /// deadline lies ahead and the election task still runs; an assumed one (dry run) always.
    pub fn is_leader(&self) -> bool {
        match &self.0 {
            Claim::Elected(rx) => Self::lease_valid(rx),
            Claim::Assumed => true,
        }
    }

    /// True only while this replica holds the Lease: what a request that writes needs.
    pub fn holds_lease(&self) -> bool {
        match &self.0 {
            Claim::Elected(rx) => Self::lease_valid(rx),
            Claim::Assumed => false,
        }
    }

    fn lease_valid(rx: &watch::Receiver<Option<Instant>>) -> bool {
        // has_changed errs once the sender is gone: the task ended, whatever the cause
        if rx.has_changed().is_err() {
            return false;
        }
        matches!(*rx.borrow(), Some(until) if Instant::now() < until)
    }

    /// Waits for the next publication (a renewal, a gain or a loss); Err once the task ended.
    /// An assumed leadership never changes: this never returns.
    pub async fn changed(&mut self) -> std::result::Result<(), watch::error::RecvError> {
        match &mut self.0 {
            Claim::Elected(rx) => rx.changed().await,
            Claim::Assumed => std::future::pending().await,
        }
    }

    /// Reads deadlines published by someone else (tests drive leadership this way).
    pub fn from_receiver(rx: watch::Receiver<Option<Instant>>) -> Self {
        Self(Claim::Elected(rx))
    }

    /// The leadership of a dry run: no election, no Lease; acts as the leader for ever, and the
    /// writer sends nothing on its behalf.
    pub fn assumed() -> Self {
        Self(Claim::Assumed)
    }
}

/// The sending side of [`Leadership`]: publishes every deadline, logs and reports transitions.
struct Publisher<F> {
    tx: watch::Sender<Option<Instant>>,
    leading: bool,
    cfg: LeaseConfig,
    on_change: F,
}

impl<F: Fn(bool)> Publisher<F> {
    fn set(&mut self, until: Option<Instant>) {
        let leader = until.is_some();
        self.tx.send_replace(until);
        if self.leading == leader {
            return;
        }
        self.leading = leader;
        let (lease, identity) = (&self.cfg.name, &self.cfg.identity);
        if leader {
            info!(%lease, %identity, "became leader");
        } else {
            warn!(%lease, %identity, "not the leader any more: writes stop");
        }
        (self.on_change)(leader);
    }
}

/// What to do about a Lease error that retrying will not cure.
fn hint(e: &crate::error::Error, namespace: &str) -> Option<String> {
    match e.api_code()? {
        404 => Some(format!(
            "the Lease namespace {namespace:?} does not exist: create it (the chart does) or set --namespace; no replica can lead until then"
        )),
        403 => Some(format!(
            "not allowed to manage Leases in namespace {namespace:?}: grant get/create/update on coordination.k8s.io leases there (the chart's Role does); no replica can lead until then"
        )),
        _ => None,
    }
}

/// Runs the election until `shutdown`. The returned [`Leadership`] says whether this replica
/// may write; the future is the election task, for the caller to spawn and supervise.
pub fn elect(
    client: Client,
    cfg: LeaseConfig,
    shutdown: CancellationToken,
    on_change: impl Fn(bool) + Send + Sync + 'static,
    notes: Notes,
) -> (
    Leadership,
    impl std::future::Future<Output = ()> + Send + 'static,
) {
    let (tx, rx) = watch::channel(None);
    let api = Api::namespaced(client, &cfg.namespace);
    let task = async move {
        let mut elector = Elector {
            api,
            cfg: cfg.clone(),
            notes,
            observed: None,
        };
        let mut last_renew: Option<Instant> = None;
        let mut told: Option<String> = None;
        let mut publish = Publisher {
            tx,
            leading: false,
            cfg: cfg.clone(),
            on_change,
        };
        loop {
            let started = Instant::now();
            let attempt = tokio::time::timeout(
                cfg.retry_period().max(Duration::from_secs(1)),
                elector.try_acquire_or_renew(),
            );
            match attempt.await {
                Ok(Ok(true)) => {
                    // measured from before the request: the server's renewTime is no earlier
                    last_renew = Some(started);
                    publish.set(Some(started + cfg.renew_deadline()));
                }
                Ok(Ok(false)) => {
                    last_renew = None;
                    publish.set(None);
                }
                Ok(Err(e)) => match hint(&e, &cfg.namespace) {
                    // a cause the user must fix: said once, at error level, in plain words
                    Some(h) if told.as_deref() != Some(h.as_str()) => {
                        error!(error = %e, category = e.category(), "{h}");
                        told = Some(h);
                    }
                    _ => warn!(error = %e, category = e.category(), "lease round failed"),
                },
                Err(_) => warn!("lease round timed out"),
            }
            if let Some(at) = last_renew
                && at.elapsed() >= cfg.renew_deadline()
            {
                last_renew = None;
                publish.set(None);
            }
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep(cfg.retry_period()) => {}
            }
        }
        let was_leader = publish.leading;
        publish.set(None);
        if was_leader {
            match tokio::time::timeout(Duration::from_secs(5), elector.release()).await {
                Ok(Ok(())) => info!(lease = %cfg.name, "lease released"),
                Ok(Err(e)) => warn!(error = %e, "could not release the lease"),
                Err(_) => warn!("releasing the lease timed out"),
            }
        }
    };
    (Leadership::from_receiver(rx), task)
}

pub fn default_identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "unknown".into());
    format!("{host}-{}", std::process::id())
}

/// Takes part in the election on the daemon's Lease (a dry run takes none: it acts as the leader
/// and writes nothing, so it never keeps a live replica from leading). Returns who may write and
/// the task that decides it.
pub fn elect_or_assume(
    sup: &Supervisor,
    local: &Client,
    cfg: LeaseConfig,
    dry_run: bool,
    metrics: &Metrics,
    notes: Notes,
) -> (Leadership, tokio::task::JoinHandle<()>) {
    if dry_run {
        info!(lease = %cfg.name, namespace = %cfg.namespace, "dry run: not taking part in the election (the Lease is left alone); acting as the leader, writing nothing");
        let stop = sup.shutdown_token();
        let idle = async move { stop.cancelled().await };
        return (
            Leadership::assumed(),
            sup.spawn("lease (none: dry run)", idle),
        );
    }
    let leader_metric = metrics.leader.clone();
    let on_change = move |l| {
        leader_metric.set(i64::from(l));
    };
    let (leader, election) = elect(local.clone(), cfg, sup.shutdown_token(), on_change, notes);
    (leader, sup.spawn("lease", election))
}

#[cfg(test)]
mod leadership_tests {
    use super::*;

    fn channel(until: Option<Instant>) -> (watch::Sender<Option<Instant>>, Leadership) {
        let (tx, rx) = watch::channel(until);
        (tx, Leadership::from_receiver(rx))
    }

    #[test]
    fn leader_only_until_the_published_deadline() {
        let (tx, l) = channel(Some(Instant::now() + Duration::from_secs(60)));
        assert!(l.is_leader());
        tx.send_replace(Some(Instant::now() - Duration::from_millis(1)));
        assert!(
            !l.is_leader(),
            "a renewal deadline that passed is not leadership"
        );
        tx.send_replace(None);
        assert!(!l.is_leader());
    }

    #[test]
    fn an_election_task_that_ended_is_not_leadership() {
        // the task held the Lease, then ended (a panic drops its sender): fail closed at once,
        // even though its last deadline still lies ahead
        let (tx, l) = channel(Some(Instant::now() + Duration::from_secs(60)));
        assert!(l.is_leader());
        drop(tx);
        assert!(!l.is_leader());
    }

    #[test]
    fn an_assumed_leadership_acts_as_leader_but_holds_no_lease() {
        let l = Leadership::assumed();
        assert!(l.is_leader(), "a dry run computes as if it led");
        assert!(!l.holds_lease(), "and may send nothing");
        let (_tx, elected) = channel(Some(Instant::now() + Duration::from_secs(60)));
        assert!(elected.holds_lease());
    }
}

/// The election's requests, against a mock API server (see `fixtures`).
#[cfg(test)]
mod election_tests {
    use super::*;
    use crate::fixtures::{self, ApiServer, created, get, ok, post, put, status, within};
    use parking_lot::Mutex;
    use serde_json::{Value, json};
    use std::sync::Arc;

    const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/ccc/leases";
    const LEASE: &str = "/apis/coordination.k8s.io/v1/namespaces/ccc/leases/ccc-leader";

    fn cfg() -> LeaseConfig {
        // long enough that no second round starts while a test runs
        LeaseConfig {
            namespace: "ccc".into(),
            name: "ccc-leader".into(),
            identity: "me".into(),
            duration: Duration::from_secs(60),
        }
    }

    fn lease(holder: Option<&str>, resource_version: &str, transitions: i32) -> Value {
        json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "ccc-leader", "namespace": "ccc",
                         "resourceVersion": resource_version},
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": 60,
                     "acquireTime": "2025-01-01T00:00:00.000000Z",
                     "renewTime": "2025-01-01T00:00:00.000000Z",
                     "leaseTransitions": transitions},
        })
    }

    struct Election {
        api: ApiServer,
        leadership: Leadership,
        shutdown: CancellationToken,
        task: tokio::task::JoinHandle<()>,
        changes: Arc<Mutex<Vec<bool>>>,
    }

    fn start() -> Election {
        start_with(no_notes())
    }

    fn start_with(notes: Notes) -> Election {
        let (client, api) = fixtures::client("local");
        let shutdown = CancellationToken::new();
        let changes = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&changes);
        let on_change = move |l| {
            seen.lock().push(l);
        };
        let (leadership, task) = elect(client, cfg(), shutdown.clone(), on_change, notes);
        Election {
            api,
            leadership,
            shutdown,
            task: tokio::spawn(task),
            changes,
        }
    }

    impl Election {
        /// Waits for the round's publication (the election task's own result, not a sleep).
        async fn published(&mut self) -> bool {
            self.api
                .idle_while("the round's result", self.leadership.changed())
                .await
                .unwrap();
            self.leadership.is_leader()
        }

        /// No Lease yet: GET (404) then POST with our identity.
        async fn create_round(&mut self) {
            self.api.expect(get(LEASE), status(404, "NotFound")).await;
            let sent = self
                .api
                .expect(post(LEASES), created(lease(Some("me"), "1", 0)))
                .await;
            assert_eq!(sent.body["metadata"]["name"], "ccc-leader");
            assert_eq!(sent.body["spec"]["holderIdentity"], "me");
            assert_eq!(sent.body["spec"]["leaseDurationSeconds"], 60);
        }
    }

    #[tokio::test]
    async fn with_no_lease_the_election_creates_one_with_our_identity_and_leads() {
        let mut e = start();
        e.create_round().await;
        assert!(e.published().await, "the Lease we created is ours");
        assert_eq!(*e.changes.lock(), vec![true]);

        // shutdown: the holder gives the Lease up so another replica takes over at once
        e.shutdown.cancel();
        e.api
            .expect(get(LEASE), ok(lease(Some("me"), "2", 0)))
            .await;
        let sent = e.api.expect(put(LEASE), ok(lease(None, "3", 0))).await;
        assert!(sent.body["spec"]["holderIdentity"].is_null());
        assert_eq!(sent.body["spec"]["leaseDurationSeconds"], 1);
        assert_eq!(sent.body["metadata"]["resourceVersion"], "2");
        within("the election task's end", e.task).await.unwrap();
        assert!(!e.leadership.is_leader());
        assert_eq!(*e.changes.lock(), vec![true, false]);
        e.api.assert_idle().await;
    }

    #[tokio::test]
    async fn the_holders_notes_ride_on_the_writes_of_the_election_and_nothing_else() {
        let notes: Notes = Arc::new(|| {
            BTreeMap::from([
                ("xcc/pods".to_string(), Some("0".to_string())),
                ("xcc/gone".to_string(), None),
            ])
        });
        let mut e = start_with(notes);
        e.api.expect(get(LEASE), status(404, "NotFound")).await;
        let sent = (e.api)
            .expect(post(LEASES), created(lease(Some("me"), "1", 0)))
            .await;
        assert_eq!(
            sent.body["metadata"]["annotations"],
            json!({"xcc/pods": "0"}),
            "a note without a value is not written"
        );
        assert!(e.published().await);

        // the renewal keeps what others wrote, sets ours and removes ours that lost its value
        let mut held = lease(Some("me"), "2", 0);
        held["metadata"]["annotations"] = json!({"other": "kept", "xcc/gone": "old"});
        let mut e2 = start_with(Arc::new(|| {
            BTreeMap::from([
                ("xcc/pods".to_string(), Some("3".to_string())),
                ("xcc/gone".to_string(), None),
            ])
        }));
        e2.api.expect(get(LEASE), ok(held)).await;
        let sent = e2
            .api
            .expect(put(LEASE), ok(lease(Some("me"), "3", 0)))
            .await;
        assert_eq!(
            sent.body["metadata"]["annotations"],
            json!({"other": "kept", "xcc/pods": "3"})
        );
        assert!(e2.published().await);
        for e in [e, e2] {
            e.shutdown.cancel();
            e.api.expect(get(LEASE), status(404, "NotFound")).await;
            within("the election task's end", e.task).await.unwrap();
        }
    }

    #[tokio::test]
    async fn a_lease_held_by_another_replica_is_not_taken_over() {
        let mut e = start();
        e.api
            .expect(get(LEASE), ok(lease(Some("other"), "5", 2)))
            .await;
        assert!(!e.published().await);
        // not the holder: shutting down releases nothing
        e.shutdown.cancel();
        within("the election task's end", e.task).await.unwrap();
        e.api.assert_idle().await;
        assert!(e.changes.lock().is_empty());
    }

    #[tokio::test]
    async fn a_released_lease_is_taken_over_with_a_compare_and_swap() {
        let mut e = start();
        e.api.expect(get(LEASE), ok(lease(None, "9", 3))).await;
        let sent = e
            .api
            .expect(put(LEASE), ok(lease(Some("me"), "10", 4)))
            .await;
        assert_eq!(sent.body["spec"]["holderIdentity"], "me");
        assert_eq!(sent.body["spec"]["leaseTransitions"], 4);
        assert_eq!(
            sent.body["metadata"]["resourceVersion"], "9",
            "the update only succeeds on the version we read"
        );
        assert!(e.published().await);
        e.task.abort();
    }

    #[tokio::test]
    async fn losing_the_race_for_a_released_lease_is_not_leadership() {
        let mut e = start();
        e.api.expect(get(LEASE), ok(lease(None, "9", 3))).await;
        e.api.expect(put(LEASE), status(409, "Conflict")).await;
        assert!(!e.published().await);
        e.shutdown.cancel();
        within("the election task's end", e.task).await.unwrap();
        e.api.assert_idle().await;
    }

    #[tokio::test]
    async fn leadership_fails_closed_when_the_election_task_ends() {
        let mut e = start();
        e.create_round().await;
        assert!(e.published().await);
        // the task dies (a panic, an abort): its last deadline still lies ahead
        e.task.abort();
        assert!(within("the aborted task", e.task).await.is_err());
        assert!(
            !e.leadership.is_leader(),
            "an ended election task is not leadership"
        );
        e.api.assert_idle().await;
    }
}
