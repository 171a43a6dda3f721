//! End to end: the Helm chart on the test bed. Lint, drift from deploy/, server-side dry run,
//! `helm install` into both clusters, and daemons running with exactly the chart's identities
//! (tokens from TokenRequest, never admin certificates), in both directions.
mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use cross_cluster_controller::cli::remote_access::reader_rules;
use cross_cluster_controller::desired::mcs::ServiceExport;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, PolicyRule};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use support::daemon::{BIN, Daemon, with_args};
use support::rbac::{RO, RW, rules, show, union, writer_needs};
use support::tools::{CHART, helm, run, template, tool};
use support::{
    LOCAL, REMOTE, bed, client, eventually, exported, namespace, namespace_in, obj, ports_are,
    present, repo_root,
};

const WAIT: Duration = Duration::from_secs(30);

/// A daemon as the release installed in `ns` runs it (its Lease, its namespace), reading `remote`.
fn release_args(ns: &str, release: &str, remote: &str) -> Vec<String> {
    [
        "--devmode",
        "--namespace",
        ns,
        "--lease-name",
        release,
        "--watch-namespace",
        ns,
        "--cluster-name",
        remote,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

#[tokio::test]
async fn the_chart_lints_clean_and_deploy_does_not_drift() {
    let kc = bed().await.kubeconfig.clone();
    let lint = run(helm(&kc).args(["lint", "--strict", CHART]));
    assert!(lint.contains("0 chart(s) failed"), "{lint}");
    run(Command::new("bash")
        .current_dir(repo_root())
        .arg("scripts/check-deploy"));
}

#[tokio::test]
async fn the_rendered_manifests_are_accepted_by_the_api_server() {
    let kc = bed().await.kubeconfig.clone();
    let ns = namespace("chart-dry-run").await;
    let rendered = run(helm(&kc).args([
        "template",
        "cross-cluster-controller",
        CHART,
        "--namespace",
        &ns.name,
        "--set",
        "serviceMonitor.enabled=false",
        "--set",
        "remoteKubeconfig.existingSecret=x",
        "--kube-version",
        "1.34.4",
    ]));
    server_dry_run(&kc, &ns.name, &rendered);
}

/// `kubectl apply --dry-run=server` of `text` (YAML documents) into `ns` of west: the API server
/// accepts every object, or the test fails with kubectl's words.
fn server_dry_run(kc: &std::path::Path, ns: &str, text: &str) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rendered.yaml");
    std::fs::write(&file, text).unwrap();
    run(Command::new(tool("kubectl"))
        .env("KUBECONFIG", kc)
        .args([
            "--context",
            LOCAL,
            "apply",
            "--dry-run=server",
            "-n",
            ns,
            "-f",
        ])
        .arg(&file));
}

/// The MCS CRDs: none by default; with `mcs.enabled` the three (ServiceExport, ServiceImport,
/// ClusterProperty), each kept by helm on uninstall (they hold the users' objects), accepted by
/// the API server; and the template is what scripts/render-mcs-crds writes today.
#[tokio::test]
async fn the_mcs_crds_come_only_when_asked_and_helm_never_deletes_them() {
    let kc = bed().await.kubeconfig.clone();
    let crds = |docs: &[serde_yaml::Value]| -> Vec<(String, String)> {
        docs.iter()
            .filter(|d| d["kind"] == "CustomResourceDefinition")
            .map(|d| {
                let name = d["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                let keep = d["metadata"]["annotations"]["helm.sh/resource-policy"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                (name, keep)
            })
            .collect()
    };
    let off = template(&kc, &["remoteKubeconfig.existingSecret=x"]).unwrap();
    assert_eq!(crds(&off), vec![], "no CRD without mcs.enabled");
    let elsewhere = template(
        &kc,
        &[
            "remoteKubeconfig.existingSecret=x",
            "mcs.enabled=true",
            "mcs.crds=false",
        ],
    )
    .unwrap();
    assert_eq!(crds(&elsewhere), vec![], "no CRD with mcs.crds=false");
    let on_text = support::tools::template_text(
        &kc,
        "fair-system",
        &["remoteKubeconfig.existingSecret=x", "mcs.enabled=true"],
    )
    .unwrap();
    let on = support::tools::documents(&on_text);
    let keep = |n: &str| (n.to_string(), "keep".to_string());
    assert_eq!(
        crds(&on),
        vec![
            keep("serviceexports.multicluster.x-k8s.io"),
            keep("serviceimports.multicluster.x-k8s.io"),
            keep("clusterproperties.about.k8s.io"),
        ]
    );
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("crds.yaml");
    let only: Vec<&serde_yaml::Value> = on
        .iter()
        .filter(|d| d["kind"] == "CustomResourceDefinition")
        .collect();
    let text: Vec<String> = only
        .iter()
        .map(|d| serde_yaml::to_string(d).unwrap())
        .collect();
    std::fs::write(&file, text.join("---\n")).unwrap();
    run(Command::new(tool("kubectl"))
        .env("KUBECONFIG", &kc)
        .args(["--context", LOCAL, "apply", "--dry-run=server", "-f"])
        .arg(&file));
    let rendered = dir.path().join("mcs-crds.yaml");
    run(Command::new("bash")
        .current_dir(repo_root())
        .arg("scripts/render-mcs-crds")
        .arg(&rendered));
    let committed = repo_root().join("charts/cross-cluster-controller/templates/mcs-crds.yaml");
    assert!(
        std::fs::read_to_string(&rendered).unwrap() == std::fs::read_to_string(committed).unwrap(),
        "templates/mcs-crds.yaml drifted from scripts/render-mcs-crds: run it again"
    );
}

/// What a render gives the daemon about its remotes: the env values it reads them from, the
/// Secret mounted as the static remote, and the verbs of Roles on Secrets.
#[derive(Debug, PartialEq)]
struct Remotes {
    env: BTreeMap<String, String>,
    static_secret: Option<String>,
    secret_verbs: Vec<String>,
}

fn remotes(docs: &[serde_yaml::Value]) -> Remotes {
    let deployment = docs
        .iter()
        .find(|d| d["kind"] == "Deployment")
        .expect("a Deployment");
    let pod = &deployment["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let env = container["env"]
        .as_sequence()
        .unwrap()
        .iter()
        .filter(|e| {
            e["name"]
                .as_str()
                .is_some_and(|n| n.starts_with("REMOTE_") || n == "KUBECONFIG_PATH")
        })
        .map(|e| {
            (
                e["name"].as_str().unwrap().to_string(),
                e["value"]
                    .as_str()
                    .expect("a plain string value")
                    .to_string(),
            )
        })
        .collect();
    let volume = pod["volumes"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "remote-kubeconfig");
    let mounted = container["volumeMounts"]
        .as_sequence()
        .unwrap()
        .iter()
        .any(|m| m["name"] == "remote-kubeconfig");
    assert_eq!(volume.is_some(), mounted, "volume and mount go together");
    let static_secret = volume.map(|v| v["secret"]["secretName"].as_str().unwrap().to_string());
    let mut secret_verbs = Vec::new();
    for doc in docs {
        let kind = doc["kind"].as_str().unwrap_or_default();
        for rule in doc["rules"].as_sequence().into_iter().flatten() {
            let resources = rule["resources"].as_sequence().unwrap();
            if resources.iter().any(|r| r == "secrets" || r == "*") {
                assert_eq!(kind, "Role", "Secrets only in a namespaced Role: {doc:?}");
                assert_eq!(doc["metadata"]["namespace"], "fair-system");
                secret_verbs.extend(
                    rule["verbs"]
                        .as_sequence()
                        .unwrap()
                        .iter()
                        .map(|v| v.as_str().unwrap().to_string()),
                );
            }
        }
    }
    Remotes {
        env,
        static_secret,
        secret_verbs,
    }
}

#[tokio::test]
async fn the_chart_reads_remotes_from_secrets_and_mounts_a_static_one_only_when_asked() {
    let kc = bed().await.kubeconfig.clone();
    let env = |v: &[(&str, &str)]| -> BTreeMap<String, String> {
        v.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let ro = vec!["get".to_string(), "list".to_string(), "watch".to_string()];
    // token renewal (on by default) writes renewed tokens back into the remote Secrets
    let rw = [&ro[..], &["update".to_string()]].concat();
    let discovery = [
        (
            "REMOTE_SECRET_SELECTOR",
            "fair.com/cross-cluster-remote=true",
        ),
        ("REMOTE_REMOVAL_GRACE_SECONDS", "30"),
        ("REMOTE_TOKEN_RENEW_BEFORE", "20%"),
    ];
    // the defaults: remotes from labelled Secrets, no static remote
    assert_eq!(
        remotes(&template(&kc, &[]).unwrap()),
        Remotes {
            env: env(&discovery),
            static_secret: None,
            secret_verbs: rw.clone(),
        }
    );
    // renewal off: no update on Secrets, and the daemon is told not to renew
    let mut off = discovery;
    off[2].1 = "off";
    assert_eq!(
        remotes(&template(&kc, &["tokenRenewal.enabled=false"]).unwrap()),
        Remotes {
            env: env(&off),
            static_secret: None,
            secret_verbs: ro.clone(),
        }
    );
    // a static remote as well, only when asked for
    let static_env = [
        ("KUBECONFIG_PATH", "/etc/cross-cluster/kubeconfig"),
        ("REMOTE_SECRET_SELECTOR", "team=a"),
        ("REMOTE_REMOVAL_GRACE_SECONDS", "120"),
        ("REMOTE_TOKEN_RENEW_BEFORE", "20%"),
    ];
    assert_eq!(
        remotes(
            &template(
                &kc,
                &[
                    "remoteKubeconfig.existingSecret=mine",
                    "remoteSecretSelector=team=a",
                    "remoteRemovalGraceSeconds=120"
                ]
            )
            .unwrap()
        ),
        Remotes {
            env: env(&static_env),
            static_secret: Some("mine".into()),
            secret_verbs: rw.clone(),
        }
    );
    // the static remote alone: the selector is passed empty (it turns Secrets off) and no
    // Secret is granted
    let created = remotes(
        &template(
            &kc,
            &[
                "remoteKubeconfig.create=true",
                "remoteKubeconfig.content=apiVersion: v1",
                "remoteSecretSelector=",
            ],
        )
        .unwrap(),
    );
    assert_eq!(
        created,
        Remotes {
            env: env(&[
                ("KUBECONFIG_PATH", "/etc/cross-cluster/kubeconfig"),
                ("REMOTE_SECRET_SELECTOR", ""),
                ("REMOTE_REMOVAL_GRACE_SECONDS", "30"),
                ("REMOTE_TOKEN_RENEW_BEFORE", "off"),
            ]),
            static_secret: Some("cross-cluster-controller-remote-kubeconfig".into()),
            secret_verbs: vec![],
        }
    );
    // no remote at all is refused
    let err = template(&kc, &["remoteSecretSelector="]).unwrap_err();
    assert!(err.contains("no remote cluster"), "{err}");
    // exec plugins a remote Secret may run: passed only when named, by absolute path
    let allowed = remotes(
        &template(
            &kc,
            &["remoteSecretAllowExec={/usr/local/bin/aws,/usr/local/bin/eks-token}"],
        )
        .unwrap(),
    );
    assert_eq!(
        allowed
            .env
            .get("REMOTE_SECRET_ALLOW_EXEC")
            .map(String::as_str),
        Some("/usr/local/bin/aws,/usr/local/bin/eks-token")
    );
    let err = template(&kc, &["remoteSecretAllowExec={aws}"]).unwrap_err();
    assert!(err.contains("remoteSecretAllowExec"), "{err}");
    // a remote Secret must pin its cluster id only when asked
    let pin_flag = |sets: &[&str]| -> bool {
        let docs = template(&kc, sets).unwrap();
        pod_template(&docs)["spec"]["containers"][0]["args"]
            .as_sequence()
            .unwrap()
            .iter()
            .any(|a| a == "--require-cluster-id-pin")
    };
    assert!(!pin_flag(&[]), "off by default");
    assert!(pin_flag(&["requireClusterIdPin=true"]));
}

/// A kubeconfig whose only credential is a TokenRequest token of `sa` in `ns` of `context`.
async fn token_kubeconfig(context: &str, ns: &str, sa: &str, dir: &Path) -> PathBuf {
    let token = support::mint_token(context, ns, sa).await;
    let path = dir.join(format!("{context}-{sa}.kubeconfig"));
    support::token_kubeconfig(context, context, &token, &path).await;
    path
}

fn remote_access(kubeconfig: &Path, context: &str, ns: &str, sa: &str, out: &Path) {
    let text = run(Command::new(BIN)
        .args([
            "remote-access",
            "--context",
            context,
            "--namespace",
            ns,
            "--service-account",
            sa,
            "--duration",
            "1h",
        ])
        .arg("--kubeconfig")
        .arg(kubeconfig));
    std::fs::write(out, text).unwrap();
}

/// The chart installed in both clusters into `ns` (a release and a remote reader named after
/// it), with `sets(context)` as extra `--set`s; returns (release, reader).
fn install_in_both(kc: &Path, ns: &str, sets: impl Fn(&str) -> Vec<String>) -> (String, String) {
    let release = format!("cross-cluster-controller-{}", &ns[ns.len() - 8..]);
    let reader = format!("reader-{}", &ns[ns.len() - 8..]);
    for ctx in [REMOTE, LOCAL] {
        let mut cmd = helm(kc);
        cmd.args([
            "install",
            &release,
            CHART,
            "--kube-context",
            ctx,
            "--namespace",
            ns,
        ])
        .args(["--set", "remoteKubeconfig.existingSecret=remote-kubeconfig"])
        .args([
            "--set",
            &format!("remoteReader.serviceAccountName={reader}"),
        ]);
        for set in sets(ctx) {
            cmd.args(["--set", &set]);
        }
        run(&mut cmd);
    }
    (release, reader)
}

#[tokio::test]
async fn installed_in_both_clusters_it_mirrors_both_ways_with_only_the_charts_identities() {
    let bed = bed().await;
    let kc = bed.kubeconfig.clone();
    let ns = namespace("chart-install").await;
    let (release, reader) = install_in_both(&kc, &ns.name, |_| {
        vec!["sweepSchedule=*/2 * * * * *".into()]
    });
    let dir = tempfile::tempdir().unwrap();
    // each daemon: its own cluster through the chart's writer ServiceAccount, the other cluster
    // through the other chart's read-only ServiceAccount (via the remote-access subcommand)
    let mut daemons = Vec::new();
    for (local, remote) in [(LOCAL, REMOTE), (REMOTE, LOCAL)] {
        let local_kc = token_kubeconfig(local, &ns.name, &release, dir.path()).await;
        let remote_kc = dir.path().join(format!("{remote}-reader.kubeconfig"));
        remote_access(&kc, remote, &ns.name, &reader, &remote_kc);
        let args = with_args(
            release_args(&ns.name, &release, remote),
            &["--kubeconfig", &remote_kc.to_string_lossy()],
        );
        let d = Daemon::start_with_env(&args, &[("KUBECONFIG", &local_kc.to_string_lossy())]).await;
        daemons.push((local, d));
    }
    for (local, d) in &daemons {
        // each reads the other cluster, under that cluster's name (--cluster-name)
        let remote = if *local == LOCAL { REMOTE } else { LOCAL };
        d.wait_synced(&[remote]).await;
    }

    let east: Api<Service> = Api::namespaced(client(REMOTE).await, &ns.name);
    let west: Api<Service> = Api::namespaced(client(LOCAL).await, &ns.name);
    east.create(&PostParams::default(), &exported("from-east", 80))
        .await
        .unwrap();
    west.create(&PostParams::default(), &exported("from-west", 80))
        .await
        .unwrap();
    for (api, name) in [(&west, "from-east"), (&east, "from-west")] {
        eventually("a follower in the other cluster", WAIT, || {
            present(api, name)
        })
        .await;
    }

    // take the writer's permissions away in west: a clear permission error, nothing written
    let crbs: Api<ClusterRoleBinding> = Api::all(client(LOCAL).await);
    crbs.delete(&release, &DeleteParams::default())
        .await
        .unwrap();
    east.create(&PostParams::default(), &exported("after-revoke", 80))
        .await
        .unwrap();
    let west_daemon = &daemons.iter().find(|(l, _)| *l == LOCAL).unwrap().1;
    // the reconcile of that very key must have hit the permission error (a failing watch alone
    // would also say "forbidden" before any write was tried)
    eventually(
        "the write of the new follower to be refused",
        WAIT,
        || async {
            let logs = west_daemon.logs();
            let refused = logs.lines().any(|l| {
                l.contains("after-revoke")
                    && l.contains("reconcile failed")
                    && l.contains("forbidden")
            });
            if refused {
                Ok(())
            } else {
                Err("not refused yet".to_string())
            }
        },
    )
    .await;
    assert!(
        west.get_opt("after-revoke").await.unwrap().is_none(),
        "nothing is written without permission"
    );
    assert!(
        west.get_opt("from-east").await.unwrap().is_some(),
        "and nothing is lost either"
    );

    drop(daemons);
    for ctx in [REMOTE, LOCAL] {
        run(helm(&kc).args([
            "uninstall",
            &release,
            "--kube-context",
            ctx,
            "--namespace",
            &ns.name,
        ]));
    }
}

#[tokio::test]
async fn with_mcs_the_charts_identities_import_both_ways() {
    let bed = bed().await;
    let kc = bed.kubeconfig.clone();
    support::mcs::crds().await;
    let ns = namespace("chart-mcs").await;
    let (release, reader) = install_in_both(&kc, &ns.name, |ctx| {
        ["mcs.enabled=true", "mcs.crds=false"]
            .map(String::from)
            .into_iter()
            .chain([format!("mcs.clusterName={ctx}")])
            .collect()
    });
    let dir = tempfile::tempdir().unwrap();
    // each daemon: its own cluster through the chart's writer, the other through a
    // `remote-access --mcs` reader: only the rights the chart and remote-access grant
    let mut daemons = Vec::new();
    for (local, remote) in [(LOCAL, REMOTE), (REMOTE, LOCAL)] {
        let local_kc = token_kubeconfig(local, &ns.name, &release, dir.path()).await;
        let remote_kc = dir.path().join(format!("{remote}-reader.kubeconfig"));
        let text = run(Command::new(BIN)
            .args([
                "remote-access",
                "--context",
                remote,
                "--namespace",
                &ns.name,
            ])
            .args(["--service-account", &reader, "--duration", "1h", "--mcs"])
            .arg("--kubeconfig")
            .arg(&kc));
        std::fs::write(&remote_kc, text).unwrap();
        let args = with_args(
            release_args(&ns.name, &release, remote),
            &[
                "--kubeconfig",
                &remote_kc.to_string_lossy(),
                "--mcs",
                "--local-cluster-name",
                local,
            ],
        );
        let d = Daemon::start_with_env(&args, &[("KUBECONFIG", &local_kc.to_string_lossy())]).await;
        daemons.push(d);
    }
    let (east, west) = (client(REMOTE).await, client(LOCAL).await);
    support::mcs::service(&east, &ns.name, "from-east", 80, &["10.201.1.5"]).await;
    support::mcs::export(&east, &ns.name, "from-east").await;
    support::mcs::service(&west, &ns.name, "from-west", 80, &["10.202.1.5"]).await;
    support::mcs::export(&west, &ns.name, "from-west").await;
    // each import in both clusters, the exporter's included, with ClusterIPs and its cluster
    for c in [&east, &west] {
        support::mcs::import_listing(c, &ns.name, "from-east", &[REMOTE]).await;
        support::mcs::import_listing(c, &ns.name, "from-west", &[LOCAL]).await;
    }
    // and each exporter's daemon wrote its ServiceExport's status
    for (c, name) in [(&east, "from-east"), (&west, "from-west")] {
        let exports: Api<ServiceExport> = Api::namespaced(c.clone(), &ns.name);
        eventually("the export Ready", WAIT, || async {
            let se = exports.get(name).await.map_err(|e| e.to_string())?;
            let ready = se
                .status
                .iter()
                .flat_map(|s| &s.conditions)
                .any(|c| c.type_ == "Ready" && c.status == "True");
            if ready {
                Ok(())
            } else {
                Err(format!("{:?}", se.status))
            }
        })
        .await;
    }
    for d in &daemons {
        // no write refused for want of a right, and every listing done (a forbidden list or
        // watch would keep a remote, or the MCS caches, from /readyz's 200)
        // (a family with no series yet is not on the page: none is no 403; the counting itself
        // is src/reconcile/writer.rs's a_refused_or_unanswered_write_is_counted_by_its_code)
        let forbidden = support::metrics::series_sum(
            &d.metrics(),
            "xcc_write_errors_total",
            &[("code", "403")],
        );
        assert_eq!(forbidden, 0.0, "{}", d.logs());
        let (code, body) = d.readyz().expect("/readyz");
        assert_eq!(code, 200, "{body}\n{}", d.logs());
    }
    drop(daemons);
    for ctx in [REMOTE, LOCAL] {
        run(helm(&kc).args([
            "uninstall",
            &release,
            "--kube-context",
            ctx,
            "--namespace",
            &ns.name,
        ]));
    }
}

/// What `kubectl auth can-i --list` grants `who` in `ns` of the local cluster (see
/// [`support::rbac::granted`]).
fn granted(kubeconfig: &Path, ns: &str, who: &str) -> BTreeMap<String, BTreeSet<String>> {
    support::rbac::granted(kubeconfig, LOCAL, ns, who)
}

fn can_i(kubeconfig: &Path, ns: &str, who: &str, verb: &str, resource: &str) -> bool {
    can_i_with(kubeconfig, ns, who, &[verb, resource])
}

/// `kubectl auth can-i` with these arguments, as `who` in `ns`.
fn can_i_with(kubeconfig: &Path, ns: &str, who: &str, what: &[&str]) -> bool {
    let out = Command::new(tool("kubectl"))
        .env("KUBECONFIG", kubeconfig)
        .args(["--context", LOCAL, "auth", "can-i"])
        .args(what)
        .args(["-n", ns, "--as", who])
        .output()
        .expect("run kubectl");
    String::from_utf8_lossy(&out.stdout).trim() == "yes"
}

/// What the other cluster's daemon reads with the remote reader's token: Services and their
/// endpoints, and the namespace kube-system (its uid is the cluster's id).
fn reader_needs() -> BTreeMap<String, BTreeSet<String>> {
    rules(&[
        ("endpoints", RO),
        ("endpointslices.discovery.k8s.io", RO),
        ("namespaces[kube-system]", &["get"]),
        // a token for itself only, so the other cluster's daemon renews it
        (
            "serviceaccounts/token[cross-cluster-remote-reader]",
            &["create"],
        ),
        ("services", RO),
    ])
}

/// What the daemon sends with `--mcs` on top, in its own cluster: its ServiceExports read, only
/// their status written; ServiceImports created, updated, deleted (get after a 409), and their
/// status; the ClusterProperty listed and watched (the derived Services and the MCS slices are
/// `services` and `endpointslices`, granted already).
fn mcs_writer_needs() -> BTreeMap<String, BTreeSet<String>> {
    rules(&[
        ("clusterproperties.about.k8s.io", &["list", "watch"]),
        ("serviceexports.multicluster.x-k8s.io", &["list", "watch"]),
        ("serviceexports.multicluster.x-k8s.io/status", &["update"]),
        ("serviceimports.multicluster.x-k8s.io", RW),
        ("serviceimports.multicluster.x-k8s.io/status", &["update"]),
    ])
}

/// What a daemon with `--mcs` reads of a remote on top: its ServiceExports and ClusterProperty
/// (the unlabelled Services and EndpointSlices of exporting namespaces: granted already).
fn mcs_reader_needs() -> BTreeMap<String, BTreeSet<String>> {
    rules(&[
        ("clusterproperties.about.k8s.io", &["list", "watch"]),
        ("serviceexports.multicluster.x-k8s.io", &["list", "watch"]),
    ])
}

/// The rules of the ClusterRole `name` of a render, as `granted` keys them (`resource.group`,
/// `[names]` when limited to named objects), so that a render compares with the needs above.
fn rendered_rules(docs: &[serde_yaml::Value], name: &str) -> BTreeMap<String, BTreeSet<String>> {
    let role = docs
        .iter()
        .find(|d| d["kind"] == "ClusterRole" && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no ClusterRole {name}"));
    let strings = |v: &serde_yaml::Value| -> Vec<String> {
        v.as_sequence()
            .into_iter()
            .flatten()
            .map(|x| x.as_str().expect("a string").to_string())
            .collect()
    };
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for rule in role["rules"].as_sequence().expect("rules") {
        let names = strings(&rule["resourceNames"]);
        for group in strings(&rule["apiGroups"]) {
            for resource in strings(&rule["resources"]) {
                // kubectl's spelling: resource.group, a subresource after the group
                let (res, sub) = match resource.split_once('/') {
                    Some((r, s)) => (r.to_string(), format!("/{s}")),
                    None => (resource.clone(), String::new()),
                };
                let mut key = if group.is_empty() {
                    format!("{res}{sub}")
                } else {
                    format!("{res}.{group}{sub}")
                };
                if !names.is_empty() {
                    key = format!("{key}[{}]", names.join(" "));
                }
                out.entry(key).or_default().extend(strings(&rule["verbs"]));
            }
        }
    }
    out
}

/// The daemon's arguments in a render that concern MCS.
fn mcs_args(docs: &[serde_yaml::Value]) -> Vec<String> {
    let deployment = docs
        .iter()
        .find(|d| d["kind"] == "Deployment")
        .expect("a Deployment");
    deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_sequence()
        .expect("args")
        .iter()
        .map(|a| a.as_str().expect("a string argument").to_string())
        .filter(|a| a.starts_with("--mcs") || a.starts_with("--local-cluster-name"))
        .collect()
}

/// The documents of a render, the Deployment's arguments starting with `prefix` left out.
fn without_args(docs: &[serde_yaml::Value], prefix: &str) -> Vec<serde_yaml::Value> {
    let mut docs = docs.to_vec();
    for d in &mut docs {
        if d["kind"] == "Deployment" {
            let args = &mut d["spec"]["template"]["spec"]["containers"][0]["args"];
            let seq = args.as_sequence_mut().expect("args");
            seq.retain(|a| !a.as_str().is_some_and(|a| a.starts_with(prefix)));
        }
    }
    docs
}

/// The documents of a render without the CustomResourceDefinitions.
fn without_crds(docs: &[serde_yaml::Value]) -> Vec<serde_yaml::Value> {
    docs.iter()
        .filter(|d| d["kind"] != "CustomResourceDefinition")
        .cloned()
        .collect()
}

/// `mcs.*` values change exactly what they say, in a render: `enabled` adds `--mcs` and the MCS
/// rules (the writer's and the reader's, nothing else) and the CRDs; `clusterName` adds
/// `--local-cluster-name`; `crds=false` drops the CRDs and nothing else. The reader's rules are
/// `remote-access --mcs`'s own.
#[tokio::test]
async fn the_mcs_values_add_exactly_the_flags_the_rules_and_the_crds_asked_for() {
    let kc = bed().await.kubeconfig.clone();
    let writer = "cross-cluster-controller";
    let reader = "cross-cluster-remote-reader-fair-system";
    let off = template(&kc, &[]).unwrap();
    let on = template(&kc, &["mcs.enabled=true"]).unwrap();
    let named = template(&kc, &["mcs.enabled=true", "mcs.clusterName=west"]).unwrap();
    let elsewhere = template(&kc, &["mcs.enabled=true", "mcs.crds=false"]).unwrap();

    // off (the default): no flag, no rule of either API group, the rules of the daemon without it
    assert_eq!(mcs_args(&off), Vec::<String>::new());
    assert_eq!(rendered_rules(&off, writer), writer_needs_rendered());
    assert_eq!(rendered_rules(&off, reader), reader_needs_rendered());
    let text = off
        .iter()
        .map(|d| serde_yaml::to_string(d).unwrap())
        .collect::<String>();
    for group in ["multicluster.x-k8s.io", "about.k8s.io"] {
        assert!(!text.contains(group), "{group} without mcs.enabled");
    }

    // on: --mcs, and exactly the MCS rules on top
    assert_eq!(mcs_args(&on), ["--mcs"]);
    assert_eq!(
        rendered_rules(&on, writer),
        union(&writer_needs_rendered(), &mcs_writer_needs())
    );
    assert_eq!(
        rendered_rules(&on, reader),
        union(&reader_needs_rendered(), &mcs_reader_needs())
    );
    // everything else is as without mcs: the other documents, the Deployment but for --mcs
    let strip = |docs: &[serde_yaml::Value]| -> Vec<serde_yaml::Value> {
        without_args(&without_crds(docs), "--mcs")
            .into_iter()
            .filter(|d| {
                !(d["kind"] == "ClusterRole"
                    && (d["metadata"]["name"] == writer || d["metadata"]["name"] == reader))
            })
            .collect()
    };
    assert_eq!(strip(&on), strip(&off));

    // the reader's rules are exactly remote-access's, with and without --mcs
    for (docs, mcs) in [(&off, false), (&on, true)] {
        let role = docs
            .iter()
            .find(|d| d["kind"] == "ClusterRole" && d["metadata"]["name"] == reader)
            .unwrap();
        let chart: Vec<PolicyRule> = serde_yaml::from_value(role["rules"].clone()).unwrap();
        let cli: Vec<PolicyRule> = serde_json::from_value(reader_rules(mcs)).unwrap();
        assert_eq!(chart, cli, "remote-access's rules (mcs {mcs})");
    }

    // clusterName: --local-cluster-name, nothing else changes
    assert_eq!(mcs_args(&named), ["--mcs", "--local-cluster-name=west"]);
    assert_eq!(without_args(&named, "--local-cluster-name"), on);

    // crds=false: the same render without the three CRDs
    assert_eq!(on.len(), elsewhere.len() + 3);
    assert_eq!(elsewhere, without_crds(&on));

    // a cluster name without mcs, or one that cannot name a cluster, is refused
    let err = template(&kc, &["mcs.clusterName=west"]).unwrap_err();
    assert!(err.contains("needs mcs.enabled=true"), "{err}");
    for bad in ["West", "west_1", "-west", &"a".repeat(64)] {
        let set = format!("mcs.clusterName={bad}");
        let err = template(&kc, &["mcs.enabled=true", &set]).unwrap_err();
        assert!(err.contains("clusterName"), "{bad}: {err}");
    }
}

/// `writer_needs` as the chart's ClusterRole holds it: the Lease and Secret rights are in Roles
/// of the release namespace, not in the ClusterRole.
fn writer_needs_rendered() -> BTreeMap<String, BTreeSet<String>> {
    let mut needs = writer_needs();
    needs.remove("leases.coordination.k8s.io");
    needs.remove("secrets");
    needs
}

/// `reader_needs` as the reader's ClusterRole holds it: its token right is in a Role.
fn reader_needs_rendered() -> BTreeMap<String, BTreeSet<String>> {
    let mut needs = reader_needs();
    needs.retain(|k, _| !k.starts_with("serviceaccounts/token"));
    needs
}

/// Installed with `mcs.enabled=true` (the CRDs left out, as for a cluster that has them from
/// elsewhere: RBAC is about names, the CRDs need not be there), the two identities are granted,
/// as the API server says, exactly what the daemon sends with `--mcs` on top; the writer may
/// write ServiceExports' status only, the reader no MCS write at all.
#[tokio::test]
async fn with_mcs_the_charts_identities_are_granted_exactly_what_the_daemon_sends() {
    let bed = bed().await;
    let kc = bed.kubeconfig.clone();
    let ns = namespace("chart-rbac-mcs").await;
    let release = format!("cross-cluster-controller-{}", &ns.name[ns.name.len() - 8..]);
    run(helm(&kc).args([
        "install",
        &release,
        CHART,
        "--kube-context",
        LOCAL,
        "--namespace",
        &ns.name,
        "--set",
        "remoteKubeconfig.existingSecret=remote-kubeconfig",
        "--set",
        "mcs.enabled=true",
        "--set",
        "mcs.crds=false",
        "--set",
        "mcs.clusterName=west",
    ]));
    let writer = format!("system:serviceaccount:{}:{release}", ns.name);
    let reader = format!(
        "system:serviceaccount:{}:cross-cluster-remote-reader",
        ns.name
    );
    let writer_has = granted(&kc, &ns.name, &writer);
    let reader_has = granted(&kc, &ns.name, &reader);
    assert_eq!(
        writer_has,
        union(&writer_needs(), &mcs_writer_needs()),
        "the writer's rights with mcs"
    );
    assert_eq!(
        reader_has,
        union(&reader_needs(), &mcs_reader_needs()),
        "the reader's rights with mcs"
    );
    for (verb, resource) in [
        ("update", "serviceexports.multicluster.x-k8s.io"),
        ("create", "serviceexports.multicluster.x-k8s.io"),
        ("delete", "serviceexports.multicluster.x-k8s.io"),
        ("patch", "serviceimports.multicluster.x-k8s.io"),
        ("create", "clusterproperties.about.k8s.io"),
    ] {
        assert!(
            !can_i(&kc, &ns.name, &writer, verb, resource),
            "the writer may {verb} {resource}"
        );
    }
    // no finalizers right: the derived objects' ownerReference does not block the import's
    // deletion (kubectl reads TYPE/NAME as a name, so the subresource is a flag)
    let finalizers = [
        "update",
        "serviceimports.multicluster.x-k8s.io",
        "--subresource=finalizers",
    ];
    assert!(!can_i_with(&kc, &ns.name, &writer, &finalizers));
    for (verb, resource) in [
        ("update", "serviceexports.multicluster.x-k8s.io/status"),
        ("create", "serviceimports.multicluster.x-k8s.io"),
        ("list", "serviceimports.multicluster.x-k8s.io"),
    ] {
        assert!(
            !can_i(&kc, &ns.name, &reader, verb, resource),
            "the reader may {verb} {resource}"
        );
    }
    // the Deployment runs the daemon with --mcs and the cluster's name
    let deployment: Api<k8s_openapi::api::apps::v1::Deployment> =
        Api::namespaced(client(LOCAL).await, &ns.name);
    let args = deployment
        .get(&release)
        .await
        .unwrap()
        .spec
        .unwrap()
        .template
        .spec
        .unwrap()
        .containers[0]
        .args
        .clone()
        .unwrap_or_default();
    assert!(args.iter().any(|a| a == "--mcs"), "{args:?}");
    assert!(
        args.iter().any(|a| a == "--local-cluster-name=west"),
        "{args:?}"
    );
    run(helm(&kc).args([
        "uninstall",
        &release,
        "--kube-context",
        LOCAL,
        "--namespace",
        &ns.name,
    ]));
}

#[tokio::test]
async fn the_charts_identities_are_granted_exactly_what_the_daemon_uses() {
    let bed = bed().await;
    let kc = bed.kubeconfig.clone();
    let ns = namespace("chart-rbac").await;
    let release = format!("cross-cluster-controller-{}", &ns.name[ns.name.len() - 8..]);
    run(helm(&kc).args([
        "install",
        &release,
        CHART,
        "--kube-context",
        LOCAL,
        "--namespace",
        &ns.name,
        "--set",
        "remoteKubeconfig.existingSecret=remote-kubeconfig",
    ]));
    let writer = format!("system:serviceaccount:{}:{release}", ns.name);
    let reader = format!(
        "system:serviceaccount:{}:cross-cluster-remote-reader",
        ns.name
    );

    let writer_needs = writer_needs();
    let reader_needs = reader_needs();
    let writer_has = granted(&kc, &ns.name, &writer);
    let reader_has = granted(&kc, &ns.name, &reader);
    assert_eq!(writer_has, writer_needs, "the writer's rights");
    assert_eq!(reader_has, reader_needs, "the reader's rights");
    // the writer's Secrets are those of the release namespace, no other; the reader has none
    for verb in ["get", "list", "watch", "update"] {
        assert!(
            can_i(&kc, &ns.name, &writer, verb, "secrets"),
            "the writer may {verb} Secrets in {}",
            ns.name
        );
        for other in ["kube-system", "default"] {
            assert!(
                !can_i(&kc, other, &writer, verb, "secrets"),
                "the writer may {verb} Secrets in {other}"
            );
        }
        for any in [ns.name.as_str(), "kube-system", "default"] {
            assert!(
                !can_i(&kc, any, &reader, verb, "secrets"),
                "the reader may {verb} Secrets in {any}"
            );
        }
    }
    // the reader's one namespace is kube-system, and only by name
    assert!(can_i(
        &kc,
        &ns.name,
        &reader,
        "get",
        "namespaces/kube-system"
    ));
    assert!(!can_i(&kc, &ns.name, &reader, "get", "namespaces/default"));
    assert!(!can_i(
        &kc,
        &ns.name,
        &reader,
        "get",
        &format!("namespaces/{}", ns.name)
    ));
    assert!(!can_i(&kc, &ns.name, &reader, "list", "namespaces"));
    // the Lease right is confined to the release namespace
    assert!(can_i(&kc, &ns.name, &writer, "update", "leases"));
    assert!(!can_i(&kc, "kube-system", &writer, "update", "leases"));
    assert!(!can_i(&kc, &ns.name, &reader, "watch", "leases"));

    // and that is enough: a daemon writing with exactly the writer's token creates, updates and
    // deletes followers and records an Event (the remote here is read with the bed's admin)
    let dir = tempfile::tempdir().unwrap();
    let local_kc = token_kubeconfig(LOCAL, &ns.name, &release, dir.path()).await;
    let args = with_args(
        release_args(&ns.name, &release, REMOTE),
        &["--remote-context", REMOTE, "--lease-duration-seconds", "6"],
    );
    let d = Daemon::start_with_env(&args, &[("KUBECONFIG", &local_kc.to_string_lossy())]).await;
    d.wait_synced(&[REMOTE]).await;
    let east: Api<Service> = Api::namespaced(client(REMOTE).await, &ns.name);
    let west: Api<Service> = Api::namespaced(client(LOCAL).await, &ns.name);
    let pp = PostParams::default();
    west.create(
        &pp,
        &obj(json!({"metadata": {"name": "shadow"}, "spec": {"ports": [{"port": 5432}]}})),
    )
    .await
    .unwrap();
    // a follower that exists before the changes and whose leader stays: the one that could be lost
    east.create(&pp, &exported("keep", 80)).await.unwrap();
    eventually("the follower kept throughout", WAIT, || {
        present(&west, "keep")
    })
    .await;
    let before = support::fault::snapshot(&client(LOCAL).await, &[&ns.name]).await;
    east.create(&pp, &exported("web", 80)).await.unwrap();
    east.create(&pp, &exported("shadow", 80)).await.unwrap();
    eventually("the follower", WAIT, || present(&west, "web")).await;
    east.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"ports": [{"name": "http", "port": 81}]}})),
    )
    .await
    .unwrap();
    eventually("the follower updated", WAIT, || {
        ports_are(&west, "web", &[81])
    })
    .await;
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(client(LOCAL).await, &ns.name);
    eventually("the NotOurFollower Event", WAIT, || async {
        let list = events
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        list.items
            .iter()
            .any(|e| {
                e.reason.as_deref() == Some("NotOurFollower")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("shadow")
            })
            .then_some(())
            .ok_or_else(|| format!("{} events", list.items.len()))
    })
    .await;
    east.delete("web", &DeleteParams::default()).await.unwrap();
    eventually("the follower deleted", WAIT, || {
        support::absent(&west, "web")
    })
    .await;
    let logs = d.logs();
    assert!(
        !logs.to_lowercase().contains("forbidden"),
        "a request was refused:\n{logs}"
    );
    assert!(
        d.metric(
            "xcc_writes_total",
            &[("kind", "Service"), ("verb", "update")]
        ) >= 1.0
    );
    d.wait_metric(
        "xcc_writes_total",
        &[("kind", "Service"), ("verb", "delete")],
        1.0,
    )
    .await;
    assert_eq!(
        west.get("shadow")
            .await
            .unwrap()
            .labels()
            .get("fair.com/cross-cluster"),
        None
    );
    drop(d);

    // what the daemon could have touched here: the Services (Endpoints of the chart's own
    // metrics Service belong to kube-controller-manager, which may still be settling)
    let after = support::fault::snapshot(&client(LOCAL).await, &[&ns.name]).await;
    let touched: Vec<String> = before
        .non_followers_touched(&after)
        .into_iter()
        .filter(|o| o.starts_with("Service "))
        .collect();
    let lost = support::fault::Lost::since(&before, &after, &BTreeSet::from(["keep".to_string()]));
    assert_eq!(
        lost.checked, 1,
        "the kept follower was there before the changes"
    );
    support::fault::conclude(
        support::fault::Report {
            id: "72-security-rbac",
            scenario: "The chart's two identities, as the API server grants them (kubectl auth can-i --list), against what the daemon sends",
            done: "helm install; can-i --list for the writer ServiceAccount and cross-cluster-remote-reader, can-i on Secrets in other namespaces; a daemon with only the writer's token created, updated and deleted a follower and recorded an Event",
            converge: None,
            note: format!(
                "writer: {}; reader: {}; the writer's Secrets (remote kubeconfigs) and Lease only in the release namespace, no Secret for the reader, whose only namespace is kube-system (by name); the chart no longer grants patch on Services/Endpoints/EndpointSlices nor core Events (never used)",
                show(&writer_has),
                show(&reader_has)
            ),
        },
        &lost,
        &touched,
    );
    run(helm(&kc).args([
        "uninstall",
        &release,
        "--kube-context",
        LOCAL,
        "--namespace",
        &ns.name,
    ]));
}

/// The verbs that change something.
const WRITES: &[&str] = &[
    "create",
    "update",
    "patch",
    "delete",
    "deletecollection",
    "escalate",
    "bind",
    "impersonate",
    "*",
];

/// `rights` without the verbs that only read.
fn writes_in(rights: &BTreeMap<String, BTreeSet<String>>) -> BTreeMap<String, BTreeSet<String>> {
    rights
        .iter()
        .filter_map(|(res, verbs)| {
            let w: BTreeSet<String> = verbs
                .iter()
                .filter(|v| WRITES.contains(&v.as_str()))
                .cloned()
                .collect();
            (!w.is_empty()).then(|| (res.clone(), w))
        })
        .collect()
}

/// With `watchNamespaces`, the chart's writer may write followers, their Events (and nothing
/// else) only in the watched namespaces: `kubectl auth can-i --list` shows no write verb in
/// kube-system, default or an unwatched namespace, and in the release namespace only its Lease,
/// Secrets and Events. Reads stay cluster-wide (the follower watches of several namespaces are
/// one cluster-wide watch each). A daemon with exactly that token mirrors into a watched
/// namespace (create, update, delete, an Event), and nothing it sends is forbidden.
#[tokio::test]
async fn with_watch_namespaces_the_writer_writes_nowhere_else() {
    let kc = bed().await.kubeconfig.clone();
    let ns = namespace("chart-scoped").await;
    let (w1, w2) = (
        namespace("chart-watched").await,
        namespace("chart-watched").await,
    );
    let outside = namespace("chart-unwatched").await;
    let release = format!("cross-cluster-controller-{}", &ns.name[ns.name.len() - 8..]);
    let watched = format!("watchNamespaces={{{},{}}}", w1.name, w2.name);
    run(helm(&kc).args([
        "install",
        &release,
        CHART,
        "--kube-context",
        LOCAL,
        "--namespace",
        &ns.name,
        "--set",
        "remoteKubeconfig.existingSecret=remote-kubeconfig",
        "--set",
        &watched,
    ]));
    let writer = format!("system:serviceaccount:{}:{release}", ns.name);
    let needs = writer_needs();
    // the writes there are the followers', their Events', and no more (reads: whatever the
    // ClusterRole reads everywhere)
    let in_watched = rules(&[
        ("endpoints", &["create", "delete", "update"]),
        (
            "endpointslices.discovery.k8s.io",
            &["create", "delete", "update"],
        ),
        ("events.events.k8s.io", &["create", "patch"]),
        ("services", &["create", "delete", "update"]),
    ]);
    let rw: BTreeSet<String> = RW.iter().map(|v| v.to_string()).collect();
    for w in [&w1.name, &w2.name] {
        let has = granted(&kc, w, &writer);
        assert_eq!(
            writes_in(&has),
            in_watched,
            "the writer in {w}: {}",
            show(&has)
        );
        for res in ["services", "endpoints", "endpointslices.discovery.k8s.io"] {
            assert_eq!(has.get(res), Some(&rw), "{res} in {w}");
        }
    }
    let mut nowhere = BTreeMap::new();
    for other in ["kube-system", "default", outside.name.as_str()] {
        let has = granted(&kc, other, &writer);
        assert_eq!(
            writes_in(&has),
            nowhere,
            "writes in {other}: {}",
            show(&has)
        );
        for res in ["services", "endpoints", "endpointslices.discovery.k8s.io"] {
            assert_eq!(
                has.get(res),
                Some(&RO.iter().map(|v| v.to_string()).collect())
            );
        }
    }
    // the release namespace: its Lease, the remote Secrets, Events about them; no follower write
    let release_rights = granted(&kc, &ns.name, &writer);
    nowhere.extend(writes_in(&needs).into_iter().filter(|(res, _)| {
        [
            "leases.coordination.k8s.io",
            "secrets",
            "events.events.k8s.io",
        ]
        .contains(&res.as_str())
    }));
    assert_eq!(
        writes_in(&release_rights),
        nowhere,
        "{}",
        show(&release_rights)
    );

    // and that is enough to mirror into a watched namespace
    let dir = tempfile::tempdir().unwrap();
    let local_kc = token_kubeconfig(LOCAL, &ns.name, &release, dir.path()).await;
    let args: Vec<String> = [
        "--devmode",
        "--namespace",
        &ns.name,
        "--lease-name",
        &release,
        "--watch-namespace",
        &format!("{},{}", w1.name, w2.name),
        "--cluster-name",
        REMOTE,
        "--remote-context",
        REMOTE,
        "--lease-duration-seconds",
        "6",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let d = Daemon::start_with_env(&args, &[("KUBECONFIG", &local_kc.to_string_lossy())]).await;
    d.wait_synced(&[REMOTE]).await;
    let east: Api<Service> = Api::namespaced(client(REMOTE).await, &w1.name);
    let west: Api<Service> = Api::namespaced(client(LOCAL).await, &w1.name);
    let pp = PostParams::default();
    west.create(
        &pp,
        &obj(json!({"metadata": {"name": "shadow"}, "spec": {"ports": [{"port": 5432}]}})),
    )
    .await
    .unwrap();
    east.create(&pp, &exported("web", 80)).await.unwrap();
    east.create(&pp, &exported("shadow", 80)).await.unwrap();
    eventually("the follower", WAIT, || present(&west, "web")).await;
    east.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"ports": [{"name": "http", "port": 81}]}})),
    )
    .await
    .unwrap();
    eventually("the follower updated", WAIT, || {
        ports_are(&west, "web", &[81])
    })
    .await;
    eventually("the NotOurFollower Event", WAIT, || {
        support::event_notes(LOCAL, &w1.name, "NotOurFollower", None)
    })
    .await;
    east.delete("web", &DeleteParams::default()).await.unwrap();
    eventually("the follower deleted", WAIT, || {
        support::absent(&west, "web")
    })
    .await;
    let logs = d.logs();
    assert!(
        !logs.to_lowercase().contains("forbidden"),
        "a request was refused:\n{logs}"
    );
    drop(d);
    support::fault::conclude(
        support::fault::Report {
            id: "75-security-rbac-watched",
            scenario: "The chart with watchNamespaces: where its writer may write (kubectl auth can-i --list)",
            done: "helm install with two watched namespaces; can-i --list in each, in kube-system, default, an unwatched namespace and the release namespace; a daemon with only the writer's token created, updated and deleted a follower in a watched namespace and recorded an Event",
            converge: None,
            note: format!(
                "watched: {}; kube-system, default, unwatched: no write verb; release namespace: {}",
                show(&in_watched),
                show(&writes_in(&release_rights))
            ),
        },
        &support::fault::Lost::nothing_to_lose(),
        &[],
    );
    run(helm(&kc).args([
        "uninstall",
        &release,
        "--kube-context",
        LOCAL,
        "--namespace",
        &ns.name,
    ]));
}

/// `networkPolicy.enabled`: ingress to the controller's pods only on the admin port and only
/// from `networkPolicy.from`; with no `from`, none at all. Off by default. The API server
/// accepts both (a server-side dry run).
#[tokio::test]
async fn the_network_policy_admits_only_the_given_peers_on_the_admin_port() {
    let kc = bed().await.kubeconfig.clone();
    let ns = namespace_in("chart-netpol", &[LOCAL]).await;
    let policies = |sets: &[&str]| -> Vec<serde_yaml::Value> {
        let mut all = vec!["remoteKubeconfig.existingSecret=x"];
        all.extend(sets);
        let docs = support::tools::documents(
            &support::tools::template_text(&kc, &ns.name, &all).expect("render"),
        );
        docs.into_iter()
            .filter(|d| d["kind"] == "NetworkPolicy")
            .collect()
    };
    assert!(policies(&[]).is_empty(), "off by default");
    let from = "networkPolicy.from[0].namespaceSelector.matchLabels.kubernetes\\.io/metadata\\.name=monitoring";
    let open = policies(&["networkPolicy.enabled=true", from, "adminPort=9090"]);
    let [p] = &open[..] else {
        panic!("one NetworkPolicy: {open:?}")
    };
    assert_eq!(
        p["spec"]["policyTypes"],
        serde_yaml::to_value(["Ingress"]).unwrap()
    );
    assert_eq!(
        p["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/name"],
        "cross-cluster-controller"
    );
    let ingress = p["spec"]["ingress"].as_sequence().expect("ingress");
    assert_eq!(ingress.len(), 1, "{ingress:?}");
    assert_eq!(
        ingress[0]["ports"],
        serde_yaml::to_value(json!([{"protocol": "TCP", "port": 9090}])).unwrap()
    );
    assert_eq!(
        ingress[0]["from"][0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"],
        "monitoring"
    );
    let closed = policies(&["networkPolicy.enabled=true"]);
    assert_eq!(
        closed[0]["spec"]["ingress"],
        serde_yaml::to_value(Vec::<u8>::new()).unwrap(),
        "no `from`: no ingress"
    );
    let err = support::tools::template_text(&kc, &ns.name, &["networkPolicy.from[0].pods=x"])
        .unwrap_err();
    assert!(err.contains("networkPolicy"), "{err}");
    for p in [&open[0], &closed[0]] {
        server_dry_run(&kc, &ns.name, &serde_yaml::to_string(p).unwrap());
    }
}

/// `clusterProfiles` with one provider, the reference `secretreader` plugin at
/// /plugins/secretreader-plugin, as `--set`s.
const PROFILES: &[&str] = &[
    "clusterProfiles.enabled=true",
    "clusterProfiles.providers[0].name=secretreader",
    "clusterProfiles.providers[0].execConfig.apiVersion=client.authentication.k8s.io/v1",
    "clusterProfiles.providers[0].execConfig.command=/plugins/secretreader-plugin",
    "clusterProfiles.providers[0].execConfig.provideClusterInfo=true",
];

/// [`PROFILES`] and `more`.
fn profiles_with<'a>(more: &[&'a str]) -> Vec<&'a str> {
    PROFILES
        .iter()
        .copied()
        .chain(more.iter().copied())
        .collect()
}

/// The pod template of a render's Deployment.
fn pod_template(docs: &[serde_yaml::Value]) -> &serde_yaml::Value {
    &docs
        .iter()
        .find(|d| d["kind"] == "Deployment")
        .expect("a Deployment")["spec"]["template"]
}

/// The daemon's arguments in a render that concern ClusterProfiles.
fn profile_args(docs: &[serde_yaml::Value]) -> Vec<String> {
    pod_template(docs)["spec"]["containers"][0]["args"]
        .as_sequence()
        .expect("args")
        .iter()
        .map(|a| a.as_str().expect("a string argument").to_string())
        .filter(|a| a.starts_with("--cluster-profiles") || a.starts_with("--clusterprofile"))
        .collect()
}

/// The document of `kind` named `name` in a render, if any.
fn doc<'a>(docs: &'a [serde_yaml::Value], kind: &str, name: &str) -> Option<&'a serde_yaml::Value> {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
}

/// The rules of Role `name` of a render, as `granted` keys them, with the Role's namespace; and
/// its RoleBinding's subjects, which must bind it to the controller's ServiceAccount.
fn role_rules(
    docs: &[serde_yaml::Value],
    name: &str,
) -> Option<(String, BTreeMap<String, BTreeSet<String>>)> {
    let role = doc(docs, "Role", name)?;
    let binding = doc(docs, "RoleBinding", name).expect("its RoleBinding");
    assert_eq!(
        binding["metadata"]["namespace"],
        role["metadata"]["namespace"]
    );
    assert_eq!(binding["roleRef"]["name"], name);
    assert_eq!(
        binding["subjects"],
        serde_yaml::to_value(json!([{"kind": "ServiceAccount",
            "name": "cross-cluster-controller", "namespace": "fair-system"}]))
        .unwrap()
    );
    // rendered_rules reads a ClusterRole: the same rules under another kind
    let mut as_cluster_role = role.clone();
    as_cluster_role["kind"] = "ClusterRole".into();
    let ns = role["metadata"]["namespace"].as_str().unwrap().to_string();
    Some((ns, rendered_rules(&[as_cluster_role], name)))
}

/// A render without what `clusterProfiles` adds (its ConfigMap and Roles, flags, checksum,
/// volume and mount), to compare with a render without it.
fn without_profiles(docs: &[serde_yaml::Value]) -> Vec<serde_yaml::Value> {
    let ours = [
        "cross-cluster-controller-cluster-profiles",
        "cross-cluster-controller-profile-secrets",
    ];
    let mut docs: Vec<serde_yaml::Value> = without_args(docs, "--cluster-profiles")
        .into_iter()
        .filter(|d| !ours.iter().any(|n| d["metadata"]["name"] == *n))
        .collect();
    docs = without_args(&docs, "--clusterprofile-provider-file");
    for d in &mut docs {
        if d["kind"] != "Deployment" {
            continue;
        }
        let t = &mut d["spec"]["template"];
        let meta = t
            .get_mut("metadata")
            .and_then(|m| m.as_mapping_mut())
            .expect("the pod template's metadata");
        if let Some(a) = meta.get_mut("annotations").and_then(|a| a.as_mapping_mut()) {
            a.remove("checksum/cluster-profiles");
            if a.is_empty() {
                meta.remove("annotations");
            }
        }
        let named = |v: &serde_yaml::Value| v["name"] == "cluster-profiles";
        t["spec"]["volumes"]
            .as_sequence_mut()
            .unwrap()
            .retain(|v| !named(v));
        t["spec"]["containers"][0]["volumeMounts"]
            .as_sequence_mut()
            .unwrap()
            .retain(|v| !named(v));
    }
    docs
}

/// `clusterProfiles.*` values change exactly what they say, in a render: off (the default),
/// nothing of it at all; `enabled` with a provider: the flags, the provider file in a ConfigMap
/// mounted where the flag points (the daemon's own parser reads it), its checksum on the pod
/// template, and a Role of list/watch on ClusterProfiles in the profiles' namespace, nothing
/// else; `secretReader`: get on the release namespace's Secrets; a hub by Secret: its flag, get
/// on that one Secret, and no ClusterProfile Role. The extra volumes, mounts and init
/// containers come as given.
#[tokio::test]
async fn the_cluster_profile_values_add_exactly_the_flags_the_file_and_the_roles_asked_for() {
    use cross_cluster_controller::remotes::profiles::access::parse_provider_file;
    let kc = bed().await.kubeconfig.clone();
    let off = template(&kc, &[]).unwrap();
    let on = template(&kc, PROFILES).unwrap();

    // off: not a word of it
    let text: String = off
        .iter()
        .map(|d| serde_yaml::to_string(d).unwrap())
        .collect();
    for word in ["clusterprofile", "cluster-profiles", "profile-secrets"] {
        assert!(
            !text.to_lowercase().contains(word),
            "{word} without clusterProfiles.enabled"
        );
    }

    // on: the flags, and nothing else changes but what comes with them
    assert_eq!(
        profile_args(&on),
        [
            "--cluster-profiles=fair-system",
            "--clusterprofile-provider-file=/etc/cross-cluster-profiles/providers.json",
            "--cluster-profiles-refresh-seconds=300",
            "--cluster-profiles-exec-timeout-seconds=10",
        ]
    );
    assert_eq!(without_profiles(&on), off);
    // the provider file: in the ConfigMap, mounted read-only where the flag points, and what the
    // daemon reads
    let cm = doc(
        &on,
        "ConfigMap",
        "cross-cluster-controller-cluster-profiles",
    )
    .expect("ConfigMap");
    assert_eq!(cm["metadata"]["namespace"], "fair-system");
    let file = cm["data"]["providers.json"]
        .as_str()
        .expect("providers.json");
    let providers = parse_provider_file(file).unwrap_or_else(|e| panic!("{e}: {file}"));
    assert_eq!(providers.names(), ["secretreader"]);
    assert_eq!(providers.commands(), ["/plugins/secretreader-plugin"]);
    let parsed: serde_json::Value = serde_json::from_str(file).unwrap();
    assert_eq!(
        parsed,
        json!({"providers": [{"name": "secretreader", "execConfig": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": "/plugins/secretreader-plugin", "provideClusterInfo": true}}]})
    );
    let pod = pod_template(&on);
    let volume = pod["spec"]["volumes"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "cluster-profiles")
        .expect("the provider file's volume");
    assert_eq!(volume["configMap"]["name"], cm["metadata"]["name"]);
    let mount = pod["spec"]["containers"][0]["volumeMounts"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "cluster-profiles")
        .expect("its mount");
    assert_eq!(mount["mountPath"], "/etc/cross-cluster-profiles");
    assert_eq!(mount["readOnly"], true);
    // the checksum follows the file, and only the file
    let checksum = |docs: &[serde_yaml::Value]| {
        pod_template(docs)["metadata"]["annotations"]["checksum/cluster-profiles"]
            .as_str()
            .expect("checksum/cluster-profiles")
            .to_string()
    };
    let other_plugin = template(
        &kc,
        &profiles_with(&["clusterProfiles.providers[0].execConfig.command=/plugins/other"]),
    )
    .unwrap();
    let refresh = template(&kc, &profiles_with(&["clusterProfiles.refreshSeconds=60"])).unwrap();
    assert_ne!(checksum(&other_plugin), checksum(&on));
    assert_eq!(checksum(&refresh), checksum(&on));
    // the hub is this cluster: list and watch ClusterProfiles in the profiles' namespace
    let (ns, rules) = role_rules(&on, "cross-cluster-controller-cluster-profiles").expect("Role");
    assert_eq!(ns, "fair-system");
    assert_eq!(rules, support::rbac::profiles_hub_needs());
    assert!(doc(&on, "Role", "cross-cluster-controller-profile-secrets").is_none());

    // the other flags
    let all = template(
        &kc,
        &profiles_with(&[
            "clusterProfiles.namespace=fleet",
            "clusterProfiles.selector=env in (prod)",
            "clusterProfiles.refreshSeconds=60",
            "clusterProfiles.execTimeoutSeconds=3",
        ]),
    )
    .unwrap();
    assert_eq!(
        profile_args(&all),
        [
            "--cluster-profiles=fleet",
            "--cluster-profiles-selector=env in (prod)",
            "--clusterprofile-provider-file=/etc/cross-cluster-profiles/providers.json",
            "--cluster-profiles-refresh-seconds=60",
            "--cluster-profiles-exec-timeout-seconds=3",
        ]
    );
    let (ns, rules) = role_rules(&all, "cross-cluster-controller-cluster-profiles").expect("Role");
    assert_eq!(ns, "fleet", "the Role is where the profiles are");
    assert_eq!(rules, support::rbac::profiles_hub_needs());

    // reportAs: its flag, and patch on the profiles' status beside list and watch
    let report = template(&kc, &profiles_with(&["clusterProfiles.reportAs=west"])).unwrap();
    assert!(
        profile_args(&report).contains(&"--cluster-profiles-report-as=west".to_string()),
        "{:?}",
        profile_args(&report)
    );
    let (_, rules) =
        role_rules(&report, "cross-cluster-controller-cluster-profiles").expect("Role");
    let mut want = support::rbac::profiles_hub_needs();
    want.extend(support::rbac::rules(&[(
        "clusterprofiles.multicluster.x-k8s.io/status",
        &["patch"],
    )]));
    assert_eq!(rules, want);
    let err = template(&kc, &profiles_with(&["clusterProfiles.reportAs=West_1"])).unwrap_err();
    assert!(err.contains("reportAs"), "{err}");

    // secretReader: get on the Secrets of the release namespace, beside what the remote Secrets
    // need (remoteSecretSelector on by default)
    let reader = template(&kc, &profiles_with(&["clusterProfiles.secretReader=true"])).unwrap();
    let (ns, rules) =
        role_rules(&reader, "cross-cluster-controller-profile-secrets").expect("Role");
    assert_eq!(ns, "fair-system");
    assert_eq!(rules, support::rbac::secretreader_needs());
    assert!(doc(&reader, "Role", "cross-cluster-controller-cluster-profiles").is_some());

    // a hub by Secret: its flag, get on that Secret only, no Role on ClusterProfiles here
    let hub = template(
        &kc,
        &profiles_with(&["clusterProfiles.hub.existingSecret=hub"]),
    )
    .unwrap();
    assert!(
        profile_args(&hub).contains(&"--cluster-profiles-hub=secret:hub".to_string()),
        "{:?}",
        profile_args(&hub)
    );
    assert!(doc(&hub, "Role", "cross-cluster-controller-cluster-profiles").is_none());
    let (ns, rules) = role_rules(&hub, "cross-cluster-controller-profile-secrets").expect("Role");
    assert_eq!(ns, "fair-system");
    assert_eq!(rules, support::rbac::rules(&[("secrets[hub]", &["get"])]));
    let text: String = hub
        .iter()
        .map(|d| serde_yaml::to_string(d).unwrap())
        .collect();
    assert!(
        !text.contains("clusterprofiles"),
        "no right on ClusterProfiles here"
    );

    // profiles alone are a remote source: no Secret right at all but the plugin's, and the
    // renewal window still reaches the daemon (it runs a profile's plugin again before expiry)
    let alone = template(
        &kc,
        &profiles_with(&["remoteSecretSelector=", "clusterProfiles.secretReader=true"]),
    )
    .unwrap();
    let r = remotes(&alone);
    assert_eq!(r.secret_verbs, ["get"]);
    assert_eq!(r.env["REMOTE_SECRET_SELECTOR"], "");
    assert_eq!(r.env["REMOTE_TOKEN_RENEW_BEFORE"], "20%");
    let no_renewal = template(
        &kc,
        &profiles_with(&["remoteSecretSelector=", "tokenRenewal.enabled=false"]),
    )
    .unwrap();
    assert_eq!(remotes(&no_renewal).env["REMOTE_TOKEN_RENEW_BEFORE"], "off");
    assert_eq!(remotes(&no_renewal).secret_verbs, Vec::<String>::new());

    // the plugins' volume, its mount and an init container, as given, after the chart's own
    let extra = template(
        &kc,
        &profiles_with(&[
            "extraVolumes[0].name=plugins",
            "extraVolumes[0].emptyDir.sizeLimit=64Mi",
            "extraVolumeMounts[0].name=plugins",
            "extraVolumeMounts[0].mountPath=/plugins",
            "extraVolumeMounts[0].readOnly=true",
            "initContainers[0].name=plugins",
            "initContainers[0].image=registry.example/plugins:1",
        ]),
    )
    .unwrap();
    let pod = pod_template(&extra);
    let names = |v: &serde_yaml::Value| -> Vec<String> {
        v.as_sequence()
            .unwrap()
            .iter()
            .map(|x| x["name"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(
        names(&pod["spec"]["volumes"]),
        ["cluster-profiles", "tmp", "plugins"]
    );
    assert_eq!(
        names(&pod["spec"]["containers"][0]["volumeMounts"]),
        ["cluster-profiles", "tmp", "plugins"]
    );
    assert_eq!(
        pod["spec"]["initContainers"],
        serde_yaml::to_value(json!([{"name": "plugins", "image": "registry.example/plugins:1"}]))
            .unwrap()
    );
    assert_eq!(
        pod["spec"]["volumes"][2],
        serde_yaml::to_value(json!({"name": "plugins", "emptyDir": {"sizeLimit": "64Mi"}}))
            .unwrap()
    );

    // refused: no provider, a command that is not an absolute path, a refresh under 5 s
    let err = template(&kc, &["clusterProfiles.enabled=true"]).unwrap_err();
    assert!(err.contains("clusterProfiles.providers"), "{err}");
    let err = template(
        &kc,
        &profiles_with(&["clusterProfiles.providers[0].execConfig.command=secretreader-plugin"]),
    )
    .unwrap_err();
    assert!(err.contains("command"), "{err}");
    let err = template(&kc, &profiles_with(&["clusterProfiles.refreshSeconds=2"])).unwrap_err();
    assert!(err.contains("refreshSeconds"), "{err}");
    // the server accepts what it renders
    let ns = namespace_in("chart-profiles-dry-run", &[LOCAL]).await;
    let text = support::tools::template_text(
        &kc,
        &ns.name,
        &profiles_with(&["clusterProfiles.secretReader=true"]),
    )
    .unwrap();
    server_dry_run(&kc, &ns.name, &text);
}

/// Installed with `clusterProfiles` (no remote Secrets), the writer is granted, as the API server
/// says, exactly what the daemon and the `secretreader` plugin it runs send on top of its own:
/// list/watch ClusterProfiles in the profiles' namespace (another one here) and get on the
/// release namespace's Secrets; with a hub by Secret, get on that one Secret and no right on
/// ClusterProfiles.
#[tokio::test]
async fn with_cluster_profiles_the_writer_is_granted_exactly_what_the_daemon_sends() {
    use support::rbac::{profiles_hub_needs, secretreader_needs, writer_needs_without_secrets};
    let kc = bed().await.kubeconfig.clone();
    let ns = namespace_in("chart-profiles-rbac", &[LOCAL]).await;
    let fleet = namespace_in("chart-profiles-fleet", &[LOCAL]).await;
    let hub_ns = namespace_in("chart-profiles-hub", &[LOCAL]).await;
    let release_of = |ns: &str| format!("cross-cluster-controller-{}", &ns[ns.len() - 8..]);
    let install = |ns: &str, sets: &[String]| -> String {
        let release = release_of(ns);
        let mut cmd = helm(&kc);
        cmd.args([
            "install",
            &release,
            CHART,
            "--kube-context",
            LOCAL,
            "--namespace",
            ns,
        ]);
        for s in PROFILES
            .iter()
            .map(|s| s.to_string())
            .chain(sets.iter().cloned())
        {
            cmd.args(["--set", &s]);
        }
        cmd.args([
            "--set",
            "remoteSecretSelector=",
            "--set",
            "remoteReader.enabled=false",
        ]);
        run(&mut cmd);
        format!("system:serviceaccount:{ns}:{release}")
    };
    let writer = install(
        &ns.name,
        &[
            format!("clusterProfiles.namespace={}", fleet.name),
            "clusterProfiles.secretReader=true".into(),
        ],
    );
    // the ClusterRole's (the Lease and Events are the release namespace's)
    let mut everywhere = writer_needs_without_secrets();
    everywhere.remove("leases.coordination.k8s.io");
    let in_release = granted(&kc, &ns.name, &writer);
    let in_fleet = granted(&kc, &fleet.name, &writer);
    let in_default = granted(&kc, "default", &writer);
    assert_eq!(
        in_release,
        union(&writer_needs_without_secrets(), &secretreader_needs()),
        "the release namespace: {}",
        show(&in_release)
    );
    assert_eq!(
        in_fleet,
        union(&everywhere, &profiles_hub_needs()),
        "the profiles' namespace: {}",
        show(&in_fleet)
    );
    assert_eq!(in_default, everywhere, "elsewhere: {}", show(&in_default));

    let hub_writer = install(
        &hub_ns.name,
        &["clusterProfiles.hub.existingSecret=hub".into()],
    );
    let in_hub_ns = granted(&kc, &hub_ns.name, &hub_writer);
    assert_eq!(
        in_hub_ns,
        union(
            &writer_needs_without_secrets(),
            &rules(&[("secrets[hub]", &["get"])])
        ),
        "a hub by Secret: {}",
        show(&in_hub_ns)
    );
    for other in [fleet.name.as_str(), "default"] {
        assert_eq!(granted(&kc, other, &hub_writer), everywhere, "{other}");
    }
    support::fault::conclude(
        support::fault::Report {
            id: "76-security-rbac-profiles",
            scenario: "The chart with clusterProfiles: what its writer may do beyond its own (kubectl auth can-i --list)",
            done: "helm install with clusterProfiles (hub this cluster, profiles in another namespace, secretReader) and with a hub by Secret, remoteSecretSelector empty; can-i --list in the release namespace, the profiles' namespace and default",
            converge: None,
            note: format!(
                "release namespace: {}; profiles' namespace: {}; hub by Secret, release namespace: {}",
                show(&in_release),
                show(&in_fleet),
                show(&in_hub_ns)
            ),
        },
        &support::fault::Lost::nothing_to_lose(),
        &[],
    );
    for ns in [&ns.name, &hub_ns.name] {
        run(helm(&kc).args([
            "uninstall",
            &release_of(ns),
            "--kube-context",
            LOCAL,
            "--namespace",
            ns,
        ]));
    }
}
