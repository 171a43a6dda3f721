//! The workers: take a key from the queue, reconcile it (leader only), retry failures with
//! back-off, and record the propagation lag of what was written. A pass that panics releases its
//! key (it would otherwise stay "in progress" and never run again) and is retried like an error.
use std::collections::HashMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;
use std::time::{Duration, Instant};

use futures::FutureExt;
use kube::runtime::events::EventType;
use tracing::{error, info, warn};

use super::ctx::{Ctx, Key, Mode};
use super::pass::reconcile;
use super::writer::Writer;
use crate::desired::mcs::Grant;
use crate::desired::{Options, Outcome, Recorded, recorded, slice_recorded};
use crate::error::Error;
use crate::runtime::lease::Leadership;
use crate::runtime::metrics::{ByModeOutcome, ByOutcome, ByRemote, Metrics};
use crate::runtime::queue::WorkQueue;
use crate::runtime::supervisor::panic_message;
use crate::state::cache::GroupKey;
use crate::state::{LOCAL, LocalState, McsCluster, McsLocal, Remotes};

/// When a remote change was first seen, and from which remote.
type Pending = (Instant, Arc<str>);

pub struct Controller {
    /// per key, the first remote change seen since its last pass started
    pending_since: Mutex<HashMap<Key, Pending>>,
    pub(super) ctx: Arc<Ctx>,
    pub(super) queue: Arc<WorkQueue<Key>>,
    pub(super) leader: Leadership,
    retries: Mutex<HashMap<Key, u32>>,
    /// a key was dropped unreconciled (not leader, or caches not complete): the next renewal
    /// while leading makes a full pass (a Lease that lapsed and came back without ever being
    /// published as lost would otherwise lose those keys until they change again)
    dropped: AtomicBool,
}

impl Controller {
    pub fn new(ctx: Arc<Ctx>, queue: Arc<WorkQueue<Key>>, leader: Leadership) -> Self {
        Self {
            pending_since: Mutex::default(),
            ctx,
            queue,
            leader,
            retries: Mutex::default(),
            dropped: AtomicBool::new(false),
        }
    }

    /// The local keys of these groups that are mirrored (namespaces in scope), of one mode.
    fn keys_of(&self, keys: Vec<GroupKey>, key: fn(GroupKey) -> Key) -> Vec<Key> {
        keys.into_iter()
            .filter(|k| self.ctx.in_scope(&k.0))
            .map(key)
            .collect()
    }

    /// Queues the keys of these groups (a full pass, a local change: drift, manual deletion).
    pub fn enqueue(&self, keys: Vec<GroupKey>) {
        for key in self.keys_of(keys, Key::follower) {
            self.queue.add(key);
        }
    }

    /// Queues the MCS keys of these groups (a local import, derived Service or MCS slice
    /// changed: drift, a manual deletion; a full pass).
    pub fn enqueue_mcs(&self, keys: Vec<GroupKey>) {
        for key in self.keys_of(keys, Key::mcs) {
            self.queue.add(key);
        }
    }

    /// Queues the key of every import of ours (what a cluster whose exports were just listed may
    /// have given: an empty first listing changes no group, yet proves those keys).
    pub fn enqueue_imports(&self) {
        let Some(mcs) = &self.ctx.mcs else { return };
        let keys: Vec<GroupKey> = mcs.imports.read().keys().cloned().collect();
        self.enqueue_mcs(keys);
    }

    /// Queues every MCS key: every export of every cluster read, and every import of ours (a
    /// cluster's name changed, a Lease gain).
    pub fn enqueue_all_mcs(&self) {
        let Some(mcs) = &self.ctx.mcs else { return };
        let mut keys = mcs.source.exported();
        keys.extend(mcs.imports.read().keys().cloned());
        for m in self.ctx.remotes.states() {
            if let Some(c) = &m.mcs {
                keys.extend(c.exported());
            }
        }
        keys.sort();
        keys.dedup();
        self.enqueue_mcs(keys);
    }

    /// Decides again which cluster goes by which MCS name (a claim changed, a remote joined or
    /// left, the remotes were all listed; see `desired::mcs::Holders`). Each change is logged;
    /// a refusal is also shown on /readyz and in `xcc_mcs_name_refused` (read from the grant
    /// when scraped), and recorded as an Event; any change queues every MCS key.
    pub async fn settle_mcs_names(&self) {
        let Some(mcs) = &self.ctx.mcs else { return };
        let remotes: Vec<Arc<McsCluster>> = self
            .ctx
            .remotes
            .states()
            .iter()
            .filter_map(|s| s.mcs.clone())
            .collect();
        let named = self.ctx.remotes.named();
        let changed = mcs.settle(&remotes, named.as_ref());
        for c in &changed {
            self.tell_grant(c).await;
        }
        if !changed.is_empty() {
            self.enqueue_all_mcs();
        }
    }

    async fn tell_grant(&self, c: &McsCluster) {
        let who = &c.identity;
        match c.grant() {
            Grant::Named(name) => {
                info!(cluster = %c.label, name, "MCS cluster name");
                if name.contains('.') {
                    warn!(cluster = %c.label, name, "a cluster name with a dot gives <hostname>.<clusterid> DNS names CoreDNS does not resolve");
                }
            }
            Grant::Pending => {
                info!(cluster = %c.label, claim = ?c.claimed(), "MCS cluster name not granted yet");
            }
            Grant::Refused { wanted, holder } => {
                let note = format!(
                    "{who} claims the MCS cluster name {wanted:?}, which {holder} holds: refused; its exports wait until it claims a free name"
                );
                warn!(cluster = %c.label, "{note}");
                let reason = "McsNameRefused";
                self.ctx
                    .event(EventType::Warning, reason, note, "Refuse", None)
                    .await;
            }
        }
    }

    /// An MCS source changed (a cluster's export, or a Service or slice it exports): queued,
    /// and remembered for the propagation-lag histogram as [`Self::remote_changed`] does, under
    /// the cluster's label ("local" for the local cluster).
    pub fn mcs_changed(&self, cluster: &Arc<str>, keys: Vec<GroupKey>) {
        if !self.reads(cluster) {
            return;
        }
        let keys = self.keys_of(keys, Key::mcs);
        self.remember(cluster, &keys);
        for key in keys {
            self.queue.add_in(cluster, key);
        }
    }

    /// A remote change: queued, and remembered for the propagation-lag histogram while this
    /// replica leads (a standby writes nothing, so it has no lag to measure; it would only
    /// collect entries). Every remembered key is queued, and every queued key is settled, so the
    /// map holds at most the keys in flight.
    pub fn remote_changed(&self, remote: &Arc<str>, keys: Vec<GroupKey>) {
        if self.ctx.remotes.get(remote).is_none() {
            // a remote that left: its last events are not worth a pass (its retirement queues
            // what it recorded)
            return;
        }
        let keys = self.keys_of(keys, Key::follower);
        self.remember(remote, &keys);
        for key in keys {
            self.queue.add_in(remote, key);
        }
    }

    /// Whether `cluster` (an MCS source's label) is a cluster this daemon reads now: the local
    /// one ([`LOCAL`], a name no remote can take) or a remote that has not left.
    fn reads(&self, cluster: &str) -> bool {
        cluster == LOCAL || self.ctx.remotes.get(cluster).is_some()
    }

    /// A local namespace appeared (or changed): what waited for it is queued, the exported
    /// Services of every remote in it and, with the MCS API, every export of it (an import is
    /// made where the namespace exists).
    pub fn namespace_appeared(&self, name: &str) {
        if let Some(mcs) = &self.ctx.mcs {
            let mut keys = mcs.source.exported_in(name);
            for s in self.ctx.remotes.states() {
                if let Some(c) = &s.mcs {
                    keys.extend(c.exported_in(name));
                }
            }
            self.enqueue_mcs(keys);
        }
        for s in self.ctx.remotes.states() {
            let keys: Vec<GroupKey> = (s.services.read().keys())
                .filter(|k| k.0 == name)
                .cloned()
                .collect();
            self.enqueue(keys);
        }
    }

    /// A remote left (retired from the set of remotes): every local follower that records it is
    /// queued (its pass removes what only that remote exported, and its slices), and every MCS
    /// import (what it had from that remote goes with its name). Returns how many followers
    /// record it.
    pub fn remote_left(&self, remote: &str) -> usize {
        let keys = retire_keys(&self.ctx, remote);
        let followers = keys.len();
        self.enqueue(keys);
        self.enqueue_imports();
        followers
    }

    /// Queues every key: every remote's exported Services, every local follower, every MCS key
    /// (the local networks changed: every admission is judged again).
    pub fn enqueue_everything(&self) {
        for s in self.ctx.remotes.states() {
            let keys: Vec<_> = s.services.read().keys().cloned().collect();
            self.enqueue(keys);
        }
        let followers: Vec<_> = self.ctx.local.services.read().keys().cloned().collect();
        self.enqueue(followers);
        if self.ctx.mcs.is_some() {
            self.enqueue_all_mcs();
        }
    }

    fn remember(&self, source: &Arc<str>, keys: &[Key]) {
        if self.leader.is_leader() {
            let now = Instant::now();
            let mut pending = self.pending_since.lock();
            for key in keys {
                pending
                    .entry(key.clone())
                    .or_insert_with(|| (now, Arc::clone(source)));
            }
        }
    }

    /// How many keys the lag and retry bookkeeping hold (both bounded by the keys in flight).
    pub fn tracked(&self) -> (usize, usize) {
        let pending = self.pending_since.lock();
        let retries = self.retries.lock();
        (pending.len(), retries.len())
    }

    /// The remote change a pass starting now answers (the first one seen since the last pass
    /// started). Taken out, so a change arriving during the pass starts its own entry, measured
    /// by the pass that follows (the queue runs a key changed mid-pass again).
    fn take_pending(&self, key: &Key) -> Option<Pending> {
        self.pending_since.lock().remove(key)
    }

    /// A pass that failed answered nothing: its change waits for the retry, and the earliest
    /// of it and one that came meanwhile is what the retry is measured from.
    fn restore_pending(&self, key: &Key, since: Option<Pending>) {
        let Some(since) = since else { return };
        let mut pending = self.pending_since.lock();
        let slot = pending.entry(key.clone()).or_insert_with(|| since.clone());
        if since.0 < slot.0 {
            *slot = since;
        }
    }

    fn settled(&self, since: Option<Pending>, wrote: bool) {
        if let (true, Some((at, remote))) = (wrote, since) {
            self.ctx
                .metrics
                .lag
                .get_or_create(&ByRemote::new(&remote))
                .observe(at.elapsed().as_secs_f64());
        }
    }

    fn retry(&self, key: Key, e: &Error) {
        let n = {
            let mut retries = self.retries.lock();
            let n = retries.entry(key.clone()).or_insert(0);
            *n += 1;
            *n
        };
        let delay = Duration::from_millis(200u64.saturating_mul(1 << n.min(9)))
            .min(Duration::from_secs(60));
        self.ctx
            .metrics
            .reconciles
            .get_or_create(&ByOutcome::new("error"))
            .inc();
        if n >= 5 || matches!(e, Error::Panic(_)) {
            error!(
                key = %key, error = %e, attempt = n,
                tags.namespace = %key.namespace, tags.kind = "Service",
                tags.category = e.category(),
                "reconcile keeps failing; retrying"
            );
        } else {
            warn!(key = %key, error = %e, category = e.category(), attempt = n, retry_in_ms = delay.as_millis() as u64, "reconcile failed; retrying");
        }
        self.queue.add_after(key, delay);
    }

    /// Whether a key was dropped since the last call.
    pub fn take_dropped(&self) -> bool {
        self.dropped.swap(false, Ordering::SeqCst)
    }

    /// A key set aside unreconciled (`why`: the outcome label, not_ready or not_leader):
    /// counted, nothing measured, and a full pass marked due.
    fn drop_key(&self, key: &Key, why: &str) {
        self.ctx
            .metrics
            .reconciles
            .get_or_create(&ByOutcome::new(why))
            .inc();
        self.forget(key);
        self.take_pending(key);
        self.dropped.store(true, Ordering::SeqCst);
    }

    /// A pass that ran: its duration, by mode and how it ended.
    fn timed(&self, key: &Key, result: &Result<Outcome, Error>, started: Instant) {
        let outcome = match result {
            Ok(o) => o.label(),
            Err(Error::NotLeader) => "not_leader",
            Err(_) => "error",
        };
        self.ctx
            .metrics
            .reconcile_duration
            .get_or_create(&ByModeOutcome::new(key.mode.label(), outcome))
            .observe(started.elapsed().as_secs_f64());
    }

    fn forget(&self, key: &Key) {
        self.retries.lock().remove(key);
    }
}

/// What the rooms above (`watch/`, `remotes/`) read of the context the workers share: through
/// these, not through `ctx`, so what they may touch is listed here.
impl Controller {
    /// Whether this replica holds the Lease (only the holder writes).
    pub fn is_leader(&self) -> bool {
        self.leader.is_leader()
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.ctx.metrics
    }

    /// The set of remotes being read.
    pub fn remotes(&self) -> &Arc<Remotes> {
        &self.ctx.remotes
    }

    /// The local caches (followers, networks).
    pub fn local(&self) -> &Arc<LocalState> {
        &self.ctx.local
    }

    pub fn opts(&self) -> &Options {
        &self.ctx.opts
    }

    /// The namespaces read (empty: all).
    pub fn namespaces(&self) -> &[String] {
        &self.ctx.namespaces
    }

    /// The MCS state of the local cluster, with `--mcs`.
    pub fn mcs(&self) -> Option<&Arc<McsLocal>> {
        self.ctx.mcs.as_ref()
    }

    /// The one writer (its Lease check, dry run and preconditions).
    pub fn writer(&self) -> &Writer {
        &self.ctx.writer
    }

    /// The export conflicts per remote and kind (for the gauge and the health Leases).
    pub fn conflict_counts(&self) -> HashMap<(String, &'static str), i64> {
        self.ctx.conflict_counts()
    }

    /// Records an Event (rate-limited; on the fallback reference when `on` is None).
    pub async fn event(
        &self,
        type_: EventType,
        reason: &str,
        note: String,
        action: &str,
        on: Option<k8s_openapi::api::core::v1::ObjectReference>,
    ) {
        self.ctx.event(type_, reason, note, action, on).await;
    }
}

/// The keys of the local followers (cache) that record a remote, which has left: a reconcile of
/// each removes what only it exported and its slices, now that it is retired.
fn retire_keys(ctx: &Ctx, remote: &str) -> Vec<GroupKey> {
    let opts = &ctx.opts;
    // each object's record is read as it is decoded and kept only if it names the remote: at
    // 10,000 followers a copy of every object's metadata would be tens of MiB
    let naming = |g: &GroupKey, r: Recorded| r.names(remote).then(|| (g.clone(), r));
    let services: Vec<(GroupKey, Recorded)> = {
        let c = ctx.local.services.read();
        c.keys()
            .filter_map(|g| {
                let s = c.named(g).ok().flatten()?;
                naming(g, recorded(&s.metadata, opts))
            })
            .collect()
    };
    let slices: Vec<(GroupKey, Recorded)> = {
        let c = ctx.local.slices.read();
        c.keys()
            .flat_map(|g| {
                c.group(g)
                    .unwrap_or_default()
                    .into_iter()
                    .filter_map(|s| naming(g, slice_recorded(&s.metadata, opts)))
                    .collect::<Vec<_>>()
            })
            .collect()
    };
    super::proof::recording(&services, &slices, remote)
}

/// Runs one pass for a key and releases the key whatever happens: a panic inside the pass is
/// caught and returned as [`Error::Panic`] with its message.
pub async fn process<K, T>(
    queue: &WorkQueue<K>,
    key: &K,
    pass: impl Future<Output = T>,
) -> Result<T, Error>
where
    K: Clone + Eq + std::hash::Hash + Send + 'static,
{
    let outcome = AssertUnwindSafe(pass).catch_unwind().await;
    queue.done(key);
    outcome.map_err(|p| Error::Panic(panic_message(p.as_ref())))
}

/// One worker: runs until the queue is closed and drained.
pub async fn run(ctl: Arc<Controller>) {
    while let Some(key) = ctl.queue.next().await {
        if !ctl.leader.is_leader() {
            // dropped: the next leadership gain (or renewal) reconciles every leader
            ctl.drop_key(&key, "not_leader");
            ctl.queue.done(&key);
            continue;
        }
        let since = ctl.take_pending(&key);
        let started = Instant::now();
        let pass = async {
            match key.mode {
                Mode::Follower => reconcile(&ctl.ctx, &key).await,
                Mode::Mcs => super::mcs::reconcile(&ctl.ctx, &key).await,
            }
        };
        let result = process(&ctl.queue, &key, pass)
            .await
            .unwrap_or_else(|panic| {
                ctl.ctx.metrics.panics.inc();
                Err(panic)
            });
        ctl.timed(&key, &result, started);
        match result {
            // queued again by the next full pass; no lag to measure
            Ok(Outcome::NotReady) => ctl.drop_key(&key, "not_ready"),
            Err(Error::NotLeader) => ctl.drop_key(&key, "not_leader"),
            // its Service waits for an update of its remote: back when one is due, measured then
            Ok(Outcome::Deferred(wait)) => {
                ctl.forget(&key);
                ctl.restore_pending(&key, since);
                ctl.queue.add_after(key, wait);
            }
            Ok(outcome) => {
                ctl.forget(&key);
                ctl.settled(
                    since,
                    matches!(outcome, Outcome::Applied | Outcome::Deleted),
                );
            }
            Err(e) => {
                ctl.restore_pending(&key, since);
                ctl.retry(key, &e);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_pass_that_panics_releases_its_key() {
        let q = WorkQueue::new();
        q.add("a");
        let key = q.next().await.expect("queued");
        let got = process(&q, &key, async { panic!("bad object") }).await;
        assert!(
            matches!(&got, Err(Error::Panic(m)) if m == "bad object"),
            "{got:?}"
        );
        // a key still marked in progress would only be marked dirty here, never handed out
        q.add("a");
        let again = tokio::time::timeout(Duration::from_secs(1), q.next()).await;
        assert_eq!(again.ok().flatten(), Some("a"));
    }

    fn runtime(leader: bool) -> (Arc<Controller>, tokio::sync::watch::Sender<Option<Instant>>) {
        let (client, _api) = crate::fixtures::client("local");
        let (tx, leadership) = crate::fixtures::leadership(leader);
        let remote = Arc::new(crate::state::RemoteState::new(
            crate::fixtures::REMOTE,
            crate::fixtures::opts(),
            vec![],
        ));
        let ctx = crate::fixtures::ctx(
            client,
            leadership.clone(),
            vec![remote],
            Arc::new(crate::state::LocalState::default().networks_listed()),
        );
        let ctl = Controller::new(Arc::new(ctx), WorkQueue::new(), leadership);
        (Arc::new(ctl), tx)
    }

    fn changed(n: usize) -> Vec<GroupKey> {
        (0..n)
            .map(|i| ("shop".to_string(), format!("s{i}")))
            .collect()
    }

    #[tokio::test]
    async fn a_standby_remembers_no_change_for_the_lag_histogram() {
        let (ctl, _tx) = runtime(false);
        ctl.remote_changed(&Arc::from(crate::fixtures::REMOTE), changed(100));
        assert_eq!(ctl.tracked(), (0, 0));
        assert_eq!(ctl.queue.len(), 100, "still queued");
    }

    #[tokio::test]
    async fn keys_dropped_after_the_lease_is_lost_leave_nothing_behind() {
        let (ctl, tx) = runtime(true);
        ctl.remote_changed(&Arc::from(crate::fixtures::REMOTE), changed(100));
        // an unknown remote's changes are neither queued nor remembered
        ctl.remote_changed(&Arc::from("gone"), changed(10));
        assert_eq!(ctl.tracked(), (100, 0));
        tx.send_replace(None);
        ctl.queue.close();
        crate::fixtures::within("the worker to drain the queue", run(Arc::clone(&ctl))).await;
        assert_eq!(ctl.tracked(), (0, 0));
        let dropped = ctl
            .ctx
            .metrics
            .reconciles
            .get_or_create(&ByOutcome::new("not_leader"))
            .get();
        assert_eq!(dropped, 100, "every key set aside is counted");
        assert!(ctl.take_dropped(), "a full pass is due once leading again");
        assert!(!ctl.take_dropped(), "once");
    }

    #[tokio::test]
    async fn a_change_seen_during_a_pass_is_measured_by_the_pass_after_it() {
        let (ctl, _tx) = runtime(true);
        let remote = Arc::from(crate::fixtures::REMOTE);
        let key = Key::follower(("shop".into(), "s0".into()));
        ctl.remote_changed(&remote, changed(1));
        let first = ctl.take_pending(&key).expect("the change the pass answers");
        assert_eq!(ctl.tracked().0, 0, "taken out when the pass starts");
        // a change during the pass: its own entry, not folded into the first one
        ctl.remote_changed(&remote, changed(1));
        let second = ctl.tracked();
        assert_eq!(second.0, 1, "kept for the pass that follows");
        // the pass failed: the retry is measured from the earliest change
        ctl.restore_pending(&key, Some(first.clone()));
        let again = ctl.take_pending(&key).expect("one entry");
        assert_eq!(again.0, first.0);
        assert!(ctl.take_pending(&key).is_none(), "one entry per key");
    }

    #[tokio::test]
    async fn a_namespace_that_appears_queues_only_the_exports_waiting_for_it() {
        let (client, _api) = crate::fixtures::client("local");
        let (_tx, leadership) = crate::fixtures::leadership(true);
        let remote = crate::state::RemoteState::new(
            crate::fixtures::REMOTE,
            crate::fixtures::opts(),
            vec![],
        );
        let exported = |ns: &str, name: &str| {
            let mut s = crate::desired::test_support::cluster_ip_service();
            s.metadata.namespace = Some(ns.into());
            s.metadata.name = Some(name.into());
            s
        };
        let services = [exported("shop", "web"), exported("shop", "db")];
        crate::fixtures::loaded(
            &remote.services,
            services.into_iter().chain([exported("other", "web")]),
        );
        let local = Arc::new(crate::state::LocalState::default().networks_listed());
        let ctx = crate::fixtures::ctx(client, leadership.clone(), vec![Arc::new(remote)], local);
        let ctl = Controller::new(Arc::new(ctx), WorkQueue::new(), leadership);
        ctl.namespace_appeared("shop");
        let mut queued = vec![];
        while !ctl.queue.is_empty() {
            let key = ctl.queue.next().await.expect("queued");
            ctl.queue.done(&key);
            queued.push(key.to_string());
        }
        queued.sort();
        assert_eq!(
            queued,
            [
                Key::follower(("shop".into(), "db".into())).to_string(),
                Key::follower(("shop".into(), "web".into())).to_string()
            ]
        );
        // and the local cluster's name is always read; a remote's only while it is a member
        assert!(ctl.reads(LOCAL));
        assert!(ctl.reads(crate::fixtures::REMOTE));
        assert!(!ctl.reads("gone"));
    }

    #[tokio::test]
    async fn a_pass_that_succeeds_releases_its_key_and_returns_its_value() {
        let q = WorkQueue::new();
        q.add(1);
        let key = q.next().await.expect("queued");
        assert!(matches!(process(&q, &key, async { 7 }).await, Ok(7)));
        q.add(1);
        assert_eq!(q.len(), 1);
    }
}
