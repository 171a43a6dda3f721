//! Leader election on a coordination.k8s.io/v1 Lease. Only the holder writes.
//!
//! Expiry is judged the way client-go does it: by how long *this* replica has seen the record
//! unchanged on its own monotonic clock, not by comparing another machine's timestamps. A holder
//! steps down (publishes `false`) as soon as it has not renewed for `renew_deadline`, which is
//! shorter than the lease duration, so it stops writing before anyone else may start.
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::error::Result;

#[derive(Clone, Debug)]
pub struct LeaseConfig {
    pub namespace: String,
    pub name: String,
    pub identity: String,
    pub duration: Duration,
}

impl LeaseConfig {
    pub fn renew_deadline(&self) -> Duration {
        self.duration * 2 / 3
    }
    pub fn retry_period(&self) -> Duration {
        (self.duration / 5).max(Duration::from_millis(500))
    }
}

struct Elector {
    api: Api<Lease>,
    cfg: LeaseConfig,
    /// (holder, renewTime, resourceVersion) last seen, and when it was first seen
    observed: Option<(String, Instant)>,
}

fn now() -> MicroTime {
    MicroTime(Timestamp::now())
}

impl Elector {
    fn lease_secs(&self) -> i32 {
        i32::try_from(self.cfg.duration.as_secs()).unwrap_or(i32::MAX)
    }

    /// One round: Ok(true) when we hold the lease afterwards.
    async fn try_acquire_or_renew(&mut self) -> Result<bool> {
        let pp = PostParams::default();
        let Some(mut lease) = self.api.get_opt(&self.cfg.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.cfg.name.clone()),
                    namespace: Some(self.cfg.namespace.clone()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.cfg.identity.clone()),
                    lease_duration_seconds: Some(self.lease_secs()),
                    acquire_time: Some(now()),
                    renew_time: Some(now()),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            return match self.api.create(&pp, &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                Err(e) => Err(e.into()),
            };
        };
        let spec = lease.spec.get_or_insert_with(Default::default);
        let holder = spec.holder_identity.clone().unwrap_or_default();
        if holder != self.cfg.identity {
            let fingerprint = format!(
                "{holder}|{:?}|{:?}",
                spec.renew_time.as_ref().map(|t| t.0),
                lease.metadata.resource_version
            );
            let seen_at = match &self.observed {
                Some((f, at)) if *f == fingerprint => *at,
                _ => {
                    self.observed = Some((fingerprint, Instant::now()));
                    Instant::now()
                }
            };
            let duration = spec
                .lease_duration_seconds
                .and_then(|s| u64::try_from(s).ok())
                .map(Duration::from_secs)
                .unwrap_or(self.cfg.duration);
            if !holder.is_empty() && seen_at.elapsed() < duration {
                return Ok(false);
            }
            spec.holder_identity = Some(self.cfg.identity.clone());
            spec.acquire_time = Some(now());
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        }
        spec.renew_time = Some(now());
        spec.lease_duration_seconds = Some(self.lease_secs());
        // the resourceVersion from the get makes this a compare-and-swap
        match self.api.replace(&self.cfg.name, &pp, &lease).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Gives the lease up on shutdown so another replica takes over at once.
    async fn release(&self) -> Result<()> {
        let Some(mut lease) = self.api.get_opt(&self.cfg.name).await? else {
            return Ok(());
        };
        let Some(spec) = lease.spec.as_mut() else {
            return Ok(());
        };
        if spec.holder_identity.as_deref() != Some(&self.cfg.identity) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(now());
        self.api
            .replace(&self.cfg.name, &PostParams::default(), &lease)
            .await?;
        Ok(())
    }
}

/// What to do about a Lease error that retrying will not cure.
fn hint(e: &crate::error::Error, namespace: &str) -> Option<String> {
    match e.api_code()? {
        404 => Some(format!(
            "the Lease namespace {namespace:?} does not exist: create it (the chart does) or set --namespace; no replica can lead until then"
        )),
        403 => Some(format!(
            "not allowed to manage Leases in namespace {namespace:?}: grant get/create/update on coordination.k8s.io leases there (the chart's Role does); no replica can lead until then"
        )),
        _ => None,
    }
}

/// Runs the election until `shutdown`; the receiver says whether this replica may write.
pub fn spawn(
    client: Client,
    cfg: LeaseConfig,
    shutdown: CancellationToken,
    on_change: impl Fn(bool) + Send + Sync + 'static,
) -> (watch::Receiver<bool>, tokio::task::JoinHandle<()>) {
    let (tx, rx) = watch::channel(false);
    let api = Api::namespaced(client, &cfg.namespace);
    let handle = tokio::spawn(async move {
        let mut elector = Elector {
            api,
            cfg: cfg.clone(),
            observed: None,
        };
        let mut last_renew: Option<Instant> = None;
        let mut told: Option<String> = None;
        let set = |leader: bool| {
            if *tx.borrow() != leader {
                if leader {
                    info!(lease = %cfg.name, identity = %cfg.identity, "became leader");
                } else {
                    warn!(lease = %cfg.name, identity = %cfg.identity, "not the leader any more: writes stop");
                }
                tx.send_replace(leader);
                on_change(leader);
            }
        };
        loop {
            let attempt = tokio::time::timeout(
                cfg.retry_period().max(Duration::from_secs(1)),
                elector.try_acquire_or_renew(),
            );
            match attempt.await {
                Ok(Ok(true)) => {
                    last_renew = Some(Instant::now());
                    set(true);
                }
                Ok(Ok(false)) => {
                    last_renew = None;
                    set(false);
                }
                Ok(Err(e)) => match hint(&e, &cfg.namespace) {
                    // a cause the user must fix: said once, at error level, in plain words
                    Some(h) if told.as_deref() != Some(h.as_str()) => {
                        error!(error = %e, category = e.category(), "{h}");
                        told = Some(h);
                    }
                    _ => warn!(error = %e, category = e.category(), "lease round failed"),
                },
                Err(_) => warn!("lease round timed out"),
            }
            if let Some(at) = last_renew
                && at.elapsed() >= cfg.renew_deadline()
            {
                last_renew = None;
                set(false);
            }
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep(cfg.retry_period()) => {}
            }
        }
        let was_leader = *tx.borrow();
        set(false);
        if was_leader {
            match tokio::time::timeout(Duration::from_secs(5), elector.release()).await {
                Ok(Ok(())) => info!(lease = %cfg.name, "lease released"),
                Ok(Err(e)) => warn!(error = %e, "could not release the lease"),
                Err(_) => warn!("releasing the lease timed out"),
            }
        }
    });
    (rx, handle)
}

pub fn default_identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "unknown".into());
    format!("{host}-{}", std::process::id())
}
