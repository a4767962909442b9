//! ValidatingAdmissionPolicies: quantities, the cost limit, the authorizer, and every validation
//! judged.

use super::*;

/// Kubernetes' quantity library, its values kept as quantities through `variables` (a
/// variable holding `quantity(...)` is compared by value in a validation): a height over the
/// ConfigMap's `1500m` is refused, one at `1.5` or under allowed.
#[tokio::test]
async fn quantities_in_policy_variables() {
    let configurations = [
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": "max-height"},
            "spec": {
                "failurePolicy": "Fail",
                "paramKind": {"apiVersion": "v1", "kind": "ConfigMap"},
                "matchConstraints": {"resourceRules": [{"apiGroups": ["farm.example.com"], "apiVersions": ["*"],
                    "operations": ["CREATE"], "resources": ["llamas"]}]},
                "variables": [
                    {"name": "limit", "expression": "quantity(params.data.maxHeight)"},
                    {"name": "height", "expression": "quantity(string(object.spec.height))"},
                ],
                "validations": [{
                    "expression": "!variables.height.isGreaterThan(variables.limit)",
                    "messageExpression": "'height ' + string(variables.height.asApproximateFloat()) + ' is over ' + params.data.maxHeight",
                }],
            },
        }),
        json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "heights", "namespace": "default"}, "data": {"maxHeight": "1500m"}}),
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": "max-height"},
            "spec": {"policyName": "max-height", "validationActions": ["Deny"],
                "paramRef": {"name": "heights", "namespace": "default"}},
        }),
    ];
    let (server, fake) = server_with(TestStorage::Memory, &configurations)
        .await
        .unwrap();
    let create = |name: &str, height: f64| {
        json!({"apiVersion": "farm.example.com/v1alpha", "kind": "Llama",
            "metadata": {"name": name}, "spec": {"weight": 10.0, "height": height}})
        .to_string()
        .into_bytes()
    };
    // The first write starts the ConfigMaps' watch; later ones read it and ask the cluster
    // nothing.
    let first = send(&server, "POST", LLAMAS, Some(create("first", 0.5))).await;
    assert_eq!(first.status, 201);
    let asked = fake.requests();
    for (name, height, status) in [
        ("short", 1.0, 201),
        ("exact", 1.5, 201),
        ("tall", 2.25, 422),
    ] {
        let created = send(&server, "POST", LLAMAS, Some(create(name, height))).await;
        let text = String::from_utf8_lossy(&created.body);
        assert_eq!(created.status, status, "{name}: {text}");
        if status == 422 {
            assert!(text.contains("height 2.25 is over 1500m"), "{text}");
        }
    }
    assert_eq!(fake.requests(), asked, "a write listed params");
    // A changed param is seen through the watch.
    fake.add(json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "heights", "namespace": "default"}, "data": {"maxHeight": "3"}}));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let tall = send(&server, "POST", LLAMAS, Some(create("tall", 2.25))).await;
        if tall.status == 201 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{}",
            String::from_utf8_lossy(&tall.body)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A policy built to exhaust memory or time is cut off at kube-apiserver's cost limit, not
/// run to the end: variables that double at each step (2^40 copies of a name without the
/// bound), `replace` nested to multiply a string's size eleven times per call, and a nested
/// comprehension (every finalizer unique: a policy kube-apiserver takes) over 2,000
/// finalizers, four million iterations. The same nested policy passes a Llama with a few
/// finalizers. The write is refused under `Fail`, let through under `Ignore`, and the server
/// goes on.
#[tokio::test]
async fn hostile_policies_hit_the_cost_limit() {
    let mut variables = vec![json!({"name": "v0", "expression": "object.metadata.name"})];
    for i in 1..=40 {
        variables.push(json!({"name": format!("v{i}"),
            "expression": format!("variables.v{0} + variables.v{0}", i - 1)}));
    }
    let replaced = format!(
        "object.metadata.name{}.size() > 0",
        ".replace('', '0123456789')".repeat(12)
    );
    let unique = "!has(object.metadata.finalizers) || object.metadata.finalizers.all(a, object.metadata.finalizers.exists_one(b, a == b))";
    let policy = |name: &str, failure: &str, variables: Value, expression: &str| {
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name},
            "spec": {
                "failurePolicy": failure,
                "matchConstraints": {"resourceRules": [{"apiGroups": ["farm.example.com"], "apiVersions": ["*"],
                    "operations": ["CREATE"], "resources": ["llamas"]}]},
                "matchConditions": [{"name": "chosen", "expression": format!("object.metadata.labels['policy'] == '{name}'")}],
                "variables": variables,
                "validations": [{"expression": expression}],
            },
        })
    };
    let binding = |name: &str| {
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name},
            "spec": {"policyName": name, "validationActions": ["Deny"]},
        })
    };
    let configurations = [
        policy(
            "doubling",
            "Fail",
            json!(variables),
            "size(variables.v40) > 0",
        ),
        binding("doubling"),
        policy("replacing", "Fail", json!([]), &replaced),
        binding("replacing"),
        policy("unique", "Fail", json!([]), unique),
        binding("unique"),
        policy(
            "ignored",
            "Ignore",
            json!(variables),
            "size(variables.v40) > 0",
        ),
        binding("ignored"),
    ];
    let (server, _fake) = server_with(TestStorage::Memory, &configurations)
        .await
        .unwrap();
    let with_finalizers = |name: &str, count: usize| {
        let finalizers: Vec<String> = (0..count)
            .map(|i| format!("farm.example.com/f{i}"))
            .collect();
        json!({"apiVersion": "farm.example.com/v1alpha", "kind": "Llama",
               "metadata": {"name": name, "labels": {"policy": "unique"}, "finalizers": finalizers},
               "spec": {"weight": 10.0, "height": 1.0}})
        .to_string()
        .into_bytes()
    };
    let few = send(&server, "POST", LLAMAS, Some(with_finalizers("few", 20))).await;
    assert_eq!(few.status, 201, "{}", String::from_utf8_lossy(&few.body));
    for (name, status) in [
        ("doubling", 422),
        ("replacing", 422),
        ("unique", 422),
        ("ignored", 201),
    ] {
        let body = if name == "unique" {
            with_finalizers(name, 2000)
        } else {
            llama(name, 10.0, json!({"policy": name}))
        };
        let created = send(&server, "POST", LLAMAS, Some(body)).await;
        let text = String::from_utf8_lossy(&created.body);
        assert_eq!(created.status, status, "{name}: {text}");
        if status == 422 {
            // An unoptimised build may reach the 250 ms deadline before the cost limit: the
            // meter stops the evaluation either way.
            assert!(
                text.contains("actual cost limit exceeded")
                    || (name == "unique" && text.contains("took longer than its budget")),
                "{text}"
            );
        }
    }
    assert_eq!(send(&server, "GET", LLAMAS, None).await.status, 200);
}

/// The `authorizer` variable: a policy asks the cluster (a SubjectAccessReview, here the fake
/// kube-apiserver's) whether the writing user may do something else, here `approve` Llamas;
/// `authorizer.requestResource` names the write's own resource. Alice may approve, Bob may
/// not; `system:masters` may everything without a review. A webhook's matchCondition asks
/// it too: the webhook sees only approvers' writes.
#[tokio::test]
async fn policies_ask_the_authorizer() {
    let hook = Webhook::start().await;
    hook.answer(|_| json!({"allowed": true}));
    let configurations = [
        validating(
            "approved",
            json!({
                "clientConfig": hook.client_config("/approved"),
                "matchConditions": [{"name": "approver",
                    "expression": "authorizer.requestResource.check('approve').allowed()"}],
            }),
        ),
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": "approvers"},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {"resourceRules": [{"apiGroups": ["farm.example.com"], "apiVersions": ["*"],
                    "operations": ["CREATE"], "resources": ["llamas"]}]},
                "validations": [
                    {"expression": "authorizer.requestResource.check('approve').allowed()",
                     "messageExpression": "'may not approve: ' + authorizer.requestResource.check('approve').reason()"},
                    {"expression": "authorizer.group('').resource('configmaps').namespace('default').check('get').allowed()",
                     "message": "may not read ConfigMaps"},
                ],
            },
        }),
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": "approvers"},
            "spec": {"policyName": "approvers", "validationActions": ["Deny"]},
        }),
    ];
    let (server, fake) = server_with(TestStorage::Memory, &configurations)
        .await
        .unwrap();
    let asked = Arc::new(Mutex::new(Vec::new()));
    let seen = asked.clone();
    fake.set_policy(move |spec| {
        let attributes = &spec["resourceAttributes"];
        if attributes["verb"] == "approve" {
            seen.lock().unwrap().push(attributes.clone());
            let alice = spec["user"] == "alice";
            return (
                alice,
                if alice { "" } else { "approving is Alice's" }.to_owned(),
            );
        }
        (true, String::new())
    });
    let write = |user: &str, name: &str| {
        let identity = if user == "admin" {
            server.admin_identity()
        } else {
            server.dev_ca().issue_client(user, &[]).unwrap()
        };
        let body = llama(name, 10.0, json!({}));
        let server = &server;
        async move {
            server
                .raw(Some(identity), Alpn::Http1)
                .send(
                    "POST",
                    LLAMAS,
                    &[("content-type", "application/json")],
                    Some(body),
                )
                .await
        }
    };
    let alice = write("alice", "alices").await;
    assert_eq!(
        alice.status,
        201,
        "{}",
        String::from_utf8_lossy(&alice.body)
    );
    let bob = write("bob", "bobs").await;
    assert_eq!(bob.status, 422, "{}", String::from_utf8_lossy(&bob.body));
    assert!(
        bob.json()["message"]
            .as_str()
            .is_some_and(|m| m.ends_with("denied request: may not approve: approving is Alice's")),
        "{}",
        bob.json()
    );
    let admin = write("admin", "admins").await;
    assert_eq!(admin.status, 201);
    let asked = asked.lock().unwrap().clone();
    assert_eq!(
        asked.len(),
        2,
        "a review for Alice and one for Bob: {asked:?}"
    );
    let seen: Vec<Value> = hook
        .seen()
        .iter()
        .map(|review| review["request"]["userInfo"]["username"].clone())
        .collect();
    assert_eq!(seen, vec![json!("alice"), json!("farm-dev-admin")]);
    assert_eq!(asked[0]["group"], "farm.example.com");
    assert_eq!(asked[0]["resource"], "llamas");
    assert_eq!(asked[0]["namespace"], "default");
    assert_eq!(asked[0]["name"], "alices");
}

/// Every binding and every validation is judged before the answer, as kube-apiserver's
/// dispatcher does: the first denial answers, and a `Warn` binding after it (by name) still
/// warns, once per failed validation.
#[tokio::test]
async fn every_validation_is_judged_before_the_answer() {
    let binding = |name: &str, action: &str| {
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name},
            "spec": {"policyName": "two-rules", "validationActions": [action]},
        })
    };
    let configurations = [
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": "two-rules"},
            "spec": {
                "matchConstraints": {"resourceRules": [{"apiGroups": ["farm.example.com"], "apiVersions": ["*"],
                    "operations": ["CREATE"], "resources": ["llamas"]}]},
                "validations": [
                    {"expression": "object.spec.weight < 100.0", "message": "too heavy"},
                    {"expression": "object.spec.height < 2.0", "message": "too tall"},
                ],
            },
        }),
        binding("a-deny", "Deny"),
        binding("b-warn", "Warn"),
    ];
    let (server, _fake) = server_with(TestStorage::Memory, &configurations)
        .await
        .unwrap();
    let body = json!({"apiVersion": "farm.example.com/v1alpha", "kind": "Llama",
        "metadata": {"name": "big"}, "spec": {"weight": 500.0, "height": 3.0}});
    let refused = send(&server, "POST", LLAMAS, Some(body.to_string().into_bytes())).await;
    assert_eq!(refused.status, 422);
    assert!(
        refused.json()["message"]
            .as_str()
            .is_some_and(|m| m.ends_with("binding 'a-deny' denied request: too heavy")),
        "{}",
        refused.json()
    );
    assert_eq!(
        warnings(&refused),
        vec![
            "299 - \"Validation failed for ValidatingAdmissionPolicy 'two-rules' with binding 'b-warn': too heavy\"",
            "299 - \"Validation failed for ValidatingAdmissionPolicy 'two-rules' with binding 'b-warn': too tall\"",
        ]
    );
}
