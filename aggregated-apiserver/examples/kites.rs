//! A minimal aggregated API server: one kind, Kite (`toys.example.com/v1`, namespaced), kept in
//! memory, with everything `aggregated-apiserver` gives any kind: discovery, OpenAPI (`kubectl
//! explain`), Tables, watch, server-side apply, validation, admission, delegated authentication
//! (the front proxy's certificates, TokenReview) and authorization (SubjectAccessReview).
//!
//! ```sh
//! KITES_CERT=tls.crt KITES_KEY=tls.key KUBECONFIG=~/.kube/config \
//!     cargo run -p aggregated-apiserver --example kites -- 0.0.0.0:8443
//! ```
//!
//! The cluster (KUBECONFIG, or in-cluster) reviews tokens and authorizes requests, and its
//! `kube-system/extension-apiserver-authentication` ConfigMap says which front proxy to trust;
//! an APIService `v1.toys.example.com` whose caBundle signed the serving certificate sends it
//! kube-apiserver's requests.

use std::{net::TcpListener, path::PathBuf, time::Duration};

use aggregated_apiserver::{
    api::identity::Identity,
    error::FieldError,
    group::ApiGroup,
    net::client_tls,
    net::tls::ServingFiles,
    resource::ServedResource,
    resource::columns::{AGE_COLUMN, ColumnDefinition, age},
    server::{self, ShutdownTiming},
    store::StorageFactory,
};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// KiteSpec describes one kite.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "toys.example.com",
    version = "v1",
    kind = "Kite",
    plural = "kites",
    namespaced,
    shortname = "kt",
    derive = "PartialEq"
)]
#[serde(rename_all = "camelCase")]
pub struct KiteSpec {
    /// Colour of the kite's sail.
    pub colour: String,
    /// Length of its line in metres; more than 0.
    pub line_metres: f64,
}

impl ServedResource for Kite {
    type Spec = KiteSpec;
    const SINGULAR: &'static str = "kite";
    const CATEGORIES: &'static [&'static str] = &["toys"];
    const DESCRIPTION: &'static str = "Kite is a kite flown on a line.";

    fn columns() -> Vec<ColumnDefinition> {
        vec![
            ColumnDefinition::new("Colour", "string", "Colour of the kite's sail."),
            ColumnDefinition::new("Line", "number", "Length of its line in metres."),
            AGE_COLUMN,
        ]
    }

    fn cells(&self, now: jiff::Timestamp) -> Vec<Value> {
        vec![
            Value::from(self.spec.colour.clone()),
            Value::from(self.spec.line_metres),
            age(&self.metadata, now),
        ]
    }

    fn validate(&self) -> Vec<FieldError> {
        let line = self.spec.line_metres;
        if line.is_finite() && line > 0.0 {
            return Vec::new();
        }
        vec![FieldError::invalid(
            "spec.lineMetres",
            line,
            "must be greater than 0",
        )]
    }
}

/// The kinds served: one line each.
fn kinds(storage: &StorageFactory) -> ApiGroup {
    ApiGroup::new("toys.example.com").serve::<Kite>(storage.store())
}

fn env_path(name: &str) -> anyhow::Result<PathBuf> {
    std::env::var_os(name)
        .map(PathBuf::from)
        .ok_or_else(|| anyhow::anyhow!("{name} is not set"))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    tracing_subscriber::fmt().with_env_filter("info").init();
    let bind = std::env::args().nth(1).unwrap_or("127.0.0.1:8443".into());
    let listener = TcpListener::bind(&bind)?;
    let serving = ServingFiles {
        cert: env_path("KITES_CERT")?,
        key: env_path("KITES_KEY")?,
    };
    let cluster = client_tls::kube_client(kube::Config::infer().await?)?;
    let config = server::Config {
        cluster: Some(cluster),
        identity: Identity::new("kites-apiserver", env!("CARGO_PKG_VERSION")),
        ..server::Config::new(listener, serving, StorageFactory::memory(), kinds)
    };
    let timing = ShutdownTiming {
        delay: Duration::from_secs(1),
        grace: Duration::from_secs(5),
    };
    server::build(config)
        .await?
        .serve(timing, (std::time::Instant::now(), || {}))
        .await
}
