//! A fake kube-apiserver on loopback (plain HTTP) for the parts of the Kubernetes API the server
//! calls: Pod list and watch. It counts every request, and can fail or cut watches on demand.
//! The real kube::Client and kube-runtime watcher talk to it over a real socket.

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

/// (allowed, reason) for a SubjectAccessReview spec.
type Policy = dyn Fn(&Value) -> (bool, String) + Send + Sync;

#[derive(Default)]
struct Pods {
    /// (resource, namespace, name) → object.
    items: BTreeMap<(String, String, String), Value>,
    rv: u64,
    /// Every event, so a watch from an older resourceVersion replays what it missed.
    history: Vec<(String, Value)>,
    /// Watches from below this resourceVersion get 410 Expired (history compacted).
    compacted: u64,
}

pub struct FakeKube {
    pub addr: SocketAddr,
    pods: Mutex<Pods>,
    events: broadcast::Sender<Option<(String, Value)>>,
    /// Decides SubjectAccessReviews: (allowed, reason) for a review's spec.
    policy: Mutex<Box<Policy>>,
    /// Every SubjectAccessReview spec received.
    pub reviews: Mutex<Vec<Value>>,
    /// Bearer tokens TokenReview accepts, with their user.
    pub tokens: Mutex<BTreeMap<String, (String, Vec<String>)>>,
    pub token_reviews: AtomicUsize,
    review_delay: Mutex<std::time::Duration>,
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

fn resource_of(object: &Value) -> String {
    match object["kind"].as_str() {
        Some("ConfigMap") => "configmaps".into(),
        Some("Namespace") => "namespaces".into(),
        Some("Service") => "services".into(),
        Some("ValidatingWebhookConfiguration") => "validatingwebhookconfigurations".into(),
        Some("MutatingWebhookConfiguration") => "mutatingwebhookconfigurations".into(),
        Some("ValidatingAdmissionPolicy") => "validatingadmissionpolicies".into(),
        Some("ValidatingAdmissionPolicyBinding") => "validatingadmissionpolicybindings".into(),
        Some("MutatingAdmissionPolicy") => "mutatingadmissionpolicies".into(),
        Some("MutatingAdmissionPolicyBinding") => "mutatingadmissionpolicybindings".into(),
        _ => "pods".into(),
    }
}

/// A Namespace, Active or (with `terminating`) being deleted.
pub fn namespace(name: &str, terminating: bool) -> Value {
    let mut ns = json!({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": name, "uid": format!("uid-{name}")},
        "status": {"phase": if terminating { "Terminating" } else { "Active" }},
    });
    if terminating {
        ns["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
    }
    ns
}

fn key_of(object: &Value) -> (String, String, String) {
    (
        resource_of(object),
        object["metadata"]["namespace"]
            .as_str()
            .unwrap_or("")
            .to_owned(),
        object["metadata"]["name"].as_str().unwrap_or("").to_owned(),
    )
}

fn in_scope(resource: &str, ns: Option<&str>, object: &Value) -> bool {
    resource_of(object) == resource && ns.is_none_or(|ns| object["metadata"]["namespace"] == ns)
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
            policy: Mutex::new(Box::new(|_| (true, String::new()))),
            reviews: Mutex::default(),
            tokens: Mutex::default(),
            token_reviews: AtomicUsize::new(0),
            review_delay: Mutex::default(),
        });
        let app = Router::new()
            .route("/api/v1/pods", get(all_pods))
            .route("/api/v1/configmaps", get(all_configmaps))
            .route("/api/v1/services", get(all_services))
            .route("/api/v1/namespaces", get(all_namespaces))
            .route("/api/v1/namespaces/{name}", get(one_namespace))
            .route("/api/v1/namespaces/{ns}/{resource}", get(namespaced))
            .route(
                "/api/v1/namespaces/{ns}/{resource}/{name}",
                get(one_namespaced),
            )
            .route(
                "/apis/admissionregistration.k8s.io/v1/{resource}",
                get(admission_configurations),
            )
            .route(
                "/apis/authorization.k8s.io/v1/subjectaccessreviews",
                axum::routing::post(subject_access_review),
            )
            .route(
                "/apis/authentication.k8s.io/v1/tokenreviews",
                axum::routing::post(token_review),
            )
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

    /// Watches open now (each holds a receiver of the events; one whose client went away
    /// lets it go at the next event).
    pub fn open_watches(&self) -> usize {
        self.events.receiver_count()
    }

    /// Ends every open watch (as a kube-apiserver restart would).
    pub fn cut_watches(&self) {
        let _ = self.events.send(None);
    }

    /// As a kube-apiserver restart over a compacted etcd: `change` edits the Pods unseen by any
    /// watch, the history is compacted, and every open watch ends; a watch resuming from before
    /// now gets 410 Expired (an ERROR event), so the client relists.
    pub fn compact_with(&self, change: impl FnOnce(&mut dyn FnMut(&str, Value))) {
        {
            let mut pods = self.pods.lock().unwrap();
            change(&mut |type_: &str, mut pod: Value| {
                pods.rv += 1;
                pod["metadata"]["resourceVersion"] = json!(pods.rv.to_string());
                let key = key_of(&pod);
                if type_ == "DELETED" {
                    pods.items.remove(&key);
                } else {
                    pods.items.insert(key, pod);
                }
            });
            pods.history.clear();
            pods.compacted = pods.rv;
        }
        self.cut_watches();
    }

    /// Who may do what: called with each SubjectAccessReview's spec.
    pub fn set_policy(&self, policy: impl Fn(&Value) -> (bool, String) + Send + Sync + 'static) {
        *self.policy.lock().unwrap() = Box::new(policy);
    }

    /// SubjectAccessReviews are answered this much later (a slow kube-apiserver).
    pub fn delay_reviews(&self, delay: std::time::Duration) {
        *self.review_delay.lock().unwrap() = delay;
    }

    pub fn sar_count(&self) -> usize {
        self.reviews.lock().unwrap().len()
    }

    fn upsert(&self, mut pod: Value, type_: &str) {
        let mut pods = self.pods.lock().unwrap();
        pods.rv += 1;
        pod["metadata"]["resourceVersion"] = json!(pods.rv.to_string());
        let key = key_of(&pod);
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
            pods.items.contains_key(&key_of(&pod))
        };
        self.upsert(pod, if exists { "MODIFIED" } else { "ADDED" });
    }

    /// Removes `object` (matched by kind, namespace and name), as a DELETED event.
    pub fn remove(&self, object: &Value) {
        let found = self
            .pods
            .lock()
            .unwrap()
            .items
            .get(&key_of(object))
            .cloned();
        if let Some(found) = found {
            self.upsert(found, "DELETED");
        }
    }

    pub fn delete(&self, namespace: &str, name: &str) {
        let pod = self
            .pods
            .lock()
            .unwrap()
            .items
            .get(&("pods".to_owned(), namespace.to_owned(), name.to_owned()))
            .cloned();
        if let Some(pod) = pod {
            self.upsert(pod, "DELETED");
        }
    }

    fn serve(
        self: Arc<Self>,
        resource: String,
        ns: Option<String>,
        query: Option<String>,
    ) -> Response {
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
                .values()
                .filter(|v| in_scope(&resource, ns.as_deref(), v))
                .cloned()
                .collect();
            let (api_version, kind) = match resource.as_str() {
                "configmaps" => ("v1", "ConfigMapList"),
                "services" => ("v1", "ServiceList"),
                "namespaces" => ("v1", "NamespaceList"),
                "validatingwebhookconfigurations" => (
                    "admissionregistration.k8s.io/v1",
                    "ValidatingWebhookConfigurationList",
                ),
                "mutatingwebhookconfigurations" => (
                    "admissionregistration.k8s.io/v1",
                    "MutatingWebhookConfigurationList",
                ),
                "validatingadmissionpolicies" => (
                    "admissionregistration.k8s.io/v1",
                    "ValidatingAdmissionPolicyList",
                ),
                "validatingadmissionpolicybindings" => (
                    "admissionregistration.k8s.io/v1",
                    "ValidatingAdmissionPolicyBindingList",
                ),
                "mutatingadmissionpolicies" => (
                    "admissionregistration.k8s.io/v1",
                    "MutatingAdmissionPolicyList",
                ),
                "mutatingadmissionpolicybindings" => (
                    "admissionregistration.k8s.io/v1",
                    "MutatingAdmissionPolicyBindingList",
                ),
                _ => ("v1", "PodList"),
            };
            let body = json!({"apiVersion": api_version, "kind": kind, "metadata": {"resourceVersion": pods.rv.to_string()}, "items": items});
            return ([("content-type", "application/json")], body.to_string()).into_response();
        }
        let since: u64 = query
            .split('&')
            .find_map(|kv| kv.strip_prefix("resourceVersion="))
            .and_then(|v| v.parse().ok())
            .unwrap_or(pods.rv);
        if since < pods.compacted {
            let expired = json!({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1",
                "metadata": {}, "status": "Failure", "reason": "Expired", "code": 410,
                "message": format!("too old resource version: {since} ({})", pods.compacted)}});
            return (
                [("content-type", "application/json")],
                format!("{expired}\n"),
            )
                .into_response();
        }
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
                if rv > since && in_scope(&resource, ns.as_deref(), &pod) {
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
                        if rv <= since || !in_scope(&resource, ns.as_deref(), &pod) {
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
    fake.serve("pods".into(), None, q)
}

async fn all_configmaps(State(fake): State<Arc<FakeKube>>, RawQuery(q): RawQuery) -> Response {
    fake.serve("configmaps".into(), None, q)
}

async fn all_services(State(fake): State<Arc<FakeKube>>, RawQuery(q): RawQuery) -> Response {
    fake.serve("services".into(), None, q)
}

async fn admission_configurations(
    State(fake): State<Arc<FakeKube>>,
    Path(resource): Path<String>,
    RawQuery(q): RawQuery,
) -> Response {
    fake.serve(resource, None, q)
}

async fn all_namespaces(State(fake): State<Arc<FakeKube>>, RawQuery(q): RawQuery) -> Response {
    fake.serve("namespaces".into(), None, q)
}

async fn one_namespace(State(fake): State<Arc<FakeKube>>, Path(name): Path<String>) -> Response {
    fake.one("namespaces", "", &name)
}

async fn one_namespaced(
    State(fake): State<Arc<FakeKube>>,
    Path((ns, resource, name)): Path<(String, String, String)>,
) -> Response {
    fake.one(&resource, &ns, &name)
}

impl FakeKube {
    /// A GET of one object, or kube-apiserver's 404.
    fn one(&self, resource: &str, ns: &str, name: &str) -> Response {
        let found = self
            .pods
            .lock()
            .unwrap()
            .items
            .get(&(resource.to_owned(), ns.to_owned(), name.to_owned()))
            .cloned();
        match found {
            Some(object) => {
                ([("content-type", "application/json")], object.to_string()).into_response()
            }
            None => (
                StatusCode::NOT_FOUND,
                [("content-type", "application/json")],
                json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404,
                    "message": format!("{resource} \"{name}\" not found"),
                    "details": {"name": name, "kind": resource}})
                .to_string(),
            )
                .into_response(),
        }
    }
}

async fn namespaced(
    State(fake): State<Arc<FakeKube>>,
    Path((ns, resource)): Path<(String, String)>,
    RawQuery(q): RawQuery,
) -> Response {
    fake.serve(resource, Some(ns), q)
}

async fn subject_access_review(
    State(fake): State<Arc<FakeKube>>,
    axum::Json(review): axum::Json<Value>,
) -> Response {
    let delay = *fake.review_delay.lock().unwrap();
    tokio::time::sleep(delay).await;
    let spec = review["spec"].clone();
    let (allowed, reason) = (fake.policy.lock().unwrap())(&spec);
    fake.reviews.lock().unwrap().push(spec);
    let mut out = review;
    out["status"] = json!({"allowed": allowed, "reason": reason});
    axum::Json(out).into_response()
}

async fn token_review(
    State(fake): State<Arc<FakeKube>>,
    axum::Json(review): axum::Json<Value>,
) -> Response {
    fake.token_reviews.fetch_add(1, Ordering::SeqCst);
    let token = review["spec"]["token"].as_str().unwrap_or("").to_owned();
    let known = fake.tokens.lock().unwrap().get(&token).cloned();
    let mut out = review;
    out["status"] = match known {
        Some((user, groups)) => {
            json!({"authenticated": true, "user": {"username": user, "groups": groups}})
        }
        None => json!({"authenticated": false}),
    };
    axum::Json(out).into_response()
}

/// The ConfigMap kube-apiserver publishes for extension API servers.
pub fn auth_configmap(
    requestheader_ca: &str,
    allowed_names: &[&str],
    client_ca: Option<&str>,
) -> Value {
    let mut data = json!({
        "requestheader-client-ca-file": requestheader_ca,
        "requestheader-allowed-names": serde_json::to_string(allowed_names).unwrap(),
        "requestheader-username-headers": "[\"X-Remote-User\"]",
        "requestheader-group-headers": "[\"X-Remote-Group\"]",
        "requestheader-extra-headers-prefix": "[\"X-Remote-Extra-\"]",
    });
    if let Some(ca) = client_ca {
        data["client-ca-file"] = json!(ca);
    }
    json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "extension-apiserver-authentication", "namespace": "kube-system"},
        "data": data
    })
}
