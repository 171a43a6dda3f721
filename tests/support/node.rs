//! A cluster of the bed with nodes (`testbed/bed node NAME [COUNT]`, see testbed/node.sh): each
//! a kubelet and containerd whose pods use the host network (node I at address 127.0.0.I), and
//! images built here from a binary (`testbed/bed image`), since there is no registry.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::config::Kubeconfig;

use super::tools::run;
use super::{bed_cmd, repo_root};

/// The static remote the chart mounts: a kubeconfig for `remote` minted by `remote-access`
/// (cluster name east, valid 1 h), in the Secret `east-kubeconfig` of `ns` on `local`.
pub async fn remote_kubeconfig_secret(
    local: &kube::Client,
    kubeconfig: &Path,
    remote: &str,
    ns: &str,
) {
    let kc = run(Command::new(super::daemon::BIN)
        .args(["remote-access", "--kubeconfig"])
        .arg(kubeconfig)
        .args(["--context", remote, "--namespace", ns, "--duration", "1h"])
        .args(["--output", "kubeconfig", "--cluster-name", "east"]));
    let secret: k8s_openapi::api::core::v1::Secret = super::obj(serde_json::json!({
        "metadata": {"name": "east-kubeconfig"}, "stringData": {"kubeconfig": kc}
    }));
    Api::namespaced(local.clone(), ns)
        .create(&kube::api::PostParams::default(), &secret)
        .await
        .unwrap();
}

/// Brings up cluster `name` with its node (idempotent, locked: every test of a run shares it) and
/// waits until the node is Ready; fails the test with the bed's own error text otherwise.
pub async fn node_cluster(name: &'static str) {
    node_cluster_with(name, 1).await
}

/// Brings up cluster `name` with `count` nodes (a cluster never loses nodes) and waits until
/// every one is Ready.
pub async fn node_cluster_with(name: &'static str, count: u8) {
    tokio::task::spawn_blocking(move || bed_cmd(&["node", name, &count.to_string()]))
        .await
        .expect("bed task");
}

/// The (first) node's name in cluster `cluster`.
pub fn node_name(cluster: &str) -> String {
    format!("{cluster}-node")
}

/// Node `i` (1, 2, ...) of `cluster`: its name and its address.
pub fn node_at(cluster: &str, i: u8) -> (String, String) {
    let name = if i == 1 {
        node_name(cluster)
    } else {
        format!("{cluster}-node-{i}")
    };
    (name, format!("127.0.0.{i}"))
}

/// Builds the daemon's image (scripts/build-image: the release binary and the Dockerfile) and
/// imports it into every node of `cluster`: build-image's output and the time both took.
pub async fn chart_image(cluster: &'static str) -> (String, Duration) {
    let setup = Instant::now();
    let built = run(Command::new("bash").arg(repo_root().join("scripts/build-image")));
    let archive = repo_root().join("target/image/cross-cluster-controller.oci.tar");
    let archive = archive.to_str().expect("utf-8 path").to_string();
    tokio::task::spawn_blocking(move || bed_cmd(&["import", cluster, &archive]))
        .await
        .expect("bed task");
    (built, setup.elapsed())
}

/// Running, with its Ready condition true.
pub fn pod_ready(pod: &Pod) -> bool {
    let status = pod.status.as_ref();
    status.and_then(|s| s.phase.as_deref()) == Some("Running")
        && status
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The holder of Lease `name`, if it has one.
pub async fn lease_holder(leases: &Api<Lease>, name: &str) -> Result<String, String> {
    let l = leases.get(name).await.map_err(|e| e.to_string())?;
    l.spec
        .and_then(|s| s.holder_identity)
        .filter(|h| !h.is_empty())
        .ok_or_else(|| "no holder".to_string())
}

/// The port of `context`'s API server in the bed's kubeconfig.
pub fn api_port(kubeconfig: &Path, context: &str) -> String {
    let kc = Kubeconfig::read_from(kubeconfig).expect("bed kubeconfig");
    let server = kc
        .clusters
        .iter()
        .find(|c| c.name == context)
        .and_then(|c| c.cluster.as_ref())
        .and_then(|c| c.server.clone())
        .expect("the cluster's server");
    server
        .rsplit(':')
        .next()
        .expect("a port")
        .trim_end_matches('/')
        .to_string()
}

/// Compiles one C file of the repository into a static binary in `out_dir` (gcc -static: the
/// image it goes into has nothing else).
pub fn static_c_binary(source: &str, out_dir: &Path) -> PathBuf {
    let src = repo_root().join(source);
    let name = src.file_stem().expect("a file name").to_owned();
    let out = out_dir.join(name);
    let tmp = scratch(&out);
    let status = Command::new("gcc")
        .args(["-static", "-Os", "-Wall", "-Wextra", "-o"])
        .arg(&tmp)
        .arg(&src)
        .status()
        .unwrap_or_else(|e| panic!("cannot run gcc (apt-get install gcc libc6-dev): {e}"));
    assert!(status.success(), "gcc -static {} failed", src.display());
    settle(&tmp, &out);
    out
}

/// A path beside `out` that no other compile of this or another test uses: gcc writes its output
/// in place, so two tests compiling one workload at once (the tests of one file run in
/// parallel) had the one's import read the other's half-written file ("is not an executable
/// file"). Each compiles to its own path and renames it over `out`, which is atomic: a reader
/// sees a whole binary, the old or the new.
fn scratch(out: &Path) -> PathBuf {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let name = out.file_name().expect("a file name").to_string_lossy();
    out.with_file_name(format!(".{name}.{}.{n}", std::process::id()))
}

fn settle(tmp: &Path, out: &Path) {
    std::fs::rename(tmp, out)
        .unwrap_or_else(|e| panic!("rename {} to {}: {e}", tmp.display(), out.display()));
}

/// Packages `binary` FROM scratch (entrypoint, user 65532) and imports it into the node of
/// `cluster` as `reference`; pods name it with imagePullPolicy Never (or IfNotPresent).
pub async fn import_image(cluster: &'static str, reference: &str, binary: &Path) {
    let reference = reference.to_string();
    let binary = binary.to_str().expect("a UTF-8 path").to_string();
    tokio::task::spawn_blocking(move || bed_cmd(&["image", cluster, &reference, &binary]))
        .await
        .expect("bed task");
}

/// kubectl of the bed (the pinned version), on the bed's kubeconfig, in context `cluster`.
pub fn kubectl(cluster: &str) -> Command {
    let env = bed_cmd(&["env"]);
    let get = |var: &str| {
        env.lines()
            .find_map(|l| l.strip_prefix(&format!("export {var}=")))
            .map(|v| v.trim_matches('\'').to_string())
            .unwrap_or_else(|| panic!("testbed/bed env did not print {var}"))
    };
    let mut cmd = Command::new(Path::new(&get("XCC_TESTBED_BIN")).join("kubectl"));
    cmd.env("KUBECONFIG", get("XCC_TESTBED_KUBECONFIG"))
        .args(["--context", cluster]);
    cmd
}

/// The bed's workload images (testbed/workloads, C built here): `testbed.invalid/web:1` (an HTTP
/// server answering with its pod's name and cluster) and `testbed.invalid/load:1` (a client:
/// `get URL`, `run URL RATE`, `idle`), imported into every node of each of `clusters`. The
/// binaries are compiled once, before any import reads them (compiling them again per cluster
/// rewrote a file another cluster's import was reading: "is not an executable file").
pub const WEB_IMAGE: &str = "testbed.invalid/web:1";
pub const LOAD_IMAGE: &str = "testbed.invalid/load:1";

pub async fn workload_images(clusters: &[&'static str]) {
    let dir = repo_root().join("target/workloads");
    std::fs::create_dir_all(&dir).expect("target/workloads");
    let web = static_c_binary("testbed/workloads/web.c", &dir);
    // dynamic: its resolver (getaddrinfo, glibc's built-in DNS) comes with libc, which the image
    // takes along (`testbed/bed image` copies what ldd names)
    let load = c_binary("testbed/workloads/load.c", &dir, false);
    let imports = clusters.iter().map(|&cluster| {
        let (web, load) = (web.clone(), load.clone());
        async move {
            import_image(cluster, WEB_IMAGE, &web).await;
            import_image(cluster, LOAD_IMAGE, &load).await;
        }
    });
    futures::future::join_all(imports).await;
}

/// Compiles one C file of the repository into `out_dir` (static or not).
pub fn c_binary(source: &str, out_dir: &Path, static_: bool) -> PathBuf {
    if static_ {
        return static_c_binary(source, out_dir);
    }
    let src = repo_root().join(source);
    let out = out_dir.join(src.file_stem().expect("a file name"));
    let tmp = scratch(&out);
    let status = Command::new("gcc")
        .args(["-Os", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&tmp)
        .arg(&src)
        .status()
        .unwrap_or_else(|e| panic!("cannot run gcc: {e}"));
    assert!(status.success(), "gcc {} failed", src.display());
    settle(&tmp, &out);
    out
}

/// Waits until `cluster`'s CoreDNS (testbed/dns.sh) is available: it reads Services through the
/// `kubernetes` Service with in-cluster configuration, as pods do in production.
pub async fn wait_dns(cluster: &str) {
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
        Api::namespaced(super::client(cluster).await, "kube-system");
    super::eventually(
        &format!("CoreDNS of {cluster} to be available"),
        Duration::from_secs(180),
        || async {
            let d = deployments
                .get("coredns")
                .await
                .map_err(|e| e.to_string())?;
            let ready = d
                .status
                .as_ref()
                .and_then(|s| s.ready_replicas)
                .unwrap_or(0);
            if ready >= 1 {
                Ok(())
            } else {
                Err(format!("{:?}", d.status))
            }
        },
    )
    .await
}

/// `kubectl exec POD -- ARGS` in `cluster`/`ns`: Ok(stdout) or Err(stderr and stdout).
pub fn exec(cluster: &str, ns: &str, pod: &str, args: &[&str]) -> Result<String, String> {
    let out = kubectl(cluster)
        .args(["-n", ns, "exec", pod, "--"])
        .args(args)
        .output()
        .expect("run kubectl");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    if out.status.success() {
        Ok(stdout)
    } else {
        Err(format!("{}{stdout}", String::from_utf8_lossy(&out.stderr)))
    }
}

/// `cluster`'s API server as a pod reaches it (`https://10.250.C.1:<port>`): the address its
/// `kubernetes` EndpointSlice holds (the API server on the bed's network), not the bed's
/// loopback, which a pod cannot reach.
pub async fn pod_network_server(cluster: &str) -> String {
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    let slices: Api<EndpointSlice> = Api::namespaced(super::client(cluster).await, "default");
    let s = slices
        .get("kubernetes")
        .await
        .unwrap_or_else(|e| panic!("{cluster}'s kubernetes EndpointSlice: {e}"));
    let ip = s
        .endpoints
        .first()
        .and_then(|e| e.addresses.first())
        .cloned()
        .unwrap_or_else(|| panic!("{cluster}: an API server address"));
    let port = s
        .ports
        .as_ref()
        .and_then(|p| p.first())
        .and_then(|p| p.port)
        .unwrap_or_else(|| panic!("{cluster}: the API server's port"));
    format!("https://{ip}:{port}")
}

/// The Ready pod of helm release `release` among `pods` (its label
/// `app.kubernetes.io/instance`), once there is one, not being deleted: its name and address.
pub async fn release_pod(pods: &Api<Pod>, release: &str, wait: Duration) -> (String, String) {
    use kube::ResourceExt;
    let lp =
        kube::api::ListParams::default().labels(&format!("app.kubernetes.io/instance={release}"));
    super::eventually(&format!("a Ready pod of {release}"), wait, || async {
        let list = pods.list(&lp).await.map_err(|e| e.to_string())?;
        list.items
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .find(|p| pod_ready(p))
            .and_then(|p| {
                let ip = p.status.as_ref()?.pod_ip.clone()?;
                Some((p.name_any(), ip))
            })
            .ok_or_else(|| format!("{} pods, none Ready", list.items.len()))
    })
    .await
}

/// `path` of the admin server of the pod at `ip` (port `port`), read from the pod's address as
/// Prometheus or the kubelet would: the body of a 200, else an error.
pub async fn pod_admin_get(ip: &str, port: u16, path: &str) -> Result<String, String> {
    let (ip, at) = (ip.to_string(), path.to_string());
    tokio::task::spawn_blocking(move || {
        super::daemon::http_get_at(&ip, port, &at, Duration::from_secs(5))
    })
    .await
    .expect("admin server task")
    .and_then(|(code, body)| match code {
        200 => Ok(body),
        _ => Err(format!("{path}: {code}: {body}")),
    })
}
