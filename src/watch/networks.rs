//! The watches of the local cluster's own networks (see `state::networks`): Nodes (addresses and
//! pod CIDRs), ServiceCIDRs, and the API server's EndpointSlices (`default/kubernetes`). Only
//! what names a network (and a node's zone) is kept of each object. A change after the first listing queues every
//! key, so an address that became local leaves every follower and import at once.
use std::net::IpAddr;
use std::sync::Arc;

use futures::StreamExt;
use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tracing::{info, warn};

use crate::desired::addresses::Refusal;
use crate::reconcile::worker::Controller;
use crate::runtime::supervisor::Supervisor;
use crate::state::networks::{Entry, Part};

/// The namespace and Service whose endpoints are the local API server's.
const API_NAMESPACE: &str = "default";
const API_SERVICE: &str = "kubernetes";
/// The label naming a node's zone.
const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

/// Starts the three watches.
pub fn start(sup: &Supervisor, ctl: &Arc<Controller>, local: &Client, timeout: u32) {
    let cfg = watcher::Config::default().timeout(timeout);
    follow(
        sup,
        ctl,
        Api::<Node>::all(local.clone()),
        cfg.clone(),
        Part::Nodes,
        node,
    );
    follow(
        sup,
        ctl,
        Api::<ServiceCIDR>::all(local.clone()),
        cfg.clone(),
        Part::ServiceCidrs,
        service_cidr,
    );
    let api_slices = cfg.labels(&format!("kubernetes.io/service-name={API_SERVICE}"));
    follow(
        sup,
        ctl,
        Api::<EndpointSlice>::namespaced(local.clone(), API_NAMESPACE),
        api_slices,
        Part::ApiServer,
        api_server,
    );
}

fn follow<K>(
    sup: &Supervisor,
    ctl: &Arc<Controller>,
    api: Api<K>,
    cfg: watcher::Config,
    part: Part,
    extract: fn(&K) -> Entry,
) where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let ctl = Arc::clone(ctl);
    let name = format!("local {} watch", part.what());
    sup.spawn_until_shutdown(name, async move {
        let mut stream = std::pin::pin!(watcher(api, cfg).default_backoff());
        while let Some(event) = stream.next().await {
            let networks = &ctl.local().networks;
            let was_ready = networks.ready();
            let changed = match event {
                Ok(Event::Init) => {
                    networks.relist(part);
                    false
                }
                Ok(Event::InitApply(o) | Event::Apply(o)) => {
                    networks.apply(part, o.name_any(), extract(&o))
                }
                Ok(Event::Delete(o)) => networks.delete(part, &o.name_any()),
                Ok(Event::InitDone) => networks.listed(part),
                Err(e) if part == Part::ServiceCidrs && not_served(&e) => {
                    info!(
                        "the local cluster does not serve ServiceCIDRs (networking.k8s.io/v1, Kubernetes 1.33+): its Service network is refused only through --local-cidrs"
                    );
                    networks.listed(part);
                    if networks.ready() {
                        ctl.enqueue_everything();
                    }
                    std::future::pending::<bool>().await
                }
                Err(e) => {
                    warn!(error = %e, "local {} watch failed; retrying (no remote address is admitted until it is listed)", part.what());
                    networks.set_problem(part, one_line(&e));
                    false
                }
            };
            // the first complete set releases what waited for it (an MCS pass that found it
            // unlisted is not queued again by anything else); a change passes every key again
            if networks.ready() && (changed || !was_ready) {
                let (addresses, nets) = networks.current().size();
                info!(addresses, nets, "local networks listed or changed; passing every key again");
                ctl.enqueue_everything();
            }
        }
    });
}

fn not_served(e: &watcher::Error) -> bool {
    matches!(e, watcher::Error::InitialListFailed(kube::Error::Api(s)) if s.code == 404)
}

fn one_line(e: &impl std::fmt::Display) -> String {
    e.to_string().replace('\n', " ").chars().take(300).collect()
}

fn ips<'a>(texts: impl IntoIterator<Item = &'a String>, why: Refusal) -> Vec<(IpAddr, Refusal)> {
    texts
        .into_iter()
        .filter_map(|t| t.parse::<IpAddr>().ok())
        .map(|ip| (ip, why))
        .collect()
}

fn nets<'a>(texts: impl IntoIterator<Item = &'a String>, why: Refusal) -> Vec<(IpNet, Refusal)> {
    texts
        .into_iter()
        .filter_map(|t| t.parse::<IpNet>().ok())
        .map(|n| (n, why))
        .collect()
}

/// A node's addresses (every type that is an IP: InternalIP, ExternalIP) and pod CIDRs.
fn node(n: &Node) -> Entry {
    let addresses = n
        .status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .map(|a| a.iter().map(|a| &a.address).collect::<Vec<_>>())
        .unwrap_or_default();
    let spec = n.spec.as_ref();
    let pod_cidrs = spec
        .and_then(|s| s.pod_cidrs.as_ref())
        .into_iter()
        .flatten()
        .chain(spec.and_then(|s| s.pod_cidr.as_ref()));
    Entry {
        addresses: ips(addresses, Refusal::LocalNode),
        nets: nets(pod_cidrs, Refusal::LocalPodNetwork),
        zone: n
            .labels()
            .get(ZONE_LABEL)
            .filter(|z| !z.is_empty())
            .cloned(),
    }
}

fn service_cidr(c: &ServiceCIDR) -> Entry {
    let cidrs = c.spec.as_ref().and_then(|s| s.cidrs.as_ref());
    Entry {
        addresses: vec![],
        nets: nets(cidrs.into_iter().flatten(), Refusal::LocalServiceNetwork),
        zone: None,
    }
}

fn api_server(s: &EndpointSlice) -> Entry {
    Entry {
        addresses: ips(
            s.endpoints.iter().flat_map(|e| &e.addresses),
            Refusal::LocalApiServer,
        ),
        nets: vec![],
        zone: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_node_gives_its_addresses_and_pod_cidrs() {
        let n: Node = serde_json::from_value(json!({
            "metadata": {"name": "west-node"},
            "spec": {"podCIDR": "10.201.1.0/24", "podCIDRs": ["10.201.1.0/24", "fd00:1:1::/64"]},
            "status": {"addresses": [
                {"type": "InternalIP", "address": "10.250.2.11"},
                {"type": "Hostname", "address": "west-node"},
            ]},
        }))
        .unwrap();
        let e = node(&n);
        assert_eq!(
            e.addresses,
            vec![("10.250.2.11".parse().unwrap(), Refusal::LocalNode)]
        );
        assert_eq!(
            e.nets.len(),
            3,
            "podCIDR repeats podCIDRs[0]: deduplicated later"
        );
    }
}
