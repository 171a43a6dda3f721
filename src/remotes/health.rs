//! Remote health in the local cluster's API, readable with kubectl: the leader keeps one
//! coordination.k8s.io Lease per remote in its namespace (the shape KEP-1645 suggests for an
//! endpoint TTL: a Lease per source cluster), renewed only while that remote's watches are
//! healthy. Its annotations say which cluster it is, when it last listed completely, since when
//! it is in its current state and why not healthy; a remote that leaves has its Lease deleted.
//! `kubectl get leases -l fair.com/cross-cluster-remote-health` lists them, and `status` reads
//! them.
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{ListParams, ObjectMeta};
use kube::{Api, Client, ResourceExt};
use sha2::{Digest, Sha256};
use tracing::{debug, info, warn};

use crate::desired::Options;
use crate::error::{Error, Result};
use crate::reconcile::worker::Controller;
use crate::reconcile::writer::Written;
use crate::runtime::lease::LeaseConfig;

/// How a remote looks now, as the daemon reads it.
#[derive(Clone, Debug, PartialEq)]
pub struct Observation {
    pub remote: String,
    pub cluster_id: Option<String>,
    /// None when every watch of the remote is healthy
    pub problem: Option<String>,
    /// when its watches last completed a full listing (the oldest of them)
    pub last_listing: Option<Timestamp>,
    /// leaders it exports (in the watched namespaces)
    pub exports: usize,
    /// followers on which its export loses a conflict
    pub conflicts: usize,
    /// when its credential expires (see [`crate::remotes::credentials`])
    pub credential_expiry: Option<Timestamp>,
    /// what the data-path probe finds ("reachable", "cut off"); None without the probe
    pub data_path: Option<&'static str>,
    /// what the cluster inventory says of it when not healthy (a ClusterProfile's
    /// `ControlPlaneHealthy False`); shown only, never proof of anything
    pub hub: Option<String>,
}

/// The annotation and label keys, under the label key's prefix.
pub struct Keys {
    pub label: String,
    pub name: String,
    pub cluster_id: String,
    pub last_listing: String,
    pub state_since: String,
    pub problem: String,
    pub exports: String,
    pub conflicts: String,
    pub credential_expiry: String,
    pub data_path: String,
    pub hub: String,
}

impl Keys {
    pub fn new(opts: &Options) -> Self {
        Self {
            label: opts.annotation("remote-health"),
            name: opts.annotation("name"),
            cluster_id: opts.annotation("cluster-id"),
            last_listing: opts.annotation("last-listing"),
            state_since: opts.annotation("state-since"),
            problem: opts.annotation("problem"),
            exports: opts.annotation("exports"),
            conflicts: opts.annotation("conflicts"),
            credential_expiry: opts.annotation("credential-expiry"),
            data_path: opts.annotation("data-path"),
            hub: opts.annotation("hub-says"),
        }
    }
}

/// The value of the health label: the daemon's election Lease name (so two releases in one
/// namespace keep apart), or `true` when that is not a valid label value.
pub fn label_value(lease_name: &str) -> String {
    let valid = !lease_name.is_empty()
        && lease_name.len() <= 63
        && lease_name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && lease_name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && lease_name.ends_with(|c: char| c.is_ascii_alphanumeric());
    if valid {
        lease_name.to_string()
    } else {
        "true".to_string()
    }
}

/// `<daemon lease>-remote-<remote>`, made a valid object name: lowercased, other characters as
/// `-`, shortened; when that changed the remote's name, a hash of it keeps names apart.
pub fn lease_name(daemon_lease: &str, remote: &str) -> String {
    let clean: String = remote
        .chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '-'
            }
        })
        .collect();
    let mut name = format!("{daemon_lease}-remote-{clean}");
    if clean != remote || name.len() > 253 {
        let digest = Sha256::digest(remote.as_bytes());
        let hash = hex::encode(&digest[..4]);
        name.truncate(243);
        name = format!("{}-{hash}", name.trim_end_matches(['-', '.']));
    }
    name
}

fn stamp(t: Timestamp) -> String {
    t.to_string()
}

/// Pure: the Lease to write for a remote now, or None when the live one needs no write. A
/// healthy remote renews (renewTime now); an unhealthy one does not, and its Lease is written
/// only when what it says changed (the problem, the counts), so it goes stale on its own.
#[allow(clippy::too_many_arguments)]
pub fn desired(
    live: Option<&Lease>,
    o: &Observation,
    keys: &Keys,
    name: &str,
    namespace: &str,
    label: &str,
    holder: &str,
    duration: Duration,
    now: Timestamp,
) -> Option<Lease> {
    let healthy = o.problem.is_none();
    let live_ann = live.map(|l| l.annotations().clone()).unwrap_or_default();
    let was_healthy =
        live.is_some_and(|_| live_ann.get(&keys.problem).is_none_or(String::is_empty));
    let changed_state = live.is_none() || was_healthy != healthy;
    let mut ann: BTreeMap<String, String> = BTreeMap::new();
    ann.insert(keys.name.clone(), o.remote.clone());
    ann.insert(
        keys.cluster_id.clone(),
        o.cluster_id.clone().unwrap_or_default(),
    );
    let last_listing = o
        .last_listing
        .map(stamp)
        .or_else(|| live_ann.get(&keys.last_listing).cloned())
        .unwrap_or_default();
    ann.insert(keys.last_listing.clone(), last_listing);
    let since = if changed_state {
        stamp(now)
    } else {
        live_ann
            .get(&keys.state_since)
            .cloned()
            .unwrap_or_else(|| stamp(now))
    };
    ann.insert(keys.state_since.clone(), since);
    ann.insert(keys.problem.clone(), o.problem.clone().unwrap_or_default());
    ann.insert(keys.exports.clone(), o.exports.to_string());
    ann.insert(keys.conflicts.clone(), o.conflicts.to_string());
    let expiry = o.credential_expiry.map(stamp).unwrap_or_default();
    ann.insert(keys.credential_expiry.clone(), expiry);
    ann.insert(
        keys.data_path.clone(),
        o.data_path.unwrap_or_default().to_string(),
    );
    ann.insert(keys.hub.clone(), o.hub.clone().unwrap_or_default());

    let live_spec = live.and_then(|l| l.spec.clone()).unwrap_or_default();
    let mut spec = live_spec.clone();
    spec.holder_identity = Some(holder.to_string());
    spec.lease_duration_seconds = Some(i32::try_from(duration.as_secs()).unwrap_or(i32::MAX));
    if healthy {
        spec.renew_time = Some(MicroTime(now));
        if changed_state || spec.acquire_time.is_none() {
            spec.acquire_time = Some(MicroTime(now));
        }
    }
    let same_ann = ann.iter().all(|(k, v)| live_ann.get(k) == Some(v));
    if !healthy && same_ann && live_spec.holder_identity.as_deref() == Some(holder) {
        return None;
    }
    let mut labels = live.map(|l| l.labels().clone()).unwrap_or_default();
    labels.insert(keys.label.clone(), label.to_string());
    let mut all_ann = live_ann;
    all_ann.extend(ann);
    Some(Lease {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(namespace.to_string()),
            labels: Some(labels),
            annotations: Some(all_ann),
            resource_version: live.and_then(|l| l.metadata.resource_version.clone()),
            ..Default::default()
        },
        spec: Some(spec),
    })
}

/// Keeps the health Leases, on the leader.
pub struct Keeper {
    ctl: Arc<Controller>,
    api: Api<Lease>,
    keys: Keys,
    namespace: String,
    daemon_lease: String,
    label: String,
    holder: String,
    interval: Duration,
}

impl Keeper {
    /// Health Leases beside the daemon's own Lease (`lease`), held by this replica, renewed
    /// every `interval`.
    pub fn new(
        ctl: Arc<Controller>,
        local: Client,
        lease: &LeaseConfig,
        interval: Duration,
    ) -> Self {
        Self {
            keys: Keys::new(ctl.opts()),
            ctl,
            api: Api::namespaced(local, &lease.namespace),
            namespace: lease.namespace.clone(),
            daemon_lease: lease.name.clone(),
            label: label_value(&lease.name),
            holder: lease.identity.clone(),
            interval,
        }
    }

    pub async fn run(self) {
        let mut tick = tokio::time::interval(self.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            // every interval, and at once when a remote is marked or restored
            tokio::select! {
                _ = tick.tick() => {}
                () = self.ctl.remotes().health_change() => {}
            }
            if !self.ctl.is_leader() {
                continue;
            }
            match self.sync().await {
                // leadership lost meanwhile: the writer refused the rest
                Ok(()) | Err(Error::NotLeader) => {}
                Err(e) => {
                    warn!(error = %crate::error::chain(&e), "remote health Leases: not written this time")
                }
            }
        }
    }

    fn observe(&self) -> Vec<Observation> {
        let conflicts = self.ctl.conflict_counts();
        let mut per_remote: HashMap<&str, i64> = HashMap::new();
        for ((remote, _), n) in &conflicts {
            *per_remote.entry(remote.as_str()).or_default() += n;
        }
        let now = Timestamp::now();
        self.ctl
            .remotes()
            .members()
            .iter()
            .map(|m| {
                let s = &m.state;
                let exports = s.exported_in_scope();
                let last_listing = s
                    .seconds_since_list()
                    .and_then(|secs| now.checked_sub(SignedDuration::from_secs_f64(secs)).ok());
                Observation {
                    remote: s.name.to_string(),
                    cluster_id: m.cluster_id.clone(),
                    problem: s.problem(),
                    last_listing,
                    exports,
                    conflicts: usize::try_from(per_remote.get(&*s.name).copied().unwrap_or(0))
                        .unwrap_or(0),
                    credential_expiry: s.credential.get().and_then(|c| c.expiry),
                    data_path: s.probe_after.map(|_| {
                        if s.is_cut_off() {
                            "cut off"
                        } else {
                            "reachable"
                        }
                    }),
                    hub: self.ctl.remotes().reported(&s.name),
                }
            })
            .collect()
    }

    /// Creates or renews one health Lease through the writer (which gates it on the Lease,
    /// honours dry run and bounds it with the write deadline).
    async fn write(&self, remote: &str, name: &str, exists: bool, lease: &Lease) -> Result<()> {
        let writer = self.ctl.writer();
        if exists {
            writer.renew(lease).await?;
        } else if let Written::Done(_) = writer.create(lease).await? {
            info!(%remote, lease = %name, "remote health Lease created");
        }
        Ok(())
    }

    async fn sync(&self) -> Result<()> {
        let selector = format!("{}={}", self.keys.label, self.label);
        let live: BTreeMap<String, Lease> = self
            .api
            .list(&ListParams::default().labels(&selector))
            .await?
            .items
            .into_iter()
            .map(|l| (l.name_any(), l))
            .collect();
        let duration = self.interval * 3;
        let mut wanted = Vec::new();
        for o in self.observe() {
            let name = lease_name(&self.daemon_lease, &o.remote);
            wanted.push(name.clone());
            let Some(lease) = desired(
                live.get(&name),
                &o,
                &self.keys,
                &name,
                &self.namespace,
                &self.label,
                &self.holder,
                duration,
                Timestamp::now(),
            ) else {
                continue;
            };
            self.write(&o.remote, &name, live.contains_key(&name), &lease)
                .await?;
        }
        // a Lease whose remote is not read any more (removed, or not joined after every source
        // was listed) goes
        if !self.ctl.remotes().complete() {
            return Ok(());
        }
        for (name, l) in &live {
            let Some(uid) = l.metadata.uid.as_deref() else {
                continue;
            };
            if wanted.contains(name) {
                continue;
            }
            let why = "its remote is not read any more";
            match self
                .ctl
                .writer()
                .delete::<Lease>(&self.namespace, name, uid, why)
                .await
            {
                Ok(()) => {}
                Err(e) if e.api_code() == Some(409) => debug!(lease = %name, "replaced meanwhile"),
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys() -> Keys {
        Keys::new(&crate::fixtures::opts())
    }

    fn obs(problem: Option<&str>) -> Observation {
        Observation {
            remote: "east".into(),
            cluster_id: Some("id-1".into()),
            problem: problem.map(str::to_string),
            last_listing: Some("2026-01-01T00:00:00Z".parse().unwrap()),
            exports: 3,
            conflicts: 1,
            credential_expiry: None,
            data_path: None,
            hub: None,
        }
    }

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn lease(live: Option<&Lease>, o: &Observation, now: &str) -> Option<Lease> {
        desired(
            live,
            o,
            &keys(),
            "ccc-remote-east",
            "ns",
            "ccc",
            "pod-1",
            Duration::from_secs(30),
            at(now),
        )
    }

    fn ann<'a>(l: &'a Lease, suffix: &str) -> &'a str {
        &l.annotations()[&format!("fair.com/cross-cluster-{suffix}")]
    }

    #[test]
    fn a_healthy_remote_renews_and_keeps_its_since() {
        let first = lease(None, &obs(None), "2026-01-01T00:01:00Z").unwrap();
        let spec = first.spec.as_ref().unwrap();
        assert_eq!(spec.renew_time, spec.acquire_time);
        assert_eq!(spec.lease_duration_seconds, Some(30));
        assert_eq!(ann(&first, "cluster-id"), "id-1");
        assert_eq!(ann(&first, "problem"), "");
        assert_eq!(ann(&first, "credential-expiry"), "", "unknown");
        let o = Observation {
            credential_expiry: Some(at("2027-01-01T00:00:00Z")),
            ..obs(None)
        };
        let with = lease(None, &o, "2026-01-01T00:01:00Z").unwrap();
        assert_eq!(ann(&with, "credential-expiry"), "2027-01-01T00:00:00Z");
        assert_eq!(
            first.labels()["fair.com/cross-cluster-remote-health"],
            "ccc"
        );
        let next = lease(Some(&first), &obs(None), "2026-01-01T00:01:10Z").unwrap();
        let spec = next.spec.as_ref().unwrap();
        assert_eq!(spec.renew_time, Some(MicroTime(at("2026-01-01T00:01:10Z"))));
        assert_eq!(
            spec.acquire_time,
            Some(MicroTime(at("2026-01-01T00:01:00Z")))
        );
        assert_eq!(ann(&next, "state-since"), "2026-01-01T00:01:00Z");
    }

    #[test]
    fn an_unhealthy_remote_stops_renewing_and_is_written_only_when_its_story_changes() {
        let up = lease(None, &obs(None), "2026-01-01T00:01:00Z").unwrap();
        let down = lease(
            Some(&up),
            &obs(Some("watch failing")),
            "2026-01-01T00:02:00Z",
        )
        .unwrap();
        assert_eq!(
            down.spec.as_ref().unwrap().renew_time,
            up.spec.as_ref().unwrap().renew_time,
            "not renewed"
        );
        assert_eq!(ann(&down, "problem"), "watch failing");
        assert_eq!(ann(&down, "state-since"), "2026-01-01T00:02:00Z");
        assert!(
            lease(
                Some(&down),
                &obs(Some("watch failing")),
                "2026-01-01T00:03:00Z"
            )
            .is_none(),
            "nothing new: no write"
        );
        let back = lease(Some(&down), &obs(None), "2026-01-01T00:04:00Z").unwrap();
        let spec = back.spec.as_ref().unwrap();
        assert_eq!(
            spec.acquire_time,
            Some(MicroTime(at("2026-01-01T00:04:00Z")))
        );
        assert_eq!(ann(&back, "state-since"), "2026-01-01T00:04:00Z");
    }

    #[test]
    fn lease_names_are_valid_and_distinct() {
        assert_eq!(lease_name("ccc", "east"), "ccc-remote-east");
        let a = lease_name("ccc", "arn:aws:eks:eu-west-1:1:cluster/East");
        let b = lease_name("ccc", "arn:aws:eks:eu-west-1:1:cluster/east");
        assert_ne!(a, b);
        for n in [&a, &b] {
            assert!(crate::desired::meta_is_dns1123_subdomain(n), "{n}");
        }
        let long = lease_name("ccc", &"x".repeat(300));
        assert!(long.len() <= 253 && crate::desired::meta_is_dns1123_subdomain(&long));
        assert_eq!(
            label_value("cross-cluster-controller"),
            "cross-cluster-controller"
        );
        assert_eq!(label_value(&"a".repeat(64)), "true");
    }

    /// A Keeper of the health Leases in namespace `shop` for one remote, over a mock API
    /// server, as a live leader (`dry_run` false) or a dry run (assumed leadership).
    fn keeper(
        dry_run: bool,
    ) -> (
        Keeper,
        crate::fixtures::ApiServer,
        tokio::sync::watch::Sender<Option<std::time::Instant>>,
    ) {
        use crate::fixtures;
        let (client, api) = fixtures::client("local");
        let (tx, elected) = fixtures::leadership(true);
        let leadership = if dry_run {
            crate::runtime::lease::Leadership::assumed()
        } else {
            elected
        };
        let remote = Arc::new(crate::state::RemoteState::new(
            fixtures::REMOTE,
            fixtures::opts(),
            vec![],
        ));
        let mut ctx = fixtures::ctx(
            client.clone(),
            leadership.clone(),
            vec![remote],
            Arc::new(crate::state::LocalState::default()),
        );
        ctx.writer = crate::reconcile::writer::Writer::new(
            client.clone(),
            leadership.clone(),
            dry_run,
            Arc::clone(&ctx.metrics),
        );
        let queue = crate::runtime::queue::WorkQueue::new();
        let ctl = Arc::new(Controller::new(Arc::new(ctx), queue, leadership));
        let lease = LeaseConfig {
            namespace: "shop".into(),
            name: "ccc".into(),
            identity: "pod-1".into(),
            duration: Duration::from_secs(15),
        };
        let interval = Duration::from_secs(10);
        (Keeper::new(ctl, client, &lease, interval), api, tx)
    }

    const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/shop/leases";

    /// The health Leases listed: this remote's (renewed) and one of a remote no longer read.
    fn listed() -> crate::fixtures::Reply {
        let mine = lease(None, &obs(None), "2026-01-01T00:01:00Z").unwrap();
        let mut mine = serde_json::to_value(&mine).unwrap();
        mine["metadata"]["name"] = serde_json::json!(lease_name("ccc", crate::fixtures::REMOTE));
        mine["metadata"]["uid"] = serde_json::json!("uid-mine");
        mine["metadata"]["resourceVersion"] = serde_json::json!("7");
        let mut old = mine.clone();
        old["metadata"]["name"] = serde_json::json!("ccc-remote-gone");
        old["metadata"]["uid"] = serde_json::json!("uid-gone");
        crate::fixtures::ok(serde_json::json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "LeaseList",
            "metadata": {"resourceVersion": "9"}, "items": [mine, old],
        }))
    }

    #[tokio::test]
    async fn health_leases_go_through_the_writer_renewed_and_deleted_with_proof() {
        use crate::fixtures::{delete, get, ok, put, run};
        let (k, api, _tx) = keeper(false);
        let mine = format!("{LEASES}/{}", lease_name("ccc", crate::fixtures::REMOTE));
        let done = run(&[&api], k.sync(), async {
            api.expect(
                get(LEASES).query("labelSelector", "fair.com/cross-cluster-remote-health=ccc"),
                listed(),
            )
            .await;
            let sent = api
                .expect(
                    put(&mine).query("fieldManager", crate::reconcile::writer::FIELD_MANAGER),
                    ok(serde_json::json!({"metadata": {"name": "x"}})),
                )
                .await;
            assert_eq!(sent.body["metadata"]["resourceVersion"], "7");
            assert_eq!(sent.body["spec"]["holderIdentity"], "pod-1");
            let sent = api
                .expect(
                    delete(&format!("{LEASES}/ccc-remote-gone")),
                    ok(serde_json::json!({"kind": "Status", "apiVersion": "v1",
                                          "status": "Success", "code": 200, "metadata": {}})),
                )
                .await;
            assert_eq!(sent.body["preconditions"]["uid"], "uid-gone");
        })
        .await;
        assert!(done.is_ok(), "{done:?}");
    }

    #[tokio::test]
    async fn a_dry_run_lists_the_health_leases_and_writes_none() {
        use crate::fixtures::{get, run};
        let (k, api, _tx) = keeper(true);
        let done = run(&[&api], k.sync(), async {
            api.expect(get(LEASES), listed()).await;
            // no PUT of its own Lease, no DELETE of the one whose remote is gone
        })
        .await;
        assert!(done.is_ok(), "{done:?}");
    }

    #[tokio::test]
    async fn a_remote_marked_or_restored_is_written_at_once_not_at_the_next_renewal() {
        use crate::fixtures::{delete, get, ok, put, run};
        let (k, api, _tx) = keeper(false);
        let ctl = Arc::clone(&k.ctl);
        let mine = format!("{LEASES}/{}", lease_name("ccc", crate::fixtures::REMOTE));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let keeper = async {
            tokio::select! {
                () = k.run() => {}
                _ = stopped => {}
            }
        };
        let status = serde_json::json!({"kind": "Status", "apiVersion": "v1",
                                        "status": "Success", "code": 200, "metadata": {}});
        let done = run(&[&api], keeper, async {
            // the first renewal, at once
            api.expect(get(LEASES), listed()).await;
            api.expect(
                put(&mine),
                ok(serde_json::json!({"metadata": {"name": "x"}})),
            )
            .await;
            api.expect(
                delete(&format!("{LEASES}/ccc-remote-gone")),
                ok(status.clone()),
            )
            .await;
            // a cut-off (or a restore) 10 s before the next renewal: written now
            let t = std::time::Instant::now();
            ctl.remotes().health_changed();
            api.expect(get(LEASES), listed()).await;
            assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
            api.expect(
                put(&mine),
                ok(serde_json::json!({"metadata": {"name": "x"}})),
            )
            .await;
            api.expect(delete(&format!("{LEASES}/ccc-remote-gone")), ok(status))
                .await;
            let _ = stop.send(());
        })
        .await;
        assert_eq!(done, ());
    }
}
