//! End to end: the chart's optional monitoring objects (ServiceMonitor, PrometheusRule, Grafana
//! dashboard ConfigMap). The API server accepts them with the real Prometheus Operator CRDs
//! (testbed/crds.sh); the alert rules pass their promtool unit tests (monitoring/alerts.test.yaml)
//! as rendered; and a real Prometheus scraping the real daemon fires CrossClusterRemoteDown while
//! a remote's API server is down, and resolves it once it is back.
mod support;

use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::Service;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use support::daemon::{Daemon, args_for, free_port, http_get, with_args, with_flag};
use support::tools::{documents, on_path, run, template, template_text, tool};
use support::{
    LOCAL, absent, bed, bed_cmd, client, eventually, exported, namespace, namespace_in, obj,
    ports_are, present, repo_root,
};

/// A cluster of the bed for the e2e alert test alone: its API server is killed.
const PROMDOWN: &str = "promdown";
/// What the Prometheus Operator names the targets of the chart's ServiceMonitor (release
/// cross-cluster-controller in fair-system), and so what the rules select by default.
const JOB: &str = "cross-cluster-controller-metrics";
const RELEASE_NS: &str = "fair-system";
const CRDS: [&str; 2] = [
    "monitoring.coreos.com_servicemonitors.yaml",
    "monitoring.coreos.com_prometheusrules.yaml",
];
const WAIT: Duration = Duration::from_secs(60);
const INSTALL: &str = "apt-get install prometheus";

/// The PrometheusRule of a render.
fn prometheus_rule(docs: &[serde_yaml::Value]) -> &serde_yaml::Value {
    docs.iter()
        .find(|d| d["kind"] == "PrometheusRule")
        .expect("a PrometheusRule")
}

/// Every alerting rule of a PrometheusRule.
fn alert_rules(rule: &serde_yaml::Value) -> Vec<&serde_yaml::Value> {
    rule["spec"]["groups"]
        .as_sequence()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_sequence().expect("rules").iter())
        .collect()
}

fn names(rules: &[&serde_yaml::Value]) -> BTreeSet<String> {
    rules
        .iter()
        .map(|r| r["alert"].as_str().expect("an alerting rule").to_string())
        .collect()
}

/// Writes the rule file Prometheus reads: the PrometheusRule's spec, as the operator hands it on.
fn write_rules(rule: &serde_yaml::Value, path: &Path) {
    std::fs::write(path, serde_yaml::to_string(&rule["spec"]).unwrap()).unwrap();
}

#[tokio::test]
async fn the_alert_rules_pass_their_promtool_unit_tests() {
    let kc = bed().await.kubeconfig.clone();
    let promtool = on_path("promtool", INSTALL);
    let docs = template(&kc, &["prometheusRule.enabled=true"]).unwrap();
    let rule = prometheus_rule(&docs);
    let rules = alert_rules(rule);
    let selector = format!("job=\"{JOB}\",namespace=\"{RELEASE_NS}\"");
    for r in &rules {
        let alert = r["alert"].as_str().unwrap();
        let expr = r["expr"].as_str().unwrap();
        assert!(
            expr.contains(&selector),
            "{alert} reads series of other releases: {expr}"
        );
        assert!(
            r["labels"]["severity"]
                .as_str()
                .is_some_and(|s| !s.is_empty()),
            "{alert} has no severity"
        );
        for a in ["summary", "description"] {
            assert!(
                r["annotations"][a].as_str().is_some_and(|s| s.len() > 20),
                "{alert} has no {a}"
            );
        }
    }

    // every alert has a case where it fires and one where it does not
    let tests_file = repo_root().join("monitoring/alerts.test.yaml");
    let tests: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(&tests_file).unwrap()).unwrap();
    let mut fires = BTreeSet::new();
    let mut quiet = BTreeSet::new();
    for case in tests["tests"].as_sequence().unwrap() {
        for t in case["alert_rule_test"].as_sequence().into_iter().flatten() {
            let name = t["alertname"].as_str().unwrap().to_string();
            match t["exp_alerts"].as_sequence() {
                Some(e) if !e.is_empty() => fires.insert(name),
                _ => quiet.insert(name),
            };
        }
    }
    let all = names(&rules);
    assert_eq!(
        all.len(),
        15,
        "the chart's alerts (update the test file too): {all:?}"
    );
    assert_eq!(fires, all, "alerts with a firing case");
    assert_eq!(quiet, all, "alerts with a case that does not fire");

    let dir = tempfile::tempdir().unwrap();
    write_rules(rule, &dir.path().join("rendered-rules.yaml"));
    std::fs::copy(&tests_file, dir.path().join("alerts.test.yaml")).unwrap();
    let check = run(Command::new(&promtool).current_dir(dir.path()).args([
        "check",
        "rules",
        "rendered-rules.yaml",
    ]));
    let found = format!("SUCCESS: {} rules found", all.len());
    assert!(check.contains(&found), "{check}");
    let out = Command::new(&promtool)
        .current_dir(dir.path())
        .args(["test", "rules", "alerts.test.yaml"])
        .output()
        .expect("run promtool");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("promtool test rules:\n{text}");
    assert!(out.status.success(), "promtool test rules failed:\n{text}");

    // the values reach the rules: a threshold, a duration, an alert turned off, the selector
    let docs = template(
        &kc,
        &[
            "prometheusRule.enabled=true",
            "prometheusRule.alerts.remoteDown.for=1m",
            "prometheusRule.alerts.sweepsAborting.count=10",
            "prometheusRule.alerts.noLeader.enabled=false",
            "prometheusRule.selector=job=\"xcc\"",
            "prometheusRule.additionalAlertLabels.team=platform",
        ],
    )
    .unwrap();
    let rules = alert_rules(prometheus_rule(&docs));
    assert!(!names(&rules).contains("CrossClusterNoLeader"));
    let by_name: BTreeMap<&str, &serde_yaml::Value> = rules
        .iter()
        .map(|r| (r["alert"].as_str().unwrap(), *r))
        .collect();
    assert_eq!(by_name["CrossClusterRemoteDown"]["for"], "1m");
    assert_eq!(
        by_name["CrossClusterRemoteDown"]["expr"],
        "min by (remote) (xcc_remote_up{job=\"xcc\"}) == 0"
    );
    assert!(
        by_name["CrossClusterSweepsAborting"]["expr"]
            .as_str()
            .unwrap()
            .ends_with("> 10")
    );
    assert!(rules.iter().all(|r| r["labels"]["team"] == "platform"));
    // nothing is rendered by default
    let docs = template(&kc, &[]).unwrap();
    for kind in ["ServiceMonitor", "PrometheusRule", "ConfigMap"] {
        assert!(
            !docs.iter().any(|d| d["kind"] == kind),
            "{kind} rendered by default"
        );
    }
}

/// The dashboard JSON of a render's ConfigMap, with the ConfigMap's labels.
fn dashboard(docs: &[serde_yaml::Value]) -> (Value, serde_yaml::Value) {
    let cm = docs
        .iter()
        .find(|d| d["kind"] == "ConfigMap")
        .expect("the dashboard ConfigMap");
    let text = cm["data"]["cross-cluster-controller.json"]
        .as_str()
        .expect("the dashboard JSON");
    (
        serde_json::from_str(text).expect("the dashboard is JSON"),
        cm["metadata"]["labels"].clone(),
    )
}

fn kubectl(kc: &Path) -> Command {
    let mut c = Command::new(tool("kubectl"));
    c.env("KUBECONFIG", kc).args(["--context", LOCAL]);
    c
}

/// Installs the Prometheus Operator's CRDs into the local cluster (idempotent).
fn install_crds(kc: &Path) {
    let dir = run(Command::new("bash")
        .current_dir(repo_root())
        .arg("testbed/crds.sh"));
    let dir = PathBuf::from(dir.trim());
    for crd in CRDS {
        run(kubectl(kc)
            .args(["apply", "--server-side", "--force-conflicts", "-f"])
            .arg(dir.join(crd)));
    }
    run(kubectl(kc).args([
        "wait",
        "--for",
        "condition=Established",
        "--timeout",
        "60s",
        "crd/servicemonitors.monitoring.coreos.com",
        "crd/prometheusrules.monitoring.coreos.com",
    ]));
}

#[tokio::test]
async fn the_monitoring_objects_are_accepted_with_the_prometheus_operator_crds() {
    let kc = bed().await.kubeconfig.clone();
    install_crds(&kc);
    let ns = namespace("monitoring-objects").await;
    let sets = [
        "serviceMonitor.enabled=true",
        "serviceMonitor.labels.release=kube-prometheus-stack",
        "prometheusRule.enabled=true",
        "prometheusRule.labels.release=kube-prometheus-stack",
        "grafanaDashboard.enabled=true",
        "grafanaDashboard.annotations.grafana_folder=Platform",
    ];
    let text = template_text(&kc, &ns.name, &sets).unwrap();
    let docs = documents(&text);
    let (dash, labels) = dashboard(&docs);
    assert_eq!(labels["grafana_dashboard"], "1", "the sidecar's label");
    assert_eq!(dash["uid"], "cross-cluster-controller");
    let dir = tempfile::tempdir().unwrap();
    let all = dir.path().join("rendered.yaml");
    std::fs::write(&all, &text).unwrap();
    // the whole chart with every monitoring object, dry run, strict field validation
    run(kubectl(&kc)
        .args([
            "apply",
            "--dry-run=server",
            "--validate=strict",
            "-n",
            &ns.name,
            "-f",
        ])
        .arg(&all));

    // the three monitoring objects created for real: what the API server stored is what was
    // rendered (no field pruned by the CRDs' schemas)
    let monitoring: Vec<&serde_yaml::Value> = docs
        .iter()
        .filter(|d| {
            ["ServiceMonitor", "PrometheusRule", "ConfigMap"].contains(&d["kind"].as_str().unwrap())
        })
        .collect();
    assert_eq!(monitoring.len(), 3);
    for d in &monitoring {
        let file = dir.path().join("one.yaml");
        std::fs::write(&file, serde_yaml::to_string(d).unwrap()).unwrap();
        run(kubectl(&kc)
            .args(["create", "--validate=strict", "-n", &ns.name, "-f"])
            .arg(&file));
        let kind = d["kind"].as_str().unwrap().to_lowercase();
        let name = d["metadata"]["name"].as_str().unwrap();
        let stored: serde_yaml::Value = serde_yaml::from_str(&run(
            kubectl(&kc).args(["get", &kind, name, "-n", &ns.name, "-o", "yaml"])
        ))
        .unwrap();
        let field = if kind == "configmap" { "data" } else { "spec" };
        assert_eq!(stored[field], d[field], "{kind} {name} stored as rendered");
        assert_eq!(
            stored["metadata"]["labels"], d["metadata"]["labels"],
            "{kind} {name} labels"
        );
    }

    // and the CRDs do validate: a rule whose `for` is not a duration is refused
    let mut bad = prometheus_rule(&docs).clone();
    bad["metadata"]["name"] = "bad-for".into();
    bad["spec"]["groups"][0]["rules"][0]["for"] = "five minutes".into();
    let file = dir.path().join("bad.yaml");
    std::fs::write(&file, serde_yaml::to_string(&bad).unwrap()).unwrap();
    let out = kubectl(&kc)
        .args(["apply", "--dry-run=server", "-n", &ns.name, "-f"])
        .arg(&file)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("spec.groups[0].rules[0].for"),
        "a bad duration was accepted: {err}"
    );
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The machine's Prometheus, started on a free loopback port with a data dir of its own.
struct Prometheus {
    child: Child,
    port: u16,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    async fn start(config: &str, rules: &serde_yaml::Value) -> Prometheus {
        let bin = on_path("prometheus", INSTALL);
        let dir = tempfile::tempdir().unwrap();
        write_rules(rules, &dir.path().join("rules.yaml"));
        let config_file = dir.path().join("prometheus.yml");
        std::fs::write(&config_file, config).unwrap();
        let log = dir.path().join("prometheus.log");
        let out = std::fs::File::create(&log).unwrap();
        let port = free_port();
        let child = Command::new(bin)
            .arg(format!("--config.file={}", config_file.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::from(out.try_clone().unwrap()))
            .stderr(Stdio::from(out))
            .spawn()
            .expect("start prometheus");
        let p = Prometheus {
            child,
            port,
            log,
            _dir: dir,
        };
        eventually("Prometheus to be ready", WAIT, || async {
            match p.get("/-/ready") {
                Ok((200, _)) => Ok(()),
                Ok((code, body)) => Err(format!("{code} {body}")),
                Err(e) => Err(format!("{e}\n{}", p.logs())),
            }
        })
        .await;
        p
    }

    fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn get(&self, path: &str) -> Result<(u16, String), String> {
        http_get(self.port, path, Duration::from_secs(10))
    }

    /// The `data` of an API answer whose status is success.
    fn api(&self, path: &str) -> Result<Value, String> {
        let (code, body) = self.get(path)?;
        let v: Value = serde_json::from_str(&body).map_err(|e| format!("{code} {body}: {e}"))?;
        if v["status"] != "success" {
            return Err(format!("{path}: {code} {body}"));
        }
        Ok(v["data"].clone())
    }

    /// An instant query's samples.
    fn query(&self, q: &str) -> Result<Vec<Value>, String> {
        let data = self.api(&format!("/api/v1/query?query={}", urlencode(q)))?;
        Ok(data["result"].as_array().cloned().unwrap_or_default())
    }

    fn query_range(&self, q: &str, start: f64, end: f64) -> Result<Vec<Value>, String> {
        let data = self.api(&format!(
            "/api/v1/query_range?query={}&start={start:.3}&end={end:.3}&step=1",
            urlencode(q)
        ))?;
        Ok(data["result"].as_array().cloned().unwrap_or_default())
    }

    /// The active (pending or firing) alerts named `name` whose labels include `labels`.
    fn alerts(&self, name: &str, labels: &[(&str, &str)]) -> Result<Vec<Value>, String> {
        let data = self.api("/api/v1/alerts")?;
        Ok(data["alerts"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|a| a["labels"]["alertname"] == name)
            .filter(|a| labels.iter().all(|(k, v)| a["labels"][*k] == *v))
            .collect())
    }

    /// The value of a single-sample instant query.
    fn value(&self, q: &str) -> Result<f64, String> {
        let r = self.query(q)?;
        r.first()
            .and_then(|s| s["value"][1].as_str())
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("{q}: {r:?}"))
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("--- prometheus log ---\n{}", self.logs());
        }
    }
}

/// Changes the port of the leaders a, b and c once per round; each round is waited for until
/// the followers show it and Prometheus has scraped the daemon after that, so the traffic is
/// paced by the scrapes (never by a sleep) and the dashboard's rates have points to show.
async fn paced_changes(
    prom: &Prometheus,
    remote: &Api<Service>,
    local: &Api<Service>,
    ports: std::ops::RangeInclusive<i32>,
) {
    let scraped = format!("timestamp(up{{job=\"{JOB}\"}})");
    for port in ports {
        for name in ["a", "b", "c"] {
            remote
                .patch(
                    name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"ports": [{"name": "http", "port": port}]}})),
                )
                .await
                .unwrap();
        }
        let want = &[port];
        for name in ["a", "b", "c"] {
            eventually("the follower updated", WAIT, || {
                ports_are(local, name, want)
            })
            .await;
        }
        let applied = unix_now();
        eventually("Prometheus to scrape the daemon again", WAIT, || async {
            match prom.value(&scraped)? {
                t if t > applied => Ok(()),
                t => Err(format!("last scrape at {t}, changes applied at {applied}")),
            }
        })
        .await;
    }
}

/// The state of the remote-down alert for `remote`: None (inactive), "pending" or "firing".
fn remote_down(p: &Prometheus, remote: &str) -> Result<Option<String>, String> {
    let a = p.alerts("CrossClusterRemoteDown", &[("remote", remote)])?;
    Ok(a.first()
        .and_then(|a| a["state"].as_str())
        .map(String::from))
}

#[tokio::test]
async fn a_real_prometheus_fires_remote_down_while_a_remote_is_down_and_resolves_it() {
    let kc = bed().await.kubeconfig.clone();
    support::extra_cluster(PROMDOWN, "").await;
    let ns = namespace_in("prom-remote-down", &[LOCAL, PROMDOWN]).await;
    let remote: Api<Service> = Api::namespaced(client(PROMDOWN).await, &ns.name);
    let local: Api<Service> = Api::namespaced(client(LOCAL).await, &ns.name);
    let pp = PostParams::default();
    for name in ["a", "b", "c"] {
        remote.create(&pp, &exported(name, 80)).await.unwrap();
    }
    let args = with_args(
        with_flag(args_for(&ns.name), "--remote-context", PROMDOWN),
        &[
            "--sweep-schedule",
            "*/5 * * * * *",
            "--sweep-list-timeout-seconds",
            "2",
        ],
    );
    let d = Daemon::start(&args).await;
    d.wait_synced(&[PROMDOWN]).await;

    // the chart's rules, as Prometheus gets them from the PrometheusRule; `for` shortened by a
    // values override, nothing else changed
    let docs = template(
        &kc,
        &[
            "prometheusRule.enabled=true",
            "prometheusRule.alerts.remoteDown.for=10s",
            "grafanaDashboard.enabled=true",
        ],
    )
    .unwrap();
    let rule = prometheus_rule(&docs);
    let remote_down_rule = alert_rules(rule)
        .into_iter()
        .find(|r| r["alert"] == "CrossClusterRemoteDown")
        .cloned()
        .unwrap();
    assert_eq!(remote_down_rule["for"], "10s");
    // the labels the Prometheus Operator gives a target of the chart's ServiceMonitor
    let config = format!(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
         rule_files: [rules.yaml]\n\
         scrape_configs:\n  - job_name: {JOB}\n    static_configs:\n      - targets: ['127.0.0.1:{}']\n        labels: {{namespace: {RELEASE_NS}}}\n",
        d.admin
    );
    let prom = Prometheus::start(&config, rule).await;
    let t_start = unix_now();
    let up = format!("xcc_remote_up{{remote=\"{PROMDOWN}\"}}");
    eventually("Prometheus to see the remote up", WAIT, || async {
        let v = prom.value(&up)?;
        if v == 1.0 {
            Ok(())
        } else {
            Err(format!("{v}"))
        }
    })
    .await;

    // traffic for the dashboard: port changes, a local Service that shadows a leader
    paced_changes(&prom, &remote, &local, 81..=95).await;
    local
        .create(
            &pp,
            &obj(json!({"metadata": {"name": "shadow"}, "spec": {"ports": [{"port": 5432}]}})),
        )
        .await
        .unwrap();
    remote.create(&pp, &exported("shadow", 80)).await.unwrap();
    d.wait_metric(
        "xcc_conflicts_total",
        &[("remote", PROMDOWN), ("kind", "Service")],
        1.0,
    )
    .await;
    eventually("Prometheus to scrape the conflict", WAIT, || async {
        match prom.value(&format!(
            "sum(xcc_conflicts_total{{remote=\"{PROMDOWN}\"}})"
        ))? {
            v if v >= 1.0 => Ok(()),
            v => Err(format!("{v}")),
        }
    })
    .await;
    // nothing fires while the remote is up, and the daemon leads
    assert_eq!(remote_down(&prom, PROMDOWN).unwrap(), None);
    let no_leader = prom.alerts("CrossClusterNoLeader", &[]).unwrap();
    assert!(no_leader.is_empty(), "{no_leader:?}");

    // the remote's API server dies
    tokio::task::spawn_blocking(|| bed_cmd(&["kill", PROMDOWN, "apiserver"]))
        .await
        .unwrap();
    let killed = Instant::now();
    let t_killed = unix_now();
    let pending = Cell::new(None);
    let alert = eventually(
        "CrossClusterRemoteDown firing for promdown",
        WAIT,
        || async {
            let a = prom.alerts("CrossClusterRemoteDown", &[("remote", PROMDOWN)])?;
            match a.first().and_then(|a| a["state"].as_str()) {
                Some("firing") => Ok(a[0].clone()),
                Some("pending") => {
                    if pending.get().is_none() {
                        pending.set(Some(killed.elapsed()));
                    }
                    Err("pending".into())
                }
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    let fired = killed.elapsed();
    let t_fired = unix_now();
    assert!(
        fired >= Duration::from_millis(9_500),
        "fired {fired:?} after the kill, before its `for` (10s) could have passed"
    );
    assert_eq!(alert["labels"]["severity"], "warning");
    let summary = alert["annotations"]["summary"].as_str().unwrap();
    assert_eq!(
        summary,
        "cross-cluster-controller cannot watch remote cluster promdown"
    );
    assert!(
        alert["annotations"]["description"]
            .as_str()
            .unwrap()
            .starts_with("A watch of remote cluster promdown has been failing for 10s"),
        "{alert}"
    );
    assert_eq!(d.gauge("xcc_remote_up", &[("remote", PROMDOWN)]), Some(0.0));

    // back: the alert resolves
    let restarted = Instant::now();
    let t_restarted = unix_now();
    tokio::task::spawn_blocking(|| bed_cmd(&["start", PROMDOWN]))
        .await
        .unwrap();
    let ready = restarted.elapsed();
    let seen_up = Cell::new(None);
    eventually("CrossClusterRemoteDown to resolve", WAIT * 2, || async {
        if seen_up.get().is_none() && prom.value(&up).ok() == Some(1.0) {
            seen_up.set(Some(restarted.elapsed()));
        }
        match remote_down(&prom, PROMDOWN)? {
            None => Ok(()),
            Some(state) => Err(state),
        }
    })
    .await;
    let resolved = restarted.elapsed();
    let t_resolved = unix_now();
    // and the remote is read again: changes and a deletion there reach the followers
    paced_changes(&prom, &remote, &local, 96..=103).await;
    remote.delete("c", &DeleteParams::default()).await.unwrap();
    eventually("the follower of the deleted leader to go", WAIT, || {
        absent(&local, "c")
    })
    .await;
    present(&local, "a").await.unwrap();
    d.wait_metric(
        "xcc_writes_total",
        &[("kind", "Service"), ("verb", "delete")],
        1.0,
    )
    .await;
    eventually("Prometheus to scrape the deletion", WAIT, || async {
        match prom.value("sum(xcc_writes_total{verb=\"delete\"})")? {
            v if v >= 1.0 => Ok(()),
            v => Err(format!("{v}")),
        }
    })
    .await;
    // the latency histograms: every write the API server accepted was timed (a refused one is
    // timed too, never counted), and Prometheus scrapes them beside the passes' durations
    let service_deletes = [("kind", "Service"), ("verb", "delete")];
    let accepted = d.metric("xcc_writes_total", &service_deletes);
    let timed = d.metric("xcc_write_duration_seconds_count", &service_deletes);
    assert!(timed >= accepted, "{timed} timed, {accepted} accepted");
    eventually(
        "Prometheus to scrape the pass and write histograms",
        WAIT,
        || async {
            let passes = prom.value(
                "sum(xcc_reconcile_duration_seconds_count{mode=\"follower\",outcome=\"applied\"})",
            )?;
            let deletes = prom
                .value("sum(xcc_write_duration_seconds_count{kind=\"Service\",verb=\"delete\"})")?;
            let buckets = prom.value(
                "count(xcc_write_duration_seconds_bucket{kind=\"Service\",verb=\"delete\"})",
            )?;
            (passes >= 1.0 && deletes >= 1.0 && buckets > 1.0)
                .then_some(())
                .ok_or(format!(
                    "applied passes {passes}, Service deletes {deletes}, buckets {buckets}"
                ))
        },
    )
    .await;

    let timings = format!(
        "remote API server killed -> alert pending {:.1}s, firing {:.1}s (for: 10s); \
         restarted -> API server ready {:.1}s, xcc_remote_up 1 in Prometheus {:.1}s, alert \
         resolved {:.1}s",
        pending.get().map(|p| p.as_secs_f64()).unwrap_or(f64::NAN),
        fired.as_secs_f64(),
        ready.as_secs_f64(),
        seen_up.get().map(|p| p.as_secs_f64()).unwrap_or(f64::NAN),
        resolved.as_secs_f64()
    );
    println!("{timings}");

    // every query of the dashboard runs on this Prometheus, and the main panels have data
    let (dash, _) = dashboard(&docs);
    let t_end = unix_now();
    let mut panels = Vec::new();
    for panel in dash["panels"].as_array().unwrap() {
        let title = panel["title"].as_str().unwrap();
        let mut targets = Vec::new();
        let mut points = 0;
        for t in panel["targets"].as_array().unwrap() {
            let expr = t["expr"]
                .as_str()
                .unwrap()
                .replace("$job", JOB)
                .replace("$remote", ".+")
                .replace("$__rate_interval", "10s");
            let series = prom
                .query_range(&expr, t_start, t_end)
                .unwrap_or_else(|e| panic!("panel {title}: {e}"));
            points += series
                .iter()
                .map(|s| s["values"].as_array().map_or(0, Vec::len))
                .sum::<usize>();
            targets.push(json!({"expr": expr, "legend": t["legendFormat"], "series": series}));
        }
        assert!(points > 0, "panel {title} has no data");
        panels.push(json!({"title": title, "type": panel["type"],
            "unit": panel["fieldConfig"]["defaults"]["unit"], "targets": targets}));
    }
    let remote_up = prom
        .query_range(
            &format!("min by (remote) (xcc_remote_up{{job=\"{JOB}\"}})"),
            t_start,
            t_end,
        )
        .unwrap();
    let values: Vec<f64> = remote_up[0]["values"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v[1].as_str()?.parse().ok())
        .collect();
    assert!(values.contains(&0.0) && values.last() == Some(&1.0));
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("monitoring");
    std::fs::create_dir_all(&out).unwrap();
    let data = json!({
        "title": dash["title"],
        "start": t_start,
        "end": t_end,
        "timings": timings,
        "events": [
            {"t": t_killed, "what": "API server killed"},
            {"t": t_fired, "what": "alert firing"},
            {"t": t_restarted, "what": "restart"},
            {"t": t_resolved, "what": "alert resolved"},
        ],
        "panels": panels,
    });
    std::fs::write(
        out.join("dashboard-data.json"),
        serde_json::to_string_pretty(&data).unwrap(),
    )
    .unwrap();
}
