//! Which writes a webhook sees (rules, selectors, dry run, deletes, match conditions), reinvocation,
//! and answers that must not break a write.

use super::*;

/// Which webhooks a write calls: rules (operations, resources), objectSelector (new or old
/// labels), namespaceSelector (the namespace's labels from the cluster); a dry run never calls a
/// webhook with side effects (400, as kube-apiserver); deletes go through validating webhooks;
/// removing a configuration stops its calls.
#[tokio::test]
async fn rules_selectors_dry_run_and_deletes() {
    let hook = Webhook::start().await;
    hook.answer(|request| {
        if request["operation"] == "DELETE" {
            deny(409, "keep it")
        } else {
            allow()
        }
    });
    let by_labels = validating(
        "labels",
        json!({
            "clientConfig": hook.client_config("/labels"),
            "objectSelector": {"matchLabels": {"team": "a"}},
        }),
    );
    let by_namespace = validating(
        "prod",
        json!({
            "clientConfig": hook.client_config("/prod"),
            "namespaceSelector": {"matchExpressions": [{"key": "env", "operator": "In", "values": ["prod"]}]},
        }),
    );
    let deletes = validating(
        "deletes",
        json!({
            "clientConfig": hook.client_config("/deletes"),
            "rules": [{"apiGroups": ["*"], "apiVersions": ["*"], "operations": ["DELETE"], "resources": ["llamas"]}],
            "sideEffects": "Unknown",
        }),
    );
    let (server, fake) = server_with(
        TestStorage::Memory,
        &[by_labels.clone(), by_namespace, deletes],
    )
    .await
    .unwrap();
    let paths = || -> Vec<String> {
        hook.seen()
            .iter()
            .map(|r| {
                r["test:uri"]
                    .as_str()
                    .unwrap()
                    .split('?')
                    .next()
                    .unwrap()
                    .to_owned()
            })
            .collect()
    };

    assert_eq!(
        send(
            &server,
            "POST",
            LLAMAS,
            Some(llama("b", 1.0, json!({"team": "b"})))
        )
        .await
        .status,
        201
    );
    assert_eq!(
        paths(),
        Vec::<String>::new(),
        "neither selector matches, no DELETE rule"
    );
    assert_eq!(
        send(
            &server,
            "POST",
            LLAMAS,
            Some(llama("a", 1.0, json!({"team": "a"})))
        )
        .await
        .status,
        201
    );
    assert_eq!(paths(), vec!["/labels"]);
    // The old object's labels match: the update that removes them is seen.
    let unlabel = send(
        &server,
        "PATCH",
        &format!("{LLAMAS}/a"),
        Some(br#"{"metadata":{"labels":null}}"#.to_vec()),
    )
    .await;
    assert_eq!(unlabel.status, 200);
    assert_eq!(paths(), vec!["/labels", "/labels"]);

    // DELETE: refused by its webhook, the Llama stays.
    let refused = send(&server, "DELETE", &format!("{LLAMAS}/b"), None).await;
    assert_eq!(refused.status, 409);
    assert_eq!(
        hook.seen().last().unwrap()["request"]["oldObject"]["metadata"]["name"],
        "b"
    );
    assert_eq!(
        hook.seen().last().unwrap()["request"]["object"],
        Value::Null
    );
    assert_eq!(
        hook.seen().last().unwrap()["request"]["options"]["kind"],
        "DeleteOptions"
    );
    assert_eq!(
        send(&server, "GET", &format!("{LLAMAS}/b"), None)
            .await
            .status,
        200
    );
    // A dry run of it: the webhook has side effects, so it is not called and the request is
    // refused.
    let calls = hook.seen().len();
    let dry = send(&server, "DELETE", &format!("{LLAMAS}/b?dryRun=All"), None).await;
    assert_eq!(dry.status, 400);
    assert_eq!(
        dry.json()["message"],
        "admission webhook \"deletes.farm.example.com\" does not support dry run"
    );
    assert_eq!(hook.seen().len(), calls);

    // Without its configuration, the webhook is not called any more.
    fake.remove(&by_labels);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let calls = hook.seen().len();
        let name = format!("x{calls}");
        assert_eq!(
            send(
                &server,
                "POST",
                LLAMAS,
                Some(llama(&name, 1.0, json!({"team": "a"})))
            )
            .await
            .status,
            201
        );
        if hook.seen().len() == calls {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the removed configuration is still called"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// reinvocationPolicy IfNeeded: a webhook that ran before a later one changed the object is
/// called once more (and only once), and sees the change.
#[tokio::test]
async fn mutating_webhooks_are_reinvoked_if_needed() {
    let first = Webhook::start().await;
    first.answer(|request| {
        if request["object"]["metadata"]["labels"]["second"] == "yes" {
            patch(
                json!([{"op": "add", "path": "/metadata/labels/first-saw-second", "value": "yes"}]),
            )
        } else {
            allow()
        }
    });
    let second = Webhook::start().await;
    second.answer(|request| {
        if request["object"]["metadata"]["labels"]["second"] == "yes" {
            allow()
        } else {
            patch(json!([{"op": "add", "path": "/metadata/labels/second", "value": "yes"}]))
        }
    });
    let configurations = [
        mutating(
            "a-first",
            json!({"clientConfig": first.client_config("/first"), "reinvocationPolicy": "IfNeeded"}),
        ),
        mutating(
            "b-second",
            json!({"clientConfig": second.client_config("/second")}),
        ),
    ];
    let (server, _fake) = server_with(TestStorage::Memory, &configurations)
        .await
        .unwrap();
    let created = send(
        &server,
        "POST",
        LLAMAS,
        Some(llama("twice", 1.0, json!({"herd": "test"}))),
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
        json!({"herd": "test", "second": "yes", "first-saw-second": "yes"})
    );
    assert_eq!(first.seen().len(), 2);
    assert_eq!(second.seen().len(), 1);
}

/// Reinvocation across the two mutating plugins, as kube-apiserver's reinvocation context
/// runs it: a webhook changed the object after a MutatingAdmissionPolicy with `IfNeeded`, so
/// the policy runs again; its second run changed the object after the webhook (also
/// `IfNeeded`), so the webhook is called again and sees it. A policy without `IfNeeded` runs
/// once.
#[tokio::test]
async fn policies_and_webhooks_are_reinvoked_together() {
    let hook = Webhook::start().await;
    hook.answer(|request| {
        let labels = &request["object"]["metadata"]["labels"];
        let saw = labels["policy-saw"]
            .as_str()
            .unwrap_or("nothing")
            .to_owned();
        let mut operations =
            vec![json!({"op": "add", "path": "/metadata/labels/webhook-saw", "value": saw})];
        if labels.get("webhook").is_none() {
            operations
                .push(json!({"op": "add", "path": "/metadata/labels/webhook", "value": "yes"}));
        }
        patch(json!(operations))
    });
    let saw = |name: &str, reinvocation: &str| {
        mutating_policy(
            name,
            json!({
                "failurePolicy": "Fail",
                "reinvocationPolicy": reinvocation,
                "mutations": [{"patchType": "ApplyConfiguration", "applyConfiguration": {"expression":
                    format!("Object{{metadata: Object.metadata{{labels: {{'{name}': object.metadata.labels.?webhook.orValue('none')}}}}}}")}}],
            }),
        )
    };
    let configurations = [
        saw("policy-saw", "IfNeeded"),
        mutating_binding("policy-saw", "policy-saw", None, json!({})),
        saw("once-saw", "Never"),
        mutating_binding("once-saw", "once-saw", None, json!({})),
        mutating(
            "hook",
            json!({"clientConfig": hook.client_config("/hook"), "reinvocationPolicy": "IfNeeded"}),
        ),
    ];
    let (server, _fake) = server_with(TestStorage::Memory, &configurations)
        .await
        .unwrap();
    let created = send(
        &server,
        "POST",
        LLAMAS,
        Some(llama("passes", 1.0, json!({"herd": "test"}))),
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
        json!({"herd": "test", "policy-saw": "yes", "once-saw": "none", "webhook": "yes", "webhook-saw": "yes"})
    );
    assert_eq!(hook.seen().len(), 2);
}

/// Whatever a webhook answers (refusals with any code, patches to any field, huge or broken
/// patches, answers of the wrong shape), the client gets a success, a client error, or one of
/// kube-apiserver's webhook failures; and a write that was refused changed nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_webhook_answer_breaks_a_write() {
    use proptest::prelude::*;
    let mutator = Webhook::start().await;
    let validator = Webhook::start().await;
    let configurations = [
        mutating("any", json!({"clientConfig": mutator.client_config("/m")})),
        validating(
            "any",
            json!({"clientConfig": validator.client_config("/v")}),
        ),
    ];
    let (server, _fake) = server_with(TestStorage::Memory, &configurations)
        .await
        .unwrap();
    let path = prop_oneof![
        Just("/metadata/name"),
        Just("/metadata/namespace"),
        Just("/metadata/uid"),
        Just("/metadata/resourceVersion"),
        Just("/metadata/labels"),
        Just("/metadata/labels/x"),
        Just("/metadata/managedFields"),
        Just("/spec/weight"),
        Just("/spec"),
        Just("/kind"),
        Just("/apiVersion"),
        Just("/status"),
        Just("/nothing/here"),
    ];
    let value = prop_oneof![
        Just(json!(null)),
        Just(json!(1)),
        Just(json!(-5.5)),
        Just(json!("text")),
        Just(json!({"a": "b"})),
        Just(json!([1, 2])),
        Just(json!("x".repeat(100_000))),
    ];
    let operation = (
        prop_oneof![
            Just("add"),
            Just("replace"),
            Just("remove"),
            Just("copy"),
            Just("move"),
            Just("test")
        ],
        path.clone(),
        path,
        value,
    )
        .prop_map(
            |(op, path, from, value)| json!({"op": op, "path": path, "from": from, "value": value}),
        );
    let answer = prop_oneof![
        Just(allow()),
        (0u16..700).prop_map(|code| deny(code, "no")),
        prop::collection::vec(operation, 0..40).prop_map(|ops| patch(Value::Array(ops))),
        Just(json!({"allowed": true, "patchType": "JSONPatch", "patch": "not base64!"})),
        Just(json!({"allowed": true, "patch": "W10="})),
        Just(json!("not a response")),
        Just(json!({"allowed": "yes"})),
    ];
    let before = send(&server, "GET", &format!("{LLAMAS}/dolly"), None)
        .await
        .json();
    let handle = tokio::runtime::Handle::current();
    let mut runner = proptest::test_runner::TestRunner::new(proptest::test_runner::Config {
        cases: 64,
        failure_persistence: None,
        ..Default::default()
    });
    let outcome = runner.run(&(answer.clone(), answer, any::<bool>()), |(mutation, validation, create)| {
        mutator.answer(move |_| mutation.clone());
        validator.answer(move |_| validation.clone());
        tokio::task::block_in_place(|| {
            handle.block_on(async {
                let start = send(&server, "GET", &format!("{LLAMAS}/dolly"), None).await.json();
                let reply = if create {
                    send(&server, "POST", LLAMAS, Some(llama("prop", 2.0, json!({})))).await
                } else {
                    send(&server, "PATCH", &format!("{LLAMAS}/dolly"), Some(br#"{"metadata":{"labels":{"seen":"1"}}}"#.to_vec())).await
                };
                let status = reply.json();
                let message = status["message"].as_str().unwrap_or_default().to_owned();
                // A denial carries the webhook's own code, 5xx included, as in kube-apiserver.
                let denied = message.starts_with("admission webhook \"any.farm.example.com\" denied the request");
                if reply.status >= 500 && !denied {
                    prop_assert_eq!(reply.status, 500, "{}", message);
                    prop_assert!(
                        message.starts_with("Internal error occurred: failed calling webhook \"any.farm.example.com\"")
                            || message.contains("admission webhook \"any.farm.example.com\" returned a patch that cannot be applied")
                            || message.contains("the object admission mutated cannot be read"),
                        "{}",
                        message
                    );
                }
                let dolly = send(&server, "GET", &format!("{LLAMAS}/dolly"), None).await.json();
                if create {
                    if reply.status == 201 {
                        let name = reply.json()["metadata"]["name"].as_str().unwrap().to_owned();
                        send(&server, "DELETE", &format!("{LLAMAS}/{name}"), None).await;
                    } else {
                        prop_assert_eq!(send(&server, "GET", &format!("{LLAMAS}/prop"), None).await.status, 404);
                    }
                    prop_assert_eq!(&dolly["metadata"]["resourceVersion"], &start["metadata"]["resourceVersion"]);
                } else if reply.status >= 400 {
                    prop_assert_eq!(&dolly["metadata"]["resourceVersion"], &start["metadata"]["resourceVersion"], "{}", message);
                } else {
                    // Put back: the next case starts from the same Llama.
                    prop_assert_eq!(reply.status, 200);
                    prop_assert_eq!(&dolly["metadata"]["uid"], &before["metadata"]["uid"]);
                    prop_assert_eq!(&dolly["metadata"]["name"], "dolly");
                    mutator.answer(|_| allow());
                    validator.answer(|_| allow());
                    let mut restore = before.clone();
                    restore["metadata"]["resourceVersion"] = dolly["metadata"]["resourceVersion"].clone();
                    restore["metadata"].as_object_mut().unwrap().remove("managedFields");
                    let put = send(&server, "PUT", &format!("{LLAMAS}/dolly"), Some(restore.to_string().into_bytes())).await;
                    prop_assert_eq!(put.status, 200);
                }
                Ok(())
            })
        })
    });
    if let Err(failure) = outcome {
        panic!("{failure}");
    }
}

/// matchConditions (CEL over object, oldObject and request): a webhook is called only when
/// all hold; a condition that cannot be evaluated refuses the write under Fail (403) and skips
/// the webhook under Ignore.
#[tokio::test]
async fn match_conditions_choose_what_a_webhook_sees() {
    let hook = Webhook::start().await;
    hook.answer(|_| deny(403, "heavy"));
    let configurations = [
        validating(
            "heavy",
            json!({
                "clientConfig": hook.client_config("/heavy"),
                "matchConditions": [
                    {"name": "heavy", "expression": "object.spec.weight > 100"},
                    {"name": "creates", "expression": "request.operation == 'CREATE' && oldObject == null"},
                ],
            }),
        ),
        validating(
            "broken",
            json!({
                "clientConfig": hook.client_config("/broken"),
                "objectSelector": {"matchLabels": {"hook": "broken"}},
                "matchConditions": [{"name": "missing", "expression": "object.spec.nothing > 1"}],
            }),
        ),
        validating(
            "ignored",
            json!({
                "clientConfig": hook.client_config("/ignored"),
                "failurePolicy": "Ignore",
                "objectSelector": {"matchLabels": {"hook": "ignored"}},
                "matchConditions": [{"name": "missing", "expression": "object.spec.nothing > 1"}],
            }),
        ),
    ];
    let (server, _fake) = server_with(TestStorage::Memory, &configurations)
        .await
        .unwrap();
    assert_eq!(
        send(
            &server,
            "POST",
            LLAMAS,
            Some(llama("light", 5.0, json!({})))
        )
        .await
        .status,
        201
    );
    assert!(
        hook.seen().is_empty(),
        "a false condition skips the webhook"
    );
    let heavy = send(
        &server,
        "POST",
        LLAMAS,
        Some(llama("heavy", 500.0, json!({}))),
    )
    .await;
    assert_eq!(heavy.status, 403);
    assert_eq!(hook.seen().len(), 1);
    // Updates are not CREATEs: the second condition is false.
    let update = send(
        &server,
        "PATCH",
        &format!("{LLAMAS}/light"),
        Some(br#"{"spec":{"weight":500}}"#.to_vec()),
    )
    .await;
    assert_eq!(update.status, 200);
    assert_eq!(hook.seen().len(), 1);

    let broken = send(
        &server,
        "POST",
        LLAMAS,
        Some(llama("b", 5.0, json!({"hook": "broken"}))),
    )
    .await;
    assert_eq!(broken.status, 403);
    let message = broken.json()["message"].as_str().unwrap().to_owned();
    assert!(
        message.starts_with("llamas.farm.example.com \"b\" is forbidden: webhook \"broken.farm.example.com\": matchCondition \"missing\""),
        "{message}"
    );
    let ignored = send(
        &server,
        "POST",
        LLAMAS,
        Some(llama("i", 5.0, json!({"hook": "ignored"}))),
    )
    .await;
    assert_eq!(ignored.status, 201);
    assert_eq!(hook.seen().len(), 1);
}
