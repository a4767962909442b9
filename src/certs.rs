//! farm-apiserver's certificates: the names its development certificates carry, and
//! `farm-apiserver certs`, the CA, serving certificate and APIService patch an install with
//! kustomize trusts.

use std::path::Path;

use aggregated_apiserver::net::tls::{self, DevNames};
use anyhow::{Context, Result};

/// The user the development kubeconfig authenticates as.
pub const DEV_USER: &str = "farm-dev-admin";

/// Names the development serving certificate is valid for: local use and the in-cluster
/// Service.
pub const DEV_SANS: &[&str] = &[
    "localhost",
    "127.0.0.1",
    "::1",
    "farm-apiserver",
    "farm-apiserver.farm-system",
    "farm-apiserver.farm-system.svc",
    "farm-apiserver.farm-system.svc.cluster.local",
];

/// What the development certificates of `--cert-dir` name.
pub const DEV: DevNames = DevNames {
    sans: DEV_SANS,
    user: DEV_USER,
    context: "farm-dev",
};

/// The APIServices that register this server (`<version>.<group>`), one per version served.
pub const API_SERVICES: [&str; 2] = ["v1.farm.example.com", "v1alpha.farm.example.com"];
/// The patch file that gives each of [`API_SERVICES`] its `caBundle`.
pub const CA_BUNDLE_PATCH: &str = "apiservice-cabundle.yaml";

/// `farm-apiserver certs`: what `kubectl apply -k manifests/` needs to trust the server, written
/// to `out`: a CA (`ca.crt`, `ca.key`; kept when present, so the APIService's caBundle stays
/// the same on renewal), a serving certificate (`tls.crt`, `tls.key`, issued anew on every run)
/// for the names the aggregator dials (`<service>.<namespace>.svc` and its shorter and longer
/// forms), and [`CA_BUNDLE_PATCH`], a kustomize patch setting the APIService's caBundle.
pub fn write_install_certificates(out: &Path, service: &str, namespace: &str) -> Result<()> {
    use base64::Engine;
    let ca = tls::DevCa::load_or_create_named(out, "farm-apiserver CA")?;
    let names = [
        service.to_owned(),
        format!("{service}.{namespace}"),
        format!("{service}.{namespace}.svc"),
        format!("{service}.{namespace}.svc.cluster.local"),
    ];
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let (cert, key) = ca.issue_serving(&names)?;
    tls::write_private(&out.join(tls::TLS_KEY), &key)?;
    let cert_path = out.join(tls::TLS_CERT);
    std::fs::write(&cert_path, cert).with_context(|| format!("writing {}", cert_path.display()))?;
    let bundle = base64::engine::general_purpose::STANDARD.encode(&ca.cert_pem);
    let mut patch = String::from(
        "# Written by `farm-apiserver certs`: the APIServices trust the CA in ca.crt.\n",
    );
    for (i, name) in API_SERVICES.iter().enumerate() {
        if i > 0 {
            patch.push_str("---\n");
        }
        patch.push_str(&format!(
            "apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata:
  name: {name}
spec:
  caBundle: {bundle}
"
        ));
    }
    let patch_path = out.join(CA_BUNDLE_PATCH);
    std::fs::write(&patch_path, patch)
        .with_context(|| format!("writing {}", patch_path.display()))?;
    Ok(())
}
