//! The FarmPod watch cache: one kube-runtime watcher over Pods (all namespaces, or one per
//! configured namespace), started at boot, reconnecting with backoff, projecting every Pod into its
//! FarmPod. Every FarmPod request is answered from memory; none reaches kube-apiserver.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api,
    runtime::{WatchStreamExt, watcher},
};

use super::{
    ListCursor, ListPage, ListRequest, MemoryStore, Object, PageInfo, Store, StoreStats,
    WatchRequest, WatchStream, memory::MemoryStoreConfig,
};
use crate::{
    error::{Error, Result},
    health::Check,
    resource::ObjectKey,
    resources::FarmPod,
};

/// Said by every FarmPod request when the server runs without a cluster.
pub const NO_CLUSTER: &str = "FarmPods are a view of a Kubernetes cluster's Pods, and this server has no cluster configured: run it in a cluster (in-cluster config), pass --kubeconfig or set KUBECONFIG (as `mirrord exec` and local development do). Llamas work without a cluster.";

/// How far the cache is from the cluster's Pods: what readiness and FarmPod requests report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheState {
    /// No cluster configured: FarmPods answer 503.
    NoCluster,
    /// Waiting for the first complete list of every watched scope.
    Syncing {
        /// Watched scopes (namespaces, or all) whose first list has not completed.
        pending: usize,
    },
    /// Synced; `degraded` says why the watch is currently broken (the last view is served).
    Synced {
        /// The watch's last error, until an event applies again; None while it is healthy.
        degraded: Option<String>,
    },
}

/// The FarmPods, a read-only [`Store`]: a [`MemoryStore`] fed by Pod watchers, its
/// resourceVersions the Pods' own. Answers 503 until the first sync, and without a cluster.
///
/// Its watcher tasks hold it weakly and are aborted when it is dropped: a cache nobody
/// serves any more watches nothing.
pub struct PodCache {
    store: MemoryStore<FarmPod>,
    state: Mutex<CacheState>,
    tasks: Mutex<Vec<tokio::task::AbortHandle>>,
}

impl Drop for PodCache {
    fn drop(&mut self) {
        if let Ok(tasks) = self.tasks.get_mut() {
            for task in tasks.drain(..) {
                task.abort();
            }
        }
    }
}

impl PodCache {
    fn with_state(state: CacheState) -> Arc<Self> {
        Arc::new(Self {
            // Versions are the Pods' own (kube-apiserver's), not this process's.
            store: MemoryStore::new(MemoryStoreConfig {
                first_resource_version: 0,
                authoritative: false,
                ..Default::default()
            }),
            state: Mutex::new(state),
            tasks: Mutex::default(),
        })
    }

    /// A cache that never syncs: no cluster.
    pub fn without_cluster() -> Arc<Self> {
        Self::with_state(CacheState::NoCluster)
    }

    /// `count` synthetic FarmPods and no cluster: for benchmarks and tests.
    pub fn synthetic(count: usize) -> Arc<Self> {
        let cache = Self::with_state(CacheState::Synced { degraded: None });
        let pods = (0..count)
            .map(|i| FarmPod::synthetic(i, i as u64 + 1))
            .collect();
        // A fresh store accepts any content.
        let _ = cache.store.replace_external_in(None, pods);
        cache
    }

    /// Starts one watcher per scope (`[]` = all namespaces) feeding this cache.
    pub fn start(client: kube::Client, namespaces: Vec<String>) -> Arc<Self> {
        let scopes: Vec<Option<String>> = if namespaces.is_empty() {
            vec![None]
        } else {
            namespaces.into_iter().map(Some).collect()
        };
        let cache = Self::with_state(CacheState::Syncing {
            pending: scopes.len(),
        });
        for scope in scopes {
            let api: Api<Pod> = match &scope {
                Some(ns) => Api::namespaced(client.clone(), ns),
                None => Api::all(client.clone()),
            };
            let task = tokio::spawn(Self::feed(Arc::downgrade(&cache), api, scope));
            if let Ok(mut tasks) = cache.tasks.lock() {
                tasks.push(task.abort_handle());
            }
        }
        cache
    }

    /// The cache's state now.
    pub fn state(&self) -> CacheState {
        self.state
            .lock()
            .map(|s| s.clone())
            .unwrap_or(CacheState::Synced {
                degraded: Some("state lock poisoned".into()),
            })
    }

    fn update(&self, f: impl FnOnce(&mut CacheState)) {
        if let Ok(mut state) = self.state.lock() {
            f(&mut state);
        }
    }

    fn synced_scope(&self) {
        self.update(|state| {
            let next = match &*state {
                CacheState::Syncing { pending } if *pending > 1 => CacheState::Syncing {
                    pending: pending - 1,
                },
                CacheState::Syncing { .. } => CacheState::Synced { degraded: None },
                other => other.clone(),
            };
            *state = next;
        });
    }

    fn degraded(&self, reason: Option<String>) {
        self.update(|state| {
            if let CacheState::Synced { degraded } = state {
                *degraded = reason;
            }
        });
    }

    /// Applies the watch of `scope` to the cache, while there is one.
    async fn feed(cache: std::sync::Weak<Self>, api: Api<Pod>, scope: Option<String>) {
        let mut buffer: Vec<FarmPod> = Vec::new();
        let mut synced_once = false;
        let stream = watcher(api, watcher::Config::default()).default_backoff();
        futures::pin_mut!(stream);
        while let Some(event) = stream.next().await {
            let Some(this) = cache.upgrade() else {
                return;
            };
            let applied = match event {
                Ok(watcher::Event::Init) => {
                    buffer.clear();
                    Ok(())
                }
                Ok(watcher::Event::InitApply(pod)) => {
                    buffer.push(FarmPod::from_pod(&pod));
                    Ok(())
                }
                Ok(watcher::Event::InitDone) => {
                    let result = this
                        .store
                        .replace_external_in(scope.as_deref(), std::mem::take(&mut buffer));
                    if !synced_once {
                        synced_once = true;
                        this.synced_scope();
                        tracing::info!(
                            scope = scope.as_deref().unwrap_or("all namespaces"),
                            "FarmPod cache synced"
                        );
                    }
                    result
                }
                Ok(watcher::Event::Apply(pod)) => {
                    this.store.apply_external(FarmPod::from_pod(&pod))
                }
                Ok(watcher::Event::Delete(pod)) => {
                    this.store.delete_external(FarmPod::from_pod(&pod))
                }
                Err(error) => {
                    tracing::warn!(%error, "Pod watch failed; serving the last synced FarmPods, retrying with backoff");
                    this.degraded(Some(error.to_string()));
                    continue;
                }
            };
            match applied {
                Ok(()) => this.degraded(None),
                Err(error) => tracing::error!(%error, "could not apply a Pod event"),
            }
        }
    }
}

#[async_trait]
impl Store<FarmPod> for PodCache {
    async fn get(&self, key: &ObjectKey) -> Result<Object<FarmPod>> {
        self.store.get(key).await
    }

    fn get_sync(&self, namespace: &str, name: &str) -> Option<Result<Object<FarmPod>>> {
        self.store.get_sync(namespace, name)
    }

    async fn list_each(
        &self,
        request: &ListRequest,
        visit: &mut (dyn for<'o> FnMut(&'o Object<FarmPod>) + Send),
    ) -> Result<PageInfo> {
        self.store.list_each(request, visit).await
    }

    async fn list(&self, request: &ListRequest) -> Result<ListPage<FarmPod>> {
        self.store.list(request).await
    }

    async fn list_cursor(&self, request: &ListRequest) -> Result<Option<ListCursor<FarmPod>>> {
        self.store.list_cursor(request).await
    }

    fn count_sync(&self, namespace: Option<&str>) -> Option<usize> {
        self.store.count_sync(namespace)
    }

    async fn watch(&self, request: WatchRequest) -> Result<WatchStream<FarmPod>> {
        self.store.watch(request).await
    }

    async fn stats(&self) -> Result<StoreStats> {
        Ok(self.store.counts())
    }

    fn check_ready(&self) -> Result<()> {
        match self.state() {
            CacheState::NoCluster => Err(Error::ServiceUnavailable(NO_CLUSTER.into())),
            CacheState::Syncing { .. } => Err(Error::ServiceUnavailable(
                "the FarmPod cache has not synced with the cluster's Pods yet; retry shortly"
                    .into(),
            )),
            CacheState::Synced { .. } => Ok(()),
        }
    }

    /// Readiness: not ready until the first sync. A broken watch after that keeps the server
    /// ready (Llamas and the last FarmPod view still serve) and shows in `/readyz/farmpod-watch`.
    fn readiness_checks(self: Arc<Self>) -> Vec<Check> {
        let synced = self.clone();
        let watch = self;
        vec![
            Check::new("farmpod-cache-synced", move || match synced.state() {
                CacheState::Syncing { pending } => {
                    Err(format!("{pending} Pod watch(es) not synced yet"))
                }
                _ => Ok(()),
            }),
            Check::informational("farmpod-watch", move || match watch.state() {
                CacheState::Synced {
                    degraded: Some(reason),
                } => Err(format!("serving the last synced view: {reason}")),
                _ => Ok(()),
            }),
        ]
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use futures::StreamExt;
    use http::{Request, Response};
    use kube::client::Body;
    use serde_json::json;

    use super::*;
    use crate::{
        negotiate::MetaVersion,
        selector::{Filter, LabelSelector},
        store::{WatchItem, WatchStart},
        table::{self, IncludeObject},
    };

    fn pod(ns: &str, name: &str, rv: u64, containers: usize, app: &str) -> serde_json::Value {
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "uid": format!("u-{name}"),
                "resourceVersion": rv.to_string(), "labels": {"app": app},
                "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"containers": (0..containers).map(|i| json!({"name": format!("c{i}")})).collect::<Vec<_>>()},
            "status": {"phase": "Running"}
        })
    }

    type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

    /// Answers the watcher's LIST, then its first WATCH with `events`; later requests hang.
    async fn serve_upstream(
        mut handle: Handle,
        list: serde_json::Value,
        events: Vec<serde_json::Value>,
    ) {
        let (request, send) = handle.next_request().await.expect("list request");
        assert_eq!(request.uri().path(), "/api/v1/pods");
        assert!(!request.uri().query().unwrap_or("").contains("watch=true"));
        send.send_response(Response::new(Body::from(
            serde_json::to_vec(&list).unwrap(),
        )));
        let (request, send) = handle.next_request().await.expect("watch request");
        assert!(request.uri().query().unwrap_or("").contains("watch=true"));
        let lines: Vec<u8> = events
            .iter()
            .flat_map(|e| {
                let mut line = serde_json::to_vec(e).unwrap();
                line.push(b'\n');
                line
            })
            .collect();
        send.send_response(Response::new(Body::from(lines)));
        // Keep the next watch open forever.
        let _pending = handle.next_request().await;
        std::future::pending::<()>().await;
    }

    async fn synced(cache: &Arc<PodCache>, expected_rv: u64) {
        for _ in 0..200 {
            if matches!(cache.state(), CacheState::Synced { .. })
                && cache.store.counts().resource_version >= expected_rv
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!(
            "cache did not sync: {:?} {:?}",
            cache.state(),
            cache.store.counts()
        );
    }

    #[tokio::test]
    async fn list_and_watch_events_become_farmpods() {
        let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let client = kube::Client::new(service, "default");
        let list = json!({"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "10"},
            "items": [pod("shop", "web-1", 5, 2, "web"), pod("shop", "db-1", 6, 1, "db"), pod("farm", "barn", 7, 3, "web")]});
        let events = vec![
            json!({"type": "ADDED", "object": pod("shop", "web-2", 11, 4, "web")}),
            json!({"type": "MODIFIED", "object": pod("shop", "db-1", 12, 2, "db")}),
            json!({"type": "DELETED", "object": pod("farm", "barn", 13, 3, "web")}),
        ];
        tokio::spawn(serve_upstream(handle, list, events));
        let cache = PodCache::start(client, Vec::new());
        assert!(
            cache.check_ready().is_err(),
            "not ready before the first sync"
        );
        synced(&cache, 13).await;
        cache.check_ready().unwrap();

        let page = cache.list(&ListRequest::default()).await.unwrap();
        let names: Vec<(String, u32)> = page
            .items
            .iter()
            .map(|p| (p.metadata.name.clone().unwrap(), p.spec.containers))
            .collect();
        assert_eq!(
            names,
            [
                ("farm-db-1".into(), 2),
                ("farm-web-1".into(), 2),
                ("farm-web-2".into(), 4)
            ]
        );

        let web = cache
            .list(&ListRequest {
                filter: Filter {
                    labels: LabelSelector::parse("app=web").unwrap(),
                    ..Default::default()
                },
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(web.items.len(), 2);

        let rows = table::table(
            page.items.iter().map(|p| p.get()),
            Default::default(),
            IncludeObject::None,
            MetaVersion::V1,
            true,
        );
        let json = serde_json::to_value(&rows).unwrap();
        assert_eq!(json["rows"][0]["cells"][0], "farm-db-1");
        assert_eq!(json["rows"][0]["cells"][1], 2);
        assert_eq!(json["rows"][0]["cells"][3], "Running");

        // A watch from the list's start sees the three changes in order.
        let mut watch = cache
            .watch(WatchRequest {
                namespace: None,
                filter: Filter::default(),
                start: WatchStart::After(page.info.resource_version - 3),
            })
            .await
            .unwrap();
        let mut seen = Vec::new();
        while seen.len() < 3 {
            if let Some(WatchItem::Event(e)) = watch.next().await {
                seen.push(format!(
                    "{} {}",
                    e.type_.as_str(),
                    e.object.metadata.name.clone().unwrap()
                ));
            }
        }
        assert_eq!(
            seen,
            [
                "ADDED farm-web-2",
                "MODIFIED farm-db-1",
                "DELETED farm-barn"
            ]
        );

        // Read-only: the cache takes no writes.
        assert!(cache.writable().is_none());
    }

    #[test]
    fn synthetic_cache_is_ready_without_a_cluster() {
        let cache = PodCache::synthetic(100);
        cache.check_ready().unwrap();
        assert_eq!(cache.store.counts().objects, 100);
        assert_eq!(
            PodCache::without_cluster()
                .check_ready()
                .unwrap_err()
                .code(),
            503
        );
    }
}
