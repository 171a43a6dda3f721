//! Wiring only: watches feed the caches and the work queue; workers reconcile; the Lease decides
//! who writes; the sweeper, the remotes' tasks and the admin server sit beside them. Every task
//! runs under the supervisor: one that ends early shuts the process down with an error.
//! SIGTERM/SIGINT drain it all.
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::sync::Notify;
use tracing::info;

use crate::client::{self, Clients};
use crate::error::{Error, Result};
use crate::reconcile::{self, Ctx, resync, sweep, worker};
use crate::remotes::{self, credentials, gauges, health, join, outage, probe};
use crate::runtime::lease::{self, LeaseConfig};
use crate::runtime::supervisor::Supervisor;
use crate::runtime::{admin, metrics::Metrics, queue::WorkQueue, schedule, signals};

/// Everything the daemon is configured with, one part per component (built from the flags by
/// [`crate::cli::args`]).
#[derive(Clone, Debug)]
pub struct Config {
    pub client: client::Settings,
    pub remotes: remotes::Settings,
    /// None: no Secret remotes
    pub secrets: Option<remotes::SecretSource>,
    /// None: no ClusterProfile remotes
    pub profiles: Option<remotes::profiles::ProfileSource>,
    pub reconcile: reconcile::Settings,
    pub lease: LeaseConfig,
    pub sweep: sweep::Settings,
    /// six-field cron expression of the sweep
    pub sweep_cron: String,
    pub health_interval: Duration,
    pub renew_before: credentials::RenewBefore,
    pub admin_bind: SocketAddr,
    pub workers: u16,
    /// the most keys of one source cluster in process at once (0: no cap)
    pub workers_per_remote: u16,
}

pub async fn run(config: Config) -> Result<()> {
    let clients = client::build(&config.client).await?;
    let metrics = Arc::new(Metrics::new());
    let sup = Supervisor::new(tokio_util::sync::CancellationToken::new());
    signals::handle(sup.shutdown_token());
    let listener = tokio::net::TcpListener::bind(config.admin_bind)
        .await
        .map_err(|e| Error::Config(format!("--admin-bind {}: {e}", config.admin_bind)))?;
    log_start(&config, &clients, &listener);
    let (local, dry_run) = (&clients.local, config.reconcile.dry_run);
    let lease = config.lease.clone();
    let noted = Arc::new(OnceLock::new());
    let notes = lease_notes(Arc::clone(&noted));
    let (leader, lease_task) = lease::elect_or_assume(&sup, local, lease, dry_run, &metrics, notes);
    let ctx = Arc::new(Ctx::new(config.reconcile.clone(), local, &leader, &metrics));
    // the Lease's notes read the context from here on (before it exists, they say nothing)
    let _ = noted.set(Arc::clone(&ctx));
    let queue = WorkQueue::with_lane_cap(usize::from(config.workers_per_remote));
    let ctl = Arc::new(worker::Controller::new(ctx.clone(), queue.clone(), leader));
    let timeout = config.remotes.watch_timeout();

    if let Some(mcs) = &ctx.mcs {
        crate::watch::mcs::preflight(local, mcs).await?;
        metrics.init_mcs();
        let source = crate::watch::mcs::Source {
            cluster: std::sync::Arc::clone(&mcs.source),
            client: local.clone(),
            namespaces: config.reconcile.namespaces.clone(),
            timeout,
            stop: sup.child_token(),
            guard: None,
        };
        crate::watch::mcs::source(&sup, &ctl, source);
        crate::watch::mcs::destination(&sup, &ctl, local, mcs, timeout);
    }
    join::static_remotes(&sup, &ctl, &clients, &config.remotes).await;
    crate::watch::local::followers(&sup, &ctl, local, timeout);
    crate::watch::local::namespaces(&sup, &ctl, local, timeout);
    crate::watch::networks::start(&sup, &ctl, local, timeout);
    sup.spawn_until_shutdown("work queue delays", Arc::clone(&queue).delays());
    let workers: Vec<_> = (0..config.workers)
        .map(|i| sup.spawn(format!("worker {i}"), worker::run(Arc::clone(&ctl))))
        .collect();
    let sweep_now = Arc::new(Notify::new());
    if let Some(from) = &config.secrets {
        let settings = (&config.remotes, from);
        remotes::secrets::spawn(&sup, &ctl, &clients, settings).await;
    }
    if let Some(from) = &config.profiles {
        let settings = (&config.remotes, from);
        remotes::profiles::spawn(&sup, &ctl, &clients, settings)
            .await
            .map_err(Error::Config)?;
    }
    remote_tasks(&sup, &ctl, &clients, &config);
    let schedule = schedule::spawn(&sup, &config.sweep_cron, &sweep_now).await?;
    sweep::spawn(&sup, &ctl, &sweep_now, config.sweep.clone());
    resync::on_gain(&sup, &ctl, &sweep_now);
    resync::mcs_on_gain(&sup, &ctl);
    let admin_state = admin::AdminState {
        metrics: Arc::clone(&metrics),
        remotes: Arc::clone(&ctx.remotes),
        local: Arc::clone(&ctx.local),
        mcs: ctx.mcs.clone(),
    };
    admin::spawn(&sup, listener, admin_state);

    sup.shutdown_token().cancelled().await;
    queue.close();
    for w in workers {
        let _ = tokio::time::timeout(Duration::from_secs(10), w).await;
    }
    let _ = tokio::time::timeout(Duration::from_secs(5), schedule).await;
    let _ = tokio::time::timeout(Duration::from_secs(6), lease_task).await;
    match sup.failure() {
        Some(why) => Err(Error::TaskEnded(why)),
        None => {
            info!("stopped");
            Ok(())
        }
    }
}

/// The remotes' own tasks: health Leases, the outage policy, token renewal; and their gauges.
fn remote_tasks(
    sup: &Supervisor,
    ctl: &Arc<worker::Controller>,
    clients: &Clients,
    config: &Config,
) {
    let local = clients.local.clone();
    let health = health::Keeper::new(
        Arc::clone(ctl),
        local,
        &config.lease,
        config.health_interval,
    );
    sup.spawn_until_shutdown("remote health Leases", health.run());
    sup.spawn_until_shutdown("outage policy", outage::run(Arc::clone(ctl)));
    sup.spawn_until_shutdown("data-path probe", probe::run(Arc::clone(ctl)));
    let renewer = credentials::Renewer::new(
        Arc::clone(ctl),
        &config.lease.namespace,
        (config.renew_before, config.remotes.api_timeout),
        config.reconcile.dry_run,
        config.remotes.client.allow_exec.clone(),
    );
    sup.spawn_until_shutdown("remote token renewal", renewer.run());
    gauges::publish(ctl);
}

/// What the leader says on its Lease for `status`: how many local pod networks it knows, once the
/// local networks are listed (none known: a remote may name a local pod's address).
fn lease_notes(ctx: Arc<OnceLock<Arc<Ctx>>>) -> lease::Notes {
    Arc::new(move || {
        let Some(ctx) = ctx.get() else {
            return BTreeMap::new();
        };
        let networks = &ctx.local.networks;
        let known =
            (networks.problem().is_none()).then(|| networks.current().pod_ranges().to_string());
        BTreeMap::from([(ctx.opts.annotation(admin::POD_NETWORKS_NOTE), known)])
    })
}

fn log_start(config: &Config, clients: &Clients, listener: &tokio::net::TcpListener) {
    let local = if config.client.devmode {
        "kubeconfig (dev mode)"
    } else {
        "in-cluster (service account token and CA, KUBERNETES_SERVICE_HOST/PORT)"
    };
    info!(
        version = env!("CARGO_PKG_VERSION"),
        identity = %config.lease.identity,
        local,
        local_server = %clients.local_authority,
        remote = %clients.remotes.iter().map(|r| r.name.as_str()).collect::<Vec<_>>().join(","),
        label_key = %config.reconcile.opts.label_key,
        mcs = config.reconcile.mcs.is_some(),
        dry_run = config.reconcile.dry_run,
        admin = %listener.local_addr().map(|a| a.to_string()).unwrap_or_default(),
        "starting"
    );
}
