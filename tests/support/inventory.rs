//! The Cluster Inventory API (ClusterProfile, KEP-4322, `multicluster.x-k8s.io/v1alpha1`) in
//! tests: testbed/inventory.sh's folder (the upstream ClusterProfile CRD, the reference
//! `secretreader` exec credential plugin built from it, upstream's LICENSE), and the CRD on a
//! cluster of the bed.
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

use super::repo_root;

/// The CRD's file in [`folder`], as upstream names it.
pub const CRD_FILE: &str = "multicluster.x-k8s.io_clusterprofiles.yaml";

static FOLDER: OnceLock<PathBuf> = OnceLock::new();

/// The folder testbed/inventory.sh prints, found with `--offline`: tests run inside the bed's
/// network namespace, where nothing is fetched or built (scripts/test runs the script outside
/// first). Panics with the script's own line when it fails: never a skip.
pub fn folder() -> PathBuf {
    FOLDER
        .get_or_init(|| {
            let script = repo_root().join("testbed/inventory.sh");
            let out = Command::new("bash")
                .arg(&script)
                .arg("--offline")
                .output()
                .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
            assert!(
                out.status.success(),
                "testbed/inventory.sh --offline failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
            let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
            assert!(
                dir.join(CRD_FILE).is_file(),
                "testbed/inventory.sh printed {}, which holds no {CRD_FILE}",
                dir.display()
            );
            dir
        })
        .clone()
}

/// The reference `secretreader` exec credential plugin, built from the pinned snapshot.
pub fn plugin() -> PathBuf {
    let path = folder().join("secretreader-plugin");
    assert!(path.is_file(), "no {}", path.display());
    path
}

/// Applies the ClusterProfile CRD to `context`, a cluster of the bed (server-side apply: running
/// it again changes nothing), and waits until the API server calls it Established.
pub async fn install_crd(context: &str) {
    let dir = tokio::task::spawn_blocking(folder)
        .await
        .expect("inventory folder task");
    let path = dir.join(CRD_FILE);
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let crd: CustomResourceDefinition =
        serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    super::objects::apply_crd(context, &crd).await;
}
