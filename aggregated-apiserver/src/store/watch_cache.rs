//! A watch cache: another server's objects (kube-apiserver's Pods, etcd's keys) held in a
//! [`MemoryStore`] and kept current by a [`Source`], a list plus a stream of changes. The cache
//! serves every read of [`Store`] from memory, keeps one [`CacheState`] (its
//! [`Store::check_ready`] answers 503 while the state says so) and reports it to `/readyz`; what
//! differs between sources (the feed, the words of the 503s and checks, whether a read first
//! catches up with the source, writes) is the source's.

use std::sync::Arc;

use async_trait::async_trait;
use futures::future::BoxFuture;
use tokio::sync::watch;

use super::{
    ListCursor, ListRequest, MemoryStore, Object, PageInfo, Store, StoreStats, WatchRequest,
    WatchStream, WritableStore, memory::MemoryStoreConfig,
};
use crate::{
    error::Result,
    observe::health::ReadinessCheck,
    resource::{ObjectKey, ServedResource},
};

/// How far a watch cache is from its source: what its reads and readiness report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheState {
    /// There is no source (a view without a cluster): nothing will ever be read.
    NoSource,
    /// Waiting for the first complete list of every scope the source feeds.
    Syncing {
        /// Scopes (namespaces, or all) whose first list has not completed.
        pending: usize,
    },
    /// Synced, and served.
    Synced {
        /// Why the source is currently failing while its last view is served (a view), until
        /// a change applies again; None while it is healthy.
        degraded: Option<String>,
    },
    /// The source is failing and the cache is not served until it is back (etcd).
    Broken(String),
}

/// Where a watch cache's objects come from: a list, then a stream of changes, again after each
/// break, applied to a [`Sink`] by tasks the source makes. What the cache answers in each
/// [`CacheState`] is the source's to say.
pub trait Source<K: ServedResource>: Send + Sync + Sized + 'static {
    /// Whether a read waits for the cache to catch up with the source first (etcd's consistent
    /// reads, in [`Source::catch_up`]): then no read is served without a future
    /// ([`Store::get_sync`] is None).
    const CONSISTENT_READS: bool = false;

    /// The tasks that feed `sink`: each lists and then applies changes, again after every
    /// break, for as long as it runs. The cache spawns them and aborts them when it is dropped.
    fn feeds(self: &Arc<Self>, sink: &Sink<K>) -> Vec<BoxFuture<'static, ()>>;

    /// What a request to the cache in `state` gets: Ok when it is served, else the 503.
    fn check_ready(&self, state: &CacheState) -> Result<()>;

    /// What the cache adds to `/readyz`, reading its state from `state`.
    fn readiness_checks(&self, state: watch::Receiver<CacheState>) -> Vec<ReadinessCheck>;

    /// Brings the cache up to date with the source as of now, before a read of the latest
    /// state (an object, the stats); nothing by default (a read is served from whatever the
    /// cache holds). One method per kind of read, so that a GET's future holds no list's.
    fn catch_up(&self, _sink: &Sink<K>) -> impl Future<Output = Result<()>> + Send {
        std::future::ready(Ok(()))
    }

    /// Brings the cache to where a list's page reads (the state `request` asks for).
    fn prepare_list(
        &self,
        _sink: &Sink<K>,
        _request: &ListRequest,
    ) -> impl Future<Output = Result<()>> + Send {
        std::future::ready(Ok(()))
    }

    /// Whether a watch may start now.
    fn prepare_watch(&self, _sink: &Sink<K>) -> Result<()> {
        Ok(())
    }

    /// The writes of a cache fed by this source, when it takes any (etcd's compare-and-swap):
    /// [`Store::writable`].
    fn writable(_cache: &WatchCache<K, Self>) -> Option<&dyn WritableStore<K>> {
        None
    }
}

/// What a source's tasks feed: the cache's objects and its state. Clones share both.
pub struct Sink<K> {
    /// The objects, at the versions the source gave them (not this process's: a watch from one
    /// the cache has not reached waits for it).
    pub cache: MemoryStore<K>,
    state: watch::Sender<CacheState>,
}

impl<K> Clone for Sink<K> {
    fn clone(&self) -> Self {
        Self {
            cache: self.cache.clone(),
            state: self.state.clone(),
        }
    }
}

impl<K> Sink<K> {
    /// The cache's state now (a read lock on it while held: not across an await).
    pub fn state(&self) -> watch::Ref<'_, CacheState> {
        self.state.borrow()
    }

    /// A scope's first list is complete (or, for a source that breaks, the feed is current
    /// again): one scope fewer pending, Synced and healthy after the last.
    pub fn synced(&self) {
        self.state.send_if_modified(|state| {
            let next = match state {
                CacheState::Syncing { pending } if *pending > 1 => CacheState::Syncing {
                    pending: *pending - 1,
                },
                CacheState::Syncing { .. } | CacheState::Broken(_) => {
                    CacheState::Synced { degraded: None }
                }
                CacheState::NoSource | CacheState::Synced { .. } => return false,
            };
            *state = next;
            true
        });
    }

    /// The source is failing (Some) or healthy again (None) while the last view is served:
    /// said once synced, not before.
    pub fn degraded(&self, reason: Option<String>) {
        self.state.send_if_modified(|state| match state {
            CacheState::Synced { degraded } if *degraded != reason => {
                *degraded = reason;
                true
            }
            _ => false,
        });
    }

    /// The source is failing: the cache is not served until [`Sink::synced`].
    pub fn broken(&self, reason: String) {
        self.state.send_replace(CacheState::Broken(reason));
    }
}

/// A read-only [`Store`] of another server's objects, fed by `S`; see the module docs.
///
/// Its source's tasks are aborted when it is dropped: a cache nobody serves any more watches
/// nothing.
pub struct WatchCache<K, S> {
    sink: Sink<K>,
    source: Arc<S>,
    tasks: Vec<tokio::task::AbortHandle>,
}

impl<K, S> Drop for WatchCache<K, S> {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl<K: ServedResource, S: Source<K>> WatchCache<K, S> {
    /// An empty cache in `state`, fed by `source`'s tasks from now on (spawned here: inside a
    /// runtime, unless the source has none).
    pub fn new(source: S, state: CacheState) -> Arc<Self> {
        let sink = Sink {
            cache: MemoryStore::new(MemoryStoreConfig {
                // Versions are the source's own, not this process's.
                first_resource_version: 0,
                // The source is the objects' truth: a watch from a version the cache has not
                // reached waits for it, as kube-apiserver's cacher does.
                authoritative: false,
                ..Default::default()
            }),
            state: watch::Sender::new(state),
        };
        let source = Arc::new(source);
        let tasks = source
            .feeds(&sink)
            .into_iter()
            .map(|feed| tokio::spawn(feed).abort_handle())
            .collect();
        Arc::new(Self {
            sink,
            source,
            tasks,
        })
    }

    /// The cache's state now.
    pub fn state(&self) -> CacheState {
        self.sink.state().clone()
    }

    /// The cache's objects and state, as its source's tasks feed them.
    pub(super) fn sink(&self) -> &Sink<K> {
        &self.sink
    }

    /// The source, for what it adds to the cache (etcd's writes).
    pub(super) fn source(&self) -> &S {
        &self.source
    }
}

#[async_trait]
impl<K: ServedResource, S: Source<K>> Store<K> for WatchCache<K, S> {
    async fn get(&self, key: &ObjectKey) -> Result<Object<K>> {
        self.source.catch_up(&self.sink).await?;
        self.sink.cache.get(key).await
    }

    fn get_sync(&self, namespace: &str, name: &str) -> Option<Result<Object<K>>> {
        if S::CONSISTENT_READS {
            return None;
        }
        self.sink.cache.get_sync(namespace, name)
    }

    async fn list_each(
        &self,
        request: &ListRequest,
        visit: &mut (dyn for<'o> FnMut(&'o Object<K>) + Send),
    ) -> Result<PageInfo> {
        self.source.prepare_list(&self.sink, request).await?;
        self.sink.cache.list_each(request, visit).await
    }

    async fn list_cursor(&self, request: &ListRequest) -> Result<Option<ListCursor<K>>> {
        self.source.prepare_list(&self.sink, request).await?;
        self.sink.cache.list_cursor(request).await
    }

    fn count_sync(&self, namespace: Option<&str>) -> Option<usize> {
        self.sink.cache.count_sync(namespace)
    }

    async fn watch(&self, request: WatchRequest) -> Result<WatchStream<K>> {
        self.source.prepare_watch(&self.sink)?;
        self.sink.cache.watch(request).await
    }

    async fn stats(&self) -> Result<StoreStats> {
        self.source.catch_up(&self.sink).await?;
        Ok(self.sink.cache.counts())
    }

    /// None until the cache is served (syncing, or its source broken): no count rather than
    /// an empty cache's 0.
    fn stats_sync(&self) -> Option<StoreStats> {
        self.check_ready().ok()?;
        Some(self.sink.cache.counts())
    }

    fn check_ready(&self) -> Result<()> {
        self.source.check_ready(&self.sink.state.borrow())
    }

    fn readiness_checks(self: Arc<Self>) -> Vec<ReadinessCheck> {
        self.source.readiness_checks(self.sink.state.subscribe())
    }

    fn writable(&self) -> Option<&dyn WritableStore<K>> {
        S::writable(self)
    }
}
