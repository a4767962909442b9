//! The whole HTTP surface driven with `oneshot`, no socket: requests carry the dev admin's
//! certificate chain as the listener would hand it over.

use axum::{
    body::Body,
    http::{Request, StatusCode},
};
use std::sync::Arc;

use aggregated_apiserver::{
    auth::PeerCertificates,
    server::{self, AppState},
    store::{ClusterSource, Store},
};
use farm_apiserver::resources::{self, Llama};
use http_body_util::BodyExt;
use serde_json::Value;
use tower::ServiceExt;

use super::oneshot_identity as identity;

pub const BASE: &str = "/apis/farm.example.com/v1alpha";
pub const TABLE_ACCEPT: &str = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";

#[derive(Clone)]
pub struct App {
    pub router: server::App,
    pub peer: PeerCertificates,
}

pub fn app() -> App {
    app_with_state().0
}

/// The app with its Llamas on `storage` (seeded with dolly), and the etcd it uses (kept
/// running while held); None (SKIPPED printed) for etcd when there is none.
pub async fn app_on(storage: super::TestStorage) -> Option<(App, Option<super::etcd::Etcd>)> {
    app_on_with(storage, false).await
}

/// [`app_on`], its deletes adding the garbage collector's finalizers when `gc`.
pub async fn app_on_with(
    storage: super::TestStorage,
    gc: bool,
) -> Option<(App, Option<super::etcd::Etcd>)> {
    let (mut options, peer) = identity();
    options.rest.garbage_collection = gc;
    let (storage, etcd) =
        super::storage_on(storage, ClusterSource::without_cluster(), true).await?;
    let (state, _shutdown) = AppState::new(resources::register(&storage), options).unwrap();
    let app = App {
        router: server::app(state),
        peer,
    };
    if etcd.is_some() {
        let ready = || async { get(&app, "/readyz/etcd").await.status == StatusCode::OK };
        super::seed_etcd(ready, storage.store::<Llama>().as_ref(), true).await;
    }
    Some((app, etcd))
}

/// The app (in memory, with dolly), and its Llama store.
pub fn app_with_state() -> (App, Arc<dyn Store<Llama>>) {
    let (options, peer) = identity();
    let storage = super::storage::memory(ClusterSource::without_cluster(), true);
    // Dropping the shutdown handle ends nothing: watches stay open.
    let (state, _shutdown) = AppState::new(resources::register(&storage), options).unwrap();
    (
        App {
            router: server::app(state),
            peer,
        },
        storage.store(),
    )
}

pub struct Reply {
    pub status: StatusCode,
    pub headers: axum::http::HeaderMap,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    /// Asserts a Status body with this code and reason; returns its message.
    pub fn status(&self, code: u16, reason: &str) -> String {
        let body = self.json();
        assert_eq!(self.status.as_u16(), code, "{body}");
        assert_eq!(body["kind"], "Status", "{body}");
        assert_eq!(body["apiVersion"], "v1");
        assert_eq!(body["status"], "Failure");
        assert_eq!(body["code"], code);
        assert_eq!(body["reason"], reason, "{body}");
        body["message"].as_str().unwrap_or_default().to_owned()
    }
}

pub async fn call(
    app: &App,
    method: &str,
    uri: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Reply {
    let mut request = Request::builder()
        .method(method)
        .uri(uri)
        .extension(app.peer.clone());
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    let response = app
        .router
        .clone()
        .oneshot(request.body(Body::from(body.to_owned())).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let body = response
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .to_vec();
    Reply {
        status,
        headers,
        body,
    }
}

/// The response to `GET uri` with `headers`, its body unread: a watch's never ends.
pub async fn open(app: &App, uri: &str, headers: &[(&str, &str)]) -> axum::response::Response {
    let mut request = Request::get(uri).extension(app.peer.clone());
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    app.router
        .clone()
        .oneshot(request.body(Body::empty()).unwrap())
        .await
        .unwrap()
}

pub async fn get(app: &App, uri: &str) -> Reply {
    call(app, "GET", uri, &[], "").await
}

pub fn llama(name: &str, weight: f64, height: f64) -> String {
    super::fixtures::llama(name)
        .weight(weight)
        .height(height)
        .json()
}

pub async fn create(app: &App, ns: &str, body: &str) -> Reply {
    call(
        app,
        "POST",
        &format!("{BASE}/namespaces/{ns}/llamas"),
        &[("content-type", "application/json")],
        body,
    )
    .await
}
