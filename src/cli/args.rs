//! Command-line flags; every flag also reads an environment variable. Compatible with the Go
//! controller's flags (`--kubeconfig`/KUBECONFIG_PATH, `--devmode`/DEV_MODE, `--local-context`,
//! `--remote-context`, `--namespace`).
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};

use crate::desired::{EndpointsMode, Options};
use crate::remotes::SecretSource;
use crate::runtime::lease::{LeaseConfig, default_identity};

/// The daemon's flags.
#[derive(Parser, Debug, Clone)]
#[command(name = "cross-cluster-controller", version, about, long_about = None)]
pub struct Args {
    /// Kubeconfig of the REMOTE cluster (default loading rules when absent).
    #[arg(long, env = "KUBECONFIG_PATH")]
    pub kubeconfig: Option<PathBuf>,

    /// Local cluster from the default kubeconfig (KUBECONFIG or ~/.kube/config) instead of the
    /// in-cluster service account.
    #[arg(long, env = "DEV_MODE")]
    pub devmode: bool,

    /// Context of the local cluster (dev mode).
    #[arg(long, env = "LOCAL_CONTEXT")]
    pub local_context: Option<String>,

    /// Context of the remote cluster in its kubeconfig.
    #[arg(long, env = "REMOTE_CONTEXT")]
    pub remote_context: Option<String>,

    /// The daemon's own namespace: its leader-election Lease, and the Secrets that name remotes.
    #[arg(long, env = "LEASE_NAMESPACE", default_value = "fair-system")]
    pub namespace: String,

    /// Label selector of the Secrets (in --namespace) that each name one remote cluster, with
    /// its kubeconfig under the data key `kubeconfig`. Empty: no Secret remotes.
    #[arg(
        long,
        env = "REMOTE_SECRET_SELECTOR",
        default_value = "fair.com/cross-cluster-remote=true"
    )]
    pub remote_secret_selector: String,

    /// Seconds between a remote's Secret being deleted and its followers being deleted; a
    /// Secret re-created for the same cluster meanwhile keeps them.
    #[arg(long, env = "REMOTE_REMOVAL_GRACE_SECONDS", default_value_t = 30)]
    pub remote_removal_grace_seconds: u64,

    /// Exec credential plugins a remote Secret's kubeconfig may run, by absolute path
    /// (comma-separated), matched exactly. Default: none, so `exec` is refused. A trust decision:
    /// whoever may write Secrets in --namespace may then run these commands in the daemon with
    /// arguments of their choice (never with an environment of their choice).
    #[arg(long, env = "REMOTE_SECRET_ALLOW_EXEC", value_delimiter = ',')]
    pub remote_secret_allow_exec: Vec<String>,

    /// Label key: remote leaders carry `<key>=true`, local followers `<key>=follower`.
    #[arg(long, env = "LABEL_KEY", default_value = "fair.com/cross-cluster")]
    pub label_key: String,

    /// Name of the remote cluster, recorded on every follower (default: the remote context name).
    #[arg(long, env = "CLUSTER_NAME")]
    pub cluster_name: Option<String>,

    /// Namespaces to watch in the remote cluster (comma-separated; default: all).
    #[arg(
        long = "watch-namespace",
        env = "WATCH_NAMESPACES",
        value_delimiter = ','
    )]
    pub watch_namespaces: Vec<String>,

    /// Sweeper schedule, cron with seconds (`sec min hour day month weekday`) or the classic
    /// five fields. Default: every five minutes.
    #[arg(long, env = "SWEEP_SCHEDULE", default_value = "0 */5 * * * *")]
    pub sweep_schedule: String,

    /// Reconcile workers (keys processed in parallel; one key is never processed twice at once).
    #[arg(long, env = "WORKERS", default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..=512))]
    pub workers: u16,

    /// The most of one source cluster's keys in process at once (a remote's; with the MCS API
    /// also the local cluster's exports), so a remote that changes thousands of Services
    /// keeps at most this many writes waiting at the local API server and the other workers free
    /// for the other remotes (0: no cap). The daemon's full passes are not capped.
    #[arg(long, env = "WORKERS_PER_REMOTE", default_value_t = 4, value_parser = clap::value_parser!(u16).range(0..=512))]
    pub workers_per_remote: u16,

    /// Log what would be written, write nothing.
    #[arg(long, env = "DRY_RUN")]
    pub dry_run: bool,

    /// Which local endpoint objects to write: EndpointSlices, legacy core/v1 Endpoints, or both.
    #[arg(long, env = "ENDPOINTS_MODE", value_enum, default_value_t = EndpointsModeArg::Slices)]
    pub endpoints_mode: EndpointsModeArg,

    /// Create a local namespace when a remote leader's namespace does not exist locally.
    #[arg(long, env = "CREATE_NAMESPACES")]
    pub create_namespaces: bool,

    /// Also serve the Multi-Cluster Services API (KEP-1645): ServiceExports in every cluster
    /// read, the local one included, become ServiceImports here (needs its CRDs).
    #[arg(long, env = "MCS")]
    pub mcs: bool,

    /// This cluster's MCS name when it carries no ClusterProperty cluster.clusterset.k8s.io
    /// (with --mcs; one of the two is needed).
    #[arg(long, env = "LOCAL_CLUSTER_NAME")]
    pub local_cluster_name: Option<String>,

    /// Address of the admin server (/healthz, /readyz, /metrics).
    #[arg(long, env = "ADMIN_BIND", default_value = "0.0.0.0:8080")]
    pub admin_bind: SocketAddr,

    /// Name of the leader-election Lease.
    #[arg(long, env = "LEASE_NAME", default_value = "cross-cluster-controller")]
    pub lease_name: String,

    /// Identity of this replica in the Lease (default: POD_NAME, else hostname and PID).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,

    /// Seconds a Lease is valid without renewal; another replica takes over after that.
    #[arg(long, env = "LEASE_DURATION_SECONDS", default_value_t = 15, value_parser = clap::value_parser!(u64).range(2..=3600))]
    pub lease_duration_seconds: u64,

    /// Timeout of each request in the sweeper's listings; a listing that times out aborts the sweep.
    #[arg(long, env = "SWEEP_LIST_TIMEOUT_SECONDS", default_value_t = 30)]
    pub sweep_list_timeout_seconds: u64,

    /// An API server (remote or local) that sends nothing for this long is treated as unreachable:
    /// it bounds each connection attempt and each response (and each local write as a whole: one
    /// not answered in time fails and is retried), and watches are renewed at this
    /// interval so a quiet healthy one never trips it. A hanging remote shows on /readyz within
    /// about twice this.
    #[arg(long, env = "API_TIMEOUT_SECONDS", default_value_t = 60, value_parser = clap::value_parser!(u32).range(2..=290))]
    pub api_timeout_seconds: u32,

    /// Seconds between renewals of each remote's health Lease (kept by the leader in
    /// --namespace, renewed only while the remote's watches are healthy; valid for three times
    /// this).
    #[arg(long, env = "REMOTE_HEALTH_INTERVAL_SECONDS", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=600))]
    pub remote_health_interval_seconds: u64,

    /// Opt-in outage policy for the static remote: once it has been unreachable this many
    /// seconds, its endpoints in every follower are marked not ready (so traffic goes to the
    /// other remotes'); restored when it returns; nothing is deleted. Default: off (keep the last
    /// known endpoints). Secret remotes: the annotation `fair.com/cross-cluster-stale-after`.
    #[arg(long, env = "REMOTE_STALE_AFTER_SECONDS", value_parser = clap::value_parser!(u64).range(1..))]
    pub remote_stale_after_seconds: Option<u64>,

    /// When to renew the token of a remote Secret made by `remote-access` (annotation
    /// `fair.com/cross-cluster-token-renewal`): a share of its lifetime left (`20%`) or a window
    /// before it expires (`24h`, `90m`), or `off`. The leader asks the remote's TokenRequest API for a new
    /// token and writes it into the Secret; a token is never renewed within 30 seconds of its
    /// issue.
    #[arg(long, env = "REMOTE_TOKEN_RENEW_BEFORE", default_value = "20%", value_parser = crate::remotes::credentials::parse_renew_before)]
    pub remote_token_renew_before: crate::remotes::credentials::RenewBefore,

    /// The networks the static remote's addresses must be in (CIDRs, comma-separated; empty: any
    /// that is not local, unless --strict-addresses). A Secret remote's are in its annotation
    /// `fair.com/cross-cluster-allowed-cidrs`.
    #[arg(long, env = "REMOTE_ALLOWED_CIDRS", default_value = "", value_parser = parse_cidrs)]
    pub remote_allowed_cidrs: CidrList,

    /// Strict mode: a remote without allowed CIDRs contributes no addresses at all.
    #[arg(long, env = "STRICT_ADDRESSES")]
    pub strict_addresses: bool,

    /// Refuse a remote Secret or ClusterProfile that pins no cluster id (the annotation
    /// `fair.com/cross-cluster-cluster-id`, the uid of the remote's kube-system namespace, which
    /// `remote-access --output secret` writes). Without it an object that pins none joins as
    /// before; one that pins an id is refused whenever its server answers with another, with or
    /// without this flag. The static remote (--kubeconfig) needs no pin.
    #[arg(long, env = "REQUIRE_CLUSTER_ID_PIN")]
    pub require_cluster_id_pin: bool,

    /// Networks of the local cluster that no remote address may be in, besides those the daemon
    /// finds itself (its nodes' addresses and pod CIDRs, its ServiceCIDRs, its API server's
    /// endpoints): the Service CIDR where the ServiceCIDR API is not served, the pods' networks
    /// where the CNI gives nodes no pod CIDRs (CIDRs, comma-separated).
    #[arg(long, env = "LOCAL_CIDRS", default_value = "", value_parser = parse_cidrs)]
    pub local_cidrs: CidrList,

    /// The local pods' networks, where neither the nodes (`spec.podCIDRs`) nor the CNI's own
    /// objects the daemon reads (Calico IPPools, Cilium CiliumNodes) name them: no remote
    /// address may be in them, and /readyz stops saying that no local pod range is known
    /// (CIDRs, comma-separated).
    #[arg(long, env = "LOCAL_POD_CIDRS", default_value = "", value_parser = parse_cidrs)]
    pub local_pod_cidrs: CidrList,

    /// The largest response a remote's client reads (a list page, a Get), in bytes (suffixes Ki,
    /// Mi, Gi); a larger one fails that request with an error on /readyz.
    #[arg(long, env = "MAX_RESPONSE_BYTES", default_value = "32Mi", value_parser = parse_limit)]
    pub max_response_bytes: u64,

    /// The longest watch event (one line of a watch response) a remote's client reads, in
    /// bytes (suffixes Ki, Mi, Gi); a longer one fails that watch.
    #[arg(long, env = "MAX_WATCH_LINE_BYTES", default_value = "4Mi", value_parser = parse_limit)]
    pub max_watch_line_bytes: u64,

    /// Budget of each remote: the Services it may export (0: no limit). Over any of its budgets
    /// a remote is degraded: its caches are dropped, its followers kept as they are, and it is
    /// read again after a back-off. A Secret remote's annotation
    /// `fair.com/cross-cluster-max-services` overrides it.
    #[arg(long, env = "REMOTE_MAX_SERVICES", default_value = "25000", value_parser = crate::state::budget::parse_count)]
    pub remote_max_services: u64,

    /// Budget of each remote: its endpoints, summed over its slices (0: no limit). Annotation
    /// `fair.com/cross-cluster-max-endpoints`.
    #[arg(long, env = "REMOTE_MAX_ENDPOINTS", default_value = "250000", value_parser = crate::state::budget::parse_count)]
    pub remote_max_endpoints: u64,

    /// Budget of each remote: the bytes its caches hold (suffixes Ki, Mi, Gi; 0: no limit).
    /// Annotation `fair.com/cross-cluster-max-cache-bytes`.
    #[arg(long, env = "REMOTE_MAX_CACHE_BYTES", default_value = "64Mi", value_parser = crate::state::budget::parse_bytes)]
    pub remote_max_cache_bytes: u64,

    /// The share of the local Service range one remote's followers may hold (`N%` or `off`):
    /// over it, its new followers that would take a ClusterIP wait (not created), with an Event,
    /// a skip counted with reason `ServiceIpsLimited` and a /readyz line; existing ones are
    /// kept. The range's size comes from the local ServiceCIDRs (or --local-service-ips).
    #[arg(long, env = "REMOTE_MAX_SERVICE_IP_SHARE", default_value = "25%", value_parser = crate::state::service_ips::parse_share)]
    pub remote_max_service_ip_share: crate::state::service_ips::Share,

    /// The share of the local Service range all remotes together may hold, their followers and
    /// the MCS derived Services (`N%` or `off`).
    #[arg(long, env = "REMOTES_MAX_SERVICE_IP_SHARE", default_value = "50%", value_parser = crate::state::service_ips::parse_share)]
    pub remotes_max_service_ip_share: crate::state::service_ips::Share,

    /// The usable addresses of the local Service range where the local cluster serves no
    /// ServiceCIDRs (Kubernetes before 1.33): without it there, no share is enforced. Served
    /// ServiceCIDRs win over it.
    #[arg(long, env = "LOCAL_SERVICE_IPS", value_parser = clap::value_parser!(u64).range(1..))]
    pub local_service_ips: Option<u64>,

    #[command(flatten)]
    pub containment: super::containment::ContainmentArgs,

    #[command(flatten)]
    pub profiles: super::profiles::ProfileArgs,
}

/// A response limit: a byte count of at least 64 KiB.
fn parse_limit(text: &str) -> Result<u64, String> {
    let n = crate::state::budget::parse_bytes(text)?;
    if n < 64 << 10 {
        return Err(format!("{text:?} is below the minimum of 64Ki"));
    }
    Ok(n)
}

/// CIDRs given as one comma-separated flag value.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CidrList(pub Vec<ipnet::IpNet>);

fn parse_cidrs(text: &str) -> Result<CidrList, String> {
    crate::desired::addresses::parse_cidrs(text).map(CidrList)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum EndpointsModeArg {
    Slices,
    Endpoints,
    Both,
}

impl From<EndpointsModeArg> for EndpointsMode {
    fn from(m: EndpointsModeArg) -> Self {
        match m {
            EndpointsModeArg::Slices => EndpointsMode::Slices,
            EndpointsModeArg::Endpoints => EndpointsMode::Endpoints,
            EndpointsModeArg::Both => EndpointsMode::Both,
        }
    }
}

impl Args {
    /// See `--api-timeout-seconds`.
    pub fn api_timeout(&self) -> Duration {
        Duration::from_secs(self.api_timeout_seconds.into())
    }

    pub fn lease_duration(&self) -> Duration {
        Duration::from_secs(self.lease_duration_seconds)
    }

    /// The sweep schedule in the six-field form tokio-cron-scheduler takes.
    pub fn sweep_cron(&self) -> Result<String, String> {
        let fields = self.sweep_schedule.split_whitespace().count();
        let expr = match fields {
            5 => format!("0 {}", self.sweep_schedule.trim()),
            6 | 7 => self.sweep_schedule.trim().to_string(),
            _ => {
                return Err(format!(
                    "--sweep-schedule {:?}: expected 5 or 6 cron fields, got {fields}",
                    self.sweep_schedule
                ));
            }
        };
        if !crate::runtime::schedule::check(&expr) {
            return Err(format!(
                "--sweep-schedule {:?}: not a cron schedule (sec min hour day month weekday, or the classic five without seconds)",
                self.sweep_schedule
            ));
        }
        Ok(expr)
    }

    /// Validates what clap cannot: one readable line per problem.
    pub fn validate(&self) -> Result<(), String> {
        validate_label_key(&self.label_key)?;
        self.sweep_cron()?;
        for ns in &self.watch_namespaces {
            if !is_dns_label(ns) {
                return Err(format!(
                    "--watch-namespace {ns:?} is not a valid namespace name"
                ));
            }
        }
        crate::client::policy::check_allowed_commands(&self.remote_secret_allow_exec)?;
        if self.kubeconfig.is_none()
            && self.remote_context.is_none()
            && self.remote_secret_selector.trim().is_empty()
            && !self.profiles.enabled()
        {
            return Err(
                "no remote: name one with --kubeconfig or --remote-context, or leave --remote-secret-selector set so remotes come from Secrets, or read ClusterProfiles (--cluster-profiles)"
                    .into(),
            );
        }
        if let Some(name) = &self.cluster_name
            && (name.is_empty() || name.len() > 253)
        {
            return Err(format!(
                "--cluster-name {name:?} must be 1 to 253 characters"
            ));
        }
        if let Some(name) = &self.local_cluster_name {
            if !self.mcs {
                return Err("--local-cluster-name needs --mcs".into());
            }
            if !crate::desired::mcs::is_cluster_name(name) {
                return Err(format!(
                    "--local-cluster-name {name:?} is not a cluster name (a lowercase DNS name usable as a label value: letters, digits, - and ., at most 63 characters)"
                ));
            }
        }
        Ok(())
    }
}

impl Args {
    /// The daemon's configuration, one part per component, once the flags are valid.
    pub fn config(&self) -> Result<crate::daemon::Config, String> {
        self.validate()?;
        let opts = Options::new(self.label_key.clone(), self.endpoints_mode.into())
            .with_containment(
                self.containment
                    .containment(&self.namespace, &self.watch_namespaces)?,
            );
        let namespaces = self.watch_namespaces.clone();
        let client = crate::client::Settings {
            devmode: self.devmode,
            local_context: self.local_context.clone(),
            kubeconfig: self.kubeconfig.clone(),
            remote_context: self.remote_context.clone(),
            cluster_name: self.cluster_name.clone(),
            api_timeout: self.api_timeout(),
            allow_exec: self.remote_secret_allow_exec.clone(),
            body_limits: crate::client::limits::BodyLimits {
                max_response: self.max_response_bytes,
                max_line: self.max_watch_line_bytes,
            },
        };
        let selector = self.remote_secret_selector.trim();
        let secrets = (!selector.is_empty()).then(|| SecretSource {
            namespace: self.namespace.clone(),
            selector: self.remote_secret_selector.clone(),
            removal_grace: Duration::from_secs(self.remote_removal_grace_seconds),
        });
        let profiles = self.profiles.source(
            &self.namespace,
            self.remote_token_renew_before,
            Duration::from_secs(self.remote_removal_grace_seconds),
        )?;
        let lease = LeaseConfig {
            namespace: self.namespace.clone(),
            name: self.lease_name.clone(),
            identity: self.identity.clone().unwrap_or_else(default_identity),
            duration: self.lease_duration(),
        };
        Ok(crate::daemon::Config {
            remotes: crate::remotes::Settings {
                opts: opts.clone(),
                namespaces: namespaces.clone(),
                api_timeout: self.api_timeout(),
                stale_after: self.remote_stale_after_seconds.map(Duration::from_secs),
                allow_external_name: self.containment.remote_allow_external_name,
                client: client.clone(),
                mcs: self.mcs,
                allowed_cidrs: self.remote_allowed_cidrs.0.clone(),
                strict_addresses: self.strict_addresses,
                require_cluster_id_pin: self.require_cluster_id_pin,
                budget: crate::state::budget::Limits {
                    services: self.remote_max_services,
                    endpoints: self.remote_max_endpoints,
                    bytes: self.remote_max_cache_bytes,
                },
            },
            client,
            secrets,
            profiles,
            reconcile: crate::reconcile::Settings {
                opts,
                namespaces: namespaces.clone(),
                create_namespaces: self.create_namespaces,
                dry_run: self.dry_run,
                api_timeout: self.api_timeout(),
                lease: (lease.namespace.clone(), lease.name.clone()),
                identity: lease.identity.clone(),
                mcs: self.mcs.then(|| crate::reconcile::McsSettings {
                    local_name: self.local_cluster_name.clone(),
                }),
                local_cidrs: self.local_cidrs.0.clone(),
                local_pod_cidrs: self.local_pod_cidrs.0.clone(),
                service_ips: crate::state::service_ips::Shares {
                    remote: self.remote_max_service_ip_share.0,
                    all: self.remotes_max_service_ip_share.0,
                    range: self.local_service_ips,
                },
            },
            lease,
            sweep: crate::reconcile::sweep::Settings {
                namespaces,
                list_timeout: Duration::from_secs(self.sweep_list_timeout_seconds),
            },
            sweep_cron: self.sweep_cron()?,
            health_interval: Duration::from_secs(self.remote_health_interval_seconds),
            renew_before: self.remote_token_renew_before,
            admin_bind: self.admin_bind,
            workers: self.workers,
            workers_per_remote: self.workers_per_remote,
        })
    }
}

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// A label key: optional DNS-subdomain prefix and '/', then a name of at most 63 characters.
pub fn validate_label_key(key: &str) -> Result<(), String> {
    let bad = |why: &str| {
        Err(format!(
            "--label-key {key:?} is not a valid label key: {why}"
        ))
    };
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix
        && (p.is_empty() || p.len() > 253 || !p.split('.').all(is_dns_label))
    {
        return bad("the prefix must be a DNS subdomain");
    }
    let ok_char = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.';
    if name.is_empty() || name.len() > 63 {
        return bad("the name must be 1 to 63 characters");
    }
    if !name.chars().all(ok_char)
        || !name.starts_with(|c: char| c.is_ascii_alphanumeric())
        || !name.ends_with(|c: char| c.is_ascii_alphanumeric())
    {
        return bad(
            "the name must be alphanumeric, '-', '_' or '.', starting and ending alphanumeric",
        );
    }
    // without a prefix, the follower annotations are `<key>-origin-cluster` etc., and must fit
    if prefix.is_none() && name.len() + LONGEST_ANNOTATION_SUFFIX.len() > 63 {
        return bad(
            "without a prefix it must be at most 48 characters (the follower annotation <key>-origin-cluster must fit in 63)",
        );
    }
    Ok(())
}

const LONGEST_ANNOTATION_SUFFIX: &str = "-origin-cluster";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_label_key_leaves_room_for_the_follower_annotations() {
        assert!(validate_label_key(&"k".repeat(48)).is_ok());
        let err = validate_label_key(&"k".repeat(49)).unwrap_err();
        assert!(err.contains("at most 48"), "{err}");
        assert!(validate_label_key(&format!("example.com/{}", "k".repeat(63))).is_ok());
    }
    use clap::CommandFactory;

    fn parse(args: &[&str]) -> Args {
        Args::try_parse_from(std::iter::once("ccc").chain(args.iter().copied())).unwrap()
    }

    #[test]
    fn the_flags_are_consistent() {
        Args::command().debug_assert();
    }

    #[test]
    fn defaults_match_the_go_controller() {
        let a = parse(&[]);
        assert_eq!(a.label_key, "fair.com/cross-cluster");
        assert_eq!(a.namespace, "fair-system");
        assert!(!a.devmode);
        assert_eq!(a.sweep_cron().unwrap(), "0 */5 * * * *");
        assert!(a.validate().is_ok());
    }

    #[test]
    fn five_field_cron_gains_a_seconds_field() {
        let a = parse(&["--sweep-schedule", "*/2 * * * *"]);
        assert_eq!(a.sweep_cron().unwrap(), "0 */2 * * * *");
    }

    #[test]
    fn bad_values_give_one_readable_line() {
        for (args, needle) in [
            (vec!["--sweep-schedule", "every minute"], "--sweep-schedule"),
            (vec!["--sweep-schedule", "99 * * * * *"], "--sweep-schedule"),
            (vec!["--label-key", "bad key!"], "--label-key"),
            (vec!["--label-key=-x.com/a"], "--label-key"),
            (vec!["--watch-namespace", "Upper"], "--watch-namespace"),
            (
                vec!["--remote-secret-allow-exec", "aws"],
                "--remote-secret-allow-exec",
            ),
            (
                vec!["--remote-secret-allow-exec=/bin/aws,../aws"],
                "--remote-secret-allow-exec",
            ),
        ] {
            let err = parse(&args).validate().unwrap_err();
            assert!(err.contains(needle), "{err}");
            assert!(!err.contains('\n'), "one line: {err}");
        }
        assert!(Args::try_parse_from(["ccc", "--workers", "0"]).is_err());
        assert!(Args::try_parse_from(["ccc", "--endpoints-mode", "nope"]).is_err());
    }

    #[test]
    fn allowed_exec_commands_split_on_commas() {
        let a = parse(&["--remote-secret-allow-exec", "/usr/local/bin/aws,/bin/t"]);
        assert_eq!(
            a.remote_secret_allow_exec,
            vec!["/usr/local/bin/aws", "/bin/t"]
        );
        assert!(a.validate().is_ok());
        assert!(parse(&[]).remote_secret_allow_exec.is_empty());
    }

    #[test]
    fn watch_namespaces_split_on_commas() {
        let a = parse(&["--watch-namespace", "a,b", "--watch-namespace", "c"]);
        assert_eq!(a.watch_namespaces, vec!["a", "b", "c"]);
    }
}
