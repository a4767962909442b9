//! FarmPod: a read-only view of one Pod of the cluster, named `farm-<pod>`. Only the projection is
//! kept (not the Pod), so memory follows what FarmPods show.

use k8s_openapi::{
    api::core::v1::{ContainerStatus, Pod},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use kube::CustomResource;
use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use std::sync::Arc;

use aggregated_apiserver::{
    resource::ServedResource,
    resource::columns::{AGE_COLUMN, ColumnDefinition, age},
    store::{ClusterSource, View, ViewCache},
};

/// Name prefix of every FarmPod.
pub const PREFIX: &str = "farm-";

/// FarmPodSpec is what a FarmPod shows of its Pod's spec.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "farm.example.com",
    version = "v1",
    kind = "FarmPod",
    plural = "farmpods",
    namespaced,
    shortname = "fp",
    category = "farm",
    status = "FarmPodStatus"
)]
pub struct FarmPodSpec {
    /// Number of containers in the Pod (init containers not counted).
    pub containers: u32,
}

/// FarmPodStatus is what `kubectl get pods` would show of the Pod.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FarmPodStatus {
    /// The Pod's phase: Pending, Running, Succeeded, Failed or Unknown.
    #[serde(default)]
    pub phase: String,
    /// What kubectl prints as STATUS: the phase, or the reason a container is waiting or ended
    /// (CrashLoopBackOff, ContainerCreating, Completed, ...), or Terminating.
    #[serde(default)]
    pub reason: String,
    /// Containers whose readiness probe passes.
    #[serde(default)]
    pub ready_containers: u32,
    /// Restarts of all containers together.
    #[serde(default)]
    pub restarts: u32,
    /// The node the Pod runs on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    /// The Pod's IP address.
    #[serde(default, rename = "podIP", skip_serializing_if = "Option::is_none")]
    pub pod_ip: Option<String>,
}

/// A stable uid per Pod uid, so a FarmPod keeps its uid as long as its Pod does.
const UID_NAMESPACE: uuid::Uuid = uuid::Uuid::from_u128(0x6661_726d_2d61_7069_7365_7276_6572_0001);

/// kubectl's STATUS column (`printPod`), for regular containers.
fn display_reason(pod: &Pod, statuses: &[ContainerStatus]) -> String {
    let status = pod.status.as_ref();
    let mut reason = status
        .and_then(|s| s.reason.clone())
        .or_else(|| status.and_then(|s| s.phase.clone()))
        .unwrap_or_else(|| "Unknown".into());
    let mut has_running = false;
    for container in statuses.iter().rev() {
        let state = container.state.as_ref();
        if let Some(waiting) = state.and_then(|s| s.waiting.as_ref())
            && let Some(r) = waiting.reason.as_ref().filter(|r| !r.is_empty())
        {
            reason = r.clone();
        } else if let Some(terminated) = state.and_then(|s| s.terminated.as_ref()) {
            reason = match (&terminated.reason, terminated.signal) {
                (Some(r), _) if !r.is_empty() => r.clone(),
                (_, Some(signal)) if signal != 0 => format!("Signal:{signal}"),
                _ => format!("ExitCode:{}", terminated.exit_code),
            };
        } else if container.ready && state.is_some_and(|s| s.running.is_some()) {
            has_running = true;
        }
    }
    if reason == "Completed" && has_running {
        reason = "Running".into();
    }
    if pod.metadata.deletion_timestamp.is_some() {
        reason = if status.and_then(|s| s.reason.as_deref()) == Some("NodeLost") {
            "Unknown".into()
        } else {
            "Terminating".into()
        };
    }
    reason
}

impl FarmPod {
    /// The FarmPod of `pod`.
    pub fn from_pod(pod: &Pod) -> Self {
        let meta = &pod.metadata;
        let statuses = pod
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.clone())
            .unwrap_or_default();
        let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        let status = pod.status.as_ref();
        FarmPod {
            metadata: ObjectMeta {
                name: Some(format!("{PREFIX}{}", meta.name.as_deref().unwrap_or(""))),
                namespace: meta.namespace.clone(),
                labels: meta.labels.clone(),
                creation_timestamp: meta.creation_timestamp.clone(),
                deletion_timestamp: meta.deletion_timestamp.clone(),
                resource_version: meta.resource_version.clone(),
                uid: meta
                    .uid
                    .as_ref()
                    .map(|uid| uuid::Uuid::new_v5(&UID_NAMESPACE, uid.as_bytes()).to_string()),
                generation: Some(1),
                ..Default::default()
            },
            spec: FarmPodSpec {
                containers: count(pod.spec.as_ref().map_or(0, |s| s.containers.len())),
            },
            status: Some(FarmPodStatus {
                phase: status.and_then(|s| s.phase.clone()).unwrap_or_default(),
                reason: display_reason(pod, &statuses),
                ready_containers: count(statuses.iter().filter(|c| c.ready).count()),
                restarts: statuses
                    .iter()
                    .map(|c| u32::try_from(c.restart_count).unwrap_or(0))
                    .sum(),
                node_name: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
                pod_ip: status.and_then(|s| s.pod_ip.clone()),
            }),
        }
    }

    /// A synthetic FarmPod for benchmarks and tests: `farm-pod-<i>` in `bench-<i % 10>`.
    pub fn synthetic(i: usize, resource_version: u64) -> Self {
        FarmPod {
            metadata: ObjectMeta {
                name: Some(format!("{PREFIX}pod-{i}")),
                namespace: Some(format!("bench-{}", i % 10)),
                labels: Some(
                    [
                        ("app".to_owned(), format!("app-{}", i % 100)),
                        (
                            "tier".to_owned(),
                            if i.is_multiple_of(2) { "web" } else { "db" }.to_owned(),
                        ),
                    ]
                    .into(),
                ),
                creation_timestamp: Some(aggregated_apiserver::resource::now()),
                resource_version: Some(resource_version.to_string()),
                uid: Some(uuid::Uuid::new_v5(&UID_NAMESPACE, i.to_string().as_bytes()).to_string()),
                generation: Some(1),
                ..Default::default()
            },
            spec: FarmPodSpec {
                containers: 1 + (i % 3) as u32,
            },
            status: Some(FarmPodStatus {
                phase: "Running".into(),
                reason: "Running".into(),
                ready_containers: 1 + (i % 3) as u32,
                restarts: (i % 5) as u32,
                node_name: Some(format!("node-{}", i % 7)),
                pod_ip: Some(format!(
                    "10.{}.{}.{}",
                    (i >> 16) & 255,
                    (i >> 8) & 255,
                    i & 255
                )),
            }),
        }
    }
}

impl View for FarmPod {
    type Of = Pod;

    fn project(pod: &Pod) -> Self {
        Self::from_pod(pod)
    }
}

/// `count` synthetic FarmPods ([`FarmPod::synthetic`]) as the FarmPod view, synced and with no
/// cluster: for benchmarks and tests.
pub fn synthetic_view(count: usize) -> Arc<ViewCache<FarmPod>> {
    ClusterSource::fixed((0..count).map(|i| FarmPod::synthetic(i, i as u64 + 1)))
}

impl ServedResource for FarmPod {
    type Spec = FarmPodSpec;

    const SINGULAR: &'static str = "farmpod";
    const CATEGORIES: &'static [&'static str] = &["farm"];
    const DESCRIPTION: &'static str =
        "FarmPod is a read-only view of a Pod of the cluster, named farm-<pod name>.";

    fn columns() -> Vec<ColumnDefinition> {
        vec![
            ColumnDefinition::new("Containers", "integer", "Number of containers in the Pod."),
            ColumnDefinition::new("Ready", "string", "Ready containers out of all containers."),
            ColumnDefinition::new(
                "Status",
                "string",
                "What kubectl shows as the Pod's status.",
            ),
            ColumnDefinition::new("Restarts", "integer", "Restarts of all containers."),
            AGE_COLUMN,
            ColumnDefinition::new("Node", "string", "The node the Pod runs on.").wide(),
            ColumnDefinition::new("IP", "string", "The Pod's IP address.").wide(),
        ]
    }

    fn cells(&self, now: jiff::Timestamp) -> Vec<Value> {
        let status = self.status.as_ref();
        let or_none = |v: Option<&String>| Value::String(v.map_or("<none>", |v| v).to_owned());
        vec![
            Value::from(self.spec.containers),
            Value::String(format!(
                "{}/{}",
                status.map_or(0, |s| s.ready_containers),
                self.spec.containers
            )),
            Value::String(status.map(|s| s.reason.clone()).unwrap_or_default()),
            Value::from(status.map_or(0, |s| s.restarts)),
            age(&self.metadata, now),
            or_none(status.and_then(|s| s.node_name.as_ref())),
            or_none(status.and_then(|s| s.pod_ip.as_ref())),
        ]
    }

    // Listed by the hundred thousand: written without a `Value` per cell.
    fn write_cells(&self, now: jiff::Timestamp, out: &mut Vec<u8>) -> serde_json::Result<()> {
        use std::io::Write;
        let status = self.status.as_ref();
        let text = |out: &mut Vec<u8>, v: Option<&String>| {
            out.push(b',');
            serde_json::to_writer(out, v.map_or("<none>", |v| v.as_str()))
        };
        let containers = self.spec.containers;
        let ready = status.map_or(0, |s| s.ready_containers);
        let _ = write!(out, ",{containers},\"{ready}/{containers}\",");
        serde_json::to_writer(&mut *out, status.map_or("", |s| s.reason.as_str()))?;
        let _ = write!(out, ",{},", status.map_or(0, |s| s.restarts));
        serde_json::to_writer(&mut *out, &age(&self.metadata, now))?;
        text(out, status.and_then(|s| s.node_name.as_ref()))?;
        text(out, status.and_then(|s| s.pod_ip.as_ref()))
    }

    fn status_schema(generator: &mut SchemaGenerator) -> Option<Schema> {
        Some(generator.subschema_for::<FarmPodStatus>())
    }
}

/// `farm.example.com/v1alpha`: the same FarmPod, unchanged, at the group's first version,
/// converted on every read from the Pod cache (which holds v1, the preferred version, so the
/// lists most clients ask for are the objects' one encoding).
pub mod v1alpha {
    use kube::CustomResource;
    use schemars::JsonSchema;
    use serde::{Deserialize, Serialize};

    use super::*;
    use aggregated_apiserver::resource::VersionOf;

    /// FarmPodSpec is what a FarmPod shows of its Pod's spec.
    #[derive(
        CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema,
    )]
    #[kube(
        group = "farm.example.com",
        version = "v1alpha",
        kind = "FarmPod",
        plural = "farmpods",
        namespaced,
        shortname = "fp",
        category = "farm",
        status = "FarmPodStatus"
    )]
    pub struct FarmPodSpec {
        /// Number of containers in the Pod (init containers not counted).
        pub containers: u32,
    }

    impl ServedResource for FarmPod {
        type Spec = FarmPodSpec;

        const SINGULAR: &'static str = "farmpod";
        const CATEGORIES: &'static [&'static str] = &["farm"];
        const DESCRIPTION: &'static str = <super::FarmPod as ServedResource>::DESCRIPTION;

        fn columns() -> Vec<ColumnDefinition> {
            super::FarmPod::columns()
        }

        fn cells(&self, now: jiff::Timestamp) -> Vec<Value> {
            super::FarmPod::from_stored(self).cells(now)
        }

        fn status_schema(generator: &mut SchemaGenerator) -> Option<Schema> {
            super::FarmPod::status_schema(generator)
        }
    }

    impl VersionOf<super::FarmPod> for FarmPod {
        fn from_stored(stored: &super::FarmPod) -> Self {
            FarmPod {
                metadata: stored.metadata.clone(),
                spec: FarmPodSpec {
                    containers: stored.spec.containers,
                },
                status: stored.status.clone(),
            }
        }

        fn to_stored(&self, _current: Option<&super::FarmPod>) -> super::FarmPod {
            super::FarmPod {
                metadata: self.metadata.clone(),
                spec: super::FarmPodSpec {
                    containers: self.spec.containers,
                },
                status: self.status.clone(),
            }
        }
    }

    impl VersionOf<FarmPod> for super::FarmPod {
        fn from_stored(stored: &FarmPod) -> Self {
            stored.to_stored(None)
        }

        fn to_stored(&self, _current: Option<&FarmPod>) -> FarmPod {
            FarmPod::from_stored(self)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod() -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web-1", "namespace": "shop", "uid": "u-1", "resourceVersion": "42",
                "labels": {"app": "web"}, "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"nodeName": "node-a", "containers": [{"name": "a"}, {"name": "b"}]},
            "status": {"phase": "Running", "podIP": "10.0.0.7", "containerStatuses": [
                {"name": "a", "ready": true, "restartCount": 2, "image": "x", "imageID": "",
                 "state": {"running": {}}},
                {"name": "b", "ready": false, "restartCount": 1, "image": "x", "imageID": "",
                 "state": {"waiting": {"reason": "CrashLoopBackOff"}}}
            ]}
        }))
        .unwrap()
    }

    #[test]
    fn projects_a_pod() {
        let fp = FarmPod::from_pod(&pod());
        assert_eq!(fp.metadata.name.as_deref(), Some("farm-web-1"));
        assert_eq!(fp.metadata.namespace.as_deref(), Some("shop"));
        assert_eq!(fp.metadata.resource_version.as_deref(), Some("42"));
        assert_eq!(fp.metadata.labels.as_ref().unwrap()["app"], "web");
        assert_eq!(fp.spec.containers, 2);
        let status = fp.status.clone().unwrap();
        assert_eq!(status.reason, "CrashLoopBackOff");
        assert_eq!(status.ready_containers, 1);
        assert_eq!(status.restarts, 3);
        // The uid is stable per Pod uid and differs from it.
        assert_eq!(fp.metadata.uid, FarmPod::from_pod(&pod()).metadata.uid);
        assert_ne!(fp.metadata.uid.as_deref(), Some("u-1"));
        let cells = fp.cells(jiff::Timestamp::now());
        assert_eq!(cells[0], 2);
        assert_eq!(cells[1], "1/2");
        assert_eq!(cells[2], "CrashLoopBackOff");
        assert_eq!(cells[3], 3);
        assert_eq!(cells[5], "node-a");
        assert_eq!(cells[6], "10.0.0.7");
    }

    #[test]
    fn written_cells_are_the_cells() {
        let now = jiff::Timestamp::now();
        let mut bare = FarmPod::from_pod(&pod());
        bare.status = None;
        bare.metadata.creation_timestamp = None;
        let mut quoted = FarmPod::from_pod(&pod());
        if let Some(status) = quoted.status.as_mut() {
            status.reason = "a \"quoted\" reason".into();
        }
        for fp in [FarmPod::from_pod(&pod()), bare, quoted] {
            let mut written = b"[0".to_vec();
            fp.write_cells(now, &mut written).unwrap();
            written.push(b']');
            let written: Vec<Value> = serde_json::from_slice(&written).unwrap();
            let mut expected = vec![Value::from(0)];
            expected.extend(fp.cells(now));
            assert_eq!(written, expected);
        }
    }

    #[test]
    fn terminating_wins() {
        let mut p = pod();
        p.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            jiff::Timestamp::now(),
        ));
        assert_eq!(FarmPod::from_pod(&p).status.unwrap().reason, "Terminating");
    }
}

#[cfg(test)]
mod view_tests {
    use std::time::Duration;

    use futures::StreamExt;
    use http::{Request, Response};
    use kube::client::Body;
    use serde_json::json;

    use super::*;
    use aggregated_apiserver::{
        store::selector::{Filter, LabelSelector},
        store::{
            CacheState, ClusterSource, ListRequest, Store, ViewCache, WatchItem, WatchRequest,
            WatchStart,
        },
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

    async fn synced(cache: &Arc<ViewCache<FarmPod>>, expected_rv: u64) {
        for _ in 0..200 {
            if matches!(cache.state(), CacheState::Synced { .. })
                && cache
                    .stats_sync()
                    .is_some_and(|s| s.resource_version >= expected_rv)
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!(
            "cache did not sync: {:?} {:?}",
            cache.state(),
            cache.stats_sync()
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
        let cache = ClusterSource::<FarmPod>::start(client, Vec::new());
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

        // The Table's cells after the name: containers, ready, status.
        let cells = page.items[0].get().cells(jiff::Timestamp::now());
        assert_eq!(cells[0], 2);
        assert_eq!(cells[2], "Running");

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
        let cache = synthetic_view(100);
        cache.check_ready().unwrap();
        assert_eq!(cache.stats_sync().unwrap().objects, 100);
        assert_eq!(
            ClusterSource::<FarmPod>::without_cluster()
                .check_ready()
                .unwrap_err()
                .code(),
            503
        );
    }
}
