//! The test bed's command-line tools (helm, kubectl from testbed/build.sh's cache) and the
//! machine's (promtool, prometheus), run as a user would.
use std::path::{Path, PathBuf};
use std::process::Command;

use super::{bed_cmd, repo_root};

/// A binary of the test bed (`XCC_TESTBED_BIN`): helm, kubectl, ...
pub fn tool(name: &str) -> PathBuf {
    let env = bed_cmd(&["env"]);
    let bin = env
        .lines()
        .find_map(|l| l.strip_prefix("export XCC_TESTBED_BIN="))
        .map(|v| v.trim_matches('\'').to_string())
        .expect("bed env names the binaries");
    Path::new(&bin).join(name)
}

/// A binary on PATH; panics (the test fails, it is not skipped) when it is missing.
pub fn on_path(name: &str, install: &str) -> PathBuf {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!("{name} is not on PATH: {install} (scripts/test and .ci/run install it)")
        })
}

/// Runs a command to success and returns its standard output; panics with its output otherwise.
pub fn run(cmd: &mut Command) -> String {
    let out = cmd.output().expect("run a command");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{cmd:?} failed:\n{text}");
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// helm of the test bed, run from the repository root against `kubeconfig`.
pub fn helm(kubeconfig: &Path) -> Command {
    let mut c = Command::new(tool("helm"));
    c.current_dir(repo_root())
        .env("KUBECONFIG", kubeconfig)
        .env("HELM_CACHE_HOME", std::env::temp_dir().join("xcc-helm"));
    c
}

/// The chart, from the repository root.
pub const CHART: &str = "charts/cross-cluster-controller";

/// `helm template` of the chart as release `cross-cluster-controller` in `namespace` with `sets`:
/// the rendered text, or helm's error.
pub fn template_text(kubeconfig: &Path, namespace: &str, sets: &[&str]) -> Result<String, String> {
    let mut cmd = helm(kubeconfig);
    cmd.args([
        "template",
        "cross-cluster-controller",
        CHART,
        "--namespace",
        namespace,
        "--kube-version",
        "1.34.4",
    ]);
    for set in sets {
        cmd.args(["--set", set]);
    }
    let out = cmd.output().expect("run helm");
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).to_string());
    }
    Ok(String::from_utf8_lossy(&out.stdout).to_string())
}

/// The documents of a multi-document YAML text.
pub fn documents(text: &str) -> Vec<serde_yaml::Value> {
    serde_yaml::Deserializer::from_str(text)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .filter(|v: &serde_yaml::Value| !v.is_null())
        .collect()
}

/// `helm template` of the chart in namespace fair-system with `sets`: its documents, or helm's
/// error.
pub fn template(kubeconfig: &Path, sets: &[&str]) -> Result<Vec<serde_yaml::Value>, String> {
    template_text(kubeconfig, "fair-system", sets).map(|t| documents(&t))
}
