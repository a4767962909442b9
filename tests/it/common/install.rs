//! The shipped manifests as a user installs them: copied with their kustomizations, the
//! certificates written by `farm-apiserver certs`, then rendered by the kustomize built into
//! kubectl.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use serde_json::Value;

pub struct Rendered {
    /// Holds `manifests/` (with `manifests/certs/` written).
    pub dir: tempfile::TempDir,
    pub objects: Vec<Value>,
}

impl Rendered {
    pub fn manifests(&self) -> PathBuf {
        self.dir.path().join("manifests")
    }

    pub fn certs(&self) -> PathBuf {
        self.manifests().join("certs")
    }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            if entry.file_name() != "certs" {
                copy_dir(&entry.path(), &target);
            }
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// Whether kubectl can be run at all.
/// Whether kubectl is on PATH. Where `FARM_REQUIRE_KUBECTL` is set (CI), its absence fails
/// the test instead of skipping it.
pub fn has_kubectl() -> bool {
    let found = Command::new("kubectl")
        .args(["version", "--client"])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        found || std::env::var_os("FARM_REQUIRE_KUBECTL").is_none(),
        "kubectl is not on PATH and FARM_REQUIRE_KUBECTL is set"
    );
    found
}

/// Runs `farm-apiserver certs` into a copy of `manifests/` and renders `kubectl kustomize`
/// of it (or of `overlay` inside it).
pub fn render(overlay: Option<&str>) -> Rendered {
    let dir = tempfile::tempdir().unwrap();
    let manifests = dir.path().join("manifests");
    copy_dir(
        Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/manifests")),
        &manifests,
    );
    let certs = Command::new(env!("CARGO_BIN_EXE_farm-apiserver"))
        .args(["certs", "--namespace", "farm-system", "--out"])
        .arg(manifests.join("certs"))
        .output()
        .expect("run farm-apiserver certs");
    assert!(
        certs.status.success(),
        "{}",
        String::from_utf8_lossy(&certs.stderr)
    );
    let target = overlay.map_or(manifests.clone(), |o| manifests.join(o));
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(&target)
        .output()
        .expect("kubectl kustomize");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let objects = text
        .split("\n---\n")
        .map(|doc| serde_saphyr::from_str::<Value>(doc).expect("YAML document"))
        .collect();
    Rendered { dir, objects }
}

/// helm: on PATH, else where `scripts/install-helm.sh` puts it. None (the caller prints
/// SKIPPED) without one, unless `FARM_REQUIRE_HELM` is set (CI), where its absence fails.
pub fn helm() -> Option<PathBuf> {
    let installed = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/helm/bin/helm");
    let found = [PathBuf::from("helm"), installed].into_iter().find(|helm| {
        Command::new(helm)
            .args(["version", "--short"])
            .output()
            .is_ok_and(|o| o.status.success())
    });
    assert!(
        found.is_some() || std::env::var_os("FARM_REQUIRE_HELM").is_none(),
        "helm is neither on PATH nor in target/helm/bin (scripts/install-helm.sh) and \
         FARM_REQUIRE_HELM is set"
    );
    found
}

/// YAML documents as kube-apiserver reads them: YAML 1.1, where `0440` is octal.
pub fn yaml_documents(text: &str) -> Vec<Value> {
    let options = serde_saphyr::options! { legacy_octal_numbers: true };
    serde_saphyr::from_multiple_with_options::<Value>(text, options)
        .expect("YAML documents")
        .into_iter()
        .filter(|doc| !doc.is_null())
        .collect()
}
