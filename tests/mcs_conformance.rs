//! The upstream Multi-Cluster Services conformance suite (kubernetes-sigs/mcs-api `conformance/`,
//! run unchanged by testbed/mcs-conformance.sh) against the real daemon with `--mcs`, one per
//! cluster, on clusters of the bed with nodes, the pod network, CoreDNS serving clusterset.local
//! and the MCS CRDs (the clusters of tests/traffic.rs, so no extra control plane stays up).
//!
//! One test, phases in a row: two clusters (each daemon reads the other as its static remote),
//! then three (each reads the other two from remote Secrets; traffic-north also carries a
//! ClusterProperty `cluster.clusterset.k8s.io`, so the others must call it `north`, not by its
//! Secret's name). Each phase passes only when the suite exits 0 and its report.yaml counts
//! every one of the 27 specs passed, none skipped or failed. The daemons watch every namespace
//! (the suite makes a random one per spec), which is why this is a test binary of its own:
//! binaries run one after another, so no other test's daemon sees the suite's namespaces.
//!
//! `XCC_MCS_REPORT_DIR=DIR` copies each phase's report.yaml and report.html to DIR/two and
//! DIR/three. Each phase's output (the suite's log, its reports, the daemons' logs) stays in
//! target/mcs-conformance/{two,three}.
mod support;

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Secret, Service};
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use kube::{Api, Client};
use serde::Deserialize;
use serde_json::json;
use support::daemon::Daemon;
use support::node::{node_cluster, node_cluster_with, wait_dns};
use support::remotes::{apply_secret, kubeconfig_of, remote_secret};
use support::{client, eventually, namespace_in, obj, repo_root};

/// The clusters of tests/traffic.rs (west with two nodes there, so the same here).
const EAST: &str = "traffic-east";
const WEST: &str = "traffic-west";
const NORTH: &str = "traffic-north";
/// The specs of the pinned suite (Required and Optional together).
const SPECS: usize = 27;
/// A label key nobody uses: the label mode stays idle, only MCS objects are written.
const LABEL_KEY: &str = "xcc-conformance.invalid/unused";
/// ginkgo's own bound on one run (it then fails the running spec and writes its reports), and
/// ours on the whole script beyond it (the process group is killed).
const GINKGO_TIMEOUT: &str = "25m";
const PHASE_DEADLINE: Duration = Duration::from_secs(28 * 60);
/// The ClusterProperty KEP-2149 names a cluster with, and the name it gives north.
const CLUSTER_ID_PROPERTY: &str = "cluster.clusterset.k8s.io";
const NORTH_ID: &str = "north";

/// One daemon per cluster: which cluster it writes and the MCS name it gives itself.
struct Member {
    context: &'static str,
    id: &'static str,
}

const EAST_M: Member = Member {
    context: EAST,
    id: "east",
};
const WEST_M: Member = Member {
    context: WEST,
    id: "west",
};
const NORTH_M: Member = Member {
    context: NORTH,
    id: NORTH_ID,
};

/// The three clusters with nodes, and CoreDNS answering in each (it needs the MCS CRDs, which
/// every cluster with nodes gets).
async fn clusters() {
    node_cluster(EAST).await;
    node_cluster_with(WEST, 2).await;
    node_cluster(NORTH).await;
    tokio::join!(wait_dns(EAST), wait_dns(WEST), wait_dns(NORTH));
}

/// The flags of the daemon writing `m`'s cluster, with its Lease (and remote Secrets) in `ns`.
fn args(m: &Member, ns: &str) -> Vec<String> {
    [
        "--devmode",
        "--local-context",
        m.context,
        "--namespace",
        ns,
        "--label-key",
        LABEL_KEY,
        "--mcs",
        "--local-cluster-name",
        m.id,
    ]
    .map(String::from)
    .to_vec()
}

/// Waits until `d` is ready (/readyz 200) with a line `remote <r>: synced` for each of
/// `remotes`; fails at once, with its log, if it exits.
async fn wait_ready(d: &Daemon, who: &str, remotes: &[&str]) {
    eventually(
        &format!("the daemon of {who} to be ready with {remotes:?} synced"),
        Duration::from_secs(90),
        || async {
            // an exit is final (a flag refused, a cluster unreachable): no point waiting on
            if let Some(status) = d.exited() {
                panic!("the daemon of {who} {status}:\n{}", d.logs());
            }
            let (code, body) = d.readyz()?;
            let unsynced: Vec<&&str> = remotes
                .iter()
                .filter(|r| !body.lines().any(|l| l == format!("remote {r}: synced")))
                .collect();
            if code == 200 && unsynced.is_empty() {
                Ok(())
            } else {
                Err(format!("/readyz {code}, not synced {unsynced:?}:\n{body}"))
            }
        },
    )
    .await
}

// ---- the report (report.go of the suite; yaml.v3 writes the field names lower-cased) --------

#[derive(Debug, Deserialize)]
struct Report {
    groups: Vec<Group>,
    #[serde(default)]
    suitefailure: String,
    passed: usize,
    total: usize,
}

#[derive(Debug, Deserialize)]
struct Group {
    name: String,
    #[serde(default)]
    tests: Vec<Spec>,
}

#[derive(Debug, Deserialize)]
struct Spec {
    desc: String,
    passed: bool,
    failed: bool,
    skipped: bool,
    conformant: bool,
    #[serde(default)]
    message: String,
}

/// What is wrong with a report, one line each; empty when all `SPECS` specs passed.
fn judge(r: &Report) -> Vec<String> {
    let mut wrong = Vec::new();
    if !r.suitefailure.is_empty() {
        wrong.push(format!("suite set-up failed: {}", r.suitefailure));
    }
    let specs: Vec<(&str, &Spec)> = r
        .groups
        .iter()
        .flat_map(|g| g.tests.iter().map(move |t| (g.name.as_str(), t)))
        .collect();
    if r.total != SPECS || specs.len() != SPECS {
        wrong.push(format!(
            "{SPECS} specs expected, the report counts {} and lists {}",
            r.total,
            specs.len()
        ));
    }
    if r.passed != r.total {
        wrong.push(format!("{} of {} specs passed", r.passed, r.total));
    }
    for (group, t) in specs {
        let state = if t.skipped {
            "SKIPPED"
        } else if t.failed {
            "FAILED"
        } else if !t.conformant {
            "NOT CONFORMANT"
        } else if !t.passed {
            "NOT PASSED"
        } else {
            continue;
        };
        wrong.push(format!("{state} [{group}] {}{}", t.desc, t.message));
    }
    wrong
}

/// The last `n` lines of a file (for a failure message), or why it cannot be read.
fn tail(path: &Path, n: usize) -> String {
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(n)..].join("\n")
        }
        Err(e) => format!("({}: {e})", path.display()),
    }
}

/// Runs the suite on `contexts` (the first exports), its output in target/mcs-conformance/`phase`,
/// with the daemons `daemons` (name, daemon) running; Err(why, in full) unless it passed.
async fn run_suite(
    phase: &str,
    contexts: &[&str],
    daemons: &[(&str, &Daemon)],
) -> Result<(), String> {
    let out = repo_root().join("target/mcs-conformance").join(phase);
    std::fs::create_dir_all(&out).expect("the phase's output folder");
    let script_log = out.join("script.log");
    let log = std::fs::File::create(&script_log).expect("script.log");
    let started = Instant::now();
    let mut child = Command::new("bash")
        .arg(repo_root().join("testbed/mcs-conformance.sh"))
        .arg("--contexts")
        .arg(contexts.join(","))
        .arg("--out")
        .arg(&out)
        .args(["--", "-ginkgo.no-color", "-ginkgo.v"])
        .arg(format!("-ginkgo.timeout={GINKGO_TIMEOUT}"))
        .stdin(Stdio::null())
        .stdout(Stdio::from(log.try_clone().expect("script.log")))
        .stderr(Stdio::from(log))
        .process_group(0)
        .spawn()
        .expect("run testbed/mcs-conformance.sh");
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the suite") {
            break Some(status);
        }
        if started.elapsed() > PHASE_DEADLINE {
            // the script, the suite and anything they started: one process group
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{}", child.id())])
                .status();
            let _ = child.wait();
            break None;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let took = started.elapsed().as_secs();

    // the daemons' logs beside the reports
    let mut daemon_logs = String::new();
    for (name, d) in daemons {
        let path = out.join(format!("daemon-{name}.log"));
        std::fs::write(&path, d.logs()).expect("copy a daemon's log");
        let exited = d.exited().map(|s| format!(" (it {s})")).unwrap_or_default();
        daemon_logs += &format!(
            "\n--- daemon of {name}{exited}: {}, last 20 lines ---\n{}",
            path.display(),
            tail(&path, 20)
        );
    }
    let report_yaml = out.join("report.yaml");
    if let Some(dir) = std::env::var_os("XCC_MCS_REPORT_DIR") {
        let dest = PathBuf::from(dir).join(phase);
        std::fs::create_dir_all(&dest).expect("XCC_MCS_REPORT_DIR");
        for f in ["report.yaml", "report.html"] {
            if out.join(f).is_file() {
                std::fs::copy(out.join(f), dest.join(f)).expect("copy a report");
            }
        }
    }

    let mut wrong = Vec::new();
    match status {
        None => wrong.push(format!(
            "the suite did not end within {PHASE_DEADLINE:?} (killed)"
        )),
        Some(s) if !s.success() => wrong.push(format!("the suite exited with {s}")),
        Some(_) => {}
    }
    let summary = match std::fs::read_to_string(&report_yaml) {
        Err(e) => {
            wrong.push(format!("no report ({}: {e})", report_yaml.display()));
            "no report".to_string()
        }
        Ok(text) => match serde_yaml::from_str::<Report>(&text) {
            Err(e) => {
                wrong.push(format!("{} unreadable: {e}", report_yaml.display()));
                "report unreadable".to_string()
            }
            Ok(r) => {
                wrong.extend(judge(&r));
                format!("{} of {} specs passed", r.passed, r.total)
            }
        },
    };
    println!(
        "MCS conformance, {phase} clusters ({}): {summary}, {} in {took} s; output in {}",
        contexts.join(","),
        match status {
            Some(s) => format!("suite {s}"),
            None => "suite killed".to_string(),
        },
        out.display()
    );
    if wrong.is_empty() {
        return Ok(());
    }
    Err(format!(
        "MCS conformance on {phase} clusters ({}) did not pass ({summary}, {took} s):\n  {}\n\
         --- suite log {}, last 60 lines ---\n{}\n--- script output {}, last 10 lines ---\n{}{daemon_logs}",
        contexts.join(","),
        wrong.join("\n  "),
        out.join("conformance.log").display(),
        tail(&out.join("conformance.log"), 60),
        script_log.display(),
        tail(&script_log, 10),
    ))
}

/// Phase 1: east and west, each daemon reading the other as its static remote, named by
/// `--cluster-name`.
async fn two_clusters() -> Result<(), String> {
    let ns = namespace_in("mcs-conformance-two", &[EAST, WEST]).await;
    let daemon = |m: &Member, other: &Member| {
        let mut a = args(m, &ns.name);
        a.extend(
            [
                "--remote-context",
                other.context,
                "--cluster-name",
                other.id,
            ]
            .map(String::from),
        );
        a
    };
    let east = Daemon::start(&daemon(&EAST_M, &WEST_M)).await;
    let west = Daemon::start(&daemon(&WEST_M, &EAST_M)).await;
    wait_ready(&east, EAST, &[WEST_M.id]).await;
    wait_ready(&west, WEST, &[EAST_M.id]).await;
    run_suite("two", &[EAST, WEST], &[("east", &east), ("west", &west)]).await
}

fn cluster_property() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("about.k8s.io", "v1alpha1", "ClusterProperty"),
        "clusterproperties",
    )
}

fn mcs(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("multicluster.x-k8s.io", "v1beta1", kind),
        plural,
    )
}

/// North's own ClusterProperty `cluster.clusterset.k8s.io` = `north` (cluster-wide).
async fn name_north(north: &Client) {
    let api: Api<DynamicObject> = Api::all_with(north.clone(), &cluster_property());
    let prop = json!({
        "apiVersion": "about.k8s.io/v1alpha1", "kind": "ClusterProperty",
        "metadata": {"name": CLUSTER_ID_PROPERTY}, "spec": {"value": NORTH_ID}
    });
    api.patch(
        CLUSTER_ID_PROPERTY,
        &PatchParams::apply("mcs-conformance-test").force(),
        &Patch::Apply(prop),
    )
    .await
    .unwrap_or_else(|e| panic!("apply north's ClusterProperty: {e}"));
}

/// With the three daemons running: a Service exported in north is imported by east and west
/// with `status.clusters` naming it `north` (its ClusterProperty), not `traffic-north` (its
/// Secret's name, what the others would call it without one).
async fn north_is_known_by_its_property(ns: &str) -> Result<(), String> {
    let north = client(NORTH).await;
    let pp = PostParams::default();
    let service: Service = obj(json!({
        "metadata": {"name": "named"},
        "spec": {"ports": [{"name": "tcp", "port": 42, "protocol": "TCP"}]}
    }));
    Api::<Service>::namespaced(north.clone(), ns)
        .create(&pp, &service)
        .await
        .map_err(|e| format!("create north's Service: {e}"))?;
    let export: DynamicObject = obj(json!({
        "apiVersion": "multicluster.x-k8s.io/v1beta1", "kind": "ServiceExport",
        "metadata": {"name": "named", "namespace": ns}
    }));
    Api::<DynamicObject>::namespaced_with(north, ns, &mcs("ServiceExport", "serviceexports"))
        .create(&pp, &export)
        .await
        .map_err(|e| format!("create north's ServiceExport: {e}"))?;
    for cluster in [EAST, WEST] {
        let imports: Api<DynamicObject> = Api::namespaced_with(
            client(cluster).await,
            ns,
            &mcs("ServiceImport", "serviceimports"),
        );
        // not `eventually`: a timeout is this check's failure, reported beside the suite's
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let seen = match imports.get_opt("named").await {
                Err(e) => e.to_string(),
                Ok(None) => "no ServiceImport".to_string(),
                Ok(Some(si)) => {
                    let clusters: Vec<&str> = si.data["status"]["clusters"]
                        .as_array()
                        .map(|cs| cs.iter().filter_map(|c| c["cluster"].as_str()).collect())
                        .unwrap_or_default();
                    if clusters == [NORTH_ID] {
                        break;
                    }
                    format!("status.clusters {clusters:?}")
                }
            };
            if Instant::now() > deadline {
                return Err(format!(
                    "{cluster}'s ServiceImport {ns}/named of north's export does not name it \
                     {NORTH_ID:?} (its ClusterProperty {CLUSTER_ID_PROPERTY}) within 60 s; \
                     last: {seen}"
                ));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    Ok(())
}

/// Phase 2: east, west and north, each daemon reading the other two from remote Secrets named
/// `east`, `west` and `traffic-north`; north names itself by its ClusterProperty.
async fn three_clusters() -> Result<(), String> {
    let ns = namespace_in("mcs-conformance-three", &[EAST, WEST, NORTH]).await;
    let north = client(NORTH).await;
    name_north(&north).await;
    // what each cluster's daemon calls the others: the Secrets' names (north's differs from its
    // MCS name, which only its ClusterProperty gives)
    let secret_name = |m: &Member| if m.context == NORTH { NORTH } else { m.id };
    let members = [&EAST_M, &WEST_M, &NORTH_M];
    let mut daemons = Vec::new();
    for m in members {
        let secrets: Api<Secret> = Api::namespaced(client(m.context).await, &ns.name);
        let others: Vec<&Member> = members
            .iter()
            .copied()
            .filter(|o| o.context != m.context)
            .collect();
        for o in &others {
            let kc = kubeconfig_of(o.context, |_| {}).await;
            apply_secret(&secrets, &remote_secret(secret_name(o), None, Some(&kc))).await;
        }
        let d = Daemon::start_secrets_only(&args(m, &ns.name)).await;
        daemons.push((m, d, others));
    }
    for (m, d, others) in &daemons {
        let names: Vec<&str> = others.iter().map(|o| secret_name(o)).collect();
        wait_ready(d, m.context, &names).await;
    }
    let running: Vec<(&str, &Daemon)> = daemons.iter().map(|(m, d, _)| (m.id, d)).collect();
    let suite = run_suite("three", &[EAST, WEST, NORTH], &running).await;
    // a namespace of its own: the daemons' namespace (their Lease, the Secrets) is one they
    // never write in (issue 27, protected namespaces), so nothing is imported there
    let named = namespace_in("mcs-conformance-named", &[EAST, WEST, NORTH]).await;
    let property = north_is_known_by_its_property(&named.name).await;
    drop(running);
    drop(daemons);
    let props: Api<DynamicObject> = Api::all_with(north, &cluster_property());
    props
        .delete(CLUSTER_ID_PROPERTY, &DeleteParams::default())
        .await
        .unwrap_or_else(|e| panic!("delete north's ClusterProperty: {e}"));
    match (suite, property) {
        (Ok(()), Ok(())) => Ok(()),
        (suite, property) => Err([suite.err(), property.err()]
            .into_iter()
            .flatten()
            .collect::<Vec<_>>()
            .join("\n\n")),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mcs_conformance_suite_passes_on_two_and_on_three_clusters() {
    clusters().await;
    let two = two_clusters().await;
    let three = three_clusters().await;
    let failures: Vec<String> = [two.err(), three.err()].into_iter().flatten().collect();
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn a_report_is_judged_by_every_spec() {
    let yaml = |passed: usize, specs: &str| {
        format!(
            "groups:\n  - name: Required\n    tests:\n{specs}suitefailure: \"\"\ndnsdomain: clusterset.local\n\
             passed: {passed}\ntotal: 27\nimplementation:\n  organization: o\n  project: p\n  version: v\n  url: u\n"
        )
    };
    let spec = |desc: &str, passed: bool, failed: bool, skipped: bool, conformant: bool| {
        format!(
            "      - desc: {desc}\n        ref: \"\"\n        labels: [DNS]\n        passed: {passed}\n        failed: {failed}\n        skipped: {skipped}\n        conformant: {conformant}\n        message: \" - why\"\n"
        )
    };
    let all_passed: String = (0..SPECS)
        .map(|i| spec(&format!("spec {i}"), true, false, false, true))
        .collect();
    let r: Report = serde_yaml::from_str(&yaml(SPECS, &all_passed)).expect("parses");
    assert_eq!(judge(&r), Vec::<String>::new());

    // one skipped, one not conformant: both named
    let mut mixed: String = (0..SPECS - 2)
        .map(|i| spec(&format!("spec {i}"), true, false, false, true))
        .collect();
    mixed += &spec("skipped one", false, false, true, true);
    mixed += &spec("wrong one", false, false, false, false);
    let r: Report = serde_yaml::from_str(&yaml(SPECS - 2, &mixed)).expect("parses");
    let wrong = judge(&r);
    assert!(
        wrong.contains(&"25 of 27 specs passed".to_string()),
        "{wrong:?}"
    );
    assert!(
        wrong.contains(&"SKIPPED [Required] skipped one - why".to_string()),
        "{wrong:?}"
    );
    assert!(
        wrong.contains(&"NOT CONFORMANT [Required] wrong one - why".to_string()),
        "{wrong:?}"
    );

    // fewer specs than the pinned suite has is not a pass, even if all of them passed
    let few: String = (0..3)
        .map(|i| spec(&format!("spec {i}"), true, false, false, true))
        .collect();
    let r: Report =
        serde_yaml::from_str(&yaml(3, &few).replace("total: 27", "total: 3")).expect("parses");
    assert_eq!(judge(&r).len(), 1, "{:?}", judge(&r));
}
