//! Budgets per remote (issue 27): a remote that exports more than its budget is degraded
//! (its caches dropped, its followers kept, /readyz and `xcc_remote_over_budget` say so) while
//! an honest remote goes on converging; a hostile API server that answers with one line of
//! hundreds of MiB fails its remote with a clear error while the daemon stays small.
mod support;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Secret, Service};
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use support::catcher::server_config;
use support::daemon::{Daemon, with_args};
use support::metrics::series_value;
use support::remotes::{apply_secret, kubeconfig_of, remote_secret, secrets_only_args};
use support::{LOCAL, REMOTE, absent, bed, client, eventually, exported, namespace_in, present};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

/// A third cluster of the bed (the one tests/remotes.rs uses too): the flooding remote.
const SOUTH: &str = "south";
const WAIT: Duration = Duration::from_secs(90);

/// South's Secret, its budget `max_services` exported Services (the annotation).
fn south_secret(kubeconfig: &str, max_services: &str) -> Secret {
    let mut s = remote_secret("south", Some(SOUTH), Some(kubeconfig));
    s.metadata.annotations = Some(
        [(
            "fair.com/cross-cluster-max-services".to_string(),
            max_services.to_string(),
        )]
        .into(),
    );
    s
}

fn over_budget(d: &Daemon, remote: &str) -> Result<f64, String> {
    series_value(
        &d.try_metrics()?,
        "xcc_remote_over_budget",
        &[("remote", remote)],
    )
}

#[tokio::test]
async fn a_flooding_remote_is_degraded_its_followers_kept_while_an_honest_one_converges() {
    support::extra_cluster(SOUTH, "").await;
    let ns = namespace_in("budgets", &[REMOTE, LOCAL, SOUTH]).await;
    let east: Api<Service> = Api::namespaced(client(REMOTE).await, &ns.name);
    let south: Api<Service> = Api::namespaced(client(SOUTH).await, &ns.name);
    let west: Api<Service> = Api::namespaced(client(LOCAL).await, &ns.name);
    let secrets: Api<Secret> = Api::namespaced(client(LOCAL).await, &ns.name);
    let pp = PostParams::default();
    east.create(&pp, &exported("honest-1", 80)).await.unwrap();
    for i in 0..2 {
        south
            .create(&pp, &exported(&format!("flood-{i}"), 80))
            .await
            .unwrap();
    }
    let d = Daemon::start_secrets_only(&secrets_only_args(&ns.name)).await;
    d.wait_leading().await;
    apply_secret(
        &secrets,
        &remote_secret("east", None, Some(&kubeconfig_of(REMOTE, |_| {}).await)),
    )
    .await;
    let south_kc = kubeconfig_of(SOUTH, |_| {}).await;
    apply_secret(&secrets, &south_secret(&south_kc, "3")).await;
    for name in ["honest-1", "flood-0", "flood-1"] {
        eventually(&format!("{name} mirrored"), WAIT, || present(&west, name)).await;
    }
    d.wait_synced(&["east", "south"]).await;

    // the flood: south exports 7 Services where its budget is 3
    for i in 2..7 {
        south
            .create(&pp, &exported(&format!("flood-{i}"), 80))
            .await
            .unwrap();
    }
    eventually(
        "south degraded on /readyz and in the metric",
        WAIT,
        || async {
            let (code, body) = d.readyz()?;
            let line = body
                .lines()
                .find(|l| l.starts_with("remote south:"))
                .unwrap_or_default();
            if code != 503 || !line.contains("over budget (more than 3 exported Services)") {
                return Err(format!("/readyz {code}:\n{body}"));
            }
            match over_budget(&d, "south")? {
                1.0 => Ok(()),
                v => Err(format!("xcc_remote_over_budget{{remote=south}} {v}")),
            }
        },
    )
    .await;
    assert_eq!(over_budget(&d, "east"), Ok(0.0));
    let (_, body) = d.readyz().unwrap();
    assert!(body.contains("remote east: synced"), "{body}");

    // the honest remote goes on converging; the flooder's followers stay, through sweeps too
    east.create(&pp, &exported("honest-2", 80)).await.unwrap();
    eventually("honest-2 mirrored", WAIT, || present(&west, "honest-2")).await;
    d.wait_metric(
        "xcc_sweeps_total",
        &[("remote", "east"), ("outcome", "done")],
        3.0,
    )
    .await;
    for name in ["flood-0", "flood-1"] {
        present(&west, name)
            .await
            .unwrap_or_else(|e| panic!("south's follower {name} was not kept: {e}"));
    }
    for i in 3..7 {
        let name = format!("flood-{i}");
        absent(&west, &name)
            .await
            .unwrap_or_else(|e| panic!("{name}, beyond south's budget, was mirrored: {e}"));
    }
    assert!(
        d.logs()
            .contains("over budget (more than 3 exported Services)"),
        "the trip is logged"
    );

    // a larger budget (the annotation: a rotation) and south is read whole again
    apply_secret(&secrets, &south_secret(&south_kc, "10")).await;
    eventually(
        "flood-6 mirrored once south's budget allows it",
        WAIT,
        || present(&west, "flood-6"),
    )
    .await;
    d.wait_synced(&["east", "south"]).await;
    // (the gauges are refreshed every second)
    eventually("south within budget in the metric", WAIT, || async {
        match over_budget(&d, "south")? {
            0.0 => Ok(()),
            v => Err(format!("xcc_remote_over_budget{{remote=south}} {v}")),
        }
    })
    .await;

    // a departed remote leaves no series
    secrets
        .delete("south", &DeleteParams::default())
        .await
        .unwrap();
    eventually("south's over-budget series gone", WAIT, || async {
        match over_budget(&d, "south") {
            Err(_) => Ok(()),
            Ok(v) => Err(format!("still there: {v}")),
        }
    })
    .await;
}

/// Bytes of each endless line: far above any limit, streamed in chunks of one buffer.
const GIANT: usize = 256 << 20;

/// A TLS server with east's serving certificate that answers the Services list with one
/// endless line, the EndpointSlices list with an empty list and their watch with one endless
/// event, and anything else 404.
async fn hostile_server(pki: &Path) -> u16 {
    let acceptor = TlsAcceptor::from(Arc::new(server_config(pki)));
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                if let Ok(tls) = acceptor.accept(tcp).await {
                    let _ = answer(tls).await;
                }
            });
        }
    });
    port
}

async fn answer(
    mut tls: tokio_rustls::server::TlsStream<tokio::net::TcpStream>,
) -> std::io::Result<()> {
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 65536 {
        let n = tls.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
    }
    let head = String::from_utf8_lossy(&head);
    let path = head
        .split_whitespace()
        .nth(1)
        .unwrap_or_default()
        .to_string();
    let watch = path.contains("watch=true");
    let (status, start): (&str, String) = if path.contains("/services") && !watch {
        ("200 OK", list_start("ServiceList"))
    } else if path.contains("/endpointslices") && watch {
        (
            "200 OK",
            r#"{"type":"ADDED","object":{"apiVersion":"discovery.k8s.io/v1","kind":"EndpointSlice","metadata":{"name":"x","annotations":{"a":""#.into(),
        )
    } else if path.contains("/endpointslices") {
        let empty = r#"{"kind":"EndpointSliceList","apiVersion":"discovery.k8s.io/v1","metadata":{"resourceVersion":"1"},"items":[]}"#;
        return reply(&mut tls, "200 OK", empty).await;
    } else if path.contains("/services") {
        // the Services watch is never reached: their list never completes
        return reply(&mut tls, "200 OK", "").await;
    } else {
        let nf = r#"{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}"#;
        return reply(&mut tls, "404 Not Found", nf).await;
    };
    let head = format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n{start}"
    );
    tls.write_all(head.as_bytes()).await?;
    let chunk = vec![b'x'; 64 << 10];
    let mut sent = 0;
    while sent < GIANT {
        // a client that refused the rest closes the connection: the write fails, we stop
        tls.write_all(&chunk).await?;
        sent += chunk.len();
    }
    tls.shutdown().await
}

fn list_start(kind: &str) -> String {
    format!(
        r#"{{"kind":"{kind}","apiVersion":"v1","metadata":{{"resourceVersion":"1"}},"items":[{{"metadata":{{"name":"x","annotations":{{"a":""#
    )
}

async fn reply(
    tls: &mut tokio_rustls::server::TlsStream<tokio::net::TcpStream>,
    status: &str,
    body: &str,
) -> std::io::Result<()> {
    let r = format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    tls.write_all(r.as_bytes()).await?;
    tls.shutdown().await
}

#[tokio::test]
async fn a_hostile_api_server_fails_its_remote_clearly_and_the_daemon_stays_small() {
    let ns = namespace_in("budgets-hostile", &[LOCAL]).await;
    let pki = bed().await.dir.join(REMOTE).join("pki");
    let port = hostile_server(&pki).await;
    let ca = std::fs::read(pki.join("ca.crt")).expect("east's CA");
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("hostile.yaml");
    use base64::Engine;
    let kc = serde_json::json!({
        "apiVersion": "v1", "kind": "Config", "current-context": "hostile",
        "clusters": [{"name": "hostile", "cluster": {
            "server": format!("https://127.0.0.1:{port}"),
            "certificate-authority-data": base64::engine::general_purpose::STANDARD.encode(&ca)}}],
        "users": [{"name": "u", "user": {"token": "hostile"}}],
        "contexts": [{"name": "hostile", "context": {"cluster": "hostile", "user": "u"}}],
    });
    std::fs::write(&kubeconfig, serde_json::to_string(&kc).unwrap()).unwrap();
    let args: Vec<String> = [
        "--devmode",
        "--local-context",
        LOCAL,
        "--namespace",
        &ns.name,
        "--watch-namespace",
        &ns.name,
        "--lease-duration-seconds",
        "6",
        "--api-timeout-seconds",
        "10",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let kubeconfig = kubeconfig.display().to_string();
    let args = with_args(args, &["--kubeconfig", &kubeconfig]);
    let d = Daemon::start(&args).await;

    // the Services list fails first (its answer is one endless line): by then, the memory it
    // could have taken is known
    eventually("the hostile Services list failed", WAIT, || async {
        if let Some(s) = d.exited() {
            return Err(format!("the daemon exited ({s}):\n{}", d.logs()));
        }
        match d
            .logs()
            .contains("watch=remote hostile Services error=listing failed")
        {
            true => Ok(()),
            false => Err("not yet".to_string()),
        }
    })
    .await;
    let peak = d.peak_mib();
    eprintln!("peak RSS with a hostile remote: {peak:.1} MiB");
    assert!(
        peak < 150.0,
        "peak RSS {peak:.1} MiB: a hostile server must not fill the daemon's memory"
    );
    eventually(
        "both hostile answers refused, each with a clear error",
        WAIT,
        || async {
            if let Some(s) = d.exited() {
                return Err(format!("the daemon exited ({s}):\n{}", d.logs()));
            }
            let logs = d.logs();
            let list =
                logs.contains("the response is larger than 33554432 bytes (--max-response-bytes)");
            let line = logs
                .contains("a watch event is longer than 4194304 bytes (--max-watch-line-bytes)");
            if !(list && line) {
                return Err(format!("list refused: {list}, watch line refused: {line}"));
            }
            let (code, body) = d.readyz()?;
            if code != 503
                || !body.contains(
                    "remote hostile: not ready: watch of Services failing: listing failed",
                )
            {
                return Err(format!("/readyz {code}:\n{body}"));
            }
            Ok(())
        },
    )
    .await;
    let peak = d.peak_mib();
    assert!(
        peak < 150.0,
        "peak RSS {peak:.1} MiB once both were refused"
    );
    // the daemon lives on, serving its admin endpoints
    assert!(d.exited().is_none());
}
