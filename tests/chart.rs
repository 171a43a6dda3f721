//! End to end: the Helm chart on the test bed. Lint, drift from deploy/, server-side dry run,
//! `helm install` into both clusters, and daemons running with exactly the chart's identities
//! (tokens from TokenRequest, never admin certificates), in both directions.
mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::json;
use support::daemon::{BIN, Daemon};
use support::{
    LOCAL, REMOTE, bed, bed_cmd, client, eventually, namespace, obj, present, repo_root,
};

const CHART: &str = "charts/cross-cluster-controller";
const WAIT: Duration = Duration::from_secs(30);

fn tool(name: &str) -> PathBuf {
    let env = bed_cmd(&["env"]);
    let bin = env
        .lines()
        .find_map(|l| l.strip_prefix("export XCC_TESTBED_BIN="))
        .map(|v| v.trim_matches('\'').to_string())
        .expect("bed env names the binaries");
    Path::new(&bin).join(name)
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().expect("run a command");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{cmd:?} failed:\n{text}");
    String::from_utf8_lossy(&out.stdout).to_string()
}

fn helm(kubeconfig: &Path) -> Command {
    let mut c = Command::new(tool("helm"));
    c.current_dir(repo_root())
        .env("KUBECONFIG", kubeconfig)
        .env("HELM_CACHE_HOME", std::env::temp_dir().join("xcc-helm"));
    c
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
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rendered.yaml");
    std::fs::write(&file, rendered).unwrap();
    run(Command::new(tool("kubectl"))
        .env("KUBECONFIG", &kc)
        .args([
            "--context",
            LOCAL,
            "apply",
            "--dry-run=server",
            "-n",
            &ns.name,
            "-f",
        ])
        .arg(&file));
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

#[tokio::test]
async fn installed_in_both_clusters_it_mirrors_both_ways_with_only_the_charts_identities() {
    let bed = bed().await;
    let kc = bed.kubeconfig.clone();
    let ns = namespace("chart-install").await;
    let release = format!("cross-cluster-controller-{}", &ns.name[ns.name.len() - 8..]);
    let reader = format!("reader-{}", &ns.name[ns.name.len() - 8..]);
    for ctx in [REMOTE, LOCAL] {
        run(helm(&kc).args([
            "install",
            &release,
            CHART,
            "--kube-context",
            ctx,
            "--namespace",
            &ns.name,
            "--set",
            "remoteKubeconfig.existingSecret=remote-kubeconfig",
            "--set",
            &format!("remoteReader.serviceAccountName={reader}"),
            "--set",
            "sweepSchedule=*/2 * * * * *",
        ]));
    }
    let dir = tempfile::tempdir().unwrap();
    // each daemon: its own cluster through the chart's writer ServiceAccount, the other cluster
    // through the other chart's read-only ServiceAccount (via the remote-access subcommand)
    let mut daemons = Vec::new();
    for (local, remote) in [(LOCAL, REMOTE), (REMOTE, LOCAL)] {
        let local_kc = token_kubeconfig(local, &ns.name, &release, dir.path()).await;
        let remote_kc = dir.path().join(format!("{remote}-reader.kubeconfig"));
        remote_access(&kc, remote, &ns.name, &reader, &remote_kc);
        let args: Vec<String> = [
            "--devmode",
            "--namespace",
            &ns.name,
            "--lease-name",
            &release,
            "--watch-namespace",
            &ns.name,
            "--cluster-name",
            remote,
            "--kubeconfig",
            &remote_kc.to_string_lossy(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let d = Daemon::start_with_env(&args, &[("KUBECONFIG", &local_kc.to_string_lossy())]).await;
        daemons.push((local, d));
    }
    for (_, d) in &daemons {
        d.wait_synced().await;
    }

    let leader = |name: &str| -> Service {
        obj(
            json!({"metadata": {"name": name, "labels": {"fair.com/cross-cluster": "true"}}, "spec": {"ports": [{"port": 80}]}}),
        )
    };
    let east: Api<Service> = Api::namespaced(client(REMOTE).await, &ns.name);
    let west: Api<Service> = Api::namespaced(client(LOCAL).await, &ns.name);
    east.create(&PostParams::default(), &leader("from-east"))
        .await
        .unwrap();
    west.create(&PostParams::default(), &leader("from-west"))
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
    east.create(&PostParams::default(), &leader("after-revoke"))
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
