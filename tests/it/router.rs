//! The router driven with `oneshot`: discovery, OpenAPI, Table, lists, writes and every error
//! shape, without a socket.

use crate::common;

use aggregated_apiserver::server;
use axum::http::StatusCode;
use common::{TestStorage, oneshot::*, oneshot_identity as identity};
use serde_json::{Value, json};

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

async fn get_returns_the_sample_and_404_is_a_status(storage: TestStorage) {
    let Some((app, _etcd)) = app_on(storage).await else {
        return;
    };
    let dolly = get(&app, &format!("{BASE}/namespaces/default/llamas/dolly"))
        .await
        .json();
    assert_eq!(dolly["kind"], "Llama");
    assert_eq!(dolly["apiVersion"], "farm.example.com/v1alpha");
    assert_eq!(dolly["spec"]["weight"], 31.4);
    assert_eq!(dolly["spec"]["height"], 0.5);
    assert!(dolly["metadata"]["uid"].is_string());
    assert!(dolly["metadata"]["creationTimestamp"].is_string());
    assert_eq!(dolly["metadata"]["generation"], 1);

    let missing = get(&app, &format!("{BASE}/namespaces/default/llamas/nope")).await;
    let message = missing.status(404, "NotFound");
    assert_eq!(message, "llamas.farm.example.com \"nope\" not found");
    assert_eq!(
        missing.json()["details"],
        json!({"name": "nope", "group": "farm.example.com", "kind": "llamas"})
    );

    let elsewhere = get(&app, &format!("{BASE}/namespaces/default/cows")).await;
    elsewhere.status(404, "NotFound");
    let outside = get(&app, "/nothing/here").await;
    outside.status(404, "NotFound");
}

/// A GET of one object is answered without a future; the same path with `watch=true` (the
/// old single-object watch) and with bad options must still take the full path.
async fn a_named_get_with_watch_streams_that_object_and_bad_options_are_400(storage: TestStorage) {
    let Some((app, _etcd)) = app_on(storage).await else {
        return;
    };
    assert_eq!(
        create(&app, "default", &llama("other", 1.0, 1.0))
            .await
            .status,
        201
    );
    let watch = get(
        &app,
        &format!("{BASE}/namespaces/default/llamas/dolly?watch=true&timeoutSeconds=1"),
    )
    .await;
    assert_eq!(watch.status, StatusCode::OK);
    let events: Vec<Value> = watch
        .body
        .split(|b| *b == b'\n')
        .filter(|line| !line.is_empty())
        .map(|line| serde_json::from_slice(line).unwrap())
        .collect();
    assert_eq!(events.len(), 1, "only dolly: {events:?}");
    assert_eq!(events[0]["type"], "ADDED");
    assert_eq!(events[0]["object"]["metadata"]["name"], "dolly");

    let item = format!("{BASE}/namespaces/default/llamas/dolly");
    get(&app, &format!("{item}?watch=maybe"))
        .await
        .status(400, "BadRequest");
    call(&app, "GET", &item, &[("accept", "application/yaml")], "")
        .await
        .status(406, "NotAcceptable");
    let encoded = get(&app, &format!("{BASE}/namespaces/def%61ult/llamas/doll%79")).await;
    assert_eq!(
        encoded.json()["metadata"]["name"],
        "dolly",
        "segments are decoded"
    );
    get(&app, &format!("{BASE}/namespaces/default/llamas/%ff"))
        .await
        .status(400, "BadRequest");
}

async fn table_has_columns_rows_and_partial_metadata(storage: TestStorage) {
    let Some((app, _etcd)) = app_on(storage).await else {
        return;
    };
    let reply = call(
        &app,
        "GET",
        &format!("{BASE}/llamas?limit=500"),
        &[("accept", TABLE_ACCEPT)],
        "",
    )
    .await;
    let table = reply.json();
    assert_eq!(table["kind"], "Table");
    assert_eq!(table["apiVersion"], "meta.k8s.io/v1");
    let names: Vec<&str> = table["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["Name", "Weight", "Height", "Age"]);
    let row = &table["rows"][0];
    assert_eq!(row["cells"][0], "dolly");
    assert_eq!(row["cells"][1], 31.4);
    assert_eq!(row["cells"][2], 0.5);
    assert!(row["cells"][3].as_str().unwrap().ends_with('s'));
    assert_eq!(row["object"]["kind"], "PartialObjectMetadata");
    assert_eq!(row["object"]["metadata"]["namespace"], "default");
    assert!(table["metadata"]["resourceVersion"].is_string());

    let none = call(
        &app,
        "GET",
        &format!("{BASE}/llamas?includeObject=None"),
        &[("accept", TABLE_ACCEPT)],
        "",
    )
    .await;
    assert!(none.json()["rows"][0].get("object").is_none());
    let object = call(
        &app,
        "GET",
        &format!("{BASE}/llamas?includeObject=Object"),
        &[("accept", TABLE_ACCEPT)],
        "",
    )
    .await;
    assert_eq!(object.json()["rows"][0]["object"]["kind"], "Llama");
    let bad = call(
        &app,
        "GET",
        &format!("{BASE}/llamas?includeObject=Everything"),
        &[("accept", TABLE_ACCEPT)],
        "",
    )
    .await;
    bad.status(400, "BadRequest");

    let beta = call(
        &app,
        "GET",
        &format!("{BASE}/namespaces/default/llamas/dolly"),
        &[(
            "accept",
            "application/json;as=Table;v=v1beta1;g=meta.k8s.io",
        )],
        "",
    )
    .await;
    assert_eq!(beta.json()["apiVersion"], "meta.k8s.io/v1beta1");
    assert_eq!(beta.json()["rows"].as_array().unwrap().len(), 1);

    let pom = call(
        &app,
        "GET",
        &format!("{BASE}/llamas"),
        &[(
            "accept",
            "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json",
        )],
        "",
    )
    .await;
    let pom = pom.json();
    assert_eq!(pom["kind"], "PartialObjectMetadataList");
    assert_eq!(pom["items"][0]["kind"], "PartialObjectMetadata");
    assert!(pom["items"][0].get("spec").is_none());

    let refused = call(
        &app,
        "GET",
        &format!("{BASE}/llamas"),
        &[("accept", "application/json;as=Table;v=v2;g=meta.k8s.io")],
        "",
    )
    .await;
    refused.status(406, "NotAcceptable");
}

async fn create_update_patch_delete_round_trip(storage: TestStorage) {
    let Some((app, _etcd)) = app_on(storage).await else {
        return;
    };
    let created = create(&app, "farm", &llama("kuzco", 120.5, 1.7)).await;
    assert_eq!(
        created.status,
        StatusCode::CREATED,
        "{}",
        String::from_utf8_lossy(&created.body)
    );
    let created = created.json();
    assert_eq!(created["metadata"]["namespace"], "farm");
    assert_eq!(created["metadata"]["generation"], 1);
    let rv = created["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_owned();

    // Update with the current resourceVersion: generation bumps with the spec.
    let mut next = created.clone();
    next["spec"]["weight"] = json!(125.0);
    let updated = call(
        &app,
        "PUT",
        &format!("{BASE}/namespaces/farm/llamas/kuzco"),
        &[("content-type", "application/json")],
        &next.to_string(),
    )
    .await;
    assert_eq!(updated.status, StatusCode::OK);
    let updated = updated.json();
    assert_eq!(updated["metadata"]["generation"], 2);
    assert_eq!(updated["metadata"]["uid"], created["metadata"]["uid"]);
    assert_ne!(updated["metadata"]["resourceVersion"], rv.as_str());

    // The stale resourceVersion now conflicts.
    let stale = call(
        &app,
        "PUT",
        &format!("{BASE}/namespaces/farm/llamas/kuzco"),
        &[("content-type", "application/json")],
        &next.to_string(),
    )
    .await;
    let message = stale.status(409, "Conflict");
    assert!(
        message.contains("the object has been modified"),
        "{message}"
    );

    let merged = call(
        &app,
        "PATCH",
        &format!("{BASE}/namespaces/farm/llamas/kuzco"),
        &[("content-type", "application/merge-patch+json")],
        r#"{"metadata":{"labels":{"tier":"gold"}},"spec":{"height":1.8}}"#,
    )
    .await;
    assert_eq!(merged.status, StatusCode::OK);
    assert_eq!(merged.json()["spec"]["height"], 1.8);
    assert_eq!(merged.json()["metadata"]["labels"]["tier"], "gold");

    let jsonpatch = call(
        &app,
        "PATCH",
        &format!("{BASE}/namespaces/farm/llamas/kuzco"),
        &[("content-type", "application/json-patch+json")],
        r#"[{"op":"replace","path":"/spec/weight","value":99}]"#,
    )
    .await;
    assert_eq!(jsonpatch.json()["spec"]["weight"], 99.0);

    let strategic = call(
        &app,
        "PATCH",
        &format!("{BASE}/namespaces/farm/llamas/kuzco"),
        &[("content-type", "application/strategic-merge-patch+json")],
        r#"{"spec":{"weight":1}}"#,
    )
    .await;
    let message = strategic.status(415, "UnsupportedMediaType");
    assert!(message.contains("--type merge"), "{message}");

    let deleted = call(
        &app,
        "DELETE",
        &format!("{BASE}/namespaces/farm/llamas/kuzco"),
        &[],
        "",
    )
    .await;
    assert_eq!(deleted.status, StatusCode::OK);
    // As for a custom resource: a success Status naming what went.
    let status = deleted.json();
    assert_eq!(status["kind"], "Status");
    assert_eq!(status["status"], "Success");
    assert_eq!(status["details"]["name"], "kuzco");
    assert_eq!(status["details"]["kind"], "llamas");
    assert_eq!(status["details"]["group"], "farm.example.com");
    get(&app, &format!("{BASE}/namespaces/farm/llamas/kuzco"))
        .await
        .status(404, "NotFound");
    call(
        &app,
        "DELETE",
        &format!("{BASE}/namespaces/farm/llamas/kuzco"),
        &[],
        "",
    )
    .await
    .status(404, "NotFound");
}

async fn generate_name_dry_run_and_already_exists(storage: TestStorage) {
    let Some((app, _etcd)) = app_on(storage).await else {
        return;
    };
    let body = json!({"apiVersion": "farm.example.com/v1alpha", "kind": "Llama", "metadata": {"generateName": "baby-"}, "spec": {"weight": 3, "height": 0.4}});
    let created = create(&app, "default", &body.to_string()).await.json();
    let name = created["metadata"]["name"].as_str().unwrap();
    assert!(name.starts_with("baby-") && name.len() == 10, "{name}");

    let dry = call(
        &app,
        "POST",
        &format!("{BASE}/namespaces/default/llamas?dryRun=All"),
        &[("content-type", "application/json")],
        &llama("ghost", 1.0, 1.0),
    )
    .await;
    assert_eq!(dry.status, StatusCode::CREATED);
    get(&app, &format!("{BASE}/namespaces/default/llamas/ghost"))
        .await
        .status(404, "NotFound");
    call(
        &app,
        "POST",
        &format!("{BASE}/namespaces/default/llamas?dryRun=Maybe"),
        &[("content-type", "application/json")],
        &llama("ghost", 1.0, 1.0),
    )
    .await
    .status(400, "BadRequest");

    let twice = create(&app, "default", &llama("dolly", 1.0, 1.0)).await;
    assert_eq!(
        twice.status(409, "AlreadyExists"),
        "llamas.farm.example.com \"dolly\" already exists"
    );
}

#[tokio::test]
async fn bad_input_gets_the_right_status_and_leaves_the_store_alone() {
    let (app, state) = app_with_state();
    let before = state.stats().await.unwrap();
    let ns = format!("{BASE}/namespaces/default/llamas");
    let json_ct = [("content-type", "application/json")];
    let cases: Vec<(&str, String, u16, &str)> = vec![
        ("malformed JSON", "{\"apiVersion\":".into(), 400, "BadRequest"),
        ("not an object", "[1,2]".into(), 400, "BadRequest"),
        ("wrong kind", llama("x", 1.0, 1.0).replace("\"Llama\"", "\"Cow\""), 422, "Invalid"),
        ("wrong apiVersion", llama("x", 1.0, 1.0).replace("farm.example.com/v1alpha", "farm.example.com/v1"), 400, "BadRequest"),
        ("name not DNS-1123", llama("Bad_Name", 1.0, 1.0), 422, "Invalid"),
        ("negative weight", llama("x", -2.0, 1.0), 422, "Invalid"),
        ("zero height", llama("x", 2.0, 0.0), 422, "Invalid"),
        ("beyond float64", llama("x", 1.5, 1.0).replace("\"weight\":1.5", "\"weight\":1e999"), 400, "BadRequest"),
        ("NaN literal", llama("x", 1.5, 1.0).replace("\"weight\":1.5", "\"weight\":NaN"), 400, "BadRequest"),
        ("weight as a string", llama("x", 1.5, 1.0).replace("\"weight\":1.5", "\"weight\":\"heavy\""), 422, "Invalid"),
        ("missing spec", json!({"apiVersion": "farm.example.com/v1alpha", "kind": "Llama", "metadata": {"name": "x"}}).to_string(), 422, "Invalid"),
        ("no name", json!({"apiVersion": "farm.example.com/v1alpha", "kind": "Llama", "metadata": {}, "spec": {"weight": 1, "height": 1}}).to_string(), 422, "Invalid"),
        ("other namespace", json!({"apiVersion": "farm.example.com/v1alpha", "kind": "Llama", "metadata": {"name": "x", "namespace": "kube-system"}, "spec": {"weight": 1, "height": 1}}).to_string(), 400, "BadRequest"),
        ("resourceVersion on create", json!({"apiVersion": "farm.example.com/v1alpha", "kind": "Llama", "metadata": {"name": "x", "resourceVersion": "3"}, "spec": {"weight": 1, "height": 1}}).to_string(), 400, "BadRequest"),
        ("bad label", json!({"apiVersion": "farm.example.com/v1alpha", "kind": "Llama", "metadata": {"name": "x", "labels": {"a": "b c"}}, "spec": {"weight": 1, "height": 1}}).to_string(), 422, "Invalid"),
    ];
    for (what, body, code, reason) in cases {
        let reply = call(&app, "POST", &ns, &json_ct, &body).await;
        assert_eq!(
            reply.status.as_u16(),
            code,
            "{what}: {}",
            String::from_utf8_lossy(&reply.body)
        );
        reply.status(code, reason);
    }
    // Validation reports every field at once, with kube-apiserver's wording.
    let both = call(&app, "POST", &ns, &json_ct, &llama("x", -1.0, 0.0)).await;
    let message = both.status(422, "Invalid");
    assert_eq!(
        message,
        "Llama.farm.example.com \"x\" is invalid: [spec.weight: Invalid value: -1: spec.weight in body should be greater than 0, spec.height: Invalid value: 0: spec.height in body should be greater than 0]"
    );
    assert_eq!(
        both.json()["details"]["causes"].as_array().unwrap().len(),
        2
    );

    // Strict unknown fields → 400; Warn → Warning header; Ignore → silently dropped.
    let extra = json!({"apiVersion": "farm.example.com/v1alpha", "kind": "Llama", "metadata": {"name": "extra"}, "spec": {"weight": 1, "height": 1, "color": "brown"}}).to_string();
    let strict = call(
        &app,
        "POST",
        &format!("{ns}?fieldValidation=Strict"),
        &json_ct,
        &extra,
    )
    .await;
    assert!(
        strict
            .status(400, "BadRequest")
            .contains("strict decoding error: unknown field \"spec.color\"")
    );
    let huge = "x".repeat(4 * 1024 * 1024);
    call(&app, "POST", &ns, &json_ct, &huge)
        .await
        .status(413, "RequestEntityTooLarge");
    call(
        &app,
        "POST",
        &ns,
        &[("content-type", "application/yaml")],
        "kind: Llama\nspec: [",
    )
    .await
    .status(400, "BadRequest");
    call(
        &app,
        "POST",
        &format!("{ns}?fieldValidation=Loose"),
        &json_ct,
        &extra,
    )
    .await
    .status(400, "BadRequest");
    assert_eq!(
        state.stats().await.unwrap(),
        before,
        "rejected writes must not touch the store"
    );

    let ignore_body = extra.replace("\"extra\"", "\"ignored\"");
    let ignored = call(
        &app,
        "POST",
        &format!("{ns}?fieldValidation=Ignore"),
        &json_ct,
        &ignore_body,
    )
    .await;
    assert_eq!(ignored.status, StatusCode::CREATED);
    assert!(
        !ignored.headers.contains_key("warning"),
        "Ignore drops unknown fields silently"
    );
    assert!(ignored.json()["spec"].get("color").is_none());

    let warn = call(
        &app,
        "POST",
        &format!("{ns}?fieldValidation=Warn"),
        &json_ct,
        &extra,
    )
    .await;
    assert_eq!(warn.status, StatusCode::CREATED);
    assert_eq!(
        warn.headers["warning"],
        "299 - \"unknown field \\\"spec.color\\\"\""
    );
    assert!(warn.json()["spec"].get("color").is_none());
}

async fn list_query_errors(storage: TestStorage) {
    let Some((app, _etcd)) = app_on(storage).await else {
        return;
    };
    for (query, code, reason) in [
        ("labelSelector=app%20in%20(", 400, "BadRequest"),
        ("labelSelector=%3Dx", 400, "BadRequest"),
        ("fieldSelector=spec.weight%3D1", 400, "BadRequest"),
        ("limit=abc", 400, "BadRequest"),
        ("resourceVersion=abc", 400, "BadRequest"),
        ("watch=maybe", 400, "BadRequest"),
        ("continue=garbage", 400, "BadRequest"),
        ("resourceVersionMatch=Exact", 422, "Invalid"),
        (
            "resourceVersion=1&resourceVersionMatch=Sometimes",
            422,
            "Invalid",
        ),
        ("sendInitialEvents=true", 422, "Invalid"),
        ("watch=true&sendInitialEvents=true", 422, "Invalid"),
        (
            "resourceVersion=18446744073709551615&resourceVersionMatch=NotOlderThan",
            504,
            "Timeout",
        ),
    ] {
        let reply = get(&app, &format!("{BASE}/llamas?{query}")).await;
        assert_eq!(
            reply.status.as_u16(),
            code,
            "{query}: {}",
            String::from_utf8_lossy(&reply.body)
        );
        reply.status(code, reason);
    }
}

/// `-l key=value` lists read the label index, which holds the objects themselves: it must
/// follow every update, relabel and delete.
async fn label_selected_lists_follow_updates_relabels_and_deletes(storage: TestStorage) {
    let Some((app, _etcd)) = app_on(storage).await else {
        return;
    };
    let body = json!({"apiVersion": "farm.example.com/v1alpha", "kind": "Llama",
        "metadata": {"name": "tina", "labels": {"herd": "north"}},
        "spec": {"weight": 10, "height": 1}});
    assert_eq!(create(&app, "farm", &body.to_string()).await.status, 201);
    let item = format!("{BASE}/namespaces/farm/llamas/tina");
    let selected = |herd: &'static str| {
        let app = app.clone();
        async move {
            get(&app, &format!("{BASE}/llamas?labelSelector=herd%3D{herd}"))
                .await
                .json()["items"]
                .as_array()
                .unwrap()
                .clone()
        }
    };
    let patch = |body: &'static str| {
        call(
            &app,
            "PATCH",
            &item,
            &[("content-type", "application/merge-patch+json")],
            body,
        )
    };

    assert_eq!(patch(r#"{"spec":{"weight":11}}"#).await.status, 200);
    let north = selected("north").await;
    assert_eq!(north.len(), 1);
    assert_eq!(
        north[0]["spec"]["weight"], 11.0,
        "the updated object, not the one indexed first"
    );

    assert_eq!(
        patch(r#"{"metadata":{"labels":{"herd":"south"}}}"#)
            .await
            .status,
        200
    );
    assert!(selected("north").await.is_empty(), "relabelled away");
    let south = selected("south").await;
    assert_eq!(south.len(), 1);
    assert_eq!(south[0]["metadata"]["name"], "tina");
    assert_eq!(south[0]["spec"]["weight"], 11.0);

    assert_eq!(call(&app, "DELETE", &item, &[], "").await.status, 200);
    assert!(selected("south").await.is_empty(), "deleted");
}

async fn selectors_and_pagination(storage: TestStorage) {
    let Some((app, _etcd)) = app_on(storage).await else {
        return;
    };
    for i in 0..7 {
        let body = json!({"apiVersion": "farm.example.com/v1alpha", "kind": "Llama",
            "metadata": {"name": format!("l{i}"), "labels": {"herd": if i % 2 == 0 { "even" } else { "odd" }, "n": i.to_string()}},
            "spec": {"weight": 1 + i, "height": 1}});
        create(
            &app,
            if i < 5 { "farm" } else { "ranch" },
            &body.to_string(),
        )
        .await;
    }
    let names = |v: &Value| -> Vec<String> {
        v["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["metadata"]["name"].as_str().unwrap().to_owned())
            .collect()
    };
    let even = get(&app, &format!("{BASE}/llamas?labelSelector=herd%3Deven"))
        .await
        .json();
    assert_eq!(names(&even), ["l0", "l2", "l4", "l6"]);
    assert_eq!(even["kind"], "LlamaList");
    assert_eq!(even["items"][0]["kind"], "Llama");
    let set = get(
        &app,
        &format!("{BASE}/namespaces/farm/llamas?labelSelector=n%20in%20(1,3),herd!%3Deven"),
    )
    .await
    .json();
    assert_eq!(names(&set), ["l1", "l3"]);
    let by_name = get(
        &app,
        &format!("{BASE}/llamas?fieldSelector=metadata.name%3Dl5"),
    )
    .await
    .json();
    assert_eq!(names(&by_name), ["l5"]);
    let by_ns = get(
        &app,
        &format!("{BASE}/llamas?fieldSelector=metadata.namespace%3Dranch"),
    )
    .await
    .json();
    assert_eq!(names(&by_ns), ["l5", "l6"]);

    // Pages through the label index: l0, l2 | l4, l6.
    let page = get(
        &app,
        &format!("{BASE}/llamas?labelSelector=herd%3Deven&limit=2"),
    )
    .await
    .json();
    assert_eq!(names(&page), ["l0", "l2"]);
    let token = page["metadata"]["continue"].as_str().unwrap().to_owned();
    let page = get(
        &app,
        &format!("{BASE}/llamas?labelSelector=herd%3Deven&limit=2&continue={token}"),
    )
    .await
    .json();
    assert_eq!(names(&page), ["l4", "l6"]);
    assert!(page["metadata"].get("remainingItemCount").is_none());
    let none = get(&app, &format!("{BASE}/llamas?labelSelector=herd%3Dnone"))
        .await
        .json();
    assert_eq!(names(&none), Vec::<String>::new());
    let ns_even = get(
        &app,
        &format!("{BASE}/namespaces/ranch/llamas?labelSelector=herd%3Deven"),
    )
    .await
    .json();
    assert_eq!(names(&ns_even), ["l6"]);

    // Pages of 3 over 8 llamas (dolly + 7), consistent across a write in between.
    let first = get(&app, &format!("{BASE}/llamas?limit=3")).await.json();
    assert_eq!(names(&first), ["dolly", "l0", "l1"]);
    assert_eq!(first["metadata"]["remainingItemCount"], 5);
    let token = first["metadata"]["continue"].as_str().unwrap().to_owned();
    let rv = first["metadata"]["resourceVersion"].clone();
    create(&app, "default", &llama("aaa-late", 1.0, 1.0)).await;
    let second = get(&app, &format!("{BASE}/llamas?limit=3&continue={token}"))
        .await
        .json();
    assert_eq!(names(&second), ["l2", "l3", "l4"]);
    assert_eq!(second["metadata"]["resourceVersion"], rv, "same snapshot");
    assert_eq!(second["metadata"]["remainingItemCount"], 2);
    let token = second["metadata"]["continue"].as_str().unwrap().to_owned();
    let last = get(&app, &format!("{BASE}/llamas?limit=3&continue={token}"))
        .await
        .json();
    assert_eq!(names(&last), ["l5", "l6"]);
    assert!(last["metadata"].get("continue").is_none());
    assert!(last["metadata"].get("remainingItemCount").is_none());
}

#[tokio::test]
async fn a_continue_token_whose_snapshot_is_gone_is_410_expired() {
    let app = app();
    for i in 0..3 {
        create(&app, "default", &llama(&format!("c{i}"), 1.0, 1.0)).await;
    }
    // A well-formed token for a resourceVersion no snapshot is kept for.
    let token = aggregated_apiserver::store::memory::ContinueToken {
        v: "meta.k8s.io/v1".into(),
        rv: 2,
        start: ("default".into(), "c0".into()),
        offset: 1,
    }
    .encode();
    let reply = get(&app, &format!("{BASE}/llamas?limit=1&continue={token}")).await;
    let message = reply.status(410, "Expired");
    assert!(
        message.starts_with("The provided continue parameter is too old"),
        "{message}"
    );
}

async fn unsupported_methods_are_405_status(storage: TestStorage) {
    let Some((app, _etcd)) = app_on(storage).await else {
        return;
    };
    let reply = call(&app, "PUT", &format!("{BASE}/llamas"), &[], "").await;
    let message = reply.status(405, "MethodNotAllowed");
    assert!(message.contains("llamas.farm.example.com"), "{message}");
    call(
        &app,
        "POST",
        &format!("{BASE}/namespaces/default/llamas/dolly"),
        &[],
        "",
    )
    .await
    .status(405, "MethodNotAllowed");
}

async fn deletecollection_honours_selectors(storage: TestStorage) {
    let Some((app, _etcd)) = app_on(storage).await else {
        return;
    };
    create(&app, "default", &json!({"apiVersion": "farm.example.com/v1alpha", "kind": "Llama", "metadata": {"name": "a", "labels": {"gone": "yes"}}, "spec": {"weight": 1, "height": 1}}).to_string()).await;
    create(&app, "default", &json!({"apiVersion": "farm.example.com/v1alpha", "kind": "Llama", "metadata": {"name": "b", "labels": {"gone": "yes"}}, "spec": {"weight": 1, "height": 1}}).to_string()).await;
    let reply = call(
        &app,
        "DELETE",
        &format!("{BASE}/namespaces/default/llamas?labelSelector=gone%3Dyes"),
        &[],
        "",
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.json()["items"].as_array().unwrap().len(), 2);
    let left = get(&app, &format!("{BASE}/namespaces/default/llamas"))
        .await
        .json();
    assert_eq!(left["items"].as_array().unwrap().len(), 1, "dolly stays");
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
