//! A view of one kind of the cluster's objects (a view of each of its Pods, say): a [`WatchCache`]
//! fed by one kube-runtime watcher over the kind (all namespaces, or one per configured
//! namespace), started at boot, reconnecting with backoff, projecting every object into its view
//! ([`View::project`]). Every request for the view is answered from memory; none reaches
//! kube-apiserver.

use std::{marker::PhantomData, sync::Arc};

use futures::{FutureExt, StreamExt, future::BoxFuture};
use k8s_openapi::NamespaceResourceScope;
use kube::{
    Api, Resource,
    runtime::{WatchStreamExt, watcher},
};
use serde::de::DeserializeOwned;
use tokio::sync::watch;

use super::{
    memory::Listed,
    watch_cache::{CacheState, Sink, Source, WatchCache},
};
use crate::{
    error::{Error, Result},
    observe::health::ReadinessCheck,
    resource::ServedResource,
};

/// A read-only kind that is a view of a namespaced kind of the cluster: each of the cluster's
/// objects is served as its projection, with the object's own name, namespace and
/// resourceVersion. Declared in the kind's own file; [`crate::store::StorageFactory::view`]
/// makes its cache.
pub trait View: ServedResource {
    /// The cluster's kind this is a view of (`Pod`).
    type Of: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static;

    /// The view of one of the cluster's objects.
    fn project(object: &Self::Of) -> Self;
}

/// A view's cache, a read-only store: the cluster's objects as their views, their
/// resourceVersions the objects' own. Answers 503 until the first sync, and without a cluster;
/// a watch that breaks after that keeps serving the last view.
pub type ViewCache<K> = WatchCache<K, ClusterSource<K>>;

/// The cluster's objects of `K::Of`, as a [`Source`] of `K`: one watcher per scope (a
/// namespace, or all).
pub struct ClusterSource<K: View> {
    scopes: Vec<(Api<K::Of>, Option<String>)>,
    _kind: PhantomData<fn() -> K>,
}

impl<K: View> ClusterSource<K> {
    fn new(scopes: Vec<(Api<K::Of>, Option<String>)>) -> Self {
        Self {
            scopes,
            _kind: PhantomData,
        }
    }

    /// Starts one watcher per scope (`[]` = all namespaces) feeding a new cache.
    pub fn start(client: kube::Client, namespaces: Vec<String>) -> Arc<ViewCache<K>> {
        let scopes: Vec<Option<String>> = if namespaces.is_empty() {
            vec![None]
        } else {
            namespaces.into_iter().map(Some).collect()
        };
        let pending = scopes.len();
        let scopes = scopes
            .into_iter()
            .map(|scope| {
                let api = match &scope {
                    Some(ns) => Api::namespaced(client.clone(), ns),
                    None => Api::all(client.clone()),
                };
                (api, scope)
            })
            .collect();
        WatchCache::new(Self::new(scopes), CacheState::Syncing { pending })
    }

    /// A cache that never syncs: no cluster.
    pub fn without_cluster() -> Arc<ViewCache<K>> {
        WatchCache::new(Self::new(Vec::new()), CacheState::NoSource)
    }

    /// A cache holding `objects` and no cluster, synced: for benchmarks and tests.
    pub fn fixed(objects: impl IntoIterator<Item = K>) -> Arc<ViewCache<K>> {
        let cache = WatchCache::new(Self::new(Vec::new()), CacheState::Synced { degraded: None });
        let objects = objects.into_iter().map(Listed::Changed);
        // A fresh store accepts any content.
        let _ = cache.sink().cache.replace_external_in(None, objects);
        cache
    }

    fn kinds() -> (String, String) {
        (
            format!("{}s", K::kind(&())),
            format!("{}s", K::Of::kind(&())),
        )
    }
}

impl<K: View> Source<K> for ClusterSource<K> {
    fn feeds(self: &Arc<Self>, sink: &Sink<K>) -> Vec<BoxFuture<'static, ()>> {
        self.scopes
            .iter()
            .map(|(api, scope)| feed(sink.clone(), api.clone(), scope.clone()).boxed())
            .collect()
    }

    fn check_ready(&self, state: &CacheState) -> Result<()> {
        let (views, objects) = Self::kinds();
        match state {
            CacheState::NoSource => Err(Error::ServiceUnavailable(format!(
                "{views} are a view of a Kubernetes cluster's {objects}, and this server has no cluster configured: run it in a cluster (in-cluster config), pass --kubeconfig or set KUBECONFIG (as `mirrord exec` and local development do)"
            ))),
            CacheState::Syncing { .. } | CacheState::Broken(_) => {
                Err(Error::ServiceUnavailable(format!(
                    "the {} cache has not synced with the cluster's {objects} yet; retry shortly",
                    K::kind(&())
                )))
            }
            CacheState::Synced { .. } => Ok(()),
        }
    }

    /// Readiness: not ready until the first sync (`<kind>-cache-synced`). A broken watch after
    /// that keeps the server ready (the last view still serves) and shows in
    /// `/readyz/<kind>-watch`.
    fn readiness_checks(&self, state: watch::Receiver<CacheState>) -> Vec<ReadinessCheck> {
        let watch = state.clone();
        let name = K::kind(&()).to_ascii_lowercase();
        let synced: &'static str = Box::leak(format!("{name}-cache-synced").into_boxed_str());
        let watching: &'static str = Box::leak(format!("{name}-watch").into_boxed_str());
        let objects = K::Of::kind(&()).into_owned();
        vec![
            ReadinessCheck::new(synced, move || match &*state.borrow() {
                CacheState::Syncing { pending } => {
                    Err(format!("{pending} {objects} watch(es) not synced yet"))
                }
                _ => Ok(()),
            }),
            ReadinessCheck::informational(watching, move || match &*watch.borrow() {
                CacheState::Synced {
                    degraded: Some(reason),
                } => Err(format!("serving the last synced view: {reason}")),
                _ => Ok(()),
            }),
        ]
    }
}

/// Applies the watch of `scope` to the cache, for as long as the cache runs it.
async fn feed<K: View>(sink: Sink<K>, api: Api<K::Of>, scope: Option<String>) {
    // A relist's objects until its end, each unchanged one as its key only.
    let mut buffer: Vec<Listed<K>> = Vec::new();
    let mut synced_once = false;
    let stream = watcher(api, watcher::Config::default()).default_backoff();
    futures::pin_mut!(stream);
    while let Some(event) = stream.next().await {
        let applied = match event {
            Ok(watcher::Event::Init) => {
                buffer.clear();
                Ok(())
            }
            Ok(watcher::Event::InitApply(object)) => {
                buffer.push(sink.cache.listed(K::project(&object)));
                Ok(())
            }
            Ok(watcher::Event::InitDone) => {
                let result = sink
                    .cache
                    .replace_external_in(scope.as_deref(), std::mem::take(&mut buffer));
                if !synced_once {
                    synced_once = true;
                    sink.synced();
                    tracing::info!(
                        kind = %K::kind(&()),
                        scope = scope.as_deref().unwrap_or("all namespaces"),
                        "view cache synced"
                    );
                }
                result
            }
            Ok(watcher::Event::Apply(object)) => sink.cache.apply_external(K::project(&object)),
            Ok(watcher::Event::Delete(object)) => sink.cache.delete_external(K::project(&object)),
            Err(error) => {
                tracing::warn!(%error, kind = %K::kind(&()), "watch failed; serving the last synced view, retrying with backoff");
                sink.degraded(Some(error.to_string()));
                continue;
            }
        };
        match applied {
            Ok(()) => sink.degraded(None),
            Err(error) => tracing::error!(%error, kind = %K::kind(&()), "could not apply an event"),
        }
    }
}
