//! What every fault case needs besides the proxy: a kubeconfig that routes chosen clusters
//! through proxies, a snapshot of the local objects to prove that nothing else changed, and one
//! row of the reliability report per case (docs/reliability.md is generated from these rows by
//! scripts/reliability-report, never typed by hand).
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Endpoints, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{ListParams, PartialObjectMeta};
use kube::{Api, Client};

use super::{bed, config, repo_root};

pub const FOLLOWER: (&str, &str) = ("fair.com/cross-cluster", "follower");

/// host:port of one cluster's API server.
pub async fn upstream(context: &str) -> String {
    let url = config(context).await.cluster_url;
    format!(
        "{}:{}",
        url.host().expect("server host"),
        url.port_u16().expect("server port")
    )
}

/// A copy of the bed's kubeconfig in which each named context's cluster is reached through the
/// given URL (a proxy). Same CA, same credentials: TLS is verified end to end.
pub async fn routed_kubeconfig(routes: &[(&str, String)], path: &Path) {
    let mut kc: serde_yaml::Value = serde_yaml::from_str(
        &std::fs::read_to_string(&bed().await.kubeconfig).expect("read kubeconfig"),
    )
    .expect("kubeconfig is YAML");
    for (context, url) in routes {
        let clusters = kc["clusters"]
            .as_sequence_mut()
            .expect("kubeconfig clusters");
        let c = clusters
            .iter_mut()
            .find(|c| c["name"] == *context)
            .unwrap_or_else(|| panic!("no cluster {context} in the bed's kubeconfig"));
        c["cluster"]["server"] = serde_yaml::Value::String(url.clone());
    }
    std::fs::write(path, serde_yaml::to_string(&kc).expect("yaml")).expect("write kubeconfig");
}

/// (uid, resourceVersion, is ours: a follower, its slice or an MCS object of ours) of every Service, Endpoints, EndpointSlice and
/// ConfigMap in the given namespaces of one cluster.
#[derive(Clone, Debug, Default)]
pub struct Snapshot(BTreeMap<(String, String, String), (String, String, bool)>);

async fn kind<K>(c: &Client, ns: &str, kind: &str, out: &mut Snapshot)
where
    K: kube::Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let api: Api<PartialObjectMeta<K>> = Api::namespaced(c.clone(), ns);
    let list = api
        .list_metadata(&ListParams::default())
        .await
        .expect("snapshot listing");
    for o in list.items {
        let m = o.metadata;
        // ours: a follower or its slice, or an MCS object of ours (a derived Service or an
        // import's slice), by the labels the daemon writes on them
        let label = |k: &str| m.labels.as_ref().and_then(|l| l.get(k)).map(String::as_str);
        use cross_cluster_controller::desired::MANAGED_BY;
        let follower = label(FOLLOWER.0) == Some(FOLLOWER.1)
            || label("app.kubernetes.io/managed-by") == Some(MANAGED_BY)
            || label("endpointslice.kubernetes.io/managed-by") == Some(MANAGED_BY);
        out.0.insert(
            (kind.to_string(), ns.to_string(), m.name.unwrap_or_default()),
            (
                m.uid.unwrap_or_default(),
                m.resource_version.unwrap_or_default(),
                follower,
            ),
        );
    }
}

pub async fn snapshot(c: &Client, namespaces: &[&str]) -> Snapshot {
    let mut s = Snapshot::default();
    for ns in namespaces {
        kind::<Service>(c, ns, "Service", &mut s).await;
        kind::<Endpoints>(c, ns, "Endpoints", &mut s).await;
        kind::<EndpointSlice>(c, ns, "EndpointSlice", &mut s).await;
        kind::<ConfigMap>(c, ns, "ConfigMap", &mut s).await;
    }
    s
}

impl Snapshot {
    /// Non-follower objects of `self` (before) that changed, or vanished, in `after`.
    pub fn non_followers_touched(&self, after: &Snapshot) -> Vec<String> {
        self.0
            .iter()
            .filter(|(_, (_, _, follower))| !follower)
            .filter(|(k, v)| after.0.get(*k) != Some(*v))
            .map(|((kind, ns, name), _)| format!("{kind} {ns}/{name}"))
            .collect()
    }

    /// Follower Services of `self` (before) whose leader still exists (`alive`) but which are
    /// gone in `after` or were deleted and re-made (another uid) in between.
    pub fn followers_lost(&self, after: &Snapshot, alive: &BTreeSet<String>) -> Vec<String> {
        self.0
            .iter()
            .filter(|((kind, _, name), (_, _, follower))| {
                *follower && kind == "Service" && alive.contains(name)
            })
            .filter(|(k, (uid, _, _))| after.0.get(*k).map(|v| &v.0) != Some(uid))
            .map(|((_, ns, name), _)| format!("{ns}/{name}"))
            .collect()
    }

    /// Names of the follower Services held.
    pub fn followers(&self) -> BTreeSet<String> {
        self.0
            .iter()
            .filter(|((kind, _, _), (_, _, f))| *f && kind == "Service")
            .map(|((_, _, name), _)| name.clone())
            .collect()
    }
}

/// What a case did and measured: one row of the reliability report, without its two counts.
pub struct Report<'a> {
    /// file name and sort key
    pub id: &'a str,
    pub scenario: &'a str,
    pub done: &'a str,
    /// from the end of the fault to convergence (None where the case measures something else,
    /// e.g. detection)
    pub converge: Option<Duration>,
    /// a figure of its own, e.g. "detected in 7.1 s"
    pub note: String,
}

#[derive(serde::Serialize)]
struct Row<'a> {
    id: &'a str,
    scenario: &'a str,
    done: &'a str,
    converge_s: Option<f64>,
    note: &'a str,
    /// None where no follower whose leader lives on existed before the fault (nothing to lose:
    /// the report shows n/a rather than a 0 that could not have been anything else)
    objects_lost: Option<usize>,
    /// followers the count was taken over
    followers_checked: usize,
    non_followers_touched: usize,
}

/// What a case checked for lost followers: the followers present before the fault whose leader
/// still exists, and those of them that were gone (or re-made) afterwards.
pub struct Lost {
    pub checked: usize,
    pub lost: Vec<String>,
}

impl Lost {
    /// For a case in which no follower could be lost (none existed before it).
    pub fn nothing_to_lose() -> Self {
        Lost {
            checked: 0,
            lost: Vec::new(),
        }
    }

    /// Between two snapshots; `alive` names the leaders that still exist.
    pub fn since(before: &Snapshot, after: &Snapshot, alive: &BTreeSet<String>) -> Self {
        Lost {
            checked: before.followers().intersection(alive).count(),
            lost: before.followers_lost(after, alive),
        }
    }
}

/// Records the case's row with its two counts, then asserts both are zero: followers lost whose
/// leader exists, and non-followers touched. Recorded first, so a failing case still leaves its
/// figures behind.
pub fn conclude(report: Report, lost: &Lost, touched: &[String]) {
    let row = Row {
        id: report.id,
        scenario: report.scenario,
        done: report.done,
        converge_s: report.converge.map(secs),
        note: &report.note,
        objects_lost: (lost.checked > 0).then_some(lost.lost.len()),
        followers_checked: lost.checked,
        non_followers_touched: touched.len(),
    };
    let dir = repo_root().join("target/reliability");
    std::fs::create_dir_all(&dir).expect("report dir");
    std::fs::write(
        dir.join(format!("{}.json", row.id)),
        serde_json::to_string_pretty(&row).expect("row json"),
    )
    .expect("write report row");
    assert!(
        lost.lost.is_empty(),
        "followers lost whose leader exists: {:?}",
        lost.lost
    );
    assert!(touched.is_empty(), "non-followers touched: {touched:?}");
}

/// [`conclude`] with both counts taken between two snapshots of the same namespaces; `alive`
/// names the leaders that still exist.
pub fn conclude_since(
    report: Report,
    before: &Snapshot,
    after: &Snapshot,
    alive: &BTreeSet<String>,
) {
    conclude(
        report,
        &Lost::since(before, after, alive),
        &before.non_followers_touched(after),
    );
}

/// Seconds as a short figure.
fn secs(d: Duration) -> f64 {
    (d.as_secs_f64() * 100.0).round() / 100.0
}
