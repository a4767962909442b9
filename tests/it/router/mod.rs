//! The router driven with `oneshot`: discovery, OpenAPI, Table, lists, writes and every error
//! shape, without a socket.

use crate::common;

use aggregated_apiserver::server;
use axum::http::StatusCode;
use common::{TestStorage, oneshot::*, oneshot_identity as identity};
use serde_json::{Value, json};

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
use lists::{
    deletecollection_honours_selectors, label_selected_lists_follow_updates_relabels_and_deletes,
    list_query_errors, selectors_and_pagination, unsupported_methods_are_405_status,
};

mod discovery;
mod lists;
