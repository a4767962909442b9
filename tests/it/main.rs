//! The integration tests, one crate (one link) with shared helpers in [`common`]: each module
//! drives the real server a different way.
//!
//! - `router`, `hardening`, `properties`, `third_kind`: the whole HTTP surface with `oneshot`
//!   (no socket), including kinds declared in the test crate alone (`barn` is one, in its file).
//! - `e2e_tls`, `security`: over the real TLS listener with kube::Client, kubectl and a raw
//!   HTTPS client replaying the aggregator's requests; `adding_a_kind`: Barn added to the
//!   binary's kinds with one line. Their servers start as the binary does (`server::build`).
//! - `farmpods`: the FarmPod cache fed by a fake kube-apiserver; `store_conformance`: every
//!   store against one contract.
//! - `binary`: the shipped binary (signals, restarts); `manifests`, `openapi_snapshot`:
//!   generated artefacts against the committed copies; `house`: source files short enough to
//!   read.
//! - `e2e_cluster`: through a real kube-apiserver when `FARM_E2E_KUBECONFIG` is set;
//!   `e2e_node`: the image and manifests installed on a real node when that cluster has one;
//!   `e2e_helm`: the Helm chart installed there by a real helm.
//! - `helm`: the chart as helm renders it, against the kustomize install it must equal.

mod barn;
mod common;
mod compression;
mod placard;

mod adding_a_kind;
mod adding_a_view;
mod admission;
mod apply;
mod audit;
mod binary;
mod bodies;
mod deletion;
mod differential;
mod docs;
mod docs_sessions;
mod e2e_cluster;
mod e2e_example;
mod e2e_helm;
mod e2e_node;
mod e2e_operator;
mod e2e_tls;
mod etcd;
mod farmpods;
mod hardening;
mod helm;
mod house;
mod inflight;
mod manifests;
mod openapi_snapshot;
mod properties;
mod protocols;
mod router;
mod security;
mod slow_watchers;
mod store_conformance;
mod third_kind;
mod traces;
mod versions;
