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

/// A validating webhook sees every create and update of a Llama as kube-apiserver would send
/// it (user, objects, options, dry run) and refuses with its own code and message, prefixed
/// as kube-apiserver prefixes it; what it refused is not stored; its warnings reach the client.
async fn a_validating_webhook_sees_writes_and_refuses_them(storage: TestStorage) {
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
async fn a_mutating_webhooks_patch_is_stored_and_validated_again(storage: TestStorage) {
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

/// No MutatingAdmissionPolicy, whatever its mutations (JSON patches to any path with any
/// value, the name, uid, kind or resourceVersion included; apply configurations of any shape;
/// expressions that fail), makes a 5xx that is not kube-apiserver's `Internal error`, renames
/// or re-creates an object, or changes an object when the write is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_mutating_policy_breaks_a_write() {
    use proptest::{prelude::*, strategy::ValueTree};
    let path = prop::sample::select(vec![
        "/metadata/name",
        "/metadata/uid",
        "/metadata/namespace",
        "/metadata/resourceVersion",
        "/metadata/labels/extra",
        "/metadata/labels",
        "/metadata/finalizers",
        "/metadata/finalizers/-",
        "/metadata/deletionTimestamp",
        "/spec/weight",
        "/spec/height",
        "/spec/extra",
        "/spec",
        "/kind",
        "/apiVersion",
        "/status",
        "",
        "/nowhere/deep",
    ]);
    let value = prop::sample::select(vec![
        "'x'",
        "-1.0",
        "5.0",
        "7",
        "null",
        "true",
        "{'a': 'b'}",
        "['a', 'b']",
        "'a'.repeat(1)",
        "object.spec.weight * 2.0",
        "object.metadata.name + '-renamed'",
        "[object.spec, object.spec]",
    ]);
    let op = prop::sample::select(vec!["add", "replace", "remove", "test", "move", "copy"]);
    let patch = (op, path.clone(), path, value).prop_map(|(op, path, from, value)| {
        format!("JSONPatch{{op: '{op}', path: '{path}', from: '{from}', value: {value}}}")
    });
    let json_patch = prop::collection::vec(patch, 0..4)
        .prop_map(|ops| json!({"patchType": "JSONPatch", "jsonPatch": {"expression": format!("[{}]", ops.join(", "))}}));
    let apply = prop::sample::select(vec![
        "Object{metadata: Object.metadata{name: 'renamed'}}",
        "Object{metadata: Object.metadata{uid: 'other'}}",
        "Object{metadata: Object.metadata{labels: {'a': 'b'}, finalizers: ['farm.example.com/x']}}",
        "Object{metadata: Object.metadata{namespace: 'elsewhere'}}",
        "Object{spec: Object.spec{weight: 'heavy'}}",
        "Object{spec: Object.spec{weight: 3.0, extra: 1}}",
        "Object{spec: Object.metadata{}}",
        "Object{kind: 'Pod'}",
        "Object{status: {'x': 1}}",
        "Object{}",
        "object",
        "1 / 0",
        "Object{spec: Object.spec{height: object.spec.nothing}}",
    ])
    .prop_map(|expression| json!({"patchType": "ApplyConfiguration", "applyConfiguration": {"expression": expression}}));
    let mutations = prop::collection::vec(prop_oneof![json_patch, apply], 1..3);
    let failure = prop::sample::select(vec!["Fail", "Ignore"]);
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let cases: Vec<(Vec<Value>, &str)> = (0..48)
        .map(|_| {
            (mutations.clone(), failure.clone())
                .new_tree(&mut runner)
                .unwrap()
                .current()
        })
        .collect();
    let mut configurations = Vec::new();
    for (index, (mutations, failure)) in cases.iter().enumerate() {
        let mut policy = mutating_policy(
            &format!("p{index}"),
            json!({"failurePolicy": failure, "mutations": mutations}),
        );
        policy["spec"]["matchConstraints"]["resourceRules"][0]["operations"] =
            json!(["CREATE", "UPDATE"]);
        configurations.push(policy);
        configurations.push(mutating_binding(
            &format!("p{index}"),
            &format!("p{index}"),
            None,
            json!({"matchLabels": {"case": index.to_string()}}),
        ));
    }
    let (server, _fake) = server_with(TestStorage::Memory, &configurations)
        .await
        .unwrap();
    for index in 0..cases.len() {
        let created = send(
            &server,
            "POST",
            LLAMAS,
            Some(llama(&format!("u-{index}"), 2.0, json!({}))),
        )
        .await;
        assert_eq!(created.status, 201, "{}", created.json());
    }
    let check = |case: &(Vec<Value>, &str), reply: &common::RawResponse| {
        let status = reply.json();
        let message = status["message"].as_str().unwrap_or_default().to_owned();
        assert!(
            reply.status < 500 || message.starts_with("Internal error occurred: "),
            "{case:?}: {} {message}",
            reply.status
        );
        message
    };
    let mut outcomes = Vec::new();
    for (index, case) in cases.iter().enumerate() {
        // A create: stored as answered (a mutation may name it, as in kube-apiserver, whose
        // storage keys a create by the admitted object), in the request's namespace, or not
        // at all.
        let name = format!("c-{index}");
        let created = send(
            &server,
            "POST",
            LLAMAS,
            Some(llama(&name, 2.0, json!({"case": index.to_string()}))),
        )
        .await;
        check(case, &created);
        outcomes.push(created.status);
        if created.status == 201 {
            let answered = created.json()["metadata"]["name"]
                .as_str()
                .unwrap()
                .to_owned();
            let stored = send(&server, "GET", &format!("{LLAMAS}/{answered}"), None).await;
            assert_eq!(stored.status, 200, "{case:?}");
            assert_eq!(
                stored.json()["metadata"]["namespace"],
                "default",
                "{case:?}"
            );
            assert_eq!(
                stored.json()["metadata"]["uid"],
                created.json()["metadata"]["uid"]
            );
            let deleted = send(&server, "DELETE", &format!("{LLAMAS}/{answered}"), None).await;
            assert_eq!(deleted.status, 200, "{case:?}");
        } else {
            let stored = send(&server, "GET", &format!("{LLAMAS}/{name}"), None).await;
            assert_eq!(stored.status, 404, "{case:?}: {}", created.json());
        }
        // An update: the same object, or unchanged.
        let path = format!("{LLAMAS}/u-{index}");
        let before = send(&server, "GET", &path, None).await.json();
        let patched = send(
            &server,
            "PATCH",
            &path,
            Some(format!(r#"{{"metadata":{{"labels":{{"case":"{index}"}}}}}}"#).into_bytes()),
        )
        .await;
        let message = check(case, &patched);
        let after = send(&server, "GET", &path, None).await.json();
        assert_eq!(
            after["metadata"]["uid"], before["metadata"]["uid"],
            "{case:?}"
        );
        assert_eq!(after["metadata"]["name"], format!("u-{index}"), "{case:?}");
        if patched.status >= 400 {
            assert_eq!(
                after["metadata"]["resourceVersion"], before["metadata"]["resourceVersion"],
                "{case:?}: {message}"
            );
        } else {
            assert_eq!(patched.status, 200, "{case:?}");
        }
        outcomes.push(patched.status);
    }
    // The cases cover writes that go through and writes refused, mutated or not.
    outcomes.sort_unstable();
    outcomes.dedup();
    eprintln!("answers: {outcomes:?}");
    assert!(
        outcomes.contains(&201) && outcomes.contains(&200),
        "{outcomes:?}"
    );
    assert!(outcomes.iter().any(|code| *code >= 400), "{outcomes:?}");
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
