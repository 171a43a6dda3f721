//! The watches of the local cluster's own networks (see `state::networks`): Nodes (addresses and
//! pod CIDRs), ServiceCIDRs, the API server's EndpointSlices (`default/kubernetes`), every
//! Service's external and load-balancer IPs, and the pod pools of the CNIs that publish them
//! elsewhere (Calico's IPPools, Cilium's CiliumNodes: an API not served is an empty part, and
//! is asked again with the watcher's backoff in case it is installed later). Only what names a
//! network (and a node's zone) is kept of each object, and nothing of an object that names none. A change after the first listing queues every
//! key, so an address that became local leaves every follower and import at once.
use std::net::IpAddr;
use std::sync::Arc;

use futures::StreamExt;
use ipnet::IpNet;
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tracing::{info, warn};

use crate::desired::addresses::Refusal;
use crate::reconcile::worker::Controller;
use crate::runtime::supervisor::Supervisor;
use crate::state::networks::{Entry, Part};
use crate::state::service_ips::{Holder, charged_to};

/// The namespace and Service whose endpoints are the local API server's.
const API_NAMESPACE: &str = "default";
const API_SERVICE: &str = "kubernetes";
/// The label naming a node's zone.
const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

/// Calico's IPPools (`spec.cidr`).
fn calico_pools() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(
        "crd.projectcalico.org",
        "v1",
        "IPPool",
    ))
}

/// Cilium's CiliumNodes (`spec.ipam.podCIDRs`, and `spec.ipam.pools.allocated[].cidrs` in its
/// multi-pool mode).
fn cilium_nodes() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk("cilium.io", "v2", "CiliumNode"))
}

/// Starts the watches.
pub fn start(sup: &Supervisor, ctl: &Arc<Controller>, local: &Client, timeout: u32) {
    let cfg = watcher::Config::default().timeout(timeout);
    follow(
        sup,
        ctl,
        Api::<Node>::all(local.clone()),
        cfg.clone(),
        Part::Nodes,
        node,
        None,
    );
    follow(
        sup,
        ctl,
        Api::<ServiceCIDR>::all(local.clone()),
        cfg.clone(),
        Part::ServiceCidrs,
        service_cidr,
        None,
    );
    let api_slices = cfg
        .clone()
        .labels(&format!("kubernetes.io/service-name={API_SERVICE}"));
    follow(
        sup,
        ctl,
        Api::<EndpointSlice>::namespaced(local.clone(), API_NAMESPACE),
        api_slices,
        Part::ApiServer,
        api_server,
        None,
    );
    follow(
        sup,
        ctl,
        Api::<Service>::all(local.clone()),
        cfg.clone(),
        Part::Services,
        service,
        Some(charged_to as Charge<Service>),
    );
    follow(
        sup,
        ctl,
        Api::<DynamicObject>::all_with(local.clone(), &calico_pools()),
        cfg.clone(),
        Part::CalicoPools,
        calico_pool,
        None,
    );
    follow(
        sup,
        ctl,
        Api::<DynamicObject>::all_with(local.clone(), &cilium_nodes()),
        cfg,
        Part::CiliumNodes,
        cilium_node,
        None,
    );
}

fn follow<K>(
    sup: &Supervisor,
    ctl: &Arc<Controller>,
    api: Api<K>,
    cfg: watcher::Config,
    part: Part,
    extract: fn(&K) -> Entry,
    charge: Option<Charge<K>>,
) where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let ctl = Arc::clone(ctl);
    let name = format!("local {} watch", part.what());
    sup.spawn_until_shutdown(name, async move {
        let mut stream = std::pin::pin!(watcher(api, cfg).default_backoff());
        let mut said_not_served = false;
        while let Some(event) = stream.next().await {
            if let (Some(charge), Ok(event)) = (charge, &event) {
                tally(&ctl, charge, event);
            }
            let networks = &ctl.local().networks;
            let was_ready = networks.ready();
            let changed = match event {
                Ok(Event::Init) => {
                    networks.relist(part);
                    false
                }
                Ok(Event::InitApply(o) | Event::Apply(o)) => {
                    networks.apply(part, key(&o), extract(&o))
                }
                Ok(Event::Delete(o)) => networks.delete(part, &key(&o)),
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
                Err(e) if optional(part) && not_served(&e) => {
                    if !said_not_served {
                        info!("the local cluster does not serve {}: none of its networks there", part.what());
                        said_not_served = true;
                    }
                    networks.listed(part)
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

/// Whom a local Service's ClusterIP is charged to (see `state::service_ips`).
type Charge<K> = fn(&K, &crate::desired::Options) -> Option<Holder>;

/// Keeps the tally of the ClusterIPs our Services hold; an address freed passes again the keys
/// that waited for one.
fn tally<K: Resource>(ctl: &Controller, charge: Charge<K>, event: &Event<K>) {
    let ips = &ctl.local().service_ips;
    let freed = match event {
        Event::Init => {
            ips.relist();
            false
        }
        Event::InitApply(o) | Event::Apply(o) => ips.apply(key(o), charge(o, ctl.opts())),
        Event::Delete(o) => ips.apply(key(o), None),
        Event::InitDone => ips.listed(),
    };
    if freed {
        let waiting = ips.waiting();
        if !waiting.is_empty() {
            ctl.enqueue(waiting);
        }
    }
}

/// A part some clusters do not serve at all (a CNI's own API).
fn optional(part: Part) -> bool {
    matches!(part, Part::CalicoPools | Part::CiliumNodes)
}

/// An object's key in its part: namespace/name (cluster-scoped: /name).
fn key<K: Resource>(o: &K) -> String {
    format!("{}/{}", o.namespace().unwrap_or_default(), o.name_any())
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

/// A Service's `externalIPs` and load-balancer ingress IPs (a hostname ingress names no IP).
fn service(s: &Service) -> Entry {
    let external = s.spec.as_ref().and_then(|s| s.external_ips.as_ref());
    let ingress = s
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref());
    let texts = external
        .into_iter()
        .flatten()
        .chain(ingress.into_iter().flatten().filter_map(|i| i.ip.as_ref()));
    Entry {
        addresses: ips(texts, Refusal::LocalServiceAddress),
        ..Entry::default()
    }
}

/// The strings at `path` of an object's data, one level of arrays flattened at each `[]` step.
fn strings_at<'a>(data: &'a serde_json::Value, path: &[&str]) -> Vec<&'a String> {
    let mut here = vec![data];
    for step in path {
        here = here
            .into_iter()
            .flat_map(|v| match (*step, v) {
                ("[]", serde_json::Value::Array(items)) => items.iter().collect(),
                ("[]", _) => vec![],
                (field, v) => v.get(field).into_iter().collect(),
            })
            .collect();
    }
    here.into_iter()
        .filter_map(|v| match v {
            serde_json::Value::String(s) => Some(s),
            _ => None,
        })
        .collect()
}

/// A Calico IPPool's CIDR.
fn calico_pool(o: &DynamicObject) -> Entry {
    Entry {
        nets: nets(
            strings_at(&o.data, &["spec", "cidr"]),
            Refusal::LocalPodNetwork,
        ),
        ..Entry::default()
    }
}

/// A CiliumNode's pod CIDRs (cluster-pool mode) and its multi-pool allocations.
fn cilium_node(o: &DynamicObject) -> Entry {
    let cluster_pool = strings_at(&o.data, &["spec", "ipam", "podCIDRs", "[]"]);
    let multi_pool = strings_at(
        &o.data,
        &["spec", "ipam", "pools", "allocated", "[]", "cidrs", "[]"],
    );
    Entry {
        nets: nets(
            cluster_pool.into_iter().chain(multi_pool),
            Refusal::LocalPodNetwork,
        ),
        ..Entry::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_service_gives_its_external_and_load_balancer_ips() {
        let s: Service = serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "shop"},
            "spec": {"clusterIP": "10.96.0.9", "externalIPs": ["198.51.100.4", "not-an-ip"]},
            "status": {"loadBalancer": {"ingress": [
                {"ip": "203.0.113.7"}, {"hostname": "lb.example.com"},
            ]}},
        }))
        .unwrap();
        let got: Vec<String> = service(&s)
            .addresses
            .iter()
            .map(|(ip, _)| ip.to_string())
            .collect();
        assert_eq!(got, ["198.51.100.4", "203.0.113.7"]);
        let plain: Service = serde_json::from_value(json!({"metadata": {"name": "db"}})).unwrap();
        assert_eq!(service(&plain), Entry::default());
    }

    #[test]
    fn the_cnis_pools_are_pod_networks() {
        let pool: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "crd.projectcalico.org/v1", "kind": "IPPool",
            "metadata": {"name": "default-ipv4-ippool"},
            "spec": {"cidr": "192.168.0.0/16", "ipipMode": "Always"},
        }))
        .unwrap();
        assert_eq!(
            calico_pool(&pool).nets,
            vec![("192.168.0.0/16".parse().unwrap(), Refusal::LocalPodNetwork)]
        );
        let node: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "cilium.io/v2", "kind": "CiliumNode",
            "metadata": {"name": "node-1"},
            "spec": {"ipam": {
                "podCIDRs": ["10.0.1.0/24"],
                "pools": {"allocated": [{"pool": "default", "cidrs": ["10.10.0.0/27", "10.10.0.32/27"]}]},
            }},
        }))
        .unwrap();
        let got: Vec<String> = cilium_node(&node)
            .nets
            .iter()
            .map(|(n, _)| n.to_string())
            .collect();
        assert_eq!(got, ["10.0.1.0/24", "10.10.0.0/27", "10.10.0.32/27"]);
        // a shape it does not know names nothing
        let odd: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "cilium.io/v2", "kind": "CiliumNode",
            "metadata": {"name": "node-2"}, "spec": {"ipam": {"podCIDRs": "10.0.2.0/24"}},
        }))
        .unwrap();
        assert_eq!(cilium_node(&odd), Entry::default());
    }

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
