//! Lists: query errors, selectors, pagination, continue tokens, deletecollection.

use super::*;

pub(super) async fn list_query_errors(storage: TestStorage) {
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
pub(super) async fn label_selected_lists_follow_updates_relabels_and_deletes(storage: TestStorage) {
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

pub(super) async fn selectors_and_pagination(storage: TestStorage) {
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

pub(super) async fn unsupported_methods_are_405_status(storage: TestStorage) {
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

pub(super) async fn deletecollection_honours_selectors(storage: TestStorage) {
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
