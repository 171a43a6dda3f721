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
