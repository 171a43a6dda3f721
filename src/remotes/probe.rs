//! The data-path probe (per remote, opt-in with the Secret annotation
//! `fair.com/cross-cluster-probe-after`): the case where a remote's API server answers but its
//! pods cannot be reached from here (peering lost, a security group, a dead gateway), which its
//! watches never show.
//!
//! Every [`EVERY`], each remote with the probe gets one round: a TCP connect to at most
//! [`PER_ROUND`] of its ready endpoints (those of one exported Service, the next one each round),
//! each bounded by [`CONNECT_TIMEOUT`]. A round is *reachable* when one connect is answered,
//! accepted or refused (a refusal still crossed the path), *unreachable* when none is. A remote
//! with no ready endpoint to probe has no round: nothing is known. Only addresses its address
//! policy admits are probed (the addresses its followers and imports may hold): a hostile
//! remote's slices cannot make the daemon knock on local or reserved addresses.
//!
//! Once its rounds have been unreachable for `probe_after`, the remote is *cut off*: its
//! endpoints are published as not ready (`ready: false, serving: false`) in every follower and
//! import, so kube-proxy sends to the other clusters' endpoints. Nothing is deleted; followers
//! and imports stay. The first reachable round restores them. Flapping is damped as by the
//! outage policy ([`super::outage::Damper`]): after a restore, the rounds must stay reachable for
//! `probe_after` before another cut-off.
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::outage::{Damper, Words, transitioned};
use crate::reconcile::worker::Controller;
use crate::runtime::metrics::ByRemoteOutcome;

/// How often each remote with the probe gets a round.
pub const EVERY: Duration = Duration::from_secs(2);
/// Connects per remote per round at most.
pub const PER_ROUND: usize = 3;
/// How long one connect may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// Whether one connect crossed the path: accepted, or refused by the far end.
async fn answered(to: SocketAddr) -> bool {
    match tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(to)).await {
        Ok(Ok(_)) => true,
        Ok(Err(e)) => e.kind() == std::io::ErrorKind::ConnectionRefused,
        Err(_) => false,
    }
}

/// One round against `targets`: Some(reachable), or None when there is nothing to probe.
pub async fn round(targets: &[SocketAddr]) -> Option<bool> {
    if targets.is_empty() {
        return None;
    }
    let answers = futures::future::join_all(targets.iter().map(|t| answered(*t))).await;
    Some(answers.into_iter().any(|a| a))
}

/// Probes every remote with the probe, cuts off and restores, queues the keys it exports, and
/// reports each transition (log, Event, metrics).
pub async fn run(ctl: Arc<Controller>) {
    let mut dampers: HashMap<Arc<str>, Damper> = HashMap::new();
    let mut tick = tokio::time::interval(EVERY);
    let mut n = 0usize;
    loop {
        tick.tick().await;
        n = n.wrapping_add(1);
        let members = ctl.remotes().states();
        dampers.retain(|name, _| members.iter().any(|m| m.name == *name));
        // no address is judged before the local networks are known
        if !ctl.local().networks.ready() {
            continue;
        }
        // every remote's round at once: one cut-off remote's timeouts delay no other's
        let local = ctl.local().networks.current();
        let rounds = members
            .into_iter()
            .filter(|s| s.probe_after.is_some())
            .map(|s| {
                // only addresses its policy lets reach a local object: a remote's slices are
                // untrusted, and the probe must not knock on what they may not name
                let targets: Vec<SocketAddr> = s
                    .probe_targets(n, PER_ROUND)
                    .into_iter()
                    .filter(|t| s.addresses.judge(&t.ip().to_string(), &local).is_ok())
                    .collect();
                async move { (round(&targets).await, s) }
            });
        for (reachable, s) in futures::future::join_all(rounds).await {
            let (Some(reachable), Some(after)) = (reachable, s.probe_after) else {
                continue;
            };
            let outcome = if reachable {
                "reachable"
            } else {
                "unreachable"
            };
            ctl.metrics()
                .probes
                .get_or_create(&ByRemoteOutcome::new(&s.name, outcome))
                .inc();
            let d = dampers
                .entry(Arc::clone(&s.name))
                .or_insert_with(|| Damper::new(after));
            if let Some(t) = d.step(reachable, Instant::now()) {
                transitioned(&ctl, &s, &s.cut_off, t, after, &CUT_OFF).await;
            }
        }
    }
}

const CUT_OFF: Words = Words {
    action: "DataPathProbe",
    marked: "RemoteCutOff",
    restored: "RemoteReachable",
    marked_note: |remote, secs| {
        format!(
            "remote {remote}'s endpoints unreachable from here for {secs}s (its API server may still answer): they are published as not ready in every follower and import (nothing deleted)"
        )
    },
    restored_note: |remote| format!("remote {remote}'s endpoints are reachable again: restored"),
};

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_listener_or_a_refusal_is_reachable_and_nothing_to_probe_is_no_round() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let open = listener.local_addr().unwrap();
        assert_eq!(round(&[open]).await, Some(true));
        // a port nothing listens on: refused, so the path is there
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        assert_eq!(round(&[closed]).await, Some(true));
        assert_eq!(round(&[]).await, None);
    }
}
