//! `cross-cluster-controller status`: the health of every remote as the local cluster's API
//! shows it, read with the local cluster's credentials only (never a remote's, never the
//! daemon's admin port): the remote health Leases the leader keeps, the election Lease, the
//! followers and their slices, the daemon's Events, and (with the MCS API) each import's ready
//! endpoints per cluster ([`imports`]).
//!
//! Exit codes: 0 every remote connected and a leader renewing; 1 something needs a look (a
//! remote not connected or its Lease not renewed, no leader, or followers recording a remote no
//! daemon reads); 2 the local cluster could not be read (or a bad flag); 3 all is well but a
//! remote's credential expires within `--credential-expiry-threshold` (or has expired). The
//! imports' endpoints change no exit code: a cluster cut off is already one (its DATA PATH), a
//! stale one is not connected, and a cluster with no ready endpoint may be scaled to zero.
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use clap::ValueEnum;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ListParams, ObjectMeta};
use kube::{Api, Client, Config, ResourceExt};
use serde::Serialize;

use crate::client::pages::{api_in, list_all, scopes};
use crate::desired::{Options, Recorded, recorded, slice_recorded};
use crate::remotes::health::{Keys, label_value};

pub mod imports;

#[derive(clap::Args, Debug, Clone)]
pub struct StatusArgs {
    /// Kubeconfig of the LOCAL cluster (default loading rules: KUBECONFIG, ~/.kube/config, or
    /// in-cluster).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Context of the local cluster (default: the current context).
    #[arg(long)]
    pub context: Option<String>,
    /// The daemon's namespace (the release namespace).
    #[arg(long, default_value = "fair-system")]
    pub namespace: String,
    /// The daemon's election Lease name (`--lease-name` of the daemon).
    #[arg(long, default_value = "cross-cluster-controller")]
    pub lease_name: String,
    /// The daemon's label key.
    #[arg(long, default_value = "fair.com/cross-cluster")]
    pub label_key: String,
    /// Namespaces whose followers to count (comma-separated; default: all), as the daemon's
    /// `--watch-namespace`.
    #[arg(long = "watch-namespace", value_delimiter = ',')]
    pub watch_namespaces: Vec<String>,
    /// Output format.
    #[arg(short, long, value_enum, default_value_t = Format::Table)]
    pub output: Format,
    /// Exit 3 when a remote's credential expires within this (e.g. 7d, 48h, 90m).
    #[arg(long, default_value = "7d", value_parser = crate::span::parse)]
    pub credential_expiry_threshold: Duration,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Table,
    Json,
}

/// One remote, as the local cluster's API shows it.
#[derive(Debug, Default, Serialize, PartialEq)]
pub struct RemoteStatus {
    pub name: String,
    /// the health Lease exists (the daemon reads this remote)
    pub known: bool,
    pub cluster_id: String,
    /// healthy watches, and the Lease renewed within its duration
    pub connected: bool,
    /// when it entered its current state (connected or not)
    pub since: String,
    pub last_renewed_seconds_ago: Option<i64>,
    pub last_listing_seconds_ago: Option<i64>,
    pub problem: String,
    /// follower Services that record it
    pub followers: usize,
    /// follower EndpointSlices with its endpoints
    pub slices: usize,
    /// followers on which its export loses a conflict now (from its Lease)
    pub export_conflicts: usize,
    /// conflict Events about it (ServiceConflict, NotOurFollower) the API still holds
    pub conflict_events: usize,
    /// skip Events about it the API still holds
    pub skip_events: usize,
    /// when its credential expires (RFC 3339; empty when unknown)
    pub credential_expiry: String,
    /// seconds until then (negative: expired)
    pub credential_expires_in_seconds: Option<i64>,
    /// what the data-path probe finds: "reachable", "cut off" (its endpoints published as not
    /// ready), empty without the probe
    pub data_path: String,
    /// what the cluster inventory says of it when not healthy (a ClusterProfile's
    /// `ControlPlaneHealthy False (Reason): message`); shown only: `status` judges by what the
    /// daemon itself sees
    pub hub_says: String,
}

#[derive(Debug, Default, Serialize, PartialEq)]
pub struct Leader {
    pub identity: String,
    pub renewed_seconds_ago: Option<i64>,
    pub fresh: bool,
    /// how many local pod networks the leader knows (its Lease says; none: not said yet)
    pub local_pod_networks: Option<u64>,
}

#[derive(Debug, Default, Serialize, PartialEq)]
pub struct Report {
    pub namespace: String,
    pub leader: Option<Leader>,
    pub remotes: Vec<RemoteStatus>,
    /// `namespace/name` of followers whose every recorded remote is unknown here
    pub unknown_remote_followers: Vec<String>,
    pub healthy: bool,
    /// remotes whose credential expires within the threshold (or has expired)
    pub credentials_expiring: Vec<String>,
    /// the MCS imports that tell their endpoints per cluster
    pub imports: Vec<imports::ImportStatus>,
    /// objects refused as remotes (a Secret, a ClusterProfile, the static remote), each as the
    /// daemon's latest `RemoteRefused` Event says; shown only (an Event outlives its cause:
    /// /readyz says which refusals hold now)
    pub refused: Vec<Refusal>,
}

/// An object refused as a remote, as the daemon's latest `RemoteRefused` Event on it says.
#[derive(Debug, Default, Serialize, PartialEq)]
pub struct Refusal {
    /// `Secret ns/name`, or what the Event's note names first (`ClusterProfile hub/east`, the
    /// static `remote "east"`)
    pub object: String,
    pub message: String,
    /// since the Event was last recorded
    pub seen_seconds_ago: Option<i64>,
}

/// What `report` reads, listed from the local cluster.
pub struct Inputs {
    pub health: Vec<Lease>,
    pub election: Option<Lease>,
    pub services: Vec<ObjectMeta>,
    pub slices: Vec<ObjectMeta>,
    pub events: Vec<Event>,
    /// our ServiceImports
    pub imports: Vec<ObjectMeta>,
}

fn ago(t: Option<Timestamp>, now: Timestamp) -> Option<i64> {
    t.map(|t| now.duration_since(t).as_secs())
}

fn parse(s: Option<&String>) -> Option<Timestamp> {
    s.and_then(|s| s.parse().ok())
}

fn lease_fresh(l: &Lease, now: Timestamp) -> (Option<i64>, bool) {
    let spec = l.spec.clone().unwrap_or_default();
    let renewed = ago(spec.renew_time.map(|t| t.0), now);
    let duration = i64::from(spec.lease_duration_seconds.unwrap_or(0));
    (renewed, renewed.is_some_and(|r| r <= duration))
}

/// Pure: the report from what was listed.
/// What the health Lease says of a remote the data-path probe finds unreachable.
const CUT_OFF: &str = "cut off";

pub fn report(inputs: &Inputs, opts: &Options, now: Timestamp) -> Report {
    let mut remotes = from_health_leases(&inputs.health, opts, now);
    let unknown = count_followers(&mut remotes, inputs, opts);
    count_events(&mut remotes, &inputs.events);
    let leader = inputs.election.as_ref().map(|l| leader_of(l, opts, now));
    let remotes: Vec<RemoteStatus> = remotes.into_values().collect();
    let healthy = leader.as_ref().is_some_and(|l| l.fresh)
        && remotes
            .iter()
            .all(|r| r.known && r.connected && r.data_path != CUT_OFF)
        && unknown.is_empty();
    Report {
        namespace: String::new(),
        leader,
        remotes,
        unknown_remote_followers: unknown,
        healthy,
        credentials_expiring: Vec::new(),
        imports: imports::imports(&inputs.imports),
        refused: Vec::new(),
    }
}

/// Pure: the daemon's `RemoteRefused` Events of its namespace, the latest per object refused.
pub fn refusals(events: &[Event], namespace: &str, now: Timestamp) -> Vec<Refusal> {
    let mut latest: BTreeMap<String, (Option<Timestamp>, String)> = BTreeMap::new();
    let refused = events.iter().filter(|e| {
        e.reason.as_deref() == Some("RemoteRefused")
            && e.metadata.namespace.as_deref() == Some(namespace)
    });
    for e in refused {
        let note = e.message.clone().unwrap_or_default();
        let r = &e.involved_object;
        let object = if r.kind.as_deref() == Some("Secret") {
            let (ns, name) = (r.namespace.as_deref(), r.name.as_deref());
            format!("Secret {}/{}", ns.unwrap_or(""), name.unwrap_or(""))
        } else {
            note.split(": ").next().unwrap_or_default().to_string()
        };
        let at = e
            .series
            .as_ref()
            .and_then(|s| s.last_observed_time.as_ref())
            .map(|t| t.0)
            .or(e.event_time.as_ref().map(|t| t.0))
            .or(e.last_timestamp.as_ref().map(|t| t.0));
        if latest.get(&object).is_none_or(|(seen, _)| *seen < at) {
            latest.insert(object, (at, note));
        }
    }
    latest
        .into_iter()
        .map(|(object, (at, message))| Refusal {
            object,
            message,
            seen_seconds_ago: ago(at, now),
        })
        .collect()
}

/// Pure: the report with the remotes whose credential expires within `threshold` named.
pub fn with_expiring(mut r: Report, threshold: Duration) -> Report {
    let limit = i64::try_from(threshold.as_secs()).unwrap_or(i64::MAX);
    r.credentials_expiring = r
        .remotes
        .iter()
        .filter(|s| {
            s.credential_expires_in_seconds
                .is_some_and(|left| left <= limit)
        })
        .map(|s| s.name.clone())
        .collect();
    r
}

/// 0 healthy, 1 something needs a look, 3 healthy but a credential expires soon.
pub fn exit_code(r: &Report) -> i32 {
    match (r.healthy, r.credentials_expiring.is_empty()) {
        (false, _) => 1,
        (true, false) => 3,
        (true, true) => 0,
    }
}

/// Every remote a health Lease names, as that Lease tells it.
fn from_health_leases(
    health: &[Lease],
    opts: &Options,
    now: Timestamp,
) -> BTreeMap<String, RemoteStatus> {
    let keys = Keys::new(opts);
    let mut remotes = BTreeMap::new();
    for l in health {
        let a = l.annotations();
        let Some(name) = a.get(&keys.name) else {
            continue;
        };
        let (renewed, fresh) = lease_fresh(l, now);
        let problem = a.get(&keys.problem).cloned().unwrap_or_default();
        let count = |k: &str| a.get(k).and_then(|v| v.parse().ok()).unwrap_or(0);
        remotes.insert(
            name.clone(),
            RemoteStatus {
                name: name.clone(),
                known: true,
                cluster_id: a.get(&keys.cluster_id).cloned().unwrap_or_default(),
                connected: fresh && problem.is_empty(),
                since: a.get(&keys.state_since).cloned().unwrap_or_default(),
                last_renewed_seconds_ago: renewed,
                last_listing_seconds_ago: ago(parse(a.get(&keys.last_listing)), now),
                problem: if fresh || !problem.is_empty() {
                    problem
                } else {
                    format!(
                        "its health Lease was not renewed for {}s (is a leader running?)",
                        renewed.unwrap_or(0)
                    )
                },
                export_conflicts: count(&keys.conflicts),
                credential_expiry: a.get(&keys.credential_expiry).cloned().unwrap_or_default(),
                credential_expires_in_seconds: parse(a.get(&keys.credential_expiry))
                    .map(|t| t.duration_since(now).as_secs()),
                data_path: a.get(&keys.data_path).cloned().unwrap_or_default(),
                hub_says: a.get(&keys.hub).cloned().unwrap_or_default(),
                ..Default::default()
            },
        );
    }
    remotes
}

/// Counts each remote's follower Services and slices (adding the remotes followers record but
/// no health Lease names); returns the followers recording no remote with a Lease.
fn count_followers(
    remotes: &mut BTreeMap<String, RemoteStatus>,
    inputs: &Inputs,
    opts: &Options,
) -> Vec<String> {
    let mut unknown = Vec::new();
    for m in &inputs.services {
        let Recorded::From(set) = recorded(m, opts) else {
            continue;
        };
        if !set.iter().any(|r| remotes.get(r).is_some_and(|s| s.known)) {
            unknown.push(format!(
                "{}/{} (records {})",
                m.namespace.as_deref().unwrap_or(""),
                m.name.as_deref().unwrap_or(""),
                set.iter().cloned().collect::<Vec<_>>().join(",")
            ));
        }
        for r in set {
            let entry = remotes.entry(r.clone()).or_insert_with(|| RemoteStatus {
                name: r.clone(),
                ..Default::default()
            });
            entry.followers += 1;
        }
    }
    for m in &inputs.slices {
        if let Recorded::From(set) = slice_recorded(m, opts) {
            for r in set {
                if let Some(entry) = remotes.get_mut(&r) {
                    entry.slices += 1;
                }
            }
        }
    }
    unknown
}

/// Counts the conflict and skip Events that name each remote.
fn count_events(remotes: &mut BTreeMap<String, RemoteStatus>, events: &[Event]) {
    for e in events {
        let note = e.message.as_deref().unwrap_or("");
        let reason = e.reason.as_deref().unwrap_or("");
        for (name, s) in remotes.iter_mut() {
            let conflict = (reason == "ServiceConflict"
                && note.contains(&format!("{name}'s export")))
                || (reason == "NotOurFollower" && note.contains(&format!("follower of {name}:")));
            if conflict {
                s.conflict_events += 1;
            } else if e.action.as_deref() == Some("Skip")
                && note.contains(&format!("(from {name})"))
            {
                s.skip_events += 1;
            }
        }
    }
}

/// The election Lease's holder, whether it is fresh, and what it says of the local networks.
fn leader_of(l: &Lease, opts: &Options, now: Timestamp) -> Leader {
    let (renewed, fresh) = lease_fresh(l, now);
    let holder = l.spec.as_ref().and_then(|s| s.holder_identity.clone());
    let note = opts.annotation(crate::runtime::admin::POD_NETWORKS_NOTE);
    Leader {
        fresh: fresh && holder.as_deref().is_some_and(|h| !h.is_empty()),
        identity: holder.unwrap_or_default(),
        renewed_seconds_ago: renewed,
        local_pod_networks: (l.metadata.annotations.as_ref())
            .and_then(|a| a.get(&note))
            .and_then(|n| n.parse().ok()),
    }
}

fn age(secs: Option<i64>) -> String {
    match secs {
        None => "-".into(),
        Some(s) if s < 120 => format!("{s}s"),
        Some(s) if s < 7200 => format!("{}m", s / 60),
        Some(s) if s < 172_800 => format!("{}h", s / 3600),
        Some(s) => format!("{}d", s / 86400),
    }
}

/// The report as a table.
pub fn table(r: &Report, now: Timestamp) -> String {
    let mut out = String::new();
    match &r.leader {
        Some(l) if l.fresh => out.push_str(&format!(
            "LEADER   {} (renewed {} ago)\n",
            l.identity,
            age(l.renewed_seconds_ago)
        )),
        Some(l) => out.push_str(&format!(
            "LEADER   none renewing (last holder {:?}, renewed {} ago)\n",
            l.identity,
            age(l.renewed_seconds_ago)
        )),
        None => out.push_str("LEADER   none (no election Lease: is the daemon running here?)\n"),
    }
    if let Some(l) = &r.leader
        && l.fresh
        && l.local_pod_networks == Some(0)
    {
        out.push_str(crate::runtime::admin::NO_POD_RANGE);
        out.push('\n');
    }
    let header = [
        "REMOTE",
        "CONNECTED",
        "SINCE",
        "LISTED",
        "FOLLOWERS",
        "SLICES",
        "CONFLICTS",
        "SKIPS",
        "CLUSTER ID",
        "CREDENTIAL",
        "DATA PATH",
        "PROBLEM",
    ];
    let mut rows: Vec<Vec<String>> = vec![header.iter().map(|h| h.to_string()).collect()];
    for s in &r.remotes {
        let since = s
            .since
            .parse::<Timestamp>()
            .ok()
            .map(|t| age(ago(Some(t), now)))
            .unwrap_or_else(|| "-".into());
        rows.push(vec![
            s.name.clone(),
            match (s.known, s.connected) {
                (false, _) => "unknown".into(),
                (true, true) => "yes".into(),
                (true, false) => "no".into(),
            },
            since,
            age(s.last_listing_seconds_ago),
            s.followers.to_string(),
            s.slices.to_string(),
            format!("{} now, {} events", s.export_conflicts, s.conflict_events),
            s.skip_events.to_string(),
            if s.cluster_id.is_empty() {
                "-".into()
            } else {
                s.cluster_id.clone()
            },
            match s.credential_expires_in_seconds {
                None => "-".into(),
                Some(left) if left < 0 => format!("expired {} ago", age(Some(-left))),
                Some(left) => format!("expires in {}", age(Some(left))),
            },
            if s.data_path.is_empty() {
                "-".into()
            } else {
                s.data_path.clone()
            },
            problem_cell(s),
        ]);
    }
    let widths: Vec<usize> = (0..header.len())
        .map(|i| rows.iter().map(|r| r[i].len()).max().unwrap_or(0))
        .collect();
    for row in &rows {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    if !r.unknown_remote_followers.is_empty() {
        out.push_str("\nFOLLOWERS OF REMOTES NO DAEMON HERE READS (kept; delete them or add their remote back)\n");
        for f in &r.unknown_remote_followers {
            out.push_str(&format!("  {f}\n"));
        }
    }
    if !r.refused.is_empty() {
        out.push_str("\nREFUSED AS REMOTES (the daemon's latest RemoteRefused Event on each; /readyz says which still hold)\n");
        for f in &r.refused {
            out.push_str(&format!(
                "  {} ({} ago): {}\n",
                f.object,
                age(f.seen_seconds_ago),
                f.message
            ));
        }
    }
    out.push_str(&imports::section(&r.imports));
    out
}

/// The PROBLEM cell: the daemon's own finding, then what the cluster inventory says.
fn problem_cell(s: &RemoteStatus) -> String {
    let own = if s.known {
        s.problem.clone()
    } else {
        "no daemon here reads it".into()
    };
    match (own.is_empty(), s.hub_says.is_empty()) {
        (_, true) => own,
        (true, false) => format!("hub says: {}", s.hub_says),
        (false, false) => format!("{own}; hub says: {}", s.hub_says),
    }
}

/// Why `status` could not read the local cluster (printed as `error: ...`, exit code 2).
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    /// `--label-key` is not a label key.
    #[error("{0}")]
    LabelKey(String),
    #[error("{source}")]
    Infer {
        source: kube::config::InferConfigError,
    },
    #[error("{source}")]
    Kubeconfig { source: crate::error::Error },
    #[error("{source}")]
    Client { source: crate::client::BuildError },
    #[error("listing {kind}: {source}")]
    List {
        kind: String,
        source: crate::error::Error,
    },
    #[error("listing the health Leases in {namespace}: {source}")]
    HealthLeases {
        namespace: String,
        source: kube::Error,
    },
    #[error("reading Lease {namespace}/{name}: {source}")]
    Election {
        namespace: String,
        name: String,
        source: kube::Error,
    },
    #[error("listing Events: {source}")]
    Events { source: kube::Error },
}

async fn client(args: &StatusArgs) -> Result<Client, StatusError> {
    let config = match (&args.kubeconfig, &args.context) {
        (None, None) => Config::infer()
            .await
            .map_err(|source| StatusError::Infer { source })?,
        (path, context) => {
            crate::client::kubeconfig_config(path.as_deref(), context.as_deref(), "local cluster")
                .await
                .map_err(|source| StatusError::Kubeconfig { source })?
        }
    };
    crate::client::plain_client(config).map_err(|source| StatusError::Client { source })
}

async fn list_meta<K>(api: Api<K>, selector: &str) -> Result<Vec<ObjectMeta>, StatusError>
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    // status reads labels and annotations of each: whole metadata, without managedFields
    list_all(&api, selector, Duration::from_secs(30), |m| {
        Some(ObjectMeta {
            managed_fields: None,
            ..m
        })
    })
    .await
    .map_err(|source| StatusError::List {
        kind: K::kind(&()).into_owned(),
        source,
    })
}

/// Reads the local cluster and prints the report; returns the exit code.
pub async fn run(args: StatusArgs) -> i32 {
    match gather(&args).await {
        Ok(r) => {
            let now = Timestamp::now();
            match args.output {
                Format::Table => print!("{}", table(&r, now)),
                Format::Json => match serde_json::to_string_pretty(&r) {
                    Ok(j) => println!("{j}"),
                    Err(e) => {
                        eprintln!("error: {e}");
                        return 2;
                    }
                },
            }
            exit_code(&r)
        }
        Err(e) => {
            eprintln!("error: {e}");
            2
        }
    }
}

async fn gather(args: &StatusArgs) -> Result<Report, StatusError> {
    crate::cli::args::validate_label_key(&args.label_key).map_err(StatusError::LabelKey)?;
    let opts = Options {
        label_key: args.label_key.clone(),
        cluster_name: String::new(),
        endpoints_mode: crate::desired::EndpointsMode::Slices,
        cluster_id: None,
        containment: Default::default(),
        allow_external_name: false,
    };
    let keys = Keys::new(&opts);
    let c = client(args).await?;
    let leases: Api<Lease> = Api::namespaced(c.clone(), &args.namespace);
    let selector = format!("{}={}", keys.label, label_value(&args.lease_name));
    let health = leases
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(|source| StatusError::HealthLeases {
            namespace: args.namespace.clone(),
            source,
        })?
        .items;
    let election =
        leases
            .get_opt(&args.lease_name)
            .await
            .map_err(|source| StatusError::Election {
                namespace: args.namespace.clone(),
                name: args.lease_name.clone(),
                source,
            })?;
    let followers = opts.follower_selector();
    let (mut services, mut slices) = (Vec::new(), Vec::new());
    for ns in scopes(&args.watch_namespaces) {
        let (svc, sl): (Api<Service>, Api<EndpointSlice>) = (api_in(&c, ns), api_in(&c, ns));
        services.extend(list_meta(svc, &followers).await?);
        slices.extend(list_meta(sl, &followers).await?);
    }
    let imports = imports::list(&c, &args.watch_namespaces).await?;
    let events: Api<Event> = Api::all(c);
    let events = events
        .list(&ListParams::default().fields("reportingComponent=cross-cluster-controller"))
        .await
        .map_err(|source| StatusError::Events { source })?
        .items;
    let refused = refusals(&events, &args.namespace, Timestamp::now());
    let inputs = Inputs {
        health,
        election,
        services,
        slices,
        events,
        imports,
    };
    let mut r = report(&inputs, &opts, Timestamp::now());
    r.namespace = args.namespace.clone();
    r.refused = refused;
    let r = with_expiring(r, args.credential_expiry_threshold);
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::remotes::health::{Observation, desired as health_lease};
    use serde_json::json;

    fn opts() -> Options {
        crate::fixtures::opts()
    }

    fn now() -> Timestamp {
        "2026-01-01T00:10:00Z".parse().unwrap()
    }

    fn health(remote: &str, problem: Option<&str>, at: &str) -> Lease {
        let o = Observation {
            remote: remote.into(),
            cluster_id: Some(format!("id-{remote}")),
            problem: problem.map(str::to_string),
            last_listing: Some("2026-01-01T00:00:00Z".parse().unwrap()),
            exports: 2,
            conflicts: 1,
            credential_expiry: None,
            data_path: Some("reachable"),
            hub: None,
        };
        let mut l = health_lease(
            None,
            &o,
            &Keys::new(&opts()),
            &format!("ccc-remote-{remote}"),
            "ns",
            "ccc",
            "pod-1",
            Duration::from_secs(30),
            at.parse().unwrap(),
        )
        .unwrap();
        if problem.is_some() {
            // as written after being healthy once, 5 minutes before
            l.spec.as_mut().unwrap().renew_time =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
                    "2026-01-01T00:05:00Z".parse().unwrap(),
                ));
        }
        l
    }

    fn follower(name: &str, remotes: &str) -> ObjectMeta {
        serde_json::from_value(json!({"namespace": "shop", "name": name,
            "labels": {"fair.com/cross-cluster": "follower"},
            "annotations": {"fair.com/cross-cluster-origin-clusters": remotes}}))
        .unwrap()
    }

    fn slice(name: &str, remote: &str) -> ObjectMeta {
        serde_json::from_value(json!({"namespace": "shop", "name": name,
            "labels": {"fair.com/cross-cluster": "follower",
                       "endpointslice.kubernetes.io/managed-by": crate::desired::MANAGED_BY},
            "annotations": {"fair.com/cross-cluster-origin-cluster": remote}}))
        .unwrap()
    }

    fn election(at: &str) -> Lease {
        serde_json::from_value(json!({"metadata": {"name": "ccc"},
            "spec": {"holderIdentity": "pod-1", "leaseDurationSeconds": 15, "renewTime": at}}))
        .unwrap()
    }

    fn event(reason: &str, action: &str, note: &str) -> Event {
        serde_json::from_value(json!({"metadata": {"name": "e"}, "involvedObject": {},
            "reason": reason, "action": action, "message": note}))
        .unwrap()
    }

    fn refused_event(ns: &str, secret: Option<&str>, note: &str, at: &str) -> Event {
        let involved = match secret {
            Some(n) => json!({"kind": "Secret", "namespace": ns, "name": n}),
            None => json!({"kind": "Lease", "namespace": ns, "name": "cross-cluster-controller"}),
        };
        serde_json::from_value(json!({"metadata": {"name": "e", "namespace": ns},
            "involvedObject": involved, "reason": "RemoteRefused", "action": "Join",
            "message": note, "eventTime": at}))
        .unwrap()
    }

    #[test]
    fn refusals_are_the_latest_remote_refused_event_per_object_of_the_daemons_namespace() {
        let events = [
            refused_event(
                "fair",
                Some("a-impostor"),
                "older",
                "2026-01-01T00:00:00.000000Z",
            ),
            refused_event(
                "fair",
                Some("a-impostor"),
                "remote \"a-impostor\": answers as cluster X, but its Secret pins cluster Y",
                "2026-01-01T00:09:00.000000Z",
            ),
            refused_event(
                "fair",
                None,
                "ClusterProfile hub/east: held",
                "2026-01-01T00:08:00.000000Z",
            ),
            // another daemon's namespace, and another reason: not ours to show
            refused_event(
                "other",
                Some("x"),
                "elsewhere",
                "2026-01-01T00:09:00.000000Z",
            ),
            event("ServiceConflict", "Conflict", "east's export"),
        ];
        let r = refusals(&events, "fair", now());
        assert_eq!(
            r,
            vec![
                Refusal {
                    object: "ClusterProfile hub/east".into(),
                    message: "ClusterProfile hub/east: held".into(),
                    seen_seconds_ago: Some(120),
                },
                Refusal {
                    object: "Secret fair/a-impostor".into(),
                    message:
                        "remote \"a-impostor\": answers as cluster X, but its Secret pins cluster Y"
                            .into(),
                    seen_seconds_ago: Some(60),
                },
            ]
        );
        let mut report = Report {
            refused: r,
            ..Default::default()
        };
        report.healthy = true;
        let text = table(&report, now());
        assert!(
            text.contains("REFUSED AS REMOTES")
                && text.contains("  Secret fair/a-impostor (60s ago): remote"),
            "{text}"
        );
        assert_eq!(exit_code(&report), 0, "shown, not judged");
    }

    #[test]
    fn what_the_hub_says_follows_the_daemons_own_finding_in_the_problem_cell() {
        let mut s = RemoteStatus {
            known: true,
            ..Default::default()
        };
        assert_eq!(problem_cell(&s), "");
        s.hub_says = "ControlPlaneHealthy False (AgentLost): gone".into();
        assert_eq!(
            problem_cell(&s),
            "hub says: ControlPlaneHealthy False (AgentLost): gone"
        );
        s.problem = "watch failing".into();
        assert_eq!(
            problem_cell(&s),
            "watch failing; hub says: ControlPlaneHealthy False (AgentLost): gone"
        );
    }

    #[test]
    fn a_remote_whose_data_path_is_cut_off_needs_a_look() {
        let inputs = |data_path: &str| {
            let mut east = health("east", None, "2026-01-01T00:09:50Z");
            east.metadata
                .annotations
                .get_or_insert_default()
                .insert("fair.com/cross-cluster-data-path".into(), data_path.into());
            Inputs {
                health: vec![east],
                election: Some(election("2026-01-01T00:09:55Z")),
                services: vec![],
                slices: vec![],
                events: vec![],
                imports: vec![],
            }
        };
        let fine = report(&inputs("reachable"), &opts(), now());
        assert!(fine.healthy, "{fine:?}");
        assert!(table(&fine, now()).contains("reachable"));
        let cut = report(&inputs("cut off"), &opts(), now());
        assert!(!cut.healthy);
        assert_eq!(exit_code(&cut), 1);
        let t = table(&cut, now());
        assert!(t.contains("DATA PATH") && t.contains("cut off"), "{t}");
    }

    #[test]
    fn a_leader_that_knows_no_local_pod_network_is_said_and_stays_healthy() {
        let with = |note: Option<&str>, renewed: &str| {
            let mut e = election(renewed);
            if let Some(n) = note {
                e.metadata
                    .annotations
                    .get_or_insert_default()
                    .insert("fair.com/cross-cluster-local-pod-networks".into(), n.into());
            }
            Inputs {
                health: vec![],
                election: Some(e),
                services: vec![],
                slices: vec![],
                events: vec![],
                imports: vec![],
            }
        };
        let none = report(&with(Some("0"), "2026-01-01T00:09:58Z"), &opts(), now());
        assert_eq!(none.leader.as_ref().unwrap().local_pod_networks, Some(0));
        assert!(none.healthy, "a warning, not a failure: {none:?}");
        let t = table(&none, now());
        assert!(
            t.lines().any(|l| l == crate::runtime::admin::NO_POD_RANGE),
            "{t}"
        );
        for (note, renewed) in [
            (Some("2"), "2026-01-01T00:09:58Z"),
            (None, "2026-01-01T00:09:58Z"),
            (Some("not a number"), "2026-01-01T00:09:58Z"),
            // a stale holder's word is not the leader's view
            (Some("0"), "2026-01-01T00:00:00Z"),
        ] {
            let t = table(&report(&with(note, renewed), &opts(), now()), now());
            assert!(!t.contains("local pod networks"), "{note:?} {renewed}: {t}");
        }
    }

    #[test]
    fn every_remote_connected_and_a_leader_is_healthy() {
        let inputs = Inputs {
            health: vec![health("east", None, "2026-01-01T00:09:55Z")],
            election: Some(election("2026-01-01T00:09:58.000000Z")),
            services: vec![follower("web", "east")],
            slices: vec![slice("web-1", "east")],
            events: vec![
                event(
                    "ServiceConflict",
                    "Merge",
                    "east's export conflicts with north's on port",
                ),
                event(
                    "NamespaceMissing",
                    "Skip",
                    "a/b (from east): local namespace missing",
                ),
            ],
            imports: vec![],
        };
        let r = report(&inputs, &opts(), now());
        assert!(r.healthy, "{r:?}");
        let east = &r.remotes[0];
        assert_eq!(
            (
                east.connected,
                east.followers,
                east.slices,
                east.export_conflicts
            ),
            (true, 1, 1, 1)
        );
        assert_eq!((east.conflict_events, east.skip_events), (1, 1));
        assert_eq!(east.last_listing_seconds_ago, Some(600));
        let t = table(&r, now());
        assert!(t.contains("LEADER   pod-1"), "{t}");
        assert!(
            t.lines()
                .any(|l| l.starts_with("east") && l.contains("yes")),
            "{t}"
        );
    }

    #[test]
    fn a_remote_down_a_stale_lease_no_leader_or_an_unknown_remote_is_not_healthy() {
        let down = Inputs {
            health: vec![health(
                "east",
                Some("watch failing"),
                "2026-01-01T00:09:55Z",
            )],
            election: Some(election("2026-01-01T00:09:58.000000Z")),
            services: vec![],
            slices: vec![],
            events: vec![],
            imports: vec![],
        };
        let r = report(&down, &opts(), now());
        assert!(!r.healthy);
        assert_eq!(r.remotes[0].problem, "watch failing");
        assert_eq!(r.remotes[0].last_renewed_seconds_ago, Some(300));

        let stale = Inputs {
            health: vec![health("east", None, "2026-01-01T00:01:00Z")],
            election: Some(election("2026-01-01T00:09:58.000000Z")),
            services: vec![],
            slices: vec![],
            events: vec![],
            imports: vec![],
        };
        let r = report(&stale, &opts(), now());
        assert!(
            !r.healthy && r.remotes[0].problem.contains("not renewed"),
            "{r:?}"
        );

        let no_leader = Inputs {
            health: vec![health("east", None, "2026-01-01T00:09:55Z")],
            election: Some(election("2026-01-01T00:01:00.000000Z")),
            services: vec![],
            slices: vec![],
            events: vec![],
            imports: vec![],
        };
        let r = report(&no_leader, &opts(), now());
        assert!(!r.healthy && !r.leader.as_ref().unwrap().fresh);

        let unknown = Inputs {
            health: vec![health("east", None, "2026-01-01T00:09:55Z")],
            election: Some(election("2026-01-01T00:09:58.000000Z")),
            services: vec![follower("web", "east,north"), follower("old", "gone")],
            slices: vec![],
            events: vec![],
            imports: vec![],
        };
        let r = report(&unknown, &opts(), now());
        assert!(!r.healthy);
        assert_eq!(r.unknown_remote_followers, ["shop/old (records gone)"]);
        let names: Vec<_> = r
            .remotes
            .iter()
            .map(|s| (s.name.as_str(), s.known))
            .collect();
        assert_eq!(names, [("east", true), ("gone", false), ("north", false)]);
        assert!(table(&r, now()).contains("FOLLOWERS OF REMOTES NO DAEMON HERE READS"));
    }

    #[test]
    fn a_credential_expiring_within_the_threshold_exits_3_and_shows_in_the_table() {
        let mut lease = health("east", None, "2026-01-01T00:09:55Z");
        lease.annotations_mut().insert(
            "fair.com/cross-cluster-credential-expiry".into(),
            "2026-01-03T00:10:00Z".into(),
        );
        let inputs = Inputs {
            health: vec![lease, health("north", None, "2026-01-01T00:09:55Z")],
            election: Some(election("2026-01-01T00:09:58.000000Z")),
            services: vec![],
            slices: vec![],
            events: vec![],
            imports: vec![],
        };
        let r = report(&inputs, &opts(), now());
        assert_eq!(r.remotes[0].credential_expires_in_seconds, Some(2 * 86400));
        assert_eq!(r.remotes[1].credential_expires_in_seconds, None, "unknown");
        let t = table(&r, now());
        assert!(
            t.contains("CREDENTIAL") && t.contains("expires in 2d"),
            "{t}"
        );
        let week = with_expiring(
            report(&inputs, &opts(), now()),
            Duration::from_secs(7 * 86400),
        );
        assert!(week.healthy);
        assert_eq!(week.credentials_expiring, ["east"]);
        assert_eq!(exit_code(&week), 3);
        let day = with_expiring(r, Duration::from_secs(86400));
        assert_eq!(exit_code(&day), 0, "two days left, a day's threshold");
        // something that needs a look anyway: 1 wins
        let mut down = with_expiring(
            report(&inputs, &opts(), now()),
            Duration::from_secs(7 * 86400),
        );
        down.healthy = false;
        assert_eq!(exit_code(&down), 1);
        // expired
        let mut gone = report(&inputs, &opts(), now());
        gone.remotes[0].credential_expires_in_seconds = Some(-3600);
        assert!(table(&gone, now()).contains("expired 60m ago"));
    }
}
