//! One watch into one cache: list (paginated), then watch from the resourceVersion the list
//! ended at, and after a transient error *resume* from the last resourceVersion seen (an object
//! event or a bookmark). Only 410 Gone (the resume point was compacted away, or a list's
//! continue token expired) starts over with a full listing.
//!
//! Why not kube-runtime's `watcher` for the caches: it does not tell its caller when a resumed
//! watch is established, so a remote that recovered without changes would stay "failing" on
//! /readyz; here a watch the server accepts clears the failure at once, and a watch start
//! refused with 410 relists. It also cannot be held or restarted from scratch by a remote's
//! budget ([`Guard`]), nor count its requests. The streams that fill no cache use `watcher`
//! (see docs/architecture.md, "Waiting, retrying, watching").
pub mod local;
pub mod mcs;
pub mod networks;
pub mod remote;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::RwLock;
use std::time::Duration;

use futures::StreamExt;
use kube::api::{WatchEvent, WatchParams};
use kube::runtime::watcher::Event;
use kube::{Api, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::client::pages::{next_token, page};
use crate::runtime::metrics::{ByWatch, Metrics};
use crate::runtime::supervisor::Supervisor;
use crate::state::cache::{Cache, GroupKey};

/// Back-off between attempts after a failure.
const RETRY_MIN: Duration = Duration::from_millis(500);
const RETRY_MAX: Duration = Duration::from_secs(30);
/// A watch that sends nothing (not even its end) this long after its server-side timeout is on a
/// dead connection: it is dropped and resumed (a new connection), as kube-runtime does.
const IDLE_MARGIN: Duration = Duration::from_secs(5);

/// What a watch can hold: an object kube reads and a cache stores.
pub trait Watched:
    Resource<DynamicType = ()>
    + Clone
    + DeserializeOwned
    + Serialize
    + std::fmt::Debug
    + Send
    + Sync
    + 'static
{
}

impl<K> Watched for K where
    K: Resource<DynamicType = ()>
        + Clone
        + DeserializeOwned
        + Serialize
        + std::fmt::Debug
        + Send
        + Sync
        + 'static
{
}

/// What to watch (bookmarks are asked for: kube's WatchParams default).
pub struct Spec<K> {
    pub api: Api<K>,
    pub selector: String,
    /// server-side watch timeout: the watch is renewed this often (seconds)
    pub timeout: u32,
    /// "remote east Services": for logs
    pub what: String,
    /// `state::LOCAL` or the remote's name, and the kind: for the request counter
    pub cluster: String,
}

/// How one round ended.
#[derive(Debug, PartialEq)]
enum Round {
    /// go on watching from this resourceVersion
    Resume(String),
    /// 410 Gone: list again, at once and without counting it as a failure
    Relist,
    /// a failure; after a back-off, retry from this point (None: list again)
    Failed(Option<String>, String),
}

/// Follows one watch into one cache; `on_change` receives the groups that
/// changed (after the first complete listing, and then every live event or completed relist).
pub struct Follow<K, T, F> {
    pub spec: Spec<K>,
    pub holder: Arc<T>,
    pub cache: fn(&T) -> &RwLock<Cache<K>>,
    pub on_change: F,
    /// called after each complete listing (an empty one changes no group, so `on_change`
    /// alone would not wake what waits for it)
    pub on_listed: Option<Listed>,
    pub metrics: Arc<Metrics>,
    /// the budget of the holder's cluster (a remote's), judged after every event
    pub guard: Option<Arc<dyn Guard>>,
    /// the guard's epoch when this watch last started a listing
    pub seen: AtomicU64,
}

/// What a watch calls after each complete listing.
pub type Listed = Box<dyn Fn() + Send + Sync>;

/// A budget a watch keeps to (see `state::budget`): what it reads stops at the budget.
pub trait Guard: Send + Sync {
    /// Err while nothing may be read (over budget, its back-off running).
    fn hold(&self) -> Result<(), String>;
    /// Bumped when the caches are dropped: a watch that listed before lists again.
    fn epoch(&self) -> u64;
    /// After an event: Err when the watch must stop and list again (over budget now, or since
    /// `seen`).
    fn admit(&self, seen: u64) -> Result<(), String>;
    /// After a complete listing.
    fn listed(&self);
}

impl<K, T, F> Follow<K, T, F>
where
    K: Watched,
    T: Send + Sync,
    F: Fn(Vec<GroupKey>) + Send,
{
    /// Runs until dropped (the supervisor drops it at shutdown).
    pub async fn run(self) {
        let mut failing = false;
        let mut delay = RETRY_MIN;
        let mut from: Option<String> = None;
        loop {
            match self.round(from.take(), &mut failing, &mut delay).await {
                Round::Resume(rv) => from = Some(rv),
                Round::Relist => {
                    info!(watch = %self.spec.what, "watch expired (410 Gone); relisting");
                }
                Round::Failed(at, why) => {
                    // the cache keeps its last complete view: an unreachable API deletes nothing
                    (self.cache)(&self.holder).write().failed(why.clone());
                    if !failing {
                        warn!(watch = %self.spec.what, error = %why, "watch failed; retrying with back-off, nothing is deleted meanwhile");
                    }
                    failing = true;
                    from = at;
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(RETRY_MAX);
                }
            }
        }
    }

    async fn round(&self, from: Option<String>, failing: &mut bool, delay: &mut Duration) -> Round {
        let mut from = from;
        if let Some(g) = &self.guard {
            if let Err(why) = g.hold() {
                return Round::Failed(None, why);
            }
            if g.epoch() != self.seen.load(Ordering::SeqCst) {
                // the caches were dropped since this watch listed: what it resumes is gone
                from = None;
            }
        }
        let round = match from {
            None => self.list().await,
            Some(rv) => self.watch(rv, failing, delay).await,
        };
        if let Round::Resume(_) = round
            && *failing
        {
            // reached after a complete listing (a watch clears it when it is accepted)
            self.recovered(failing, delay, "complete listing received");
        }
        round
    }

    fn recovered(&self, failing: &mut bool, delay: &mut Duration, how: &str) {
        *delay = RETRY_MIN;
        if *failing {
            info!(watch = %self.spec.what, "watch recovered: {how}");
            (self.cache)(&self.holder).write().recovered();
            *failing = false;
        }
    }

    fn count(&self, request: &str) {
        self.metrics
            .watch_requests
            .get_or_create(&ByWatch::new(
                self.spec.cluster.as_str(),
                K::kind(&()).as_ref(),
                request,
            ))
            .inc();
    }

    /// Applies one event; Err when the guard stops this watch (its budget).
    fn apply(&self, event: Event<K>) -> Result<(), String> {
        let changed = (self.cache)(&self.holder).write().apply(event);
        if let Some(g) = &self.guard {
            g.admit(self.seen.load(Ordering::SeqCst))?;
        }
        if !changed.is_empty() {
            (self.on_change)(changed);
        }
        Ok(())
    }

    /// A complete, paginated listing, fed page by page into the cache's relist buffer (the cache
    /// shows it only once complete).
    async fn list(&self) -> Round {
        if let Some(g) = &self.guard {
            self.seen.store(g.epoch(), Ordering::SeqCst);
        }
        if let Err(why) = self.apply(Event::Init) {
            return Round::Failed(None, why);
        }
        let mut token: Option<String> = None;
        loop {
            let lp = page(&self.spec.selector, token.take());
            self.count("list");
            let listed = match self.spec.api.list(&lp).await {
                Ok(page) => page,
                Err(e) if gone(&e) => return Round::Relist,
                Err(e) => {
                    let why = format!("listing failed: {}", crate::error::chain(&e));
                    return Round::Failed(None, why);
                }
            };
            for obj in listed.items {
                if let Err(why) = self.apply(Event::InitApply(obj)) {
                    return Round::Failed(None, why);
                }
            }
            token = next_token(&listed.metadata);
            if token.is_none() {
                let Some(rv) = listed.metadata.resource_version.filter(|v| !v.is_empty()) else {
                    return Round::Failed(None, "listing has no resourceVersion".into());
                };
                if let Err(why) = self.apply(Event::InitDone) {
                    return Round::Failed(None, why);
                }
                if let Some(g) = &self.guard {
                    g.listed();
                }
                if let Some(listed) = &self.on_listed {
                    listed();
                }
                return Round::Resume(rv);
            }
        }
    }

    /// Watches from `rv` until the server ends the watch (its timeout: resume at once), an error
    /// (resume after a back-off) or 410 Gone (relist).
    async fn watch(&self, rv: String, failing: &mut bool, delay: &mut Duration) -> Round {
        let wp = WatchParams::default()
            .labels(&self.spec.selector)
            .timeout(self.spec.timeout);
        self.count("watch");
        let stream = match self.spec.api.watch(&wp, &rv).await {
            Ok(s) => s,
            Err(e) if gone(&e) => return Round::Relist,
            Err(e) => {
                let why = format!("watch failed to start: {}", crate::error::chain(&e));
                return Round::Failed(Some(rv), why);
            }
        };
        // the server accepted a watch from where we were: the cache is current again
        self.recovered(failing, delay, "watch resumed");
        let idle = Duration::from_secs(u64::from(self.spec.timeout)) + IDLE_MARGIN;
        let mut stream = std::pin::pin!(stream);
        let mut rv = rv;
        loop {
            let Ok(next) = tokio::time::timeout(idle, stream.next()).await else {
                return Round::Resume(rv);
            };
            match next {
                None => return Round::Resume(rv),
                Some(Ok(WatchEvent::Added(o) | WatchEvent::Modified(o))) => {
                    rv = version_or(&o, rv);
                    if let Err(why) = self.apply(Event::Apply(o)) {
                        return Round::Failed(None, why);
                    }
                }
                Some(Ok(WatchEvent::Deleted(o))) => {
                    rv = version_or(&o, rv);
                    if let Err(why) = self.apply(Event::Delete(o)) {
                        return Round::Failed(None, why);
                    }
                }
                Some(Ok(WatchEvent::Bookmark(b))) => rv = b.metadata.resource_version,
                Some(Ok(WatchEvent::Error(s))) if s.code == 410 => return Round::Relist,
                Some(Ok(WatchEvent::Error(s))) => {
                    return Round::Failed(Some(rv), format!("watch error: {}", s.message));
                }
                Some(Err(e)) => {
                    let why = format!("watch broke: {}", crate::error::chain(&e));
                    return Round::Failed(Some(rv), why);
                }
            }
        }
    }
}

fn version_or<K: Resource>(o: &K, rv: String) -> String {
    o.meta()
        .resource_version
        .clone()
        .filter(|v| !v.is_empty())
        .unwrap_or(rv)
}

/// 410 Gone: a resourceVersion (or a list's continue token) etcd has compacted away.
fn gone(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 410)
}

/// What one watch of `cluster` reads: `selector` in the mirrored `namespaces`.
pub fn spec<K>(
    client: &kube::Client,
    namespaces: &[String],
    timeout: u32,
    selector: String,
    cluster: &str,
    what: String,
) -> Spec<K>
where
    K: Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>,
{
    Spec {
        api: crate::client::pages::scoped_api(client, namespaces),
        selector,
        timeout,
        what,
        cluster: cluster.to_string(),
    }
}

/// Where a watch writes: a holder of caches, and which of its caches.
pub type Target<T, K> = (Arc<T>, fn(&T) -> &RwLock<Cache<K>>);

/// Spawns one supervised watch into a cache of `holder`, until `stop`.
pub fn spawn<K, T>(
    sup: &Supervisor,
    metrics: &Arc<Metrics>,
    stop: &CancellationToken,
    spec: Spec<K>,
    into: Target<T, K>,
    on_change: impl Fn(Vec<GroupKey>) + Send + Sync + 'static,
) where
    K: Watched,
    T: Send + Sync + 'static,
{
    spawn_listed(sup, metrics, stop, spec, into, on_change, None);
}

/// [`spawn`], calling `on_listed` after each complete listing.
pub fn spawn_listed<K, T>(
    sup: &Supervisor,
    metrics: &Arc<Metrics>,
    stop: &CancellationToken,
    spec: Spec<K>,
    into: Target<T, K>,
    on_change: impl Fn(Vec<GroupKey>) + Send + Sync + 'static,
    on_listed: Option<Listed>,
) where
    K: Watched,
    T: Send + Sync + 'static,
{
    spawn_guarded(sup, metrics, stop, spec, into, on_change, on_listed, None);
}

/// [`spawn_listed`], kept to `guard` (a remote's budget).
#[allow(clippy::too_many_arguments)]
pub fn spawn_guarded<K, T>(
    sup: &Supervisor,
    metrics: &Arc<Metrics>,
    stop: &CancellationToken,
    spec: Spec<K>,
    into: Target<T, K>,
    on_change: impl Fn(Vec<GroupKey>) + Send + Sync + 'static,
    on_listed: Option<Listed>,
    guard: Option<Arc<dyn Guard>>,
) where
    K: Watched,
    T: Send + Sync + 'static,
{
    let what = spec.what.clone();
    let (holder, cache) = into;
    let follow = Follow {
        spec,
        holder,
        cache,
        on_change,
        on_listed,
        metrics: Arc::clone(metrics),
        guard,
        seen: AtomicU64::new(0),
    };
    sup.spawn_until(what, stop.clone(), follow.run());
}
