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
//!     columns::{AGE_COLUMN, ColumnDefinition, age},
//!     group::ApiGroup,
//!     resource::ServedResource,
//!     server::{self, ShutdownTiming},
//!     store::StorageFactory,
//!     tls::ServingFiles,
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
//! A request goes: [`tls`] (handshake, client certificate) → [`server::app`] (probes go
//! straight to [`health`]; everything else through the edge: [`request_info`], [`auth`]
//! (authentication, SubjectAccessReview), metrics, the request log) → [`rest`] when the path is
//! a resource endpoint (the verbs of one kind, written once; writes through [`admission`],
//! the cluster's webhooks), else the axum router for
//! [`discovery`], [`openapi`], /version and /metrics → [`store`] (in memory by default).
//! [`table`], [`watch`] and [`negotiate`] shape responses, [`compression`] gzips large ones;
//! [`error`] turns every failure into a `meta/v1 Status`.
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

pub mod admission;
pub mod audit;
pub mod auth;
pub mod client_tls;
pub mod columns;
pub mod compression;
pub mod conditional;
pub mod connection;
pub mod discovery;
pub mod error;
pub mod group;
pub mod health;
pub mod identity;
pub mod informer;
pub mod json_patch;
pub mod list_body;
pub mod list_buffer;
pub mod metrics;
pub mod namespaces;
pub mod negotiate;
pub mod openapi;
pub mod recovery;
pub mod request_info;
pub mod resource;
pub mod rest;
pub mod selector;
pub mod server;
pub mod store;
pub mod table;
pub mod telemetry;
#[cfg(test)]
mod testing;
pub mod tls;
pub mod validation;
pub mod watch;

pub use error::{Error, Result};
