//! What a ValidatingAdmissionPolicy reads: every part of the object, its params, and readiness
//! until the configurations are read.

use super::*;

/// Policies are given only the parts of the object their expressions read (`object.spec`
/// alone for `object.spec.weight`), and each still sees all it reads: a field chain, the object
/// whole, `metadata` through a messageExpression, the labels an objectSelector judges, and
/// `oldObject` on an update, several policies on one write.
#[tokio::test]
async fn policies_see_every_part_of_the_object_they_read() {
    let policy = |name: &str, validation: Value, operations: Value| {
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name},
            "spec": {
                "matchConstraints": {"resourceRules": [{"apiGroups": ["farm.example.com"], "apiVersions": ["*"],
                    "operations": operations, "resources": ["llamas"]}]},
                "validations": [validation],
            },
        })
    };
    let binding = |name: &str, selector: Value| {
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name},
            "spec": {"policyName": name, "validationActions": ["Deny"],
                "matchResources": {"objectSelector": selector}},
        })
    };
    let configurations = [
        policy(
            "a-weight",
            json!({"expression": "object.spec.weight < 100.0",
                "messageExpression": "'too heavy: ' + object.metadata.name"}),
            json!(["CREATE"]),
        ),
        binding("a-weight", json!({})),
        policy(
            "b-whole",
            json!({"expression": "object.size() == 4 && 'kind' in object && object.kind == 'Llama'",
                "message": "not the whole object"}),
            json!(["CREATE"]),
        ),
        binding("b-whole", json!({})),
        policy(
            "c-labelled",
            json!({"expression": "object.spec.height < 2.0", "message": "labelled and too tall"}),
            json!(["CREATE"]),
        ),
        binding("c-labelled", json!({"matchLabels": {"checked": "yes"}})),
        policy(
            "d-grows",
            json!({"expression": "object.spec.weight >= oldObject.spec.weight && oldObject.metadata.name == object.metadata.name",
                "message": "llamas do not shrink"}),
            json!(["UPDATE"]),
        ),
        binding("d-grows", json!({})),
    ];
    let (server, _fake) = server_with(TestStorage::Memory, &configurations)
        .await
        .unwrap();
    let create = |name: &str, weight: f64, height: f64, labels: Value| {
        json!({"apiVersion": "farm.example.com/v1alpha", "kind": "Llama",
            "metadata": {"name": name, "labels": labels},
            "spec": {"weight": weight, "height": height}})
        .to_string()
        .into_bytes()
    };
    // The messageExpression reads metadata, which the validation does not.
    let heavy = send(
        &server,
        "POST",
        LLAMAS,
        Some(create("heavy", 500.0, 1.0, json!({}))),
    )
    .await;
    assert_eq!(heavy.status, 422, "{}", heavy.json());
    assert!(
        heavy.json()["message"]
            .as_str()
            .is_some_and(|m| m.ends_with("denied request: too heavy: heavy")),
        "{}",
        heavy.json()
    );
    // The objectSelector reads the labels: a tall Llama passes unlabelled, not labelled.
    let tall = send(
        &server,
        "POST",
        LLAMAS,
        Some(create("tall", 50.0, 3.0, json!({}))),
    )
    .await;
    assert_eq!(tall.status, 201, "{}", tall.json());
    let labelled = send(
        &server,
        "POST",
        LLAMAS,
        Some(create("labelled", 50.0, 3.0, json!({"checked": "yes"}))),
    )
    .await;
    assert_eq!(labelled.status, 422, "{}", labelled.json());
    assert!(
        labelled.json()["message"]
            .as_str()
            .is_some_and(|m| m.ends_with("labelled and too tall")),
        "{}",
        labelled.json()
    );
    // oldObject is read in part too.
    let path = format!("{LLAMAS}/tall");
    let shrunk = send(
        &server,
        "PATCH",
        &path,
        Some(json!({"spec": {"weight": 10.0}}).to_string().into_bytes()),
    )
    .await;
    assert_eq!(shrunk.status, 422, "{}", shrunk.json());
    let grown = send(
        &server,
        "PATCH",
        &path,
        Some(json!({"spec": {"weight": 60.0}}).to_string().into_bytes()),
    )
    .await;
    assert_eq!(grown.status, 200, "{}", grown.json());
}

/// A ValidatingAdmissionPolicy with a ConfigMap param, bound with Deny: a violation is refused
/// with its message (and its reason's code), the rest allowed; a Warn binding warns; a binding
/// whose param is missing denies (`parameterNotFoundAction: Deny`); variables, matchConditions
/// and messageExpression as kube-apiserver evaluates them.
#[tokio::test]
async fn validating_admission_policies_with_params() {
    let policy = json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": "max-weight"},
        "spec": {
            "failurePolicy": "Fail",
            "paramKind": {"apiVersion": "v1", "kind": "ConfigMap"},
            "matchConstraints": {"resourceRules": [{"apiGroups": ["farm.example.com"], "apiVersions": ["*"],
                "operations": ["CREATE", "UPDATE"], "resources": ["llamas"]}]},
            "matchConditions": [{"name": "not-exempt", "expression": "!has(object.metadata.labels) || !('exempt' in object.metadata.labels)"}],
            "variables": [{"name": "limit", "expression": "double(params.data.maxWeight)"}],
            "validations": [{
                "expression": "object.spec.weight <= variables.limit",
                "messageExpression": "'weight ' + string(object.spec.weight) + ' is over ' + params.data.maxWeight",
            }],
        },
    });
    let binding = |name: &str, param: &str, actions: &[&str], selector: Value| {
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name},
            "spec": {
                "policyName": "max-weight",
                "paramRef": {"name": param, "namespace": "default", "parameterNotFoundAction": "Deny"},
                "validationActions": actions,
                "matchResources": {"objectSelector": selector,
                    "resourceRules": [{"apiGroups": ["*"], "apiVersions": ["*"], "operations": ["*"], "resources": ["*"]}]},
            },
        })
    };
    let limits = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "limits", "namespace": "default"}, "data": {"maxWeight": "100"}});
    let configurations = [
        policy,
        limits,
        binding(
            "deny",
            "limits",
            &["Deny"],
            json!({"matchLabels": {"binding": "deny"}}),
        ),
        binding(
            "warn",
            "limits",
            &["Warn"],
            json!({"matchLabels": {"binding": "warn"}}),
        ),
        binding(
            "missing",
            "nowhere",
            &["Deny"],
            json!({"matchLabels": {"binding": "missing"}}),
        ),
    ];
    let (server, _fake) = server_with(TestStorage::Memory, &configurations)
        .await
        .unwrap();

    let light = send(
        &server,
        "POST",
        LLAMAS,
        Some(llama("light", 50.0, json!({"binding": "deny"}))),
    )
    .await;
    assert_eq!(
        light.status,
        201,
        "{}",
        String::from_utf8_lossy(&light.body)
    );
    let heavy = send(
        &server,
        "POST",
        LLAMAS,
        Some(llama("heavy", 500.0, json!({"binding": "deny"}))),
    )
    .await;
    assert_eq!(
        heavy.status,
        422,
        "{}",
        String::from_utf8_lossy(&heavy.body)
    );
    let status = heavy.json();
    assert_eq!(
        status["message"],
        "llamas.farm.example.com \"heavy\" is forbidden: ValidatingAdmissionPolicy 'max-weight' with binding 'deny' denied request: weight 500 is over 100"
    );
    assert_eq!(status["reason"], "Invalid");
    assert_eq!(
        send(&server, "GET", &format!("{LLAMAS}/heavy"), None)
            .await
            .status,
        404
    );
    // An update is judged too; the Llama stays.
    let patched = send(
        &server,
        "PATCH",
        &format!("{LLAMAS}/light"),
        Some(br#"{"spec":{"weight":1000}}"#.to_vec()),
    )
    .await;
    assert_eq!(patched.status, 422);
    // The matchCondition exempts.
    let exempt = send(
        &server,
        "POST",
        LLAMAS,
        Some(llama(
            "exempt",
            500.0,
            json!({"binding": "deny", "exempt": "yes"}),
        )),
    )
    .await;
    assert_eq!(exempt.status, 201);

    let warned = send(
        &server,
        "POST",
        LLAMAS,
        Some(llama("warned", 500.0, json!({"binding": "warn"}))),
    )
    .await;
    assert_eq!(warned.status, 201);
    assert_eq!(
        warnings(&warned),
        vec![
            "299 - \"Validation failed for ValidatingAdmissionPolicy 'max-weight' with binding 'warn': weight 500 is over 100\""
        ]
    );

    let missing = send(
        &server,
        "POST",
        LLAMAS,
        Some(llama("m", 5.0, json!({"binding": "missing"}))),
    )
    .await;
    // A binding that cannot be configured: Invalid, whatever its validationActions.
    assert_eq!(
        missing.status,
        422,
        "{}",
        String::from_utf8_lossy(&missing.body)
    );
    assert!(
        missing.json()["message"].as_str().unwrap().ends_with(
            "denied request: failed to configure binding: no params found for policy binding with `Deny` parameterNotFoundAction"
        ),
        "{}",
        missing.json()
    );
    // Nothing binds an unlabelled Llama.
    assert_eq!(
        send(
            &server,
            "POST",
            LLAMAS,
            Some(llama("free", 500.0, json!({})))
        )
        .await
        .status,
        201
    );
    // Each decision counted with kube-apiserver's names.
    let metrics = send(&server, "GET", "/metrics", None).await;
    let metrics = String::from_utf8_lossy(&metrics.body).into_owned();
    let count = |binding: &str, action: &str| {
        metrics
            .lines()
            .find(|l| {
                l.starts_with("apiserver_validating_admission_policy_check_total{")
                    && l.contains("policy=\"max-weight\"")
                    && l.contains(&format!("policy_binding=\"{binding}\""))
                    && l.contains("error_type=\"no_error\"")
                    && l.contains(&format!("enforcement_action=\"{action}\""))
            })
            .and_then(|l| l.rsplit(' ').next())
            .map(str::to_owned)
    };
    // light, exempt (its matchCondition is false: allowed); heavy, the patch of light.
    assert_eq!(count("deny", "allow").as_deref(), Some("2"), "{metrics}");
    assert_eq!(count("deny", "deny").as_deref(), Some("2"), "{metrics}");
    assert_eq!(count("warn", "warn").as_deref(), Some("1"), "{metrics}");
    assert!(
        metrics.contains("apiserver_validating_admission_policy_check_duration_seconds_bucket{"),
        "{metrics}"
    );
}

/// `/readyz` waits for the admission configurations to be listed (`informer-sync`, as
/// k8s.io/apiserver's): a server that cannot read them (no RBAC, a broken cluster) is not
/// ready, rather than taking writes it would refuse.
#[tokio::test]
async fn readiness_waits_for_the_configurations() {
    let fake = FakeKube::start().await;
    fake.fail_next(100_000);
    let server = TestServer::start_with(Options {
        cluster: Some(fake.client().await),
        webhooks: true,
        ..Default::default()
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let ready = send(&server, "GET", "/readyz?verbose", None).await;
    assert_eq!(ready.status, 500);
    assert!(String::from_utf8_lossy(&ready.body).contains("[-]informer-sync failed"));

    let (server, _fake) = server_with(TestStorage::Memory, &[]).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let ready = send(&server, "GET", "/readyz?verbose", None).await;
        if ready.status == 200 {
            assert!(String::from_utf8_lossy(&ready.body).contains("[+]informer-sync ok"));
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{}",
            String::from_utf8_lossy(&ready.body)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
