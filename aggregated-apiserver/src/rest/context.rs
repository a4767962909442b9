//! What the REST layer shares across kinds: its settings and the context every handler
//! reaches besides its kind's store.

use std::{sync::Arc, time::Duration};

use tokio_util::sync::CancellationToken;

use super::body;
use crate::observe::metrics::Metrics;

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
    pub namespaces: Option<Arc<crate::store::namespaces::Namespaces>>,
    /// The cluster's admission webhooks every write goes through (none standalone).
    pub admission: crate::admission::Admission,
}
