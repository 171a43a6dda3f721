//! Traffic under events (tests/traffic.rs): the bed's load client as a pod (`load run URL RATE`,
//! testbed/workloads/load.c) whose log is the evidence, one record per request; tallies of a
//! window of time; what a node's kube-proxy currently sends traffic to; the web Deployment the
//! events act on.
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{DeleteParams, ListParams, LogParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

use super::node::{LOAD_IMAGE, WEB_IMAGE, pod_ready};
use super::{eventually, obj};

/// Start-up of pods, a rollout, a cluster's restart on a busy two-core machine.
pub const WAIT: Duration = Duration::from_secs(120);

/// One request of a load client.
#[derive(Clone, Debug)]
pub struct Rec {
    /// its number (from 0, in the order requests began)
    pub seq: u64,
    /// when it began (unix ms)
    pub sent: i64,
    /// ms until its answer or failure
    pub took: i64,
    /// a 2xx answer
    pub ok: bool,
    /// the answering pod and its cluster (`pod=... cluster=...`), empty on failure
    pub pod: String,
    pub cluster: String,
    /// the failure, or the status line of a non-2xx answer
    pub why: String,
}

/// The records of a `load run` log; lines of another shape are skipped.
pub fn parse(log: &str) -> Vec<Rec> {
    log.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<Rec> {
    let mut f = line.splitn(5, ' ');
    let seq = f.next()?.parse().ok()?;
    let sent = f.next()?.parse().ok()?;
    let took = f.next()?.parse().ok()?;
    let verdict = f.next()?;
    let rest = f.next().unwrap_or("");
    let field = |k: &str| {
        rest.split_whitespace()
            .find_map(|w| w.strip_prefix(k))
            .unwrap_or("")
            .to_string()
    };
    let status_ok = rest
        .split_whitespace()
        .next()
        .and_then(|s| s.parse::<u16>().ok())
        .is_some_and(|s| (200..300).contains(&s));
    let ok = verdict == "ok" && status_ok;
    Some(Rec {
        seq,
        sent,
        took,
        ok,
        pod: if ok { field("pod=") } else { String::new() },
        cluster: if ok { field("cluster=") } else { String::new() },
        why: if ok { String::new() } else { rest.to_string() },
    })
}

pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// What a client saw of the requests it began in a window.
#[derive(Debug, Default)]
pub struct Tally {
    pub sent: usize,
    pub failed: usize,
    /// answers per cluster
    pub by_cluster: BTreeMap<String, usize>,
    /// answers per pod
    pub by_pod: BTreeMap<String, usize>,
    pub fails: Vec<Rec>,
}

impl Tally {
    /// The requests of `recs` begun in [from, to).
    pub fn of(recs: &[Rec], from: i64, to: i64) -> Tally {
        let mut t = Tally::default();
        for r in recs.iter().filter(|r| r.sent >= from && r.sent < to) {
            t.sent += 1;
            if r.ok {
                *t.by_cluster.entry(r.cluster.clone()).or_default() += 1;
                *t.by_pod.entry(r.pod.clone()).or_default() += 1;
            } else {
                t.failed += 1;
                t.fails.push(r.clone());
            }
        }
        t
    }

    /// "600 sent, 0 failed" (with the first failure's reason when there is one).
    pub fn figures(&self) -> String {
        match self.fails.first() {
            None => format!("{} sent, 0 failed", self.sent),
            Some(f) => format!(
                "{} sent, {} failed (first: {})",
                self.sent, self.failed, f.why
            ),
        }
    }
}

/// Ok when every request of `recs` begun before `t` has its record.
pub fn complete_before(recs: &[Rec], t: i64) -> Result<(), String> {
    let first_after = recs
        .iter()
        .filter(|r| r.sent >= t)
        .map(|r| r.seq)
        .min()
        .ok_or("no request begun at or after the window's end has ended yet")?;
    let ended: BTreeSet<u64> = recs.iter().map(|r| r.seq).collect();
    match (0..first_after).find(|s| !ended.contains(s)) {
        None => Ok(()),
        Some(s) => Err(format!("request {s} has not ended")),
    }
}

/// A load client pod (`load run URL RATE`) and its log.
pub struct Load {
    pods: Api<Pod>,
    pub name: String,
    pub cluster: &'static str,
    /// the records read so far by [`Load::follow`]'s stream, by number, when it runs
    followed: Option<Followed>,
}

/// The records of one load client's log, kept by a task that follows it.
struct Followed {
    recs: Arc<Mutex<BTreeMap<u64, Rec>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Followed {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Follows the log of load pod `name` into `recs` for ever: a stream that cannot open yet (the
/// container not started) or ends is opened again, from a few seconds before its last line (a
/// line seen twice is kept once: records are keyed by number).
async fn follow_log(pods: Api<Pod>, name: String, recs: Arc<Mutex<BTreeMap<u64, Rec>>>) {
    use futures::{AsyncBufReadExt, TryStreamExt};
    let mut last: Option<i64> = None;
    loop {
        let lp = LogParams {
            follow: true,
            since_seconds: last.map(|t| (now_ms() - t) / 1000 + 5),
            ..LogParams::default()
        };
        if let Ok(log) = pods.log_stream(&name, &lp).await {
            let mut lines = log.lines();
            while let Ok(Some(line)) = lines.try_next().await {
                last = Some(now_ms());
                if let Some(r) = parse_line(&line) {
                    recs.lock().expect("records lock").insert(r.seq, r);
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

impl Load {
    /// Starts pod `name` in `cluster`/`ns` sending `rate` requests a second to `url`.
    pub async fn start(
        c: &Client,
        cluster: &'static str,
        ns: &str,
        name: &str,
        url: &str,
        rate: u32,
    ) -> Load {
        Self::start_on(c, cluster, ns, name, url, rate, None).await
    }

    /// [`Load::start`] on a node labelled `on` (label, value), if given: a zone
    /// (`topology.kubernetes.io/zone`) or one node (`kubernetes.io/hostname`).
    pub async fn start_on(
        c: &Client,
        cluster: &'static str,
        ns: &str,
        name: &str,
        url: &str,
        rate: u32,
        on: Option<(&str, &str)>,
    ) -> Load {
        let selector = on.map(|(label, value)| json!({ label: value }));
        let pod: Pod = obj(json!({
            "metadata": {"name": name, "labels": {"app": "load"}},
            "spec": {
                "terminationGracePeriodSeconds": 1,
                "nodeSelector": selector,
                "containers": [{"name": "load", "image": LOAD_IMAGE, "imagePullPolicy": "Never",
                                "args": ["run", url, rate.to_string()]}]
            }
        }));
        let pods: Api<Pod> = Api::namespaced(c.clone(), ns);
        pods.create(&PostParams::default(), &pod)
            .await
            .unwrap_or_else(|e| panic!("create load pod {name} in {cluster}: {e}"));
        Load {
            pods,
            name: name.to_string(),
            cluster,
            followed: None,
        }
    }

    /// The client with its log followed from now on by a task of its own (one stream, each line
    /// read once) instead of read whole at every [`Load::records`]: for a client at hundreds of
    /// requests a second, whose whole log would be megabytes to fetch at every look.
    pub fn follow(mut self) -> Load {
        let recs = Arc::new(Mutex::new(BTreeMap::new()));
        let task = tokio::spawn(follow_log(
            self.pods.clone(),
            self.name.clone(),
            recs.clone(),
        ));
        self.followed = Some(Followed { recs, task });
        self
    }

    /// Deletes the pod (not waited for).
    pub async fn delete(&self) {
        self.pods
            .delete(&self.name, &DeleteParams::default())
            .await
            .unwrap_or_else(|e| panic!("delete load pod {} in {}: {e}", self.name, self.cluster));
    }

    /// Every record so far (the pod's log, read through its API server, or what
    /// [`Load::follow`]'s stream has read of it).
    pub async fn records(&self) -> Result<Vec<Rec>, String> {
        if let Some(f) = &self.followed {
            return Ok(f
                .recs
                .lock()
                .expect("records lock")
                .values()
                .cloned()
                .collect());
        }
        let log = self
            .pods
            .logs(&self.name, &LogParams::default())
            .await
            .map_err(|e| format!("{} log of {}: {e}", self.cluster, self.name))?;
        Ok(parse(&log))
    }

    /// The records once every request begun before `t` (unix ms) has ended, so a window ending
    /// at `t` is complete: a request begun at or after `t` has ended, and so has every request
    /// numbered below it (the client numbers them in the order it starts them, and they end in
    /// any order).
    pub async fn records_past(&self, t: i64) -> Vec<Rec> {
        let what = format!("{}'s load client {} to pass {t}", self.cluster, self.name);
        eventually(&what, WAIT, || async {
            let recs = self.records().await?;
            complete_before(&recs, t)?;
            Ok(recs)
        })
        .await
    }

    /// Waits until the requests begun after `from` were answered by every pod of `pods` (and
    /// by nothing else): the unix ms of the record that completed the set.
    pub async fn answered_by(&self, from: i64, pods: &BTreeSet<String>) -> i64 {
        let what = format!("{}'s client answered by {pods:?}", self.cluster);
        eventually(&what, WAIT, || async {
            let recs = self.records().await?;
            let mut seen = BTreeSet::new();
            for r in recs.iter().filter(|r| r.sent >= from && r.ok) {
                seen.insert(r.pod.clone());
                if seen.is_superset(pods) {
                    return Ok(r.sent);
                }
            }
            Err(format!("seen {seen:?}"))
        })
        .await
    }
}

/// The web Deployment of `cluster` (`replicas` pods, named port `http` 8080, readiness probe
/// every second, rolling update maxSurge 1 / maxUnavailable 0, 5 s of serving after SIGTERM as
/// a preStop hook gives) and its Service `web` (port 80 to `http`), labelled for export when
/// `export`.
pub async fn web(c: &Client, ns: &str, cluster: &str, replicas: i32, export: bool) {
    let env = json!([
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "CLUSTER", "value": cluster},
        {"name": "GRACE_SECONDS", "value": "5"}
    ]);
    let deployment: Deployment = obj(json!({
        "metadata": {"name": "web"},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": "web"}},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {
                    "terminationGracePeriodSeconds": 15,
                    "containers": [{
                        "name": "web", "image": WEB_IMAGE, "imagePullPolicy": "Never",
                        "env": env,
                        "ports": [{"name": "http", "containerPort": 8080}],
                        "readinessProbe": {"httpGet": {"path": "/ready", "port": "http"}, "periodSeconds": 1}
                    }]
                }
            }
        }
    }));
    let api: Api<Deployment> = Api::namespaced(c.clone(), ns);
    api.create(&PostParams::default(), &deployment)
        .await
        .unwrap_or_else(|e| panic!("{cluster}: create the web Deployment: {e}"));
    let labels = if export {
        json!({"app": "web", "fair.com/cross-cluster": "true"})
    } else {
        json!({"app": "web"})
    };
    let service: Service = obj(json!({
        "metadata": {"name": "web", "labels": labels},
        "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}
    }));
    Api::<Service>::namespaced(c.clone(), ns)
        .create(&PostParams::default(), &service)
        .await
        .unwrap_or_else(|e| panic!("{cluster}: create the web Service: {e}"));
}

/// The web pods of `ns` once exactly `n` exist, all ready, none terminating and none of them
/// named in `not` (pods an event replaces): name to IP.
pub async fn settled_web_pods(
    c: &Client,
    ns: &str,
    n: usize,
    not: &BTreeSet<String>,
) -> BTreeMap<String, String> {
    settled_web_pods_within(c, ns, n, not, WAIT).await
}

/// [`settled_web_pods`] with a deadline of its own (a 10-pod rollout on busy cores).
pub async fn settled_web_pods_within(
    c: &Client,
    ns: &str,
    n: usize,
    not: &BTreeSet<String>,
    wait: Duration,
) -> BTreeMap<String, String> {
    settled_pods_within(c, ns, "app=web", n, not, wait).await
}

/// The pods of `ns` labelled `selector` once exactly `n` exist, all ready, none terminating and
/// none of them named in `not`: name to IP.
pub async fn settled_pods_within(
    c: &Client,
    ns: &str,
    selector: &str,
    n: usize,
    not: &BTreeSet<String>,
    wait: Duration,
) -> BTreeMap<String, String> {
    let pods: Api<Pod> = Api::namespaced(c.clone(), ns);
    eventually(
        &format!("{n} settled pods {selector} in {ns}, none of {not:?}"),
        wait,
        || async {
            let list = pods
                .list(&ListParams::default().labels(selector))
                .await
                .map_err(|e| e.to_string())?;
            let ready: BTreeMap<String, String> = list
                .items
                .iter()
                .filter(|p| pod_ready(p) && p.metadata.deletion_timestamp.is_none())
                .filter_map(|p| Some((p.name_any(), p.status.as_ref()?.pod_ip.clone()?)))
                .collect();
            let replaced = ready.keys().all(|p| !not.contains(p));
            if ready.len() == n && list.items.len() == n && replaced {
                Ok(ready)
            } else {
                Err(format!("{} ready of {}", ready.len(), list.items.len()))
            }
        },
    )
    .await
}

/// The network namespaces of `cluster`'s nodes (testbed/net.sh), in order; Err when it has
/// none or its directory cannot be read.
pub fn node_netns(bed_dir: &Path, cluster: &str) -> Result<Vec<std::path::PathBuf>, String> {
    let dir = bed_dir.join(cluster);
    let mut nodes: Vec<_> = std::fs::read_dir(&dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("node"))
        .map(|e| e.path().join("netns"))
        .filter(|p| p.exists())
        .collect();
    nodes.sort();
    if nodes.is_empty() {
        return Err(format!("{cluster} has no node"));
    }
    Ok(nodes)
}

/// The rulesets of the kube-proxies of every node of `cluster`: their nftables tables, read in
/// each node's network namespace (testbed/net.sh) where the bed keeps them.
pub fn proxy_rules(bed_dir: &Path, cluster: &str) -> Result<Vec<String>, String> {
    let nodes = node_netns(bed_dir, cluster)?;
    nodes
        .iter()
        .map(|netns| {
            let out = std::process::Command::new("nsenter")
                .arg(format!("--net={}", netns.display()))
                .args(["nft", "list", "table", "ip", "kube-proxy"])
                .output()
                .map_err(|e| format!("nsenter nft: {e}"))?;
            if out.status.success() {
                Ok(String::from_utf8_lossy(&out.stdout).into_owned())
            } else {
                Err(String::from_utf8_lossy(&out.stderr).into_owned())
            }
        })
        .collect()
}

/// The TCP flows the nodes of `cluster` track (conntrack, in each node's network namespace,
/// where kube-proxy's DNAT happens): `conntrack -L`'s lines, each after its namespace's path, for
/// a failure message to say where the failed requests went.
pub fn flows(bed_dir: &Path, cluster: &str) -> Vec<String> {
    match node_netns(bed_dir, cluster) {
        Ok(nodes) => (nodes.iter())
            .flat_map(|netns| in_node(netns, &["conntrack", "-L", "-p", "tcp"]))
            .collect(),
        Err(e) => vec![e],
    }
}

/// The lines `args` prints in node namespace `netns`, each after the namespace's path (or one
/// line saying why it could not run).
fn in_node(netns: &Path, args: &[&str]) -> Vec<String> {
    let run = std::process::Command::new("nsenter")
        .arg(format!("--net={}", netns.display()))
        .args(args)
        .output();
    match run {
        Ok(o) => (String::from_utf8_lossy(&o.stdout).lines())
            .map(|l| format!("{}: {l}", netns.display()))
            .collect(),
        Err(e) => vec![format!("nsenter {}: {e}", args.join(" "))],
    }
}

/// [`flows`] whose answer is due from one of `ips` (the reply direction's source).
pub fn flows_to(bed_dir: &Path, cluster: &str, ips: &BTreeSet<String>) -> Vec<String> {
    (flows(bed_dir, cluster).into_iter())
        .filter(|l| {
            let reply = l.split("src=").nth(2).unwrap_or_default();
            ips.iter().any(|ip| reply.starts_with(&format!("{ip} ")))
        })
        .collect()
}

/// The local port a load client's failed connect names (`... (port 40312)`, testbed/workloads/load.c).
pub fn failed_port(why: &str) -> Option<u16> {
    why.rsplit_once("(port ")?.1.strip_suffix(')')?.parse().ok()
}

/// The SYNs and RSTs every node namespace of `cluster` sees, captured by tcpdump into files until
/// dropped, for a failure message to follow a failed request's packets through its node (the
/// pod's veth before DNAT, the node's eth0 after it).
pub struct SynCapture {
    _dir: tempfile::TempDir,
    /// each node's capture file and namespace (where its interface names resolve)
    files: Vec<(PathBuf, PathBuf)>,
    running: Vec<std::process::Child>,
}

impl SynCapture {
    pub fn start(bed_dir: &Path, cluster: &str) -> Result<SynCapture, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let (mut running, mut files) = (Vec::new(), Vec::new());
        for (i, netns) in node_netns(bed_dir, cluster)?.into_iter().enumerate() {
            let file = dir.path().join(format!("node{i}.pcap"));
            let child = std::process::Command::new("nsenter")
                .arg(format!("--net={}", netns.display()))
                .args(["tcpdump", "-i", "any", "-nn", "-U", "-w"])
                .arg(&file)
                .arg("tcp[tcpflags] & (tcp-syn|tcp-rst) != 0")
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .map_err(|e| format!("nsenter tcpdump: {e}"))?;
            running.push(child);
            files.push((file, netns));
        }
        Ok(SynCapture {
            _dir: dir,
            files,
            running,
        })
    }

    /// The packets from or to local port `port` of every node, as tcpdump prints them (read in
    /// the node's namespace, so that its interfaces have their names).
    pub fn packets(&self, port: u16) -> Vec<String> {
        let filter = format!("port {port}");
        (self.files.iter())
            .flat_map(|(file, netns)| {
                let file = file.display().to_string();
                in_node(netns, &["tcpdump", "-nn", "-tt", "-r", &file, &filter])
            })
            .collect()
    }
}

impl Drop for SynCapture {
    fn drop(&mut self) {
        for c in &mut self.running {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Waits until the kube-proxy of every node of `cluster` sends traffic to none of `ips`
/// (`gone`) or to every one of them (not `gone`): the unix ms at which that was seen.
pub async fn proxy_targets(
    bed_dir: &Path,
    cluster: &str,
    ips: &BTreeSet<String>,
    gone: bool,
) -> i64 {
    let what = format!(
        "{cluster}'s kube-proxies to send {} to {ips:?}",
        if gone { "nothing" } else { "traffic" }
    );
    eventually(&what, WAIT, || async {
        let rules = proxy_rules(bed_dir, cluster)?;
        // an endpoint's rule DNATs to `ip:port` (its chain, which nftables mode deletes later,
        // is named `...__ip/port`): match the address followed by its port separator
        let done = rules.iter().all(|r| {
            let has = |ip: &String| r.contains(&format!("{ip}:"));
            if gone {
                !ips.iter().any(has)
            } else {
                ips.iter().all(has)
            }
        });
        done.then(now_ms).ok_or_else(|| "not yet".to_string())
    })
    .await
}

/// Seconds between two unix ms, one decimal.
pub fn secs(from: i64, to: i64) -> String {
    format!("{:.1}", (to - from) as f64 / 1000.0)
}
