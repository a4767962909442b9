//! Deleting as kube-apiserver deletes, on both storages: finalizers hold a delete, the write
//! that removes the last one completes it, the propagation policy sets the garbage collector's
//! finalizers, and an object being deleted keeps its deletion fields. Each rule here failed
//! before (a Llama with a finalizer was gone the moment it was deleted; `--cascade=orphan`
//! deleted the owner and left its children to the collector).

use crate::common;

use std::time::Duration;

use common::{TestStorage, oneshot::*};
use serde_json::{Value, json};

const LLAMAS: &str = "/apis/farm.example.com/v1alpha/namespaces/default/llamas";

/// The app with the garbage collector's finalizers on (as with a cluster).
async fn gc_app(storage: TestStorage) -> Option<(App, Option<common::etcd::Etcd>)> {
    app_on_with(storage, true).await
}

fn held(name: &str, finalizers: &[&str]) -> String {
    json!({
        "apiVersion": "farm.example.com/v1alpha", "kind": "Llama",
        "metadata": {"name": name, "finalizers": finalizers},
        "spec": {"weight": 1, "height": 1},
    })
    .to_string()
}

async fn delete(app: &App, name: &str, body: &str) -> Reply {
    call(
        app,
        "DELETE",
        &format!("{LLAMAS}/{name}"),
        &[("content-type", "application/json")],
        body,
    )
    .await
}

async fn merge(app: &App, name: &str, patch: Value) -> Reply {
    call(
        app,
        "PATCH",
        &format!("{LLAMAS}/{name}"),
        &[("content-type", "application/merge-patch+json")],
        &patch.to_string(),
    )
    .await
}

/// A finalizer holds a delete: the object stays, marked deleting (deletionTimestamp,
/// deletionGracePeriodSeconds 0, generation moved); a repeated delete changes nothing; the
/// patch that removes the last finalizer deletes it. Watchers see MODIFIED then DELETED, the
/// DELETED event with the final object.
async fn a_finalizer_holds_a_delete_until_it_is_removed(storage: TestStorage) {
    let Some((app, _etcd)) = gc_app(storage).await else {
        return;
    };
    let created = create(&app, "default", &held("held", &["farm.example.com/hold"])).await;
    assert_eq!(created.status, 201);
    let rv = created.json()["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_owned();
    let watch = tokio::spawn(watch_lines(
        app.clone(),
        format!("{LLAMAS}?watch=true&resourceVersion={rv}&fieldSelector=metadata.name%3Dheld"),
        3,
    ));
    let first = delete(&app, "held", "").await;
    assert_eq!(
        first.status,
        200,
        "{}",
        String::from_utf8_lossy(&first.body)
    );
    let marked = first.json();
    assert_eq!(marked["kind"], "Llama");
    assert!(marked["metadata"]["deletionTimestamp"].is_string());
    assert_eq!(marked["metadata"]["deletionGracePeriodSeconds"], 0);
    assert_eq!(marked["metadata"]["generation"], 2);
    // Again: nothing changes.
    let again = delete(&app, "held", "").await.json();
    assert_eq!(
        again["metadata"]["resourceVersion"],
        marked["metadata"]["resourceVersion"]
    );
    assert_eq!(get(&app, &format!("{LLAMAS}/held")).await.status, 200);
    // Other updates are fine; a new finalizer is not.
    assert_eq!(
        merge(&app, "held", json!({"metadata": {"labels": {"a": "b"}}}))
            .await
            .status,
        200
    );
    let message = merge(
        &app,
        "held",
        json!({"metadata": {"finalizers": ["farm.example.com/hold", "farm.example.com/more"]}}),
    )
    .await
    .status(422, "Invalid");
    assert!(
        message.ends_with("metadata.finalizers: Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers []string{\"farm.example.com/more\"}"),
        "{message}"
    );
    // The deletion fields stay the server's.
    let kept = merge(
        &app,
        "held",
        json!({"metadata": {"deletionTimestamp": null, "deletionGracePeriodSeconds": null}}),
    )
    .await;
    assert_eq!(kept.status, 200);
    assert_eq!(
        kept.json()["metadata"]["deletionTimestamp"],
        marked["metadata"]["deletionTimestamp"]
    );
    // A write from a stale read may not remove the last finalizer: 409, the object stays.
    let mut stale = marked.clone();
    stale["metadata"]["finalizers"] = json!([]);
    call(
        &app,
        "PUT",
        &format!("{LLAMAS}/held"),
        &[("content-type", "application/json")],
        &stale.to_string(),
    )
    .await
    .status(409, "Conflict");
    assert_eq!(get(&app, &format!("{LLAMAS}/held")).await.status, 200);
    // The last finalizer goes: so does the object.
    let done = merge(&app, "held", json!({"metadata": {"finalizers": null}})).await;
    assert_eq!(done.status, 200, "{}", String::from_utf8_lossy(&done.body));
    get(&app, &format!("{LLAMAS}/held"))
        .await
        .status(404, "NotFound");
    let events = tokio::time::timeout(Duration::from_secs(10), watch)
        .await
        .expect("three events")
        .unwrap();
    let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(types, ["MODIFIED", "MODIFIED", "DELETED"]);
    assert!(events[0]["object"]["metadata"]["deletionTimestamp"].is_string());
    assert!(events[2]["object"]["metadata"]["deletionTimestamp"].is_string());
}

/// The first `n` lines of a watch, as JSON.
async fn watch_lines(app: App, uri: String, n: usize) -> Vec<Value> {
    use http_body_util::BodyExt;
    let response = crate::common::oneshot::open(&app, &uri, &[]).await;
    let mut body = response.into_body();
    let mut text = Vec::new();
    while text.iter().filter(|b| **b == b'\n').count() < n {
        let Some(Ok(frame)) = body.frame().await else {
            break;
        };
        if let Ok(data) = frame.into_data() {
            text.extend_from_slice(&data);
        }
    }
    text.split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .filter_map(|l| serde_json::from_slice::<Value>(l).ok())
        .filter(|e| e["type"] != "BOOKMARK")
        .take(n)
        .collect()
}

/// The propagation policy sets the garbage collector's finalizers, as kube-apiserver does;
/// background (the default) deletes at once; bad options are 422 and delete nothing.
async fn propagation_policies_set_the_collectors_finalizers(storage: TestStorage) {
    let Some((app, _etcd)) = gc_app(storage).await else {
        return;
    };
    for (name, body, finalizer, code) in [
        (
            "orphaned",
            r#"{"propagationPolicy":"Orphan"}"#,
            "orphan",
            200,
        ),
        ("legacy", r#"{"orphanDependents":true}"#, "orphan", 200),
        (
            "fore",
            r#"{"propagationPolicy":"Foreground"}"#,
            "foregroundDeletion",
            200,
        ),
    ] {
        assert_eq!(create(&app, "default", &held(name, &[])).await.status, 201);
        let reply = delete(&app, name, body).await;
        assert_eq!(reply.status, code, "{name}");
        assert_eq!(reply.json()["metadata"]["finalizers"], json!([finalizer]));
        assert!(reply.json()["metadata"]["deletionTimestamp"].is_string());
    }
    // The collector removes its finalizer: the object goes.
    assert_eq!(
        merge(&app, "orphaned", json!({"metadata": {"finalizers": []}}))
            .await
            .status,
        200
    );
    get(&app, &format!("{LLAMAS}/orphaned"))
        .await
        .status(404, "NotFound");
    // `orphanDependents: false` (legacy foreground-less cascade) on a held object: 202.
    assert_eq!(
        create(
            &app,
            "default",
            &held("accepted", &["farm.example.com/hold"])
        )
        .await
        .status,
        201
    );
    assert_eq!(
        delete(&app, "accepted", r#"{"orphanDependents":false}"#)
            .await
            .status,
        202
    );
    // Background: at once.
    assert_eq!(create(&app, "default", &held("now", &[])).await.status, 201);
    let gone = delete(&app, "now", r#"{"propagationPolicy":"Background"}"#).await;
    assert_eq!(gone.status, 200);
    assert_eq!(gone.json()["status"], "Success");
    // Refused options delete nothing.
    assert_eq!(
        create(&app, "default", &held("kept", &[])).await.status,
        201
    );
    let message = delete(&app, "kept", r#"{"propagationPolicy":"Sideways"}"#)
        .await
        .status(422, "Invalid");
    assert_eq!(
        message,
        "DeleteOptions.meta.k8s.io \"\" is invalid: propagationPolicy: Unsupported value: \"Sideways\": supported values: \"Foreground\", \"Background\", \"Orphan\", \"nil\""
    );
    delete(
        &app,
        "kept",
        r#"{"propagationPolicy":"Orphan","orphanDependents":true}"#,
    )
    .await
    .status(422, "Invalid");
    // The query's options, when there is no body (curl).
    let reply = call(
        &app,
        "DELETE",
        &format!("{LLAMAS}/kept?propagationPolicy=Foreground"),
        &[],
        "",
    )
    .await;
    assert_eq!(
        reply.json()["metadata"]["finalizers"],
        json!(["foregroundDeletion"])
    );
    // A precondition that no longer holds.
    assert_eq!(create(&app, "default", &held("pre", &[])).await.status, 201);
    delete(&app, "pre", r#"{"preconditions":{"resourceVersion":"1"}}"#)
        .await
        .status(409, "Conflict");
    // deletecollection applies the same to each: held ones stay, marked.
    assert_eq!(
        create(&app, "default", &held("c1", &["farm.example.com/hold"]))
            .await
            .status,
        201
    );
    let listed = call(
        &app,
        "DELETE",
        &format!("{LLAMAS}?fieldSelector=metadata.name%3Dc1"),
        &[],
        "",
    )
    .await;
    assert_eq!(listed.status, 200);
    assert_eq!(listed.json()["items"][0]["metadata"]["name"], "c1");
    let c1 = get(&app, &format!("{LLAMAS}/c1")).await.json();
    assert!(c1["metadata"]["deletionTimestamp"].is_string());
}

/// Finalizer names are validated as kube-apiserver validates them; the deletion fields are
/// the server's on create and update.
async fn finalizers_and_deletion_fields_are_validated(storage: TestStorage) {
    let Some((app, _etcd)) = gc_app(storage).await else {
        return;
    };
    for (finalizer, why) in [
        (
            "bad finalizer",
            "name part must consist of alphanumeric characters",
        ),
        ("", "name part must be non-empty"),
        (
            "a/b/c",
            "a qualified name must consist of alphanumeric characters",
        ),
        (
            "Example.com/ok",
            "prefix part a lowercase RFC 1123 subdomain",
        ),
    ] {
        let message = create(&app, "default", &held("bad", &[finalizer]))
            .await
            .status(422, "Invalid");
        assert!(
            message.contains(&format!(
                "metadata.finalizers: Invalid value: {finalizer:?}: {why}"
            )),
            "{message}"
        );
    }
    // A name without a '/' is accepted with kube-apiserver's warning.
    let reply = create(&app, "default", &held("plain", &["plain"])).await;
    assert_eq!(reply.status, 201);
    let warning = reply.headers["warning"].to_str().unwrap();
    assert!(
        warning.contains("prefer a domain-qualified finalizer name"),
        "{warning}"
    );
    // Deletion fields sent on create are dropped; on an update or patch, refused.
    let mut body: Value = serde_json::from_str(&held("sent", &[])).unwrap();
    body["metadata"]["deletionTimestamp"] = json!("2020-01-01T00:00:00Z");
    body["metadata"]["deletionGracePeriodSeconds"] = json!(5);
    let created = create(&app, "default", &body.to_string()).await.json();
    assert!(created["metadata"]["deletionTimestamp"].is_null());
    assert!(created["metadata"]["deletionGracePeriodSeconds"].is_null());
    let message = merge(
        &app,
        "sent",
        json!({"metadata": {"deletionGracePeriodSeconds": 5}}),
    )
    .await
    .status(422, "Invalid");
    assert!(
        message
            .ends_with("metadata.deletionGracePeriodSeconds: Invalid value: 5: field is immutable"),
        "{message}"
    );
    let message = merge(
        &app,
        "sent",
        json!({"metadata": {"deletionTimestamp": "2020-01-01T00:00:00Z"}}),
    )
    .await
    .status(422, "Invalid");
    assert!(
        message.ends_with(
            "metadata.deletionTimestamp: Invalid value: \"2020-01-01T00:00:00Z\": field is immutable"
        ),
        "{message}"
    );
}

/// Two controllers remove their own finalizers at once while the object is being deleted,
/// and a removal races the DELETE itself: no removal is lost, the object is deleted exactly
/// once (404 after), and no write fails for the race.
async fn finalizer_removals_race_safely(storage: TestStorage) {
    let Some((app, _etcd)) = gc_app(storage).await else {
        return;
    };
    for round in 0..5 {
        let name = format!("race-{round}");
        let finalizers = ["farm.example.com/a", "farm.example.com/b"];
        assert_eq!(
            create(&app, "default", &held(&name, &finalizers))
                .await
                .status,
            201
        );
        assert_eq!(delete(&app, &name, "").await.status, 200);
        // Each controller removes its own with a JSON patch `test`-guarded remove of the
        // index it read (an optimistic lock on the list), retrying on a failed test.
        let removals: Vec<_> = finalizers
            .iter()
            .map(|mine| {
                let (app, name, mine) = (app.clone(), name.clone(), (*mine).to_owned());
                tokio::spawn(async move {
                    for _ in 0..50 {
                        let reply = get(&app, &format!("{LLAMAS}/{name}")).await;
                        if reply.status == 404 {
                            return true;
                        }
                        let current = reply.json();
                        let list = current["metadata"]["finalizers"].as_array().cloned();
                        let Some(index) = list
                            .unwrap_or_default()
                            .iter()
                            .position(|f| f == mine.as_str())
                        else {
                            return true;
                        };
                        let patch = json!([
                            {"op": "test", "path": "/metadata/resourceVersion", "value": current["metadata"]["resourceVersion"]},
                            {"op": "remove", "path": format!("/metadata/finalizers/{index}")},
                        ]);
                        let reply = call(
                            &app,
                            "PATCH",
                            &format!("{LLAMAS}/{name}"),
                            &[("content-type", "application/json-patch+json")],
                            &patch.to_string(),
                        )
                        .await;
                        match reply.status.as_u16() {
                            200 => return true,
                            404 | 409 | 422 => continue,
                            other => panic!("{other}: {}", String::from_utf8_lossy(&reply.body)),
                        }
                    }
                    false
                })
            })
            .collect();
        for removal in removals {
            assert!(removal.await.unwrap(), "a removal never landed");
        }
        get(&app, &format!("{LLAMAS}/{name}"))
            .await
            .status(404, "NotFound");
    }
    // A removal racing the DELETE: whichever lands first, the object is gone once both are
    // done.
    for round in 0..10 {
        let name = format!("rush-{round}");
        assert_eq!(
            create(&app, "default", &held(&name, &["farm.example.com/a"]))
                .await
                .status,
            201
        );
        let (a, b) = (app.clone(), app.clone());
        let (n1, n2) = (name.clone(), name.clone());
        let deleting = tokio::spawn(async move { delete(&a, &n1, "").await.status });
        let removing = tokio::spawn(async move {
            merge(&b, &n2, json!({"metadata": {"finalizers": null}}))
                .await
                .status
        });
        let (deleted, removed) = (deleting.await.unwrap(), removing.await.unwrap());
        assert!(deleted == 200 || deleted == 404, "{deleted}");
        assert!(removed == 200 || removed == 404, "{removed}");
        // The removal first: the DELETE deleted. The DELETE first: the removal did.
        get(&app, &format!("{LLAMAS}/{name}"))
            .await
            .status(404, "NotFound");
    }
}

/// Server-side apply keeps finalizers as a set: a manager that applied a finalizer removes it
/// by applying without it, and when that was the last one of an object being deleted, the
/// object goes; applying a new one while deleting is refused.
async fn apply_owns_finalizers_like_any_field(storage: TestStorage) {
    let Some((app, _etcd)) = gc_app(storage).await else {
        return;
    };
    let apply = |finalizers: &[&str]| {
        let (app, body) = (app.clone(), held("applied", finalizers));
        async move {
            call(
                &app,
                "PATCH",
                &format!("{LLAMAS}/applied?fieldManager=ctl"),
                &[("content-type", "application/apply-patch+yaml")],
                &body,
            )
            .await
        }
    };
    assert_eq!(apply(&["farm.example.com/hold"]).await.status, 201);
    assert_eq!(delete(&app, "applied", "").await.status, 200);
    let message = apply(&["farm.example.com/hold", "farm.example.com/more"])
        .await
        .status(422, "Invalid");
    assert!(
        message.contains("no new finalizers can be added"),
        "{message}"
    );
    let last = apply(&[]).await;
    assert_eq!(last.status, 200, "{}", String::from_utf8_lossy(&last.body));
    get(&app, &format!("{LLAMAS}/applied"))
        .await
        .status(404, "NotFound");
}

crate::on_both_storages!(
    apply_owns_finalizers_like_any_field,
    a_finalizer_holds_a_delete_until_it_is_removed,
    propagation_policies_set_the_collectors_finalizers,
    finalizers_and_deletion_fields_are_validated,
    finalizer_removals_race_safely,
);

/// Standalone (no garbage collector), a propagation policy adds no finalizer nobody would
/// remove: the delete is immediate.
#[tokio::test]
async fn without_a_cluster_no_collector_finalizer_is_added() {
    let app = app();
    assert_eq!(
        create(&app, "default", &held("solo", &[])).await.status,
        201
    );
    let reply = delete(&app, "solo", r#"{"propagationPolicy":"Orphan"}"#).await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.json()["status"], "Success");
}

/// NamespaceLifecycle, against a fake kube-apiserver's Namespaces: nothing is created in a
/// namespace that does not exist (404) or is being deleted (403, with kube-apiserver's cause);
/// updates and deletes there stay allowed, so the namespace controller can empty it; a
/// namespace created after the server started is found by a live lookup.
#[tokio::test]
async fn creates_follow_the_namespaces_lifecycle() {
    use common::fake_kube::{FakeKube, namespace};
    let fake = FakeKube::start().await;
    fake.add(namespace("default", false));
    fake.add(namespace("ending", true));
    let server = common::TestServer::start_with(common::Options {
        cluster: Some(fake.client().await),
        namespace_lifecycle: true,
        garbage_collection: true,
        ..Default::default()
    })
    .await;
    let raw = server.raw(Some(server.admin_identity()), common::Alpn::Http2);
    let post = |ns: &str, name: &str| {
        let raw = &raw;
        let (ns, body) = (ns.to_owned(), held(name, &[]));
        async move {
            raw.send(
                "POST",
                &format!("/apis/farm.example.com/v1alpha/namespaces/{ns}/llamas"),
                &[("content-type", "application/json")],
                Some(body.into_bytes()),
            )
            .await
        }
    };
    let missing = post("ghost", "boo").await;
    assert_eq!(missing.status, 404);
    assert_eq!(missing.json()["message"], "namespaces \"ghost\" not found");
    let ending = post("ending", "late").await;
    assert_eq!(ending.status, 403);
    let status = ending.json();
    assert_eq!(status["reason"], "Forbidden");
    assert_eq!(
        status["message"],
        "llamas.farm.example.com \"late\" is forbidden: unable to create new content in namespace ending because it is being terminated"
    );
    assert_eq!(
        status["details"]["causes"],
        json!([{"reason": "NamespaceTerminating", "message": "namespace ending is being terminated", "field": "metadata.namespace"}])
    );
    assert_eq!(post("default", "fine").await.status, 201);
    // A namespace made after the watch started: looked up live.
    fake.add(namespace("fresh", false));
    assert_eq!(post("fresh", "new").await.status, 201);
    // Once it is being deleted: no new Llama, but what is there may change and go.
    fake.add(namespace("fresh", true));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while post("fresh", "later").await.status != 403 {
        assert!(
            std::time::Instant::now() < deadline,
            "the watch never saw it"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let new_llama = "/apis/farm.example.com/v1alpha/namespaces/fresh/llamas/new";
    let patched = raw
        .send(
            "PATCH",
            new_llama,
            &[("content-type", "application/merge-patch+json")],
            Some(br#"{"metadata":{"labels":{"a":"b"}}}"#.to_vec()),
        )
        .await;
    assert_eq!(patched.status, 200);
    assert_eq!(raw.send("DELETE", new_llama, &[], None).await.status, 200);
}
