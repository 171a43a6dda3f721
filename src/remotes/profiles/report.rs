//! What the daemon sees of each profile's cluster, written back on the profile (opt-in:
//! `--cluster-profiles-report-as NAME`; it needs `patch` on `clusterprofiles/status` in the
//! hub). Each reading daemon owns one condition of its own, by server-side apply with a field
//! manager of its own, so neither the cluster manager's conditions nor another daemon's are
//! touched:
//!
//! `cross-cluster-controller.fair.com/ConnectedFrom.<NAME>`: True (`Connected`) while the
//! remote's watches are healthy; False with the reason `Unreachable`, `CutOff` (the data-path
//! probe) or `Refused` (the profile gives this daemon no usable access) and the daemon's own
//! one-line message.
//!
//! Only the leader writes; a dry run writes nothing; a condition is written only when it changes.
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use parking_lot::RwLock;
use serde_json::{Value, json};
use tracing::warn;

use super::ClusterProfile;
use crate::reconcile::worker::Controller;

/// The condition type's prefix; the reporting daemon's name follows.
pub const CONDITION_PREFIX: &str = "cross-cluster-controller.fair.com/ConnectedFrom.";

/// What a condition says (its time aside).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Said {
    pub status: &'static str,
    pub reason: &'static str,
    pub message: String,
}

/// How a profile's remote looks to this daemon.
pub enum Seen<'a> {
    /// a member: its problem, if any, and whether the probe cut it off
    Member {
        problem: Option<&'a str>,
        cut_off: bool,
    },
    /// not a member: why the profile was refused
    Refused(&'a str),
}

/// Pure: the condition for what is seen.
pub fn said(seen: &Seen<'_>) -> Said {
    let short = |m: &str| -> String { m.replace('\n', " ").chars().take(1000).collect() };
    match seen {
        Seen::Member { problem: Some(p), .. } => Said {
            status: "False",
            reason: "Unreachable",
            message: short(p),
        },
        Seen::Member { cut_off: true, .. } => Said {
            status: "False",
            reason: "CutOff",
            message: "its API server answers, but no probe reaches its endpoints: they are published as not ready".into(),
        },
        Seen::Member { .. } => Said {
            status: "True",
            reason: "Connected",
            message: "its Services are read and mirrored".into(),
        },
        Seen::Refused(why) => Said {
            status: "False",
            reason: "Refused",
            message: short(why),
        },
    }
}

/// The condition of this daemon as a profile carries it (from the watch), by profile.
pub type Observed = Arc<RwLock<BTreeMap<String, Value>>>;

/// Pure: this daemon's condition on a profile, if it carries one.
pub fn ours(p: &ClusterProfile, kind: &str) -> Option<Value> {
    p.status
        .as_ref()?
        .get("conditions")?
        .as_array()?
        .iter()
        .find(|c| c.get("type").and_then(Value::as_str) == Some(kind))
        .cloned()
}

/// Writes the conditions, on the leader.
pub struct Reporter {
    pub ctl: Arc<Controller>,
    pub hub: Client,
    pub namespace: String,
    /// the condition type (prefix and the daemon's name)
    pub kind: String,
    pub interval: Duration,
    pub observed: Observed,
}

impl Reporter {
    pub async fn run(self) {
        // on a tick only: a remote's health change wakes one waiter (the health Leases' keeper)
        let mut tick = tokio::time::interval(self.interval);
        loop {
            tick.tick().await;
            if !self.ctl.is_leader() || self.ctl.writer().dry_run() {
                continue;
            }
            for (profile, seen) in self.seen() {
                self.write(&profile, said(&seen.as_seen())).await;
            }
        }
    }

    /// Every profile this daemon read or refused, and how it looks.
    fn seen(&self) -> Vec<(String, Owned)> {
        let remotes = self.ctl.remotes();
        let mut all: Vec<(String, Owned)> = remotes
            .members()
            .iter()
            .filter_map(|m| match m.origin.object() {
                Some(("ClusterProfile", name, _)) => Some((
                    name.to_string(),
                    Owned::Member(m.state.problem(), m.state.is_cut_off()),
                )),
                _ => None,
            })
            .collect();
        let prefix = format!("ClusterProfile {}/", self.namespace);
        for (source, why) in remotes.problems() {
            if let Some(name) = source.strip_prefix(&prefix)
                && !all.iter().any(|(n, _)| n == name)
            {
                all.push((name.to_string(), Owned::Refused(why)));
            }
        }
        all
    }

    async fn write(&self, profile: &str, said: Said) {
        let live = self.observed.read().get(profile).cloned();
        let field = |k: &str| {
            live.as_ref()
                .and_then(|c| c.get(k))
                .and_then(Value::as_str)
                .map(String::from)
        };
        let same = field("status").as_deref() == Some(said.status)
            && field("reason").as_deref() == Some(said.reason)
            && field("message").as_deref() == Some(said.message.as_str());
        if same {
            return;
        }
        let now = || Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
        // the time of the last change of status: kept while the status stays
        let since = match field("status") {
            Some(s) if s == said.status => field("lastTransitionTime").unwrap_or_else(now),
            _ => now(),
        };
        let body = json!({
            "apiVersion": "multicluster.x-k8s.io/v1alpha1",
            "kind": "ClusterProfile",
            "metadata": {"name": profile, "namespace": self.namespace},
            "status": {"conditions": [{
                "type": self.kind, "status": said.status, "reason": said.reason,
                "message": said.message, "lastTransitionTime": since}]}
        });
        let api: Api<ClusterProfile> = Api::namespaced(self.hub.clone(), &self.namespace);
        let manager = format!(
            "cross-cluster-controller/{}",
            self.kind.trim_start_matches(CONDITION_PREFIX)
        );
        let pp = PatchParams::apply(&manager).force();
        match api.patch_status(profile, &pp, &Patch::Apply(&body)).await {
            Ok(p) => {
                // what it carries now, before the watch says so
                if let Some(c) = ours(&p, &self.kind) {
                    self.observed.write().insert(p.name_any(), c);
                }
            }
            // deleted meanwhile (its remote leaves after the grace): nothing to say
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => warn!(profile, namespace = %self.namespace, error = %crate::error::chain(&e),
                "could not write this daemon's condition on the profile"),
        }
    }
}

/// [`Seen`], owned.
enum Owned {
    Member(Option<String>, bool),
    Refused(String),
}

impl Owned {
    fn as_seen(&self) -> Seen<'_> {
        match self {
            Owned::Member(p, c) => Seen::Member {
                problem: p.as_deref(),
                cut_off: *c,
            },
            Owned::Refused(why) => Seen::Refused(why),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_condition_says_what_the_daemon_sees() {
        let ok = said(&Seen::Member {
            problem: None,
            cut_off: false,
        });
        assert_eq!((ok.status, ok.reason), ("True", "Connected"));
        let down = said(&Seen::Member {
            problem: Some("watch failing:\nrefused"),
            cut_off: false,
        });
        assert_eq!((down.status, down.reason), ("False", "Unreachable"));
        assert_eq!(down.message, "watch failing: refused");
        let cut = said(&Seen::Member {
            problem: None,
            cut_off: true,
        });
        assert_eq!(cut.reason, "CutOff");
        let refused = said(&Seen::Refused("not a remote: no provider"));
        assert_eq!((refused.status, refused.reason), ("False", "Refused"));
    }

    #[test]
    fn the_condition_type_is_valid_for_a_cluster_name() {
        // metav1.Condition's pattern: a DNS prefix, '/', then [A-Za-z0-9][-A-Za-z0-9_.]*[A-Za-z0-9]
        let kind = format!("{CONDITION_PREFIX}west-1");
        let (prefix, name) = kind.split_once('/').unwrap();
        assert!(prefix.split('.').all(|l| {
            !l.is_empty()
                && l.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        }));
        assert!(
            name.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        );
        assert!(kind.len() <= 316);
    }
}
