//! Remotes from Secrets: each Secret of the daemon's namespace selected by
//! `--remote-secret-selector` names one remote cluster (data key `kubeconfig`; the name from its
//! label or annotation `fair.com/cross-cluster-name`, else the Secret's name). Joined, rotated and
//! retired as [`super::source`] says.
use std::sync::Arc;

use k8s_openapi::api::core::v1::{ObjectReference, Secret};
use kube::api::Api;
use kube::{Client, Resource};
use prometheus_client::metrics::gauge::Gauge;

use super::remote_secret::{Candidate, read_secret};
use super::source::{Kind, Refused, Source};
use super::{SecretSource, Settings};
use crate::client::Clients;
use crate::reconcile::worker::Controller;
use crate::runtime::metrics::Metrics;
use crate::runtime::supervisor::Supervisor;
use crate::state::Origin;

/// Secrets of the daemon's namespace.
pub struct Secrets {
    local: Client,
    from: SecretSource,
}

impl Kind for Secrets {
    type Object = Secret;
    const KIND: &'static str = "Secret";

    fn api(&self) -> Api<Secret> {
        Api::namespaced(self.local.clone(), &self.from.namespace)
    }

    fn selector(&self) -> &str {
        &self.from.selector
    }

    fn namespace(&self) -> &str {
        &self.from.namespace
    }

    fn remote_name(&self, s: &Secret) -> String {
        super::remote_secret::remote_name(s)
    }

    async fn candidate(&mut self, s: &Secret) -> Result<Candidate, Refused> {
        read_secret(s).map_err(Refused::Unreadable)
    }

    fn origin(&self, object: &str, hash: String) -> Origin {
        Origin::Secret {
            name: object.to_string(),
            hash,
        }
    }

    fn reference(&self, s: &Secret) -> Option<ObjectReference> {
        Some(s.object_ref(&()))
    }

    fn refused_gauge(metrics: &Metrics) -> &Gauge {
        &metrics.remote_secrets_refused
    }
}

/// Remotes from the Secrets of the daemon's namespace: joined, rotated and retired at run time.
pub async fn spawn(
    sup: &Supervisor,
    ctl: &Arc<Controller>,
    clients: &Clients,
    settings: (&Settings, &SecretSource),
) {
    let (settings, from) = settings;
    // not complete until listed: set before anything else can read the registry
    ctl.remotes()
        .unlisted(&super::source::listing_source::<Secrets>(&from.namespace));
    let kind = Secrets {
        local: clients.local.clone(),
        from: from.clone(),
    };
    let local = super::source::local_cluster(clients, settings).await;
    let source = Source::new(
        kind,
        Arc::clone(ctl),
        sup.clone(),
        Arc::new(settings.clone()),
        from.removal_grace,
        local,
    );
    sup.spawn_until_shutdown("remote Secrets", source.run());
}
