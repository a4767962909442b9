#![forbid(unsafe_code)]
#![warn(missing_docs)]
//! farm-apiserver: a Kubernetes aggregated API server for `farm.example.com`, built on
//! [`aggregated_apiserver`], which serves whatever kinds it is given. This crate holds only what
//! is farm-apiserver's own:
//!
//! - [`resources`]: the kinds (Llama at v1 and v1alpha, FarmPod, a view of the cluster's Pods),
//!   each in its own file, and [`resources::register`], one line per kind;
//! - [`config`]: the flags (every one with a `FARM_…` variable) and what they start, ending in
//!   [`aggregated_apiserver::server::build`];
//! - [`certs`]: the development certificates' names and `farm-apiserver certs`.

pub mod certs;
pub mod config;
pub mod resources;
