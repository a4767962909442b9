//! Just enough kube-apiserver for farm-apiserver's delegated authorization: SubjectAccessReview
//! (always allowed, counted) and an empty, never-changing auth ConfigMap watch; and Namespaces
//! for its NamespaceLifecycle admission: every namespace exists, made (and announced to the
//! Namespace watch, as a cluster's informer would learn of it) when first looked up; and the
//! Pods [`crate::pods`] makes, when a scenario sets them. Plain
//! HTTP on loopback, so the measured server does real reviews and caches them.

use std::{
    collections::BTreeSet,
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
};

use axum::{
    Json, Router,
    body::Body,
    extract::{Path, RawQuery, State},
    response::{IntoResponse, Response},
    routing::{get, post},
};
use serde_json::{Value, json};

pub struct Fake {
    pub reviews: AtomicU64,
    /// Every request, reviews included (anything it does not serve is answered 404).
    pub requests: AtomicU64,
    /// Namespaces looked up so far, and their announcements to Namespace watches.
    namespaces: Mutex<BTreeSet<String>>,
    announced: tokio::sync::broadcast::Sender<String>,
    /// The admission configurations listed from now on (servers started earlier keep what
    /// they listed: the watches never tell them more).
    admission: Mutex<Vec<Value>>,
    /// The Pods it lists (none unless set).
    pub pods: Arc<crate::pods::PodSet>,
}

impl Default for Fake {
    fn default() -> Self {
        Self {
            reviews: AtomicU64::default(),
            requests: AtomicU64::default(),
            namespaces: Mutex::new(BTreeSet::from(["default".to_owned()])),
            announced: tokio::sync::broadcast::channel(1024).0,
            admission: Mutex::default(),
            pods: Default::default(),
        }
    }
}

impl Fake {
    /// Lists `objects` (ValidatingAdmissionPolicies, their bindings...) to servers started
    /// from now on.
    pub fn set_admission(&self, objects: Vec<Value>) {
        if let Ok(mut admission) = self.admission.lock() {
            *admission = objects;
        }
    }
}

fn namespace(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "resourceVersion": "1"}, "status": {"phase": "Active"}})
}

/// Every namespace exists: made on its first lookup, and announced to the watches.
async fn get_namespace(State(fake): State<Arc<Fake>>, Path(name): Path<String>) -> Json<Value> {
    let new = fake
        .namespaces
        .lock()
        .map(|mut known| known.insert(name.clone()))
        .unwrap_or(false);
    if new {
        let _ = fake.announced.send(name.clone());
    }
    Json(namespace(&name))
}

async fn namespaces(State(fake): State<Arc<Fake>>, RawQuery(q): RawQuery) -> Response {
    if q.unwrap_or_default().contains("watch=true") {
        let announced = fake.announced.subscribe();
        let events = futures::stream::unfold(announced, |mut rx| async move {
            let name = rx.recv().await.ok()?;
            let line = format!("{}\n", json!({"type": "ADDED", "object": namespace(&name)}));
            Some((Ok::<_, std::io::Error>(bytes::Bytes::from(line)), rx))
        });
        return (
            [("content-type", "application/json")],
            Body::from_stream(events),
        )
            .into_response();
    }
    let items: Vec<Value> = fake
        .namespaces
        .lock()
        .map(|known| known.iter().map(|n| namespace(n)).collect())
        .unwrap_or_default();
    Json(json!({"apiVersion": "v1", "kind": "NamespaceList", "metadata": {"resourceVersion": "1"}, "items": items}))
        .into_response()
}

async fn count(
    State(fake): State<Arc<Fake>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    fake.requests.fetch_add(1, Ordering::Relaxed);
    next.run(request).await
}

async fn review(State(fake): State<Arc<Fake>>, Json(mut review): Json<Value>) -> Json<Value> {
    fake.reviews.fetch_add(1, Ordering::Relaxed);
    review["status"] = json!({"allowed": true});
    Json(review)
}

async fn configmaps(RawQuery(q): RawQuery) -> Response {
    if q.unwrap_or_default().contains("watch=true") {
        // Open until the process ends: nothing ever changes.
        let never = futures::stream::pending::<Result<bytes::Bytes, std::io::Error>>();
        return (
            [("content-type", "application/json")],
            Body::from_stream(never),
        )
            .into_response();
    }
    Json(json!({"apiVersion": "v1", "kind": "ConfigMapList", "metadata": {"resourceVersion": "1"}, "items": []}))
        .into_response()
}

/// The cluster's admission configurations (webhooks, policies): what [`Fake::set_admission`]
/// set (none at first), never changing for a server that listed them.
async fn admission_configurations(
    State(fake): State<Arc<Fake>>,
    Path(resource): Path<String>,
    RawQuery(q): RawQuery,
) -> Response {
    if q.unwrap_or_default().contains("watch=true") {
        let never = futures::stream::pending::<Result<bytes::Bytes, std::io::Error>>();
        return (
            [("content-type", "application/json")],
            Body::from_stream(never),
        )
            .into_response();
    }
    let items: Vec<Value> = fake
        .admission
        .lock()
        .map(|objects| {
            objects
                .iter()
                .filter(|o| {
                    o["kind"].as_str().is_some_and(|kind| {
                        resource
                            == format!("{}s", kind.to_lowercase()).replace("policys", "policies")
                    })
                })
                .cloned()
                .collect()
        })
        .unwrap_or_default();
    Json(
        json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": format!("{resource}List"),
        "metadata": {"resourceVersion": "1"}, "items": items}),
    )
    .into_response()
}

/// Starts the fake; returns its address and counters.
pub async fn start() -> anyhow::Result<(SocketAddr, Arc<Fake>)> {
    let fake = Arc::new(Fake::default());
    let app = Router::new()
        .route(
            "/apis/authorization.k8s.io/v1/subjectaccessreviews",
            post(review),
        )
        .route("/api/v1/namespaces/kube-system/configmaps", get(configmaps))
        .route("/api/v1/namespaces", get(namespaces))
        .route(
            "/api/v1/pods",
            get(crate::pods::list_or_watch).with_state(fake.pods.clone()),
        )
        .route("/api/v1/namespaces/{name}", get(get_namespace))
        .route(
            "/apis/admissionregistration.k8s.io/v1/{resource}",
            get(admission_configurations),
        )
        .layer(axum::middleware::from_fn_with_state(fake.clone(), count))
        .with_state(fake.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok((addr, fake))
}

pub fn kubeconfig(addr: SocketAddr) -> String {
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: fake
  cluster:
    server: http://{addr}
users:
- name: bench
  user: {{}}
contexts:
- name: fake
  context:
    cluster: fake
    user: bench
current-context: fake
"
    )
}
