//! A measurement, not a test (`test = false` in Cargo.toml: `cargo test` never runs it; see
//! docs/benchmarks.md, "A flooding remote"): a flooding remote (east: `XCC_FLOOD_N` Services, 1,000
//! by default, with an annotation of `XCC_FLOOD_BYTES` random letters each, 100,000 by default) and an
//! honest one (south: 100 Services), both read from Secrets, the daemon started with
//! `XCC_FLOOD_ARGS` more; prints the time until south is mirrored, how east ended (waiting up to
//! `XCC_FLOOD_SETTLE_S`, 1,200 s by default, for it to settle), the daemon's
//! peak RSS and its RSS 10 s later. Run it in the bed:
//! `bash testbed/bed exec cargo test --test flood_measure -- --nocapture`.
mod support;

use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Secret, Service};
use kube::Api;
use kube::api::{ListParams, PostParams};
use support::daemon::{Daemon, with_args};
use support::remotes::{apply_secret, kubeconfig_of, remote_secret, secrets_only_args};
use support::{LOCAL, REMOTE, client, eventually, exported, namespace_in};

const SOUTH: &str = "south";

/// `len` letters that do not compress (xorshift from `seed`), so a cache holding them pays in full.
fn noise(seed: usize, len: usize) -> String {
    let mut x = (seed as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            char::from(b'a' + (x % 26) as u8)
        })
        .collect()
}

async fn create_many(api: &Api<Service>, prefix: &str, n: usize, annotation: usize) {
    futures::stream::iter(0..n)
        .for_each_concurrent(16, |i| {
            let api = api.clone();
            let big = noise(i, annotation);
            async move {
                let mut s = exported(&format!("{prefix}-{i}"), 80);
                if annotation > 0 {
                    s.metadata.annotations = Some([("flood".to_string(), big)].into());
                }
                api.create(&PostParams::default(), &s).await.unwrap();
            }
        })
        .await;
}

#[tokio::test]
async fn measure_a_flood_beside_an_honest_remote() {
    let n: usize = std::env::var("XCC_FLOOD_N").map_or(1000, |v| v.parse().unwrap());
    let size: usize = std::env::var("XCC_FLOOD_BYTES").map_or(100_000, |v| v.parse().unwrap());
    let extra: Vec<String> = std::env::var("XCC_FLOOD_ARGS")
        .map(|v| v.split_whitespace().map(String::from).collect())
        .unwrap_or_default();
    support::extra_cluster(SOUTH, "").await;
    let ns = namespace_in("flood", &[REMOTE, LOCAL, SOUTH]).await;
    let east: Api<Service> = Api::namespaced(client(REMOTE).await, &ns.name);
    let south: Api<Service> = Api::namespaced(client(SOUTH).await, &ns.name);
    let west: Api<Service> = Api::namespaced(client(LOCAL).await, &ns.name);
    let secrets: Api<Secret> = Api::namespaced(client(LOCAL).await, &ns.name);
    let t = Instant::now();
    create_many(&east, "flood", n, size).await;
    create_many(&south, "honest", 100, 0).await;
    eprintln!("created in {:.1} s", t.elapsed().as_secs_f64());
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let d = Daemon::start_secrets_only(&with_args(secrets_only_args(&ns.name), &extra)).await;
    d.wait_leading().await;
    let start = Instant::now();
    apply_secret(
        &secrets,
        &remote_secret("east", None, Some(&kubeconfig_of(REMOTE, |_| {}).await)),
    )
    .await;
    let kc = kubeconfig_of(SOUTH, |_| {}).await;
    apply_secret(&secrets, &remote_secret("south", Some(SOUTH), Some(&kc))).await;
    let count = |prefix: &'static str| {
        let west = west.clone();
        async move {
            let l = west
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            Ok::<usize, String>(
                l.items
                    .iter()
                    .filter(|s| s.metadata.name.as_deref().unwrap_or("").starts_with(prefix))
                    .count(),
            )
        }
    };
    eventually("south's 100 mirrored", Duration::from_secs(600), || async {
        match count("honest-").await? {
            100 => Ok(()),
            c => Err(format!("{c}")),
        }
    })
    .await;
    let honest = start.elapsed().as_secs_f64();
    eprintln!(
        "south mirrored after {honest:.1} s; the daemon's peak RSS so far {:.1} MiB",
        d.peak_mib()
    );
    // east mirrored in full (within its budget) takes a write per follower: measured for up to
    // XCC_FLOOD_SETTLE_S (default 1,200) s, and reported as far as it got (a measurement, not a
    // test: the figures are what it reached)
    let settle = std::env::var("XCC_FLOOD_SETTLE_S").map_or(1200, |v| v.parse().unwrap());
    let deadline = Instant::now() + Duration::from_secs(settle);
    let flooded = loop {
        // a failed read is a failed measurement, never a figure of 0
        let (_, body) = d.readyz().expect("/readyz");
        let east_line = body
            .lines()
            .find(|l| l.starts_with("remote east:"))
            .unwrap_or("")
            .to_string();
        let c = count("flood-").await.expect("count east's followers");
        let settled =
            c == n || east_line.contains("over budget") || east_line.contains("larger than");
        if settled || Instant::now() > deadline {
            let how = if settled {
                "settled"
            } else {
                "not settled by the deadline"
            };
            break (c, format!("{how}: {east_line}"));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    tokio::time::sleep(Duration::from_secs(10)).await;
    eprintln!(
        "RESULT n={n} annotation={size} honest_converged_s={honest:.1} east_followers={} east={:?} peak_mib={:.1} rss_10s_later_mib={:.1} total_s={:.1}",
        flooded.0,
        flooded.1,
        d.peak_mib(),
        d.rss_mib(),
        start.elapsed().as_secs_f64()
    );
}
