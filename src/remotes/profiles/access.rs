//! The access providers of the ClusterProfile API (KEP-4322, with the profile-sourced arguments
//! and environment of KEP-5339), read without I/O: the provider file (the operator's
//! configuration, in the format of cluster-inventory-api's `pkg/access/config.go`) and a profile's
//! `status.accessProviders` give the exec credential plugin to run and the cluster to reach.
//!
//! What is trusted, and how far:
//! - the provider file is the operator's: its commands run (each an absolute path), with its
//!   arguments and environment;
//! - a profile is cluster data (whoever may write ClusterProfiles' status in the hub): its
//!   `cluster` goes through the policy of a remote Secret's kubeconfig (https only, TLS always
//!   verified, no file paths: see `crate::client::policy`), and its profile-sourced arguments
//!   and environment are ignored unless the provider's policy admits them. Even then, no variable
//!   that would make the plugin load code, find another program, read another kubeconfig or
//!   send its requests elsewhere is taken from a profile (see [`unsafe_env`]).
//!
//! The provider chosen is the first of the file's (in its order) that the profile offers, in
//! `accessProviders` or the deprecated `credentialProviders` (the former wins on a name in both),
//! as the reference library chooses.
use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::{Map, Value, json};
use thiserror::Error;

/// The extension of a profile's cluster passed to the plugin as `spec.cluster.config`.
pub const EXEC_EXTENSION: &str = "client.authentication.k8s.io/exec";
/// The extension with arguments for the plugin (KEP-5339): a list of strings.
pub const ARGS_EXTENSION: &str = "clusterprofiles.multicluster.x-k8s.io/exec/additional-args";
/// The extension with environment variables for the plugin (KEP-5339): a map of strings.
pub const ENV_EXTENSION: &str = "clusterprofiles.multicluster.x-k8s.io/exec/additional-envs";
/// The ExecCredential versions a plugin may be asked for.
pub const EXEC_API_VERSIONS: &[&str] = &[
    "client.authentication.k8s.io/v1",
    "client.authentication.k8s.io/v1beta1",
];

/// The provider file.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    providers: Vec<Provider>,
}

/// One provider: a name a profile offers, and the plugin that gives credentials for it.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Provider {
    pub name: String,
    pub exec_config: Option<ExecConfig>,
    #[serde(default, rename = "profileSourcedCLIArgsPolicy")]
    pub args_policy: ArgsPolicy,
    #[serde(default, rename = "profileSourcedEnvVarsPolicy")]
    pub env_policy: EnvPolicy,
}

/// A kubeconfig `exec` entry, as the provider file holds it.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExecConfig {
    #[serde(default)]
    pub api_version: String,
    pub command: String,
    #[serde(default)]
    pub args: Option<Vec<String>>,
    #[serde(default)]
    pub env: Option<Vec<EnvVar>>,
    #[serde(default)]
    pub provide_cluster_info: bool,
    #[serde(default)]
    pub install_hint: Option<String>,
    #[serde(default)]
    pub interactive_mode: Option<String>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvVar {
    pub name: String,
    pub value: String,
}

/// What a provider does with a profile's additional arguments.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
pub enum ArgsPolicy {
    /// unset: as Ignore
    #[default]
    #[serde(rename = "")]
    Unset,
    Ignore,
    /// after the provider's own
    Append,
}

/// What a provider does with a profile's additional environment variables.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
pub enum EnvPolicy {
    /// unset: as Ignore
    #[default]
    #[serde(rename = "")]
    Unset,
    Ignore,
    /// the provider's own win
    AppendIfNotExists,
    /// the profile's win
    Replace,
}

/// The providers of a valid provider file, in its order.
#[derive(Clone, Debug)]
pub struct Providers(Vec<Provider>);

impl Providers {
    pub fn names(&self) -> Vec<&str> {
        self.0.iter().map(|p| p.name.as_str()).collect()
    }

    pub fn commands(&self) -> Vec<&str> {
        self.0
            .iter()
            .filter_map(|p| p.exec_config.as_ref())
            .map(|e| e.command.as_str())
            .collect()
    }
}

/// Pure: the providers of a provider file, or why it is not one (one line).
pub fn parse_provider_file(text: &str) -> Result<Providers, String> {
    let file: File = serde_json::from_str(text).map_err(|e| format!("not a provider file: {e}"))?;
    if file.providers.is_empty() {
        return Err("it names no provider (\"providers\": [])".into());
    }
    let mut seen = std::collections::BTreeSet::new();
    for p in &file.providers {
        let at = format!("provider {:?}", p.name);
        if p.name.is_empty() {
            return Err("a provider has no name".into());
        }
        if !seen.insert(p.name.as_str()) {
            return Err(format!("{at} is named twice"));
        }
        let Some(e) = &p.exec_config else {
            return Err(format!("{at} has no execConfig"));
        };
        if !e.command.starts_with('/') || e.command.contains('\0') {
            return Err(format!(
                "{at}: execConfig.command {:?} is not an absolute path (the daemon runs only the program the operator names, never one found on PATH)",
                e.command
            ));
        }
        if !EXEC_API_VERSIONS.contains(&e.api_version.as_str()) {
            return Err(format!(
                "{at}: execConfig.apiVersion {:?} is not one of {}",
                e.api_version,
                EXEC_API_VERSIONS.join(", ")
            ));
        }
        if e.interactive_mode.as_deref() == Some("Always") {
            return Err(format!(
                "{at}: execConfig.interactiveMode Always: the daemon has no terminal (Never or IfAvailable)"
            ));
        }
        for v in e.env.iter().flatten() {
            if !is_env_name(&v.name) {
                return Err(format!(
                    "{at}: execConfig.env name {:?} is not a variable name",
                    v.name
                ));
            }
        }
    }
    Ok(Providers(file.providers))
}

/// Why a profile gives no access the daemon may use: one line.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum Refusal {
    #[error("its status is unreadable: {0}")]
    Unreadable(String),
    #[error(
        "it offers no access provider yet (status.accessProviders is empty: the cluster manager has not published how to reach it)"
    )]
    NoProvider,
    #[error(
        "none of the access providers it offers ({offered}) is in --clusterprofile-provider-file ({configured})"
    )]
    UnknownProvider { offered: String, configured: String },
    #[error("access provider {provider:?}: its cluster has no server")]
    NoServer { provider: String },
    #[error("access provider {provider:?}: extension {name}: {why}")]
    Extension {
        provider: String,
        name: String,
        why: String,
    },
    #[error(
        "access provider {provider:?}: the profile sets the plugin's environment variable {name:?}, which is never taken from a profile (it could make the plugin load code, run another program, read another kubeconfig or send its requests elsewhere)"
    )]
    UnsafeEnv { provider: String, name: String },
}

/// How to run a provider's plugin for one profile: what the daemon executes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Invocation {
    /// the provider's name
    pub provider: String,
    pub command: String,
    pub args: Vec<String>,
    /// set on top of the daemon's own environment, in this order
    pub env: Vec<(String, String)>,
    /// the ExecCredential version asked for
    pub api_version: String,
    /// `KUBERNETES_EXEC_INFO`
    pub exec_info: String,
}

/// A profile's access, once chosen: the plugin to run and the cluster (a kubeconfig `cluster`,
/// its extensions taken out) its credential is for.
#[derive(Clone, Debug)]
pub struct Access {
    pub invocation: Invocation,
    pub cluster: Map<String, Value>,
    /// the profile-sourced arguments and variables its provider's policy ignored (for a note)
    pub ignored: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Status {
    #[serde(default)]
    access_providers: Vec<Offered>,
    #[serde(default)]
    credential_providers: Vec<Offered>,
}

#[derive(Debug, Deserialize)]
struct Offered {
    name: String,
    #[serde(default)]
    cluster: Map<String, Value>,
}

/// Pure: the access a profile's `status` gives through the providers of the file.
pub fn access(providers: &Providers, status: Option<&Value>) -> Result<Access, Refusal> {
    let status: Status = match status {
        None | Some(Value::Null) => Status::default(),
        Some(v) => {
            serde_json::from_value(v.clone()).map_err(|e| Refusal::Unreadable(e.to_string()))?
        }
    };
    let mut offered: BTreeMap<&str, &Offered> = BTreeMap::new();
    for o in status
        .credential_providers
        .iter()
        .chain(&status.access_providers)
    {
        offered.insert(o.name.as_str(), o);
    }
    if offered.is_empty() {
        return Err(Refusal::NoProvider);
    }
    let Some((provider, chosen)) = providers
        .0
        .iter()
        .find_map(|p| offered.get(p.name.as_str()).map(|o| (p, *o)))
    else {
        return Err(Refusal::UnknownProvider {
            offered: offered.keys().copied().collect::<Vec<_>>().join(", "),
            configured: providers.names().join(", "),
        });
    };
    let name = provider.name.clone();
    let mut cluster = chosen.cluster.clone();
    let extensions = extensions(&name, cluster.remove("extensions"))?;
    match cluster.get("server").and_then(Value::as_str) {
        Some(s) if !s.is_empty() => {}
        _ => return Err(Refusal::NoServer { provider: name }),
    }
    // only an ExecConfig-bearing provider passes parse_provider_file
    let Some(exec) = provider.exec_config.as_ref() else {
        return Err(Refusal::NoProvider);
    };
    let mut ignored = Vec::new();
    let mut args = exec.args.clone().unwrap_or_default();
    if let Some(extra) = extensions.get(ARGS_EXTENSION) {
        let extra: Vec<String> =
            serde_json::from_value(extra.clone()).map_err(|e| Refusal::Extension {
                provider: name.clone(),
                name: ARGS_EXTENSION.into(),
                why: format!("not a list of strings: {e}"),
            })?;
        match provider.args_policy {
            ArgsPolicy::Append => args.extend(extra),
            ArgsPolicy::Unset | ArgsPolicy::Ignore if !extra.is_empty() => ignored.push(format!(
                "arguments {extra:?} (profileSourcedCLIArgsPolicy is not Append)"
            )),
            _ => {}
        }
    }
    let own: Vec<(String, String)> = exec
        .env
        .iter()
        .flatten()
        .map(|v| (v.name.clone(), v.value.clone()))
        .collect();
    let env = match extensions.get(ENV_EXTENSION) {
        None => own,
        Some(extra) => {
            let extra: BTreeMap<String, String> =
                serde_json::from_value(extra.clone()).map_err(|e| Refusal::Extension {
                    provider: name.clone(),
                    name: ENV_EXTENSION.into(),
                    why: format!("not a map of strings: {e}"),
                })?;
            profile_env(&name, provider.env_policy, own, extra, &mut ignored)?
        }
    };
    let exec_info = exec_info(exec, &cluster, extensions.get(EXEC_EXTENSION));
    Ok(Access {
        invocation: Invocation {
            provider: name,
            command: exec.command.clone(),
            args,
            env,
            api_version: exec.api_version.clone(),
            exec_info,
        },
        cluster,
        ignored,
    })
}

/// A cluster's extensions by name (a kubeconfig v1 NamedExtension list).
fn extensions(provider: &str, list: Option<Value>) -> Result<BTreeMap<String, Value>, Refusal> {
    #[derive(Deserialize)]
    struct Named {
        name: String,
        #[serde(default)]
        extension: Value,
    }
    let list: Vec<Named> = match list {
        None | Some(Value::Null) => Vec::new(),
        Some(v) => serde_json::from_value(v).map_err(|e| Refusal::Extension {
            provider: provider.into(),
            name: "extensions".into(),
            why: e.to_string(),
        })?,
    };
    Ok(list.into_iter().map(|n| (n.name, n.extension)).collect())
}

/// The plugin's environment: the provider's, and the profile's as its policy says.
fn profile_env(
    provider: &str,
    policy: EnvPolicy,
    own: Vec<(String, String)>,
    extra: BTreeMap<String, String>,
    ignored: &mut Vec<String>,
) -> Result<Vec<(String, String)>, Refusal> {
    if matches!(policy, EnvPolicy::Unset | EnvPolicy::Ignore) {
        if !extra.is_empty() {
            let names: Vec<&String> = extra.keys().collect();
            ignored.push(format!(
                "environment variables {names:?} (profileSourcedEnvVarsPolicy is not AppendIfNotExists or Replace)"
            ));
        }
        return Ok(own);
    }
    if let Some(name) = extra.keys().find(|n| unsafe_env(n)) {
        return Err(Refusal::UnsafeEnv {
            provider: provider.into(),
            name: name.clone(),
        });
    }
    let mut env: BTreeMap<String, String> = extra;
    for (k, v) in own {
        match policy {
            EnvPolicy::Replace => {
                env.entry(k).or_insert(v);
            }
            _ => {
                env.insert(k, v);
            }
        }
    }
    Ok(env.into_iter().collect())
}

/// A variable name (letters, digits and `_`, not starting with a digit).
fn is_env_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// A variable a profile may never set, whatever the policy: one that is no variable name, or one
/// that makes a program load code (`LD_PRELOAD`, `NODE_OPTIONS`, `GODEBUG`...), find another
/// program (`PATH`), read another kubeconfig or home (`KUBECONFIG`, `HOME`, `KUBERNETES_*`),
/// trust other certificates (`SSL_CERT_*`) or send its requests through a proxy (`*_PROXY`).
pub fn unsafe_env(name: &str) -> bool {
    const EXACT: &[&str] = &[
        "PATH",
        "HOME",
        "KUBECONFIG",
        "TMPDIR",
        "SHELL",
        "ENV",
        "BASH_ENV",
        "IFS",
        "NODE_OPTIONS",
        "PERL5OPT",
        "RUBYOPT",
        "JAVA_TOOL_OPTIONS",
    ];
    const PREFIX: &[&str] = &[
        "LD_",
        "DYLD_",
        "KUBERNETES_",
        "SSL_",
        "GO",
        "PYTHON",
        "XDG_",
        "AWS_",
        "GOOGLE_",
        "AZURE_",
    ];
    let upper = name.to_ascii_uppercase();
    !is_env_name(name)
        || EXACT.contains(&upper.as_str())
        || PREFIX.iter().any(|p| upper.starts_with(p))
        || upper.ends_with("_PROXY")
}

/// `KUBERNETES_EXEC_INFO`: the ExecCredential the plugin reads, with the cluster when the
/// provider asks for it (`provideClusterInfo`), its `config` the profile's exec extension.
fn exec_info(exec: &ExecConfig, cluster: &Map<String, Value>, config: Option<&Value>) -> String {
    let mut spec = json!({"interactive": false});
    if exec.provide_cluster_info {
        let mut c = Map::new();
        for k in [
            "server",
            "tls-server-name",
            "insecure-skip-tls-verify",
            "certificate-authority-data",
            "proxy-url",
            "disable-compression",
        ] {
            if let Some(v) = cluster.get(k) {
                c.insert(k.to_string(), v.clone());
            }
        }
        if let Some(config) = config {
            c.insert("config".into(), config.clone());
        }
        spec["cluster"] = Value::Object(c);
    }
    json!({"apiVersion": exec.api_version, "kind": "ExecCredential", "spec": spec}).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = r#"{"providers": [
        {"name": "token", "execConfig": {"apiVersion": "client.authentication.k8s.io/v1",
          "command": "/bin/token", "args": ["--flag"], "env": [{"name": "MODE", "value": "op"}],
          "provideClusterInfo": true}},
        {"name": "secretreader", "execConfig": {"apiVersion": "client.authentication.k8s.io/v1",
          "command": "/opt/secretreader-plugin", "args": null, "env": null,
          "provideClusterInfo": true}, "profileSourcedCLIArgsPolicy": "Append",
          "profileSourcedEnvVarsPolicy": "AppendIfNotExists"}
    ]}"#;

    fn status(providers: Value) -> Value {
        json!({"accessProviders": providers})
    }

    fn offered(name: &str, extensions: Value) -> Value {
        json!({"name": name, "cluster": {"server": "https://10.0.0.1:6443",
               "certificate-authority-data": "Q0E=", "extensions": extensions}})
    }

    #[test]
    fn the_reference_example_file_parses() {
        // examples/controller-example/plugins/secretreader/provider-config.json, with the command
        // made absolute (the daemon runs no program found relative to its directory)
        let text = r#"{"providers": [{"name": "secretreader", "execConfig": {
            "apiVersion": "client.authentication.k8s.io/v1", "args": null,
            "command": "/bin/secretreader-plugin", "env": null, "provideClusterInfo": true}}]}"#;
        let p = parse_provider_file(text).expect("valid");
        assert_eq!(p.names(), ["secretreader"]);
        let relative = text.replace("/bin/secretreader-plugin", "./bin/secretreader-plugin");
        let why = parse_provider_file(&relative).unwrap_err();
        assert!(why.contains("not an absolute path"), "{why}");
    }

    #[test]
    fn a_bad_provider_file_says_what_is_wrong() {
        for (text, want) in [
            ("{", "not a provider file"),
            (r#"{"providers": []}"#, "names no provider"),
            (r#"{"providers": [{"name": "a"}]}"#, "has no execConfig"),
            (
                r#"{"providers": [{"name": "a", "execConfig": {"command": "/x"}}]}"#,
                "apiVersion",
            ),
            (
                r#"{"providers": [{"name": "a", "execConfig": {"apiVersion": "client.authentication.k8s.io/v1", "command": "/x"}, "profileSourcedCLIArgsPolicy": "Always"}]}"#,
                "unknown variant",
            ),
            (
                r#"{"providers": [{"name": "a", "execConfig": {"apiVersion": "client.authentication.k8s.io/v1", "command": "/x", "provideClusterinfo": true}}]}"#,
                "unknown field",
            ),
            (
                r#"{"providers": [{"name": "a", "execConfig": {"apiVersion": "client.authentication.k8s.io/v1", "command": "/x"}}, {"name": "a", "execConfig": {"apiVersion": "client.authentication.k8s.io/v1", "command": "/y"}}]}"#,
                "named twice",
            ),
        ] {
            let why = parse_provider_file(text).expect_err(text);
            assert!(why.contains(want), "{text}: {why}");
            assert!(!why.contains('\n'), "{why}");
        }
    }

    #[test]
    fn the_first_provider_of_the_file_that_the_profile_offers_is_chosen() {
        let p = parse_provider_file(FILE).unwrap();
        let s = status(json!([
            offered("secretreader", json!([])),
            offered("token", json!([]))
        ]));
        let a = access(&p, Some(&s)).unwrap();
        assert_eq!(a.invocation.provider, "token", "the file's order decides");
        assert_eq!(a.invocation.command, "/bin/token");
        assert_eq!(a.invocation.args, ["--flag"]);
        assert!(!a.cluster.contains_key("extensions"));
        let s = status(json!([offered("secretreader", json!([]))]));
        assert_eq!(
            access(&p, Some(&s)).unwrap().invocation.provider,
            "secretreader"
        );
        // the deprecated field is read too
        let s = json!({"credentialProviders": [offered("secretreader", json!([]))]});
        assert_eq!(
            access(&p, Some(&s)).unwrap().invocation.provider,
            "secretreader"
        );
    }

    #[test]
    fn a_profile_without_a_known_provider_is_refused_by_name() {
        let p = parse_provider_file(FILE).unwrap();
        assert_eq!(access(&p, None).unwrap_err(), Refusal::NoProvider);
        let s = status(json!([
            offered("gke", json!([])),
            offered("azure", json!([]))
        ]));
        let why = access(&p, Some(&s)).unwrap_err().to_string();
        assert!(
            why.contains("(azure, gke)") && why.contains("(token, secretreader)"),
            "{why}"
        );
        let s = status(json!([{"name": "token", "cluster": {}}]));
        assert!(matches!(
            access(&p, Some(&s)),
            Err(Refusal::NoServer { .. })
        ));
    }

    #[test]
    fn the_exec_extension_reaches_the_plugin_with_the_cluster() {
        let p = parse_provider_file(FILE).unwrap();
        let ext = json!([{"name": EXEC_EXTENSION, "extension": {"clusterName": "spoke-1"}}]);
        let s = status(json!([offered("secretreader", ext)]));
        let a = access(&p, Some(&s)).unwrap();
        let info: Value = serde_json::from_str(&a.invocation.exec_info).unwrap();
        assert_eq!(info["kind"], "ExecCredential");
        assert_eq!(info["apiVersion"], "client.authentication.k8s.io/v1");
        assert_eq!(info["spec"]["interactive"], false);
        assert_eq!(info["spec"]["cluster"]["server"], "https://10.0.0.1:6443");
        assert_eq!(
            info["spec"]["cluster"]["certificate-authority-data"],
            "Q0E="
        );
        assert_eq!(info["spec"]["cluster"]["config"]["clusterName"], "spoke-1");
    }

    #[test]
    fn profile_sourced_arguments_and_variables_follow_the_providers_policy() {
        let p = parse_provider_file(FILE).unwrap();
        let ext = json!([
            {"name": ARGS_EXTENSION, "extension": ["--region", "eu"]},
            {"name": ENV_EXTENSION, "extension": {"MODE": "profile", "REGION": "eu"}}
        ]);
        // "token" has neither policy: both ignored, and said so
        let s = status(json!([offered("token", ext.clone())]));
        let a = access(&p, Some(&s)).unwrap();
        assert_eq!(a.invocation.args, ["--flag"]);
        assert_eq!(a.invocation.env, [("MODE".to_string(), "op".to_string())]);
        assert_eq!(a.ignored.len(), 2, "{:?}", a.ignored);
        // "secretreader": Append and AppendIfNotExists
        let s = status(json!([offered("secretreader", ext)]));
        let a = access(&p, Some(&s)).unwrap();
        assert_eq!(a.invocation.args, ["--region", "eu"]);
        assert_eq!(
            a.invocation.env,
            [
                ("MODE".to_string(), "profile".to_string()),
                ("REGION".to_string(), "eu".to_string())
            ]
        );
        assert!(a.ignored.is_empty());
    }

    #[test]
    fn the_provider_wins_unless_the_policy_is_replace() {
        let own = vec![("MODE".to_string(), "op".to_string())];
        let extra = BTreeMap::from([("MODE".to_string(), "profile".to_string())]);
        let mut ignored = Vec::new();
        let keep = profile_env(
            "p",
            EnvPolicy::AppendIfNotExists,
            own.clone(),
            extra.clone(),
            &mut ignored,
        );
        assert_eq!(keep.unwrap(), own);
        let replace = profile_env("p", EnvPolicy::Replace, own, extra, &mut ignored).unwrap();
        assert_eq!(replace, [("MODE".to_string(), "profile".to_string())]);
    }

    #[test]
    fn a_profile_never_sets_a_variable_that_changes_what_runs_or_where_it_goes() {
        for name in [
            "LD_PRELOAD",
            "PATH",
            "KUBECONFIG",
            "HTTPS_PROXY",
            "https_proxy",
            "GODEBUG",
            "NODE_OPTIONS",
            "SSL_CERT_FILE",
            "KUBERNETES_EXEC_INFO",
            "HOME",
            "A=B",
            "",
        ] {
            assert!(unsafe_env(name), "{name}");
        }
        for name in ["REGION", "CLUSTER_NAME", "MODE"] {
            assert!(!unsafe_env(name), "{name}");
        }
        let p = parse_provider_file(FILE).unwrap();
        let ext = json!([{"name": ENV_EXTENSION, "extension": {"LD_PRELOAD": "/tmp/x.so"}}]);
        let s = status(json!([offered("secretreader", ext)]));
        let why = access(&p, Some(&s)).unwrap_err();
        assert!(
            matches!(&why, Refusal::UnsafeEnv { name, .. } if name == "LD_PRELOAD"),
            "{why}"
        );
    }

    #[test]
    fn a_malformed_extension_is_refused_with_its_name() {
        let p = parse_provider_file(FILE).unwrap();
        let ext = json!([{"name": ARGS_EXTENSION, "extension": {"not": "a list"}}]);
        let s = status(json!([offered("secretreader", ext)]));
        let why = access(&p, Some(&s)).unwrap_err().to_string();
        assert!(why.contains(ARGS_EXTENSION), "{why}");
    }
}
