//! A cluster of the bed with one node (`testbed/bed node NAME`, see testbed/node.sh): a kubelet
//! and containerd whose pods use the host network (address 127.0.0.1), and images built here
//! from a binary (`testbed/bed image`), since there is no registry.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::{bed_cmd, repo_root};

/// Brings up cluster `name` with its node (idempotent, locked: every test of a run shares it) and
/// waits until the node is Ready; fails the test with the bed's own error text otherwise.
pub async fn node_cluster(name: &'static str) {
    tokio::task::spawn_blocking(move || bed_cmd(&["node", name]))
        .await
        .expect("bed task");
}

/// The node's name in cluster `cluster`.
pub fn node_name(cluster: &str) -> String {
    format!("{cluster}-node")
}

/// Compiles one C file of the repository into a static binary in `out_dir` (gcc -static: the
/// image it goes into has nothing else).
pub fn static_c_binary(source: &str, out_dir: &Path) -> PathBuf {
    let src = repo_root().join(source);
    let name = src.file_stem().expect("a file name").to_owned();
    let out = out_dir.join(name);
    let status = Command::new("gcc")
        .args(["-static", "-Os", "-Wall", "-Wextra", "-o"])
        .arg(&out)
        .arg(&src)
        .status()
        .unwrap_or_else(|e| panic!("cannot run gcc (apt-get install gcc libc6-dev): {e}"));
    assert!(status.success(), "gcc -static {} failed", src.display());
    out
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
