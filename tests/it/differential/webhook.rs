//! A webhook served with a self-signed certificate made as most guides make it (`openssl req
//! -x509`, which marks it `CA:TRUE`), its `caBundle` that certificate: kube-apiserver calls it
//! for ConfigMaps, farm-apiserver for Llamas, with `failurePolicy: Fail`. Both must trust it
//! alike (Go's crypto/x509 trusts a certificate found in the bundle as it is): the same
//! verdicts, the same refusals.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::admission::{Webhook, allow, deny};
use crate::e2e_cluster::{Cluster, ONE_AT_A_TIME, register};

const CONFIGURATION: &str = "farm-e2e-self-signed";

/// (code, message) of a create of `object` through kube-apiserver.
async fn create(client: &kube::Client, path: &str, object: &Value) -> (u16, String) {
    let request = http::Request::post(path)
        .header("content-type", "application/json")
        .body(kube::client::Body::from(object.to_string().into_bytes()))
        .unwrap();
    let response = client.send(request).await.expect("send");
    let code = response.status().as_u16();
    let body = http_body_util::BodyExt::collect(response.into_body())
        .await
        .unwrap()
        .to_bytes();
    let body: Value = serde_json::from_slice(&body).unwrap_or_default();
    (
        code,
        body["message"].as_str().unwrap_or_default().to_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_self_signed_webhook_is_trusted_as_kube_apiserver_trusts_it() {
    let Some(cluster) = Cluster::from_env() else {
        return;
    };
    let _one = ONE_AT_A_TIME.lock().await;
    let started = Instant::now();
    let step = |what: &str| eprintln!("[{:>5.1}s] {what}", started.elapsed().as_secs_f64());
    let (server, installed) = register(&cluster, Vec::new(), None, &[], &step).await;
    let ns = installed.namespace.clone();

    step("a webhook with an `openssl req -x509` certificate, for ConfigMaps and Llamas");
    let hook = Webhook::start_self_signed(&[]).await;
    hook.answer(|request| {
        if request["object"]["metadata"]["labels"]["verdict"] == "no" {
            deny(403, "the self-signed webhook says no")
        } else {
            allow()
        }
    });
    let configuration = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": CONFIGURATION},
        "webhooks": [{
            "name": "self-signed.farm.example.com",
            "clientConfig": hook.client_config("/validate"),
            "rules": [
                {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["configmaps"]},
                {"apiGroups": ["farm.example.com"], "apiVersions": ["*"], "operations": ["CREATE"], "resources": ["llamas"]},
            ],
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
            "failurePolicy": "Fail",
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
        }],
    });
    cluster.ok(&["apply", "-f", "-"], Some(&configuration.to_string()));
    let client = cluster.client().await;
    let configmaps = format!("/api/v1/namespaces/{ns}/configmaps");
    let llamas = format!("/apis/farm.example.com/v1/namespaces/{ns}/llamas");
    let configmap = |name: &str, verdict: &str| {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": name, "labels": {"verdict": verdict}}, "data": {"a": "b"}})
    };
    let llama = |name: &str, verdict: &str| {
        json!({"apiVersion": "farm.example.com/v1", "kind": "Llama",
               "metadata": {"name": name, "labels": {"verdict": verdict}},
               "spec": {"weightKg": 40, "heightMetres": 1.2}})
    };

    step("both servers have the configuration and call the webhook");
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut attempt = 0;
    let (theirs, ours) = loop {
        attempt += 1;
        let theirs = create(
            &client,
            &configmaps,
            &configmap(&format!("no-{attempt}"), "no"),
        )
        .await;
        let ours = create(&client, &llamas, &llama(&format!("no-{attempt}"), "no")).await;
        if theirs.0 == 403 && ours.0 == 403 {
            break (theirs, ours);
        }
        assert!(
            Instant::now() < deadline,
            "the webhook did not refuse both: kube-apiserver {theirs:?}, farm-apiserver {ours:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    for (who, (_, message)) in [("kube-apiserver", &theirs), ("farm-apiserver", &ours)] {
        assert!(
            message.contains("the self-signed webhook says no"),
            "{who} did not get the webhook's verdict: {message}"
        );
    }
    step("its allowed objects are created by both");
    assert_eq!(
        create(&client, &configmaps, &configmap("yes", "yes"))
            .await
            .0,
        201
    );
    assert_eq!(create(&client, &llamas, &llama("yes", "yes")).await.0, 201);
    let seen = hook.seen();
    let kinds = |kind: &str| {
        seen.iter()
            .filter(|review| review["request"]["kind"]["kind"] == kind)
            .count()
    };
    assert!(kinds("ConfigMap") >= 2 && kinds("Llama") >= 2, "{seen:?}");

    let _ = cluster.run(
        &["delete", "validatingwebhookconfiguration", CONFIGURATION],
        None,
    );
    drop(installed);
    drop(server);
    step("done");
}
