//! The data-path probe's cost (`XCC_BENCH_PROBE=1`, issue 28): the daemon with 10 remotes of
//! 1,000 endpoints each (10 API-only remote clusters `r0`..`r9` from Secrets, each exporting the
//! same 10 labelled Services of 100 endpoints, its own addresses: 10 merged followers of 1,000
//! endpoints), once with every Secret annotated
//! `fair.com/cross-cluster-probe-after` and once without (the floor), alternating off, on, on,
//! off on one bed. Each run measures a steady window of [`WINDOW`] once every follower records
//! all 10 remotes: the daemon's CPU seconds, the probe rounds it counted
//! (`xcc_remote_probes_total`), the TCP connects it sent (SYNs counted by an nftables rule of the
//! bed's namespace on the endpoints' addresses), its writes (`xcc_writes_total`: a cut-off would
//! write, so a window with writes is not the steady cost) and its peak memory.
//!
//! The endpoints' addresses (10.100.0.0/16, [`super::slice_named`]) are made local to the
//! bed's namespace for the run (`ip addr add 10.100.0.0/16 dev lo`, removed at the end), so
//! every connect is refused at once, as a port nothing listens on would be: a reachable round,
//! the steady state. Nothing leaves the bed's namespace.
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Patch, PatchParams};
use kube::config::Kubeconfig;
use kube::{Api, Client};
use serde_json::json;

use super::multi::{followers_recording, load_1m};
use super::{Res, Set, client, create_ns, daemon_metrics, fresh_bed_of, spawn_daemon, write_set};

pub const SECTION: &str = "## Data-path probe";
const REMOTES: usize = 10;
const SERVICES: usize = 10;
const ENDPOINTS: usize = 100;
/// The steady window each run measures.
const WINDOW: Duration = Duration::from_secs(60);
/// The address range of the endpoints, made local to the bed's namespace for the run.
const RANGE: &str = "10.100.0.0/16";
const TABLE: &str = "xcc_bench_probe";

#[derive(serde::Serialize, Clone, Debug)]
pub struct Run {
    pub probe: bool,
    pub window_s: f64,
    pub cpu_s: f64,
    pub rounds: f64,
    pub connects: f64,
    pub writes: f64,
    pub cut_off: f64,
    pub peak_mib: f64,
    pub load_1m: f64,
}

#[derive(serde::Serialize, Debug)]
pub struct Results {
    pub remotes: usize,
    pub endpoints_per_remote: usize,
    pub runs: Vec<Run>,
}

/// The remote clusters' names (their contexts in the bed's kubeconfig).
fn remotes() -> Vec<String> {
    (0..REMOTES).map(|i| format!("r{i}")).collect()
}

/// The Secret of remote `r<i>`: its kubeconfig, with the probe when `probe`.
fn secret(kc: &Path, i: usize, probe: bool) -> Res<Secret> {
    let mut k = Kubeconfig::read_from(kc)?;
    k.current_context = Some(format!("r{i}"));
    let annotations = if probe {
        json!({"fair.com/cross-cluster-probe-after": "30s"})
    } else {
        json!({})
    };
    Ok(serde_json::from_value(json!({
        "metadata": {"name": format!("r{i}"), "annotations": annotations,
                     "labels": {"fair.com/cross-cluster-remote": "true"}},
        "stringData": {"kubeconfig": serde_yaml::to_string(&k)?}
    }))?)
}

/// Every remote's Secret, replaced whole (annotations included).
async fn secrets(west: &Client, ns: &str, kc: &Path, probe: bool) -> Res<()> {
    let api: Api<Secret> = Api::namespaced(west.clone(), ns);
    for i in 0..REMOTES {
        let s = serde_json::to_value(secret(kc, i, probe)?)?;
        let pp = PatchParams::apply("bench").force();
        api.patch(&format!("r{i}"), &pp, &Patch::Apply(s)).await?;
    }
    Ok(())
}

fn sh(args: &[&str]) -> Res<String> {
    let out = Command::new(args[0]).args(&args[1..]).output()?;
    if !out.status.success() {
        return Err(format!(
            "{}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The endpoints' range local, and an nftables counter of the SYNs sent to it.
fn network_up() -> Res<()> {
    sh(&["ip", "addr", "replace", RANGE, "dev", "lo"])?;
    let rules = format!(
        "table ip {TABLE} {{\n chain out {{\n  type filter hook output priority 0; policy accept;\n  \
         ip daddr {RANGE} tcp flags & (syn | ack) == syn counter\n }}\n}}\n"
    );
    let _ = sh(&["nft", "delete", "table", "ip", TABLE]);
    let mut nft = Command::new("nft")
        .args(["-f", "-"])
        .stdin(std::process::Stdio::piped())
        .spawn()?;
    std::io::Write::write_all(nft.stdin.as_mut().ok_or("nft's stdin")?, rules.as_bytes())?;
    if !nft.wait()?.success() {
        return Err(format!("nft -f: {rules}").into());
    }
    Ok(())
}

fn network_down() {
    let _ = sh(&["nft", "delete", "table", "ip", TABLE]);
    let _ = sh(&["ip", "addr", "del", RANGE, "dev", "lo"]);
}

/// The SYNs counted so far.
fn syns() -> Res<f64> {
    let text = sh(&["nft", "list", "table", "ip", TABLE])?;
    let packets = text
        .split_whitespace()
        .skip_while(|w| *w != "packets")
        .nth(1)
        .ok_or("no counter in the nftables table")?;
    Ok(packets.parse()?)
}

/// The sum of every series of the family `name` in the daemon's /metrics.
async fn family(port: u16, name: &str) -> Res<f64> {
    let text = daemon_metrics(port)
        .await
        .map_err(|e| format!("{name} from the daemon's /metrics at 127.0.0.1:{port}: {e}"))?;
    Ok(text
        .lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum())
}

/// One run: the daemon started, steady (every follower records every remote, every remote up
/// and swept twice, and with the probe every remote probed), then measured for [`WINDOW`].
async fn one(bin: &Path, kc: &Path, west: &Client, ns: &str, probe: bool) -> Res<Run> {
    secrets(west, ns, kc, probe).await?;
    let log = std::env::temp_dir().join(format!("xcc-bench-probe-{ns}-{probe}.log"));
    let extra: Vec<std::ffi::OsString> = vec![];
    let mut d = spawn_daemon(bin, kc, ns, &extra, &log)?;
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        if let Some(status) = d.child.try_wait()? {
            return Err(format!("the daemon exited ({status}); its log: {}", log.display()).into());
        }
        let merged = followers_recording(west, ns, REMOTES).await?;
        // steady: every remote up and swept twice by this daemon (its start-up is over), and
        // with the probe every remote probed
        let up = family(d.port, "xcc_remote_up").await.unwrap_or(0.0);
        let swept = super::sweeps_ended(d.port).await.unwrap_or(0.0);
        let probed = family(d.port, "xcc_remote_probes_total")
            .await
            .unwrap_or(0.0);
        let n = REMOTES as f64;
        if merged == SERVICES && up >= n && swept >= 2.0 * n && (!probe || probed >= n) {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!(
                "not steady in 300 s: {merged} followers merged, {up} remotes up, {swept} sweeps, {probed} rounds"
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let start = Instant::now();
    let (_, _, cpu0) = d.stat()?;
    let rounds0 = family(d.port, "xcc_remote_probes_total").await?;
    let writes0 = family(d.port, "xcc_writes_total").await?;
    let syns0 = syns()?;
    tokio::time::sleep(WINDOW).await;
    let (peak, _, cpu1) = d.stat()?;
    Ok(Run {
        probe,
        window_s: start.elapsed().as_secs_f64(),
        cpu_s: cpu1 - cpu0,
        rounds: family(d.port, "xcc_remote_probes_total").await? - rounds0,
        connects: syns()? - syns0,
        writes: family(d.port, "xcc_writes_total").await? - writes0,
        cut_off: family(d.port, "xcc_remote_cut_off").await?,
        peak_mib: peak,
        load_1m: load_1m(),
    })
}

pub async fn run(bin: &Path, kc: &Path, tag: &str) -> Res<Results> {
    let names = remotes();
    let mut clusters: Vec<&str> = vec!["west"];
    clusters.extend(names.iter().map(String::as_str));
    fresh_bed_of(&clusters).await?;
    let west = client(kc, "west").await?;
    let ns = format!("probe-{tag}");
    create_ns(&west, &ns).await?;
    for (i, name) in names.iter().enumerate() {
        let c = client(kc, name).await?;
        create_ns(&c, &ns).await?;
        // the same Service names in every remote (merged followers), addresses of its own
        let set = Set {
            prefix: "svc",
            n: SERVICES,
            eps: ENDPOINTS,
            leader: true,
            seed: i * SERVICES,
            slices_each: 1,
        };
        write_set(&c, &ns, &set).await?;
    }
    network_up()?;
    let mut runs = Vec::new();
    for probe in [false, true, true, false] {
        match one(bin, kc, &west, &ns, probe).await {
            Ok(r) => runs.push(r),
            Err(e) => {
                network_down();
                return Err(e);
            }
        }
    }
    network_down();
    Ok(Results {
        remotes: REMOTES,
        endpoints_per_remote: SERVICES * ENDPOINTS,
        runs,
    })
}

fn mean(runs: &[&Run], f: fn(&Run) -> f64) -> f64 {
    runs.iter().map(|r| f(r)).sum::<f64>() / runs.len().max(1) as f64
}

pub fn markdown(res: &Results) -> String {
    let mut md = format!(
        "{SECTION}\n\n{} remotes of {} endpoints each (API-only clusters from Secrets, each \
         exporting the same {} Services of {} endpoints: merged followers), every Secret with \
         `fair.com/cross-cluster-probe-after: 30s` (probe) or without it (floor); runs alternate \
         off, on, on, off; each measures a steady window once every follower records every \
         remote. Connects are the SYNs to the endpoints' addresses counted by nftables in the \
         bed's namespace (each refused at once: a reachable round). Writes are every write the \
         daemon sent in the window (`xcc_writes_total`), the health Leases' renewals included \
         (10 remotes, every 10 s: 60 a minute).\n\n\
         | run | probe | window s | CPU s | CPU % of a core | rounds/s | connects/s | writes | cut off | peak RSS MiB | load 1m |\n\
         |---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        res.remotes, res.endpoints_per_remote, SERVICES, ENDPOINTS
    );
    for (i, r) in res.runs.iter().enumerate() {
        md += &format!(
            "| {} | {} | {:.1} | {:.2} | {:.2} | {:.2} | {:.2} | {} | {} | {:.1} | {:.2} |\n",
            i + 1,
            if r.probe { "on" } else { "off" },
            r.window_s,
            r.cpu_s,
            100.0 * r.cpu_s / r.window_s,
            r.rounds / r.window_s,
            r.connects / r.window_s,
            r.writes,
            // a sum of zeros is -0.0 (f64's Sum starts there)
            r.cut_off + 0.0,
            r.peak_mib,
            r.load_1m
        );
    }
    let on: Vec<&Run> = res.runs.iter().filter(|r| r.probe).collect();
    let off: Vec<&Run> = res.runs.iter().filter(|r| !r.probe).collect();
    let pct = |r: &Run| 100.0 * r.cpu_s / r.window_s;
    md += &format!(
        "\nThe probe's cost (mean of the on runs minus mean of the off runs): {:+.2} % of a core, \
         {:.2} rounds/s and {:.2} connects/s at {} remotes ({:.2} connects/s in the off runs).\n",
        mean(&on, pct) - mean(&off, pct),
        mean(&on, |r| r.rounds / r.window_s),
        mean(&on, |r| r.connects / r.window_s),
        res.remotes,
        mean(&off, |r| r.connects / r.window_s),
    );
    md
}
