//! Webhooks reached through Services, and hooks of one version judging writes made through
//! another.

use super::*;

/// A webhook reached through a Service (`clientConfig.service`), resolved as kube-apiserver
/// resolves it: an ExternalName Service to its external name, a ClusterIP Service to its
/// ClusterIP when it has the port; TLS verifies the certificate for `<name>.<namespace>.svc`
/// (a certificate without that name fails, as does a Service that does not exist).
#[tokio::test]
async fn webhooks_reached_through_services() {
    let hook = Webhook::start_for(&["external.default.svc", "cluster.default.svc"]).await;
    hook.answer(|request| {
        if request["object"]["metadata"]["labels"]["deny"] == "yes" {
            deny(403, "no, through the service")
        } else {
            allow()
        }
    });
    let port = hook.port();
    let service = |name: &str, spec: Value| {
        json!({"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": name, "namespace": "default"}, "spec": spec})
    };
    let webhook = |name: &str, service: &str, select: &str| {
        json!({
            "name": format!("{name}.farm.example.com"),
            "clientConfig": hook.service_config("default", service, "/validate"),
            "rules": [{"apiGroups": ["farm.example.com"], "apiVersions": ["*"],
                       "operations": ["CREATE"], "resources": ["llamas"]}],
            "objectSelector": {"matchLabels": {"via": select}},
            "sideEffects": "None", "admissionReviewVersions": ["v1"], "failurePolicy": "Fail",
        })
    };
    let mut configuration = validating(
        "through-services",
        webhook("external", "external", "external"),
    );
    configuration["webhooks"].as_array_mut().unwrap().extend([
        webhook("cluster", "cluster", "cluster"),
        webhook("unnamed", "unnamed", "unnamed"),
        webhook("missing", "missing", "missing"),
        webhook("portless", "portless", "portless"),
    ]);
    let configurations = [
        service(
            "external",
            json!({"type": "ExternalName", "externalName": "localhost"}),
        ),
        service(
            "cluster",
            json!({"type": "ClusterIP", "clusterIP": "127.0.0.1",
            "ports": [{"port": port}]}),
        ),
        // Reaches the webhook, whose certificate does not name it.
        service(
            "unnamed",
            json!({"type": "ExternalName", "externalName": "localhost"}),
        ),
        service(
            "portless",
            json!({"type": "ClusterIP", "clusterIP": "127.0.0.1",
            "ports": [{"port": 1}]}),
        ),
        configuration,
    ];
    let (server, _fake) = server_with(TestStorage::Memory, &configurations)
        .await
        .unwrap();
    let create = |name: &str, via: &str, deny: &str| {
        let body = llama(name, 5.0, json!({"via": via, "deny": deny}));
        let server = &server;
        async move { send(server, "POST", LLAMAS, Some(body)).await }
    };
    for via in ["external", "cluster"] {
        let allowed = create(&format!("{via}-ok"), via, "no").await;
        assert_eq!(allowed.status, 201, "{}", allowed.json());
        let denied = create(&format!("{via}-no"), via, "yes").await;
        assert_eq!(denied.status, 403, "{}", denied.json());
        assert_eq!(
            denied.json()["message"],
            format!(
                "admission webhook \"{via}.farm.example.com\" denied the request: no, through the service"
            )
        );
    }
    assert_eq!(hook.seen().len(), 4);
    assert!(
        hook.seen().iter().all(|review| review["test:uri"]
            .as_str()
            .unwrap()
            .starts_with("/validate?timeout=")),
        "{:?}",
        hook.seen()
    );
    for (via, expected) in [
        ("unnamed", "certificate"),
        ("missing", "service \"missing\" not found"),
        ("portless", "no service port"),
    ] {
        let failed = create(&format!("{via}-x"), via, "no").await;
        assert_eq!(failed.status, 500, "{}", failed.json());
        let message = failed.json()["message"].as_str().unwrap().to_owned();
        assert!(
            message.starts_with(&format!(
                "Internal error occurred: failed calling webhook \"{via}.farm.example.com\": failed to call webhook"
            )) && message.contains(expected),
            "{message}"
        );
    }
    assert_eq!(hook.seen().len(), 4);
}

/// `matchPolicy: Equivalent`, kube-apiserver's default: a webhook or policy whose rules name
/// only v1alpha judges a write made through v1, converted to v1alpha (`kind` and `resource`
/// v1alpha, `requestKind` and `requestResource` v1); what it mutates is converted back, v1's
/// nickname kept; `Exact` is not called. A v1alpha write is judged as it always was.
#[tokio::test]
async fn hooks_of_one_version_judge_writes_made_through_another() {
    let hook = Webhook::start().await;
    // The mutating webhook sets v1alpha's weight of a Llama named "patched" (the validating
    // ones see it set).
    hook.answer(|request| {
        if request["name"] == "patched" && request["object"]["spec"]["weight"] == 200 {
            patch(json!([{"op": "replace", "path": "/spec/weight", "value": 7.0}]))
        } else {
            allow()
        }
    });
    let alpha_rules = json!([{"apiGroups": ["farm.example.com"], "apiVersions": ["v1alpha"],
        "operations": ["CREATE", "UPDATE"], "resources": ["llamas"]}]);
    let policy_rules = json!({"resourceRules": alpha_rules.clone()});
    let configurations = [
        mutating(
            "alpha-mutating",
            json!({"clientConfig": hook.client_config("/mutate"), "rules": alpha_rules.clone()}),
        ),
        validating(
            "alpha-equivalent",
            json!({"clientConfig": hook.client_config("/equivalent"), "rules": alpha_rules.clone()}),
        ),
        validating(
            "v1-only",
            json!({"clientConfig": hook.client_config("/v1-only"),
                   "rules": [{"apiGroups": ["farm.example.com"], "apiVersions": ["v1"],
                              "operations": ["CREATE"], "resources": ["llamas"]}]}),
        ),
        validating(
            "alpha-deletes",
            json!({"clientConfig": hook.client_config("/deletes"),
                   "rules": [{"apiGroups": ["farm.example.com"], "apiVersions": ["v1alpha"],
                              "operations": ["DELETE"], "resources": ["llamas"]}]}),
        ),
        validating(
            "alpha-exact",
            json!({"clientConfig": hook.client_config("/exact"), "rules": alpha_rules.clone(),
                   "matchPolicy": "Exact"}),
        ),
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": "alpha-weight"},
            "spec": {
                "matchConstraints": policy_rules.clone(),
                "validations": [{
                    "expression": "object.spec.weight < 500.0",
                    "messageExpression": "'too heavy at ' + request.kind.version + ' for a ' + request.requestKind.version + ' write'",
                }],
            },
        }),
        json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
               "metadata": {"name": "alpha-weight"},
               "spec": {"policyName": "alpha-weight", "validationActions": ["Deny"]}}),
        json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingAdmissionPolicy",
               "metadata": {"name": "alpha-height"},
               "spec": {"matchConstraints": policy_rules,
                        "mutations": [{"patchType": "ApplyConfiguration", "applyConfiguration": {"expression":
                            "Object{spec: Object.spec{height: object.spec.height * 2.0}}"}}]}}),
        mutating_binding("alpha-height", "alpha-height", None, json!({})),
    ];
    let (server, _fake) = server_with(TestStorage::Memory, &configurations)
        .await
        .unwrap();
    let v1 = "/apis/farm.example.com/v1/namespaces/default/llamas";
    let v1_llama = |name: &str, weight: f64| {
        json!({"apiVersion": "farm.example.com/v1", "kind": "Llama", "metadata": {"name": name},
               "spec": {"weightKg": weight, "heightMetres": 1.5, "nickname": "Kuzco"}})
        .to_string()
        .into_bytes()
    };
    let reviews = |path: &str| -> Vec<Value> {
        hook.seen()
            .into_iter()
            .filter(|r| r["test:uri"].as_str().is_some_and(|u| u.starts_with(path)))
            .collect()
    };

    // A v1 write: every v1alpha hook sees it at v1alpha; their mutations come back to v1.
    let created = send(&server, "POST", v1, Some(v1_llama("patched", 200.0))).await;
    assert_eq!(created.status, 201, "{}", created.json());
    let body = created.json();
    assert_eq!(body["apiVersion"], "farm.example.com/v1");
    assert_eq!(
        body["spec"],
        json!({"weightKg": 7, "heightMetres": 3, "nickname": "Kuzco"}),
        "the webhook's weight, the policy's height, v1's nickname kept"
    );
    assert_eq!(body["metadata"].get("annotations"), None, "{body}");
    let mutated = reviews("/mutate");
    assert_eq!(mutated.len(), 1, "{mutated:?}");
    let request = &mutated[0]["request"];
    assert_eq!(request["kind"]["version"], "v1alpha");
    assert_eq!(request["resource"]["version"], "v1alpha");
    assert_eq!(request["requestKind"]["version"], "v1");
    assert_eq!(request["requestResource"]["version"], "v1");
    assert_eq!(request["object"]["apiVersion"], "farm.example.com/v1alpha");
    // The policy ran first (it doubled the height); v1's nickname rides in the annotation.
    assert_eq!(
        request["object"]["spec"],
        json!({"weight": 200, "height": 3})
    );
    assert_eq!(
        request["object"]["metadata"]["annotations"]["farm.example.com/v1-nickname"],
        "Kuzco"
    );
    let validated = reviews("/equivalent");
    assert_eq!(validated.len(), 1, "{validated:?}");
    let request = &validated[0]["request"];
    assert_eq!(request["kind"]["version"], "v1alpha");
    assert_eq!(request["requestKind"]["version"], "v1");
    assert_eq!(request["object"]["spec"], json!({"weight": 7, "height": 3}));
    assert!(reviews("/exact").is_empty(), "Exact takes no v1 write");
    let seen = reviews("/v1-only");
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0]["request"]["requestKind"]["version"], "v1");
    assert_eq!(seen[0]["request"]["kind"]["version"], "v1");

    // An update through v1: the old object too is at v1alpha, the nickname in it.
    let patched = send(
        &server,
        "PATCH",
        &format!("{v1}/patched"),
        Some(br#"{"spec":{"weightKg":8}}"#.to_vec()),
    )
    .await;
    assert_eq!(patched.status, 200, "{}", patched.json());
    assert_eq!(
        patched.json()["spec"],
        json!({"weightKg": 8, "heightMetres": 6, "nickname": "Kuzco"})
    );
    let request = &reviews("/equivalent").last().unwrap()["request"].clone();
    assert_eq!(request["operation"], "UPDATE");
    assert_eq!(request["requestKind"]["version"], "v1");
    assert_eq!(
        request["oldObject"]["apiVersion"],
        "farm.example.com/v1alpha"
    );
    assert_eq!(
        request["oldObject"]["spec"],
        json!({"weight": 7, "height": 3})
    );
    assert_eq!(
        request["oldObject"]["metadata"]["annotations"]["farm.example.com/v1-nickname"],
        "Kuzco"
    );
    assert_eq!(request["object"]["spec"], json!({"weight": 8, "height": 6}));

    // The v1alpha policy judges v1's weightKg as its weight.
    let refused = send(&server, "POST", v1, Some(v1_llama("heavy", 900.0))).await;
    assert_eq!(refused.status, 422, "{}", refused.json());
    assert!(
        refused.json()["message"]
            .as_str()
            .is_some_and(|m| m.ends_with("denied request: too heavy at v1alpha for a v1 write")),
        "{}",
        refused.json()
    );
    assert_eq!(
        send(&server, "GET", &format!("{v1}/heavy"), None)
            .await
            .status,
        404
    );

    // A delete through v1: the v1alpha DELETE webhook gets the old object at v1alpha.
    assert_eq!(
        send(&server, "DELETE", &format!("{v1}/patched"), None)
            .await
            .status,
        200
    );
    let deleted = reviews("/deletes");
    assert_eq!(deleted.len(), 1, "{deleted:?}");
    let request = &deleted[0]["request"];
    assert_eq!(request["kind"]["version"], "v1alpha");
    assert_eq!(request["requestKind"]["version"], "v1");
    assert_eq!(request["object"], Value::Null);
    assert_eq!(request["oldObject"]["spec"]["weight"], 8);

    // A v1alpha write: the same hooks, and Exact too, at the version requested; the v1 one at
    // v1, the write converted up.
    let created = send(
        &server,
        "POST",
        LLAMAS,
        Some(llama("alpha", 10.0, json!({}))),
    )
    .await;
    assert_eq!(created.status, 201, "{}", created.json());
    assert_eq!(created.json()["spec"], json!({"weight": 10, "height": 2}));
    for path in ["/equivalent", "/exact"] {
        let seen = reviews(path);
        let request = &seen.last().unwrap()["request"];
        assert_eq!(request["name"], "alpha", "{path}");
        assert_eq!(request["kind"]["version"], "v1alpha", "{path}");
        assert_eq!(request["requestKind"]["version"], "v1alpha", "{path}");
    }
    let request = &reviews("/v1-only").last().unwrap()["request"].clone();
    assert_eq!(request["name"], "alpha");
    assert_eq!(request["kind"]["version"], "v1");
    assert_eq!(request["requestKind"]["version"], "v1alpha");
    assert_eq!(
        request["object"]["spec"],
        json!({"weightKg": 10, "heightMetres": 2})
    );
}
