//! Wiring: remote and local watches feed the caches and the work queue; workers reconcile; the
//! Lease decides who writes; the sweeper and the admin server sit beside them. Every task runs
//! under the supervisor: one that ends early shuts the process down with an error. SIGTERM/SIGINT
//! drain it all.
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Endpoints, Namespace, ObjectReference, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::core::PartialObjectMeta;
use kube::runtime::WatchStreamExt;
use kube::runtime::events::Reporter;
use kube::runtime::watcher::{self, watcher};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::Notify;
use tokio_cron_scheduler::{Job, JobScheduler};
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::admin::{self, AdminState};
use crate::args::Args;
use crate::cache::{Cache, GroupKey};
use crate::clients::{self, Remote};
use crate::desired::Options;
use crate::error::{Error, Result};
use crate::lease::{self, Leadership, LeaseConfig};
use crate::metrics::{Metrics, labels};
use crate::queue::WorkQueue;
use crate::reconcile::{self, Ctx, LocalState, RemoteState, read};
use crate::registry::{Member, Origin, Registry};
use crate::remote_secrets;
use crate::supervisor::Supervisor;
use crate::sweeper;
use crate::watch::{Follow, Spec};
use crate::worker::{self, Runtime};
use crate::writer::Writer;
use crate::{health, outage};

const CONTROLLER: &str = "cross-cluster-controller";
/// How long start-up waits for the static remote's cluster id.
const STATIC_ID_WAIT: Duration = Duration::from_secs(5);

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
    let metrics = Arc::new(Metrics::new());
    let shutdown = CancellationToken::new();
    handle_signals(shutdown.clone());
    let sup = Supervisor::new(shutdown.clone());
    let identity = args
        .identity
        .clone()
        .unwrap_or_else(lease::default_identity);
    let listener = tokio::net::TcpListener::bind(args.admin_bind)
        .await
        .map_err(|e| Error::Config(format!("--admin-bind {}: {e}", args.admin_bind)))?;
    log_start(&args, &clients, &identity, &listener);

    let (leader, lease_task) = election(&sup, &args, &clients.local, &identity, &metrics);
    let ctx = context(&args, &clients.local, &identity, &leader, &metrics);
    let queue = WorkQueue::new();
    let rt = Arc::new(Runtime::new(Arc::clone(&ctx), Arc::clone(&queue), leader));

    static_remotes(&sup, &rt, &clients, &args).await;
    local_watches(&sup, &rt, &clients.local, &args);
    namespace_watch(&sup, &rt, &clients.local, &args);
    let workers: Vec<_> = (0..args.workers)
        .map(|i| sup.spawn(format!("worker {i}"), worker::run(Arc::clone(&rt))))
        .collect();
    let sweep_now = Arc::new(Notify::new());
    if !args.remote_secret_selector.trim().is_empty() {
        ctx.remotes.set_complete(false);
        remote_secrets(&sup, &rt, &clients, &sweep_now, &args).await;
    }
    let health = health::Keeper::new(Arc::clone(&rt), clients.local.clone(), &args, &identity);
    sup.spawn_until_shutdown("remote health Leases", health.run());
    sup.spawn_until_shutdown("outage policy", outage::run(Arc::clone(&rt)));
    let renewer = crate::credentials::Renewer::new(Arc::clone(&rt), &args);
    sup.spawn_until_shutdown("remote token renewal", renewer.run());
    let mut scheduler = cron_ticks(&cron, &sweep_now).await?;
    sweeper_task(&sup, &rt, &sweep_now, &args);
    resync_on_gain(&sup, &rt, &sweep_now);
    gauges(&sup, &rt);
    admin_server(&sup, listener, &ctx, &metrics, &shutdown);

    shutdown.cancelled().await;
    queue.close();
    for w in workers {
        let _ = tokio::time::timeout(Duration::from_secs(10), w).await;
    }
    let _ = scheduler.shutdown().await;
    let _ = tokio::time::timeout(Duration::from_secs(6), lease_task).await;
    match sup.failure() {
        Some(why) => Err(Error::TaskEnded(why)),
        None => {
            info!("stopped");
            Ok(())
        }
    }
}

fn log_start(
    args: &Args,
    clients: &clients::Clients,
    identity: &str,
    listener: &tokio::net::TcpListener,
) {
    let local = if args.devmode {
        "kubeconfig (dev mode)"
    } else {
        "in-cluster (service account token and CA, KUBERNETES_SERVICE_HOST/PORT)"
    };
    info!(
        version = env!("CARGO_PKG_VERSION"),
        identity = %identity,
        local,
        local_server = %clients.local_authority,
        remote = %clients.remotes.iter().map(|r| r.name.as_str()).collect::<Vec<_>>().join(","),
        label_key = %args.label_key,
        dry_run = args.dry_run,
        admin = %listener.local_addr().map(|a| a.to_string()).unwrap_or_default(),
        "starting"
    );
}

/// Leader election on the daemon's Lease: who may write, and the task that decides it.
fn election(
    sup: &Supervisor,
    args: &Args,
    local: &Client,
    identity: &str,
    metrics: &Metrics,
) -> (Leadership, tokio::task::JoinHandle<()>) {
    if args.dry_run {
        // a dry run must never keep a live replica from leading: it takes no part at all
        info!(lease = %args.lease_name, namespace = %args.namespace, "dry run: not taking part in the election (the Lease is left alone); acting as the leader, writing nothing");
        let stop = sup.shutdown_token();
        let idle = async move { stop.cancelled().await };
        return (
            Leadership::assumed(),
            sup.spawn("lease (none: dry run)", idle),
        );
    }
    let lease_cfg = LeaseConfig {
        namespace: args.namespace.clone(),
        name: args.lease_name.clone(),
        identity: identity.to_string(),
        duration: args.lease_duration(),
    };
    let leader_metric = metrics.leader.clone();
    let (leader, election) =
        lease::elect(local.clone(), lease_cfg, sup.shutdown_token(), move |l| {
            leader_metric.set(i64::from(l));
        });
    (leader, sup.spawn("lease", election))
}

/// The static remote (flags), with its cluster id: recorded on its followers and as the MCS
/// source-cluster of its slices; a remote that does not answer at start is read without it.
async fn static_remotes(
    sup: &Supervisor,
    rt: &Arc<Runtime>,
    clients: &clients::Clients,
    args: &Args,
) {
    for remote in &clients.remotes {
        let id = remote_secrets::cluster_id(&remote.client, STATIC_ID_WAIT)
            .await
            .inspect_err(|why| warn!(remote = %remote.name, "cluster id unknown: {why}"))
            .ok();
        let stale_after = args.remote_stale_after_seconds.map(Duration::from_secs);
        let member = join(sup, rt, remote, (id, stale_after), Origin::Static, args);
        if let Ok((cfg, _)) = clients::remote_config(args).await {
            let _ = member
                .state
                .credential
                .set(crate::credentials::credential(&cfg.auth_info));
        }
    }
}

/// /healthz, /readyz, /metrics; a server that fails ends the process.
fn admin_server(
    sup: &Supervisor,
    listener: tokio::net::TcpListener,
    ctx: &Ctx,
    metrics: &Arc<Metrics>,
    shutdown: &CancellationToken,
) {
    let admin_state = Arc::new(AdminState {
        metrics: Arc::clone(metrics),
        remotes: Arc::clone(&ctx.remotes),
        local: Arc::clone(&ctx.local),
    });
    let serve = admin::serve(listener, admin_state, shutdown.clone());
    let admin_sup = sup.clone();
    sup.spawn("admin server", async move {
        if let Err(e) = serve.await {
            admin_sup.fail(format!("admin server: {e}"));
        }
    });
}

/// What every reconcile shares: caches, the writer, Events, metrics.
fn context(
    args: &Args,
    local: &Client,
    identity: &str,
    leader: &Leadership,
    metrics: &Arc<Metrics>,
) -> Arc<Ctx> {
    let fallback_ref = ObjectReference {
        api_version: Some("coordination.k8s.io/v1".into()),
        kind: Some("Lease".into()),
        name: Some(args.lease_name.clone()),
        namespace: Some(args.namespace.clone()),
        ..Default::default()
    };
    Arc::new(Ctx {
        opts: Options {
            label_key: args.label_key.clone(),
            cluster_name: String::new(),
            endpoints_mode: args.endpoints_mode.into(),
            cluster_id: None,
        },
        namespaces: args.watch_namespaces.clone(),
        remotes: Arc::new(Registry::default()),
        local: Arc::new(LocalState::default()),
        writer: Writer::new(
            local.clone(),
            leader.clone(),
            args.dry_run,
            Arc::clone(metrics),
        )
        .with_deadline(args.api_timeout())
        .with_reporter(Reporter {
            controller: CONTROLLER.into(),
            instance: Some(identity.to_string()),
        }),
        metrics: Arc::clone(metrics),
        create_namespaces: args.create_namespaces,
        fallback_ref,
        events_sent: std::sync::Mutex::new(reconcile::EventLimiter::new(Duration::from_secs(300))),
        export_conflicts: std::sync::Mutex::default(),
    })
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

/// Spawns one supervised watch into a cache of `holder`, until `stop`.
fn watch_into<K, T>(
    sup: &Supervisor,
    rt: &Arc<Runtime>,
    stop: &CancellationToken,
    spec: Spec<K>,
    holder: Arc<T>,
    cache: fn(&T) -> &RwLock<Cache<K>>,
    on_change: impl Fn(Vec<GroupKey>) + Send + Sync + 'static,
) where
    K: Resource<DynamicType = ()>
        + Clone
        + DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
    T: Send + Sync + 'static,
{
    let what = spec.what.clone();
    let follow = Follow {
        spec,
        holder,
        cache,
        on_change,
        metrics: Arc::clone(&rt.ctx.metrics),
    };
    sup.spawn_until(what, stop.clone(), follow.run());
}

/// What one watch of `cluster` reads.
fn spec<K>(client: &Client, args: &Args, selector: String, cluster: &str, what: String) -> Spec<K>
where
    K: Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>,
{
    Spec {
        api: scoped_api(client, &args.watch_namespaces),
        selector,
        timeout: args.api_timeout_seconds,
        what,
        cluster: cluster.to_string(),
    }
}

/// Makes a remote a member: its metric series, its caches in the registry, its watches (which
/// end when it leaves). A member of the same name is replaced (its watches cancelled). `known`
/// is its cluster id and its outage policy (see [`outage`]).
pub(crate) fn join(
    sup: &Supervisor,
    rt: &Arc<Runtime>,
    remote: &Remote,
    known: (Option<String>, Option<Duration>),
    origin: Origin,
    args: &Args,
) -> Arc<Member> {
    let (cluster_id, stale_after) = known;
    let opts = Options {
        label_key: args.label_key.clone(),
        cluster_name: remote.name.clone(),
        endpoints_mode: args.endpoints_mode.into(),
        cluster_id: cluster_id.clone(),
    };
    rt.ctx.metrics.init_remote(&remote.name);
    let state = RemoteState::new(&remote.name, opts, args.watch_namespaces.clone())
        .with_stale_after(stale_after);
    let member = rt.ctx.remotes.insert(Member {
        state: Arc::new(state),
        client: remote.client.clone(),
        cluster_id,
        origin,
        cancel: sup.child_token(),
    });
    remote_watches(sup, rt, &member, args);
    // a remote that joins a running leader: every one of its leaders once its caches complete
    let (rt2, state) = (Arc::clone(rt), Arc::clone(&member.state));
    let name = format!("remote {} first pass", remote.name);
    sup.spawn_until(name, member.cancel.clone(), async move {
        // a standby has nothing to do: its next leadership gain reconciles every remote
        while rt2.leader.is_leader() && !resync_when_ready(&rt2, &state) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        std::future::pending::<()>().await
    });
    member
}

/// Queues every leader of a remote, and every local follower (one this remote's listing may
/// now prove gone), if it and the local caches have completed a listing (and this replica
/// leads); false while they have not.
fn resync_when_ready(rt: &Runtime, s: &RemoteState) -> bool {
    if !(rt.leader.is_leader() && rt.ctx.local.ready() && s.ready()) {
        return false;
    }
    let keys: Vec<GroupKey> = read(&s.services).keys().cloned().collect();
    let followers: Vec<GroupKey> = read(&rt.ctx.local.services).keys().cloned().collect();
    info!(remote = %s.name, leaders = keys.len(), followers = followers.len(), "caches synced; reconciling every leader and follower");
    rt.enqueue(keys);
    rt.enqueue(followers);
    true
}

/// Remotes from the Secrets of the daemon's namespace: joined, rotated and retired at run time.
async fn remote_secrets(
    sup: &Supervisor,
    rt: &Arc<Runtime>,
    clients: &clients::Clients,
    sweep_now: &Arc<Notify>,
    args: &Args,
) {
    // the local cluster's id, so a Secret reaching the local cluster under another address is
    // refused too (without it, only the same address is)
    let local_id = remote_secrets::cluster_id(&clients.local, args.api_timeout())
        .await
        .inspect_err(|why| warn!("local cluster id unknown: {why}"))
        .ok();
    let source = remote_secrets::Source::new(
        Arc::clone(rt),
        sup.clone(),
        args.clone(),
        clients.local.clone(),
        clients.local_authority.clone(),
        local_id,
        Arc::clone(sweep_now),
    );
    sup.spawn_until_shutdown("remote Secrets", source.run());
}

/// A remote's leaders, their leader-labelled slices and the slices other managers wrote.
fn remote_watches(sup: &Supervisor, rt: &Arc<Runtime>, member: &Member, args: &Args) {
    let (state, stop) = (&member.state, &member.cancel);
    let on_change = || {
        let (rt, name) = (Arc::clone(rt), Arc::clone(&state.name));
        move |keys| rt.remote_changed(&name, keys)
    };
    let (c, name) = (&member.client, &*state.name);
    let what = |kind: &str| format!("remote {name} {kind}");
    let leaders = state.opts.leader_selector();
    let foreign = state.opts.foreign_slice_selector();
    let s = || Arc::clone(state);
    let services = spec::<Service>(c, args, leaders.clone(), name, what("Services"));
    watch_into(sup, rt, stop, services, s(), |s| &s.services, on_change());
    let slices = spec::<EndpointSlice>(c, args, leaders, name, what("EndpointSlices"));
    watch_into(sup, rt, stop, slices, s(), |s| &s.slices, on_change());
    let other = what("EndpointSlices of other managers");
    let foreign = spec::<EndpointSlice>(c, args, foreign, name, other);
    watch_into(
        sup,
        rt,
        stop,
        foreign,
        s(),
        |s| &s.foreign_slices,
        on_change(),
    );
}

/// Local followers: drift or manual deletion re-triggers the key for every remote.
fn local_watches(sup: &Supervisor, rt: &Arc<Runtime>, local: &Client, args: &Args) {
    let sel = format!("{}=follower", args.label_key);
    let on_change = || {
        let rt = Arc::clone(rt);
        move |keys| rt.enqueue(keys)
    };
    let what = |kind: &str| format!("local follower {kind}");
    let s = || Arc::clone(&rt.ctx.local);
    let stop = &sup.child_token();
    let services = spec::<Service>(local, args, sel.clone(), "local", what("Services"));
    watch_into(sup, rt, stop, services, s(), |s| &s.services, on_change());
    let slices = spec::<EndpointSlice>(local, args, sel.clone(), "local", what("EndpointSlices"));
    watch_into(sup, rt, stop, slices, s(), |s| &s.slices, on_change());
    let endpoints = spec::<Endpoints>(local, args, sel, "local", what("Endpoints"));
    watch_into(sup, rt, stop, endpoints, s(), |s| &s.endpoints, on_change());
}

/// A namespace that appears locally releases the leaders that were waiting for it.
fn namespace_watch(sup: &Supervisor, rt: &Arc<Runtime>, local: &Client, args: &Args) {
    let rt = Arc::clone(rt);
    let api: Api<PartialObjectMeta<Namespace>> = Api::all(local.clone());
    let cfg = watcher::Config::default().timeout(args.api_timeout_seconds);
    sup.spawn_until_shutdown("local namespace watch", async move {
        let stream = watcher(api, cfg).default_backoff().applied_objects();
        let mut stream = std::pin::pin!(stream);
        while let Some(ns) = stream.next().await {
            match ns {
                Ok(ns) => {
                    let Some(name) = ns.metadata.name else {
                        continue;
                    };
                    for s in rt.ctx.remotes.states() {
                        let keys: Vec<GroupKey> = read(&s.services)
                            .keys()
                            .filter(|k| k.0 == name)
                            .cloned()
                            .collect();
                        rt.enqueue(keys);
                    }
                }
                Err(e) => warn!(error = %e, "local namespace watch failed; retrying"),
            }
        }
    });
}

/// The sweep schedule: each cron tick wakes the sweeper.
async fn cron_ticks(cron: &str, sweep_now: &Arc<Notify>) -> Result<JobScheduler> {
    let scheduler = JobScheduler::new()
        .await
        .map_err(|e| Error::Scheduler(e.to_string()))?;
    let wake = Arc::clone(sweep_now);
    let job = Job::new(cron, move |_, _| wake.notify_one())
        .map_err(|e| Error::Scheduler(e.to_string()))?;
    scheduler
        .add(job)
        .await
        .map_err(|e| Error::Scheduler(e.to_string()))?;
    scheduler
        .start()
        .await
        .map_err(|e| Error::Scheduler(e.to_string()))?;
    Ok(scheduler)
}

/// Sweeps every remote when woken (cron ticks and leadership gains), leader only.
fn sweeper_task(sup: &Supervisor, rt: &Arc<Runtime>, sweep_now: &Arc<Notify>, args: &Args) {
    let rt = Arc::clone(rt);
    let sweep_now = Arc::clone(sweep_now);
    let namespaces = args.watch_namespaces.clone();
    let timeout = Duration::from_secs(args.sweep_list_timeout_seconds);
    sup.spawn_until_shutdown("sweeper", async move {
        loop {
            sweep_now.notified().await;
            if !rt.leader.is_leader() {
                continue;
            }
            let changed = sweeper::sweep_logged(&rt.ctx, &namespaces, timeout).await;
            rt.enqueue(changed);
        }
    });
}

/// On every leadership gain: sweep (fresh listings, no cache needed), and reconcile every leader
/// of each remote as soon as that remote's caches are complete; a broken remote does not hold
/// the others back.
fn resync_on_gain(sup: &Supervisor, rt: &Arc<Runtime>, sweep_now: &Arc<Notify>) {
    let rt = Arc::clone(rt);
    let sweep_now = Arc::clone(sweep_now);
    let mut leader = rt.leader.clone();
    sup.spawn_until_shutdown("resync on leadership gain", async move {
        let mut was_leader = false;
        loop {
            // every renewal is published: a gain, or a renewal after keys were dropped (a Lease
            // that lapsed unseen between two renewals), starts a full pass
            let leading = leader.is_leader();
            let gained = leading && !was_leader;
            let redo = leading && rt.take_dropped();
            was_leader = leading;
            if gained {
                sweep_now.notify_one();
            }
            if gained || redo {
                let mut pending = rt.ctx.remotes.states();
                while !pending.is_empty() && rt.leader.is_leader() {
                    // keys dropped meanwhile (by a remote that stays unready, say) are not held
                    // back: every remote already passed is passed again
                    if rt.take_dropped() {
                        pending = rt.ctx.remotes.states();
                    }
                    pending.retain(|s| !resync_when_ready(&rt, s));
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
            if leader.changed().await.is_err() {
                // the election ended: the supervisor reports it; nothing to resync meanwhile
                std::future::pending::<()>().await;
            }
        }
    });
}

/// Gauges: followers, remote health.
fn gauges(sup: &Supervisor, rt: &Arc<Runtime>) {
    let rt = Arc::clone(rt);
    sup.spawn_until_shutdown("gauges", async move {
        loop {
            let m = &rt.ctx.metrics;
            let conflicts = rt.ctx.conflict_counts();
            for s in rt.ctx.remotes.states() {
                let remote = labels([("remote", &s.name)]);
                let n = read(&s.services)
                    .keys()
                    .filter(|k| s.in_scope(&k.0))
                    .count();
                m.followers.get_or_create(&remote).set(n as i64);
                for kind in crate::desired::ConflictKind::LABELS {
                    let n = conflicts
                        .get(&(s.name.to_string(), kind))
                        .copied()
                        .unwrap_or(0);
                    m.export_conflicts
                        .get_or_create(&labels([("remote", &s.name), ("kind", kind)]))
                        .set(n);
                }
                m.remote_up
                    .get_or_create(&remote)
                    .set(i64::from(s.problem().is_none()));
                if let Some(secs) = s.seconds_since_list() {
                    m.since_list.get_or_create(&remote).set(secs);
                }
                if let Some(exp) = s.credential.get().and_then(|c| c.expiry) {
                    m.credential_expiry
                        .get_or_create(&remote)
                        .set(exp.as_second());
                }
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    });
}
