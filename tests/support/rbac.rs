//! RBAC as the API server grants it: `kubectl auth can-i --list` of an identity in a namespace,
//! as resource -> verbs, and what the daemon sends in its own cluster, to compare with it
//! (tests/chart.rs, tests/profiles_chart.rs).
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use super::tools::{run, tool};

/// Resource -> verbs.
pub type Rights = BTreeMap<String, BTreeSet<String>>;

/// What `kubectl auth can-i --list` grants `who` in `ns` of `context`: resource -> verbs, without
/// the non-resource URLs and the self-subject reviews every identity has. A rule limited to named
/// objects is keyed `resource[name ...]` (can-i prints its Resource Names column as
/// `[kube-system]`), apart from the same resource without names.
pub fn granted(kubeconfig: &Path, context: &str, ns: &str, who: &str) -> Rights {
    const EVERYONE: [&str; 3] = [
        "selfsubjectreviews.authentication.k8s.io",
        "selfsubjectaccessreviews.authorization.k8s.io",
        "selfsubjectrulesreviews.authorization.k8s.io",
    ];
    let table = run(Command::new(tool("kubectl"))
        .env("KUBECONFIG", kubeconfig)
        .args([
            "--context",
            context,
            "auth",
            "can-i",
            "--list",
            "-n",
            ns,
            "--as",
            who,
        ]));
    let mut lines = table.lines();
    let header = lines.next().unwrap_or_default();
    assert!(
        header.starts_with("Resources") && header.trim_end().ends_with("Verbs"),
        "{table}"
    );
    let mut rules: Rights = BTreeMap::new();
    for line in lines {
        // rows of non-resource URLs have an empty first column
        if line.trim().is_empty() || line.starts_with(char::is_whitespace) {
            continue;
        }
        let resource = line.split_whitespace().next().unwrap_or_default();
        // [non-resource URLs] [resource names] [verbs]
        let columns: Vec<&str> = line
            .split('[')
            .skip(1)
            .map(|c| c.split(']').next().unwrap_or_default())
            .collect();
        assert_eq!(columns.len(), 3, "unexpected row: {line}");
        assert!(
            columns[0].is_empty(),
            "non-resource URLs on a resource row: {line}"
        );
        if EVERYONE.contains(&resource) {
            continue;
        }
        let key = if columns[1].is_empty() {
            resource.to_string()
        } else {
            format!("{resource}[{}]", columns[1])
        };
        rules
            .entry(key)
            .or_default()
            .extend(columns[2].split_whitespace().map(str::to_string));
    }
    rules
}

pub fn rules(v: &[(&str, &[&str])]) -> Rights {
    v.iter()
        .map(|(r, verbs)| (r.to_string(), verbs.iter().map(|v| v.to_string()).collect()))
        .collect()
}

pub fn show(r: &Rights) -> String {
    r.iter()
        .map(|(res, verbs)| {
            format!(
                "{res} {}",
                verbs.iter().cloned().collect::<Vec<_>>().join("/")
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// `a` and `b` in one map (a resource in both gets the union of the verbs).
pub fn union(a: &Rights, b: &Rights) -> Rights {
    let mut out = a.clone();
    for (resource, verbs) in b {
        out.entry(resource.clone())
            .or_default()
            .extend(verbs.iter().cloned());
    }
    out
}

pub const RW: &[&str] = &["create", "delete", "get", "list", "update", "watch"];
pub const RO: &[&str] = &["get", "list", "watch"];

/// What the daemon sends (src/) in its own cluster: watches and lists, get after a 409, create
/// (POST), update (PUT with a resourceVersion), delete (uid precondition); events.k8s.io Events
/// (create, and patch for a series); its Lease: get, create, update; remotes from Secrets: the
/// labelled Secrets of its own namespace, listed and watched.
pub fn writer_needs() -> Rights {
    rules(&[
        ("endpoints", RW),
        ("endpointslices.discovery.k8s.io", RW),
        ("events.events.k8s.io", &["create", "patch"]),
        (
            "leases.coordination.k8s.io",
            &["create", "delete", "get", "list", "update"],
        ),
        ("namespaces", RO),
        // the local networks no remote address may be in: nodes' addresses and pod CIDRs, the
        // ServiceCIDRs, Calico's and Cilium's pod pools (the API server's endpoints are
        // endpointslices of default/kubernetes; Services' external IPs are services)
        ("nodes", &["list", "watch"]),
        ("servicecidrs.networking.k8s.io", &["list", "watch"]),
        ("ippools.crd.projectcalico.org", &["list", "watch"]),
        ("ciliumnodes.cilium.io", &["list", "watch"]),
        // update: a renewed remote token is written back into its Secret (tokenRenewal)
        ("secrets", &["get", "list", "update", "watch"]),
        ("services", RW),
    ])
}

/// What the daemon sends in its own cluster with no remote from Secrets
/// (`remoteSecretSelector` empty): [`writer_needs`] without any Secret.
pub fn writer_needs_without_secrets() -> Rights {
    let mut needs = writer_needs();
    needs.remove("secrets");
    needs
}

/// What the daemon sends with `--cluster-profiles` on top, the hub being its own cluster: a list
/// and a watch of the ClusterProfiles of the hub's namespace, nothing else.
pub fn profiles_hub_needs() -> Rights {
    rules(&[("clusterprofiles.multicluster.x-k8s.io", &["list", "watch"])])
}

/// What the write-back adds (`--cluster-profiles-report-as`): a server-side apply of the
/// daemon's own condition on the profiles' status.
pub fn profiles_report_needs() -> Rights {
    rules(&[("clusterprofiles.multicluster.x-k8s.io/status", &["patch"])])
}

/// What the reference `secretreader` plugin sends when the daemon runs it in its pod: a get of
/// the Secret named by the profile, in the pod's namespace.
pub fn secretreader_needs() -> Rights {
    rules(&[("secrets", &["get"])])
}
