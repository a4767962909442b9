//! Admission webhooks called on writes: validating and mutating, their TLS, failure policy and
//! timeouts.

use super::*;

/// A validating webhook sees every create and update of a Llama as kube-apiserver would send
/// it (user, objects, options, dry run) and refuses with its own code and message, prefixed
/// as kube-apiserver prefixes it; what it refused is not stored; its warnings reach the client.
pub(super) async fn a_validating_webhook_sees_writes_and_refuses_them(storage: TestStorage) {
    let hook = Webhook::start().await;
    hook.answer(|request| {
        if request["object"]["spec"]["weight"].as_f64() > Some(100.0) {
            let mut denied = deny(403, "too heavy");
            denied["warnings"] = json!(["weighed"]);
            denied
        } else {
            json!({"allowed": true, "warnings": ["weighed"]})
        }
    });
    let config = validating(
        "weight",
        json!({"clientConfig": hook.client_config("/validate")}),
    );
    let Some((server, _fake)) = server_with(storage, &[config]).await else {
        return;
    };

    let created = send(
        &server,
        "POST",
        LLAMAS,
        Some(llama("light", 50.0, json!({}))),
    )
    .await;
    assert_eq!(
        created.status,
        201,
        "{}",
        String::from_utf8_lossy(&created.body)
    );
    assert_eq!(warnings(&created), vec!["299 - \"weighed\""]);
    let seen = hook.seen();
    assert_eq!(seen.len(), 1);
    let review = &seen[0];
    assert_eq!(review["apiVersion"], "admission.k8s.io/v1");
    assert!(
        review["test:uri"]
            .as_str()
            .unwrap()
            .ends_with("/validate?timeout=10s"),
        "{}",
        review["test:uri"]
    );
    let request = &review["request"];
    assert_eq!(request["operation"], "CREATE");
    assert_eq!(
        request["kind"],
        json!({"group": "farm.example.com", "version": "v1alpha", "kind": "Llama"})
    );
    assert_eq!(
        request["resource"],
        json!({"group": "farm.example.com", "version": "v1alpha", "resource": "llamas"})
    );
    assert_eq!(request["requestKind"], request["kind"]);
    assert_eq!(
        (request["namespace"].as_str(), request["name"].as_str()),
        (Some("default"), Some("light"))
    );
    assert_eq!(
        request["userInfo"]["username"],
        farm_apiserver::certs::DEV_USER
    );
    assert!(
        request["userInfo"]["groups"]
            .as_array()
            .unwrap()
            .contains(&json!("system:masters"))
    );
    assert_eq!(request["object"]["metadata"]["name"], "light");
    assert!(
        request["object"]["metadata"]["uid"].is_string(),
        "validating webhooks see the object as stored"
    );
    assert_eq!(request["oldObject"], Value::Null);
    assert_eq!(request["dryRun"], false);
    assert_eq!(request["options"]["kind"], "CreateOptions");
    assert_eq!(request["options"]["apiVersion"], "meta.k8s.io/v1");

    let refused = send(
        &server,
        "POST",
        LLAMAS,
        Some(llama("heavy", 500.0, json!({}))),
    )
    .await;
    assert_eq!(refused.status, 403);
    let status = refused.json();
    assert_eq!(status["kind"], "Status");
    assert_eq!(
        status["message"],
        "admission webhook \"weight.farm.example.com\" denied the request: too heavy"
    );
    assert_eq!(warnings(&refused), vec!["299 - \"weighed\""]);
    assert_eq!(
        send(&server, "GET", &format!("{LLAMAS}/heavy"), None)
            .await
            .status,
        404
    );

    // An update: the old object too; refused (once: a refusal is not asked again), the Llama
    // stays as it was.
    let calls = hook.seen().len();
    let patched = send(
        &server,
        "PATCH",
        &format!("{LLAMAS}/dolly"),
        Some(br#"{"spec":{"weight":1000}}"#.to_vec()),
    )
    .await;
    assert_eq!(patched.status, 403);
    assert_eq!(hook.seen().len(), calls + 1);
    let review = hook.seen().pop().unwrap();
    assert_eq!(review["request"]["operation"], "UPDATE");
    assert_eq!(review["request"]["oldObject"]["spec"]["weight"], 31.4);
    assert_eq!(review["request"]["object"]["spec"]["weight"], 1000.0);
    assert_eq!(review["request"]["options"]["kind"], "UpdateOptions");
    let dolly = send(&server, "GET", &format!("{LLAMAS}/dolly"), None)
        .await
        .json();
    assert_eq!(dolly["spec"]["weight"], 31.4);

    // A dry run is sent as one (the webhook has no side effects) and stores nothing.
    let dry = send(
        &server,
        "POST",
        &format!("{LLAMAS}?dryRun=All"),
        Some(llama("dry", 1.0, json!({}))),
    )
    .await;
    assert_eq!(dry.status, 201);
    assert_eq!(hook.seen().pop().unwrap()["request"]["dryRun"], true);
    assert_eq!(
        send(&server, "GET", &format!("{LLAMAS}/dry"), None)
            .await
            .status,
        404
    );

    // Counted with kube-apiserver's names.
    let metrics = send(&server, "GET", "/metrics", None).await;
    let metrics = String::from_utf8_lossy(&metrics.body).into_owned();
    assert!(
        metrics.lines().any(
            |l| l.starts_with("apiserver_admission_webhook_rejection_count{")
                && l.contains("name=\"weight.farm.example.com\"")
                && l.contains("operation=\"CREATE\"")
                && l.contains("error_type=\"no_error\"")
                && l.contains("rejection_code=\"403\"")
                && l.ends_with(" 1")
        ),
        "{metrics}"
    );
    assert!(
        metrics.lines().any(|l| l
            .starts_with("apiserver_admission_webhook_admission_duration_seconds_count{")
            && l.contains("rejected=\"false\"")
            && l.contains("type=\"validating\"")),
        "{metrics}"
    );

    // A webhook that answers without a code refuses with 400.
    hook.answer(|_| json!({"allowed": false}));
    let refused = send(
        &server,
        "POST",
        LLAMAS,
        Some(llama("plain", 1.0, json!({}))),
    )
    .await;
    assert_eq!(refused.status, 400);
    assert_eq!(
        refused.json()["message"],
        "admission webhook \"weight.farm.example.com\" denied the request without explanation"
    );
}

/// A mutating webhook's JSONPatch is applied and stored; what it makes is validated again (a
/// negative weight is 422), and it cannot rename the object an update names (400). Validating
/// webhooks see the mutated object.
pub(super) async fn a_mutating_webhooks_patch_is_stored_and_validated_again(storage: TestStorage) {
    let mutator = Webhook::start().await;
    mutator.answer(|_| {
        patch(json!([{"op": "add", "path": "/metadata/labels/mutated", "value": "yes"}]))
    });
    let validator = Webhook::start().await;
    let configurations = [
        mutating(
            "label",
            json!({"clientConfig": mutator.client_config("/mutate")}),
        ),
        validating(
            "see",
            json!({"clientConfig": validator.client_config("/validate")}),
        ),
    ];
    let Some((server, _fake)) = server_with(storage, &configurations).await else {
        return;
    };
    let created = send(
        &server,
        "POST",
        LLAMAS,
        Some(llama("marked", 5.0, json!({"a": "b"}))),
    )
    .await;
    assert_eq!(
        created.status,
        201,
        "{}",
        String::from_utf8_lossy(&created.body)
    );
    assert_eq!(
        created.json()["metadata"]["labels"],
        json!({"a": "b", "mutated": "yes"})
    );
    let stored = send(&server, "GET", &format!("{LLAMAS}/marked"), None)
        .await
        .json();
    assert_eq!(stored["metadata"]["labels"]["mutated"], "yes");
    assert_eq!(
        validator.seen().pop().unwrap()["request"]["object"]["metadata"]["labels"]["mutated"],
        "yes"
    );
    // What the webhook added is nobody's: the client's manager owns only what it sent.
    let owned = stored["metadata"]["managedFields"][0]["fieldsV1"].to_string();
    assert!(
        owned.contains("f:a") && !owned.contains("f:mutated"),
        "{owned}"
    );

    // A patch nesting the object deeper than any Llama needs is the webhook's failure (500),
    // never a crash.
    mutator.answer(|_| {
        let mut deep = json!("bottom");
        for _ in 0..300 {
            deep = json!([deep]);
        }
        patch(json!([{"op": "add", "path": "/metadata/annotations", "value": {"deep": deep}}]))
    });
    let deep = send(&server, "POST", LLAMAS, Some(llama("deep", 5.0, json!({})))).await;
    assert_eq!(deep.status, 500, "{}", String::from_utf8_lossy(&deep.body));
    assert_eq!(
        send(&server, "GET", &format!("{LLAMAS}/marked"), None)
            .await
            .status,
        200
    );

    // The patched object goes through the kind's validation.
    mutator.answer(|_| patch(json!([{"op": "replace", "path": "/spec/weight", "value": -1}])));
    let invalid = send(
        &server,
        "POST",
        LLAMAS,
        Some(llama("negative", 5.0, json!({}))),
    )
    .await;
    assert_eq!(
        invalid.status,
        422,
        "{}",
        String::from_utf8_lossy(&invalid.body)
    );
    assert_eq!(
        send(&server, "GET", &format!("{LLAMAS}/negative"), None)
            .await
            .status,
        404
    );

    // Renaming what an update names is refused, and nothing changes.
    mutator
        .answer(|_| patch(json!([{"op": "replace", "path": "/metadata/name", "value": "other"}])));
    let renamed = send(
        &server,
        "PATCH",
        &format!("{LLAMAS}/marked"),
        Some(br#"{"spec":{"weight":6}}"#.to_vec()),
    )
    .await;
    assert_eq!(
        renamed.status,
        400,
        "{}",
        String::from_utf8_lossy(&renamed.body)
    );
    let stored = send(&server, "GET", &format!("{LLAMAS}/marked"), None)
        .await
        .json();
    assert_eq!(stored["spec"]["weight"], 5.0);

    // A patch that cannot be applied is the webhook's failure, not the client's.
    mutator.answer(|_| patch(json!([{"op": "remove", "path": "/spec/nothing"}])));
    let broken = send(
        &server,
        "POST",
        LLAMAS,
        Some(llama("broken", 5.0, json!({}))),
    )
    .await;
    assert_eq!(broken.status, 500);
    assert!(
        broken.json()["message"].as_str().unwrap().contains(
            "admission webhook \"label.farm.example.com\" returned a patch that cannot be applied"
        ),
        "{}",
        broken.json()
    );
}

crate::on_both_storages!(
    a_validating_webhook_sees_writes_and_refuses_them,
    a_mutating_webhooks_patch_is_stored_and_validated_again,
    mutating_admission_policies_mutate_writes,
);

/// failurePolicy: a webhook that cannot be reached refuses the write with kube-apiserver's 500
/// under Fail, and lets it through under Ignore; a slow one is cut at its timeoutSeconds.
/// A webhook whose caBundle is its own self-signed certificate (`openssl req -x509`, which
/// marks it `CA:TRUE`) is trusted as kube-apiserver trusts it (Go's crypto/x509 trusts a
/// certificate found in the bundle as it is): with `failurePolicy: Fail` its answers decide
/// (names, expiry and usage are still checked: `client_tls`'s unit tests).
#[tokio::test]
async fn a_webhook_with_a_self_signed_certificate_is_trusted_as_kube_apiserver_trusts_it() {
    let hook = Webhook::start_self_signed(&[]).await;
    hook.answer(|request| {
        if request["object"]["metadata"]["labels"]["verdict"] == "no" {
            deny(403, "the self-signed webhook says no")
        } else {
            allow()
        }
    });
    let config = hook.client_config("/check");
    let configurations = [validating(
        "self-signed",
        json!({"clientConfig": config, "failurePolicy": "Fail",
            "objectSelector": {"matchExpressions": [{"key": "verdict", "operator": "Exists"}]}}),
    )];
    let (server, _fake) = server_with(TestStorage::Memory, &configurations)
        .await
        .unwrap();
    let allowed = send(
        &server,
        "POST",
        LLAMAS,
        Some(llama("yes", 1.0, json!({"verdict": "yes"}))),
    )
    .await;
    assert_eq!(allowed.status, 201, "{}", allowed.json());
    let denied = send(
        &server,
        "POST",
        LLAMAS,
        Some(llama("no", 1.0, json!({"verdict": "no"}))),
    )
    .await;
    assert_eq!(denied.status, 403, "{}", denied.json());
    assert!(
        denied.json()["message"]
            .as_str()
            .unwrap()
            .contains("the self-signed webhook says no"),
        "{}",
        denied.json()
    );
    assert_eq!(hook.seen().len(), 2);
}

#[tokio::test]
async fn failure_policy_and_timeout() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let down = json!({"url": format!("https://127.0.0.1:{port}/gone")});
    let slow = Webhook::start().await;
    *slow.delay.lock().unwrap() = Duration::from_secs(3);
    let configurations = [
        validating(
            "down",
            json!({"clientConfig": down, "failurePolicy": "Fail",
            "objectSelector": {"matchLabels": {"hook": "down"}}}),
        ),
        validating(
            "ignored",
            json!({"clientConfig": down, "failurePolicy": "Ignore",
            "objectSelector": {"matchLabels": {"hook": "ignored"}}}),
        ),
        validating(
            "slow",
            json!({"clientConfig": slow.client_config("/slow"), "timeoutSeconds": 1,
            "objectSelector": {"matchLabels": {"hook": "slow"}}}),
        ),
    ];
    let (server, _fake) = server_with(TestStorage::Memory, &configurations)
        .await
        .unwrap();

    let refused = send(
        &server,
        "POST",
        LLAMAS,
        Some(llama("a", 1.0, json!({"hook": "down"}))),
    )
    .await;
    assert_eq!(refused.status, 500);
    let message = refused.json()["message"].as_str().unwrap().to_owned();
    assert!(
        message.starts_with("Internal error occurred: failed calling webhook \"down.farm.example.com\": failed to call webhook: Post"),
        "{message}"
    );
    assert_eq!(
        send(&server, "GET", &format!("{LLAMAS}/a"), None)
            .await
            .status,
        404
    );

    let through = send(
        &server,
        "POST",
        LLAMAS,
        Some(llama("b", 1.0, json!({"hook": "ignored"}))),
    )
    .await;
    assert_eq!(through.status, 201);

    let started = Instant::now();
    let timed_out = send(
        &server,
        "POST",
        LLAMAS,
        Some(llama("c", 1.0, json!({"hook": "slow"}))),
    )
    .await;
    assert_eq!(timed_out.status, 500);
    assert!(
        timed_out.json()["message"]
            .as_str()
            .unwrap()
            .ends_with("context deadline exceeded"),
        "{}",
        timed_out.json()
    );
    assert!(
        started.elapsed() < Duration::from_millis(2500),
        "{:?}",
        started.elapsed()
    );
    // Other requests are not held meanwhile.
    assert_eq!(send(&server, "GET", LLAMAS, None).await.status, 200);
}
