//! The FarmPod watch cache: a [`WatchCache`] fed by one kube-runtime watcher over Pods (all
//! namespaces, or one per configured namespace), started at boot, reconnecting with backoff,
//! projecting every Pod into its FarmPod. Every FarmPod request is answered from memory; none
//! reaches kube-apiserver.

use std::sync::Arc;

use futures::{FutureExt, StreamExt, future::BoxFuture};
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api,
    runtime::{WatchStreamExt, watcher},
};
use tokio::sync::watch;

use super::{
    memory::Listed,
    watch_cache::{CacheState, Sink, Source, WatchCache},
};
use crate::{
    error::{Error, Result},
    health::Check,
    resources::FarmPod,
};

/// Said by every FarmPod request when the server runs without a cluster.
pub const NO_CLUSTER: &str = "FarmPods are a view of a Kubernetes cluster's Pods, and this server has no cluster configured: run it in a cluster (in-cluster config), pass --kubeconfig or set KUBECONFIG (as `mirrord exec` and local development do). Llamas work without a cluster.";

/// The FarmPods, a read-only store: the cluster's Pods as FarmPods, their resourceVersions the
/// Pods' own. Answers 503 until the first sync, and without a cluster; a watch that breaks after
/// that keeps serving the last view.
pub type PodCache = WatchCache<FarmPod, PodSource>;

/// The cluster's Pods, as a [`Source`] of FarmPods: one watcher per scope (a namespace, or all).
pub struct PodSource {
    scopes: Vec<(Api<Pod>, Option<String>)>,
}

impl PodCache {
    /// Starts one watcher per scope (`[]` = all namespaces) feeding a new cache.
    pub fn start(client: kube::Client, namespaces: Vec<String>) -> Arc<Self> {
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
        WatchCache::new(PodSource { scopes }, CacheState::Syncing { pending })
    }

    /// A cache that never syncs: no cluster.
    pub fn without_cluster() -> Arc<Self> {
        WatchCache::new(PodSource { scopes: Vec::new() }, CacheState::NoSource)
    }

    /// `count` synthetic FarmPods and no cluster: for benchmarks and tests.
    pub fn synthetic(count: usize) -> Arc<Self> {
        let cache = WatchCache::new(
            PodSource { scopes: Vec::new() },
            CacheState::Synced { degraded: None },
        );
        let pods = (0..count).map(|i| Listed::Changed(FarmPod::synthetic(i, i as u64 + 1)));
        // A fresh store accepts any content.
        let _ = cache.sink().cache.replace_external_in(None, pods);
        cache
    }
}

impl Source<FarmPod> for PodSource {
    fn feeds(self: &Arc<Self>, sink: &Sink<FarmPod>) -> Vec<BoxFuture<'static, ()>> {
        self.scopes
            .iter()
            .map(|(api, scope)| feed(sink.clone(), api.clone(), scope.clone()).boxed())
            .collect()
    }

    fn check_ready(&self, state: &CacheState) -> Result<()> {
        match state {
            CacheState::NoSource => Err(Error::ServiceUnavailable(NO_CLUSTER.into())),
            CacheState::Syncing { .. } | CacheState::Broken(_) => Err(Error::ServiceUnavailable(
                "the FarmPod cache has not synced with the cluster's Pods yet; retry shortly"
                    .into(),
            )),
            CacheState::Synced { .. } => Ok(()),
        }
    }

    /// Readiness: not ready until the first sync. A broken watch after that keeps the server
    /// ready (Llamas and the last FarmPod view still serve) and shows in `/readyz/farmpod-watch`.
    fn readiness_checks(&self, state: watch::Receiver<CacheState>) -> Vec<Check> {
        let watch = state.clone();
        vec![
            Check::new("farmpod-cache-synced", move || match &*state.borrow() {
                CacheState::Syncing { pending } => {
                    Err(format!("{pending} Pod watch(es) not synced yet"))
                }
                _ => Ok(()),
            }),
            Check::informational("farmpod-watch", move || match &*watch.borrow() {
                CacheState::Synced {
                    degraded: Some(reason),
                } => Err(format!("serving the last synced view: {reason}")),
                _ => Ok(()),
            }),
        ]
    }
}

/// Applies the Pod watch of `scope` to the cache, for as long as the cache runs it.
async fn feed(sink: Sink<FarmPod>, api: Api<Pod>, scope: Option<String>) {
    // A relist's Pods until its end, each unchanged one as its key only.
    let mut buffer: Vec<Listed<FarmPod>> = Vec::new();
    let mut synced_once = false;
    let stream = watcher(api, watcher::Config::default()).default_backoff();
    futures::pin_mut!(stream);
    while let Some(event) = stream.next().await {
        let applied = match event {
            Ok(watcher::Event::Init) => {
                buffer.clear();
                Ok(())
            }
            Ok(watcher::Event::InitApply(pod)) => {
                buffer.push(sink.cache.listed(FarmPod::from_pod(&pod)));
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
                        scope = scope.as_deref().unwrap_or("all namespaces"),
                        "FarmPod cache synced"
                    );
                }
                result
            }
            Ok(watcher::Event::Apply(pod)) => sink.cache.apply_external(FarmPod::from_pod(&pod)),
            Ok(watcher::Event::Delete(pod)) => sink.cache.delete_external(FarmPod::from_pod(&pod)),
            Err(error) => {
                tracing::warn!(%error, "Pod watch failed; serving the last synced FarmPods, retrying with backoff");
                sink.degraded(Some(error.to_string()));
                continue;
            }
        };
        match applied {
            Ok(()) => sink.degraded(None),
            Err(error) => tracing::error!(%error, "could not apply a Pod event"),
        }
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
        store::{ListRequest, Store, WatchItem, WatchRequest, WatchStart},
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
                && cache.sink().cache.counts().resource_version >= expected_rv
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!(
            "cache did not sync: {:?} {:?}",
            cache.state(),
            cache.sink().cache.counts()
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
        assert_eq!(cache.sink().cache.counts().objects, 100);
        assert_eq!(
            PodCache::without_cluster()
                .check_ready()
                .unwrap_err()
                .code(),
            503
        );
    }
}
