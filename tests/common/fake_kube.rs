//! A fake kube-apiserver on loopback (plain HTTP) for the parts of the Kubernetes API the server
//! calls: Pod list and watch. It counts every request, and can fail or cut watches on demand.
//! The real kube::Client and kube-runtime watcher talk to it over a real socket.

#![allow(dead_code)]

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
};

use axum::{
    Router,
    body::Body,
    extract::{Path, RawQuery, State},
    http::StatusCode,
    response::{IntoResponse, Response},
    routing::get,
};
use bytes::Bytes;
use serde_json::{Value, json};
use tokio::sync::broadcast;

#[derive(Default)]
struct Pods {
    items: BTreeMap<(String, String), Value>,
    rv: u64,
    /// Every event, so a watch from an older resourceVersion replays what it missed.
    history: Vec<(String, Value)>,
}

pub struct FakeKube {
    pub addr: SocketAddr,
    pods: Mutex<Pods>,
    events: broadcast::Sender<Option<(String, Value)>>,
    requests: AtomicUsize,
    /// The next this-many Pod requests answer 500.
    failures: AtomicUsize,
    pub log: Mutex<Vec<String>>,
}

pub fn pod(namespace: &str, name: &str, labels: &[(&str, &str)], containers: usize) -> Value {
    let labels: serde_json::Map<String, Value> = labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), Value::String((*v).to_owned())))
        .collect();
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name, "namespace": namespace, "uid": format!("uid-{namespace}-{name}"),
            "labels": labels, "creationTimestamp": "2026-01-01T00:00:00Z"
        },
        "spec": {
            "nodeName": "node-a",
            "containers": (0..containers).map(|i| json!({"name": format!("c{i}"), "image": "busybox"})).collect::<Vec<_>>()
        },
        "status": {
            "phase": "Running",
            "podIP": "10.1.2.3",
            "containerStatuses": (0..containers).map(|i| json!({
                "name": format!("c{i}"), "ready": true, "restartCount": 1, "image": "busybox", "imageID": "",
                "state": {"running": {"startedAt": "2026-01-01T00:00:01Z"}}
            })).collect::<Vec<_>>()
        }
    })
}

fn scope_matches(ns: Option<&str>, key: &(String, String)) -> bool {
    ns.is_none_or(|ns| ns == key.0)
}

impl FakeKube {
    pub async fn start() -> Arc<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (events, _) = broadcast::channel(1024);
        let fake = Arc::new(Self {
            addr: listener.local_addr().unwrap(),
            pods: Mutex::default(),
            events,
            requests: AtomicUsize::new(0),
            failures: AtomicUsize::new(0),
            log: Mutex::default(),
        });
        let app = Router::new()
            .route("/api/v1/pods", get(all_pods))
            .route("/api/v1/namespaces/{ns}/pods", get(namespaced_pods))
            .with_state(fake.clone());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        fake
    }

    pub async fn client(&self) -> kube::Client {
        let config = kube::Config::new(format!("http://{}", self.addr).parse().unwrap());
        kube::Client::try_from(config).unwrap()
    }

    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }

    pub fn fail_next(&self, count: usize) {
        self.failures.store(count, Ordering::SeqCst);
    }

    /// Ends every open watch (as a kube-apiserver restart would).
    pub fn cut_watches(&self) {
        let _ = self.events.send(None);
    }

    fn upsert(&self, mut pod: Value, type_: &str) {
        let mut pods = self.pods.lock().unwrap();
        pods.rv += 1;
        pod["metadata"]["resourceVersion"] = json!(pods.rv.to_string());
        let key = (
            pod["metadata"]["namespace"].as_str().unwrap().to_owned(),
            pod["metadata"]["name"].as_str().unwrap().to_owned(),
        );
        if type_ == "DELETED" {
            pods.items.remove(&key);
        } else {
            pods.items.insert(key, pod.clone());
        }
        pods.history.push((type_.to_owned(), pod.clone()));
        let _ = self.events.send(Some((type_.to_owned(), pod)));
    }

    pub fn add(&self, pod: Value) {
        let exists = {
            let pods = self.pods.lock().unwrap();
            pods.items.contains_key(&(
                pod["metadata"]["namespace"].as_str().unwrap().to_owned(),
                pod["metadata"]["name"].as_str().unwrap().to_owned(),
            ))
        };
        self.upsert(pod, if exists { "MODIFIED" } else { "ADDED" });
    }

    pub fn delete(&self, namespace: &str, name: &str) {
        let pod = self
            .pods
            .lock()
            .unwrap()
            .items
            .get(&(namespace.to_owned(), name.to_owned()))
            .cloned();
        if let Some(pod) = pod {
            self.upsert(pod, "DELETED");
        }
    }

    fn serve(self: Arc<Self>, ns: Option<String>, query: Option<String>) -> Response {
        self.requests.fetch_add(1, Ordering::SeqCst);
        let query = query.unwrap_or_default();
        self.log.lock().unwrap().push(query.clone());
        if self
            .failures
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return (StatusCode::INTERNAL_SERVER_ERROR, "{\"kind\":\"Status\",\"apiVersion\":\"v1\",\"status\":\"Failure\",\"message\":\"injected failure\",\"code\":500}").into_response();
        }
        let watch = query
            .split('&')
            .any(|kv| kv == "watch=true" || kv == "watch=1");
        let pods = self.pods.lock().unwrap();
        if !watch {
            let items: Vec<Value> = pods
                .items
                .iter()
                .filter(|(k, _)| scope_matches(ns.as_deref(), k))
                .map(|(_, v)| v.clone())
                .collect();
            let body = json!({"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": pods.rv.to_string()}, "items": items});
            return ([("content-type", "application/json")], body.to_string()).into_response();
        }
        let since: u64 = query
            .split('&')
            .find_map(|kv| kv.strip_prefix("resourceVersion="))
            .and_then(|v| v.parse().ok())
            .unwrap_or(pods.rv);
        let mut rx = self.events.subscribe();
        let missed: Vec<(String, Value)> = pods.history.clone();
        drop(pods);
        let stream = async_stream(move |tx: tokio::sync::mpsc::Sender<Bytes>| async move {
            for (type_, pod) in missed {
                let rv: u64 = pod["metadata"]["resourceVersion"]
                    .as_str()
                    .unwrap()
                    .parse()
                    .unwrap();
                let in_scope = ns
                    .as_deref()
                    .is_none_or(|ns| pod["metadata"]["namespace"] == ns);
                if rv > since && in_scope {
                    let line = format!("{}\n", json!({"type": type_, "object": pod}));
                    if tx.send(Bytes::from(line)).await.is_err() {
                        return;
                    }
                }
            }
            loop {
                match rx.recv().await {
                    Ok(Some((type_, pod))) => {
                        let rv: u64 = pod["metadata"]["resourceVersion"]
                            .as_str()
                            .unwrap()
                            .parse()
                            .unwrap();
                        let key = (
                            pod["metadata"]["namespace"].as_str().unwrap().to_owned(),
                            String::new(),
                        );
                        if rv <= since || !scope_matches(ns.as_deref(), &key) {
                            continue;
                        }
                        let line = format!("{}\n", json!({"type": type_, "object": pod}));
                        if tx.send(Bytes::from(line)).await.is_err() {
                            return;
                        }
                    }
                    Ok(None) | Err(_) => return,
                }
            }
        });
        (
            [("content-type", "application/json")],
            Body::from_stream(stream),
        )
            .into_response()
    }
}

/// A body stream fed by a task.
fn async_stream<F, Fut>(
    f: F,
) -> impl futures::Stream<Item = Result<Bytes, std::convert::Infallible>>
where
    F: FnOnce(tokio::sync::mpsc::Sender<Bytes>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(f(tx));
    futures::stream::unfold(
        rx,
        |mut rx| async move { rx.recv().await.map(|b| (Ok(b), rx)) },
    )
}

async fn all_pods(State(fake): State<Arc<FakeKube>>, RawQuery(q): RawQuery) -> Response {
    fake.serve(None, q)
}

async fn namespaced_pods(
    State(fake): State<Arc<FakeKube>>,
    Path(ns): Path<String>,
    RawQuery(q): RawQuery,
) -> Response {
    fake.serve(Some(ns), q)
}
