//! Wiring: remote and local watches feed the caches and the work queue; workers reconcile; the
//! Lease decides who writes; the sweeper and the admin server sit beside them; SIGTERM/SIGINT
//! drain it all.
use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Endpoints, Namespace, ObjectReference, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::core::PartialObjectMeta;
use kube::runtime::WatchStreamExt;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::{Notify, watch};
use tokio_cron_scheduler::{Job, JobScheduler};
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::admin::{self, AdminState};
use crate::args::Args;
use crate::cache::{Cache, GroupKey};
use crate::clients::{self, Remote};
use crate::desired::Options;
use crate::error::{Error, Result};
use crate::lease::{self, LeaseConfig};
use crate::metrics::{Metrics, labels};
use crate::queue::WorkQueue;
use crate::reconcile::{self, Ctx, Key, LocalState, Outcome, RemoteState, read, write};
use crate::sweeper;
use crate::writer::Writer;

const CONTROLLER: &str = "cross-cluster-controller";

/// Follows one watch into one cache; `on_change` receives the groups that changed (after the
/// first complete listing, and then every live event or completed relist).
async fn follow<K, T>(
    api: Api<K>,
    cfg: watcher::Config,
    holder: Arc<T>,
    cache: fn(&T) -> &RwLock<Cache<K>>,
    what: String,
    on_change: impl Fn(Vec<GroupKey>) + Send,
    shutdown: CancellationToken,
) where
    K: Resource<DynamicType = ()>
        + Clone
        + DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
    T: Send + Sync,
{
    let mut failing = false;
    let mut delay = RETRY_MIN;
    'watch: loop {
        // a fresh watcher starts with a complete listing: after any failure, only a complete
        // listing (InitDone) marks the watch healthy again and clears /readyz
        let stream = watcher(api.clone(), cfg.clone());
        let mut stream = std::pin::pin!(stream);
        loop {
            let next = tokio::select! {
                _ = shutdown.cancelled() => return,
                n = stream.next() => n,
            };
            match next {
                Some(Ok(ev)) => {
                    if matches!(ev, Event::InitDone) {
                        delay = RETRY_MIN;
                        if failing {
                            info!(watch = %what, "watch recovered: complete listing received");
                            failing = false;
                        }
                    }
                    let changed = write(cache(&holder)).apply(ev);
                    if !changed.is_empty() {
                        on_change(changed);
                    }
                }
                Some(Err(e)) if expired(&e) => {
                    // the resume point was compacted away: start over with a listing at once
                    // (the cache swaps it in only once it is complete); not a failure
                    info!(watch = %what, "watch expired (410 Gone); relisting");
                    continue 'watch;
                }
                Some(Err(e)) => {
                    // recorded with its causes (a TLS or DNS failure is named only there); the
                    // cache keeps its last complete view: an unreachable API deletes nothing
                    let why = crate::error::chain(&e);
                    write(cache(&holder)).failed(why.clone());
                    if !failing {
                        warn!(watch = %what, error = %why, "watch failed; retrying with back-off, nothing is deleted meanwhile");
                    }
                    failing = true;
                    break;
                }
                None => return,
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(delay) => {}
        }
        delay = (delay * 2).min(RETRY_MAX);
    }
}

/// 410 Gone: the watch asked for a resourceVersion that etcd has compacted away.
fn expired(e: &watcher::Error) -> bool {
    match e {
        watcher::Error::WatchError(s) => s.code == 410,
        watcher::Error::WatchStartFailed(kube::Error::Api(s)) => s.code == 410,
        _ => false,
    }
}

/// Back-off between attempts of a failed watch.
const RETRY_MIN: Duration = Duration::from_millis(500);
const RETRY_MAX: Duration = Duration::from_secs(30);

use kube::runtime::watcher::watcher;

struct Runtime {
    /// when a remote change for a key was first seen and not yet written
    pending_since: Mutex<HashMap<Key, Instant>>,
    ctx: Arc<Ctx>,
    queue: Arc<WorkQueue<Key>>,
    leader: watch::Receiver<bool>,
    remotes: Vec<(Remote, Arc<RemoteState>)>,
}

impl Runtime {
    fn enqueue_remote(&self, remote: &Arc<str>, keys: Vec<GroupKey>) {
        let Some(state) = self.ctx.remotes.get(remote) else {
            return;
        };
        for (namespace, name) in keys.into_iter().filter(|k| state.in_scope(&k.0)) {
            self.queue.add(Key {
                remote: Arc::clone(remote),
                namespace,
                name,
            });
        }
    }

    /// A remote change: remembered for the propagation-lag histogram, then queued.
    fn remote_changed(&self, remote: &Arc<str>, keys: Vec<GroupKey>) {
        {
            let now = Instant::now();
            let mut pending = self.pending_since.lock().unwrap_or_else(|p| p.into_inner());
            for (namespace, name) in &keys {
                let key = Key {
                    remote: Arc::clone(remote),
                    namespace: namespace.clone(),
                    name: name.clone(),
                };
                pending.entry(key).or_insert(now);
            }
        }
        self.enqueue_remote(remote, keys);
    }

    fn settled(&self, key: &Key, wrote: bool) {
        let since = self
            .pending_since
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
        if let (true, Some(at)) = (wrote, since) {
            self.ctx
                .metrics
                .lag
                .get_or_create(&labels([("remote", &key.remote)]))
                .observe(at.elapsed().as_secs_f64());
        }
    }
}

async fn worker(rt: Arc<Runtime>, retries: Arc<Mutex<HashMap<Key, u32>>>) {
    while let Some(key) = rt.queue.next().await {
        if !*rt.leader.borrow() {
            rt.queue.done(&key);
            continue;
        }
        let result = reconcile::reconcile(&rt.ctx, &key).await;
        rt.queue.done(&key);
        let mut retries_map = retries.lock().unwrap_or_else(|p| p.into_inner());
        match result {
            Ok(Outcome::NotReady) | Err(Error::NotLeader) => {
                retries_map.remove(&key);
            }
            Ok(outcome) => {
                retries_map.remove(&key);
                rt.settled(&key, matches!(outcome, Outcome::Applied | Outcome::Deleted));
            }
            Err(e) => {
                let n = retries_map.entry(key.clone()).or_insert(0);
                *n += 1;
                let delay = Duration::from_millis(200u64.saturating_mul(1 << (*n).min(9)))
                    .min(Duration::from_secs(60));
                rt.ctx
                    .metrics
                    .reconciles
                    .get_or_create(&labels([("remote", &key.remote), ("outcome", "error")]))
                    .inc();
                if *n >= 5 {
                    error!(
                        key = %key, error = %e, attempt = *n,
                        tags.remote = %key.remote, tags.namespace = %key.namespace, tags.kind = "Service",
                        tags.category = e.category(),
                        "reconcile keeps failing; retrying"
                    );
                } else {
                    warn!(key = %key, error = %e, category = e.category(), attempt = *n, retry_in_ms = delay.as_millis() as u64, "reconcile failed; retrying");
                }
                rt.queue.add_after(key, delay);
            }
        }
    }
}

/// Watches end server-side after `--api-timeout-seconds` and are renewed, so a quiet healthy
/// watch keeps its connection active and a stalled one is noticed (see `clients::with_timeouts`).
fn watcher_config(selector: &str, args: &Args) -> watcher::Config {
    watcher::Config::default()
        .labels(selector)
        .timeout(args.api_timeout_seconds)
}

/// Blocks until SIGTERM or SIGINT, then cancels; a second signal exits at once.
fn handle_signals(shutdown: CancellationToken) {
    tokio::spawn(async move {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(e) => {
                    error!(error = %e, "cannot install the SIGTERM handler");
                    return;
                }
            };
        for n in 0..2 {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
            if n == 0 {
                info!("shutting down: draining work, releasing the lease (signal again to abort)");
                shutdown.cancel();
            } else {
                warn!("second signal: exiting now");
                std::process::exit(130);
            }
        }
    });
}

pub async fn run(args: Args) -> Result<()> {
    args.validate().map_err(Error::Config)?;
    let cron = args.sweep_cron().map_err(Error::Config)?;
    let clients = clients::build(&args).await?;
    let metrics = Arc::new(Metrics::default());
    let shutdown = CancellationToken::new();
    handle_signals(shutdown.clone());

    let identity = args
        .identity
        .clone()
        .unwrap_or_else(lease::default_identity);
    let listener = tokio::net::TcpListener::bind(args.admin_bind)
        .await
        .map_err(|e| Error::Config(format!("--admin-bind {}: {e}", args.admin_bind)))?;
    info!(
        version = env!("CARGO_PKG_VERSION"),
        identity = %identity,
        remote = %clients.remotes.iter().map(|r| r.name.as_str()).collect::<Vec<_>>().join(","),
        label_key = %args.label_key,
        dry_run = args.dry_run,
        admin = %listener.local_addr().map(|a| a.to_string()).unwrap_or_default(),
        "starting"
    );

    // leader election
    let lease_cfg = LeaseConfig {
        namespace: args.namespace.clone(),
        name: args.lease_name.clone(),
        identity: identity.clone(),
        duration: args.lease_duration(),
    };
    let leader_metric = metrics.leader.clone();
    let (leader, lease_task) = lease::spawn(
        clients.local.clone(),
        lease_cfg,
        shutdown.clone(),
        move |l| {
            leader_metric.set(i64::from(l));
        },
    );

    let local_state = Arc::new(LocalState::default());
    let remotes: Vec<(Remote, Arc<RemoteState>)> = clients
        .remotes
        .iter()
        .map(|r| {
            let opts = Options {
                label_key: args.label_key.clone(),
                cluster_name: r.name.clone(),
                endpoints_mode: args.endpoints_mode.into(),
            };
            (
                r.clone(),
                Arc::new(RemoteState::new(
                    &r.name,
                    opts,
                    args.watch_namespaces.clone(),
                )),
            )
        })
        .collect();

    let fallback_ref = ObjectReference {
        api_version: Some("coordination.k8s.io/v1".into()),
        kind: Some("Lease".into()),
        name: Some(args.lease_name.clone()),
        namespace: Some(args.namespace.clone()),
        ..Default::default()
    };
    let ctx = Arc::new(Ctx {
        remotes: remotes
            .iter()
            .map(|(_, s)| (Arc::clone(&s.name), Arc::clone(s)))
            .collect(),
        local: Arc::clone(&local_state),
        writer: Writer::new(
            clients.local.clone(),
            leader.clone(),
            args.dry_run,
            Arc::clone(&metrics),
        ),
        recorder: Recorder::new(
            clients.local.clone(),
            Reporter {
                controller: CONTROLLER.into(),
                instance: Some(identity.clone()),
            },
        ),
        metrics: Arc::clone(&metrics),
        create_namespaces: args.create_namespaces,
        fallback_ref,
        events_sent: Mutex::new(reconcile::EventLimiter::new(Duration::from_secs(300))),
    });
    let queue = WorkQueue::new();
    let rt = Arc::new(Runtime {
        pending_since: Mutex::default(),
        ctx: Arc::clone(&ctx),
        queue: Arc::clone(&queue),
        leader: leader.clone(),
        remotes: remotes.clone(),
    });

    let mut tasks = Vec::new();
    // remote watches: leaders and their slices, per remote
    for (remote, state) in &remotes {
        tasks.push(remote_watch(
            &rt,
            remote,
            state,
            &args,
            |s| &s.services,
            "Services",
            &shutdown,
        ));
        tasks.push(remote_watch(
            &rt,
            remote,
            state,
            &args,
            |s| &s.slices,
            "EndpointSlices",
            &shutdown,
        ));
    }

    // local followers: drift or manual deletion re-triggers the key for every remote
    let local_sel = format!("{}=follower", args.label_key);
    macro_rules! local_watch {
        ($kind:ty, $field:ident, $what:expr) => {{
            let rt = Arc::clone(&rt);
            tasks.push(tokio::spawn(follow(
                scoped_api::<$kind>(&clients.local, &args.watch_namespaces),
                watcher_config(&local_sel, &args),
                Arc::clone(&local_state),
                |s: &LocalState| &s.$field,
                $what.to_string(),
                move |keys: Vec<GroupKey>| {
                    for (_, s) in &rt.remotes {
                        rt.enqueue_remote(&s.name, keys.clone());
                    }
                },
                shutdown.clone(),
            )));
        }};
    }
    local_watch!(Service, services, "local follower Services");
    local_watch!(EndpointSlice, slices, "local follower EndpointSlices");
    local_watch!(Endpoints, endpoints, "local follower Endpoints");

    // a namespace that appears locally releases the leaders that were waiting for it
    {
        let rt = Arc::clone(&rt);
        let api: Api<PartialObjectMeta<Namespace>> = Api::all(clients.local.clone());
        let shutdown = shutdown.clone();
        tasks.push(tokio::spawn(async move {
            let stream = watcher(
                api,
                watcher::Config::default().timeout(args.api_timeout_seconds),
            )
            .default_backoff()
            .applied_objects();
            let mut stream = std::pin::pin!(stream);
            loop {
                let ns = tokio::select! {
                    _ = shutdown.cancelled() => return,
                    n = stream.next() => n,
                };
                match ns {
                    Some(Ok(ns)) => {
                        let Some(name) = ns.metadata.name else {
                            continue;
                        };
                        for (_, s) in &rt.remotes {
                            let keys: Vec<GroupKey> = read(&s.services)
                                .keys()
                                .filter(|k| k.0 == name)
                                .cloned()
                                .collect();
                            rt.enqueue_remote(&s.name, keys);
                        }
                    }
                    Some(Err(e)) => warn!(error = %e, "local namespace watch failed; retrying"),
                    None => return,
                }
            }
        }));
    }

    // workers
    let retries = Arc::new(Mutex::new(HashMap::new()));
    let workers: Vec<_> = (0..args.workers)
        .map(|_| tokio::spawn(worker(Arc::clone(&rt), Arc::clone(&retries))))
        .collect();

    // sweeper: cron ticks and leadership gains wake it
    let sweep_now = Arc::new(Notify::new());
    let mut scheduler = JobScheduler::new()
        .await
        .map_err(|e| Error::Scheduler(e.to_string()))?;
    {
        let sweep_now = Arc::clone(&sweep_now);
        let job = Job::new(cron.as_str(), move |_, _| sweep_now.notify_one())
            .map_err(|e| Error::Scheduler(e.to_string()))?;
        scheduler
            .add(job)
            .await
            .map_err(|e| Error::Scheduler(e.to_string()))?;
        scheduler
            .start()
            .await
            .map_err(|e| Error::Scheduler(e.to_string()))?;
    }
    {
        let rt = Arc::clone(&rt);
        let sweep_now = Arc::clone(&sweep_now);
        let shutdown = shutdown.clone();
        let namespaces = args.watch_namespaces.clone();
        let timeout = Duration::from_secs(args.sweep_list_timeout_seconds);
        tasks.push(tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = sweep_now.notified() => {}
                }
                if !*rt.leader.borrow() {
                    continue;
                }
                for (remote, state) in &rt.remotes {
                    sweeper::sweep_logged(
                        &rt.ctx,
                        &state.name,
                        &remote.client,
                        &state.opts,
                        &namespaces,
                        timeout,
                    )
                    .await;
                }
            }
        }));
    }

    // on every leadership gain: sweep (fresh listings, no cache needed), and reconcile every
    // leader of each remote as soon as that remote's caches are complete; a broken remote
    // does not hold the others back
    {
        let rt = Arc::clone(&rt);
        let sweep_now = Arc::clone(&sweep_now);
        let mut leader = leader.clone();
        let shutdown = shutdown.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                if *leader.borrow_and_update() {
                    sweep_now.notify_one();
                    let mut pending: Vec<Arc<RemoteState>> = rt.remotes.iter().map(|(_, s)| Arc::clone(s)).collect();
                    while !pending.is_empty() && *leader.borrow() {
                        let local_ready = rt.ctx.local.ready();
                        pending.retain(|s| {
                            if !(local_ready && s.ready()) {
                                return true;
                            }
                            let keys: Vec<GroupKey> = read(&s.services).keys().cloned().collect();
                            info!(remote = %s.name, leaders = keys.len(), "caches synced; reconciling every leader");
                            rt.enqueue_remote(&s.name, keys);
                            false
                        });
                        tokio::select! {
                            _ = shutdown.cancelled() => return,
                            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                        }
                    }
                }
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    r = leader.changed() => if r.is_err() { return },
                }
            }
        }));
    }

    // gauges: followers, remote health
    {
        let rt = Arc::clone(&rt);
        let shutdown = shutdown.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                let m = &rt.ctx.metrics;
                for (_, s) in &rt.remotes {
                    let remote = labels([("remote", &s.name)]);
                    let n = read(&rt.ctx.local.services)
                        .keys()
                        .filter(|k| s.in_scope(&k.0))
                        .count();
                    m.followers.get_or_create(&remote).set(n as i64);
                    m.remote_up
                        .get_or_create(&remote)
                        .set(i64::from(s.problem().is_none()));
                    if let Some(secs) = s.seconds_since_list() {
                        m.since_list.get_or_create(&remote).set(secs);
                    }
                }
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
            }
        }));
    }

    let admin_state = Arc::new(AdminState {
        metrics: Arc::clone(&metrics),
        remotes: remotes.iter().map(|(_, s)| Arc::clone(s)).collect(),
        local: Arc::clone(&local_state),
    });
    let admin = tokio::spawn(admin::serve(listener, admin_state, shutdown.clone()));

    shutdown.cancelled().await;
    queue.close();
    for w in workers {
        let _ = tokio::time::timeout(Duration::from_secs(10), w).await;
    }
    let _ = scheduler.shutdown().await;
    let _ = tokio::time::timeout(Duration::from_secs(6), lease_task).await;
    for t in tasks {
        t.abort();
    }
    if let Ok(Err(e)) = admin.await {
        warn!(error = %e, "admin server");
    }
    info!("stopped");
    Ok(())
}

/// One mirrored namespace: a namespaced watch. Several or all: one cluster-wide watch (a cache
/// takes one complete listing at a time), and reconcile ignores keys outside the list.
fn scoped_api<K>(client: &Client, namespaces: &[String]) -> Api<K>
where
    K: Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>,
{
    match namespaces {
        [only] => Api::namespaced(client.clone(), only),
        _ => Api::all(client.clone()),
    }
}

/// Follows one kind of the remote's leader-labelled objects into its cache; changes queue keys.
fn remote_watch<K>(
    rt: &Arc<Runtime>,
    remote: &Remote,
    state: &Arc<RemoteState>,
    args: &Args,
    cache: fn(&RemoteState) -> &RwLock<Cache<K>>,
    what: &str,
    shutdown: &CancellationToken,
) -> tokio::task::JoinHandle<()>
where
    K: Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let rt = Arc::clone(rt);
    let name = Arc::clone(&state.name);
    tokio::spawn(follow(
        scoped_api::<K>(&remote.client, &args.watch_namespaces),
        watcher_config(&state.opts.leader_selector(), args),
        Arc::clone(state),
        cache,
        format!("remote {} {what}", state.name),
        move |keys| rt.remote_changed(&name, keys),
        shutdown.clone(),
    ))
}
