//! The failover benchmark (issue 28, part 5), a measurement `cargo test` never runs (`test =
//! false` in Cargo.toml): `XCC_BENCH_FAILOVER=1 scripts/bench` runs it on a fresh bench bed
//! (`.testbed-bench/`) of east (one node) and west (three), and it writes the "Failover" section
//! of bench/results.md (before "Data path", which stays the last) and the "failover" key of
//! results.json.
//!
//! The set-up of tests/locality.rs's failover beside its floor (tests/support/locality.rs): the
//! import of `web` (west's 2 pods on west's node 3 in zone a, east's 2; PreferClose, exported;
//! the daemon in west with `--mcs`, reading east) beside the floor, one west Service `floor`
//! (PreferClose) with 2 pods on node 3 and 2 on node 2 (zone b); a client of each on node 1
//! (zone a) at 200 requests/s. Node 3 is unplugged (`bed unplug west 3`: its pods run on,
//! unreachable, and their kubelet's probes fail, so they turn not ready after about 3 s) and
//! plugged in again, N times (`XCC_BENCH_FAILOVER_N`, default 50). For each failover and each
//! side:
//! - **failover time**: from the unplug to the `sent` time of the first request begun at or after
//!   it that the other side answered (east's pods for ours, zone b's for the floor): the local
//!   backend gone to the first remote answer; the kubelet's readiness detection is in both;
//! - **failed requests** among those begun from the unplug until 3 s after both clients were
//!   answered by the other side alone (`2 x 200` answers in a row);
//! - the same after the plug (**failback**): to the first request answered by node 3's pods
//!   again, and the failures until 3 s after both clients were home.
//!
//! Each failover has a fresh pair of clients, whose logs are followed as they are written: a
//! client at 200 requests/s writes about 10 MiB of log in 8 minutes, where the kubelet rotates
//! it, and a log read across a rotation would lose records.
mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use serde_json::json;
use support::bench::{env_number, load_avg, pct, write_results};
use support::locality::{Beside, names, settled_on};
use support::node::{node_cluster, node_cluster_with, wait_dns, workload_images};
use support::traffic::{Load, Rec, Tally, now_ms};
use support::{BedUndo, bed_do};

const EAST: &str = "east";
const WEST: &str = "west";
/// Requests a second of each client (the figure).
const RATE: u32 = 200;
/// How far past both clients' settling a window reaches (ms): late failures on either side.
const TAIL: i64 = 3000;
/// How long a side may take to settle (on the other side, or home) before the failover is
/// recorded as not settled.
const SETTLE_WAIT: Duration = Duration::from_secs(60);
/// The heading of this benchmark's section in results.md.
const SECTION: &str = "## Failover";

/// One side of one failover (ours: the import; the floor: the in-cluster Service), ms after the
/// unplug or the plug.
#[derive(Debug, Default, serde::Serialize)]
struct Side {
    /// from the unplug to the first request begun since that the other side answered
    failover_ms: Option<i64>,
    /// from the unplug to the last request (begun since) that failed or was answered by another
    /// pod than the other side's, once `2 x RATE` in a row were the other side's; None when that
    /// did not happen within SETTLE_WAIT
    away_ms: Option<i64>,
    /// requests begun in the failover's window and how many of them failed
    sent: usize,
    failed: usize,
    /// of those, when the ones begun after the first request the other side answered began (ms
    /// from the unplug), and when the last failed one began
    late_failures_ms: Vec<i64>,
    last_failure_ms: Option<i64>,
    /// from the plug to the first request begun since that node 3's pods answered
    failback_ms: Option<i64>,
    /// like `away_ms`, home: from the plug
    home_ms: Option<i64>,
    failback_sent: usize,
    failback_failed: usize,
    /// why requests failed (failover and failback windows), with their counts
    failures: BTreeMap<String, usize>,
}

/// One failover, both sides.
#[derive(Debug, serde::Serialize)]
struct Failover {
    /// unix ms of the unplug and of the plug
    unplug: i64,
    plug: i64,
    /// the windows' lengths (ms): from the unplug, and from the plug
    window_ms: i64,
    failback_window_ms: i64,
    ours: Side,
    floor: Side,
}

/// ms from `t0` to the `sent` time of the first request begun at or after `t0` that a pod of
/// `by` answered.
fn first_answer(recs: &[Rec], t0: i64, by: &BTreeSet<String>) -> Option<i64> {
    recs.iter()
        .filter(|r| r.sent >= t0 && r.ok && by.contains(&r.pod))
        .map(|r| r.sent - t0)
        .min()
}

/// Waits for `load`'s requests begun after `from` to settle on `by` (see
/// [`settled_on`]) for at most SETTLE_WAIT: ms from `from` to the last one that did not.
async fn settled_within(load: &Load, from: i64, by: BTreeSet<String>) -> Option<i64> {
    tokio::time::timeout(SETTLE_WAIT, settled_on(load, from, by, 2 * RATE as usize))
        .await
        .ok()
        .map(|t| t - from)
}

/// The failures of a window of requests, by reason.
fn count_failures(t: &Tally, into: &mut BTreeMap<String, usize>) {
    for f in &t.fails {
        *into.entry(f.why.clone()).or_default() += 1;
    }
}

/// One half of a failover: `bed CMD west 3` at `from`, then both clients settled on their new
/// pods (or not, within SETTLE_WAIT), then every request begun until `to`, TAIL later, ended.
struct Switch {
    from: i64,
    to: i64,
    /// ms from `from` to each client's settling ([`settled_within`]): ours, the floor's
    settled: (Option<i64>, Option<i64>),
}

/// Runs `bed CMD west 3` (`unplug` or `plug`) under both clients and waits until `load` is
/// answered by `to.0` alone and `floor` by `to.1`, and every request begun until TAIL later
/// has ended.
async fn switch(
    cmd: &'static str,
    (load, floor): (&Load, &Load),
    to: (&BTreeSet<String>, &BTreeSet<String>),
) -> Switch {
    let from = now_ms();
    bed_do(&[cmd, WEST, "3"]).await;
    let settled = tokio::join!(
        settled_within(load, from, to.0.clone()),
        settled_within(floor, from, to.1.clone())
    );
    let to = now_ms() + TAIL;
    tokio::join!(load.records_past(to), floor.records_past(to));
    Switch { from, to, settled }
}

/// One client's view of a failover: `away` the other side's pods, `home` node 3's; `settled`
/// picks its own of each switch's settling times.
fn side(
    recs: &[Rec],
    (out, back): (&Switch, &Switch),
    (away, home): (&BTreeSet<String>, &BTreeSet<String>),
    settled: fn(&Switch) -> Option<i64>,
) -> Side {
    let (o, b) = (
        Tally::of(recs, out.from, out.to),
        Tally::of(recs, back.from, back.to),
    );
    let first = first_answer(recs, out.from, away);
    let mut failures = BTreeMap::new();
    count_failures(&o, &mut failures);
    count_failures(&b, &mut failures);
    Side {
        failover_ms: first,
        away_ms: settled(out),
        sent: o.sent,
        failed: o.failed,
        late_failures_ms: o
            .fails
            .iter()
            .map(|f| f.sent - out.from)
            .filter(|t| first.is_some_and(|first| *t > first))
            .collect(),
        last_failure_ms: o.fails.iter().map(|f| f.sent - out.from).max(),
        failback_ms: first_answer(recs, back.from, home),
        home_ms: settled(back),
        failback_sent: b.sent,
        failback_failed: b.failed,
        failures,
    }
}

/// One failover with a fresh pair of clients: unplugged, settled on the other side, plugged in,
/// home again; and whether both clients came home (the run stops when not).
async fn failover(b: &Beside, i: usize) -> (Failover, bool) {
    let (load, floor) = b
        .clients(&format!("load-{i}"), &format!("floor-{i}"), RATE, true)
        .await;
    let (east_web, floor_b) = (names(&b.east_web), names(&b.floor_b));
    let (west_web, floor_a) = (names(&b.west_web), names(&b.floor_a));
    let out = switch("unplug", (&load, &floor), (&east_web, &floor_b)).await;
    let back = switch("plug", (&load, &floor), (&west_web, &floor_a)).await;
    // both followed logs are complete past `back.to` by now
    let (recs, floor_recs) = (records(&load).await, records(&floor).await);
    tokio::join!(load.delete(), floor.delete());
    let f = Failover {
        unplug: out.from,
        plug: back.from,
        window_ms: out.to - out.from,
        failback_window_ms: back.to - back.from,
        ours: side(&recs, (&out, &back), (&east_web, &west_web), |s| {
            s.settled.0
        }),
        floor: side(&floor_recs, (&out, &back), (&floor_b, &floor_a), |s| {
            s.settled.1
        }),
    };
    let home = back.settled.0.is_some() && back.settled.1.is_some();
    (f, home)
}

/// Every record of a client so far.
async fn records(load: &Load) -> Vec<Rec> {
    load.records()
        .await
        .unwrap_or_else(|e| panic!("records of {}: {e}", load.name))
}

/// ms with no decimals, or "-" when there was nothing to take it from.
fn ms(v: f64) -> String {
    if v.is_nan() {
        "-".into()
    } else {
        format!("{v:.0}")
    }
}

/// p50, p99 and max of `v`, as table cells.
fn spread(v: &[f64]) -> String {
    format!(
        "{} | {} | {}",
        ms(pct(v, 0.5)),
        ms(pct(v, 0.99)),
        ms(pct(v, 1.0))
    )
}

/// Failed requests begun after a side's first remote answer: "N (in M)".
fn stragglers(fs: &[Failover], pick: Pick) -> String {
    let n: Vec<usize> = fs.iter().map(|f| pick(f).late_failures_ms.len()).collect();
    format!(
        "{} (in {})",
        n.iter().sum::<usize>(),
        n.iter().filter(|n| **n > 0).count()
    )
}

/// The failures' reasons of one side over the run, most frequent first (at most 3).
fn reasons(fs: &[Failover], pick: Pick) -> String {
    let mut all: BTreeMap<&str, usize> = BTreeMap::new();
    for f in fs {
        for (why, n) in &pick(f).failures {
            *all.entry(why).or_default() += n;
        }
    }
    let mut v: Vec<(&str, usize)> = all.into_iter().collect();
    v.sort_by_key(|b| std::cmp::Reverse(b.1));
    let shown: Vec<String> = v
        .iter()
        .take(3)
        .map(|(why, n)| format!("{n} `{why}`"))
        .collect();
    if shown.is_empty() {
        "none".into()
    } else {
        shown.join(", ")
    }
}

struct Run {
    n: usize,
    failovers: Vec<Failover>,
    /// why the run stopped before N failovers, if it did
    stopped: Option<String>,
    daemon_exited: bool,
    secs: f64,
    /// of which the failovers
    failovers_secs: f64,
    loads: Vec<String>,
}

fn ours(f: &Failover) -> &Side {
    &f.ours
}

fn floor(f: &Failover) -> &Side {
    &f.floor
}

/// One side of a failover: [`ours`] or [`floor`].
type Pick = fn(&Failover) -> &Side;

fn markdown(r: &Run) -> String {
    let fs = &r.failovers;
    let col = |pick: Pick, v: fn(&Side) -> Option<i64>| -> Vec<f64> {
        fs.iter()
            .filter_map(|f| v(pick(f)))
            .map(|x| x as f64)
            .collect()
    };
    let diffs: Vec<f64> = fs
        .iter()
        .filter_map(|f| Some((f.ours.failover_ms? - f.floor.failover_ms?) as f64))
        .collect();
    let (o_time, f_time) = (col(ours, |s| s.failover_ms), col(floor, |s| s.failover_ms));
    let mut md = format!(
        "{SECTION}\n\n`XCC_BENCH_FAILOVER=1 scripts/bench`: a fresh bed of east (one node) and west (three nodes, zones west-a, west-b, west-a). The import of `web` (west's 2 pods on west's node 3 in zone a, east's 2; both Services `trafficDistribution: PreferClose`, exported; the daemon in west with `--mcs`, release build, reading east) beside its floor, one west Service `floor` (PreferClose) with 2 pods on node 3 and 2 on node 2 (zone b). A client of each on node 1 (zone a), {RATE} requests/s each (`load run`, a new connection and DNS lookup per request), a fresh pair per failover. Each failover: `bed unplug west 3` (its pods run on, unreachable; their kubelet's readiness probes, every 1 s, fail, so they turn not ready after about 3 s), until both clients are answered by the other side alone ({} answers in a row: ours by east's pods, the floor's by zone b's), then `bed plug west 3`, until both are answered by node 3's pods alone again. {} of {} failovers done{}. Whole run {:.0} s, of which the failovers {:.0} s; the machine's 1-minute load average {}.\n",
        2 * RATE,
        fs.len(),
        r.n,
        r.stopped
            .as_ref()
            .map(|s| format!(" (stopped: {s})"))
            .unwrap_or_default(),
        r.secs,
        r.failovers_secs,
        r.loads.join(" before, ") + " after"
    );
    if fs.len() < 100 {
        md += &format!(
            "\nWith {} failovers, p99 (nearest rank) is the largest value.\n",
            fs.len()
        );
    }
    md += &format!(
        "\n### Failover time\n\nms from the unplug to the `sent` time of the first request, begun at or after the unplug, that the other side answered (the local backend gone to the first remote answer; the kubelet's readiness detection, about 3 s, is in both); then from the unplug to the last request that was not the other side's answer before the client was settled on the other side ({} in a row):\n\n| | failovers | first remote answer p50 | p99 | max | settled p50 | p99 | max |\n|---|---:|---:|---:|---:|---:|---:|---:|\n",
        2 * RATE
    );
    for (label, pick) in [
        ("ours (the import, to east)", ours as Pick),
        ("floor (in-cluster, to zone b)", floor),
    ] {
        md += &format!(
            "| {label} | {} | {} | {} |\n",
            col(pick, |s| s.failover_ms).len(),
            spread(&col(pick, |s| s.failover_ms)),
            spread(&col(pick, |s| s.away_ms)),
        );
    }
    md += &format!(
        "| ours minus floor, per failover | {} | {} | | | |\n",
        diffs.len(),
        spread(&diffs)
    );
    md += "\n### Failed requests\n\nPer failover: the requests begun from the unplug until 3 s after both clients were settled on the other side; per failback: from the plug until 3 s after both were home again.\n\n| | failovers | failed per failover: mean | p50 | p99 | max | total | of requests | failed per failback: mean | total | of requests |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
    let total =
        |pick: Pick, v: fn(&Side) -> usize| -> usize { fs.iter().map(|f| v(pick(f))).sum() };
    for (label, pick) in [("ours", ours as Pick), ("floor", floor)] {
        let failed: Vec<f64> = fs.iter().map(|f| pick(f).failed as f64).collect();
        let mean = |t: usize| t as f64 / fs.len().max(1) as f64;
        md += &format!(
            "| {label} | {} | {:.1} | {} | {} | {} | {:.1} | {} | {} |\n",
            fs.len(),
            mean(total(pick, |s| s.failed)),
            spread(&failed),
            total(pick, |s| s.failed),
            total(pick, |s| s.sent),
            mean(total(pick, |s| s.failback_failed)),
            total(pick, |s| s.failback_failed),
            total(pick, |s| s.failback_sent),
        );
    }
    let more = fs.iter().filter(|f| f.ours.failed > f.floor.failed).count();
    md += &format!(
        "\nFailovers in which ours failed more requests than the floor: {more} of {}. Failed requests begun after the side's first remote answer (total; in how many failovers): ours {}, floor {}. Why requests failed (both windows), ours: {}; floor: {}.\n",
        fs.len(),
        stragglers(fs, ours),
        stragglers(fs, floor),
        reasons(fs, ours),
        reasons(fs, floor)
    );
    md += &format!(
        "\n### Failback time\n\nms from the plug to the `sent` time of the first request, begun at or after the plug, that node 3's pods answered; then to the last request that was not theirs before the client was home ({} in a row):\n\n| | failbacks | first home answer p50 | p99 | max | home p50 | p99 | max |\n|---|---:|---:|---:|---:|---:|---:|---:|\n",
        2 * RATE
    );
    for (label, pick) in [("ours", ours as Pick), ("floor", floor)] {
        md += &format!(
            "| {label} | {} | {} | {} |\n",
            col(pick, |s| s.failback_ms).len(),
            spread(&col(pick, |s| s.failback_ms)),
            spread(&col(pick, |s| s.home_ms)),
        );
    }
    let unsettled: Vec<String> = fs
        .iter()
        .enumerate()
        .filter(|(_, f)| {
            [&f.ours, &f.floor]
                .iter()
                .any(|s| s.away_ms.is_none() || s.home_ms.is_none())
        })
        .map(|(i, _)| i.to_string())
        .collect();
    if !unsettled.is_empty() {
        md += &format!(
            "\nNot settled within {} s on one side or both (failover numbers from 0; their windows end {} s after the wait gave up): {}.\n",
            SETTLE_WAIT.as_secs(),
            TAIL / 1000,
            unsettled.join(", ")
        );
    }
    if r.daemon_exited {
        md += "\nThe daemon had exited by the end of the run.\n";
    }
    let added = pct(&o_time, 0.99) - pct(&f_time, 0.99);
    let (o_failed, f_failed) = (total(ours, |s| s.failed), total(floor, |s| s.failed));
    md += &format!(
        "\nGoal: failover adds less than 1 s at p99 to what kube-proxy itself needs (ours' p99 minus the floor's p99, first remote answer): {} ({} ms; the per-failover difference's p99 is {} ms). Failed requests no more than the floor's (totals over the failovers): {} ({o_failed} against {f_failed}).\n",
        if added < 1000.0 { "met" } else { "missed" },
        ms(added),
        ms(pct(&diffs, 0.99)),
        if o_failed <= f_failed {
            "met"
        } else {
            "missed"
        },
    );
    md
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_against_its_floor() {
    let started = Instant::now();
    let n = env_number("XCC_BENCH_FAILOVER_N", 50);
    node_cluster(EAST).await;
    // CoreDNS (one replica) is placed while west has two nodes, so never on node 3, which the
    // benchmark unplugs (Beside::set_up checks)
    node_cluster_with(WEST, 2).await;
    wait_dns(WEST).await;
    node_cluster_with(WEST, 3).await;
    workload_images(&[EAST, WEST]).await;
    tokio::join!(wait_dns(EAST), wait_dns(WEST));
    let b = Beside::set_up(EAST, WEST, "bench-failover").await;
    // an abort leaves node 3 plugged in
    let _plug = BedUndo(&["plug", WEST, "3"]);
    let mut loads = vec![load_avg()];
    let begun = Instant::now();
    let mut failovers = Vec::new();
    let mut stopped = None;
    for i in 0..n {
        let (f, home) = failover(&b, i).await;
        eprintln!("failover {i}: {f:?}");
        failovers.push(f);
        if !home {
            stopped = Some(format!(
                "after failover {i}, a client was not home within {} s of the plug",
                SETTLE_WAIT.as_secs()
            ));
            break;
        }
    }
    loads.push(load_avg());
    let run = Run {
        n,
        failovers,
        stopped,
        daemon_exited: b.daemon.exited().is_some(),
        secs: started.elapsed().as_secs_f64(),
        failovers_secs: begun.elapsed().as_secs_f64(),
        loads,
    };
    let section = markdown(&run);
    write_results(
        &section,
        "failover",
        json!({"n": run.n, "rate": RATE, "tail_ms": TAIL, "secs": run.secs,
               "failovers_secs": run.failovers_secs, "load_avg": run.loads,
               "stopped": run.stopped, "daemon_exited": run.daemon_exited, "failovers": run.failovers}),
    );
    println!("{section}");
}
