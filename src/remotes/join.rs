//! Joining: a remote becomes a member (its metric series, its caches, its watches), from the
//! flags at start or from a Secret at run time.
use std::sync::Arc;
use std::time::Duration;

use kube::runtime::events::EventType;
use tracing::{error, warn};

use super::Settings;
use crate::client::{self, Clients, Remote};
use crate::desired::addresses::AddressPolicy;
use crate::reconcile::resync;
use crate::reconcile::worker::Controller;
use crate::runtime::metrics::ByKindReason;
use crate::runtime::supervisor::Supervisor;
use crate::state::{Member, Origin, RemoteState};

/// How long start-up waits for the static remote's cluster id.
const STATIC_ID_WAIT: Duration = Duration::from_secs(5);

/// What is known of a remote when it joins, besides its client.
pub struct Known {
    /// the uid of its kube-system namespace
    pub cluster_id: Option<String>,
    /// its outage policy (see [`super::outage`])
    pub stale_after: Option<Duration>,
    /// the networks its addresses must be in (empty: any that is not local, unless strict)
    pub allowed_cidrs: Vec<ipnet::IpNet>,
    /// its data-path probe (see [`super::probe`])
    pub probe_after: Option<Duration>,
    /// what it may cost (see `crate::state::budget`)
    pub budget: crate::state::budget::Limits,
    /// whether its ExternalName Services are mirrored
    pub allow_external_name: bool,
}

/// Makes a remote a member: its metric series, its caches in the set of remotes, its watches
/// (which end when it leaves). A member of the same name is replaced (its watches cancelled).
pub fn join(
    sup: &Supervisor,
    ctl: &Arc<Controller>,
    remote: &Remote,
    known: Known,
    origin: Origin,
    settings: &Settings,
) -> Arc<Member> {
    let cluster_id = known.cluster_id.clone();
    let mut opts = settings.opts.for_remote(&remote.name, cluster_id.clone());
    opts.allow_external_name = known.allow_external_name;
    ctl.metrics().init_remote(&remote.name);
    let addresses = AddressPolicy {
        allowed: known.allowed_cidrs,
        strict: settings.strict_addresses,
    };
    let state = RemoteState::new(&remote.name, opts, settings.namespaces.clone())
        .with_stale_after(known.stale_after)
        .with_probe_after(known.probe_after)
        .with_addresses(addresses)
        .with_budget(known.budget)
        .with_mcs(settings.mcs, cluster_id.as_deref());
    let member = ctl.remotes().insert(Member {
        state: Arc::new(state),
        client: remote.client.clone(),
        cluster_id,
        origin,
        cancel: sup.child_token(),
    });
    crate::watch::remote::start(sup, ctl, &member, settings.watch_timeout());
    if let Some(cluster) = &member.state.mcs {
        let source = crate::watch::mcs::Source {
            cluster: Arc::clone(cluster),
            client: remote.client.clone(),
            namespaces: settings.namespaces.clone(),
            timeout: settings.watch_timeout(),
            stop: member.cancel.clone(),
            guard: Some(Arc::clone(&member.state) as Arc<dyn crate::watch::Guard>),
        };
        crate::watch::mcs::source(sup, ctl, source);
    }
    // a remote that joins a running leader: every one of its exported Services once its caches
    // complete
    let (ctl, state) = (Arc::clone(ctl), Arc::clone(&member.state));
    let name = format!("remote {} first pass", remote.name);
    sup.spawn_until(name, member.cancel.clone(), async move {
        resync::when_joined(&ctl, &state).await;
        std::future::pending::<()>().await
    });
    member
}

/// The static remote (flags), with its cluster id: recorded on its followers and as the MCS
/// source-cluster of its slices; a remote that does not answer at start is read without it. One
/// that answers with a kube-system uid that is no UUID is not read at all (shown on /readyz, an
/// Event, `xcc_remote_refusals_total{kind="static"}`): its followers are kept as they are.
pub async fn static_remotes(
    sup: &Supervisor,
    ctl: &Arc<Controller>,
    clients: &Clients,
    settings: &Settings,
) {
    for remote in &clients.remotes {
        let id = match client::cluster_id(&remote.client, STATIC_ID_WAIT).await {
            Ok(id) => Some(id.into_string()),
            Err(client::ClusterIdError::NotAUuid(why)) => {
                refuse_static(ctl, &remote.name, &why).await;
                continue;
            }
            Err(why) => {
                warn!(remote = %remote.name, "cluster id unknown: {why}");
                None
            }
        };
        let known = Known {
            cluster_id: id,
            stale_after: settings.stale_after,
            allowed_cidrs: settings.allowed_cidrs.clone(),
            // a Secret remote's annotation only
            probe_after: None,
            budget: settings.budget,
            allow_external_name: settings.allow_external_name,
        };
        let member = join(sup, ctl, remote, known, Origin::Static, settings);
        if let Ok((cfg, _)) = client::remote_config(&settings.client).await {
            let _ = member
                .state
                .credential
                .set(super::credentials::credential(&cfg.auth_info));
        }
    }
}

/// The kind the refusal metric gives the static remote.
const STATIC: &str = "static";

/// The static remote answered with a uid that is no UUID: it is not read (until a restart).
async fn refuse_static(ctl: &Arc<Controller>, name: &str, why: &client::NotAUuid) {
    let reason = "NotAUuid";
    let said = format!(
        "its server's kube-system uid {why}: remote {name:?} refused, nothing of it is read (its followers are kept)"
    );
    error!(remote = %name, "{said}");
    let metrics = ctl.metrics();
    metrics.init_refusals(STATIC, &[reason]);
    metrics
        .remote_refusals
        .get_or_create(&ByKindReason::new(STATIC, reason))
        .inc();
    let source = format!("remote {name} (--kubeconfig/--remote-context)");
    ctl.remotes()
        .set_problem(&source, format!("not a remote: {said}"));
    // on the daemon's Lease: the note names what was refused first, as a profile's does
    let note = format!("{source}: {said}");
    ctl.event(EventType::Warning, "RemoteRefused", note, "Join", None)
        .await;
}
