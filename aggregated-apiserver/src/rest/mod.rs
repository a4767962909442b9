//! The REST verbs of one kind, written once for every [`ServedResource`]: get, list, watch,
//! create, update, patch, delete and deletecollection, with kube-apiserver's query parameters,
//! content negotiation, status codes and messages.
//!
//! Laid out as k8s.io/apiserver lays out the same work: [`route`] finds the kind and verb from
//! the path (its `endpoints/installer`), [`options`] reads the query (ListOptions,
//! WatchOptions, DeleteOptions), [`read`] and [`write`](mod@write) are the verbs
//! (`endpoints/handlers`), [`strategy`] is what a create or update does to an object before it
//! is stored (`registry/rest`), [`patch`] applies patches, and [`response`] shapes what goes
//! back.

pub mod admit;
pub mod body;
pub mod decode;
pub mod delete;
pub mod dispatch;
pub mod field_managers;
pub mod guaranteed;
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

use std::{sync::Arc, time::Duration};

use tokio_util::sync::CancellationToken;

use crate::{
    error::{Error, Result},
    metrics::Metrics,
    resource::ServedResource,
    store::{Store, WritableStore},
};

pub use response::ItemResponse;
pub use route::{Endpoints, Route, Target};

/// kube-apiserver's `--max-request-body-bytes` default for JSON bodies (3 MiB).
pub const MAX_BODY_BYTES: usize = 3 * 1024 * 1024;

/// Knobs of the REST layer shared by every kind.
#[derive(Debug, Clone)]
pub struct RestSettings {
    /// Watches without `timeoutSeconds` end after a random time in [min, 2*min), as kube-apiserver's
    /// `--min-request-timeout` does, so clients spread their reconnects.
    pub min_request_timeout: Duration,
    /// How often a watch that allows bookmarks gets one (when its resourceVersion moved).
    pub bookmark_interval: Duration,
    /// How long a request that is not a watch may take, response included (kube-apiserver's
    /// `--request-timeout`): past it, 504.
    pub request_timeout: Duration,
    /// A cluster's garbage collector looks after our objects: a delete adds its finalizer
    /// (`orphan`, `foregroundDeletion`) as the propagation policy says. Without one nobody
    /// would remove them, so none is added.
    pub garbage_collection: bool,
}

impl Default for RestSettings {
    fn default() -> Self {
        Self {
            min_request_timeout: Duration::from_secs(1800),
            bookmark_interval: Duration::from_secs(60),
            request_timeout: Duration::from_secs(60),
            garbage_collection: false,
        }
    }
}

/// What every handler can reach besides its store.
#[derive(Clone)]
pub struct RestContext {
    /// The server's metrics (the handlers count open watches).
    pub metrics: Arc<Metrics>,
    /// Cancelled when open watches are to end (shutdown).
    pub shutdown: CancellationToken,
    /// Timeouts and the bookmark interval.
    pub settings: Arc<RestSettings>,
    /// Where large and deep request bodies are worked on.
    pub work: body::Work,
    /// The cluster's namespaces, for NamespaceLifecycle admission of creates; None without a
    /// cluster (or with the plugin disabled): no check.
    pub namespaces: Option<Arc<crate::namespaces::Namespaces>>,
    /// The cluster's admission webhooks every write goes through (none standalone).
    pub admission: crate::admission::Admission,
}

pub(crate) struct KindApiInner<K> {
    pub(crate) store: Arc<dyn Store<K>>,
    pub(crate) ctx: RestContext,
    /// The kind's field managers (a kind whose schema does not convert is not served).
    pub(crate) fields: field_managers::FieldManagers,
    /// The kind's versions, for admission's `matchPolicy: Equivalent` (None: it has one).
    pub(crate) equivalents: Option<Arc<dyn crate::admission::Equivalents>>,
}

/// A kind's handler state: one `Arc`, so the per-request clone is one atomic increment.
pub(crate) struct KindApi<K>(Arc<KindApiInner<K>>);

impl<K> Clone for KindApi<K> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<K> std::ops::Deref for KindApi<K> {
    type Target = KindApiInner<K>;
    fn deref(&self) -> &KindApiInner<K> {
        &self.0
    }
}

impl<K: ServedResource> KindApi<K> {
    /// The store's writes; 405 when the kind is read-only.
    pub(crate) fn writer(&self) -> Result<&dyn WritableStore<K>> {
        self.store.writable().ok_or_else(|| {
            Error::MethodNotAllowed(format!(
                "writes are not supported on resources of kind {:?}",
                K::qualified_resource()
            ))
        })
    }
}
