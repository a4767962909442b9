#![forbid(unsafe_code)]
#![warn(missing_docs)]
//! aggregated-apiserver: the machinery of a Kubernetes aggregated API server, for whatever kinds
//! its user gives it.
//!
//! A kind is a type with kube's `#[derive(CustomResource)]` and an [`resource::ServedResource`]
//! (its Table columns, validation and strategy hooks); [`server::build`] serves the kinds
//! [`server::Config::kinds`] lists, one line each, with discovery, OpenAPI, Tables, watch,
//! server-side apply, admission, audit, delegated authentication and authorization:
//!
//! ```no_run
//! use aggregated_apiserver::{
//!     group::ApiGroup,
//!     net::tls::ServingFiles,
//!     resource::{
//!         ServedResource,
//!         columns::{AGE_COLUMN, ColumnDefinition, age},
//!     },
//!     server::{self, ShutdownTiming},
//!     store::StorageFactory,
//! };
//!
//! /// KiteSpec describes one kite.
//! #[derive(kube::CustomResource, Clone, Debug, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
//! #[kube(group = "toys.example.com", version = "v1", kind = "Kite", namespaced)]
//! pub struct KiteSpec {
//!     /// Colour of the kite's sail.
//!     pub colour: String,
//! }
//!
//! impl ServedResource for Kite {
//!     type Spec = KiteSpec;
//!     const SINGULAR: &'static str = "kite";
//!     const CATEGORIES: &'static [&'static str] = &[];
//!     const DESCRIPTION: &'static str = "Kite is a kite.";
//!
//!     fn columns() -> Vec<ColumnDefinition> {
//!         vec![ColumnDefinition::new("Colour", "string", "Its sail's colour."), AGE_COLUMN]
//!     }
//!
//!     fn cells(&self, now: jiff::Timestamp) -> Vec<serde_json::Value> {
//!         vec![self.spec.colour.clone().into(), age(&self.metadata, now)]
//!     }
//! }
//!
//! #[tokio::main]
//! async fn main() -> anyhow::Result<()> {
//!     let _ = rustls::crypto::ring::default_provider().install_default();
//!     let kinds = |storage: &StorageFactory| {
//!         ApiGroup::new("toys.example.com").serve::<Kite>(storage.store())
//!     };
//!     let listener = std::net::TcpListener::bind("127.0.0.1:8443")?;
//!     let serving = ServingFiles { cert: "tls.crt".into(), key: "tls.key".into() };
//!     let config = server::Config {
//!         // The cluster reviews tokens and authorizes; without one, only client certificates
//!         // in `system:masters` get in.
//!         cluster: Some(kube::Client::try_default().await?),
//!         ..server::Config::new(listener, serving, StorageFactory::memory(), kinds)
//!     };
//!     let timing = ShutdownTiming { delay: Default::default(), grace: Default::default() };
//!     server::build(config).await?.serve(timing, (std::time::Instant::now(), || {})).await
//! }
//! ```
//!
//! `examples/kites.rs` is that server whole (validation, settings from the environment); the
//! workspace's end-to-end tests register it through a real kube-apiserver and use it with
//! kubectl.
//!
//! The crate is laid out by layer, each module using only those of the layers before it:
//! 1. [`error`], [`json_patch`], [`net`] (TLS, connections) and [`request_info`];
//! 2. what a kind is ([`resource`]) and how operators watch the server ([`observe`]: health,
//!    metrics, traces, panics);
//! 3. where objects are kept ([`store`]: in memory, on etcd, or a view of the cluster's
//!    objects) and who is asking ([`auth`]);
//! 4. how objects go out on the wire (`render`) and what is recorded of each request
//!    ([`audit`]);
//! 5. [`admission`], and what the server says of its API ([`api`]);
//! 6. the REST verbs ([`rest`]); 7. the group of kinds served ([`group`]); 8. the [`server`].
//!
//! A request goes: [`net::tls`] (handshake, client certificate) → [`server::app`] (probes go
//! straight to `observe::health`; everything else through the edge: [`request_info`],
//! [`auth`] (authentication, SubjectAccessReview), metrics, [`audit`], the request log) →
//! [`rest`] when the path is a resource endpoint (the verbs of one kind, written once; writes
//! through [`admission`], the cluster's webhooks), else the axum router for
//! `api::discovery`, [`api::openapi`], /version and /metrics → [`store`] (in memory by
//! default). `render` shapes responses; [`error`] turns every failure into a `meta/v1 Status`.
//!
//! Start-up is one function, [`server::build`], called by a server's `main` (after its flags)
//! and by its tests alike: [`server::Config::kinds`] gives the API group
//! ([`group::ApiGroup`]) and its kinds ([`resource::ServedResource`], a view of the cluster's
//! objects being a [`store::View`]), each on the store [`store::StorageFactory`] makes for it.
//!
//! The `_sync` convention: a method so named answers without waiting when all it
//! needs is in memory, and returns None when only its async counterpart can answer
//! ([`store::Store::get_sync`], [`auth::Auth::authorize_sync`]). A cached GET through the
//! aggregator is then answered without a boxed future. [`rest::Target::call_sync`] answers a
//! GET of one object at once from such a store, or else with the store's own read as the one
//! future (a consistent read on etcd), past the general path.

// Every layer's.
pub mod error;
pub mod json_patch;
pub mod observe;

// Kinds, storage, rendering.
pub(crate) mod render;
pub mod resource;
pub mod store;

// The REST verbs and what they serve.
pub mod admission;
pub mod api;
pub mod group;
pub mod rest;

// The server around them.
pub mod audit;
pub mod auth;
pub mod net;
pub mod request_info;
pub mod server;

#[cfg(test)]
mod testing;

pub use error::{Error, Result};
