//! The REST verbs of one kind, written once for every
//! [`ServedResource`](crate::resource::ServedResource): get, list, watch, create, update,
//! patch, delete and deletecollection, with kube-apiserver's query parameters, content
//! negotiation, status codes and messages.
//!
//! Laid out as k8s.io/apiserver lays out the same work: `route` finds the kind, namespace and
//! name from the path (its `endpoints/installer`) and `dispatch` the verb; `options` reads the
//! query (ListOptions, WatchOptions, DeleteOptions); `read`, `write` and `delete` are the verbs
//! (`endpoints/handlers`). Every write ends in one `pipeline` (the kind's `strategy`, managed
//! fields, admission through `admit`, the store), retried by `guaranteed` as GuaranteedUpdate
//! retries it; `patch` applies patches, and `response` shapes what goes back. `context` is
//! what every kind's handlers share.

pub(crate) mod admit;
pub(crate) mod body;
pub(crate) mod context;
pub(crate) mod decode;
pub(crate) mod delete;
pub(crate) mod dispatch;
pub(crate) mod field_managers;
pub(crate) mod guaranteed;
pub(crate) mod kind_api;
pub(crate) mod lifecycle;
pub(crate) mod options;
pub(crate) mod partial_json;
pub(crate) mod patch;
pub(crate) mod pipeline;
pub(crate) mod read;
pub(crate) mod response;
pub(crate) mod route;
pub(crate) mod strategy;
pub(crate) mod structural;
pub(crate) mod write;

pub use body::MAX_BODY_BYTES;
pub use context::{RestContext, RestSettings};
pub use response::ItemResponse;
pub use route::{Endpoints, Route, Target};
