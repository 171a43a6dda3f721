//! The remotes while the daemon runs: joining and leaving (flags and Secrets), their health
//! Leases, credentials, gauges and the outage policy.
use std::time::Duration;

use crate::desired::Options;

pub mod credentials;
pub mod gauges;
pub mod health;
pub mod join;
pub mod outage;
pub mod probe;
pub mod profiles;
pub mod remote_secret;
pub mod secrets;
pub mod source;

/// How remotes are read.
#[derive(Clone, Debug)]
pub struct Settings {
    /// what every remote's options start from (label key, endpoints mode)
    pub opts: Options,
    /// namespaces mirrored (empty: all)
    pub namespaces: Vec<String>,
    /// the limit of one request; watches are renewed this often
    pub api_timeout: Duration,
    /// the static remote's outage policy (a Secret remote's is on its Secret)
    pub stale_after: Option<Duration>,
    /// the static remote may export ExternalName Services (a Secret remote's is on its Secret)
    pub allow_external_name: bool,
    /// how a Secret remote's client is built
    pub client: crate::client::Settings,
    /// read every remote as a Multi-Cluster Services source too (`--mcs`)
    pub mcs: bool,
    /// the static remote's allowed CIDRs (a Secret remote's are on its Secret)
    pub allowed_cidrs: Vec<ipnet::IpNet>,
    /// a remote without allowed CIDRs contributes no addresses
    pub strict_addresses: bool,
    /// every remote's budget (a Secret's annotations override it for its remote)
    pub budget: crate::state::budget::Limits,
    /// a Secret or ClusterProfile that pins no cluster id is refused (`--require-cluster-id-pin`)
    pub require_cluster_id_pin: bool,
}

impl Settings {
    /// The server-side timeout of a watch, in seconds.
    pub fn watch_timeout(&self) -> u32 {
        u32::try_from(self.api_timeout.as_secs()).unwrap_or(u32::MAX)
    }
}

/// Where Secret remotes come from.
#[derive(Clone, Debug)]
pub struct SecretSource {
    /// the daemon's namespace, which holds the Secrets
    pub namespace: String,
    /// the label selector of remote Secrets
    pub selector: String,
    /// how long a remote whose Secret was deleted is kept before it leaves
    pub removal_grace: Duration,
}
