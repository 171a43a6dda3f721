//! The flags of what a remote may never decide here (issue 27): label lists, protected
//! namespaces, ExternalName for the static remote; and the top-level domains a follower's
//! namespace or name may be all the same (issue 37).
use clap::Args;

use crate::desired::check_label_entry;
use crate::desired::containment::{Containment, DEFAULT_PROTECTED_NAMESPACES};
use crate::desired::limits::WriteLimits;

/// What a remote may never decide about local objects.
#[derive(Args, Debug, Clone)]
pub struct ContainmentArgs {
    /// Remote label keys never copied onto local objects (comma-separated): a key (`team`), or a
    /// prefix ending in `/` (`example.com/`, its subdomains too). Reserved prefixes
    /// (`kubernetes.io`, `k8s.io`, `x-k8s.io` and their subdomains, the label key's own domain)
    /// are never copied whatever this says.
    #[arg(long, env = "LABEL_DENY", value_delimiter = ',')]
    pub label_deny: Vec<String>,

    /// When set, only these remote label keys or prefixes (as --label-deny) are copied; the
    /// reserved and denied ones never are. Default: every label that is not refused.
    #[arg(long, env = "LABEL_ALLOW", value_delimiter = ',')]
    pub label_allow: Vec<String>,

    /// Namespaces the daemon never writes in (comma-separated); an export into one is refused
    /// (logged, counted, an Event on the daemon's Lease). Default: kube-system, kube-public,
    /// kube-node-lease and the daemon's own --namespace, less any that --watch-namespace names
    /// (the operator's explicit word). When set, exactly this list, watched or not;
    /// `--protected-namespaces=` protects none.
    #[arg(long, env = "PROTECTED_NAMESPACES", value_delimiter = ',')]
    pub protected_namespaces: Option<Vec<String>>,

    /// Mirror the static remote's ExternalName Services (refused by default: a local name would
    /// be a CNAME to any host the remote picks). Secret remotes: the annotation
    /// `fair.com/cross-cluster-allow-external-name: "true"`.
    #[arg(long, env = "REMOTE_ALLOW_EXTERNAL_NAME")]
    pub remote_allow_external_name: bool,

    /// Top-level domains a follower's namespace or name may be (comma-separated: `dev,app`).
    /// Without it, an export whose namespace or name is a top-level domain (`com`, `dev`, `io`,
    /// every TLD of the ICANN list, and `internal`, `local`) is refused: its follower would
    /// make local pods' look-ups of public names (`github.com`) answer with the remote's
    /// endpoints. Naming one trusts every remote with the names under it in this cluster.
    #[arg(long, env = "ALLOW_TLD_NAMES", value_delimiter = ',')]
    pub allow_tld_names: Vec<String>,

    /// The most bytes of label keys and values one remote leader may have copied onto its
    /// follower Service (suffixes Ki, Mi, Gi; 0: no limit). Over it, the follower's labels are
    /// kept as they were (a new follower gets none of them), with an Event `LabelsOverLimit`,
    /// `xcc_labels_refused_total{reason="over_limit"}` and a /readyz line.
    #[arg(long, env = "REMOTE_MAX_LABEL_BYTES", default_value = "16Ki", value_parser = crate::state::budget::parse_bytes)]
    pub remote_max_label_bytes: u64,

    /// The most follower EndpointSlices one remote's endpoints of one Service may make (each
    /// port set is a slice of its own, each 1,000 endpoints another; 0: no limit). Over it,
    /// what the follower has of that remote is kept as it was (Event `TooManySlices`).
    #[arg(long, env = "REMOTE_MAX_SLICES_PER_SERVICE", default_value = "100", value_parser = crate::state::budget::parse_count)]
    pub remote_max_slices_per_service: u64,

    /// The most ports one remote's Service may have, and the most distinct ports its
    /// EndpointSlices may name (0: no limit). Over it, what the follower has of that remote is
    /// kept as it was (Event `TooManyPorts`).
    #[arg(long, env = "REMOTE_MAX_PORTS_PER_SERVICE", default_value = "100", value_parser = crate::state::budget::parse_count)]
    pub remote_max_ports_per_service: u64,

    /// The most updates a second of the follower Services whose fields come from one remote,
    /// in bursts of ten seconds' worth (0: no limit). Past it a pass leaves the Service as it
    /// is and comes back when an update is due, writing what changed meanwhile once; the
    /// slices and Endpoints are never held back.
    #[arg(long, env = "REMOTE_MAX_SERVICE_UPDATES_PER_SECOND", default_value = "10", value_parser = crate::state::budget::parse_count)]
    pub remote_max_service_updates_per_second: u64,
}

impl ContainmentArgs {
    /// The settings; or what is wrong with a list. `own` is the daemon's namespace, `watched`
    /// the namespaces --watch-namespace names.
    pub fn containment(&self, own: &str, watched: &[String]) -> Result<Containment, String> {
        let list = |flag: &str, entries: &[String]| -> Result<Vec<String>, String> {
            let entries: Vec<String> = entries
                .iter()
                .map(|e| e.trim().to_string())
                .filter(|e| !e.is_empty())
                .collect();
            for e in &entries {
                check_label_entry(e).map_err(|why| format!("{flag}: {why}"))?;
            }
            Ok(entries)
        };
        let protected: Vec<String> = match &self.protected_namespaces {
            Some(given) => given
                .iter()
                .map(|n| n.trim().to_string())
                .filter(|n| !n.is_empty())
                .collect(),
            None => DEFAULT_PROTECTED_NAMESPACES
                .iter()
                .copied()
                .chain([own])
                .filter(|n| !watched.iter().any(|w| w == n))
                .map(String::from)
                .collect(),
        };
        Ok(Containment {
            label_deny: list("--label-deny", &self.label_deny)?,
            label_allow: list("--label-allow", &self.label_allow)?,
            protected_namespaces: protected,
            allowed_tld_names: tld_names(&self.allow_tld_names)?,
            limits: WriteLimits {
                label_bytes: self.remote_max_label_bytes,
                slices: self.remote_max_slices_per_service,
                ports: self.remote_max_ports_per_service,
                service_updates: self.remote_max_service_updates_per_second,
            },
        })
    }
}

/// The `--allow-tld-names` entries, trimmed and lowercase; each must be a DNS label (what a
/// namespace or a Service name can be).
fn tld_names(given: &[String]) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for entry in given {
        let label = entry.trim().to_ascii_lowercase();
        if label.is_empty() {
            continue;
        }
        let ok = label.len() <= 63
            && !label.starts_with('-')
            && !label.ends_with('-')
            && label
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        if !ok {
            return Err(format!(
                "--allow-tld-names: {entry:?} is not a DNS label (a namespace or Service name)"
            ));
        }
        out.push(label);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        c: ContainmentArgs,
    }

    #[test]
    fn defaults_protect_the_system_namespaces_and_our_own_unless_watched_by_name() {
        let c = Cli::parse_from(["x"])
            .c
            .containment("fair-system", &[])
            .unwrap();
        for ns in [
            "kube-system",
            "kube-public",
            "kube-node-lease",
            "fair-system",
        ] {
            assert!(c.protected(ns), "{ns}");
        }
        assert!(!c.protected("default"));
        let watched = ["fair-system".to_string(), "kube-system".to_string()];
        let c = Cli::parse_from(["x"])
            .c
            .containment("fair-system", &watched)
            .unwrap();
        assert!(!c.protected("fair-system") && !c.protected("kube-system"));
        assert!(c.protected("kube-public"));
        let given = Cli::parse_from(["x", "--protected-namespaces=kube-system,shop"]).c;
        let c = given.containment("fair-system", &watched).unwrap();
        assert_eq!(c.protected_namespaces, ["kube-system", "shop"]);
        let none = Cli::parse_from(["x", "--protected-namespaces="]).c;
        let c = none.containment("fair-system", &[]).unwrap();
        assert!(c.protected_namespaces.is_empty());
    }

    #[test]
    fn write_limits_default_to_the_documented_values_and_take_zero_for_none() {
        let c = Cli::parse_from(["x"]).c.containment("ns", &[]).unwrap();
        assert_eq!(
            (
                c.limits.label_bytes,
                c.limits.slices,
                c.limits.ports,
                c.limits.service_updates
            ),
            (16 << 10, 100, 100, 10)
        );
        let args = [
            "x",
            "--remote-max-label-bytes=1Mi",
            "--remote-max-slices-per-service=0",
            "--remote-max-ports-per-service=7",
            "--remote-max-service-updates-per-second=0",
        ];
        let c = Cli::parse_from(args).c.containment("ns", &[]).unwrap();
        assert_eq!(
            c.limits,
            WriteLimits {
                label_bytes: 1 << 20,
                slices: 0,
                ports: 7,
                service_updates: 0,
            }
        );
    }

    #[test]
    fn lists_are_checked() {
        let args = Cli::parse_from([
            "x",
            "--label-deny",
            "team,example.com/",
            "--label-allow=app",
        ])
        .c;
        let c = args.containment("ns", &[]).unwrap();
        assert_eq!(c.label_deny, ["team", "example.com/"]);
        assert_eq!(c.label_allow, ["app"]);
        assert_eq!(c.limits, WriteLimits::default());
        let bad = Cli::parse_from(["x", "--label-deny", "Bad Key"]).c;
        assert!(
            bad.containment("ns", &[])
                .unwrap_err()
                .contains("--label-deny")
        );
    }

    #[test]
    fn top_level_domains_are_refused_unless_allowed() {
        let c = Cli::parse_from(["x"]).c.containment("ns", &[]).unwrap();
        assert!(c.allowed_tld_names.is_empty());
        assert!(c.public_name("com", "github").is_some());
        assert!(c.public_name("shop-team", "dev").is_some());
        let args = Cli::parse_from(["x", "--allow-tld-names", " Dev,app,,"]).c;
        let c = args.containment("ns", &[]).unwrap();
        assert_eq!(c.allowed_tld_names, ["dev", "app"]);
        assert!(c.public_name("dev", "web").is_none());
        assert!(c.public_name("shop-team", "app").is_none());
        assert!(c.public_name("shop-team", "io").is_some());
        for bad in ["a.b", "-dev", "dev_x", "*"] {
            let args = Cli::parse_from(["x", &format!("--allow-tld-names={bad}")]).c;
            let why = args.containment("ns", &[]).unwrap_err();
            assert!(why.contains("--allow-tld-names"), "{bad}: {why}");
        }
    }
}
