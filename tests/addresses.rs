//! End to end: a remote's addresses stay inside its own networks (issue 27, the address
//! policy). A hostile remote lists the local cluster's own addresses (its API server, an address
//! of its Service network), an address outside its allowlist and an FQDN endpoint: none of them
//! reaches the follower, each is counted by reason and named in an Event; with strict mode a
//! remote without an allowlist contributes nothing until its Secret names its networks.
mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::{Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use support::daemon::{Daemon, args_for, with_args};
use support::fault::{Lost, Report, conclude, snapshot};
use support::remotes::{apply_secret, kubeconfig_of, remote_secret, secrets_only_args};
use support::{
    LOCAL, REMOTE, client, endpoint, eventually, exported, namespace, present, remote_slice,
    remote_slice_with,
};

const WAIT: Duration = Duration::from_secs(60);
/// A network no cluster of the bed uses: the remote's "own" pods.
const OWN: &str = "10.77.0.5";
const OWN_NET: &str = "10.77.0.0/16";
/// Outside OWN_NET, and no cluster's of the bed either.
const ELSEWHERE: &str = "10.78.0.5";

/// The local API server's address (the endpoint of `default/kubernetes`) and an address of the
/// local Service network (the `kubernetes` Service's ClusterIP).
async fn local_addresses() -> (String, String) {
    let west = client(LOCAL).await;
    let slices: Api<EndpointSlice> = Api::namespaced(west.clone(), "default");
    let lp = ListParams::default().labels("kubernetes.io/service-name=kubernetes");
    let api = eventually("the local API server's endpoint", WAIT, || async {
        let list = slices.list(&lp).await.map_err(|e| e.to_string())?;
        list.items
            .iter()
            .flat_map(|s| s.endpoints.iter().flat_map(|e| e.addresses.clone()))
            .next()
            .ok_or_else(|| "no endpoint yet".to_string())
    })
    .await;
    let kubernetes: Service = Api::namespaced(west, "default")
        .get("kubernetes")
        .await
        .expect("the kubernetes Service");
    let cluster_ip = kubernetes
        .spec
        .and_then(|s| s.cluster_ip)
        .expect("its ClusterIP");
    (api, cluster_ip)
}

/// Every address in the follower `svc`'s slices, sorted.
async fn follower_addresses(ns: &str, svc: &str) -> Result<Vec<String>, String> {
    let api: Api<EndpointSlice> = Api::namespaced(client(LOCAL).await, ns);
    let lp = ListParams::default().labels(&format!("kubernetes.io/service-name={svc}"));
    let list = api.list(&lp).await.map_err(|e| e.to_string())?;
    let mut out: Vec<String> = list
        .items
        .iter()
        .flat_map(|s| s.endpoints.iter().flat_map(|e| e.addresses.clone()))
        .collect();
    out.sort();
    Ok(out)
}

async fn addresses_are(ns: &str, svc: &str, want: &[&str]) {
    eventually(&format!("follower {svc} holds {want:?}"), WAIT, || async {
        let got = follower_addresses(ns, svc).await?;
        if got == want {
            Ok(())
        } else {
            Err(format!("{got:?}"))
        }
    })
    .await;
}

#[tokio::test]
async fn a_remote_listing_local_addresses_reaches_no_follower_with_them() {
    let ns = namespace("addresses-hostile").await;
    let (api, service_ip) = local_addresses().await;
    let east = client(REMOTE).await;
    let pp = PostParams::default();
    Api::<Service>::namespaced(east.clone(), &ns.name)
        .create(&pp, &exported("web", 80))
        .await
        .unwrap();
    let slices: Api<EndpointSlice> = Api::namespaced(east, &ns.name);
    let hostile = [OWN, api.as_str(), service_ip.as_str(), ELSEWHERE];
    slices
        .create(&pp, &remote_slice("web", "web-1", &hostile))
        .await
        .unwrap();
    let fqdn = remote_slice_with(
        "web",
        "web-fqdn",
        "FQDN",
        json!([{"name": "http", "port": 8080, "protocol": "TCP"}]),
        vec![endpoint("db.example.com")],
    );
    slices.create(&pp, &fqdn).await.unwrap();

    let before = snapshot(&client(LOCAL).await, &[&ns.name]).await;
    let t0 = std::time::Instant::now();
    let args = with_args(args_for(&ns.name), &["--remote-allowed-cidrs", OWN_NET]);
    let d = Daemon::start(&args).await;
    d.wait_synced(&[REMOTE]).await;
    let west: Api<Service> = Api::namespaced(client(LOCAL).await, &ns.name);
    eventually("the follower", WAIT, || present(&west, "web")).await;
    addresses_are(&ns.name, "web", &[OWN]).await;
    let took = t0.elapsed();

    for reason in [
        "LocalApiServer",
        "LocalServiceNetwork",
        "NotAllowed",
        "Fqdn",
    ] {
        d.wait_metric(
            "xcc_addresses_refused_total",
            &[("remote", REMOTE), ("reason", reason)],
            1.0,
        )
        .await;
    }
    let notes = eventually("an AddressRefused Event on the follower", WAIT, || {
        // the pass that creates the follower records it there (not on the daemon's Lease)
        support::event_notes(LOCAL, &ns.name, "AddressRefused", Some(("Service", "web")))
    })
    .await;
    assert!(
        notes
            .iter()
            .any(|n| n.contains(&api) && n.contains("the local API server")),
        "{notes:?}"
    );
    let (_, ready) = d.readyz().expect("readyz");
    assert!(ready.contains("local networks: listed"), "{ready}");

    // the remote turns every address local: the follower keeps none, and never one of them
    let mut s = slices.get("web-1").await.unwrap();
    s.endpoints = [api.as_str(), service_ip.as_str()]
        .iter()
        .map(|ip| support::obj(endpoint(ip)))
        .collect();
    slices.replace("web-1", &pp, &s).await.unwrap();
    addresses_are(&ns.name, "web", &[]).await;
    present(&west, "web")
        .await
        .expect("the follower stays: refused addresses are no proof of absence");
    let after = snapshot(&client(LOCAL).await, &[&ns.name]).await;
    conclude(
        Report {
            id: "78-contain-local-addresses",
            scenario: "A remote's slice lists the local API server's address, an address of the local Service network, an address outside its allowed CIDRs and an FQDN endpoint, beside one of its own",
            done: "a daemon with --remote-allowed-cidrs 10.77.0.0/16; then the remote lists only local addresses",
            converge: Some(took),
            note: format!(
                "the follower held only {OWN}, then none; refused LocalApiServer, LocalServiceNetwork, NotAllowed, Fqdn (each counted, an AddressRefused Event); the follower kept"
            ),
        },
        &Lost::nothing_to_lose(),
        &before.non_followers_touched(&after),
    );
}

#[tokio::test]
async fn in_strict_mode_a_remote_contributes_only_inside_the_networks_its_secret_names() {
    let ns = support::namespace_in("addresses-strict", &[REMOTE, LOCAL]).await;
    support::remotes::export(REMOTE, &ns.name, "web", "web-1", OWN).await;
    let secrets: Api<Secret> = Api::namespaced(client(LOCAL).await, &ns.name);
    let kc = kubeconfig_of(REMOTE, |_| {}).await;
    let secret = remote_secret("east", Some(REMOTE), Some(&kc));
    apply_secret(&secrets, &secret).await;
    let args = with_args(secrets_only_args(&ns.name), &["--strict-addresses"]);
    let d = Daemon::start_secrets_only(&args).await;
    d.wait_synced(&[REMOTE]).await;

    // no allowlist: the follower, but no address of the remote
    let west: Api<Service> = Api::namespaced(client(LOCAL).await, &ns.name);
    eventually("the follower", WAIT, || present(&west, "web")).await;
    d.wait_metric(
        "xcc_addresses_refused_total",
        &[("remote", REMOTE), ("reason", "NoAllowlist")],
        1.0,
    )
    .await;
    assert_eq!(
        follower_addresses(&ns.name, "web").await.unwrap(),
        Vec::<String>::new()
    );

    // the Secret names its networks (what `remote-access --allowed-cidrs` writes): a rotation
    let annotate = |value: &str| json!({"metadata": {"annotations": {"fair.com/cross-cluster-allowed-cidrs": value}}});
    secrets
        .patch(
            "east",
            &PatchParams::default(),
            &Patch::Merge(annotate(OWN_NET)),
        )
        .await
        .unwrap();
    addresses_are(&ns.name, "web", &[OWN]).await;

    // a bad annotation is refused with a clear error, and loses nothing
    secrets
        .patch(
            "east",
            &PatchParams::default(),
            &Patch::Merge(annotate("10.77.0.5, nonsense")),
        )
        .await
        .unwrap();
    eventually("the Secret refused on /readyz", WAIT, || async {
        let (_, body) = d.readyz()?;
        if body.contains("fair.com/cross-cluster-allowed-cidrs") && body.contains("is not a CIDR") {
            Ok(())
        } else {
            Err(body)
        }
    })
    .await;
    assert_eq!(
        follower_addresses(&ns.name, "web").await.unwrap(),
        vec![OWN]
    );
    assert!(west.get("web").await.unwrap().uid().is_some());
}

/// The MCS import's slices in `ns`: every address they hold, sorted.
async fn import_addresses(ns: &str, name: &str) -> Result<Vec<String>, String> {
    let api: Api<EndpointSlice> = Api::namespaced(client(LOCAL).await, ns);
    let lp =
        ListParams::default().labels(&format!("multicluster.kubernetes.io/service-name={name}"));
    let list = api.list(&lp).await.map_err(|e| e.to_string())?;
    let mut ips: Vec<String> = list
        .items
        .iter()
        .flat_map(|s| s.endpoints.iter().flat_map(|e| e.addresses.clone()))
        .collect();
    ips.sort();
    Ok(ips)
}

#[tokio::test]
async fn an_mcs_export_listing_local_addresses_reaches_no_import_with_them() {
    support::mcs::crds().await;
    let ns = namespace("addresses-mcs").await;
    let (api, service_ip) = local_addresses().await;
    let east = client(REMOTE).await;
    // east's own address, the local API server's and one of the local Service network
    support::mcs::service(&east, &ns.name, "web", 80, &[OWN, &api, &service_ip]).await;
    support::mcs::export(&east, &ns.name, "web").await;
    let args = with_args(
        args_for(&ns.name),
        &["--mcs", "--local-cluster-name", LOCAL],
    );
    let before = snapshot(&client(LOCAL).await, &[&ns.name]).await;
    let t0 = std::time::Instant::now();
    let d = Daemon::start(&args).await;
    support::mcs::import_listing(&client(LOCAL).await, &ns.name, "web", &[REMOTE]).await;
    eventually(
        "the import's slices to hold east's own address only",
        WAIT,
        || async {
            let got = import_addresses(&ns.name, "web").await?;
            if got == [OWN] {
                Ok(())
            } else {
                Err(format!("{got:?}"))
            }
        },
    )
    .await;
    for reason in ["LocalApiServer", "LocalServiceNetwork"] {
        d.wait_metric(
            "xcc_addresses_refused_total",
            &[("remote", REMOTE), ("reason", reason)],
            1.0,
        )
        .await;
    }
    // the pass that creates the import reports on it
    let notes = eventually("an AddressRefused Event on the ServiceImport", WAIT, || {
        support::event_notes(
            LOCAL,
            &ns.name,
            "AddressRefused",
            Some(("ServiceImport", "web")),
        )
    })
    .await;
    assert!(notes.iter().any(|n| n.contains(api.as_str())), "{notes:?}");
    assert!(
        !import_addresses(&ns.name, "web")
            .await
            .unwrap()
            .iter()
            .any(|ip| *ip == api || *ip == service_ip),
        "no local address in the import"
    );
    let after = snapshot(&client(LOCAL).await, &[&ns.name]).await;
    conclude(
        Report {
            id: "88-contain-local-addresses-mcs",
            scenario: "A remote's MCS export whose slice lists the local API server's address and an address of the local Service network, beside one of its own",
            done: "a daemon with --mcs reading east",
            converge: Some(t0.elapsed()),
            note: format!(
                "the import's slices held only {OWN}; LocalApiServer and LocalServiceNetwork counted; an AddressRefused Event on the ServiceImport the pass created"
            ),
        },
        &Lost::nothing_to_lose(),
        &before.non_followers_touched(&after),
    );
}

/// Networks of the bed no cluster uses, for this test's local objects: a local Service's external
/// IP and load-balancer IP, a Calico IPPool, a CiliumNode's pod CIDR, `--local-pod-cidrs`.
const EXTERNAL_IP: &str = "10.79.0.7";
const LB_IP: &str = "10.79.0.8";
const CALICO_NET: &str = "10.79.1.0/24";
const CALICO_POD: &str = "10.79.1.5";
const CILIUM_NET: &str = "10.79.2.0/24";
const CILIUM_POD: &str = "10.79.2.5";
const POD_FLAG_NET: &str = "10.79.3.0/24";
const POD_FLAG_POD: &str = "10.79.3.5";
/// One of the remote's own IPv6 pods.
const OWN6: &str = "fd77::5";

/// A local Service of `ns` (not a follower) with an external IP, and a LoadBalancer Service whose
/// status names an ingress IP, as a cloud's load-balancer controller writes it.
async fn local_service_addresses(ns: &str) {
    let west: Api<Service> = Api::namespaced(client(LOCAL).await, ns);
    let pp = PostParams::default();
    let external = support::obj(json!({
        "metadata": {"name": "front"},
        "spec": {"ports": [{"port": 80}], "externalIPs": [EXTERNAL_IP]},
    }));
    west.create(&pp, &external).await.unwrap();
    let lb = support::obj(json!({
        "metadata": {"name": "edge"},
        "spec": {"type": "LoadBalancer", "ports": [{"port": 443}]},
    }));
    west.create(&pp, &lb).await.unwrap();
    let status = json!({"status": {"loadBalancer": {"ingress": [{"ip": LB_IP}]}}});
    west.patch_status("edge", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
}

/// Calico's IPPool and Cilium's CiliumNode CRDs in the local cluster (stand-ins that keep any
/// field), each with one object naming a pod network, as those CNIs publish them.
async fn cni_pools(ns: &str) -> Vec<(kube::api::ApiResource, String)> {
    use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
    let crds = [
        (
            "crd.projectcalico.org",
            "v1",
            "IPPool",
            "ippools",
            json!({"cidr": CALICO_NET}),
        ),
        (
            "cilium.io",
            "v2",
            "CiliumNode",
            "ciliumnodes",
            json!({"ipam": {"podCIDRs": [CILIUM_NET]}}),
        ),
    ];
    let mut made = Vec::new();
    for (group, version, kind, plural, spec) in crds {
        support::objects::apply_crd(
            LOCAL,
            &support::objects::open_crd(group, version, kind, plural),
        )
        .await;
        let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind));
        let api: Api<DynamicObject> = Api::all_with(client(LOCAL).await, &ar);
        let name = format!("xcc-{ns}");
        let obj: DynamicObject = serde_json::from_value(json!({
            "apiVersion": format!("{group}/{version}"), "kind": kind,
            "metadata": {"name": name}, "spec": spec,
        }))
        .unwrap();
        api.create(&PostParams::default(), &obj).await.unwrap();
        made.push((ar, name));
    }
    made
}

#[tokio::test]
async fn cloud_platform_nat64_and_every_local_network_are_refused() {
    let ns = namespace("addresses-platform").await;
    let (api, _) = local_addresses().await;
    local_service_addresses(&ns.name).await;
    let pools = cni_pools(&ns.name).await;
    let east = client(REMOTE).await;
    let pp = PostParams::default();
    Api::<Service>::namespaced(east.clone(), &ns.name)
        .create(&pp, &exported("web", 80))
        .await
        .unwrap();
    let slices: Api<EndpointSlice> = Api::namespaced(east, &ns.name);
    // the local API server through NAT64 (64:ff9b::/96 embeds it), written canonically
    let v4: std::net::Ipv4Addr = api.parse().expect("the API server's IPv4 address");
    let [a, b, c, e] = v4.octets();
    let nat64 = std::net::Ipv6Addr::new(
        0x64,
        0xff9b,
        0,
        0,
        0,
        0,
        u16::from_be_bytes([a, b]),
        u16::from_be_bytes([c, e]),
    )
    .to_string();
    let hostile4 = [
        OWN,
        "100.100.100.200",
        "168.63.129.16",
        EXTERNAL_IP,
        LB_IP,
        CALICO_POD,
        CILIUM_POD,
        POD_FLAG_POD,
    ];
    slices
        .create(&pp, &remote_slice("web", "web-1", &hostile4))
        .await
        .unwrap();
    let hostile6: Vec<serde_json::Value> = [OWN6, "fd00:ec2::254", "fd20:ce::254", nat64.as_str()]
        .iter()
        .map(|ip| endpoint(ip))
        .collect();
    let v6 = remote_slice_with(
        "web",
        "web-v6",
        "IPv6",
        json!([{"name": "http", "port": 8080, "protocol": "TCP"}]),
        hostile6,
    );
    slices.create(&pp, &v6).await.unwrap();

    let before = snapshot(&client(LOCAL).await, &[&ns.name]).await;
    let t0 = std::time::Instant::now();
    // any address is the remote's to name, but for what is local or a platform's
    let args = with_args(
        args_for(&ns.name),
        &[
            "--remote-allowed-cidrs",
            "0.0.0.0/0,::/0",
            "--local-pod-cidrs",
            POD_FLAG_NET,
        ],
    );
    let d = Daemon::start(&args).await;
    d.wait_synced(&[REMOTE]).await;
    let west: Api<Service> = Api::namespaced(client(LOCAL).await, &ns.name);
    eventually("the follower", WAIT, || present(&west, "web")).await;
    let mut want = [OWN, OWN6];
    want.sort();
    addresses_are(&ns.name, "web", &want).await;
    let took = t0.elapsed();
    for (reason, n) in [
        ("Platform", 4.0),
        ("LocalApiServer", 1.0),
        ("LocalServiceAddress", 2.0),
        ("LocalPodNetwork", 3.0),
    ] {
        d.wait_metric(
            "xcc_addresses_refused_total",
            &[("remote", REMOTE), ("reason", reason)],
            n,
        )
        .await;
    }
    let notes = eventually("an AddressRefused Event on the follower", WAIT, || {
        support::event_notes(LOCAL, &ns.name, "AddressRefused", Some(("Service", "web")))
    })
    .await;
    assert!(
        notes.iter().any(|n| n.contains("cloud platform")),
        "{notes:?}"
    );
    let (_, ready) = d.readyz().expect("readyz");
    assert!(
        !ready.contains("local pod networks: none known"),
        "--local-pod-cidrs and the CNI's pools name pod networks: {ready}"
    );

    let after = snapshot(&client(LOCAL).await, &[&ns.name]).await;
    // the load balancer goes: its address is a remote's to name again
    Api::<Service>::namespaced(client(LOCAL).await, &ns.name)
        .delete("edge", &Default::default())
        .await
        .unwrap();
    let mut want = [OWN, OWN6, LB_IP];
    want.sort();
    addresses_are(&ns.name, "web", &want).await;
    for (ar, name) in pools {
        let api: Api<kube::api::DynamicObject> = Api::all_with(client(LOCAL).await, &ar);
        api.delete(&name, &Default::default()).await.unwrap();
    }
    conclude(
        Report {
            id: "79-contain-platform-addresses",
            scenario: "A remote's slices list cloud platform endpoints (Alibaba metadata, Azure WireServer, AWS and GCP metadata over IPv6), the local API server through NAT64, a local Service's external and load-balancer IPs, and addresses in a Calico IPPool, a CiliumNode's pod CIDR and --local-pod-cidrs, beside its own IPv4 and IPv6 pods",
            done: "a daemon whose remote may use any address (allowlist 0.0.0.0/0, ::/0); then the load-balancer Service is deleted",
            converge: Some(took),
            note: format!(
                "the follower held only {OWN} and {OWN6}; refused Platform 4, LocalApiServer 1 (NAT64), LocalServiceAddress 2, LocalPodNetwork 3 (each counted, an AddressRefused Event); the load balancer gone, its address was admitted again"
            ),
        },
        &Lost::nothing_to_lose(),
        &before.non_followers_touched(&after),
    );
}
