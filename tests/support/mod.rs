//! Test support: the real test bed (see testbed/bed), a fresh namespace per test in every
//! cluster, clients per cluster, waiting on conditions with a deadline, and the real daemon binary.
#![allow(dead_code)] // each test binary uses a different part of this module

pub mod bench;
pub mod catcher;
pub mod daemon;
pub mod fault;
pub mod fleet;
pub mod inventory;
pub mod locality;
pub mod mcs;
pub mod metrics;
pub mod node;
pub mod objects;
pub mod proxy;
pub mod rbac;
pub mod remotes;
pub mod tools;
pub mod traffic;

#[allow(unused_imports)] // each test binary uses a different part
pub use objects::{KEY, endpoint, exported, exported_with, remote_slice, remote_slice_with};

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{DeleteParams, ObjectMeta, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use tokio::sync::OnceCell;

/// The cluster the daemon under test reads from.
pub const REMOTE: &str = "east";
/// The cluster the daemon under test writes to.
pub const LOCAL: &str = "west";

pub struct Bed {
    pub kubeconfig: PathBuf,
    pub dir: PathBuf,
}

static BED: OnceCell<Bed> = OnceCell::const_new();

pub fn repo_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Runs testbed/bed with the given arguments; panics with its own error text when it fails, so a
/// control plane that cannot start fails the test with the reason instead of skipping it.
pub fn bed_cmd(args: &[&str]) -> String {
    bed_cmd_env(args, &[])
}

/// [`bed_cmd`] from async code (a blocking task).
pub async fn bed_do(args: &[&str]) -> String {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        bed_cmd(&args.iter().map(String::as_str).collect::<Vec<_>>())
    })
    .await
    .expect("bed task")
}

/// Runs a testbed/bed command when dropped (`plug`, `mend`, ...), so a failing test leaves the
/// bed as it found it for the tests after it. Errors are ignored: it runs while unwinding.
pub struct BedUndo(pub &'static [&'static str]);

impl Drop for BedUndo {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(repo_root().join("testbed/bed"))
            .args(self.0)
            .status();
    }
}

/// Brings up one extra cluster of the bed whose kube-apiserver gets `apiserver_args` (a cluster
/// of its own, so its settings reach no other test); a no-op when it already runs.
pub async fn extra_cluster(name: &'static str, apiserver_args: &'static str) {
    tokio::task::spawn_blocking(move || {
        bed_cmd_env(
            &["up", name],
            &[("XCC_TESTBED_APISERVER_ARGS", apiserver_args)],
        )
    })
    .await
    .expect("bed task");
}

/// Brings up one extra cluster of the bed whose Service range is a /`prefix`
/// (XCC_TESTBED_SERVICE_PREFIX, see testbed/bed); a no-op when it already runs with it.
pub async fn narrow_cluster(name: &'static str, prefix: &'static str) {
    tokio::task::spawn_blocking(move || {
        bed_cmd_env(&["up", name], &[("XCC_TESTBED_SERVICE_PREFIX", prefix)])
    })
    .await
    .expect("bed task");
}

/// Brings up one extra cluster of the bed whose etcd has a quota of `mib` MiB
/// (XCC_TESTBED_ETCD_QUOTA_MIB, see testbed/bed); a no-op when it already runs with it.
pub async fn quota_cluster(name: &'static str, mib: &'static str) {
    tokio::task::spawn_blocking(move || {
        bed_cmd_env(&["up", name], &[("XCC_TESTBED_ETCD_QUOTA_MIB", mib)])
    })
    .await
    .expect("bed task");
}

/// The client port of the etcd of the bed's cluster `name` (its `ports` file, testbed/bed).
pub async fn etcd_port(name: &str) -> u16 {
    let ports = bed().await.dir.join(name).join("ports");
    let text =
        std::fs::read_to_string(&ports).unwrap_or_else(|e| panic!("{}: {e}", ports.display()));
    (text.split_whitespace())
        .find_map(|w| w.strip_prefix("etcd_client=")?.parse().ok())
        .unwrap_or_else(|| panic!("no etcd_client in {}: {text}", ports.display()))
}

/// A call of etcd's JSON gateway on loopback port `port` (POST `path` with `body`): its answer.
pub async fn etcd_call(
    port: u16,
    path: &str,
    body: serde_json::Value,
) -> Result<serde_json::Value, String> {
    let (url, body) = (format!("http://127.0.0.1:{port}{path}"), body.to_string());
    let out = tokio::task::spawn_blocking(move || {
        Command::new("curl")
            .args(["-sf", "--max-time", "5", "-X", "POST", "-d", &body, &url])
            .output()
    })
    .await
    .map_err(|e| e.to_string())?
    .map_err(|e| format!("curl: {e}"))?;
    if !out.status.success() {
        return Err(format!("etcd {path}: curl {}", out.status));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("etcd {path}: {e}"))
}

/// Runs testbed/bed with `env` and says whether it succeeded, with its standard error.
pub fn bed_try(args: &[&str], env: &[(&str, &str)]) -> (bool, String) {
    let out = Command::new("bash")
        .arg(repo_root().join("testbed/bed"))
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("run testbed/bed");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs testbed/bed like [`bed_cmd`]; what it said on standard error.
pub fn bed_cmd_stderr(args: &[&str]) -> String {
    bed_output(args, &[]).1
}

fn bed_cmd_env(args: &[&str], env: &[(&str, &str)]) -> String {
    bed_output(args, env).0
}

/// Standard output and standard error of testbed/bed; panics when it fails.
fn bed_output(args: &[&str], env: &[(&str, &str)]) -> (String, String) {
    let script = repo_root().join("testbed/bed");
    let out = Command::new("bash")
        .arg(&script)
        .args(args)
        .envs(env.iter().copied())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "testbed/bed {} failed ({}):\n{stderr}",
        args.join(" "),
        out.status
    );
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr.into_owned(),
    )
}

/// Brings the test bed up once per test process (the script itself is idempotent and locked, so
/// every test binary of a run shares one bed).
pub async fn bed() -> &'static Bed {
    BED.get_or_init(|| async {
        tokio::task::spawn_blocking(|| {
            bed_cmd(&["up"]);
            let env = bed_cmd(&["env"]);
            let get = |var: &str| -> PathBuf {
                env.lines()
                    .find_map(|l| l.strip_prefix(&format!("export {var}=")))
                    .map(|v| PathBuf::from(v.trim_matches('\'')))
                    .unwrap_or_else(|| panic!("testbed/bed env did not print {var}"))
            };
            assert_in_bed_netns(&get("XCC_TESTBED_NETNS"));
            Bed {
                kubeconfig: get("XCC_TESTBED_KUBECONFIG"),
                dir: get("XCC_TESTBED_DIR"),
            }
        })
        .await
        .expect("test bed start-up task panicked")
    })
    .await
}

/// The bed (API servers, nodes, pods) lives in a network namespace of its own (testbed/net.sh):
/// a test reaches it only from in there.
fn assert_in_bed_netns(netns: &Path) {
    use std::os::unix::fs::MetadataExt;
    let ns = |p: &Path| std::fs::metadata(p).map(|m| (m.dev(), m.ino())).ok();
    assert!(
        ns(Path::new("/proc/self/ns/net")) == ns(netns),
        "the tests run inside the test bed's network namespace {}: \
         `bash testbed/bed exec cargo test --features e2e ...` (scripts/test does so)",
        netns.display()
    );
}

pub async fn config(context: &str) -> Config {
    let bed = bed().await;
    let kc = Kubeconfig::read_from(&bed.kubeconfig).expect("read the test bed kubeconfig");
    let opts = KubeConfigOptions {
        context: Some(context.to_string()),
        ..Default::default()
    };
    Config::from_custom_kubeconfig(kc, &opts)
        .await
        .expect("kubeconfig context")
}

/// An admin client for one cluster of the bed.
pub async fn client(context: &str) -> Client {
    Client::try_from(config(context).await).expect("build client")
}

/// The ClusterIP prefix ("10.97.") of the range `context`'s API server allocates from, read from
/// its `default/kubernetes` Service (the range's first address). The bed gives each cluster its
/// own /16 in the order it started them (after the demo, north has one), so a test reads it
/// instead of assuming it.
pub async fn service_prefix(context: &str) -> String {
    let api: Api<k8s_openapi::api::core::v1::Service> =
        Api::namespaced(client(context).await, "default");
    let ip = api
        .get("kubernetes")
        .await
        .unwrap_or_else(|e| panic!("{context}: the kubernetes Service: {e}"))
        .spec
        .and_then(|s| s.cluster_ip)
        .unwrap_or_else(|| panic!("{context}: the kubernetes Service has no ClusterIP"));
    let octets: Vec<&str> = ip.split('.').collect();
    assert_eq!(octets.len(), 4, "{context}: not an IPv4 ClusterIP: {ip}");
    format!("{}.{}.", octets[0], octets[1])
}

/// A namespace of the same name in every cluster of the bed, deleted when dropped.
pub struct TestNs {
    pub name: String,
    contexts: Vec<String>,
}

pub async fn namespace(test: &str) -> TestNs {
    namespace_in(test, &[REMOTE, LOCAL]).await
}

pub async fn namespace_in(test: &str, contexts: &[&str]) -> TestNs {
    let suffix = format!("{:08x}", rand_u32());
    let mut base: String = test
        .to_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    base.truncate(40);
    let name = format!("t-{}-{suffix}", base.trim_matches('-'));
    for ctx in contexts {
        let api: Api<Namespace> = Api::all(client(ctx).await);
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                labels: Some([("xcc-test".to_string(), "true".to_string())].into()),
                ..Default::default()
            },
            ..Default::default()
        };
        api.create(&PostParams::default(), &ns)
            .await
            .expect("create test namespace");
    }
    TestNs {
        name,
        contexts: contexts.iter().map(|c| c.to_string()).collect(),
    }
}

impl Drop for TestNs {
    fn drop(&mut self) {
        if std::env::var_os("XCC_KEEP_NAMESPACES").is_some() {
            return;
        }
        let name = self.name.clone();
        let contexts = self.contexts.clone();
        // Drop cannot await: delete from a separate thread with its own runtime
        block_on_thread(async move {
            for ctx in contexts {
                let api: Api<Namespace> = Api::all(client(&ctx).await);
                let _ = api.delete(&name, &DeleteParams::background()).await;
            }
        });
    }
}

/// Runs `f` to its end on a thread of its own with its own runtime (for a Drop, which cannot
/// await, even inside a runtime).
pub fn block_on_thread<F>(f: F)
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    let _ = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build();
        if let Ok(rt) = rt {
            rt.block_on(f);
        }
    })
    .join();
}

fn rand_u32() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.finish() as u32
}

/// Polls `check` until it returns Some, or panics after `timeout` naming what was awaited and
/// the last observation. Never a fixed sleep: the loop ends as soon as the condition holds.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        let last = match check().await {
            Ok(v) => return v,
            Err(why) => why,
        };
        if Instant::now() >= deadline {
            panic!(
                "timed out after {timeout:?} waiting for {what}; last: {last}{}",
                degraded()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What `testbed/bed status` finds wrong with the bed, for a wait that timed out: a cluster that
/// lost a part of its control plane ("degraded": a controller manager that died leaves a cluster
/// that silently creates no pods), or the disk nearly full (the kubelets then evict pods).
fn degraded() -> String {
    let out = Command::new("bash")
        .arg(repo_root().join("testbed/bed"))
        .arg("status")
        .output();
    let Ok(out) = out else {
        return String::new();
    };
    let lines: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains(" degraded ") || l.starts_with("disk low:"))
        .map(str::to_string)
        .collect();
    if lines.is_empty() {
        String::new()
    } else {
        format!("; the bed: {}", lines.join("; "))
    }
}

/// `Ok(object)` once it exists: for [`eventually`].
pub async fn present<K>(api: &Api<K>, name: &str) -> Result<K, String>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.get_opt(name)
        .await
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("{name} absent"))
}

/// `Ok(())` once it is gone: for [`eventually`].
pub async fn absent<K>(api: &Api<K>, name: &str) -> Result<(), String>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.get_opt(name).await.map_err(|e| e.to_string())? {
        None => Ok(()),
        Some(_) => Err(format!("{name} still exists")),
    }
}

/// `Ok(())` once the Service's ports are `want`: for [`eventually`].
pub async fn ports_are(
    api: &Api<k8s_openapi::api::core::v1::Service>,
    name: &str,
    want: &[i32],
) -> Result<(), String> {
    let s = api.get(name).await.map_err(|e| e.to_string())?;
    let ports: Vec<i32> = s
        .spec
        .and_then(|s| s.ports)
        .unwrap_or_default()
        .iter()
        .map(|p| p.port)
        .collect();
    if ports == want {
        Ok(())
    } else {
        Err(format!("{ports:?}"))
    }
}

/// A TokenRequest token (one hour) for a ServiceAccount of one cluster of the bed.
pub async fn mint_token(context: &str, namespace: &str, service_account: &str) -> String {
    use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
    use k8s_openapi::api::core::v1::ServiceAccount;
    let sas: Api<ServiceAccount> = Api::namespaced(client(context).await, namespace);
    let req = TokenRequest {
        spec: TokenRequestSpec {
            expiration_seconds: Some(3600),
            ..Default::default()
        },
        ..Default::default()
    };
    let minted: TokenRequest = sas
        .create_subresource("token", service_account, &PostParams::default(), &req)
        .await
        .expect("TokenRequest works");
    minted.status.expect("token status").token
}

/// Writes a kubeconfig for one cluster of the bed whose only credential is `token`; its one
/// context (the current one) is called `name`.
pub async fn token_kubeconfig(context: &str, name: &str, token: &str, path: &Path) {
    let server = config(context).await.cluster_url;
    let bed_kc: serde_yaml::Value = serde_yaml::from_str(
        &std::fs::read_to_string(&bed().await.kubeconfig).expect("read kubeconfig"),
    )
    .expect("kubeconfig is YAML");
    let ca = bed_kc["clusters"]
        .as_sequence()
        .and_then(|cs| cs.iter().find(|c| c["name"] == context))
        .and_then(|c| c["cluster"]["certificate-authority-data"].as_str())
        .expect("the bed's kubeconfig has the cluster's CA")
        .to_string();
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: {context}\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\n\
         users:\n- name: {name}\n  user:\n    token: {token}\ncontexts:\n- name: {name}\n  context: {{cluster: {context}, user: {name}}}\ncurrent-context: {name}\n"
    );
    std::fs::write(path, text).expect("write kubeconfig");
}

/// Builds a typed object from JSON (test fixtures read like the YAML a user would write).
pub fn obj<K: serde::de::DeserializeOwned>(v: serde_json::Value) -> K {
    serde_json::from_value(v).expect("fixture deserializes")
}

/// The notes of the events.k8s.io Events in `ns` of `context` with `reason`, about the object
/// `(kind, name)` when one is given; an error (how many Events there were) while there is none.
pub async fn event_notes(
    context: &str,
    ns: &str,
    reason: &str,
    about: Option<(&str, &str)>,
) -> Result<Vec<String>, String> {
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(client(context).await, ns);
    let list = events
        .list(&kube::api::ListParams::default())
        .await
        .map_err(|e| e.to_string())?;
    let notes: Vec<String> = list
        .items
        .iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .filter(|e| {
            about.is_none_or(|(kind, name)| {
                let r = e.regarding.as_ref();
                r.and_then(|r| r.kind.as_deref()) == Some(kind)
                    && r.and_then(|r| r.name.as_deref()) == Some(name)
            })
        })
        .map(|e| e.note.clone().unwrap_or_default())
        .collect();
    if notes.is_empty() {
        let what = about.map_or(String::new(), |(k, n)| format!(" on {k} {n}"));
        return Err(format!(
            "no {reason} Event{what} among {}",
            list.items.len()
        ));
    }
    Ok(notes)
}

/// `status -o json` against west, scoped to the test's namespace: (exit code, the report).
pub async fn status_json(ns: &str) -> (i32, serde_json::Value) {
    let kc = bed().await.kubeconfig.clone();
    let ns = ns.to_string();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(daemon::BIN)
            .args(["status", "--kubeconfig"])
            .arg(&kc)
            .args([
                "--context",
                LOCAL,
                "--namespace",
                &ns,
                "--watch-namespace",
                &ns,
            ])
            .args(["-o", "json"])
            .output()
            .expect("run status")
    })
    .await
    .unwrap();
    let code = out.status.code().unwrap_or(-1);
    let text = String::from_utf8_lossy(&out.stdout);
    let report: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| {
        panic!(
            "status output is not JSON ({e}): {text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (code, report)
}

/// The remote `name` in a `status -o json` report.
pub fn status_remote<'a>(
    report: &'a serde_json::Value,
    name: &str,
) -> Option<&'a serde_json::Value> {
    report["remotes"]
        .as_array()?
        .iter()
        .find(|r| r["name"] == name)
}
