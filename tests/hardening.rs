//! What an attacker or a careless client must not be able to do: panic the server, grow its
//! memory without bound, hold its connections, or lose data. Each test here failed before the
//! fix it names.

mod common;

use std::sync::Arc;

use async_trait::async_trait;
use axum::http::StatusCode;
use common::{oneshot::*, oneshot_identity};
use farm_apiserver::{
    Result, recovery,
    resource::ObjectKey,
    resources::{FarmPod, Llama},
    server::{self, AppState},
    store::{
        ListRequest, MemoryStore, Object, PageInfo, PodCache, Preconditions, Store, StoreStats,
        WatchRequest, WatchStream,
    },
};
use http_body_util::BodyExt;
use serde_json::{Value, json};

const LLAMAS: &str = "/apis/farm.example.com/v1alpha/namespaces/default/llamas";

/// `?watch=true&timeoutSeconds=18446744073709551615` overflowed the deadline and panicked.
#[tokio::test]
async fn a_watch_timeout_of_u64_max_is_served() {
    let app = app();
    let mut request = axum::http::Request::get(format!(
        "{LLAMAS}?watch=true&timeoutSeconds=18446744073709551615"
    ))
    .extension(app.peer.clone())
    .body(axum::body::Body::empty())
    .unwrap();
    request
        .headers_mut()
        .insert("accept", "application/json".parse().unwrap());
    let response = tower::ServiceExt::oneshot(app.router.clone(), request)
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    let event: Value = serde_json::from_slice(&first).unwrap();
    assert_eq!(event["type"], "ADDED");
    assert_eq!(event["object"]["metadata"]["name"], "dolly");
}

/// A non-ASCII `generateName` over 58 bytes was cut inside a character and panicked; it is a
/// name validation would refuse anyway, so it is refused (422), as kube-apiserver does.
#[tokio::test]
async fn a_long_non_ascii_generate_name_is_invalid_not_a_panic() {
    let app = app();
    for prefix in ["é".repeat(40), format!("a{}", "ü".repeat(29))] {
        let body = json!({
            "apiVersion": "farm.example.com/v1alpha",
            "kind": "Llama",
            "metadata": {"generateName": prefix},
            "spec": {"weight": 1, "height": 1},
        });
        let reply = create(&app, "default", &body.to_string()).await;
        let message = reply.status(422, "Invalid");
        assert!(
            message.contains("metadata.name: Invalid value"),
            "{message}"
        );
    }
    // An ASCII prefix of any length is trimmed to 58 bytes plus 5 random characters.
    let body = json!({
        "apiVersion": "farm.example.com/v1alpha",
        "kind": "Llama",
        "metadata": {"generateName": "g".repeat(80)},
        "spec": {"weight": 1, "height": 1},
    });
    let reply = create(&app, "default", &body.to_string()).await;
    assert_eq!(
        reply.status,
        201,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    let name = reply.json()["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(name.len(), 63);
    assert!(name.starts_with(&"g".repeat(58)));
}

/// Names are DNS-1123 subdomains: up to 253 characters, no 63-character limit per part.
#[tokio::test]
async fn names_follow_is_dns1123_subdomain() {
    let app = app();
    for name in [
        "a".repeat(64),
        format!("{}.{}", "b".repeat(100), "c".repeat(152)),
    ] {
        let reply = create(&app, "default", &llama(&name, 1.0, 1.0)).await;
        assert_eq!(
            reply.status,
            201,
            "{}: {}",
            name.len(),
            String::from_utf8_lossy(&reply.body)
        );
        assert_eq!(get(&app, &format!("{LLAMAS}/{name}")).await.status, 200);
    }
    for name in ["d".repeat(254), "-a".into(), "a..b".into(), "A".into()] {
        let reply = create(&app, "default", &llama(&name, 1.0, 1.0)).await;
        reply.status(422, "Invalid");
    }
}

/// A store that panics on the Llama named `boom`, in its answer without waiting (a cached GET)
/// and in the waiting one (a list in namespace `boom`), and is a memory store otherwise.
struct Panicky(MemoryStore<Llama>);

fn boom(name: &str) {
    if name == "boom" {
        panic!("the store cannot bear {name}");
    }
}

#[async_trait]
impl Store<Llama> for Panicky {
    async fn get(&self, key: &ObjectKey) -> Result<Object<Llama>> {
        boom(&key.name);
        self.0.get(key).await
    }
    fn get_now(&self, key: &ObjectKey) -> Option<Result<Object<Llama>>> {
        boom(&key.name);
        self.0.get_now(key)
    }
    async fn list_each(
        &self,
        request: &ListRequest,
        visit: &mut (dyn for<'o> FnMut(&'o Object<Llama>) + Send),
    ) -> Result<PageInfo> {
        boom(request.namespace.as_deref().unwrap_or(""));
        self.0.list_each(request, visit).await
    }
    async fn create(&self, object: Llama, dry_run: bool) -> Result<Object<Llama>> {
        self.0.create(object, dry_run).await
    }
    async fn update(&self, object: Llama, dry_run: bool) -> Result<Object<Llama>> {
        self.0.update(object, dry_run).await
    }
    async fn delete(
        &self,
        key: &ObjectKey,
        preconditions: &Preconditions,
        dry_run: bool,
    ) -> Result<Object<Llama>> {
        self.0.delete(key, preconditions, dry_run).await
    }
    async fn watch(&self, request: WatchRequest) -> Result<WatchStream<Llama>> {
        self.0.watch(request).await
    }
    fn stats(&self) -> StoreStats {
        self.0.stats()
    }
}

/// A panic in a handler is a 500 Status (kube-apiserver's words), counted, and the server goes
/// on serving: on the path that answers at once and on the one that waits.
#[tokio::test]
async fn a_panicking_handler_is_a_500_and_the_server_serves_on() {
    let (options, peer) = oneshot_identity();
    let farmpods: Arc<dyn Store<FarmPod>> = PodCache::without_cluster();
    let (state, shutdown) =
        AppState::from_stores(Arc::new(Panicky(MemoryStore::default())), farmpods, options);
    std::mem::forget(shutdown);
    let app = App {
        router: server::app(state.clone()),
        peer,
    };
    let before = create(&app, "default", &llama("calm", 1.0, 1.0)).await;
    assert_eq!(before.status, 201);
    for uri in [
        format!("{LLAMAS}/boom"),
        "/apis/farm.example.com/v1alpha/namespaces/boom/llamas".to_owned(),
    ] {
        let reply = get(&app, &uri).await;
        let message = reply.status(500, "InternalError");
        assert_eq!(
            message,
            format!("Internal error occurred: {}", recovery::MESSAGE)
        );
        assert_eq!(get(&app, &format!("{LLAMAS}/calm")).await.status, 200);
    }
    let metrics = String::from_utf8(get(&app, "/metrics").await.body).unwrap();
    assert!(
        metrics.contains("farm_apiserver_request_panics_total 2"),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"apiserver_request_total{verb="get",resource="llamas",code="500"} 1"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"apiserver_request_total{verb="list",resource="llamas",code="500"} 1"#),
        "{metrics}"
    );
}

/// The spec is float64 (Kubernetes' `number`), stored and served as sent: a JSON patch `test`
/// of the value a GET shows matches (with f32 it was 31.399999618530273 inside and 422).
#[tokio::test]
async fn json_patch_test_matches_the_value_get_shows() {
    let app = app();
    let shown = get(&app, &format!("{LLAMAS}/dolly")).await.json();
    assert_eq!(shown["spec"]["weight"], json!(31.4));
    let patch = json!([
        {"op": "test", "path": "/spec/weight", "value": shown["spec"]["weight"]},
        {"op": "replace", "path": "/spec/height", "value": 0.1},
    ]);
    let reply = call(
        &app,
        "PATCH",
        &format!("{LLAMAS}/dolly"),
        &[("content-type", "application/json-patch+json")],
        &patch.to_string(),
    )
    .await;
    assert_eq!(
        reply.status,
        200,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    assert_eq!(reply.json()["spec"], json!({"weight": 31.4, "height": 0.1}));
    // Full float64 precision survives a round trip.
    let precise = 0.1 + 0.2;
    let reply = create(&app, "default", &llama("precise", precise, 1e300)).await;
    assert_eq!(reply.status, 201);
    let got = get(&app, &format!("{LLAMAS}/precise")).await.json();
    assert_eq!(got["spec"]["weight"].as_f64(), Some(precise));
    assert_eq!(got["spec"]["height"].as_f64(), Some(1e300));
}
