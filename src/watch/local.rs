//! The local watches: our followers (drift or a manual deletion queues the key again) and the
//! namespaces (one that appears releases the exported Services that waited for it).
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Endpoints, Namespace, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::core::PartialObjectMeta;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, watcher};
use kube::{Api, Client};
use tracing::warn;

use super::{spawn, spec};
use crate::reconcile::worker::Controller;
use crate::runtime::supervisor::Supervisor;
use crate::state::LOCAL;

/// Starts the watches of our local followers: Services, EndpointSlices and Endpoints.
pub fn followers(sup: &Supervisor, ctl: &Arc<Controller>, local: &Client, timeout: u32) {
    let sel = format!("{}=follower", ctl.opts().label_key);
    let on_change = || {
        let ctl = Arc::clone(ctl);
        move |keys| ctl.enqueue(keys)
    };
    let what = |kind: &str| format!("local follower {kind}");
    let (m, ns) = (ctl.metrics(), ctl.namespaces());
    let s = || Arc::clone(ctl.local());
    let stop = &sup.child_token();
    let services = spec::<Service>(local, ns, timeout, sel.clone(), LOCAL, what("Services"));
    spawn(sup, m, stop, services, (s(), |s| &s.services), on_change());
    let slices = spec::<EndpointSlice>(
        local,
        ns,
        timeout,
        sel.clone(),
        LOCAL,
        what("EndpointSlices"),
    );
    spawn(sup, m, stop, slices, (s(), |s| &s.slices), on_change());
    let endpoints = spec::<Endpoints>(local, ns, timeout, sel, LOCAL, what("Endpoints"));
    spawn(
        sup,
        m,
        stop,
        endpoints,
        (s(), |s| &s.endpoints),
        on_change(),
    );
}

/// Starts the watch of local namespaces: one that appears queues the exported Services of every
/// remote in it.
pub fn namespaces(sup: &Supervisor, ctl: &Arc<Controller>, local: &Client, timeout: u32) {
    let ctl = Arc::clone(ctl);
    let api: Api<PartialObjectMeta<Namespace>> = Api::all(local.clone());
    let cfg = watcher::Config::default().timeout(timeout);
    sup.spawn_until_shutdown("local namespace watch", async move {
        let stream = watcher(api, cfg).default_backoff().applied_objects();
        let mut stream = std::pin::pin!(stream);
        while let Some(ns) = stream.next().await {
            match ns {
                Ok(ns) => {
                    if let Some(name) = ns.metadata.name {
                        ctl.namespace_appeared(&name);
                    }
                }
                Err(e) => warn!(error = %e, "local namespace watch failed; retrying"),
            }
        }
    });
}
