//! The image, built here with buildah from the project's own Dockerfile (scripts/build-image:
//! the runtime base assembled from Debian 12 packages, the builder stage swapped for the host's
//! release binary), checked for what distroless `cc-debian12:nonroot` promises: the binary runs
//! on the image's own glibc as user 65532, CA certificates are there, and there is no shell.
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn work() -> PathBuf {
    repo().join("target/image")
}

fn buildah(args: &[&str]) -> String {
    let w = work();
    let out = Command::new("buildah")
        .args(["--storage-driver", "vfs", "--root"])
        .arg(w.join("storage"))
        .arg("--runroot")
        .arg(w.join("run"))
        .args(args)
        .output()
        .expect("buildah (scripts/test and .ci/run install it)");
    assert!(
        out.status.success(),
        "buildah {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn the_image_builds_here_and_runs_as_65532_on_its_own_glibc_without_a_shell() {
    let out = Command::new("bash")
        .arg(repo().join("scripts/build-image"))
        .output()
        .expect("run scripts/build-image");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "build-image failed: {text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let archive = work().join("cross-cluster-controller.oci.tar");
    let size = std::fs::metadata(&archive).expect("the OCI archive").len();
    eprintln!("{text}");
    assert!(size > 1_000_000, "archive of {size} bytes");

    let image = "localhost/cross-cluster-controller:dev";
    let inspect = buildah(&["inspect", "--type", "image", image]);
    let inspect: serde_json::Value = serde_json::from_str(&inspect).expect("buildah inspect");
    let config = &inspect["OCIv1"]["config"];
    assert_eq!(config["User"], "65532:65532");
    assert_eq!(
        config["Entrypoint"],
        serde_json::json!(["/usr/local/bin/cross-cluster-controller"])
    );
    assert!(
        config["Env"]
            .as_array()
            .is_some_and(|e| e.iter().any(|v| v == "ENV=production")),
        "{config}"
    );

    let c = buildah(&["from", "--pull-never", image]);
    let root = PathBuf::from(buildah(&["mount", &c]));
    let check = || {
        for sh in [
            "bin/sh",
            "bin/bash",
            "bin/dash",
            "usr/bin/sh",
            "usr/bin/bash",
        ] {
            assert!(!root.join(sh).exists(), "a shell in the image: {sh}");
        }
        let bundle = std::fs::read_to_string(root.join("etc/ssl/certs/ca-certificates.crt"))
            .expect("CA bundle");
        assert!(bundle.matches("BEGIN CERTIFICATE").count() > 100);
        let passwd = std::fs::read_to_string(root.join("etc/passwd")).expect("passwd");
        assert!(passwd.contains("nonroot:x:65532:65532:"), "{passwd}");
        // the binary on the image's own libraries, as the unprivileged user
        let run = Command::new("chroot")
            .arg("--userspec=65532:65532")
            .arg(&root)
            .args(["/usr/local/bin/cross-cluster-controller", "--version"])
            .output()
            .expect("chroot");
        assert!(
            run.status.success(),
            "{}",
            String::from_utf8_lossy(&run.stderr)
        );
        assert!(String::from_utf8_lossy(&run.stdout).starts_with("cross-cluster-controller "));
    };
    let checked = std::panic::catch_unwind(check);
    buildah(&["umount", &c]);
    buildah(&["rm", &c]);
    if let Err(p) = checked {
        std::panic::resume_unwind(p);
    }
}
