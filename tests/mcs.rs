//! End to end: the Multi-Cluster Services API (`--mcs`, issue 22), one test per safety invariant,
//! with the real binary against the bed's API servers (the upstream conformance suite, with
//! nodes and a pod network, is tests/mcs_conformance.rs).
//!
//! The daemon under test writes LOCAL (west) and reads REMOTE (east) and the local cluster as
//! MCS sources. Cluster names are cluster-wide (a ClusterProperty names a whole cluster), so the
//! tests of this file take turns.
mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use cross_cluster_controller::desired::mcs::{
    ClusterProperty, ServiceExport, ServiceImport, derived_name,
};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;
use support::daemon::{Daemon, args_for, with_args};
use support::fault::{routed_kubeconfig, upstream};
use support::mcs::{crds, export, import_listing, service, unexport};
use support::metrics::series_value;
use support::proxy::{Fault, Proxy};
use support::{LOCAL, REMOTE, client, eventually, namespace};
use tokio::sync::Mutex;

const WAIT: Duration = Duration::from_secs(60);
const SLICE_LABEL: &str = "multicluster.kubernetes.io/service-name";
const SOURCE_LABEL: &str = "multicluster.kubernetes.io/source-cluster";

/// One test of this file at a time (see the module comment).
static ONE_AT_A_TIME: Mutex<()> = Mutex::const_new(());
/// A daemon of west reading east, with the MCS API on, confined to `ns`.
async fn daemon(ns: &str, extra: &[&str]) -> Daemon {
    let args = with_args(
        args_for(ns),
        &[&["--mcs", "--local-cluster-name", LOCAL][..], extra].concat(),
    );
    Daemon::start(&args).await
}

/// Our MCS slices of `name` in `ns`, by source cluster: the addresses each holds.
async fn mcs_slices(c: &Client, ns: &str, name: &str) -> BTreeMap<String, Vec<String>> {
    let api: Api<EndpointSlice> = Api::namespaced(c.clone(), ns);
    let lp = ListParams::default().labels(&format!("{SLICE_LABEL}={name}"));
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for s in api.list(&lp).await.expect("list slices").items {
        let cluster = s.labels().get(SOURCE_LABEL).cloned().unwrap_or_default();
        let ips = s.endpoints.iter().flat_map(|e| e.addresses.clone());
        out.entry(cluster).or_default().extend(ips);
    }
    out
}

async fn slices_are(c: &Client, ns: &str, name: &str, want: &[(&str, &[&str])]) {
    let want: BTreeMap<String, Vec<String>> = want
        .iter()
        .map(|(c, ips)| (c.to_string(), ips.iter().map(|s| s.to_string()).collect()))
        .collect();
    eventually(&format!("slices of {name}: {want:?}"), WAIT, || async {
        let got = mcs_slices(c, ns, name).await;
        if got == want {
            Ok(())
        } else {
            Err(format!("{got:?}"))
        }
    })
    .await;
}

async fn gone<K>(api: &Api<K>, name: &str)
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    eventually(&format!("{name} deleted"), WAIT, || async {
        match api.get_opt(name).await {
            Ok(None) => Ok(()),
            Ok(Some(_)) => Err("still there".to_string()),
            Err(e) => Err(e.to_string()),
        }
    })
    .await;
}

/// (uid, resourceVersion) of every ServiceImport, Service and EndpointSlice of `ns`.
async fn versions(c: &Client, ns: &str) -> BTreeMap<String, (String, String)> {
    let mut out = ids::<ServiceImport>(c, ns).await;
    out.extend(ids::<Service>(c, ns).await);
    out.extend(ids::<EndpointSlice>(c, ns).await);
    out
}

/// `<kind>/<name>` -> (uid, resourceVersion) of every object of one kind in `ns`.
async fn ids<K>(c: &Client, ns: &str) -> BTreeMap<String, (String, String)>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let list = Api::<K>::namespaced(c.clone(), ns)
        .list(&ListParams::default())
        .await
        .expect("list");
    list.items
        .iter()
        .map(|o| {
            let m = o.meta();
            let id = (m.uid.clone(), m.resource_version.clone());
            (
                format!("{}/{}", K::kind(&()), o.name_any()),
                (id.0.unwrap_or_default(), id.1.unwrap_or_default()),
            )
        })
        .collect()
}

#[tokio::test]
async fn exports_in_both_clusters_become_one_import_and_each_unexport_removes_its_part() {
    let _turn = ONE_AT_A_TIME.lock().await;
    crds().await;
    let ns = namespace("mcs-import").await;
    let (east, west) = (client(REMOTE).await, client(LOCAL).await);
    service(&east, &ns.name, "web", 80, &["10.201.1.5", "10.201.1.6"]).await;
    export(&east, &ns.name, "web").await;
    let d = daemon(&ns.name, &[]).await;

    let si = import_listing(&west, &ns.name, "web", &[REMOTE]).await;
    assert_eq!(si.spec.type_, "ClusterSetIP");
    assert_eq!(si.spec.ports.len(), 1);
    assert_eq!(si.spec.ports[0].port, 80);
    let derived = Api::<Service>::namespaced(west.clone(), &ns.name)
        .get(&derived_name(&ns.name, "web"))
        .await
        .expect("the derived Service");
    assert_eq!(
        derived.spec.as_ref().and_then(|s| s.cluster_ips.clone()),
        Some(si.spec.ips.clone()),
        "spec.ips are the derived Service's ClusterIPs"
    );
    let owner = &derived.owner_references()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str()),
        ("ServiceImport", si.uid().as_deref().unwrap_or_default())
    );
    slices_are(
        &west,
        &ns.name,
        "web",
        &[(REMOTE, &["10.201.1.5", "10.201.1.6"])],
    )
    .await;

    // the local cluster is a source too: its export joins the same import, and its
    // ServiceExport gets Valid, Ready and Conflict
    service(&west, &ns.name, "web", 80, &["10.202.1.7"]).await;
    export(&west, &ns.name, "web").await;
    import_listing(&west, &ns.name, "web", &[REMOTE, LOCAL]).await;
    slices_are(
        &west,
        &ns.name,
        "web",
        &[
            (REMOTE, &["10.201.1.5", "10.201.1.6"]),
            (LOCAL, &["10.202.1.7"]),
        ],
    )
    .await;
    let exports: Api<ServiceExport> = Api::namespaced(west.clone(), &ns.name);
    eventually(
        "west's ServiceExport Valid, Ready, no Conflict",
        WAIT,
        || async {
            let se = exports.get("web").await.map_err(|e| e.to_string())?;
            let cs: BTreeMap<String, (String, String)> = se
                .status
                .map(|s| s.conditions)
                .unwrap_or_default()
                .into_iter()
                .map(|c| (c.type_, (c.status, c.reason)))
                .collect();
            let want = |s: &str, r: &str| Some((s.to_string(), r.to_string()));
            if cs.get("Valid").cloned() == want("True", "Valid")
                && cs.get("Ready").cloned() == want("True", "Exported")
                && cs.get("Conflict").cloned() == want("False", "NoConflicts")
            {
                Ok(())
            } else {
                Err(format!("{cs:?}"))
            }
        },
    )
    .await;

    // east stops exporting: its slices go, the import stays for west
    unexport(&east, &ns.name, "web").await;
    slices_are(&west, &ns.name, "web", &[(LOCAL, &["10.202.1.7"])]).await;
    import_listing(&west, &ns.name, "web", &[LOCAL]).await;
    // and west too: the import, its derived Service and slices go
    unexport(&west, &ns.name, "web").await;
    gone(
        &Api::<ServiceImport>::namespaced(west.clone(), &ns.name),
        "web",
    )
    .await;
    gone(
        &Api::<Service>::namespaced(west.clone(), &ns.name),
        &derived_name(&ns.name, "web"),
    )
    .await;
    slices_are(&west, &ns.name, "web", &[]).await;
    assert!(d.exited().is_none(), "{}", d.logs());
}

#[tokio::test]
async fn objects_that_are_not_ours_are_never_touched() {
    let _turn = ONE_AT_A_TIME.lock().await;
    crds().await;
    let ns = namespace("mcs-not-ours").await;
    let (east, west) = (client(REMOTE).await, client(LOCAL).await);
    let pp = PostParams::default();
    // a ServiceImport of another implementation, a Service holding the derived name of `api`,
    // and an MCS slice of `db` written by someone else
    let theirs: ServiceImport = serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": ns.name},
        "spec": {"type": "ClusterSetIP", "ports": [{"port": 1, "protocol": "TCP"}]},
    }))
    .expect("an import");
    Api::<ServiceImport>::namespaced(west.clone(), &ns.name)
        .create(&pp, &theirs)
        .await
        .expect("create their import");
    let squatter: Service = serde_json::from_value(json!({
        "metadata": {"name": derived_name(&ns.name, "api"), "namespace": ns.name},
        "spec": {"ports": [{"port": 1, "protocol": "TCP"}]},
    }))
    .expect("a Service");
    Api::<Service>::namespaced(west.clone(), &ns.name)
        .create(&pp, &squatter)
        .await
        .expect("create the squatter");
    let foreign: EndpointSlice = serde_json::from_value(json!({
        "metadata": {"name": "db-theirs", "namespace": ns.name,
                     "labels": {SLICE_LABEL: "db", SOURCE_LABEL: REMOTE,
                                "kubernetes.io/service-name": derived_name(&ns.name, "db"),
                                "endpointslice.kubernetes.io/managed-by": "another-mcs.example.com"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["10.9.9.9"]}],
    }))
    .expect("a slice");
    Api::<EndpointSlice>::namespaced(west.clone(), &ns.name)
        .create(&pp, &foreign)
        .await
        .expect("create their slice");
    let before = versions(&west, &ns.name).await;

    for name in ["web", "api", "db"] {
        service(&east, &ns.name, name, 80, &["10.201.1.5"]).await;
        export(&east, &ns.name, name).await;
    }
    let d = daemon(&ns.name, &[]).await;
    // db, which is free, is imported beside their slice; web and api meet what is not ours
    import_listing(&west, &ns.name, "db", &[REMOTE]).await;
    d.wait_metric(
        "xcc_conflicts_total",
        &[("remote", ""), ("kind", "ServiceImport")],
        1.0,
    )
    .await;
    d.wait_metric(
        "xcc_conflicts_total",
        &[("remote", ""), ("kind", "Service")],
        1.0,
    )
    .await;
    // and the one that goes: db unexported, our slices go, theirs stays
    unexport(&east, &ns.name, "db").await;
    gone(
        &Api::<ServiceImport>::namespaced(west.clone(), &ns.name),
        "db",
    )
    .await;
    let after = versions(&west, &ns.name).await;
    for (id, v) in &before {
        assert_eq!(after.get(id), Some(v), "{id} was changed or deleted");
    }
    let theirs = mcs_slices(&west, &ns.name, "db").await;
    assert_eq!(
        theirs,
        BTreeMap::from([(REMOTE.to_string(), vec!["10.9.9.9".to_string()])])
    );
    assert!(d.exited().is_none(), "{}", d.logs());
}

#[tokio::test]
async fn an_unreachable_remote_deletes_nothing() {
    let _turn = ONE_AT_A_TIME.lock().await;
    crds().await;
    let ns = namespace("mcs-unreachable").await;
    let (east, west) = (client(REMOTE).await, client(LOCAL).await);
    service(&east, &ns.name, "web", 80, &["10.201.1.5"]).await;
    export(&east, &ns.name, "web").await;
    let proxy = Proxy::start(&upstream(REMOTE).await).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let kc = dir.path().join("remote-proxied");
    routed_kubeconfig(&[(REMOTE, proxy.url())], &kc).await;
    let kc = kc.to_str().expect("path").to_string();
    let mut d = daemon(&ns.name, &["--kubeconfig", &kc]).await;
    import_listing(&west, &ns.name, "web", &[REMOTE]).await;
    slices_are(&west, &ns.name, "web", &[(REMOTE, &["10.201.1.5"])]).await;
    let before = versions(&west, &ns.name).await;

    // east stops answering, its export goes meanwhile, and a new daemon starts without ever
    // listing east: nothing it imported may go
    proxy.set(Fault::Refuse);
    unexport(&east, &ns.name, "web").await;
    d.kill();
    let d2 = daemon(&ns.name, &["--kubeconfig", &kc]).await;
    // it leads, lists west, and passes the import it finds there: east proves nothing, so the
    // pass holds everything east gave
    d2.wait_metric("xcc_reconciles_total", &[("outcome", "unchanged")], 1.0)
        .await;
    let during = versions(&west, &ns.name).await;
    assert_eq!(
        during,
        before,
        "nothing changed while east was unreachable\n{}",
        d2.logs()
    );
    assert_eq!(
        d2.writes(
            &["ServiceImport", "Service", "EndpointSlice"],
            &["create", "update", "delete"]
        ),
        0.0
    );

    // east answers again: its listing proves the export gone, and only now does the import go
    proxy.set(Fault::Pass);
    gone(
        &Api::<ServiceImport>::namespaced(west.clone(), &ns.name),
        "web",
    )
    .await;
    slices_are(&west, &ns.name, "web", &[]).await;
}

#[tokio::test]
async fn a_dry_run_and_a_standby_write_nothing() {
    let _turn = ONE_AT_A_TIME.lock().await;
    crds().await;
    let ns = namespace("mcs-dry-run").await;
    let (east, west) = (client(REMOTE).await, client(LOCAL).await);
    service(&east, &ns.name, "web", 80, &["10.201.1.5"]).await;
    export(&east, &ns.name, "web").await;
    service(&west, &ns.name, "db", 80, &["10.202.1.5"]).await;
    export(&west, &ns.name, "db").await;
    let exports: Api<ServiceExport> = Api::namespaced(west.clone(), &ns.name);
    let export_version = || async {
        exports
            .get("db")
            .await
            .expect("the export")
            .resource_version()
    };
    let before = (versions(&west, &ns.name).await, export_version().await);

    let dry = daemon(&ns.name, &["--dry-run"]).await;
    eventually("the dry run to say what it would write", WAIT, || async {
        let logs = dry.logs();
        let would = |kind: &str, verb: &str| {
            logs.lines()
                .any(|l| l.contains("dry run: would") && l.contains(kind) && l.contains(verb))
        };
        if would("ServiceImport", "create") {
            Ok(())
        } else {
            Err(logs)
        }
    })
    .await;
    let after = (versions(&west, &ns.name).await, export_version().await);
    assert_eq!(after, before, "a dry run writes nothing\n{}", dry.logs());
    let kinds = ["ServiceImport", "Service", "EndpointSlice"];
    assert_eq!(dry.writes(&kinds, &["create", "update", "delete"]), 0.0);
    drop(dry);

    // a standby beside a leader: the leader writes, the standby nothing
    let leader = daemon(&ns.name, &[]).await;
    import_listing(&west, &ns.name, "web", &[REMOTE]).await;
    let standby = daemon(&ns.name, &[]).await;
    service(&east, &ns.name, "api", 80, &["10.201.1.9"]).await;
    export(&east, &ns.name, "api").await;
    import_listing(&west, &ns.name, "api", &[REMOTE]).await;
    // the standby saw the change and set it aside
    standby
        .wait_metric("xcc_reconciles_total", &[("outcome", "not_leader")], 1.0)
        .await;
    assert_eq!(
        standby.writes(&kinds, &["create", "update", "delete"]),
        0.0,
        "{}",
        standby.logs()
    );
    assert!(leader.writes(&["ServiceImport"], &["create"]) >= 2.0);
}

#[tokio::test]
async fn the_label_mode_and_mcs_work_side_by_side_on_one_service() {
    let _turn = ONE_AT_A_TIME.lock().await;
    crds().await;
    let ns = namespace("mcs-both").await;
    let (east, west) = (client(REMOTE).await, client(LOCAL).await);
    service(&east, &ns.name, "web", 80, &["10.201.1.5"]).await;
    // labelled for the label mode, and exported through the MCS API
    let label = json!({"metadata": {"labels": {"fair.com/cross-cluster": "true"}}});
    Api::<Service>::namespaced(east.clone(), &ns.name)
        .patch("web", &PatchParams::default(), &Patch::Merge(&label))
        .await
        .expect("label it");
    Api::<EndpointSlice>::namespaced(east.clone(), &ns.name)
        .patch("web-src", &PatchParams::default(), &Patch::Merge(&label))
        .await
        .expect("label its slice");
    export(&east, &ns.name, "web").await;
    let d = daemon(&ns.name, &[]).await;
    import_listing(&west, &ns.name, "web", &[REMOTE]).await;
    let services: Api<Service> = Api::namespaced(west.clone(), &ns.name);
    let follower = eventually("the follower", WAIT, || async {
        services
            .get_opt("web")
            .await
            .map_err(|e| e.to_string())?
            .ok_or("no follower".to_string())
    })
    .await;
    assert_eq!(
        follower
            .labels()
            .get("fair.com/cross-cluster")
            .map(String::as_str),
        Some("follower")
    );
    slices_are(&west, &ns.name, "web", &[(REMOTE, &["10.201.1.5"])]).await;

    // unexport: the import goes, the follower stays as it was
    let follower_version = follower.resource_version();
    unexport(&east, &ns.name, "web").await;
    gone(
        &Api::<ServiceImport>::namespaced(west.clone(), &ns.name),
        "web",
    )
    .await;
    let still = services.get("web").await.expect("the follower stays");
    assert_eq!(still.resource_version(), follower_version);
    assert!(d.exited().is_none(), "{}", d.logs());
}

/// Deletes east's ClusterProperty when dropped (a failed test too): it names the whole cluster.
struct PropertyGone;

impl Drop for PropertyGone {
    fn drop(&mut self) {
        // a client of its own: one made on the test's runtime cannot be driven from another
        support::block_on_thread(async {
            let api: Api<ClusterProperty> = Api::all(client(REMOTE).await);
            let _ = api
                .delete("cluster.clusterset.k8s.io", &DeleteParams::default())
                .await;
        });
    }
}

#[tokio::test]
async fn a_cluster_property_names_the_cluster_in_imports_and_slices() {
    let _turn = ONE_AT_A_TIME.lock().await;
    crds().await;
    let ns = namespace("mcs-property").await;
    let (east, west) = (client(REMOTE).await, client(LOCAL).await);
    service(&east, &ns.name, "web", 80, &["10.201.1.5"]).await;
    export(&east, &ns.name, "web").await;
    let d = daemon(&ns.name, &[]).await;
    import_listing(&west, &ns.name, "web", &[REMOTE]).await;

    // east names itself: the import and the slices follow, the old-named slice goes
    let properties: Api<ClusterProperty> = Api::all(east.clone());
    let _cleanup = PropertyGone;
    let _ = properties
        .delete("cluster.clusterset.k8s.io", &DeleteParams::default())
        .await;
    let cp: ClusterProperty = serde_json::from_value(json!({
        "metadata": {"name": "cluster.clusterset.k8s.io"}, "spec": {"value": "cluster-e"},
    }))
    .expect("a ClusterProperty");
    properties
        .create(&PostParams::default(), &cp)
        .await
        .expect("create the property");
    let renamed = async {
        import_listing(&west, &ns.name, "web", &["cluster-e"]).await;
        slices_are(&west, &ns.name, "web", &[("cluster-e", &["10.201.1.5"])]).await;
    };
    renamed.await;
    properties
        .delete("cluster.clusterset.k8s.io", &DeleteParams::default())
        .await
        .expect("delete the property");
    import_listing(&west, &ns.name, "web", &[REMOTE]).await;
    slices_are(&west, &ns.name, "web", &[(REMOTE, &["10.201.1.5"])]).await;
    assert!(d.exited().is_none(), "{}", d.logs());
}

#[tokio::test]
async fn a_remote_removed_on_purpose_takes_its_part_of_the_imports_with_it() {
    use k8s_openapi::api::core::v1::Secret;
    use support::remotes::{apply_secret, kubeconfig_of, remote_secret, secrets_only_args};
    let _turn = ONE_AT_A_TIME.lock().await;
    crds().await;
    let ns = namespace("mcs-retired").await;
    let (east, west) = (client(REMOTE).await, client(LOCAL).await);
    service(&east, &ns.name, "web", 80, &["10.201.1.5"]).await;
    export(&east, &ns.name, "web").await;
    service(&west, &ns.name, "web", 80, &["10.202.1.5"]).await;
    export(&west, &ns.name, "web").await;
    let args = with_args(
        secrets_only_args(&ns.name),
        &["--mcs", "--local-cluster-name", LOCAL],
    );
    let d = Daemon::start_secrets_only(&args).await;
    let secrets: Api<Secret> = Api::namespaced(west.clone(), &ns.name);
    let kc = kubeconfig_of(REMOTE, |_| {}).await;
    apply_secret(&secrets, &remote_secret(REMOTE, None, Some(&kc))).await;
    import_listing(&west, &ns.name, "web", &[REMOTE, LOCAL]).await;
    slices_are(
        &west,
        &ns.name,
        "web",
        &[(REMOTE, &["10.201.1.5"]), (LOCAL, &["10.202.1.5"])],
    )
    .await;
    // east's Secret goes (east still exports): after the grace, east's part goes, west's stays
    secrets
        .delete(REMOTE, &DeleteParams::default())
        .await
        .expect("delete the Secret");
    slices_are(&west, &ns.name, "web", &[(LOCAL, &["10.202.1.5"])]).await;
    import_listing(&west, &ns.name, "web", &[LOCAL]).await;
    assert!(d.exited().is_none(), "{}", d.logs());
}

/// A third cluster of the bed, read from a Secret, for the tests of cluster names (issue 27).
const SOUTH: &str = "south";
/// South's addresses (east's are 10.201.1.5, by `service`).
const SOUTH_IP: &str = "10.203.1.5";

/// West's daemon reading east (the static remote) and south (a remote Secret); both export
/// `web`, and west imports both.
struct Two {
    ns: support::TestNs,
    east: Client,
    south: Client,
    west: Client,
}

async fn east_and_south_export_web(test: &str) -> Two {
    use support::mcs::crds_in;
    support::extra_cluster(SOUTH, "").await;
    crds().await;
    crds_in(SOUTH).await;
    let ns = support::namespace_in(test, &[REMOTE, LOCAL, SOUTH]).await;
    let (east, south) = (client(REMOTE).await, client(SOUTH).await);
    let west = client(LOCAL).await;
    service(&east, &ns.name, "web", 80, &["10.201.1.5"]).await;
    export(&east, &ns.name, "web").await;
    service(&south, &ns.name, "web", 80, &[SOUTH_IP]).await;
    export(&south, &ns.name, "web").await;
    Two {
        ns,
        east,
        south,
        west,
    }
}

/// West's daemon: east from the flags, south from a Secret of the test's namespace.
async fn daemon_of_two(two: &Two) -> Daemon {
    daemon_reading(two, East::Static).await
}

/// Where west's daemon reads east from.
#[derive(Clone, Copy)]
enum East {
    /// the flags (`--remote-context east`): a member even while it does not answer
    Static,
    /// a remote Secret: a remote whose server does not answer when its Secret comes is not read
    Secret,
}

/// West's daemon: east as `east` says, south from a Secret of the test's namespace.
async fn daemon_reading(two: &Two, east: East) -> Daemon {
    use k8s_openapi::api::core::v1::Secret;
    use support::remotes::{apply_secret, kubeconfig_of, remote_secret, secrets_only_args};
    let ns = &two.ns.name;
    let secrets: Api<Secret> = Api::namespaced(two.west.clone(), ns);
    let mut remotes = vec![SOUTH];
    let d = match east {
        East::Static => daemon(ns, &[]).await,
        East::Secret => {
            remotes.push(REMOTE);
            let args = with_args(
                secrets_only_args(ns),
                &["--mcs", "--local-cluster-name", LOCAL],
            );
            Daemon::start_secrets_only(&args).await
        }
    };
    for remote in remotes {
        let kc = kubeconfig_of(remote, |_| {}).await;
        apply_secret(&secrets, &remote_secret(remote, None, Some(&kc))).await;
    }
    d
}

/// Names the cluster of `c` by its ClusterProperty `cluster.clusterset.k8s.io`.
async fn claim_name(c: &Client, name: &str) {
    let cp: ClusterProperty = serde_json::from_value(json!({
        "metadata": {"name": "cluster.clusterset.k8s.io"}, "spec": {"value": name},
    }))
    .expect("a ClusterProperty");
    Api::<ClusterProperty>::all(c.clone())
        .patch(
            "cluster.clusterset.k8s.io",
            &PatchParams::apply("xcc-test").force(),
            &Patch::Apply(&cp),
        )
        .await
        .expect("apply the ClusterProperty");
}

async fn withdraw_name(c: &Client) {
    Api::<ClusterProperty>::all(c.clone())
        .delete("cluster.clusterset.k8s.io", &DeleteParams::default())
        .await
        .expect("delete the ClusterProperty");
}

/// Deletes south's ClusterProperty when dropped.
struct SouthNameGone;

impl Drop for SouthNameGone {
    fn drop(&mut self) {
        support::block_on_thread(async {
            let api: Api<ClusterProperty> = Api::all(client(SOUTH).await);
            let _ = api
                .delete("cluster.clusterset.k8s.io", &DeleteParams::default())
                .await;
        });
    }
}

/// Starts a stopped cluster of the bed again when dropped.
struct StartAgain(&'static str);

impl Drop for StartAgain {
    fn drop(&mut self) {
        let script = support::repo_root().join("testbed/bed");
        let _ = std::process::Command::new("bash")
            .arg(script)
            .args(["start", self.0])
            .output();
    }
}

/// The slices of ours that carry `cluster` as their source: name -> (uid, resourceVersion,
/// addresses).
async fn slices_of(
    c: &Client,
    ns: &str,
    cluster: &str,
) -> BTreeMap<String, (String, String, Vec<String>)> {
    let api: Api<EndpointSlice> = Api::namespaced(c.clone(), ns);
    let lp = ListParams::default().labels(&format!("{SOURCE_LABEL}={cluster}"));
    let list = api.list(&lp).await.expect("list slices");
    list.items
        .into_iter()
        .map(|s| {
            let ips = s
                .endpoints
                .iter()
                .flat_map(|e| e.addresses.clone())
                .collect();
            let id = (
                s.uid().unwrap_or_default(),
                s.resource_version().unwrap_or_default(),
            );
            (s.name_any(), (id.0, id.1, ips))
        })
        .collect()
}

/// The line /readyz gives a remote, once it contains `text`.
async fn readyz_says(d: &Daemon, remote: &str, text: &str) -> String {
    eventually(
        &format!("/readyz: remote {remote}: ...{text}..."),
        WAIT,
        || async {
            let (_, body) = d.readyz()?;
            body.lines()
                .find(|l| l.starts_with(&format!("remote {remote}:")) && l.contains(text))
                .map(str::to_string)
                .ok_or(body)
        },
    )
    .await
}

#[tokio::test]
async fn a_cluster_claiming_anothers_name_is_refused_and_the_holders_exports_keep_flowing() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let two = east_and_south_export_web("mcs-claim").await;
    let ns = two.ns.name.clone();
    let d = daemon_of_two(&two).await;
    import_listing(&two.west, &ns, "web", &[REMOTE, SOUTH]).await;
    slices_are(
        &two.west,
        &ns,
        "web",
        &[(REMOTE, &["10.201.1.5"]), (SOUTH, &[SOUTH_IP])],
    )
    .await;

    // south claims east's name: refused; only south's part of the import waits
    let _cleanup = SouthNameGone;
    claim_name(&two.south, REMOTE).await;
    import_listing(&two.west, &ns, "web", &[REMOTE]).await;
    slices_are(&two.west, &ns, "web", &[(REMOTE, &["10.201.1.5"])]).await;
    d.wait_metric("xcc_mcs_name_refused", &[("remote", SOUTH)], 1.0)
        .await;
    let line = readyz_says(&d, SOUTH, "refused").await;
    assert!(line.contains("MCS name \"east\" refused"), "{line}");
    eventually("the McsNameRefused Event", WAIT, || {
        support::event_notes(LOCAL, &ns, "McsNameRefused", None)
    })
    .await;

    // east's own change reaches west while the claim stands
    let slices: Api<EndpointSlice> = Api::namespaced(two.east.clone(), &ns);
    let patch =
        json!({"endpoints": [{"addresses": ["10.201.1.6"], "conditions": {"ready": true}}]});
    slices
        .patch("web-src", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("change east's slice");
    slices_are(&two.west, &ns, "web", &[(REMOTE, &["10.201.1.6"])]).await;
    assert_eq!(
        d.gauge("xcc_mcs_name_refused", &[("remote", REMOTE)]),
        Some(0.0),
        "the holder is not refused"
    );

    // withdrawn: south's part comes back under its own name
    withdraw_name(&two.south).await;
    import_listing(&two.west, &ns, "web", &[REMOTE, SOUTH]).await;
    slices_are(
        &two.west,
        &ns,
        "web",
        &[(REMOTE, &["10.201.1.6"]), (SOUTH, &[SOUTH_IP])],
    )
    .await;
    assert_eq!(
        d.gauge("xcc_mcs_name_refused", &[("remote", SOUTH)]),
        Some(0.0)
    );
    assert!(d.exited().is_none(), "{}", d.logs());
}

#[tokio::test]
async fn a_claim_withdrawn_while_the_holder_is_down_deletes_nothing_of_the_holder() {
    withdrawn_while_the_holder_is_down("mcs-claim-down", East::Static).await;
}

/// As above, with east read from a Secret: after the restart east is not read at all (its
/// server does not answer), yet the name its Secret gives it is kept for it.
#[tokio::test]
async fn a_name_whose_remote_secret_cannot_be_read_is_kept_for_it() {
    withdrawn_while_the_holder_is_down("mcs-claim-secret", East::Secret).await;
}

async fn withdrawn_while_the_holder_is_down(test: &str, east: East) {
    let _turn = ONE_AT_A_TIME.lock().await;
    let two = east_and_south_export_web(test).await;
    let ns = two.ns.name.clone();
    let mut d = daemon_reading(&two, east).await;
    import_listing(&two.west, &ns, "web", &[REMOTE, SOUTH]).await;
    slices_are(
        &two.west,
        &ns,
        "web",
        &[(REMOTE, &["10.201.1.5"]), (SOUTH, &[SOUTH_IP])],
    )
    .await;
    let east_before = slices_of(&two.west, &ns, REMOTE).await;

    // east's API server goes down, south claims east's name, and the daemon restarts meanwhile:
    // the new one never hears east's own word
    let _cleanup = SouthNameGone;
    let _east_again = StartAgain(REMOTE);
    support::bed_cmd(&["stop", REMOTE]);
    claim_name(&two.south, REMOTE).await;
    d.kill();
    let d = daemon_reading(&two, east).await;
    // south's claim waits for east's own word (east is the remote of that name here)
    readyz_says(&d, SOUTH, "MCS name \"east\" not granted yet").await;
    assert_eq!(
        slices_of(&two.west, &ns, REMOTE).await,
        east_before,
        "{}",
        d.logs()
    );

    // the claim is withdrawn while east is still down: south's part comes back under its own
    // name, and nothing of east's goes
    withdraw_name(&two.south).await;
    slices_are(
        &two.west,
        &ns,
        "web",
        &[(REMOTE, &["10.201.1.5"]), (SOUTH, &[SOUTH_IP])],
    )
    .await;
    assert_eq!(
        slices_of(&two.west, &ns, REMOTE).await,
        east_before,
        "east's slices untouched\n{}",
        d.logs()
    );
    let si: ServiceImport = Api::namespaced(two.west.clone(), &ns)
        .get("web")
        .await
        .expect("the import is kept");
    let listed: Vec<String> = si
        .status
        .iter()
        .flat_map(|s| s.clusters.iter().map(|c| c.cluster.clone()))
        .collect();
    assert!(
        listed.contains(&REMOTE.to_string()),
        "east still listed: {listed:?}"
    );

    // east answers again: the import lists both
    support::bed_cmd(&["start", REMOTE]);
    import_listing(&two.west, &ns, "web", &[REMOTE, SOUTH]).await;
    slices_are(
        &two.west,
        &ns,
        "web",
        &[(REMOTE, &["10.201.1.5"]), (SOUTH, &[SOUTH_IP])],
    )
    .await;
    assert!(d.exited().is_none(), "{}", d.logs());
}

/// What the kube-system case makes in east's kube-system, deleted when dropped.
struct EastKubeSystem(String);

impl Drop for EastKubeSystem {
    fn drop(&mut self) {
        let name = self.0.clone();
        support::block_on_thread(async move {
            let c = client(REMOTE).await;
            let dp = DeleteParams::default();
            let _ = Api::<ServiceExport>::namespaced(c.clone(), "kube-system")
                .delete(&name, &dp)
                .await;
            let _ = Api::<EndpointSlice>::namespaced(c.clone(), "kube-system")
                .delete(&format!("{name}-src"), &dp)
                .await;
            let _ = Api::<Service>::namespaced(c, "kube-system")
                .delete(&name, &dp)
                .await;
        });
    }
}

#[tokio::test]
async fn an_export_into_kube_system_is_never_imported() {
    let _turn = ONE_AT_A_TIME.lock().await;
    crds().await;
    // the daemon's own namespace (its Lease), and one it imports into
    let own = namespace("mcs-own").await;
    let ns = namespace("mcs-protected").await;
    let name = format!("xcc-mcs-{}", &ns.name[ns.name.len() - 8..]);
    let _cleanup = EastKubeSystem(name.clone());
    let (east, west) = (client(REMOTE).await, client(LOCAL).await);
    service(&east, "kube-system", &name, 80, &["10.203.1.5"]).await;
    export(&east, "kube-system", &name).await;
    service(&east, &ns.name, "web", 80, &["10.203.1.6"]).await;
    export(&east, &ns.name, "web").await;
    // every namespace read (no --watch-namespace): kube-system is protected by default
    let mut args = with_args(
        args_for(&own.name),
        &["--mcs", "--local-cluster-name", LOCAL],
    );
    let i = args
        .iter()
        .position(|a| a == "--watch-namespace")
        .expect("flag");
    args.drain(i..i + 2);
    let d = Daemon::start(&args).await;
    import_listing(&west, &ns.name, "web", &[REMOTE]).await;

    let imports: Api<ServiceImport> = Api::namespaced(west.clone(), "kube-system");
    let services: Api<Service> = Api::namespaced(west.clone(), "kube-system");
    let derived = derived_name("kube-system", &name);
    let nothing_there = || async {
        if imports
            .get_opt(&name)
            .await
            .map_err(|e| e.to_string())?
            .is_some()
        {
            return Err(format!("a ServiceImport {name} was written in kube-system"));
        }
        if services
            .get_opt(&derived)
            .await
            .map_err(|e| e.to_string())?
            .is_some()
        {
            return Err(format!(
                "a derived Service {derived} was written in kube-system"
            ));
        }
        let slices = mcs_slices(&west, "kube-system", &name).await;
        if !slices.is_empty() {
            return Err(format!("MCS slices written in kube-system: {slices:?}"));
        }
        Ok(())
    };
    eventually(
        "the kube-system export refused and logged",
        WAIT,
        || async {
            nothing_there().await?;
            let key = format!("mcs:kube-system/{name}");
            if !d
                .logs()
                .lines()
                .any(|l| l.contains("NamespaceProtected") && l.contains(&key))
            {
                return Err("no NamespaceProtected log line yet".into());
            }
            Ok(())
        },
    )
    .await;
    // a later pass of the key (another change of its export) still writes nothing there
    service(&east, "kube-system", &format!("{name}-b"), 80, &[]).await;
    let _more = EastKubeSystem(format!("{name}-b"));
    export(&east, "kube-system", &format!("{name}-b")).await;
    eventually(
        "the second kube-system export refused too",
        WAIT,
        || async {
            let key = format!("mcs:kube-system/{name}-b");
            if d.logs()
                .lines()
                .any(|l| l.contains("NamespaceProtected") && l.contains(&key))
            {
                Ok(())
            } else {
                Err("no log line yet".into())
            }
        },
    )
    .await;
    nothing_there()
        .await
        .expect("nothing written in kube-system");
}

/// The creationTimestamp of the export `name` in `c`.
async fn export_created(c: &Client, ns: &str, name: &str) -> k8s_openapi::jiff::Timestamp {
    let se = Api::<ServiceExport>::namespaced(c.clone(), ns)
        .get(name)
        .await
        .expect("get the ServiceExport");
    se.metadata
        .creation_timestamp
        .expect("a creationTimestamp")
        .0
}

/// The import `web`'s internalTrafficPolicy and the holder it records, once they are `want`;
/// and the derived Service's policy (what kube-proxy applies) the same.
async fn web_held_by(c: &Client, ns: &str, want: (&str, &str)) {
    let imports: Api<ServiceImport> = Api::namespaced(c.clone(), ns);
    let services: Api<Service> = Api::namespaced(c.clone(), ns);
    let derived = derived_name(ns, "web");
    eventually(
        &format!("the import web held as {want:?}"),
        WAIT,
        || async {
            let si = imports.get("web").await.map_err(|e| e.to_string())?;
            let holder = si.annotations().get(HOLDER).cloned().unwrap_or_default();
            let policy = si.spec.internal_traffic_policy.clone().unwrap_or_default();
            let svc = services.get(&derived).await.map_err(|e| e.to_string())?;
            let applied = svc.spec.and_then(|s| s.internal_traffic_policy);
            let got = (policy.as_str(), holder.as_str());
            if got == want && applied.as_deref() == Some(want.0) {
                Ok(())
            } else {
                Err(format!("{got:?}, derived {applied:?}"))
            }
        },
    )
    .await;
}

const HOLDER: &str = "cross-cluster-controller.fair.com/properties-holder";

/// Issue 37 item 6. A real API server cannot backdate a creationTimestamp, so the attack is
/// modelled by the order of joining: south exports `web` first (its export truly older) with
/// `internalTrafficPolicy: Local`, which would black-hole the import for every west client on
/// a node without a local endpoint (none has one: no cluster's pods run in west); west's daemon
/// reads only east at first, whose export (`Cluster`) becomes the import's holder; then south
/// joins, older by its timestamp. Without the holder rule south took the import's properties.
#[tokio::test]
async fn a_newcomer_older_by_its_timestamp_does_not_take_the_imports_properties() {
    use k8s_openapi::api::core::v1::Secret;
    use support::fault::{Lost, Report, conclude, snapshot};
    use support::mcs::crds_in;
    use support::remotes::{apply_secret, kubeconfig_of, remote_secret};
    let _turn = ONE_AT_A_TIME.lock().await;
    support::extra_cluster(SOUTH, "").await;
    crds().await;
    crds_in(SOUTH).await;
    let ns = support::namespace_in("mcs-holder", &[REMOTE, LOCAL, SOUTH]).await;
    let n = ns.name.as_str();
    let (east, south, west) = (
        client(REMOTE).await,
        client(SOUTH).await,
        client(LOCAL).await,
    );
    service(&south, n, "web", 80, &[SOUTH_IP]).await;
    let local_policy = json!({"spec": {"internalTrafficPolicy": "Local"}});
    Api::<Service>::namespaced(south.clone(), n)
        .patch("web", &PatchParams::default(), &Patch::Merge(&local_policy))
        .await
        .expect("south's web: Local");
    export(&south, n, "web").await;
    let south_made = export_created(&south, n, "web").await;
    // creationTimestamp counts seconds: east's must fall in a later one
    eventually(
        "the clock past the second of south's export",
        WAIT,
        || async {
            let now = k8s_openapi::jiff::Timestamp::now();
            (now.as_second() > south_made.as_second())
                .then_some(())
                .ok_or(format!("now {now}, south's export {south_made}"))
        },
    )
    .await;
    service(&east, n, "web", 80, &["10.201.1.5"]).await;
    export(&east, n, "web").await;
    let east_made = export_created(&east, n, "web").await;
    assert!(south_made < east_made, "{south_made} < {east_made}");

    // west reads east only: east's export is the import's holder
    let before = snapshot(&west, &[n]).await;
    let d = daemon(n, &[]).await;
    import_listing(&west, n, "web", &[REMOTE]).await;
    web_held_by(&west, n, ("Cluster", REMOTE)).await;

    // south joins, its export older than east's: a member, its endpoints imported, and the
    // import keeps east's properties
    let secrets: Api<Secret> = Api::namespaced(west.clone(), n);
    let kc = kubeconfig_of(SOUTH, |_| {}).await;
    let t0 = std::time::Instant::now();
    apply_secret(&secrets, &remote_secret(SOUTH, None, Some(&kc))).await;
    // the status lists south in the same pass that writes the spec: no later flip to wait for
    import_listing(&west, n, "web", &[REMOTE, SOUTH]).await;
    let took = t0.elapsed();
    web_held_by(&west, n, ("Cluster", REMOTE)).await;
    slices_are(
        &west,
        n,
        "web",
        &[(REMOTE, &["10.201.1.5"]), (SOUTH, &[SOUTH_IP])],
    )
    .await;
    let notes = eventually("the ServiceConflict Event on the import", WAIT, || {
        support::event_notes(LOCAL, n, "ServiceConflict", Some(("ServiceImport", "web")))
    })
    .await;
    assert!(
        notes.iter().any(|note| note
            .contains("cluster \"east\"'s properties (it holds the import")
            && note.contains("internalTrafficPolicy by \"south\"")),
        "{notes:?}"
    );

    // east stops exporting: south, the oldest left, takes over and becomes the holder
    unexport(&east, n, "web").await;
    import_listing(&west, n, "web", &[SOUTH]).await;
    web_held_by(&west, n, ("Local", SOUTH)).await;
    slices_are(&west, n, "web", &[(SOUTH, &[SOUTH_IP])]).await;
    assert!(d.exited().is_none(), "{}", d.logs());

    let after = snapshot(&west, &[n]).await;
    conclude(
        Report {
            id: "59-contain-mcs-holder",
            scenario: "An MCS export that joins later but claims to be older (its creationTimestamp; on the bed, a cluster that exported first and joined second) asks for internalTrafficPolicy Local",
            done: "south exported web (Local) a second before east (Cluster); west's daemon read east alone, then south's Secret was applied; then east unexported",
            converge: Some(took),
            note: format!(
                "south listed in the import {:.1} s after its Secret and its endpoint imported; the import and its derived Service kept east's Cluster (holder annotation east) and a ServiceConflict Event named east as the holder; once east unexported, south took over (Local, holder south). With the rule removed, south took Local at once",
                took.as_secs_f64()
            ),
        },
        &Lost::nothing_to_lose(),
        &before.non_followers_touched(&after),
    );
}

/// Services `web-<i>` for each i of `range`, each with one address (10.201.3.<i+1>), exported.
async fn export_webs(c: &Client, ns: &str, range: std::ops::Range<usize>) {
    for i in range {
        let name = format!("web-{i}");
        service(c, ns, &name, 80, &[&format!("10.201.3.{}", i + 1)]).await;
        export(c, ns, &name).await;
    }
}

#[tokio::test]
async fn a_remote_over_its_budget_through_its_exports_is_degraded_its_imports_kept() {
    let _turn = ONE_AT_A_TIME.lock().await;
    crds().await;
    let ns = namespace("mcs-budget").await;
    let (east, west) = (client(REMOTE).await, client(LOCAL).await);
    export_webs(&east, &ns.name, 0..3).await;
    // east's budget: 3 exported Services; its exports count as its labelled Services do
    let d = daemon(&ns.name, &["--remote-max-services", "3"]).await;
    for i in 0..3 {
        let (name, ip) = (format!("web-{i}"), format!("10.201.3.{}", i + 1));
        import_listing(&west, &ns.name, &name, &[REMOTE]).await;
        slices_are(&west, &ns.name, &name, &[(REMOTE, &[&ip])]).await;
    }
    let before = versions(&west, &ns.name).await;

    // two exports more: east is over its budget through the MCS API alone
    export_webs(&east, &ns.name, 3..5).await;
    eventually(
        "east degraded on /readyz and in the metric",
        WAIT,
        || async {
            let (code, body) = d.readyz()?;
            let line = (body.lines())
                .find(|l| l.starts_with(&format!("remote {REMOTE}:")))
                .unwrap_or_default();
            if code != 503 || !line.contains("over budget (more than 3 exported Services)") {
                return Err(format!("/readyz {code}:\n{body}"));
            }
            let metrics = d.try_metrics()?;
            match series_value(&metrics, "xcc_remote_over_budget", &[("remote", REMOTE)])? {
                1.0 => Ok(()),
                v => Err(format!("xcc_remote_over_budget{{remote={REMOTE}}} {v}")),
            }
        },
    )
    .await;
    // degraded, east proves nothing: what it gave is held as it was, nothing more is imported
    let imports: Api<ServiceImport> = Api::namespaced(west.clone(), &ns.name);
    for i in 3..5 {
        let name = format!("web-{i}");
        let got = imports.get_opt(&name).await.expect("get an import");
        assert!(got.is_none(), "{name}, beyond east's budget, was imported");
    }
    assert_eq!(
        versions(&west, &ns.name).await,
        before,
        "the imports, derived Services and slices of a degraded remote are kept as they were"
    );
}
