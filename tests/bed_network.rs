//! The bed's pod network stays in the bed's own network namespaces (testbed/net.sh): a bed of
//! its own (a cluster with a node: bed namespace, node namespace, CNI bridge, kube-proxy's
//! nftables, CoreDNS) leaves the machine's network namespace exactly as it found it: its links,
//! addresses, routes and netfilter rules are the same while the bed runs and after it is gone.
mod support;

use std::process::Command;
use std::time::Duration;

use support::node::pod_ready;
use support::{eventually, repo_root};

/// What the machine's namespace holds, read (never changed) from inside it: the namespace the
/// shared bed was made from (`outer-netns` in its directory; the tests run in the bed's).
fn host_network(outer: &std::path::Path) -> String {
    // every reader must work (set -e); the saves' comment lines hold a time stamp
    let script = "set -e; ip -d -br link; ip -br addr; ip route show table all; \
                  ip -6 route show table all; ip rule; nft -s list ruleset; \
                  iptables-save | sed '/^#/d'; ip6tables-save | sed '/^#/d'";
    let out = Command::new("nsenter")
        .arg(format!("--net={}", outer.display()))
        .args(["--", "sh", "-c", script])
        .output()
        .expect("nsenter the machine's network namespace");
    assert!(
        out.status.success(),
        "reading the machine's network failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// testbed/bed with its state in `dir`: a bed apart from the one the other tests share.
fn own_bed(dir: &std::path::Path, args: &[&str]) {
    let out = Command::new("bash")
        .arg(repo_root().join("testbed/bed"))
        .args(args)
        .env("XCC_TESTBED_DIR", dir)
        .output()
        .expect("run testbed/bed");
    assert!(
        out.status.success(),
        "testbed/bed {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bed_with_a_pod_network_leaves_the_machines_network_namespace_untouched() {
    // the bed every other test shares must already run in a namespace of its own
    let outer = support::bed().await.dir.join("outer-netns");
    let before = host_network(&outer);
    let dir = tempfile::Builder::new()
        .prefix("xcc-bed-network")
        .tempdir_in(repo_root().join("target"))
        .expect("tempdir");
    let guard = Down(Some(dir.path().to_path_buf()));
    own_bed(dir.path(), &["node", "isle"]);
    // a pod (not host-network) on the pod network, so a veth, an address and routes exist
    let kubectl = |args: &[&str]| {
        let env = Command::new("bash")
            .arg(repo_root().join("testbed/bed"))
            .arg("env")
            .env("XCC_TESTBED_DIR", dir.path())
            .output()
            .expect("bed env");
        let env = String::from_utf8_lossy(&env.stdout).to_string();
        let bin = env
            .lines()
            .find_map(|l| l.strip_prefix("export XCC_TESTBED_BIN="))
            .expect("XCC_TESTBED_BIN")
            .trim_matches('\'')
            .to_string();
        let out = Command::new("bash")
            .arg(repo_root().join("testbed/bed"))
            .args(["exec", &format!("{bin}/kubectl"), "--context", "isle"])
            .args(args)
            .env("XCC_TESTBED_DIR", dir.path())
            .env("KUBECONFIG", dir.path().join("kubeconfig"))
            .output()
            .expect("kubectl");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).to_string(),
        )
    };
    eventually(
        "CoreDNS (an ordinary pod) to be Ready on the isle's node",
        Duration::from_secs(180),
        || async {
            let (ok, out) = kubectl(&[
                "-n",
                "kube-system",
                "get",
                "pods",
                "-l",
                "k8s-app=kube-dns",
                "-o",
                "json",
            ]);
            let list: serde_json::Value =
                serde_json::from_str(&out).map_err(|e| format!("{ok} {e}: {out}"))?;
            let pods: Vec<k8s_openapi::api::core::v1::Pod> =
                serde_json::from_value(list["items"].clone()).map_err(|e| e.to_string())?;
            match pods.iter().find(|p| pod_ready(p)) {
                Some(p) => Ok(p
                    .status
                    .as_ref()
                    .and_then(|s| s.pod_ip.clone())
                    .unwrap_or_default()),
                None => Err(out),
            }
        },
    )
    .await;
    assert_eq!(
        host_network(&outer),
        before,
        "the machine's network changed while a bed ran"
    );
    own_bed(dir.path(), &["down"]);
    drop(guard);
    assert_eq!(
        host_network(&outer),
        before,
        "the machine's network changed after a bed"
    );
}

/// Takes the bed in `dir` down if the test ends early.
struct Down(Option<std::path::PathBuf>);
impl Drop for Down {
    fn drop(&mut self) {
        if let Some(dir) = self.0.take()
            && dir.join("clusters").exists()
        {
            let _ = Command::new("bash")
                .arg(repo_root().join("testbed/bed"))
                .arg("down")
                .env("XCC_TESTBED_DIR", &dir)
                .status();
        }
    }
}
