//! Discovery, health, metrics, routing and OpenAPI as kube-apiserver answers them.

use super::*;

#[tokio::test]
async fn resource_list_has_exact_group_version_and_verbs() {
    let reply = get(&app(), BASE).await;
    assert_eq!(reply.status, StatusCode::OK);
    let body = reply.json();
    assert_eq!(body["kind"], "APIResourceList");
    assert_eq!(body["apiVersion"], "v1");
    assert_eq!(body["groupVersion"], "farm.example.com/v1alpha");
    let llamas = &body["resources"][0];
    assert_eq!(llamas["name"], "llamas");
    assert_eq!(llamas["singularName"], "llama");
    assert_eq!(llamas["kind"], "Llama");
    assert_eq!(llamas["namespaced"], true);
    assert_eq!(llamas["shortNames"], json!(["ll"]));
    assert_eq!(llamas["categories"], json!(["farm"]));
    let verbs: Vec<&str> = llamas["verbs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    for verb in [
        "get",
        "list",
        "watch",
        "create",
        "update",
        "patch",
        "delete",
        "deletecollection",
    ] {
        assert!(verbs.contains(&verb), "{verb} missing from {verbs:?}");
    }
}

#[tokio::test]
async fn apis_negotiates_aggregated_discovery_with_etag() {
    let app = app();
    let accept = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList";
    let reply = call(&app, "GET", "/apis", &[("accept", accept)], "").await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(
        reply.headers["content-type"],
        "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
    );
    assert_eq!(reply.headers["vary"], "Accept");
    let etag = reply.headers["etag"].to_str().unwrap().to_owned();
    assert!(etag.starts_with('"') && etag.len() == 130, "{etag}");
    let body = reply.json();
    assert_eq!(body["kind"], "APIGroupDiscoveryList");
    assert_eq!(body["apiVersion"], "apidiscovery.k8s.io/v2");
    assert_eq!(body["items"].as_array().unwrap().len(), 1, "only our group");
    assert_eq!(body["items"][0]["metadata"]["name"], "farm.example.com");
    // Both versions, the preferred (v1) first; Llamas and FarmPods in each.
    let versions = body["items"][0]["versions"].as_array().unwrap();
    let names: Vec<_> = versions.iter().map(|v| v["version"].clone()).collect();
    assert_eq!(names, [json!("v1"), json!("v1alpha")]);
    for version in versions {
        assert_eq!(version["freshness"], "Current");
        assert_eq!(version["resources"][0]["resource"], "llamas");
        assert_eq!(version["resources"][0]["scope"], "Namespaced");
        assert_eq!(
            version["resources"][0]["responseKind"],
            json!({"group": "farm.example.com", "version": version["version"], "kind": "Llama"})
        );
    }
    let resources = |v: &Value| -> Vec<Value> {
        v["resources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["resource"].clone())
            .collect()
    };
    assert_eq!(
        resources(&versions[0]),
        [json!("llamas"), json!("farmpods")]
    );
    assert_eq!(
        resources(&versions[1]),
        [json!("llamas"), json!("farmpods")]
    );

    let again = call(
        &app,
        "GET",
        "/apis",
        &[("accept", accept), ("if-none-match", &etag)],
        "",
    )
    .await;
    assert_eq!(again.status, StatusCode::NOT_MODIFIED);
    assert!(again.body.is_empty());

    let beta = "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList";
    let reply = call(&app, "GET", "/apis", &[("accept", beta)], "").await;
    assert_eq!(reply.headers["content-type"], beta);
    assert_eq!(reply.json()["apiVersion"], "apidiscovery.k8s.io/v2beta1");
    assert_ne!(reply.headers["etag"].to_str().unwrap(), etag);

    let legacy = call(&app, "GET", "/apis", &[("accept", "application/json")], "").await;
    assert_eq!(legacy.json()["kind"], "APIGroupList");
    assert_eq!(
        legacy.json()["groups"][0]["preferredVersion"]["groupVersion"],
        "farm.example.com/v1"
    );
    assert_eq!(
        legacy.json()["groups"][0]["versions"],
        json!([
            {"groupVersion": "farm.example.com/v1", "version": "v1"},
            {"groupVersion": "farm.example.com/v1alpha", "version": "v1alpha"},
        ])
    );

    let refused = call(
        &app,
        "GET",
        "/apis",
        &[("accept", "application/vnd.kubernetes.protobuf")],
        "",
    )
    .await;
    refused.status(406, "NotAcceptable");
}

#[tokio::test]
async fn group_api_and_version_for_standalone_kubectl() {
    let app = app();
    let group = get(&app, "/apis/farm.example.com").await.json();
    assert_eq!(group["kind"], "APIGroup");
    assert_eq!(group["name"], "farm.example.com");
    let api = get(&app, "/api").await.json();
    assert_eq!(api["kind"], "APIVersions");
    assert_eq!(api["versions"], json!([]));
    let version = get(&app, "/version").await.json();
    assert!(version["gitVersion"].as_str().unwrap().starts_with('v'));
}

#[tokio::test]
async fn health_endpoints() {
    let (options, peer) = identity();
    let (state, shutdown) = common::memory_state(true, options);
    let app = App {
        router: server::app(state),
        peer,
    };
    let ok = get(&app, "/readyz").await;
    assert_eq!(ok.status, StatusCode::OK);
    assert_eq!(ok.body, b"ok");
    let verbose = String::from_utf8(get(&app, "/readyz?verbose").await.body).unwrap();
    assert!(
        verbose.contains("[+]ping ok") && verbose.contains("[+]shutdown ok"),
        "{verbose}"
    );
    assert_eq!(get(&app, "/livez").await.status, StatusCode::OK);
    assert_eq!(get(&app, "/healthz/ping").await.status, StatusCode::OK);
    shutdown.begin();
    let failing = get(&app, "/readyz").await;
    assert_eq!(failing.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(String::from_utf8_lossy(&failing.body).contains("[-]shutdown failed"));
    assert_eq!(
        get(&app, "/livez").await.status,
        StatusCode::OK,
        "alive while draining"
    );
}

#[tokio::test]
async fn metrics_count_requests_and_objects() {
    let app = app();
    get(&app, &format!("{BASE}/namespaces/default/llamas/dolly")).await;
    get(&app, &format!("{BASE}/namespaces/default/llamas/nope")).await;
    let text = String::from_utf8(get(&app, "/metrics").await.body).unwrap();
    assert!(
        text.contains(r#"apiserver_request_total{verb="GET",resource="llamas",code="200"} 1"#),
        "{text}"
    );
    assert!(text.contains(r#"apiserver_request_total{verb="GET",resource="llamas",code="404"} 1"#));
    assert!(text.contains(r#"apiserver_storage_objects{resource="llamas.farm.example.com"} 1"#));
    assert!(text.contains("apiserver_request_duration_seconds_bucket"));
    assert!(text.contains("apiserver_longrunning_requests"));
}

#[tokio::test]
async fn resource_paths_match_exactly_as_kube_apiserver_lays_them_out() {
    let app = app();
    // A percent-encoded name is the name it decodes to, as Go's net/url gives it.
    let reply = get(&app, &format!("{BASE}/namespaces/default/llamas/dol%6Cy")).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.json()["metadata"]["name"], "dolly");
    // HEAD is a GET without a body.
    let reply = call(
        &app,
        "HEAD",
        &format!("{BASE}/namespaces/default/llamas/dolly"),
        &[],
        "",
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK);
    // No subresources, no deeper paths, no cluster-wide items of a namespaced kind, no empty
    // segments, no unknown kinds: each is a 404 Status, never a guess.
    for path in [
        format!("{BASE}/namespaces/default/llamas/dolly/status"),
        format!("{BASE}/namespaces/default/llamas/dolly/status/x"),
        format!("{BASE}/llamas/dolly"),
        format!("{BASE}/namespaces//llamas"),
        format!("{BASE}/namespaces/default/llamas/"),
        format!("{BASE}/namespaces/default/alpacas"),
        format!("{BASE}/namespaces/default"),
    ] {
        let reply = get(&app, &path).await;
        assert_eq!(reply.status, StatusCode::NOT_FOUND, "{path}");
        assert_eq!(reply.json()["kind"], "Status", "{path}");
    }
    // A segment that does not decode to UTF-8 is the client's mistake.
    get(&app, &format!("{BASE}/namespaces/default/llamas/%FF"))
        .await
        .status(400, "BadRequest");
}

// The Llama API on both storages: in memory and on a real etcd.
crate::on_both_storages!(
    get_returns_the_sample_and_404_is_a_status,
    a_named_get_with_watch_streams_that_object_and_bad_options_are_400,
    table_has_columns_rows_and_partial_metadata,
    create_update_patch_delete_round_trip,
    generate_name_dry_run_and_already_exists,
    list_query_errors,
    label_selected_lists_follow_updates_relabels_and_deletes,
    selectors_and_pagination,
    unsupported_methods_are_405_status,
    deletecollection_honours_selectors,
);

/// `/openapi/v2` as kube-openapi serves it: JSON by default, gnostic's protobuf when the client
/// asks for it (client-go's `OpenAPISchema` sends the deprecated name), 406 for neither.
#[tokio::test]
async fn openapi_v2_is_served_as_protobuf_when_asked_for() {
    let app = app();
    for accept in [
        "application/com.github.proto-openapi.spec.v2@v1.0+protobuf",
        "application/com.github.proto-openapi.spec.v2.v1.0+protobuf, application/json;q=0.5",
    ] {
        let reply = call(&app, "GET", "/openapi/v2", &[("accept", accept)], "").await;
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(
            reply.headers["content-type"],
            "application/com.github.proto-openapi.spec.v2.v1.0+protobuf"
        );
        // Document.swagger (field 1, length-delimited): "2.0".
        assert_eq!(&reply.body[..5], b"\x0a\x032.0");
        let text = String::from_utf8_lossy(&reply.body);
        for expected in [
            "readFarmExampleComV1NamespacedLlama",
            "readFarmExampleComV1alphaNamespacedLlama",
            "com.example.farm.v1.Llama",
            "x-kubernetes-group-version-kind",
        ] {
            assert!(text.contains(expected), "{expected} not in the protobuf");
        }
        let etag = reply.headers["etag"].to_str().unwrap().to_owned();
        let again = call(
            &app,
            "GET",
            "/openapi/v2",
            &[("accept", accept), ("if-none-match", &etag)],
            "",
        )
        .await;
        assert_eq!(again.status, StatusCode::NOT_MODIFIED);
    }
    let json = call(&app, "GET", "/openapi/v2", &[("accept", "*/*")], "").await;
    assert_eq!(json.headers["content-type"], "application/json");
    let refused = call(&app, "GET", "/openapi/v2", &[("accept", "text/html")], "").await;
    assert_eq!(refused.status, StatusCode::NOT_ACCEPTABLE);
}
