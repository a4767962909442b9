//! Patches, bookmarks, watch-list, content types, versions from the future and the other
//! differences from kube-apiserver a client could tell.

use super::*;

pub(super) async fn json_patch(app: &App, name: &str, query: &str, patch: &Value) -> Reply {
    call(
        app,
        "PATCH",
        &format!("{LLAMAS}/{name}{query}"),
        &[("content-type", "application/json-patch+json")],
        &patch.to_string(),
    )
    .await
}

/// A 2 KB JSON patch whose copies each double the document (the class of CVE-2019-1002100)
/// took 1.7 GB; copies are now capped at 3 MiB in all, as kube-apiserver caps them, dry run
/// or not, and the Llama is left as it was.
#[tokio::test]
async fn json_patch_copies_are_capped() {
    let app = app();
    let before = get(&app, &format!("{LLAMAS}/dolly")).await.json();
    let mut operations =
        vec![json!({"op": "add", "path": "/zz", "value": {"a": "x".repeat(1024)}})];
    operations
        .extend((0..24).map(|i| json!({"op": "copy", "from": "/zz", "path": format!("/zz/b{i}")})));
    let patch = Value::Array(operations);
    assert!(patch.to_string().len() < 3000);
    for query in ["", "?dryRun=All"] {
        let reply = json_patch(&app, "dolly", query, &patch).await;
        let message = reply.status(422, "Invalid");
        assert!(
            message
                .contains("Unable to complete the copy, the accumulated size increase of copy is")
                && message.contains("exceeding the limit 3145728"),
            "{message}"
        );
    }
    assert_eq!(get(&app, &format!("{LLAMAS}/dolly")).await.json(), before);

    // Copies below the cap are fine.
    let small = json!([
        {"op": "add", "path": "/metadata/labels", "value": {"a": "b"}},
        {"op": "copy", "from": "/metadata/labels/a", "path": "/metadata/labels/c"},
    ]);
    let reply = json_patch(&app, "dolly", "", &small).await;
    assert_eq!(
        reply.status,
        200,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    assert_eq!(
        reply.json()["metadata"]["labels"],
        json!({"a": "b", "c": "b"})
    );
}

/// More than 10,000 operations is 413 with kube-apiserver's message, before any is applied;
/// a failed operation names itself (no empty field name).
#[tokio::test]
async fn json_patch_operations_are_capped_and_failures_named() {
    let app = app();
    let many = Value::Array(vec![
        json!({"op": "test", "path": "/kind", "value": "Llama"});
        10_001
    ]);
    let reply = json_patch(&app, "dolly", "", &many).await;
    assert_eq!(
        reply.status(413, "RequestEntityTooLarge"),
        "Request entity too large: The allowed maximum operations in a JSON patch is 10000, got 10001"
    );
    let failing = json!([{"op": "test", "path": "/spec/weight", "value": 1}]);
    let message = json_patch(&app, "dolly", "", &failing)
        .await
        .status(422, "Invalid");
    assert!(
        message.contains("operation 0 (test \"/spec/weight\"): testing value /spec/weight failed"),
        "{message}"
    );
    assert!(!message.contains(": :"), "{message}");
}

/// The first `n` events of a watch, as JSON.
pub(super) async fn watch_events(app: &App, uri: &str, accept: &str, n: usize) -> Vec<Value> {
    let response = open(app, uri, &[("accept", accept)]).await;
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    let mut text = Vec::new();
    while text.iter().filter(|b| **b == b'\n').count() < n {
        let frame = tokio::time::timeout(Duration::from_secs(5), body.frame())
            .await
            .expect("an event in time")
            .expect("the watch is open")
            .unwrap();
        text.extend_from_slice(&frame.into_data().unwrap());
    }
    text.split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .take(n)
        .map(|l| serde_json::from_slice(l).unwrap())
        .collect()
}

/// client-go's metadata informer (the garbage collector's and quota's) watches with
/// sendInitialEvents and a PartialObjectMetadata Accept: the initial-events-end BOOKMARK must
/// come as a PartialObjectMetadata too, or it gives up on the stream and relists. In Table form
/// the bookmark is a Table whose one row's object carries the annotation, as kube-apiserver
/// converts it.
#[tokio::test]
async fn bookmarks_come_in_the_form_the_client_asked_for() {
    let app = app();
    let uri = format!(
        "{LLAMAS}?watch=true&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan&timeoutSeconds=5"
    );
    let metadata_accept = "application/vnd.kubernetes.protobuf;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json";
    let events = watch_events(&app, &uri, metadata_accept, 2).await;
    assert_eq!(events[0]["type"], "ADDED");
    assert_eq!(events[0]["object"]["kind"], "PartialObjectMetadata");
    let bookmark = &events[1];
    assert_eq!(bookmark["type"], "BOOKMARK");
    assert_eq!(bookmark["object"]["kind"], "PartialObjectMetadata");
    assert_eq!(bookmark["object"]["apiVersion"], "meta.k8s.io/v1");
    assert_eq!(
        bookmark["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );
    assert!(bookmark["object"]["metadata"]["resourceVersion"].is_string());

    let events = watch_events(&app, &uri, TABLE_ACCEPT, 2).await;
    assert_eq!(events[0]["object"]["kind"], "Table");
    assert!(events[0]["object"]["columnDefinitions"].is_array());
    let bookmark = &events[1]["object"];
    assert_eq!(events[1]["type"], "BOOKMARK");
    assert_eq!(bookmark["kind"], "Table");
    assert!(bookmark.get("columnDefinitions").is_none(), "headers once");
    assert!(bookmark["metadata"]["resourceVersion"].is_string());
    let row_object = &bookmark["rows"][0]["object"];
    assert_eq!(row_object["kind"], "PartialObjectMetadata");
    assert_eq!(
        row_object["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );
    // The kind's own form is unchanged.
    let events = watch_events(&app, &uri, "application/json", 2).await;
    assert_eq!(events[1]["object"]["kind"], "Llama");
}

/// A metadata watcher (kube-rs, as client-go's metadata informer) syncs by watch-list alone and
/// never falls back to LIST. (kube-rs reads a bookmark of any kind; client-go does not, which
/// is what the wire-form test above holds the server to.)
#[tokio::test]
async fn a_metadata_watcher_syncs_by_watch_list_alone() {
    use futures::StreamExt;
    use kube::runtime::watcher::{self, Event};
    let server = TestServer::start().await;
    let client = server.kube_client().await;
    let api: kube::Api<kube::core::PartialObjectMeta<Llama>> =
        kube::Api::namespaced(client, "default");
    let mut stream = watcher::watcher(api, watcher::Config::default().streaming_lists()).boxed();
    let mut names = Vec::new();
    loop {
        let event = tokio::time::timeout(Duration::from_secs(5), stream.next())
            .await
            .expect("the watcher syncs")
            .expect("the stream goes on")
            .expect("no error");
        match event {
            Event::InitApply(meta) => names.push(meta.metadata.name.unwrap_or_default()),
            Event::InitDone => break,
            _ => {}
        }
    }
    assert_eq!(names, ["dolly"]);
    let metrics = server
        .raw(Some(server.admin_identity()), Alpn::Http2)
        .get("/metrics", &[])
        .await;
    let metrics = String::from_utf8_lossy(&metrics.body).into_owned();
    assert!(
        !metrics.contains(r#"apiserver_request_total{verb="LIST",resource="llamas""#),
        "no LIST: {metrics}"
    );
}

/// Versions the store has not reached: a plain watch from one is 410 Expired (only another
/// process can have handed it out); a watch-list or a list from one is refused with "Too large
/// resource version", as kube-apiserver refuses them; either way the client relists.
#[tokio::test]
async fn versions_from_the_future() {
    let app = app();
    let list = get(&app, LLAMAS).await.json();
    let rv: u64 = list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    // This store is the Llamas' source of truth: a version above its own can only be an
    // earlier process's (a clock that ran ahead), so a watch from one is told to relist.
    let events = watch_events(
        &app,
        &format!(
            "{LLAMAS}?watch=true&resourceVersion={}&timeoutSeconds=5",
            rv + 2
        ),
        "application/json",
        1,
    )
    .await;
    assert_eq!(events[0]["type"], "ERROR");
    assert_eq!(events[0]["object"]["code"], 410);
    assert_eq!(events[0]["object"]["reason"], "Expired");
    // A watch-list: 200 and an ERROR event (as kube-apiserver's watch cache answers it).
    let events = watch_events(
        &app,
        &format!(
            "{LLAMAS}?watch=true&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan&resourceVersion={}",
            rv + 1000
        ),
        "application/json",
        1,
    )
    .await;
    assert_eq!(events[0]["type"], "ERROR");
    let status = &events[0]["object"];
    assert_eq!(status["code"], 504);
    assert_eq!(status["reason"], "Timeout");
    assert!(
        status["message"]
            .as_str()
            .unwrap()
            .starts_with("Timeout: Too large resource version: "),
        "{status}"
    );
    assert_eq!(
        status["details"]["causes"][0]["reason"],
        "ResourceVersionTooLarge"
    );
    // A list: 504 with Retry-After.
    let reply = get(
        &app,
        &format!(
            "{LLAMAS}?resourceVersion={}&resourceVersionMatch=NotOlderThan",
            rv + 1000
        ),
    )
    .await;
    let message = reply.status(504, "Timeout");
    assert!(
        message.starts_with("Timeout: Too large resource version"),
        "{message}"
    );
    assert_eq!(reply.headers["retry-after"], "1");
    assert_eq!(reply.json()["details"]["retryAfterSeconds"], 1);
}

/// Content-Type as kube-apiserver reads it: a create without one is JSON (kube-apiserver
/// accepts it, "for backwards compatibility"), a malformed or unknown one is 415, and a patch
/// must say which kind of patch it is (415 without).
#[tokio::test]
async fn content_types_as_kube_apiserver_reads_them() {
    let app = app();
    let reply = call(&app, "POST", LLAMAS, &[], &llama("untyped", 1.0, 1.0)).await;
    assert_eq!(
        reply.status,
        201,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    for content_type in [
        "text/plain",
        "application/json; charset",
        "application/json; =utf-8",
        "not a media type",
    ] {
        let reply = call(
            &app,
            "POST",
            LLAMAS,
            &[("content-type", content_type)],
            &llama("typed", 1.0, 1.0),
        )
        .await;
        let message = reply.status(415, "UnsupportedMediaType");
        assert!(
            message.starts_with("the body of the request was in an unknown format"),
            "{content_type}: {message}"
        );
    }
    // YAML, as kube-apiserver decodes it for a create or an update, not for a patch.
    let yaml = "apiVersion: farm.example.com/v1alpha\nkind: Llama\nmetadata:\n  name: yaml\nspec:\n  weight: 2\n  height: 1.5\n";
    let reply = call(
        &app,
        "POST",
        LLAMAS,
        &[("content-type", "application/yaml")],
        yaml,
    )
    .await;
    assert_eq!(
        reply.status,
        201,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    assert_eq!(reply.json()["spec"], json!({"weight": 2, "height": 1.5}));
    let stored = reply.json();
    let update = format!(
        "{}metadata:\n  name: yaml\n  resourceVersion: \"{}\"\nspec:\n  weight: 3\n  height: 1.5\n",
        "apiVersion: farm.example.com/v1alpha\nkind: Llama\n",
        stored["metadata"]["resourceVersion"].as_str().unwrap()
    );
    let reply = call(
        &app,
        "PUT",
        &format!("{LLAMAS}/yaml"),
        &[("content-type", "application/yaml")],
        &update,
    )
    .await;
    assert_eq!(
        reply.status,
        200,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    assert_eq!(reply.json()["spec"]["weight"], 3);
    for content_type in [None, Some("application/yaml")] {
        let headers: Vec<(&str, &str)> = content_type
            .map(|c| ("content-type", c))
            .into_iter()
            .collect();
        let reply = call(
            &app,
            "PATCH",
            &format!("{LLAMAS}/dolly"),
            &headers,
            r#"{"spec":{"weight":2}}"#,
        )
        .await;
        reply.status(415, "UnsupportedMediaType");
    }
}

/// Authorization judges the verb that is served: the watch parameter is read as the handler
/// reads it (the first one, percent-decoded), so a user allowed to list cannot open a watch by
/// spelling it differently, nor be refused a list by repeating it.
#[tokio::test]
async fn the_verb_authorized_is_the_verb_served() {
    let fake = FakeKube::start().await;
    fake.set_policy(|spec| {
        let verb = spec["resourceAttributes"]["verb"].as_str().unwrap_or("");
        (verb == "list", String::new())
    });
    let server = TestServer::start_with(Options {
        cluster: Some(fake.client().await),
        ..Default::default()
    })
    .await;
    let (cert, key) = server.dev_ca().issue_client("lister", &[]).unwrap();
    let raw = server.raw(Some((cert, key)), Alpn::Http2);
    // Served as a list (the first value counts): allowed.
    let reply = raw
        .get(&format!("{LLAMAS}?watch=false&watch=true"), &[])
        .await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.json()["kind"], "LlamaList");
    // Served as a watch (the name escaped): refused, as a watch.
    for query in ["wat%63h=true", "watch=%31"] {
        let reply = raw
            .get(&format!("{LLAMAS}?{query}&timeoutSeconds=1"), &[])
            .await;
        assert_eq!(reply.status, 403, "{query}");
        assert!(
            reply.json()["message"]
                .as_str()
                .unwrap()
                .contains("cannot watch resource \"llamas\""),
            "{query}"
        );
    }
}

/// Patch after patch cannot grow a Llama past what one request may send (3 MiB): each patch
/// is within every bound, the object it would make is not.
#[tokio::test]
async fn patches_cannot_grow_an_object_without_bound() {
    let app = app();
    let mut refused = None;
    for i in 0..16 {
        // 3,000 finalizers a patch, about 250 KB (and as much again in managedFields).
        let mut operations = Vec::new();
        if i == 0 {
            operations.push(json!({"op": "add", "path": "/metadata/finalizers", "value": []}));
        }
        for j in 0..3000 {
            let value = format!("farm.example.com/f-{i}-{j:0>50}");
            operations.push(json!({"op": "add", "path": "/metadata/finalizers/-", "value": value}));
        }
        let reply = call(
            &app,
            "PATCH",
            &format!("{LLAMAS}/dolly"),
            &[("content-type", "application/json-patch+json")],
            &Value::Array(operations).to_string(),
        )
        .await;
        if reply.status == 413 {
            refused = Some((i, reply.status(413, "RequestEntityTooLarge")));
            break;
        }
        assert_eq!(reply.status, 200, "patch {i}");
    }
    let (i, message) = refused.expect("refused before it grew past 3 MiB");
    assert!(i >= 5, "{i}");
    assert!(message.contains("limit is 3145728"), "{message}");
}

/// Smaller differences from kube-apiserver, each as it answers: a JSON patch `test` compares
/// numbers by value, and whole float64s are served as Go writes them (`120`, not `120.0`); a
/// uid other than the stored one is refused (a PUT's as a precondition, 409; a patched one as
/// immutable, 422); a malformed `resourceVersion` is 400 on a GET too, and `+1` is malformed;
/// a watch whose `timeoutSeconds` has passed already ends at once.
#[tokio::test]
async fn smaller_differences_from_kube_apiserver() {
    let app = app();
    let created = create(&app, "default", &llama("whole", 120.0, 1.5)).await;
    assert_eq!(created.status, 201);
    assert!(
        String::from_utf8_lossy(&created.body).contains(r#""spec":{"weight":120,"height":1.5}"#),
        "{}",
        String::from_utf8_lossy(&created.body)
    );
    // json-patch compares numbers as texts, as kube-apiserver does (a CRD answers the same):
    // 120 is what a GET shows; 120.0 is not it.
    for (value, code) in [("120", 200), ("120.0", 422)] {
        let patch = format!(
            r#"[{{"op": "test", "path": "/spec/weight", "value": {value}}}, {{"op": "replace", "path": "/spec/height", "value": 2}}]"#
        );
        let reply = json_patch(
            &app,
            "whole",
            "",
            &serde_json::from_str::<Value>(&patch).unwrap(),
        )
        .await;
        assert_eq!(
            reply.status,
            code,
            "{value}: {}",
            String::from_utf8_lossy(&reply.body)
        );
    }
    let reply = json_patch(
        &app,
        "whole",
        "",
        &json!([{"op": "test", "path": "/spec/weight", "value": 121}]),
    )
    .await;
    assert!(reply.status(422, "Invalid").contains("test failed"));

    // A uid that is not the stored one.
    let mut current = get(&app, &format!("{LLAMAS}/whole")).await.json();
    let stored_uid = current["metadata"]["uid"].as_str().unwrap().to_owned();
    current["metadata"]["uid"] = json!("not-the-uid");
    let message = call(
        &app,
        "PUT",
        &format!("{LLAMAS}/whole"),
        &[("content-type", "application/json")],
        &current.to_string(),
    )
    .await
    .status(409, "Conflict");
    assert_eq!(
        message,
        format!(
            "Operation cannot be fulfilled on llamas.farm.example.com \"whole\": Precondition failed: UID in precondition: not-the-uid, UID in object meta: {stored_uid}"
        )
    );
    let message = call(
        &app,
        "PATCH",
        &format!("{LLAMAS}/whole"),
        &[("content-type", "application/merge-patch+json")],
        r#"{"metadata":{"uid":"not-the-uid"}}"#,
    )
    .await
    .status(422, "Invalid");
    assert_eq!(
        message,
        "Llama.farm.example.com \"whole\" is invalid: metadata.uid: Invalid value: \"not-the-uid\": field is immutable"
    );
    let after = get(&app, &format!("{LLAMAS}/whole")).await.json();
    assert_eq!(after["metadata"]["uid"], stored_uid.as_str());

    // Malformed resourceVersions.
    let message = get(&app, &format!("{LLAMAS}/whole?resourceVersion=abc"))
        .await
        .status(400, "BadRequest");
    assert_eq!(
        message,
        "invalid resource version: resourceVersion: Invalid value: \"abc\": strconv.ParseUint: parsing \"abc\": invalid syntax"
    );
    let message = get(&app, &format!("{LLAMAS}?resourceVersion=%2B1"))
        .await
        .status(400, "BadRequest");
    assert_eq!(
        message,
        "invalid resource version: resourceVersion: Invalid value: \"+1\": strconv.ParseUint: parsing \"+1\": invalid syntax"
    );

    // A watch that is over before it starts.
    let reply = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        get(&app, &format!("{LLAMAS}?watch=true&timeoutSeconds=-1")),
    )
    .await
    .expect("the watch ended");
    assert_eq!(reply.status, 200);
}

/// The watch history kept the last 10,000 events whatever their size: a large Llama patched
/// with one label at a time grew the process by megabytes a patch (3 GB after 500 patches of
/// a 2 MB Llama). It is now bounded in bytes too: the oldest events go, a watch from before
/// them is 410 Expired, and the history's size is a metric.
#[tokio::test]
async fn the_watch_history_is_bounded_in_bytes() {
    const LIMIT: u64 = 64 * 1024 * 1024;
    let app = app();
    let mut big: Value = serde_json::from_str(&llama("big", 1.0, 1.0)).unwrap();
    big["metadata"]["annotations"] = json!({ "ballast": "x".repeat(250 * 1024) });
    let created = create(&app, "default", &big.to_string()).await;
    assert_eq!(created.status, 201);
    let first = created.json()["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_owned();
    for i in 0..300 {
        let reply = call(
            &app,
            "PATCH",
            &format!("{LLAMAS}/big"),
            &[("content-type", "application/merge-patch+json")],
            &json!({"metadata": {"labels": {"n": i.to_string()}}}).to_string(),
        )
        .await;
        assert_eq!(reply.status, 200);
    }
    let metrics = String::from_utf8(get(&app, "/metrics").await.body).unwrap();
    let figure = |name: &str| -> u64 {
        let prefix = format!("{name}{{resource=\"llamas.farm.example.com\"}} ");
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .unwrap_or_else(|| panic!("no {name} in {metrics}"))
            .parse()
            .unwrap()
    };
    let (bytes, events) = (
        figure("farm_apiserver_watch_history_bytes"),
        figure("farm_apiserver_watch_history_events"),
    );
    assert!(bytes <= LIMIT, "{bytes} bytes in {events} events");
    // Each event holds about 3 x 256 KiB (object, JSON, watch line): about 85 of them fit.
    assert!((70..=95).contains(&events), "{events} events");
    let events = watch_events(
        &app,
        &format!("{LLAMAS}?watch=true&resourceVersion={first}"),
        "application/json",
        1,
    )
    .await;
    assert_eq!(events[0]["type"], "ERROR");
    assert_eq!(events[0]["object"]["code"], 410);
    assert!(
        events[0]["object"]["message"]
            .as_str()
            .unwrap()
            .starts_with(&format!("too old resource version: {first} (")),
        "{}",
        events[0]
    );
}
