//! Benchmark on the test bed (run it with `scripts/bench`; it is not part of the test command).
//!
//! For each scenario (labelled remote services x endpoints each) it measures, against the real
//! API servers: the floor (the daemon's own objects, computed by its pure desired state, written
//! by a plain client and timed by the same watch counters as the daemon, right before and right
//! after it: see [`multi`]), the daemon's time from start to full convergence, its peak and
//! steady memory and CPU seconds, the API writes it caused (from the API server's own
//! apiserver_request_total) and the writes during an idle window that holds a whole sweep (the
//! benchmarked daemons sweep every 20 s). The floor of earlier runs (plain objects, timed until
//! the last create answered) is reported beside it. One scenario also measures
//! steady-state propagation lag at a fixed rate of endpoint changes, observed by a separate
//! watcher on the local cluster. Results go to bench/results.{md,json} and bench/*.svg.
//!
//! `XCC_BENCH_MULTI=1` runs the scenarios with several remote clusters instead ([`multi`]);
//! `XCC_BENCH_MCS=1` the Multi-Cluster Services path ([`mcs`]); `XCC_BENCH_PROBE=1` the
//! data-path probe's cost ([`probe`]); each mode's results go to a
//! section of their own in the same files.
mod mcs;
mod multi;
mod probe;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::core::v1::{Namespace, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{PartialObjectMeta, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Config};
use serde_json::{Value, json};

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

const KEY: &str = "fair.com/cross-cluster";
const PARALLEL: usize = 32;

async fn client(kubeconfig: &Path, ctx: &str) -> Res<Client> {
    let kc = Kubeconfig::read_from(kubeconfig)?;
    let opts = KubeConfigOptions {
        context: Some(ctx.into()),
        ..Default::default()
    };
    Ok(Client::try_from(
        Config::from_custom_kubeconfig(kc, &opts).await?,
    )?)
}

fn service(name: &str, leader: bool) -> Service {
    let labels = if leader {
        json!({KEY: "true", "app": name})
    } else {
        json!({"app": name})
    };
    let mut spec = json!({"ports": [{"name": "http", "port": 80, "targetPort": 8080}]});
    // headless by default: this Kubernetes version's ClusterIP allocator gets slower with every
    // Service (10,000 take 130 s to create here, 18 s headless), the same for the floor and the
    // daemon, and would hide both; XCC_BENCH_CLUSTERIP=1 measures with ClusterIPs anyway
    if std::env::var_os("XCC_BENCH_CLUSTERIP").is_none() {
        spec["clusterIP"] = json!("None");
    }
    serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}, "spec": spec}))
        .expect("service fixture")
}

fn slice(svc: &str, endpoints: usize, seed: usize, leader: bool) -> EndpointSlice {
    slice_named(svc, &format!("{svc}-abcde"), endpoints, seed, leader)
}

/// A slice of `svc` named `name`, its addresses derived from `seed`.
fn slice_named(
    svc: &str,
    name: &str,
    endpoints: usize,
    seed: usize,
    leader: bool,
) -> EndpointSlice {
    let eps: Vec<Value> = (0..endpoints)
        .map(|i| {
            let n = seed * 100 + i;
            json!({"addresses": [format!("10.{}.{}.{}", 100 + n / 65000 % 100, n / 250 % 250, n % 250 + 1)],
                   "conditions": {"ready": true}})
        })
        .collect();
    let mut labels = json!({"kubernetes.io/service-name": svc});
    if leader {
        labels[KEY] = json!("true");
    }
    serde_json::from_value(json!({"metadata": {"name": name, "labels": labels},
        "addressType": "IPv4", "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}], "endpoints": eps}))
    .expect("slice fixture")
}

/// A fresh test bed (down, then up) for each scenario: no scenario pays for the objects of the
/// previous one (the API server's ClusterIP repair loop and the namespace controller would be
/// busy with them for minutes), and clean-up costs nothing. The bed is the one in
/// $XCC_TESTBED_DIR, which scripts/bench points at a directory of its own.
async fn fresh_bed(kc: &Path) -> Res<(Client, Client)> {
    fresh_bed_of(&["east", "west"]).await?;
    Ok((client(kc, "east").await?, client(kc, "west").await?))
}

/// A fresh test bed of these clusters (each one's context is its name).
async fn fresh_bed_of(clusters: &[&str]) -> Res<()> {
    if std::env::var_os("XCC_TESTBED_DIR").is_none() {
        return Err("run the benchmark with scripts/bench: it resets a test bed of its own".into());
    }
    for cmd in ["down", "up"] {
        let names: &[&str] = if cmd == "up" { clusters } else { &[] };
        let out = Command::new("bash")
            .args(["testbed/bed", cmd])
            .args(names)
            .stderr(Stdio::inherit())
            .output()?;
        if !out.status.success() {
            return Err(format!("testbed/bed {cmd} failed").into());
        }
    }
    Ok(())
}

async fn create_ns(c: &Client, name: &str) -> Res<()> {
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}}))?;
    Api::<Namespace>::all(c.clone())
        .create(&PostParams::default(), &ns)
        .await?;
    Ok(())
}

/// Writes n Services and n slices as fast as the API server takes them; returns the seconds.
/// Unlabelled ones (`leader` false) are named `other-N`, so they can sit beside the leaders.
async fn write_all(c: &Client, ns: &str, n: usize, eps: usize, leader: bool) -> Res<f64> {
    let prefix = if leader { "svc" } else { "other" };
    write_set(
        c,
        ns,
        &Set {
            prefix,
            n,
            eps,
            leader,
            seed: 0,
            slices_each: 1,
        },
    )
    .await
}

/// What [`write_set`] writes: Services `<prefix>-<i>` for i in 0..n, each with `slices_each`
/// slices of `eps` endpoints (addresses from `seed + i`).
struct Set<'a> {
    prefix: &'a str,
    n: usize,
    eps: usize,
    leader: bool,
    seed: usize,
    slices_each: usize,
}

/// Writes a [`Set`] as fast as the API server takes it (32 Services in flight, each followed by
/// its slices); returns the seconds. One slice each is named `<service>-abcde`, more
/// `<service>-abcde-<j>`.
async fn write_set(c: &Client, ns: &str, set: &Set<'_>) -> Res<f64> {
    let svcs: Api<Service> = Api::namespaced(c.clone(), ns);
    let slices: Api<EndpointSlice> = Api::namespaced(c.clone(), ns);
    let start = Instant::now();
    stream::iter(0..set.n)
        .map(|i| {
            let (svcs, slices) = (svcs.clone(), slices.clone());
            async move {
                let name = format!("{}-{i}", set.prefix);
                svcs.create(&PostParams::default(), &service(&name, set.leader))
                    .await?;
                for j in 0..set.slices_each {
                    let slice_name = match set.slices_each {
                        1 => format!("{name}-abcde"),
                        _ => format!("{name}-abcde-{j}"),
                    };
                    let seed = (set.seed + i) * set.slices_each + j;
                    let s = slice_named(&name, &slice_name, set.eps, seed, set.leader);
                    slices.create(&PostParams::default(), &s).await?;
                }
                Ok::<_, kube::Error>(())
            }
        })
        .buffer_unordered(PARALLEL)
        .try_collect::<Vec<_>>()
        .await?;
    Ok(start.elapsed().as_secs_f64())
}

/// apiserver_request_total of mutating verbs (POST, PUT, PATCH, DELETE) on Services and
/// EndpointSlices, summed.
async fn api_writes(c: &Client) -> Res<f64> {
    // what the daemon writes in slices mode. Not Endpoints: the bed's kube-controller-manager
    // keeps issuing DELETEs (404) for the Endpoints of Services deleted with earlier namespaces
    api_writes_of(c, &["services", "endpointslices"]).await
}

/// apiserver_request_total of mutating verbs on these resources (subresources included), summed.
async fn api_writes_of(c: &Client, resources: &[&str]) -> Res<f64> {
    let req = http::Request::get("/metrics").body(Vec::new())?;
    let text = c.request_text(req).await?;
    if !text.contains("\napiserver_request_total{") {
        return Err("the API server's /metrics has no apiserver_request_total".into());
    }
    Ok(text
        .lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
        .filter(|l| {
            [
                "verb=\"POST\"",
                "verb=\"PUT\"",
                "verb=\"PATCH\"",
                "verb=\"DELETE\"",
            ]
            .iter()
            .any(|v| l.contains(v))
        })
        .filter(|l| {
            resources
                .iter()
                .any(|r| l.contains(&format!("resource=\"{r}\"")))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum())
}

struct Proc {
    child: Child,
    /// the daemon's admin server (its /metrics) at 127.0.0.1
    port: u16,
}

impl Proc {
    /// Peak RSS (MiB), RSS now (MiB) and CPU seconds of the daemon, while it runs; an error
    /// (never a zero) when they cannot be read, e.g. because it exited.
    fn stat(&mut self) -> Res<(f64, f64, f64)> {
        if let Some(status) = self.child.try_wait()? {
            return Err(format!("the daemon exited ({status}) before it was measured").into());
        }
        let pid = self.child.id();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
        let kb = |k: &str| -> Res<f64> {
            status
                .lines()
                .find(|l| l.starts_with(k))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
                .ok_or_else(|| format!("no {k} in /proc/{pid}/status").into())
        };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
        let fields: Vec<&str> = stat
            .rsplit(')')
            .next()
            .unwrap_or("")
            .split_whitespace()
            .collect();
        let ticks = |i: usize| -> Res<f64> {
            fields
                .get(i)
                .and_then(|v| v.parse::<f64>().ok())
                .ok_or_else(|| format!("/proc/{pid}/stat has no field {i}").into())
        };
        // utime, stime are fields 14 and 15 of stat; after the ')' they are at 11 and 12
        let cpu = (ticks(11)? + ticks(12)?) / 100.0;
        Ok((kb("VmHWM:")? / 1024.0, kb("VmRSS:")? / 1024.0, cpu))
    }
}

impl Drop for Proc {
    /// SIGTERM, as Kubernetes stops a pod (a heap-profiling build writes its profile then);
    /// SIGKILL if it has not exited after 30 s.
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The daemon with one static remote, east (`--remote-context east`).
fn start_daemon(bin: &Path, kubeconfig: &Path, ns: &str, log: &Path) -> Res<Proc> {
    let mut args: Vec<std::ffi::OsString> = ["--remote-context", "east", "--kubeconfig"]
        .map(Into::into)
        .into();
    args.push(kubeconfig.into());
    spawn_daemon(bin, kubeconfig, ns, &args, log)
}

/// The daemon (local cluster west, mirroring namespace `ns`, its Lease and remote Secrets in
/// `ns` too) with `extra` arguments.
fn spawn_daemon(
    bin: &Path,
    kubeconfig: &Path,
    ns: &str,
    extra: &[std::ffi::OsString],
    log: &Path,
) -> Res<Proc> {
    let out = std::fs::File::create(log)?;
    let port = free_port()?;
    let child = Command::new(bin)
        .args([
            "--devmode",
            "--local-context",
            "west",
            "--namespace",
            ns,
            "--watch-namespace",
            ns,
        ])
        .args([
            "--workers",
            "32",
            "--admin-bind",
            &format!("127.0.0.1:{port}"),
        ])
        .args(["--sweep-schedule", SWEEP_SCHEDULE])
        .args(extra)
        .env("KUBECONFIG", kubeconfig)
        // XCC_BENCH_RUST_LOG=info for a timeline of the daemon's writes (the log is kept in /tmp)
        .env(
            "RUST_LOG",
            std::env::var("XCC_BENCH_RUST_LOG").unwrap_or_else(|_| "warn".into()),
        )
        // no budget (issue 27): 10,000 x 100 is a million endpoints, four times the default
        // of one remote; the benchmark measures the pace, and an operator mirroring that much
        // raises the budget the same way (an older build without the flags ignores these)
        .env("REMOTE_MAX_SERVICES", "0")
        .env("REMOTE_MAX_ENDPOINTS", "0")
        .env("REMOTE_MAX_CACHE_BYTES", "0")
        // a remote from the environment would be one the benchmark did not ask for
        .env_remove("KUBECONFIG_PATH")
        .env_remove("REMOTE_CONTEXT")
        .stdout(Stdio::from(out.try_clone()?))
        .stderr(Stdio::from(out))
        .spawn()?;
    Ok(Proc { child, port })
}

/// The sweep schedule of every benchmarked daemon: often enough that an idle window, which
/// lasts until a whole sweep has run inside it, stays short (the daemon's default is every
/// five minutes, when a sweep would rarely fall in a window of a few seconds).
pub(crate) const SWEEP_SCHEDULE: &str = "*/20 * * * * *";

/// A TCP port nothing listens on at 127.0.0.1 now (the daemon's admin server).
pub(crate) fn free_port() -> Res<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// The daemon's /metrics text.
pub(crate) async fn daemon_metrics(port: u16) -> Res<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .await?;
    let mut text = String::new();
    s.read_to_string(&mut text).await?;
    Ok(text)
}

/// The sweeps the daemon has run to an end (`xcc_sweeps_total`, every outcome).
async fn sweeps_ended(port: u16) -> Res<f64> {
    let text = daemon_metrics(port).await?;
    let ended: f64 = text
        .lines()
        .filter(|l| l.starts_with("xcc_sweeps_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    if !text.contains("\nxcc_sweeps_total{") {
        return Err("the daemon's /metrics has no xcc_sweeps_total".into());
    }
    Ok(ended)
}

/// An idle window that holds a whole sweep: it lasts until two sweeps have ended after its
/// start (the first may have begun before it). Returns the seconds it lasted and the sweeps
/// that ended in it; `writes` is read at its start and its end, and the difference returned.
pub(crate) async fn idle_window<F, Fut>(port: u16, writes: F) -> Res<Idle>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Res<f64>>,
{
    let start = Instant::now();
    let (before, ended_before) = (writes().await?, sweeps_ended(port).await?);
    let deadline = start + Duration::from_secs(120);
    let mut ended = ended_before;
    while ended < ended_before + 2.0 {
        if Instant::now() > deadline {
            return Err(format!("no whole sweep within 120 s ({SWEEP_SCHEDULE})").into());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
        ended = sweeps_ended(port).await?;
    }
    Ok(Idle {
        writes: writes().await? - before,
        seconds: start.elapsed().as_secs_f64(),
        sweeps: ended - ended_before,
    })
}

/// What an idle window saw.
#[derive(serde::Serialize, Clone, Copy, Debug)]
pub(crate) struct Idle {
    pub writes: f64,
    pub seconds: f64,
    pub sweeps: f64,
}

/// How many objects a [`counter`] sees: None until its watch has listed them once.
type Count = tokio::sync::watch::Receiver<Option<usize>>;

/// Number of objects matching the selector in the namespace, kept current by a metadata watch
/// (polling listings at 10,000 objects would load the API server the daemon is measured on).
fn counter<K>(c: &Client, ns: &str, selector: &str) -> Count
where
    K: kube::Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + 'static,
{
    counter_where::<K>(c, ns, selector, |_| true)
}

/// A [`counter`] of the objects whose name passes `keep`. A relisting watch publishes nothing
/// until its listing is complete, so a count never drops to zero because a watch restarted.
fn counter_where<K>(c: &Client, ns: &str, selector: &str, keep: fn(&str) -> bool) -> Count
where
    K: kube::Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + 'static,
{
    let api: Api<PartialObjectMeta<K>> = Api::namespaced(c.clone(), ns);
    let cfg = watcher::Config::default().labels(selector);
    let (tx, rx) = tokio::sync::watch::channel(None);
    tokio::spawn(async move {
        let mut names = std::collections::HashSet::new();
        let mut relist: Option<std::collections::HashSet<String>> = None;
        // backed off: a watch error must not turn into a busy loop on the cores being measured
        let mut s = std::pin::pin!(watcher::watcher(api, cfg).default_backoff());
        while let Some(ev) = s.next().await {
            let name = |m: PartialObjectMeta<K>| m.metadata.name.filter(|n| keep(n));
            match ev {
                Ok(Event::Apply(m)) => names.extend(name(m)),
                Ok(Event::Delete(m)) => {
                    if let Some(n) = name(m) {
                        names.remove(&n);
                    }
                }
                Ok(Event::Init) => relist = Some(Default::default()),
                Ok(Event::InitApply(m)) => {
                    if let Some(r) = relist.as_mut() {
                        r.extend(name(m));
                    }
                    continue;
                }
                Ok(Event::InitDone) => names = relist.take().unwrap_or_default(),
                Err(_) => continue,
            }
            if relist.is_none() && tx.send(Some(names.len())).is_err() {
                return;
            }
        }
    });
    rx
}

/// The current count of a [`counter`] (0 before its first listing, for messages only).
fn now(c: &Count) -> usize {
    c.borrow().unwrap_or(0)
}

/// Waits until both counters reach n.
async fn both_reach(a: &mut Count, b: &mut Count, n: usize, limit: Duration) -> Res<()> {
    reach(a, n, b, n, limit).await
}

/// Waits until counter a reaches at least na and b at least nb.
async fn reach(a: &mut Count, na: usize, b: &mut Count, nb: usize, limit: Duration) -> Res<()> {
    let wait = async {
        a.wait_for(|v| v.is_some_and(|v| v >= na)).await?;
        b.wait_for(|v| v.is_some_and(|v| v >= nb)).await?;
        Ok::<_, tokio::sync::watch::error::RecvError>(())
    };
    match tokio::time::timeout(limit, wait).await {
        Ok(r) => Ok(r?),
        Err(_) => Err(format!(
            "no convergence within {limit:?} ({} services of {na}, {} slices of {nb})",
            now(a),
            now(b)
        )
        .into()),
    }
}

#[derive(serde::Serialize, Clone)]
struct Row {
    services: usize,
    /// unlabelled Services in the remote namespace, each with a slice that only carries
    /// `kubernetes.io/service-name` (the slices the daemon's second slice watch receives)
    unrelated: usize,
    endpoints: usize,
    /// the daemon's objects written directly, timed by the watch counters, right before and
    /// right after the daemon; the ratio's denominator is their mean
    floor_before_s: f64,
    floor_after_s: f64,
    floor_s: f64,
    /// the floor of runs before 2026-11-26: plain objects, timed until the last create answered
    plain_floor_s: f64,
    converge_s: f64,
    ratio: f64,
    peak_mib: f64,
    steady_mib: f64,
    cpu_s: f64,
    api_writes: f64,
    expected_writes: usize,
    /// writes in an idle window that holds a whole sweep, its length and the sweeps it saw
    idle_writes: f64,
    idle_s: f64,
    idle_sweeps: f64,
}

/// One scenario's size: labelled leaders, endpoints each, and unlabelled Services beside them.
struct Size {
    n: usize,
    eps: usize,
    unrelated: usize,
}

async fn scenario(
    bin: &Path,
    kc: &Path,
    east: &Client,
    west: &Client,
    size: Size,
    tag: &str,
) -> Res<Row> {
    let Size { n, eps, unrelated } = size;
    let ns = format!("bench-{tag}-{n}-{eps}-{unrelated}");
    let (plain_ns, before_ns, after_ns) = (
        format!("{ns}-plain"),
        format!("{ns}-floor-a"),
        format!("{ns}-floor-b"),
    );
    for c in [east, west] {
        create_ns(c, &ns).await?;
    }
    for floor_ns in [&plain_ns, &before_ns, &after_ns] {
        create_ns(west, floor_ns).await?;
    }
    eprintln!("[{n} x {eps}] remote setup");
    write_all(east, &ns, n, eps, true).await?;
    if unrelated > 0 {
        eprintln!("[{n} x {eps}] {unrelated} unrelated Services and slices");
        write_all(east, &ns, unrelated, eps, false).await?;
    }
    // the floor: the daemon's own objects, computed by its pure desired state, written directly
    // and timed by the same watch counters (multi.rs), before and after the daemon
    let want = multi::desired_followers(&[("east".to_string(), east.clone())], &ns).await?;
    if want.len() != n {
        return Err(format!("the desired state has {} followers, not {n}", want.len()).into());
    }
    let plain = write_all(west, &plain_ns, n, eps, false).await?;
    let floor_before = multi::floor(west, &before_ns, &want).await?;
    eprintln!(
        "[{n} x {eps}] floor before the daemon {floor_before:.2}s (plain objects, unwatched: {plain:.2}s)"
    );

    eprintln!("[{n} x {eps}] daemon");
    let writes_before = api_writes(west).await?;
    let dir = std::env::temp_dir();
    let mut proc = start_daemon(bin, kc, &ns, &dir.join(format!("xcc-bench-{ns}.log")))?;
    let start = Instant::now();
    let sel = format!("{KEY}=follower");
    let (mut svcs, mut slices) = (
        counter::<Service>(west, &ns, &sel),
        counter::<EndpointSlice>(west, &ns, &sel),
    );
    both_reach(&mut svcs, &mut slices, n, Duration::from_secs(600)).await?;
    let converge = start.elapsed().as_secs_f64();
    let writes = api_writes(west).await? - writes_before;
    eprintln!("[{n} x {eps}] converged in {converge:.2}s; idle period");
    // let the queue drain (second passes triggered by our own writes), then measure idleness
    // over a window that holds a whole sweep
    tokio::time::sleep(Duration::from_secs(5)).await;
    let idle = idle_window(proc.port, || api_writes(west)).await?;
    let (peak, steady, cpu) = proc.stat()?;
    drop(proc);
    multi::same_as_written(west, &ns, &want).await?;
    let floor_after = multi::floor(west, &after_ns, &want).await?;
    let floor = (floor_before + floor_after) / 2.0;
    eprintln!("[{n} x {eps}] floor after the daemon {floor_after:.2}s");
    Ok(Row {
        services: n,
        unrelated,
        endpoints: eps,
        floor_before_s: floor_before,
        floor_after_s: floor_after,
        floor_s: floor,
        plain_floor_s: plain,
        converge_s: converge,
        ratio: converge / floor,
        peak_mib: peak,
        steady_mib: steady,
        cpu_s: cpu,
        api_writes: writes,
        expected_writes: 2 * n,
        idle_writes: idle.writes,
        idle_s: idle.seconds,
        idle_sweeps: idle.sweeps,
    })
}

#[derive(serde::Serialize)]
struct Lag {
    services: usize,
    rate_per_s: u32,
    changes: usize,
    observed: usize,
    /// changes whose remote write failed (not sent, so not awaited)
    failed: usize,
    /// changes sent but not seen within [`LATE`] of the last one: not in the percentiles
    late: usize,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    #[serde(skip)]
    samples_ms: Vec<f64>,
}

/// Endpoint changes at a fixed rate on the remote; a separate watcher on the local cluster
/// records when each change's new address shows up in a follower slice.
#[allow(clippy::too_many_arguments)]
async fn lag(
    bin: &Path,
    kc: &Path,
    east: &Client,
    west: &Client,
    n: usize,
    rate: u32,
    secs: u64,
    tag: &str,
) -> Res<Lag> {
    let ns = format!("bench-lag-{tag}-{n}");
    for c in [east, west] {
        create_ns(c, &ns).await?;
    }
    write_all(east, &ns, n, 3, true).await?;
    let proc = start_daemon(
        bin,
        kc,
        &ns,
        &std::env::temp_dir().join("xcc-bench-lag.log"),
    )?;
    let sel = format!("{KEY}=follower");
    let (mut svcs, mut slices) = (
        counter::<Service>(west, &ns, &sel),
        counter::<EndpointSlice>(west, &ns, &sel),
    );
    both_reach(&mut svcs, &mut slices, n, Duration::from_secs(600)).await?;
    let remote = [(Api::namespaced(east.clone(), &ns), 0)];
    let sel = format!("{KEY}=follower");
    let lag = churn(west, &ns, &sel, &remote, n, rate, secs).await?;
    drop(proc);
    Ok(lag)
}

/// The changes of a lag scenario: `rate` per second for `secs`, change i to the slice of
/// Service `svc-<i mod n>` on remote `i mod R` (its two base addresses from the remote's seed
/// base, plus one new address), timed from just before its update is sent to the new address's
/// arrival in a local slice matching `sel` (the followers', or the MCS slices of a source
/// cluster), seen by a separate watcher.
/// How long a lag run waits, after its last change, for the changes not seen yet.
const LATE: Duration = Duration::from_secs(30);

async fn churn(
    west: &Client,
    ns: &str,
    sel: &str,
    remotes: &[(Api<EndpointSlice>, usize)],
    n: usize,
    rate: u32,
    secs: u64,
) -> Res<Lag> {
    let sel = sel.to_string();
    // new address -> (sent at, change number)
    let sent: Arc<Mutex<HashMap<String, (Instant, usize)>>> = Arc::default();
    // (lag in ms, change number)
    let seen: Arc<Mutex<Vec<(f64, usize)>>> = Arc::default();
    // the first change goes out once the watcher has listed (a change sent during its initial
    // listing would be seen only after it, and timed with it)
    let (listed_tx, listed) = tokio::sync::oneshot::channel();
    let watch = {
        let (sent, seen) = (Arc::clone(&sent), Arc::clone(&seen));
        let api: Api<EndpointSlice> = Api::namespaced(west.clone(), ns);
        let mut listed_tx = Some(listed_tx);
        tokio::spawn(async move {
            let mut s = std::pin::pin!(watcher::watcher(
                api,
                watcher::Config::default().labels(&sel)
            ));
            while let Some(Ok(ev)) = s.next().await {
                if matches!(ev, Event::InitDone)
                    && let Some(tx) = listed_tx.take()
                {
                    let _ = tx.send(());
                }
                if let Event::Apply(sl) | Event::InitApply(sl) = ev {
                    let now = Instant::now();
                    for ep in &sl.endpoints {
                        for a in &ep.addresses {
                            if let Some((t, i)) =
                                sent.lock().map(|mut m| m.remove(a)).ok().flatten()
                                && let Ok(mut v) = seen.lock()
                            {
                                v.push((now.duration_since(t).as_secs_f64() * 1000.0, i));
                            }
                        }
                    }
                }
            }
        })
    };
    tokio::time::timeout(Duration::from_secs(120), listed)
        .await
        .map_err(|_| "the lag watcher did not list within 120 s")??;
    let total = (rate as u64 * secs) as usize;
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate as f64));
    let mut handles = Vec::new();
    for i in 0..total {
        tick.tick().await;
        let (slices, seed) = &remotes[i % remotes.len()];
        let svc = format!("svc-{}", i % n);
        let ip = format!("10.250.{}.{}", i / 250 % 250, i % 250 + 1);
        let mut s = slice(&svc, 2, seed + i % n, true);
        s.endpoints.push(serde_json::from_value(
            json!({"addresses": [ip.clone()], "conditions": {"ready": true}}),
        )?);
        let (slices, sent) = (slices.clone(), Arc::clone(&sent));
        handles.push(tokio::spawn(async move {
            let name = format!("{svc}-abcde");
            let mut cur = slices.get(&name).await.ok()?;
            cur.endpoints = s.endpoints;
            if let Ok(mut m) = sent.lock() {
                m.insert(ip.clone(), (Instant::now(), i));
            }
            if slices
                .replace(&name, &PostParams::default(), &cur)
                .await
                .is_ok()
            {
                return Some(());
            }
            // not sent: nothing to see
            if let Ok(mut m) = sent.lock() {
                m.remove(&ip);
            }
            None
        }));
    }
    let mut failed = 0;
    for h in handles {
        if !matches!(h.await, Ok(Some(()))) {
            failed += 1;
        }
    }
    // every change sent is awaited until it is seen, up to LATE after the last was sent; what
    // is still unseen then is reported as late, not dropped from the count
    let deadline = Instant::now() + LATE;
    let unseen = || sent.lock().map(|m| m.len()).unwrap_or(0);
    while unseen() > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let late = unseen();
    watch.abort();
    if failed + late > 0 {
        eprintln!(
            "  {failed} changes not sent (the remote write failed), {late} sent but not seen within {} s",
            LATE.as_secs()
        );
    }
    let seen = seen.lock().map(|v| v.clone()).unwrap_or_default();
    // the changes later than 100 ms, for a look at where a tail comes from
    let slow: Vec<String> = seen
        .iter()
        .filter(|(ms, _)| *ms > 100.0)
        .map(|(ms, i)| {
            let at = *i as f64 / rate as f64;
            format!(
                "#{i} (remote {}, sent at {at:.2}s) {ms:.0}ms",
                i % remotes.len()
            )
        })
        .collect();
    if !slow.is_empty() {
        eprintln!("  changes later than 100 ms: {}", slow.join(", "));
    }
    let mut v: Vec<f64> = seen.iter().map(|(ms, _)| *ms).collect();
    v.sort_by(|a, b| a.total_cmp(b));
    let q = |p: f64| {
        if v.is_empty() {
            f64::NAN
        } else {
            v[((v.len() - 1) as f64 * p).round() as usize]
        }
    };
    Ok(Lag {
        services: n,
        rate_per_s: rate,
        changes: total,
        observed: v.len(),
        failed,
        late,
        p50_ms: q(0.5),
        p99_ms: q(0.99),
        max_ms: q(1.0),
        samples_ms: v,
    })
}

/// A file's text, or empty when it does not exist.
fn read_or_empty(path: &Path) -> Res<String> {
    match std::fs::read_to_string(path) {
        Ok(t) => Ok(t),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(String::new()),
        Err(e) => Err(e.into()),
    }
}

/// The heading of the data-path section (`XCC_BENCH_DATAPATH=1`, tests/bench_datapath.rs
/// writes it, always as the last section); runs of the other modes keep it.
const DATAPATH: &str = "## Data path";

/// The heading of the failover section (`XCC_BENCH_FAILOVER=1`, tests/bench_failover.rs writes
/// it, before the data path's); runs of the other modes keep it.
const FAILOVER: &str = "## Failover";

/// Where results.md's section `heading` begins, if it has one.
fn section_at(md: &str, heading: &str) -> Option<usize> {
    match md.find(&format!("\n{heading}\n")) {
        Some(i) => Some(i + 1),
        None => md.starts_with(heading).then_some(0),
    }
}

/// The sections of results.md after the single-remote one, in their order (the data path always
/// last); each mode replaces its own and keeps the others.
const SECTIONS: [&str; 5] = [
    multi::SECTION,
    mcs::SECTION,
    probe::SECTION,
    FAILOVER,
    DATAPATH,
];

/// results.md with the section `heading` (one of [`SECTIONS`]) replaced by `section`, or added
/// in its place in the order of [`SECTIONS`]; the rest is kept as it was.
fn with_section(md: &str, heading: &str, section: &str) -> String {
    let (head, _) = split_section(md);
    let mut out = head.trim_end().to_string();
    for h in SECTIONS {
        let text = if h == heading {
            section.to_string()
        } else if let Some(i) = section_at(md, h) {
            // up to the next section of ours, whichever follows
            let rest = &md[i + h.len()..];
            let end = SECTIONS
                .iter()
                .filter_map(|o| rest.find(&format!("\n{o}\n")))
                .min()
                .map_or(md.len(), |e| i + h.len() + e + 1);
            md[i..end].to_string()
        } else {
            continue;
        };
        out += &format!("\n\n{}", text.trim_end());
    }
    out.trim_start().to_string() + "\n"
}

/// results.md split before its several-remotes, MCS, failover or data-path section (the first of
/// them).
fn split_section(md: &str) -> (&str, Option<&str>) {
    match SECTIONS.iter().filter_map(|h| section_at(md, h)).min() {
        Some(i) => (&md[..i], Some(&md[i..])),
        None => (md, None),
    }
}

/// Replaces one mode's section of results.md and its key of results.json; the rest of both
/// files stays.
fn write_section(out: &Path, heading: &str, section: &str, key: &str, value: Value) -> Res<()> {
    std::fs::create_dir_all(out)?;
    let md = read_or_empty(&out.join("results.md"))?;
    std::fs::write(out.join("results.md"), with_section(&md, heading, section))?;
    let mut json: Value = match read_or_empty(&out.join("results.json"))?.as_str() {
        "" => json!({}),
        text => serde_json::from_str(text)?,
    };
    json[key] = value;
    std::fs::write(
        out.join("results.json"),
        serde_json::to_string_pretty(&json)?,
    )?;
    Ok(())
}

fn svg_convergence(rows: &[Row]) -> String {
    let (w, h, pad) = (640.0, 360.0, 50.0);
    let max_t = rows
        .iter()
        .map(|r| r.converge_s.max(r.floor_s))
        .fold(0.1, f64::max);
    let x = |n: usize| pad + ((n as f64).log10() - 2.0) / 2.0 * (w - 2.0 * pad);
    let y = |t: f64| h - pad - t / max_t * (h - 2.0 * pad);
    let mut out = format!(
        "<svg xmlns='http://www.w3.org/2000/svg' width='{w}' height='{h}' font-family='sans-serif' font-size='12'>\n<rect width='100%' height='100%' fill='white'/>\n<text x='{pad}' y='20'>Time to converge (s) vs labelled services (log scale); solid: daemon, dashed: API-server floor</text>\n"
    );
    out += &format!(
        "<line x1='{pad}' y1='{}' x2='{}' y2='{}' stroke='black'/><line x1='{pad}' y1='{pad}' x2='{pad}' y2='{}' stroke='black'/>\n",
        h - pad,
        w - pad,
        h - pad,
        h - pad
    );
    for n in [100, 1000, 10000] {
        out += &format!(
            "<text x='{}' y='{}' text-anchor='middle'>{n}</text>\n",
            x(n),
            h - pad + 18.0
        );
    }
    out += &format!(
        "<text x='5' y='{}'>{max_t:.1}s</text><text x='5' y='{}'>0</text>\n",
        y(max_t) + 4.0,
        h - pad
    );
    for (eps, color) in [(3, "#1f77b4"), (100, "#d62728")] {
        let pts: Vec<&Row> = rows.iter().filter(|r| r.endpoints == eps).collect();
        let line = |f: &dyn Fn(&Row) -> f64| {
            pts.iter()
                .map(|r| format!("{:.1},{:.1}", x(r.services), y(f(r))))
                .collect::<Vec<_>>()
                .join(" ")
        };
        out += &format!(
            "<polyline fill='none' stroke='{color}' stroke-width='2' points='{}'/>\n",
            line(&|r| r.converge_s)
        );
        out += &format!(
            "<polyline fill='none' stroke='{color}' stroke-dasharray='5,4' points='{}'/>\n",
            line(&|r| r.floor_s)
        );
        if let Some(last) = pts.last() {
            out += &format!(
                "<text x='{}' y='{}' fill='{color}'>{eps} endpoints</text>\n",
                x(last.services) - 90.0,
                y(last.converge_s) - 8.0
            );
        }
    }
    out + "</svg>\n"
}

fn svg_lag(l: &Lag) -> String {
    let (w, h, pad) = (640.0, 300.0, 50.0);
    let mut buckets: BTreeMap<u32, usize> = BTreeMap::new();
    for v in &l.samples_ms {
        *buckets.entry((v / 5.0).floor() as u32).or_default() += 1;
    }
    let max_b = buckets.keys().max().copied().unwrap_or(0) + 1;
    let max_c = buckets.values().max().copied().unwrap_or(1) as f64;
    let bw = (w - 2.0 * pad) / max_b as f64;
    let mut out = format!(
        "<svg xmlns='http://www.w3.org/2000/svg' width='{w}' height='{h}' font-family='sans-serif' font-size='12'>\n<rect width='100%' height='100%' fill='white'/>\n<text x='{pad}' y='20'>Propagation lag, {} changes at {}/s over {} services: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms (5 ms buckets)</text>\n",
        l.observed, l.rate_per_s, l.services, l.p50_ms, l.p99_ms, l.max_ms
    );
    for (b, c) in &buckets {
        let bh = *c as f64 / max_c * (h - 2.0 * pad);
        out += &format!(
            "<rect x='{:.1}' y='{:.1}' width='{:.1}' height='{bh:.1}' fill='#1f77b4'/>\n",
            pad + *b as f64 * bw,
            h - pad - bh,
            bw.max(1.0) - 0.5
        );
    }
    out += &format!(
        "<line x1='{pad}' y1='{}' x2='{}' y2='{}' stroke='black'/>\n<text x='{pad}' y='{}'>0 ms</text><text x='{}' y='{}' text-anchor='end'>{} ms</text>\n",
        h - pad,
        w - pad,
        h - pad,
        h - pad + 16.0,
        w - pad,
        h - pad + 16.0,
        max_b * 5
    );
    out + "</svg>\n"
}

#[tokio::main]
async fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().collect();
    let kc = PathBuf::from(
        args.get(1)
            .ok_or("usage: bench KUBECONFIG BINARY OUTDIR [SIZES]")?,
    );
    let bin = PathBuf::from(args.get(2).ok_or("binary")?);
    let out = PathBuf::from(args.get(3).ok_or("outdir")?);
    let multi = std::env::var("XCC_BENCH_MULTI").as_deref() == Ok("1");
    // several remotes: the sizes are Services per remote of the spread scenario (5 remotes)
    let default_sizes = if multi {
        vec![200, 1000, 2000]
    } else {
        vec![100, 1000, 10000]
    };
    let sizes: Vec<usize> = args
        .get(4)
        .map(|s| s.split(',').filter_map(|v| v.parse().ok()).collect())
        .unwrap_or(default_sizes);
    let tag = format!(
        "{:x}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_secs()
            % 0xfffff
    );
    if multi {
        // Services per remote of the merged, join/leave and lag scenarios
        let n: usize = match std::env::var("XCC_BENCH_MULTI_N") {
            Ok(v) => v.parse()?,
            Err(_) => 1000,
        };
        let res = multi::run(&bin, &kc, &sizes, n, &tag).await?;
        let section = multi::markdown(&res, &sizes, n);
        write_section(
            &out,
            multi::SECTION,
            &section,
            "multi",
            serde_json::to_value(&res)?,
        )?;
        print!("{section}");
        return Ok(());
    }
    if std::env::var("XCC_BENCH_PROBE").as_deref() == Ok("1") {
        let res = probe::run(&bin, &kc, &tag).await?;
        let section = probe::markdown(&res);
        write_section(
            &out,
            probe::SECTION,
            &section,
            "probe",
            serde_json::to_value(&res)?,
        )?;
        print!("{section}");
        return Ok(());
    }
    if std::env::var("XCC_BENCH_MCS").as_deref() == Ok("1") {
        let sizes: Vec<usize> = match args.get(4) {
            Some(s) => s.split(',').filter_map(|v| v.parse().ok()).collect(),
            None => vec![1000, 2000],
        };
        let res = mcs::run(&bin, &kc, &sizes, &tag).await?;
        let section = mcs::markdown(&res, &sizes);
        write_section(
            &out,
            mcs::SECTION,
            &section,
            "mcs",
            serde_json::to_value(&res)?,
        )?;
        print!("{section}");
        return Ok(());
    }
    let started = Instant::now();
    let mut rows = Vec::new();
    // XCC_BENCH_ENDPOINTS=3 runs only the 3-endpoint scenarios (for a profile)
    let endpoints: Vec<usize> = std::env::var("XCC_BENCH_ENDPOINTS")
        .ok()
        .map(|v| v.split(',').filter_map(|e| e.parse().ok()).collect())
        .unwrap_or(vec![3, 100]);
    // XCC_BENCH_UNRELATED=N runs each scenario a second time with N unrelated Services whose
    // slices carry only kubernetes.io/service-name (what the second slice watch receives)
    let unrelated: Vec<usize> = match std::env::var("XCC_BENCH_UNRELATED") {
        Ok(v) => vec![0, v.parse()?],
        Err(_) => vec![0],
    };
    for &n in &sizes {
        for &eps in &endpoints {
            for &u in &unrelated {
                let (east, west) = fresh_bed(&kc).await?;
                let row = scenario(
                    &bin,
                    &kc,
                    &east,
                    &west,
                    Size {
                        n,
                        eps,
                        unrelated: u,
                    },
                    &tag,
                )
                .await?;
                eprintln!("  -> {}", serde_json::to_string(&row)?);
                rows.push(row);
            }
        }
    }
    // XCC_BENCH_LAG=0 leaves the lag scenario out (a memory experiment needs only the rows)
    let lag = if std::env::var("XCC_BENCH_LAG").as_deref() == Ok("0") {
        None
    } else {
        let (east, west) = fresh_bed(&kc).await?;
        Some(lag(&bin, &kc, &east, &west, 1000, 50, 20, &tag).await?)
    };
    std::fs::create_dir_all(&out)?;
    std::fs::write(out.join("convergence.svg"), svg_convergence(&rows))?;
    if let Some(lag) = &lag {
        std::fs::write(out.join("lag.svg"), svg_lag(lag))?;
    }
    let mut md = String::from(
        "| services | unrelated slices | endpoints each | floor before (s) | floor after (s) | floor, mean (s) | plain floor (s) | daemon (s) | ratio | peak RSS (MiB) | steady RSS (MiB) | CPU (s) | API writes (expected) | idle writes (window, sweeps in it) |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in &rows {
        md += &format!(
            "| {} | {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.1} | {:.1} | {:.2} | {} ({}) | {} ({:.0} s, {}) |\n",
            r.services,
            r.unrelated,
            r.endpoints,
            r.floor_before_s,
            r.floor_after_s,
            r.floor_s,
            r.plain_floor_s,
            r.converge_s,
            r.ratio,
            r.peak_mib,
            r.steady_mib,
            r.cpu_s,
            r.api_writes,
            r.expected_writes,
            r.idle_writes,
            r.idle_s,
            r.idle_sweeps
        );
    }
    if let Some(lag) = &lag {
        md += &format!(
            "\nPropagation lag (API object to API object: the middle part of the data path, see \"Data path\") at {} endpoint changes per second over {} services, {} changes, {} observed by a separate watcher ({} not sent, {} sent but not seen within 30 s, so not in the percentiles): p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms.\n",
            lag.rate_per_s,
            lag.services,
            lag.changes,
            lag.observed,
            lag.failed,
            lag.late,
            lag.p50_ms,
            lag.p99_ms,
            lag.max_ms
        );
    }
    md += &format!("\nWhole run: {:.0} s.\n", started.elapsed().as_secs_f64());
    // the several-remotes, MCS, failover and data-path sections of earlier runs stay
    let old = read_or_empty(&out.join("results.md"))?;
    let (_, kept) = split_section(&old);
    std::fs::write(
        out.join("results.md"),
        format!("{md}{}", kept.map(|k| format!("\n{k}")).unwrap_or_default()),
    )?;
    let lag = lag.map(|lag| {
        json!({"services": lag.services, "rate_per_s": lag.rate_per_s, "changes": lag.changes,
        "observed": lag.observed, "failed": lag.failed, "late": lag.late, "p50_ms": lag.p50_ms, "p99_ms": lag.p99_ms, "max_ms": lag.max_ms})
    });
    let mut json = json!({"rows": rows, "lag": lag});
    if let Ok(text) = std::fs::read_to_string(out.join("results.json"))
        && let Ok(old) = serde_json::from_str::<Value>(&text)
    {
        for key in ["multi", "mcs", "failover", "datapath"] {
            if let Some(m) = old.get(key) {
                json[key] = m.clone();
            }
        }
    }
    std::fs::write(
        out.join("results.json"),
        serde_json::to_string_pretty(&json)?,
    )?;
    print!("{md}");
    Ok(())
}
