//! Rendering: how an object, a list or a watch goes out on the wire, as kube-apiserver writes
//! them. `negotiate` picks the form from `Accept` (JSON, a `table`, PartialObjectMetadata,
//! a discovery document); `list_body` writes a list while the store lends its objects, into
//! a `list_buffer`; `watch` frames events; `conditional` serves documents computed once
//! with their ETag; `compression` gzips large responses.

pub(crate) mod compression;
pub(crate) mod conditional;
pub(crate) mod list_body;
pub(crate) mod list_buffer;
pub(crate) mod negotiate;
pub(crate) mod table;
pub(crate) mod watch;
