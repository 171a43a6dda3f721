//! The data-path probe's cost (`XCC_BENCH_PROBE=1`, issue 28): the daemon with 10 remotes of
//! 1,000 endpoints each (10 Secrets reading one API-only remote cluster, east, whose 10 labelled
//! Services have 100 endpoints each: 10 merged followers), once with every Secret annotated
//! `fair.com/cross-cluster-probe-after` and once without (the floor), alternating off, on, on,
//! off on one bed. Each run measures a steady window of [`WINDOW`] once every follower records
//! all 10 remotes: the daemon's CPU seconds, the probe rounds it counted
//! (`xcc_remote_probes_total`), the TCP connects it sent (SYNs counted by an nftables rule of the
//! bed's namespace on the endpoints' addresses), its writes (`xcc_writes_total`: a cut-off would
//! write, so a window with writes is not the steady cost) and its peak memory.
//!
//! The endpoints' addresses (10.100.0.0/22, [`super::slice_named`]) are made local to the
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

/// The Secret of remote `r<i>`: east's kubeconfig, with the probe when `probe`.
fn secret(kc: &Path, i: usize, probe: bool) -> Res<Secret> {
    let mut k = Kubeconfig::read_from(kc)?;
    k.current_context = Some("east".into());
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
        "table ip {TABLE} {{ chain out {{ type filter hook output priority 0; policy accept; \
         ip daddr {RANGE} tcp flags & (syn | ack) == syn counter }} }}"
    );
    let _ = sh(&["nft", "delete", "table", "ip", TABLE]);
    sh(&["nft", &rules])?;
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
    let text = daemon_metrics(port).await?;
    Ok(text
        .lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum())
}

/// One run: the daemon started, converged (every follower records every remote, and with the
/// probe every remote probed), then measured for [`WINDOW`].
async fn one(bin: &Path, kc: &Path, west: &Client, ns: &str, probe: bool) -> Res<Run> {
    secrets(west, ns, kc, probe).await?;
    let log = std::env::temp_dir().join(format!("xcc-bench-probe-{probe}.log"));
    let extra: Vec<std::ffi::OsString> = vec![];
    let mut d = spawn_daemon(bin, kc, ns, &extra, &log)?;
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let merged = followers_recording(west, ns, REMOTES).await?;
        let probed = family(d.port, "xcc_remote_probes_total")
            .await
            .unwrap_or(0.0);
        if merged == SERVICES && (!probe || probed >= REMOTES as f64) {
            break;
        }
        if Instant::now() > deadline {
            return Err(
                format!("not converged in 300 s: {merged} followers, {probed} rounds").into(),
            );
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
    fresh_bed_of(&["east", "west"]).await?;
    let (east, west) = (client(kc, "east").await?, client(kc, "west").await?);
    let ns = format!("probe-{tag}");
    create_ns(&east, &ns).await?;
    create_ns(&west, &ns).await?;
    let set = Set {
        prefix: "svc",
        n: SERVICES,
        eps: ENDPOINTS,
        leader: true,
        seed: 0,
        slices_each: 1,
    };
    write_set(&east, &ns, &set).await?;
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
        "{SECTION}\n\n{} remotes of {} endpoints each ({} Services of {} endpoints, read through 10 \
         Secrets of one API-only cluster: 10 merged followers), every Secret with \
         `fair.com/cross-cluster-probe-after: 30s` (probe) or without it (floor); runs alternate \
         off, on, on, off; each measures a steady window once every follower records every \
         remote. Connects are the SYNs to the endpoints' addresses counted by nftables in the \
         bed's namespace (each refused at once: a reachable round).\n\n\
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
            r.cut_off,
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
