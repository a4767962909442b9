//! A handler that panics is a 500 and the server serves on; audited too.

use super::*;

/// A store that panics on the Llama named `boom`, in its answer without waiting (a cached GET)
/// and in the waiting one (a list in namespace `boom`), and is a memory store otherwise.
pub(super) struct Panicky(MemoryStore<Llama>);

pub(super) fn boom(name: &str) {
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
    fn get_sync(&self, namespace: &str, name: &str) -> Option<Result<Object<Llama>>> {
        boom(name);
        self.0.get_sync(namespace, name)
    }
    async fn list_each(
        &self,
        request: &ListRequest,
        visit: &mut (dyn for<'o> FnMut(&'o Object<Llama>) + Send),
    ) -> Result<PageInfo> {
        boom(request.namespace.as_deref().unwrap_or(""));
        self.0.list_each(request, visit).await
    }
    async fn watch(&self, request: WatchRequest) -> Result<WatchStream<Llama>> {
        self.0.watch(request).await
    }
    async fn stats(&self) -> Result<StoreStats> {
        Store::stats(&self.0).await
    }
    fn writable(&self) -> Option<&dyn WritableStore<Llama>> {
        Some(self)
    }
}

#[async_trait::async_trait]
impl WritableStore<Llama> for Panicky {
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
}

/// A panic in a handler is a 500 Status (kube-apiserver's words), counted, and the server goes
/// on serving: on the path that answers at once and on the one that waits.
#[tokio::test]
async fn a_panicking_handler_is_a_500_and_the_server_serves_on() {
    let (options, peer) = oneshot_identity();
    let group = ApiGroup::new(farm_apiserver::resources::GROUP)
        .serve::<Llama>(Arc::new(Panicky(MemoryStore::default())));
    let (state, _shutdown) = AppState::new(group, options).unwrap();
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
        metrics.contains(r#"apiserver_request_total{verb="GET",resource="llamas",code="500"} 1"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"apiserver_request_total{verb="LIST",resource="llamas",code="500"} 1"#),
        "{metrics}"
    );
}

/// With an audit log, a handler's panic writes kube-apiserver's Panic event (500 "APIServer
/// panic'd") after RequestReceived, on the path that answers at once as on the one that
/// waits; the server serves on.
#[tokio::test]
async fn a_panicking_handler_is_audited() {
    let (mut options, peer) = oneshot_identity();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.log");
    options.audit = Some(crate::audit::auditor(
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: Metadata\n",
        &path,
    ));
    let group = ApiGroup::new(farm_apiserver::resources::GROUP)
        .serve::<Llama>(Arc::new(Panicky(MemoryStore::default())));
    let (state, _shutdown) = AppState::new(group, options).unwrap();
    let app = App {
        router: server::app(state.clone()),
        peer,
    };
    for (uri, id) in [
        (
            format!("{LLAMAS}/boom"),
            "11111111-8b86-4011-b42d-00cf4fc964ff",
        ),
        (
            "/apis/farm.example.com/v1alpha/namespaces/boom/llamas".to_owned(),
            "22222222-8b86-4011-b42d-00cf4fc964ff",
        ),
    ] {
        let reply = call(&app, "GET", &uri, &[("audit-id", id)], "").await;
        assert_eq!(reply.status, 500);
        let written = crate::audit::events(&path, id, 2).await;
        assert_eq!(
            crate::audit::stages(&written),
            ["RequestReceived", "Panic"],
            "{uri}"
        );
        let status = &written[1]["responseStatus"];
        assert_eq!(status["code"], 500);
        assert_eq!(status["message"], "APIServer panic'd");
        assert_eq!(written[1]["user"]["username"], "farm-dev-admin");
    }
    assert_eq!(get(&app, &format!("{LLAMAS}/calm")).await.status, 404);
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
