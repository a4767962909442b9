//! The cluster's admission webhooks on Llama writes (#28): configurations from the cluster (a
//! fake kube-apiserver serving them, watched as kube-apiserver's informers watch them), real
//! HTTPS webhooks on loopback trusted through `caBundle`, and the server's real TLS listener.

use crate::common;

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use base64::Engine;
use common::{Alpn, Options, TestServer, TestStorage, fake_kube::FakeKube};
use serde_json::{Value, json};

const LLAMAS: &str = "/apis/farm.example.com/v1alpha/namespaces/default/llamas";

type Answer = dyn Fn(&Value) -> Value + Send + Sync;

/// An admission webhook on loopback: HTTPS with a certificate of its own CA, every review it
/// gets kept, each answered by a function of the review.
pub(crate) struct Webhook {
    addr: SocketAddr,
    ca_pem: String,
    seen: Arc<Mutex<Vec<Value>>>,
    answer: Arc<Mutex<Box<Answer>>>,
    delay: Arc<Mutex<Duration>>,
    _dir: tempfile::TempDir,
}

impl Webhook {
    pub(crate) async fn start() -> Self {
        Self::start_for(&[]).await
    }

    /// One whose certificate also names `names` (a Service's `<name>.<namespace>.svc`).
    pub(crate) async fn start_for(names: &[&str]) -> Self {
        Self::start_with(names, false).await
    }

    /// One serving a self-signed certificate (`openssl req -x509`, `CA:TRUE`) that is its own
    /// caBundle, as most guides make a webhook's.
    pub(crate) async fn start_self_signed(names: &[&str]) -> Self {
        Self::start_with(names, true).await
    }

    async fn start_with(names: &[&str], self_signed: bool) -> Self {
        let seen: Arc<Mutex<Vec<Value>>> = Arc::default();
        let answer: Arc<Mutex<Box<Answer>>> = Arc::new(Mutex::new(Box::new(|_| allow())));
        let delay: Arc<Mutex<Duration>> = Arc::default();
        let state = (seen.clone(), answer.clone(), delay.clone());
        let app = axum::Router::new().fallback(axum::routing::post(
            move |axum::extract::OriginalUri(uri): axum::extract::OriginalUri,
                  axum::Json(review): axum::Json<Value>| {
                let (seen, answer, delay) = state.clone();
                async move {
                    let wait = *delay.lock().unwrap();
                    tokio::time::sleep(wait).await;
                    let mut review = review;
                    review["test:uri"] = json!(uri.to_string());
                    seen.lock().unwrap().push(review.clone());
                    let mut response = (answer.lock().unwrap())(&review["request"]);
                    if let Some(fields) = response.as_object_mut() {
                        fields.insert("uid".into(), review["request"]["uid"].clone());
                    }
                    axum::Json(json!({
                        "apiVersion": "admission.k8s.io/v1",
                        "kind": "AdmissionReview",
                        "response": response,
                    }))
                }
            },
        ));
        let served = if self_signed {
            common::https::serve_self_signed(app, names).await
        } else {
            common::https::serve(app, "webhook-ca", names).await
        };
        Self {
            addr: served.addr,
            ca_pem: served.ca_pem,
            seen,
            answer,
            delay,
            _dir: served.dir,
        }
    }

    pub(crate) fn answer(&self, answer: impl Fn(&Value) -> Value + Send + Sync + 'static) {
        *self.answer.lock().unwrap() = Box::new(answer);
    }

    /// It answers this much later.
    pub(crate) fn set_delay(&self, delay: Duration) {
        *self.delay.lock().unwrap() = delay;
    }

    pub(crate) fn seen(&self) -> Vec<Value> {
        self.seen.lock().unwrap().clone()
    }

    /// Its port.
    pub(crate) fn port(&self) -> u16 {
        self.addr.port()
    }

    /// A `clientConfig` that reaches it through the Service `namespace/name` (at its port).
    pub(crate) fn service_config(&self, namespace: &str, name: &str, path: &str) -> Value {
        json!({
            "service": {"namespace": namespace, "name": name, "path": path, "port": self.addr.port()},
            "caBundle": base64::engine::general_purpose::STANDARD.encode(&self.ca_pem),
        })
    }

    /// A `clientConfig` that reaches it (`url` and `caBundle`).
    pub(crate) fn client_config(&self, path: &str) -> Value {
        json!({
            "url": format!("https://127.0.0.1:{}{path}", self.addr.port()),
            "caBundle": base64::engine::general_purpose::STANDARD.encode(&self.ca_pem),
        })
    }
}

pub(crate) fn allow() -> Value {
    json!({"allowed": true})
}

pub(crate) fn deny(code: u16, message: &str) -> Value {
    json!({"allowed": false, "status": {"code": code, "message": message}})
}

/// A JSONPatch answer.
pub(crate) fn patch(operations: Value) -> Value {
    json!({
        "allowed": true,
        "patchType": "JSONPatch",
        "patch": base64::engine::general_purpose::STANDARD.encode(operations.to_string()),
    })
}

/// A webhook configuration of `kind` with one webhook, its fields over the defaults.
fn configuration(kind: &str, name: &str, webhook: Value) -> Value {
    let mut hook = json!({
        "name": format!("{name}.farm.example.com"),
        "rules": [{"apiGroups": ["farm.example.com"], "apiVersions": ["*"],
                   "operations": ["CREATE", "UPDATE"], "resources": ["llamas"]}],
        "sideEffects": "None",
        "admissionReviewVersions": ["v1"],
        "failurePolicy": "Fail",
    });
    for (key, value) in webhook.as_object().unwrap() {
        hook[key] = value.clone();
    }
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": kind,
        "metadata": {"name": name},
        "webhooks": [hook],
    })
}

pub(crate) fn validating(name: &str, webhook: Value) -> Value {
    configuration("ValidatingWebhookConfiguration", name, webhook)
}

pub(crate) fn mutating(name: &str, webhook: Value) -> Value {
    configuration("MutatingWebhookConfiguration", name, webhook)
}

fn llama(name: &str, weight: f64, labels: Value) -> Vec<u8> {
    json!({"apiVersion": "farm.example.com/v1alpha", "kind": "Llama",
           "metadata": {"name": name, "labels": labels},
           "spec": {"weight": weight, "height": 1.0}})
    .to_string()
    .into_bytes()
}

/// A server with Llamas on `storage`, its cluster the fake (which has the namespace `default`,
/// labelled `env=dev`, and the configurations in `configurations`), calling its webhooks.
async fn server_with(
    storage: TestStorage,
    configurations: &[Value],
) -> Option<(TestServer, Arc<FakeKube>)> {
    if storage == TestStorage::Etcd && common::etcd::binary().is_none() {
        return None;
    }
    let fake = FakeKube::start().await;
    let mut default = common::fake_kube::namespace("default", false);
    default["metadata"]["labels"] = json!({"env": "dev"});
    fake.add(default);
    for configuration in configurations {
        fake.add(configuration.clone());
    }
    let server = TestServer::start_with(Options {
        cluster: Some(fake.client().await),
        webhooks: true,
        storage,
        ..Default::default()
    })
    .await;
    Some((server, fake))
}

async fn send(
    server: &TestServer,
    method: &str,
    path: &str,
    body: Option<Vec<u8>>,
) -> common::RawResponse {
    let content_type = if method == "PATCH" {
        "application/merge-patch+json"
    } else {
        "application/json"
    };
    server
        .raw(Some(server.admin_identity()), Alpn::Http1)
        .send(method, path, &[("content-type", content_type)], body)
        .await
}

fn warnings(reply: &common::RawResponse) -> Vec<String> {
    reply
        .headers
        .get_all("warning")
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .collect()
}

fn mutating_policy(name: &str, spec: Value) -> Value {
    let mut spec = spec;
    spec["matchConstraints"] = json!({"resourceRules": [{"apiGroups": ["farm.example.com"],
        "apiVersions": ["*"], "operations": ["CREATE", "UPDATE"], "resources": ["llamas"]}]});
    json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingAdmissionPolicy",
           "metadata": {"name": name}, "spec": spec})
}

fn mutating_binding(name: &str, policy: &str, param: Option<&str>, selector: Value) -> Value {
    let mut spec = json!({"policyName": policy, "matchResources": {"objectSelector": selector}});
    if let Some(param) = param {
        spec["paramRef"] =
            json!({"name": param, "namespace": "default", "parameterNotFoundAction": "Deny"});
    }
    json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingAdmissionPolicyBinding",
           "metadata": {"name": name}, "spec": spec})
}

/// MutatingAdmissionPolicy: an apply configuration (`Object{...}`, with a ConfigMap param and a
/// matchCondition) and a JSON patch (`JSONPatch{...}`, `jsonpatch.escapeKey`, a failed `test`
/// changing nothing) mutate creates and updates, in binding order, before the kind's own
/// validation (which judges the result); a dry run is mutated and not stored; a mutation that
/// fails refuses the write under `failurePolicy: Fail` with kube-apiserver's text and lets it
/// through under Ignore; an apply configuration must name its Object types for their place.
async fn mutating_admission_policies_mutate_writes(storage: TestStorage) {
    let stamp = mutating_policy(
        "stamp",
        json!({
            "failurePolicy": "Fail",
            "paramKind": {"apiVersion": "v1", "kind": "ConfigMap"},
            "matchConditions": [{"name": "not-skipped", "expression": "!('skip' in object.metadata.labels)"}],
            "variables": [{"name": "stamp", "expression": "params.data.stamp"}],
            "mutations": [{"patchType": "ApplyConfiguration", "applyConfiguration": {"expression":
                "Object{metadata: Object.metadata{labels: {'stamped': variables.stamp}}}"}}],
        }),
    );
    let double = mutating_policy(
        "double",
        json!({
            "mutations": [
                {"patchType": "JSONPatch", "jsonPatch": {"expression":
                    "[JSONPatch{op: 'replace', path: '/spec/height', value: object.spec.height * 2.0}, JSONPatch{op: 'add', path: '/metadata/labels/' + jsonpatch.escapeKey('farm.example.com/doubled'), value: 'true'}]"}},
                // A failed test: nothing of this patch is applied.
                {"patchType": "JSONPatch", "jsonPatch": {"expression":
                    "[JSONPatch{op: 'test', path: '/spec/weight', value: -1.0}, JSONPatch{op: 'replace', path: '/spec/weight', value: 0.0}]"}},
            ],
        }),
    );
    let negative = mutating_policy(
        "negative",
        json!({"mutations": [{"patchType": "ApplyConfiguration", "applyConfiguration": {"expression":
            "Object{spec: Object.spec{weight: -5.0}}"}}]}),
    );
    let broken = |name: &str, failure: &str| {
        mutating_policy(
            name,
            json!({"failurePolicy": failure, "mutations": [{"patchType": "ApplyConfiguration",
                "applyConfiguration": {"expression": "Object{spec: Object.metadata{}}"}}]}),
        )
    };
    let params = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "stamps", "namespace": "default"}, "data": {"stamp": "by-policy"}});
    let configurations = [
        stamp,
        double,
        negative,
        broken("broken", "Fail"),
        broken("ignored", "Ignore"),
        params,
        mutating_binding("a-stamp", "stamp", Some("stamps"), json!({"team": "b"})),
        mutating_binding(
            "b-double",
            "double",
            None,
            json!({"matchLabels": {"double": "yes"}}),
        ),
        mutating_binding(
            "c-negative",
            "negative",
            None,
            json!({"matchLabels": {"negative": "yes"}}),
        ),
        mutating_binding(
            "d-broken",
            "broken",
            None,
            json!({"matchLabels": {"broken": "yes"}}),
        ),
        mutating_binding(
            "e-ignored",
            "ignored",
            None,
            json!({"matchLabels": {"ignored": "yes"}}),
        ),
    ];
    let Some((server, _fake)) = server_with(storage, &configurations).await else {
        eprintln!("skipped: no etcd binary (FARM_REQUIRE_ETCD makes this a failure)");
        return;
    };

    // The apply configuration adds its label, the rest of the object as sent.
    let created = send(
        &server,
        "POST",
        LLAMAS,
        Some(llama("stamped", 5.0, json!({"team": "a"}))),
    )
    .await;
    assert_eq!(created.status, 201, "{}", created.json());
    let stored = send(&server, "GET", &format!("{LLAMAS}/stamped"), None)
        .await
        .json();
    assert_eq!(
        stored["metadata"]["labels"],
        json!({"team": "a", "stamped": "by-policy"})
    );
    assert_eq!(stored["spec"], json!({"weight": 5, "height": 1}));
    // An update that drops the label gets it back.
    let updated = send(
        &server,
        "PATCH",
        &format!("{LLAMAS}/stamped"),
        Some(br#"{"metadata":{"labels":{"stamped":null}}}"#.to_vec()),
    )
    .await;
    assert_eq!(updated.status, 200, "{}", updated.json());
    assert_eq!(updated.json()["metadata"]["labels"]["stamped"], "by-policy");
    // The matchCondition skips.
    let skipped = send(
        &server,
        "POST",
        LLAMAS,
        Some(llama("skipped", 5.0, json!({"skip": "x"}))),
    )
    .await;
    assert_eq!(skipped.status, 201);
    assert_eq!(skipped.json()["metadata"]["labels"], json!({"skip": "x"}));

    // JSON patches, in order; a failed test changes nothing; the stamp came first.
    let doubled = send(
        &server,
        "POST",
        LLAMAS,
        Some(llama("tall", 7.0, json!({"double": "yes"}))),
    )
    .await;
    assert_eq!(doubled.status, 201, "{}", doubled.json());
    let body = doubled.json();
    assert_eq!(body["spec"], json!({"weight": 7, "height": 2}));
    assert_eq!(
        body["metadata"]["labels"],
        json!({"double": "yes", "stamped": "by-policy", "farm.example.com/doubled": "true"})
    );

    // A dry run is mutated, and not stored.
    let dry = send(
        &server,
        "POST",
        &format!("{LLAMAS}?dryRun=All"),
        Some(llama("dry", 7.0, json!({"team": "b"}))),
    )
    .await;
    assert_eq!(dry.status, 201);
    assert_eq!(dry.json()["metadata"]["labels"]["stamped"], "by-policy");
    assert_eq!(
        send(&server, "GET", &format!("{LLAMAS}/dry"), None)
            .await
            .status,
        404
    );

    // The kind's validation judges what the policies made.
    let negative = send(
        &server,
        "POST",
        LLAMAS,
        Some(llama("neg", 7.0, json!({"negative": "yes"}))),
    )
    .await;
    assert_eq!(negative.status, 422, "{}", negative.json());
    assert!(
        negative.json()["message"]
            .as_str()
            .unwrap()
            .contains("spec.weight"),
        "{}",
        negative.json()
    );

    // A failing mutation: refused under Fail, in kube-apiserver's words; ignored under Ignore.
    let refused = send(
        &server,
        "POST",
        LLAMAS,
        Some(llama("broken", 7.0, json!({"broken": "yes"}))),
    )
    .await;
    assert_eq!(refused.status, 403, "{}", refused.json());
    let status = refused.json();
    assert_eq!(status["reason"], "Invalid");
    assert_eq!(
        status["message"],
        "policy 'broken' with binding 'd-broken' denied request: expression 'Object{spec: Object.metadata{}}' resulted in error: type mismatch: unexpected type name \"Object.metadata\", expected \"Object.spec\", which matches field name path from root Object type"
    );
    assert_eq!(
        send(&server, "GET", &format!("{LLAMAS}/broken"), None)
            .await
            .status,
        404
    );
    let ignored = send(
        &server,
        "POST",
        LLAMAS,
        Some(llama("ignored", 7.0, json!({"ignored": "yes"}))),
    )
    .await;
    assert_eq!(ignored.status, 201, "{}", ignored.json());

    // Each invocation counted with kube-apiserver's names.
    let metrics = send(&server, "GET", "/metrics", None).await;
    let metrics = String::from_utf8_lossy(&metrics.body).into_owned();
    let counted = |binding: &str, error_type: &str| {
        metrics.lines().any(|l| {
            l.starts_with("apiserver_mutating_admission_policy_check_total{")
                && l.contains(&format!("policy_binding=\"{binding}\""))
                && l.contains(&format!("error_type=\"{error_type}\""))
        })
    };
    assert!(counted("a-stamp", "no_error"), "{metrics}");
    assert!(counted("d-broken", "invalid_error"), "{metrics}");
}

mod mutating_policies;
mod policies;
mod policy_params;
mod services_and_versions;
mod webhook_rules;
mod webhooks;
