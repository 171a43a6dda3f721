//! End to end: `remote-access` makes a read-only identity in the cluster to be read, and its
//! kubeconfig is all the other cluster's daemon needs; every write with it is refused.
mod support;

use std::time::Duration;

use cross_cluster_controller::remotes::credentials::{self, Credential};
use k8s_openapi::api::authorization::v1::SelfSubjectAccessReview;
use k8s_openapi::api::core::v1::{Namespace, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use secrecy::ExposeSecret;
use serde_json::json;
use support::daemon::{Daemon, run_to_exit};
use support::remotes::remote_access;
use support::{LOCAL, REMOTE, bed, client, eventually, namespace, obj, present};

fn forbidden<T: std::fmt::Debug>(what: &str, r: Result<T, kube::Error>) {
    match r {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 403, "{what}: {s:?}"),
        other => panic!("{what} must be refused with 403, got {other:?}"),
    }
}

#[tokio::test]
async fn remote_access_gives_a_read_only_kubeconfig_the_daemon_runs_with() {
    let ns = namespace("remote-access").await;
    let kc = bed().await.kubeconfig.to_string_lossy().to_string();
    let args = [
        "--kubeconfig",
        &kc,
        "--context",
        REMOTE,
        "--namespace",
        &ns.name,
        "--duration",
        "1h",
        "--cluster-name",
        "east-ro",
    ];
    let (kubeconfig, stderr) = remote_access(&args);
    assert!(stderr.contains("created ServiceAccount"), "{stderr}");
    let (_, again) = remote_access(&args);
    assert!(
        again.contains("reusing ServiceAccount"),
        "a second run reuses it: {again}"
    );

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("remote.kubeconfig");
    std::fs::write(&path, &kubeconfig).unwrap();
    let parsed = Kubeconfig::read_from(&path).unwrap();
    let cfg = Config::from_custom_kubeconfig(parsed, &KubeConfigOptions::default())
        .await
        .unwrap();
    let ro = Client::try_from(cfg).unwrap();

    // every write verb is refused, reads work
    let svcs: Api<Service> = Api::namespaced(ro.clone(), &ns.name);
    svcs.list(&Default::default())
        .await
        .expect("reading Services is allowed");
    let slices: Api<EndpointSlice> = Api::namespaced(ro.clone(), &ns.name);
    slices
        .list(&Default::default())
        .await
        .expect("reading EndpointSlices is allowed");
    let svc: Service = obj(json!({"metadata": {"name": "w"}, "spec": {"ports": [{"port": 80}]}}));
    forbidden("create", svcs.create(&PostParams::default(), &svc).await);
    let admin_svcs: Api<Service> = Api::namespaced(client(REMOTE).await, &ns.name);
    admin_svcs
        .create(&PostParams::default(), &support::exported("storefront", 80))
        .await
        .unwrap();
    forbidden(
        "patch",
        svcs.patch(
            "storefront",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})),
        )
        .await,
    );
    forbidden(
        "update",
        svcs.replace(
            "storefront",
            &PostParams::default(),
            &admin_svcs.get("storefront").await.unwrap(),
        )
        .await,
    );
    forbidden(
        "delete",
        svcs.delete("storefront", &DeleteParams::default()).await,
    );
    let slice: EndpointSlice = obj(
        json!({"metadata": {"name": "s", "labels": {"kubernetes.io/service-name": "storefront"}},
        "addressType": "IPv4", "endpoints": []}),
    );
    forbidden(
        "create slice",
        slices.create(&PostParams::default(), &slice).await,
    );
    let secrets: Api<Secret> = Api::namespaced(ro.clone(), &ns.name);
    forbidden("read secrets", secrets.list(&Default::default()).await);
    // the one namespace it may read is kube-system, by name: its uid is the cluster's id
    let namespaces: Api<Namespace> = Api::all(ro);
    let kube_system = namespaces
        .get("kube-system")
        .await
        .expect("getting the namespace kube-system is allowed");
    assert!(kube_system.metadata.uid.is_some());
    forbidden("get another namespace", namespaces.get(&ns.name).await);
    forbidden("get default", namespaces.get("default").await);
    forbidden(
        "list namespaces",
        namespaces.list(&Default::default()).await,
    );

    // the daemon in the other cluster runs with exactly this kubeconfig for its remote
    let daemon_args: Vec<String> = [
        "--devmode",
        "--local-context",
        LOCAL,
        "--kubeconfig",
        &path.to_string_lossy(),
        "--namespace",
        &ns.name,
        "--watch-namespace",
        &ns.name,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let d = Daemon::start(&daemon_args).await;
    let local: Api<Service> = Api::namespaced(client(LOCAL).await, &ns.name);
    let follower = eventually(
        "the follower, read through the read-only token",
        Duration::from_secs(30),
        || present(&local, "storefront"),
    )
    .await;
    assert_eq!(
        follower
            .metadata
            .annotations
            .unwrap()
            .get("fair.com/cross-cluster-origin-cluster")
            .map(String::as_str),
        Some("east-ro"),
        "the remote is named after the kubeconfig's context"
    );
    drop(d);

    // --output secret is ready to apply in the other cluster
    let (secret_yaml, _) = remote_access(
        &[
            &args[..],
            &["--output", "secret", "--secret-namespace", &ns.name],
        ]
        .concat(),
    );
    let secret: Secret = serde_yaml::from_str(&secret_yaml).unwrap();
    let west_secrets: Api<Secret> = Api::namespaced(client(LOCAL).await, &ns.name);
    let applied = west_secrets
        .create(&PostParams::default(), &secret)
        .await
        .expect("the Secret applies as printed");
    assert_eq!(
        applied.metadata.name.as_deref(),
        Some("cross-cluster-remote-east-ro")
    );
    // what the daemon discovers remotes from: its default selector finds it, named after
    // --cluster-name, the kubeconfig under the key kubeconfig
    let found = west_secrets
        .list(&ListParams::default().labels("fair.com/cross-cluster-remote=true"))
        .await
        .unwrap();
    assert_eq!(found.items.len(), 1, "the default selector finds it");
    let labels = applied.metadata.labels.clone().unwrap();
    assert_eq!(
        labels
            .get("fair.com/cross-cluster-name")
            .map(String::as_str),
        Some("east-ro")
    );
    let data = applied.data.unwrap();
    assert_eq!(data.keys().collect::<Vec<_>>(), ["kubeconfig"]);
    let inner = String::from_utf8(data["kubeconfig"].0.clone()).unwrap();
    let inner = Kubeconfig::from_yaml(&inner).unwrap();
    assert_eq!(inner.current_context.as_deref(), Some("east-ro"));

    // without --cluster-name, the remote is named after the context used
    let (unnamed, _) = remote_access(&[
        "--kubeconfig",
        &kc,
        "--context",
        REMOTE,
        "--namespace",
        &ns.name,
        "--duration",
        "1h",
        "--output",
        "secret",
        "--secret-name",
        "by-context",
        "--secret-namespace",
        &ns.name,
    ]);
    let unnamed: Secret = serde_yaml::from_str(&unnamed).unwrap();
    assert_eq!(unnamed.metadata.name.as_deref(), Some("by-context"));
    assert_eq!(
        unnamed.metadata.labels.unwrap()["fair.com/cross-cluster-name"],
        REMOTE
    );

    let admin = client(REMOTE).await;
    let name = format!("cross-cluster-remote-reader-{}", ns.name);
    let _ = Api::<ClusterRoleBinding>::all(admin.clone())
        .delete(&name, &DeleteParams::default())
        .await;
    let _ = Api::<ClusterRole>::all(admin)
        .delete(&name, &DeleteParams::default())
        .await;
}

#[tokio::test]
async fn an_existing_reader_role_without_the_cluster_id_right_is_named_and_left_alone() {
    let ns = namespace("remote-access-old-role").await;
    let kc = bed().await.kubeconfig.to_string_lossy().to_string();
    let admin = client(REMOTE).await;
    let roles: Api<ClusterRole> = Api::all(admin.clone());
    let name = format!("cross-cluster-remote-reader-{}", ns.name);
    // the ClusterRole as the chart and remote-access made it before the cluster id was read
    let old: ClusterRole = obj(json!({"metadata": {"name": name}, "rules": [
        {"apiGroups": [""], "resources": ["services", "endpoints"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"]}
    ]}));
    roles.create(&PostParams::default(), &old).await.unwrap();
    let (_, stderr) = remote_access(&[
        "--kubeconfig",
        &kc,
        "--context",
        REMOTE,
        "--namespace",
        &ns.name,
        "--duration",
        "1h",
    ]);
    assert!(
        stderr.contains(&format!(
            "warning: the existing ClusterRole {name} does not grant get namespaces/kube-system"
        )),
        "{stderr}"
    );
    assert_eq!(
        roles.get(&name).await.unwrap().rules,
        old.rules,
        "an existing ClusterRole is not changed"
    );
    let _ = Api::<ClusterRoleBinding>::all(admin)
        .delete(&name, &DeleteParams::default())
        .await;
    let _ = roles.delete(&name, &DeleteParams::default()).await;
}

/// Whether the identity of `client` may `verb` `resource` (of `group`, its `subresource`) in
/// `namespace` (None: cluster-wide), as the API server answers a SelfSubjectAccessReview: by
/// name, so the resource's CRD need not be installed.
async fn may(
    client: &Client,
    verb: &str,
    group: &str,
    resource: &str,
    subresource: Option<&str>,
    namespace: Option<&str>,
) -> bool {
    let review: SelfSubjectAccessReview = obj(json!({"spec": {"resourceAttributes": {
        "verb": verb, "group": group, "resource": resource,
        "subresource": subresource, "namespace": namespace,
    }}}));
    Api::<SelfSubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .expect("a SelfSubjectAccessReview")
        .status
        .expect("its status")
        .allowed
}

/// A client whose only credential is the kubeconfig `remote-access` printed.
async fn client_of(kubeconfig: &str, dir: &std::path::Path, file: &str) -> Client {
    let path = dir.join(file);
    std::fs::write(&path, kubeconfig).unwrap();
    let parsed = Kubeconfig::read_from(&path).unwrap();
    let cfg = Config::from_custom_kubeconfig(parsed, &KubeConfigOptions::default())
        .await
        .unwrap();
    Client::try_from(cfg).unwrap()
}

const MCS: &str = "multicluster.x-k8s.io";
const ABOUT: &str = "about.k8s.io";

/// `remote-access --mcs`: its token may list and watch ServiceExports and ClusterProperties of
/// the whole cluster (and unlabelled Services and EndpointSlices), and write nothing of MCS; a
/// token without `--mcs` may not list ServiceExports; a reader ClusterRole an earlier
/// `remote-access` made without the MCS rights is brought up to them when `--mcs` asks for them,
/// and one it did not make (the chart's) is named and left as it is.
#[tokio::test]
async fn a_remote_access_mcs_token_reads_exports_and_properties_and_writes_nothing_of_mcs() {
    let ns = namespace("remote-access-mcs").await;
    let kc = bed().await.kubeconfig.to_string_lossy().to_string();
    let base = [
        "--kubeconfig",
        &kc,
        "--context",
        REMOTE,
        "--namespace",
        &ns.name,
        "--duration",
        "1h",
    ];
    let (mcs_kubeconfig, stderr) =
        remote_access(&[&base[..], &["--service-account", "mcs-reader", "--mcs"]].concat());
    assert!(
        stderr.contains("created ServiceAccount")
            && stderr.contains("serviceexports, clusterproperties"),
        "{stderr}"
    );
    let (plain_kubeconfig, _) =
        remote_access(&[&base[..], &["--service-account", "plain-reader"]].concat());
    let dir = tempfile::tempdir().unwrap();
    let mcs = client_of(&mcs_kubeconfig, dir.path(), "mcs.kubeconfig").await;
    let plain = client_of(&plain_kubeconfig, dir.path(), "plain.kubeconfig").await;

    // reads, cluster-wide (None) and in a namespace
    for scope in [None, Some(ns.name.as_str())] {
        for verb in ["list", "watch"] {
            assert!(
                may(&mcs, verb, MCS, "serviceexports", None, scope).await,
                "{verb} serviceexports in {scope:?}"
            );
            assert!(
                may(&mcs, verb, ABOUT, "clusterproperties", None, scope).await,
                "{verb} clusterproperties in {scope:?}"
            );
            // the Services and EndpointSlices of an exporting namespace carry no label of ours
            assert!(may(&mcs, verb, "", "services", None, scope).await);
            assert!(
                may(
                    &mcs,
                    verb,
                    "discovery.k8s.io",
                    "endpointslices",
                    None,
                    scope
                )
                .await
            );
        }
    }
    // no MCS write of any kind: the exporting cluster's own daemon writes its exports' status,
    // the reading daemon its imports in its own cluster
    let ns_scope = Some(ns.name.as_str());
    for (verb, group, resource, sub) in [
        ("update", MCS, "serviceexports", Some("status")),
        ("patch", MCS, "serviceexports", Some("status")),
        ("create", MCS, "serviceexports", None),
        ("update", MCS, "serviceexports", None),
        ("delete", MCS, "serviceexports", None),
        ("create", MCS, "serviceimports", None),
        ("list", MCS, "serviceimports", None),
        ("update", MCS, "serviceimports", Some("status")),
        ("create", ABOUT, "clusterproperties", None),
        ("update", ABOUT, "clusterproperties", None),
    ] {
        for scope in [None, ns_scope] {
            assert!(
                !may(&mcs, verb, group, resource, sub, scope).await,
                "{verb} {resource}/{sub:?} in {scope:?}"
            );
        }
    }
    // without --mcs: no MCS read either
    for (group, resource) in [(MCS, "serviceexports"), (ABOUT, "clusterproperties")] {
        assert!(!may(&plain, "list", group, resource, None, None).await);
    }
    assert!(may(&plain, "list", "", "services", None, None).await);

    // the plain reader's ClusterRole, ours, asked for with --mcs: brought up to it, nothing
    // taken away; the token made before may now read exports too
    let roles: Api<ClusterRole> = Api::all(client(REMOTE).await);
    let plain_role = format!("plain-reader-{}", ns.name);
    let before = roles.get(&plain_role).await.unwrap().rules.unwrap();
    let (_, stderr) =
        remote_access(&[&base[..], &["--service-account", "plain-reader", "--mcs"]].concat());
    assert!(
        stderr.contains(&format!(
            "updated ClusterRole {plain_role} (made by an earlier remote-access): it now grants \
             list serviceexports.multicluster.x-k8s.io, watch serviceexports.multicluster.x-k8s.io, \
             list clusterproperties.about.k8s.io, watch clusterproperties.about.k8s.io"
        )),
        "{stderr}"
    );
    let after = roles.get(&plain_role).await.unwrap().rules.unwrap();
    assert_eq!(after[..before.len()], before[..], "nothing taken away");
    eventually(
        "the plain reader's token may list ServiceExports",
        Duration::from_secs(30),
        || async {
            may(&plain, "list", MCS, "serviceexports", None, None)
                .await
                .then_some(())
                .ok_or_else(|| "not yet".to_string())
        },
    )
    .await;
    assert!(
        !may(
            &plain,
            "update",
            MCS,
            "serviceexports",
            Some("status"),
            None
        )
        .await
    );
    let (_, again) =
        remote_access(&[&base[..], &["--service-account", "plain-reader", "--mcs"]].concat());
    assert!(!again.contains("updated ClusterRole"), "{again}");
    assert_eq!(roles.get(&plain_role).await.unwrap().rules.unwrap(), after);

    // a reader ClusterRole the chart made (Helm's), asked for with --mcs: named, not changed
    let chart_role = format!("chart-reader-{}", ns.name);
    let chart: ClusterRole = obj(json!({
        "metadata": {"name": chart_role, "labels": {"app.kubernetes.io/managed-by": "Helm"}},
        "rules": before,
    }));
    roles.create(&PostParams::default(), &chart).await.unwrap();
    let (_, stderr) =
        remote_access(&[&base[..], &["--service-account", "chart-reader", "--mcs"]].concat());
    assert!(
        stderr.contains(&format!(
            "warning: the existing ClusterRole {chart_role} does not grant list \
             serviceexports.multicluster.x-k8s.io, watch serviceexports.multicluster.x-k8s.io, \
             list clusterproperties.about.k8s.io, watch clusterproperties.about.k8s.io:"
        )),
        "{stderr}"
    );
    assert_eq!(roles.get(&chart_role).await.unwrap().rules, chart.rules);

    for sa in ["mcs-reader", "plain-reader", "chart-reader"] {
        let name = format!("{sa}-{}", ns.name);
        let _ = Api::<ClusterRoleBinding>::all(client(REMOTE).await)
            .delete(&name, &DeleteParams::default())
            .await;
        let _ = roles.delete(&name, &DeleteParams::default()).await;
    }
}

/// How long the refusals of a reader without the MCS rights are watched for.
const WAIT_403: Duration = Duration::from_secs(60);

/// A reader made without `--mcs`, read by a daemon with `--mcs`: /readyz names the missing
/// right (and the ClusterProperty 403 is retried with a bounded back-off, not several times a
/// second); `remote-access --mcs` for the same reader brings its ClusterRole up, and the
/// cluster's exports arrive with the token the daemon already holds.
#[tokio::test]
async fn remote_access_mcs_brings_an_earlier_reader_up_and_its_exports_arrive() {
    use support::mcs::{crds, export, import_listing, service};
    crds().await;
    let ns = namespace("remote-access-mcs-later").await;
    let kc = bed().await.kubeconfig.to_string_lossy().to_string();
    let east = client(REMOTE).await;
    service(&east, &ns.name, "web", 80, &["10.201.1.5"]).await;
    export(&east, &ns.name, "web").await;
    let base = [
        "--kubeconfig",
        &kc,
        "--context",
        REMOTE,
        "--namespace",
        &ns.name,
        "--duration",
        "1h",
        "--cluster-name",
        REMOTE,
        "--output",
        "secret",
        "--secret-namespace",
        &ns.name,
    ];
    let (secret_yaml, _) = remote_access(&base);
    let secret: Secret = serde_yaml::from_str(&secret_yaml).unwrap();
    Api::<Secret>::namespaced(client(LOCAL).await, &ns.name)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let args = support::daemon::with_args(
        support::remotes::secrets_only_args(&ns.name),
        &["--mcs", "--local-cluster-name", LOCAL],
    );
    let d = Daemon::start_secrets_only(&args).await;
    let wanted = format!("remote {REMOTE}:");
    let line = eventually(
        "/readyz names the missing right",
        Duration::from_secs(60),
        || async {
            let (_, body) = d.readyz()?;
            body.lines()
                .find(|l| {
                    l.starts_with(&wanted)
                        && l.contains("missing right: list, watch clusterproperties.about.k8s.io")
                })
                .map(str::to_string)
                .ok_or(body)
        },
    )
    .await;
    assert!(line.contains("remote-access --mcs"), "{line}");
    // the refusals the daemon logged (kube's watcher logs each attempt's 403, the daemon its
    // first): retried after 1 s doubling, the fifth comes at least 7 s after the first; several
    // a second (kube's back-off, reset before each listing) would bring it within 3 s
    let refusals = |d: &Daemon| {
        d.logs()
            .lines()
            .filter(|l| l.contains("clusterproperties") && l.contains("403"))
            .count()
    };
    let at_least = |n: usize| {
        let d = &d;
        move || async move {
            let seen = refusals(d);
            (seen >= n)
                .then(std::time::Instant::now)
                .ok_or_else(|| format!("{seen} so far"))
        }
    };
    let first = eventually("a ClusterProperty 403 logged", WAIT_403, at_least(1)).await;
    let fifth = eventually("five ClusterProperty 403s logged", WAIT_403, at_least(5)).await;
    assert!(
        fifth - first >= Duration::from_secs(6),
        "five ClusterProperty 403s logged within {:?}:\n{}",
        fifth - first,
        d.logs()
    );

    let (_, stderr) = remote_access(&[&base[..], &["--mcs"]].concat());
    assert!(stderr.contains("updated ClusterRole"), "{stderr}");
    import_listing(&client(LOCAL).await, &ns.name, "web", &[REMOTE]).await;
    eventually(
        "/readyz no longer names a missing right",
        Duration::from_secs(90),
        || async {
            let (_, body) = d.readyz()?;
            match body.lines().find(|l| l.starts_with(&wanted)) {
                Some(l) if l.contains("missing right") => Err(body),
                _ => Ok(()),
            }
        },
    )
    .await;
    drop(d);
    cleanup_reader_roles(&ns.name).await;
}

/// The token in a Secret that `remote-access --output secret` made, as the daemon reads it.
async fn secret_token(secrets: &Api<Secret>, name: &str) -> (String, Credential) {
    let s = secrets.get(name).await.expect("the remote Secret");
    let text = String::from_utf8(s.data.expect("data")["kubeconfig"].0.clone()).unwrap();
    let kc = Kubeconfig::from_yaml(&text).unwrap();
    let user = credentials::user_of(&kc).expect("the context's user");
    let token = user
        .token
        .as_ref()
        .expect("a token")
        .expose_secret()
        .to_string();
    (
        token.clone(),
        credentials::jwt_claims(&token).expect("a JWT"),
    )
}

/// A new token, later than `before`, in the Secret (the daemon renewed it).
async fn renewed_after(secrets: &Api<Secret>, name: &str, before: &Credential) -> Credential {
    eventually(
        "a renewed token with a later exp in the Secret",
        Duration::from_secs(120),
        || async {
            let (_, now) = secret_token(secrets, name).await;
            if now.expiry > before.expiry && now.issued > before.issued {
                Ok(now)
            } else {
                Err(format!("still {now:?}"))
            }
        },
    )
    .await
}

async fn follower_converges(local: &Api<Service>, remote: &Api<Service>, name: &str) {
    remote
        .create(&PostParams::default(), &support::exported(name, 80))
        .await
        .unwrap();
    eventually(
        &format!("follower {name} of a leader made now"),
        Duration::from_secs(30),
        || present(local, name),
    )
    .await;
}

/// The status command's exit code and output for the daemon in `ns` of the local cluster.
fn status(kubeconfig: &str, ns: &str, extra: &[&str]) -> (i32, String) {
    let base = [
        "status",
        "--kubeconfig",
        kubeconfig,
        "--context",
        LOCAL,
        "--namespace",
        ns,
    ];
    run_to_exit(&[&base[..], extra].concat(), &[])
}

#[tokio::test]
async fn the_daemon_renews_a_remote_access_token_before_it_expires_and_after_a_restart() {
    let ns = namespace("token-renewal").await;
    let kc = bed().await.kubeconfig.to_string_lossy().to_string();
    // the shortest lifetime TokenRequest grants
    let (secret_yaml, stderr) = remote_access(&[
        "--kubeconfig",
        &kc,
        "--context",
        REMOTE,
        "--namespace",
        &ns.name,
        "--duration",
        "10m",
        "--cluster-name",
        "east-renew",
        "--output",
        "secret",
        "--secret-namespace",
        &ns.name,
    ]);
    assert!(
        stderr.contains("the daemon reading this Secret renews it"),
        "{stderr}"
    );
    let secret: Secret = serde_yaml::from_str(&secret_yaml).unwrap();
    let secrets: Api<Secret> = Api::namespaced(client(LOCAL).await, &ns.name);
    let name = secrets
        .create(&PostParams::default(), &secret)
        .await
        .unwrap()
        .metadata
        .name
        .unwrap();
    let (first_token, first) = secret_token(&secrets, &name).await;
    let remote: Api<Service> = Api::namespaced(client(REMOTE).await, &ns.name);
    let local: Api<Service> = Api::namespaced(client(LOCAL).await, &ns.name);

    // a window wider than the lifetime: due at once (30 s after issue at the earliest)
    let args = support::daemon::with_args(
        support::remotes::secrets_only_args(&ns.name),
        &["--remote-token-renew-before", "11m"],
    );
    let mut d = Daemon::start_secrets_only(&args).await;
    follower_converges(&local, &remote, "storefront").await;
    let expiry = |d: &Daemon| {
        d.gauge(
            "xcc_remote_credential_expiry_timestamp_seconds",
            &[("remote", "east-renew")],
        )
    };
    eventually(
        "the first token's expiry on /metrics",
        Duration::from_secs(30),
        || async {
            let want = first.expiry.map(|t| t.as_second() as f64);
            if expiry(&d) == want {
                Ok(())
            } else {
                Err(format!("{:?} != {want:?}", expiry(&d)))
            }
        },
    )
    .await;
    let second = renewed_after(&secrets, &name, &first).await;
    let (second_token, _) = secret_token(&secrets, &name).await;
    assert_ne!(second_token, first_token);
    d.wait_metric(
        "xcc_remote_credential_renewals_total",
        &[("remote", "east-renew"), ("outcome", "renewed")],
        1.0,
    )
    .await;
    // the Secret watch rotated the remote onto the new token: its expiry shows, and it is read
    eventually(
        "the renewed token's expiry on /metrics",
        Duration::from_secs(30),
        || async {
            let want = second.expiry.map(|t| t.as_second() as f64);
            if expiry(&d) == want {
                Ok(())
            } else {
                Err(format!("{:?} != {want:?}", expiry(&d)))
            }
        },
    )
    .await;
    assert!(d.metric("xcc_remote_changes_total", &[("change", "rotated")]) >= 1.0);
    present(&local, "storefront")
        .await
        .expect("the follower stays through the rotation");
    follower_converges(&local, &remote, "cart").await;
    // the status command shows the expiry, and exits 3 (all is well, but the credential expires
    // within the default 7 days) once the rotated remote's new watches have listed (until then it
    // is rightly not connected, exit 1)
    let out = eventually(
        "status to name the credential and exit 3",
        Duration::from_secs(60),
        || async {
            let (code, out) = status(&kc, &ns.name, &[]);
            if out.contains("expires in") && code == 3 {
                Ok(out)
            } else {
                Err(format!("exit {code}:\n{out}"))
            }
        },
    )
    .await;
    assert!(out.contains("expires in"), "{out}");
    let (code, out) = status(&kc, &ns.name, &["--credential-expiry-threshold", "1m"]);
    assert_eq!(code, 0, "{out}");

    // a restart loses nothing: the Secret holds the state; the next renewal comes from it
    d.terminate().await;
    let d = Daemon::start_secrets_only(&args).await;
    follower_converges(&local, &remote, "after-restart").await;
    let third = renewed_after(&secrets, &name, &second).await;
    assert!(third.expiry > second.expiry);
    eventually(
        "the third token's expiry on /metrics",
        Duration::from_secs(30),
        || async {
            let want = third.expiry.map(|t| t.as_second() as f64);
            if expiry(&d) == want {
                Ok(())
            } else {
                Err(format!("{:?} != {want:?}", expiry(&d)))
            }
        },
    )
    .await;
    follower_converges(&local, &remote, "after-second-renewal").await;
    for f in ["storefront", "cart", "after-restart"] {
        present(&local, f).await.expect("every follower kept");
    }
    // every renewal the restarted daemon counted, of any outcome, renewed
    assert_eq!(
        d.family_total("xcc_remote_credential_renewals_total"),
        d.metric(
            "xcc_remote_credential_renewals_total",
            &[("remote", "east-renew"), ("outcome", "renewed")]
        ),
        "a renewal failed\n{}",
        d.logs()
    );
    drop(d);
    cleanup_reader_roles(&ns.name).await;
}

async fn cleanup_reader_roles(ns: &str) {
    let admin = client(REMOTE).await;
    let name = format!("cross-cluster-remote-reader-{ns}");
    let _ = Api::<ClusterRoleBinding>::all(admin.clone())
        .delete(&name, &DeleteParams::default())
        .await;
    let _ = Api::<ClusterRole>::all(admin)
        .delete(&name, &DeleteParams::default())
        .await;
}
