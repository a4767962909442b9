#![forbid(unsafe_code)]
#![warn(missing_docs)]
//! aggregated-apiserver: the machinery of a Kubernetes aggregated API server, for whatever kinds
//! its user gives it.
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
//! The `_sync` (and `_now`) convention: a method so named answers without waiting when all it
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
pub mod json_patch;
pub mod list_body;
pub mod list_buffer;
pub mod metrics;
pub mod namespaces;
pub mod negotiate;
pub mod openapi;
pub mod recovery;
pub mod reflect;
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
