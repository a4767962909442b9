//! Just enough kube-apiserver for farm-apiserver's delegated authorization: SubjectAccessReview
//! (always allowed, counted) and an empty, never-changing auth ConfigMap watch. Plain HTTP on
//! loopback, so the measured server does real reviews and caches them.

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
};

use axum::{
    Json, Router,
    body::Body,
    extract::{RawQuery, State},
    response::{IntoResponse, Response},
    routing::{get, post},
};
use serde_json::{Value, json};

#[derive(Default)]
pub struct Fake {
    pub reviews: AtomicU64,
    /// Every request, reviews included (anything else, Pods for one, is answered 404).
    pub requests: AtomicU64,
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

/// Starts the fake; returns its address and counters.
pub async fn start() -> anyhow::Result<(SocketAddr, Arc<Fake>)> {
    let fake = Arc::new(Fake::default());
    let app = Router::new()
        .route(
            "/apis/authorization.k8s.io/v1/subjectaccessreviews",
            post(review),
        )
        .route("/api/v1/namespaces/kube-system/configmaps", get(configmaps))
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
