//! The flags of the ClusterProfile source of remotes (issue 30; see
//! `crate::remotes::profiles`).
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use crate::remotes::credentials::RenewBefore;
use crate::remotes::profiles::{Hub, ProfileSource, access};

/// Where ClusterProfile remotes come from.
#[derive(Args, Debug, Clone)]
pub struct ProfileArgs {
    /// Read remotes from the ClusterProfiles (multicluster.x-k8s.io/v1alpha1, KEP-4322) in this
    /// namespace of the hub: each one whose status.accessProviders names a provider of
    /// --clusterprofile-provider-file is a remote named after the profile. Default: off.
    #[arg(long, env = "CLUSTER_PROFILES")]
    pub cluster_profiles: Option<String>,

    /// The cluster holding the ClusterProfiles: `local` (this cluster), the absolute path of a
    /// kubeconfig (its current context), or `secret:NAME` (a Secret of --namespace with the data
    /// key `kubeconfig`, checked as a remote Secret's kubeconfig is).
    #[arg(long, env = "CLUSTER_PROFILES_HUB", default_value = "local")]
    pub cluster_profiles_hub: Hub,

    /// Label selector of the ClusterProfiles read (empty: every one of the namespace).
    #[arg(long, env = "CLUSTER_PROFILES_SELECTOR", default_value = "")]
    pub cluster_profiles_selector: String,

    /// The access-provider file (JSON, the format of cluster-inventory-api's pkg/access): the
    /// exec credential plugin of each provider name, by absolute path, and the policies for the
    /// arguments and environment a profile adds (KEP-5339). The operator's configuration: its
    /// commands are run. Needed with --cluster-profiles.
    #[arg(long, env = "CLUSTERPROFILE_PROVIDER_FILE")]
    pub clusterprofile_provider_file: Option<PathBuf>,

    /// A profile's plugin is run again at least this often (seconds), and before its credential
    /// expires (--remote-token-renew-before; with `off`, at 20% of its life left), so a
    /// credential rotated in the hub is used.
    #[arg(long, env = "CLUSTER_PROFILES_REFRESH_SECONDS", default_value_t = 300, value_parser = clap::value_parser!(u64).range(5..))]
    pub cluster_profiles_refresh_seconds: u64,

    /// A plugin that has not answered within this many seconds is killed (the profile is then
    /// tried again, its remote kept as it was).
    #[arg(long, env = "CLUSTER_PROFILES_EXEC_TIMEOUT_SECONDS", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=300))]
    pub cluster_profiles_exec_timeout_seconds: u64,

    /// Write back what this daemon sees of each profile's cluster: the leader keeps a condition
    /// of its own, `cross-cluster-controller.fair.com/ConnectedFrom.<NAME>`, on each profile it
    /// reads or refuses (NAME: this cluster's name in the fleet, a lowercase DNS label). Needs
    /// `patch` on clusterprofiles/status in the hub. Default: off, nothing is written there.
    #[arg(long, env = "CLUSTER_PROFILES_REPORT_AS")]
    pub cluster_profiles_report_as: Option<String>,
}

impl ProfileArgs {
    /// Whether profiles are read.
    pub fn enabled(&self) -> bool {
        self.cluster_profiles.is_some()
    }

    /// The source, when --cluster-profiles is set; or what is wrong (the provider file is read
    /// and checked here, and each of its commands must be an executable file).
    pub fn source(
        &self,
        daemon_namespace: &str,
        renew_before: RenewBefore,
        removal_grace: Duration,
    ) -> Result<Option<ProfileSource>, String> {
        let Some(namespace) = &self.cluster_profiles else {
            if self.clusterprofile_provider_file.is_some() {
                return Err("--clusterprofile-provider-file needs --cluster-profiles".into());
            }
            if self.cluster_profiles_report_as.is_some() {
                return Err("--cluster-profiles-report-as needs --cluster-profiles".into());
            }
            return Ok(None);
        };
        if namespace.is_empty() {
            return Err("--cluster-profiles needs the hub's namespace of the profiles".into());
        }
        let Some(path) = &self.clusterprofile_provider_file else {
            return Err(
                "--cluster-profiles needs --clusterprofile-provider-file (which plugin gives credentials for which access provider)"
                    .into(),
            );
        };
        if let Some(name) = &self.cluster_profiles_report_as
            && !crate::desired::mcs::is_cluster_name(name)
        {
            return Err(format!(
                "--cluster-profiles-report-as {name:?} is not a cluster name (a lowercase DNS name: letters, digits, - and ., at most 63 characters)"
            ));
        }
        let at = format!("--clusterprofile-provider-file {}", path.display());
        let text = std::fs::read_to_string(path).map_err(|e| format!("{at}: {e}"))?;
        let providers = access::parse_provider_file(&text).map_err(|e| format!("{at}: {e}"))?;
        for command in providers.commands() {
            executable(command).map_err(|e| format!("{at}: {e}"))?;
        }
        Ok(Some(ProfileSource {
            hub: self.cluster_profiles_hub.clone(),
            namespace: namespace.clone(),
            selector: self.cluster_profiles_selector.clone(),
            providers,
            refresh: Duration::from_secs(self.cluster_profiles_refresh_seconds),
            // `off` stops the writes of token renewal; running a plugin again writes nothing, so
            // a profile's credential is refreshed before it expires all the same
            renew_before: match renew_before {
                RenewBefore::Off => RenewBefore::Percent(20),
                window => window,
            },
            exec_timeout: Duration::from_secs(self.cluster_profiles_exec_timeout_seconds),
            removal_grace,
            daemon_namespace: daemon_namespace.to_string(),
            report_as: self.cluster_profiles_report_as.clone(),
        }))
    }
}

/// A provider's command: an executable file.
fn executable(command: &str) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let m = std::fs::metadata(command).map_err(|e| format!("plugin {command}: {e}"))?;
    if !m.is_file() || m.permissions().mode() & 0o111 == 0 {
        return Err(format!("plugin {command} is not an executable file"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(ns: Option<&str>, file: Option<PathBuf>) -> ProfileArgs {
        ProfileArgs {
            cluster_profiles: ns.map(String::from),
            cluster_profiles_hub: Hub::Local,
            cluster_profiles_selector: String::new(),
            clusterprofile_provider_file: file,
            cluster_profiles_refresh_seconds: 300,
            cluster_profiles_exec_timeout_seconds: 10,
            cluster_profiles_report_as: None,
        }
    }

    fn source(a: &ProfileArgs) -> Result<Option<ProfileSource>, String> {
        a.source("fair-system", RenewBefore::Off, Duration::from_secs(30))
    }

    fn file(text: &str) -> (tempfile::TempDir, PathBuf) {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("providers.json");
        std::fs::write(&p, text).unwrap();
        (d, p)
    }

    #[test]
    fn off_unless_a_namespace_is_given_and_then_the_provider_file_is_needed() {
        assert!(source(&args(None, None)).unwrap().is_none());
        let why = source(&args(Some("fleet"), None)).unwrap_err();
        assert!(why.contains("--clusterprofile-provider-file"), "{why}");
        let why = source(&args(None, Some("/x".into()))).unwrap_err();
        assert!(why.contains("needs --cluster-profiles"), "{why}");
    }

    #[test]
    fn the_provider_file_is_read_and_its_commands_must_be_executable() {
        let good = r#"{"providers": [{"name": "p", "execConfig": {"apiVersion": "client.authentication.k8s.io/v1", "command": "/bin/sh"}}]}"#;
        let (_d, p) = file(good);
        let s = source(&args(Some("fleet"), Some(p))).unwrap().expect("on");
        assert_eq!(s.namespace, "fleet");
        assert_eq!(s.providers.names(), ["p"]);
        assert_eq!(
            s.renew_before,
            RenewBefore::Percent(20),
            "renewal off still refreshes a profile's credential before it expires"
        );
        let (_d, p) = file(&good.replace("/bin/sh", "/nonexistent/plugin"));
        let why = source(&args(Some("fleet"), Some(p))).unwrap_err();
        assert!(why.contains("/nonexistent/plugin"), "{why}");
        let (_d, p) = file("{}");
        let why = source(&args(Some("fleet"), Some(p.clone()))).unwrap_err();
        assert!(why.contains(&p.display().to_string()), "{why}");
    }
}
