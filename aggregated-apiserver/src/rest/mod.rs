//! The REST verbs of one kind, written once for every
//! [`ServedResource`](crate::resource::ServedResource): get, list, watch, create, update,
//! patch, delete and deletecollection, with kube-apiserver's query parameters, content
//! negotiation, status codes and messages.
//!
//! Laid out as k8s.io/apiserver lays out the same work: [`route`] finds the kind, namespace
//! and name from the path (its `endpoints/installer`) and [`dispatch`] the verb; [`options`]
//! reads the query (ListOptions, WatchOptions, DeleteOptions); [`read`], [`write`](mod@write)
//! and [`delete`](mod@delete) are the verbs (`endpoints/handlers`). Every write ends in one
//! pipeline (the kind's [`strategy`], managed fields, [`admit`]ssion, the store), retried by
//! [`guaranteed`] as GuaranteedUpdate retries it; [`patch`] applies patches, and [`response`]
//! shapes what goes back. [`context`] is what every kind's handlers share.

pub mod admit;
pub mod body;
pub mod context;
pub mod decode;
pub mod delete;
pub mod dispatch;
pub mod field_managers;
pub mod guaranteed;
pub(crate) mod kind_api;
pub mod lifecycle;
pub mod options;
pub mod partial_json;
pub mod patch;
pub(crate) mod pipeline;
pub mod read;
pub mod response;
pub mod route;
pub mod strategy;
pub mod structural;
pub mod write;

pub use context::{MAX_BODY_BYTES, RestContext, RestSettings};
pub use response::ItemResponse;
pub use route::{Endpoints, Route, Target};
