//! Admission webhooks and policies configured with kubectl in the real cluster.

use super::*;

/// Webhook configurations the test applied; deleted when dropped (they are cluster-wide).
pub(super) struct Configured<'a> {
    cluster: &'a Cluster,
    names: Vec<(&'static str, String)>,
}

impl Drop for Configured<'_> {
    fn drop(&mut self) {
        for (kind, name) in &self.names {
            let _ = self
                .cluster
                .run(&["delete", kind, name, "--ignore-not-found"], None);
        }
    }
}

/// The cluster's admission webhooks, configured with kubectl as for any kind, reach Llama
/// writes through the aggregator (#28): a validating webhook (namespaceSelector on the real
/// namespace's labels) refuses with its message and sees the kubectl user and dry runs; a
/// mutating webhook's patch is stored; failurePolicy Fail refuses while a webhook is down;
/// deleting the configurations stops the calls within seconds.
pub(super) async fn webhooks_configured_with_kubectl(
    cluster: &Cluster,
    ns: &str,
    step: &dyn Fn(&str),
) {
    use crate::admission::{Webhook, allow, deny, mutating, patch, validating};
    step("admission webhooks on loopback, configured with kubectl");
    let validator = Webhook::start().await;
    validator.answer(|request| {
        if request["object"]["spec"]["weight"].as_f64() > Some(100.0) {
            deny(403, "too heavy")
        } else {
            allow()
        }
    });
    let mutator = Webhook::start().await;
    mutator.answer(|_| {
        patch(json!([{"op": "add", "path": "/metadata/labels/mutated", "value": "yes"}]))
    });
    let suffix = std::process::id();
    let in_namespace = json!({"matchLabels": {"kubernetes.io/metadata.name": ns}});
    // It names v1alpha only: v1 writes reach it converted (matchPolicy Equivalent).
    let mut weight = validating(
        &format!("farm-e2e-weight-{suffix}"),
        json!({"name": "weight.farm.example.com", "clientConfig": validator.client_config("/validate"),
               "rules": [{"apiGroups": ["farm.example.com"], "apiVersions": ["v1alpha"],
                          "operations": ["CREATE", "UPDATE"], "resources": ["llamas"]}],
               "matchConditions": [{"name": "heavy", "expression": "object.spec.weight > 100"}],
               "namespaceSelector": in_namespace,
               "objectSelector": {"matchExpressions": [{"key": "hook", "operator": "DoesNotExist"}]}}),
    );
    let mut label = mutating(
        &format!("farm-e2e-label-{suffix}"),
        json!({"name": "label.farm.example.com", "clientConfig": mutator.client_config("/mutate"),
               "namespaceSelector": in_namespace,
               "objectSelector": {"matchLabels": {"hook": "mutate"}}}),
    );
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let down_port = closed.local_addr().unwrap().port();
    drop(closed);
    let mut down = validating(
        &format!("farm-e2e-down-{suffix}"),
        json!({"name": "down.farm.example.com",
               "clientConfig": {"url": format!("https://127.0.0.1:{down_port}/down")},
               "namespaceSelector": in_namespace,
               "objectSelector": {"matchLabels": {"hook": "down"}}}),
    );
    for configuration in [&mut weight, &mut label, &mut down] {
        configuration["metadata"]["labels"] = json!({"farm-e2e": "true"});
    }
    let configured = Configured {
        cluster,
        names: vec![
            (
                "validatingwebhookconfiguration",
                weight["metadata"]["name"].as_str().unwrap().to_owned(),
            ),
            (
                "mutatingwebhookconfiguration",
                label["metadata"]["name"].as_str().unwrap().to_owned(),
            ),
            (
                "validatingwebhookconfiguration",
                down["metadata"]["name"].as_str().unwrap().to_owned(),
            ),
        ],
    };
    let list = json!({"apiVersion": "v1", "kind": "List", "items": [weight, label, down]});
    // kubectl validates this List against the cluster's OpenAPI v2, which kube-apiserver
    // serves only while ours is valid Swagger 2.0.
    cluster.ok(&["apply", "-f", "-"], Some(&list.to_string()));

    let llama = |name: &str, weight: f64, labels: Value| {
        json!({"apiVersion": "farm.example.com/v1alpha", "kind": "Llama",
               "metadata": {"name": name, "namespace": ns, "labels": labels},
               "spec": {"weight": weight, "height": 1.0}})
        .to_string()
    };
    step("a validating webhook refuses a heavy Llama (once the server has the configuration)");
    let deadline = Instant::now() + Duration::from_secs(20);
    let refused = loop {
        let (ok, out, err) = cluster.run(
            &["create", "-f", "-"],
            Some(&llama("heavy", 500.0, json!({}))),
        );
        if !ok {
            break err;
        }
        assert!(
            Instant::now() < deadline,
            "the webhook was never called: {out}"
        );
        cluster.ok(&["delete", "llama", "heavy", "-n", ns], None);
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert!(
        refused.contains(
            "admission webhook \"weight.farm.example.com\" denied the request: too heavy"
        ),
        "{refused}"
    );
    let review = validator.seen().pop().unwrap();
    assert_eq!(
        review["request"]["userInfo"]["username"], "lab-admin",
        "the kubectl user, from the front proxy"
    );
    assert_eq!(review["request"]["namespace"], ns);

    step("its matchCondition leaves light Llamas alone; a server-side dry run is sent as one");
    let calls = validator.seen().len();
    cluster.ok(
        &["create", "-f", "-"],
        Some(&llama("light", 5.0, json!({}))),
    );
    assert_eq!(
        validator.seen().len(),
        calls,
        "a false matchCondition skips the webhook"
    );
    let (ok, _, err) = cluster.run(
        &["create", "--dry-run=server", "-f", "-"],
        Some(&llama("dry", 500.0, json!({}))),
    );
    assert!(!ok && err.contains("too heavy"), "{err}");
    assert_eq!(validator.seen().pop().unwrap()["request"]["dryRun"], true);

    step(
        "the webhook names v1alpha only: a v1 write reaches it at v1alpha (matchPolicy Equivalent)",
    );
    let v1 = json!({"apiVersion": "farm.example.com/v1", "kind": "Llama",
                    "metadata": {"name": "heavy-v1", "namespace": ns},
                    "spec": {"weightKg": 500.0, "heightMetres": 1.0}});
    let (ok, _, err) = cluster.run(&["create", "-f", "-"], Some(&v1.to_string()));
    assert!(!ok && err.contains("too heavy"), "{err}");
    let request = validator.seen().pop().unwrap()["request"].clone();
    assert_eq!(request["kind"]["version"], "v1alpha", "{request}");
    assert_eq!(request["requestKind"]["version"], "v1", "{request}");
    assert_eq!(request["object"]["spec"]["weight"].as_f64(), Some(500.0));

    step("a mutating webhook's patch is stored");
    cluster.ok(
        &["create", "-f", "-"],
        Some(&llama("marked", 5.0, json!({"hook": "mutate"}))),
    );
    let labels = cluster.ok(
        &[
            "get",
            "llama",
            "marked",
            "-n",
            ns,
            "-o",
            "jsonpath={.metadata.labels.mutated}",
        ],
        None,
    );
    assert_eq!(labels, "yes");

    step("failurePolicy Fail: refused while the webhook is down");
    let (ok, _, err) = cluster.run(
        &["create", "-f", "-"],
        Some(&llama("unchecked", 5.0, json!({"hook": "down"}))),
    );
    assert!(!ok);
    assert!(
        err.contains("failed calling webhook \"down.farm.example.com\""),
        "{err}"
    );

    step("failurePolicy Ignore: the same write goes through while the webhook is down");
    cluster.ok(
        &[
            "patch",
            "validatingwebhookconfiguration",
            &format!("farm-e2e-down-{suffix}"),
            "--type",
            "json",
            "-p",
            r#"[{"op":"replace","path":"/webhooks/0/failurePolicy","value":"Ignore"}]"#,
        ],
        None,
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (ok, _, err) = cluster.run(
            &["create", "-f", "-"],
            Some(&llama("unchecked", 5.0, json!({"hook": "down"}))),
        );
        if ok {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still refused under Ignore: {err}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    step("configurations deleted: no more calls");
    drop(configured);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let calls = validator.seen().len();
        let (ok, _, err) = cluster.run(
            &["create", "-f", "-"],
            Some(&llama("late", 500.0, json!({}))),
        );
        if ok && validator.seen().len() == calls {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still called after its configuration went: {err}"
        );
        let _ = cluster.run(
            &["delete", "llama", "late", "-n", ns, "--ignore-not-found"],
            None,
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// A ValidatingAdmissionPolicy with a ConfigMap param, applied with kubectl as for any kind,
/// reaches Llama writes through the aggregator (#28): it denies with its message, allows
/// otherwise, follows its param, and stops when its binding goes.
pub(super) async fn policies_configured_with_kubectl(
    cluster: &Cluster,
    ns: &str,
    step: &dyn Fn(&str),
) {
    step("a ValidatingAdmissionPolicy with a ConfigMap param, applied with kubectl");
    let suffix = std::process::id();
    let policy_name = format!("farm-e2e-max-weight-{suffix}");
    let binding_name = format!("farm-e2e-max-weight-{suffix}");
    let objects = json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "limits", "namespace": ns},
         "data": {"maxWeight": "100"}},
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
         "metadata": {"name": policy_name},
         "spec": {
             "failurePolicy": "Fail",
             "paramKind": {"apiVersion": "v1", "kind": "ConfigMap"},
             "matchConstraints": {"resourceRules": [{"apiGroups": ["farm.example.com"],
                 "apiVersions": ["*"], "operations": ["CREATE", "UPDATE"], "resources": ["llamas"]}]},
             "validations": [{
                 "expression": "object.spec.weight <= double(params.data.maxWeight)",
                 "messageExpression": "'weight ' + string(object.spec.weight) + ' is over ' + params.data.maxWeight",
             }],
         }},
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
         "metadata": {"name": binding_name},
         "spec": {
             "policyName": policy_name,
             "paramRef": {"name": "limits", "namespace": ns, "parameterNotFoundAction": "Deny"},
             "validationActions": ["Deny"],
             "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}},
         }},
    ]});
    let configured = Configured {
        cluster,
        names: vec![
            ("validatingadmissionpolicybinding", binding_name.clone()),
            ("validatingadmissionpolicy", policy_name.clone()),
        ],
    };
    cluster.ok(&["apply", "-f", "-"], Some(&objects.to_string()));
    let llama = |name: &str, weight: f64| {
        json!({"apiVersion": "farm.example.com/v1alpha", "kind": "Llama",
               "metadata": {"name": name, "namespace": ns},
               "spec": {"weight": weight, "height": 1.0}})
        .to_string()
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    let refused = loop {
        let (ok, _, err) = cluster.run(&["create", "-f", "-"], Some(&llama("over", 500.0)));
        if !ok {
            break err;
        }
        assert!(Instant::now() < deadline, "the policy never applied");
        cluster.ok(&["delete", "llama", "over", "-n", ns], None);
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert!(
        refused.contains(&format!(
            "ValidatingAdmissionPolicy '{policy_name}' with binding '{binding_name}' denied request: weight 500 is over 100"
        )),
        "{refused}"
    );
    cluster.ok(&["create", "-f", "-"], Some(&llama("under", 50.0)));

    step("the param raised: the same Llama is allowed");
    cluster.ok(
        &[
            "patch",
            "configmap",
            "limits",
            "-n",
            ns,
            "--type",
            "merge",
            "-p",
            r#"{"data":{"maxWeight":"1000"}}"#,
        ],
        None,
    );
    // Params are watched: the change applies once the watch brings it.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (ok, _, err) = cluster.run(&["create", "-f", "-"], Some(&llama("over", 500.0)));
        if ok {
            break;
        }
        assert!(Instant::now() < deadline, "{err}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    step("the policy's binding deleted: nothing is refused");
    drop(configured);
    cluster
        .eventually(
            &["get", "validatingadmissionpolicybinding", &binding_name],
            Duration::from_secs(10),
            |ok, _, _| !ok,
        )
        .await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cluster
        .run(&["create", "-f", "-"], Some(&llama("huge", 5000.0)))
        .0
    {
        assert!(
            Instant::now() < deadline,
            "still refused after the binding went"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// A ValidatingAdmissionPolicy whose `authorizer` asks kube-apiserver's RBAC (through the
/// server's SubjectAccessReviews) whether the writing user may `approve` Llamas: a user the
/// built-in `edit` role lets create Llamas (kube-apiserver impersonating it, `--as`) is
/// refused for want of `approve`; `system:masters` may.
pub(super) async fn a_policy_asks_the_authorizer(cluster: &Cluster, ns: &str, step: &dyn Fn(&str)) {
    step("a ValidatingAdmissionPolicy asks the authorizer (RBAC through SubjectAccessReviews)");
    let suffix = std::process::id();
    let name = format!("farm-e2e-approvers-{suffix}");
    let objects = json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
         "metadata": {"name": name},
         "spec": {
             "failurePolicy": "Fail",
             "matchConstraints": {"resourceRules": [{"apiGroups": ["farm.example.com"],
                 "apiVersions": ["*"], "operations": ["CREATE"], "resources": ["llamas"]}]},
             "validations": [{
                 "expression": "authorizer.requestResource.check('approve').allowed()",
                 "messageExpression": "request.userInfo.username + ' may not approve llamas'",
             }],
         }},
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
         "metadata": {"name": name},
         "spec": {
             "policyName": name,
             "validationActions": ["Deny"],
             "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}},
         }},
    ]});
    let _configured = Configured {
        cluster,
        names: vec![
            ("validatingadmissionpolicybinding", name.clone()),
            ("validatingadmissionpolicy", name.clone()),
        ],
    };
    cluster.ok(
        &[
            "create",
            "rolebinding",
            "e2e-editor",
            "-n",
            ns,
            "--clusterrole=edit",
            "--user=e2e-editor",
        ],
        None,
    );
    cluster.ok(&["apply", "-f", "-"], Some(&objects.to_string()));
    let llama = |name: &str| {
        json!({"apiVersion": "farm.example.com/v1alpha", "kind": "Llama",
               "metadata": {"name": name, "namespace": ns},
               "spec": {"weight": 10.0, "height": 1.0}})
        .to_string()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let refused = loop {
        let (ok, _, err) = cluster.run(
            &["create", "-f", "-", "--as=e2e-editor"],
            Some(&llama("unapproved")),
        );
        if !ok && err.contains("may not approve") {
            break err;
        }
        assert!(Instant::now() < deadline, "never refused: {err}");
        if ok {
            cluster.ok(&["delete", "llama", "unapproved", "-n", ns], None);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert!(
        refused.contains(&format!(
            "ValidatingAdmissionPolicy '{name}' with binding '{name}' denied request: e2e-editor may not approve llamas"
        )),
        "{refused}"
    );
    cluster.ok(&["create", "-f", "-"], Some(&llama("approved")));
}

/// A MutatingAdmissionPolicy applied with kubectl, exactly as for a built-in kind: its apply
/// configuration adds a label to every Llama created in the namespace, until its binding goes.
pub(super) async fn mutating_policies_configured_with_kubectl(
    cluster: &Cluster,
    ns: &str,
    step: &dyn Fn(&str),
) {
    step("a MutatingAdmissionPolicy applied with kubectl adds a label");
    let suffix = std::process::id();
    let name = format!("farm-e2e-stamp-{suffix}");
    let objects = json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingAdmissionPolicy",
         "metadata": {"name": name},
         "spec": {
             "failurePolicy": "Fail",
             "reinvocationPolicy": "IfNeeded",
             "matchConstraints": {"resourceRules": [{"apiGroups": ["farm.example.com"],
                 "apiVersions": ["*"], "operations": ["CREATE", "UPDATE"], "resources": ["llamas"]}]},
             "mutations": [{"patchType": "ApplyConfiguration", "applyConfiguration": {"expression":
                 "Object{metadata: Object.metadata{labels: {'farm.example.com/stamped': string(int(object.spec.height * 100.0))}}}"}}],
         }},
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingAdmissionPolicyBinding",
         "metadata": {"name": name},
         "spec": {
             "policyName": name,
             "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}},
         }},
    ]});
    let configured = Configured {
        cluster,
        names: vec![
            ("mutatingadmissionpolicybinding", name.clone()),
            ("mutatingadmissionpolicy", name.clone()),
        ],
    };
    cluster.ok(&["apply", "-f", "-"], Some(&objects.to_string()));
    let llama = |name: &str| {
        json!({"apiVersion": "farm.example.com/v1alpha", "kind": "Llama",
               "metadata": {"name": name, "namespace": ns},
               "spec": {"weight": 5.0, "height": 1.0}})
        .to_string()
    };
    let label = |name: &str| {
        let (_, out, _) = cluster.run(
            &[
                "get",
                "llama",
                name,
                "-n",
                ns,
                "-o",
                "jsonpath={.metadata.labels.farm\\.example\\.com/stamped}",
            ],
            None,
        );
        out.trim().to_owned()
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut attempt = 0;
    loop {
        let created = format!("stamped-{attempt}");
        cluster.ok(&["create", "-f", "-"], Some(&llama(&created)));
        if label(&created) == "100" {
            break;
        }
        assert!(Instant::now() < deadline, "the policy never applied");
        attempt += 1;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    step("the MutatingAdmissionPolicy's binding deleted: Llamas are stored as sent");
    drop(configured);
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut attempt = 0;
    loop {
        let created = format!("plain-{attempt}");
        cluster.ok(&["create", "-f", "-"], Some(&llama(&created)));
        if label(&created).is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still mutated after the binding went"
        );
        attempt += 1;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// A validating webhook reached through a Service, as on the lab: an ExternalName Service
/// (`localhost`) at the webhook's port, its certificate for `<service>.<namespace>.svc`.
pub(super) async fn webhook_through_a_service(cluster: &Cluster, ns: &str, step: &dyn Fn(&str)) {
    use crate::admission::{Webhook, allow, deny, validating};
    step("a validating webhook reached through an ExternalName Service");
    let service = "farm-e2e-hook";
    let hook = Webhook::start_for(&[&format!("{service}.{ns}.svc")]).await;
    hook.answer(|request| {
        if request["object"]["metadata"]["labels"]["service-hook"] == "deny" {
            deny(403, "refused through the service")
        } else {
            allow()
        }
    });
    let name = format!("farm-e2e-service-{}", std::process::id());
    let configuration = validating(
        &name,
        json!({"name": "service.farm.example.com",
               "clientConfig": hook.service_config(ns, service, "/validate"),
               "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
               "objectSelector": {"matchExpressions": [{"key": "service-hook", "operator": "Exists"}]}}),
    );
    let service_object = json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": service, "namespace": ns},
        "spec": {"type": "ExternalName", "externalName": "localhost",
                 "ports": [{"port": hook.port()}]}});
    let _configured = Configured {
        cluster,
        names: vec![("validatingwebhookconfiguration", name.clone())],
    };
    let list =
        json!({"apiVersion": "v1", "kind": "List", "items": [service_object, configuration]});
    cluster.ok(&["apply", "-f", "-"], Some(&list.to_string()));
    let llama = |name: &str, verdict: &str| {
        json!({"apiVersion": "farm.example.com/v1alpha", "kind": "Llama",
               "metadata": {"name": name, "namespace": ns, "labels": {"service-hook": verdict}},
               "spec": {"weight": 5.0, "height": 1.0}})
        .to_string()
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    let refused = loop {
        let (ok, _, err) = cluster.run(&["create", "-f", "-"], Some(&llama("svc-deny", "deny")));
        if !ok {
            break err;
        }
        assert!(Instant::now() < deadline, "the webhook was never called");
        cluster.ok(&["delete", "llama", "svc-deny", "-n", ns], None);
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert!(
        refused.contains(
            "admission webhook \"service.farm.example.com\" denied the request: refused through the service"
        ),
        "{refused}"
    );
    cluster.ok(&["create", "-f", "-"], Some(&llama("svc-allow", "allow")));
    assert!(hook.seen().len() >= 2);
}
