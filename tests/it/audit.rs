//! The audit log (#31, and #28's audit annotations): a policy file's rules, `audit.k8s.io/v1`
//! events in a log file written by the server's real TLS listener path, the `Audit-ID` a
//! request brings kept (kube-apiserver's aggregator sends its own), admission's annotations,
//! and a full buffer that never holds a request.

use crate::common;

use std::{path::Path, sync::Arc, time::Duration};

use aggregated_apiserver::audit::{Auditor, Mode, Policy, log};
use common::{Alpn, Options, TestServer, fake_kube::FakeKube};
use serde_json::{Value, json};

const LLAMAS: &str = "/apis/farm.example.com/v1alpha/namespaces/default/llamas";

const POLICY: &str = r#"
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: []
rules:
- level: None
  nonResourceURLs: ["/version"]
- level: RequestResponse
  verbs: ["create"]
  omitManagedFields: true
- level: Request
  verbs: ["patch"]
- level: Metadata
"#;

/// An auditor of `policy` writing to `path`.
pub(crate) fn auditor(policy: &str, path: &Path) -> Arc<Auditor> {
    let sink = log::start(
        log::LogOptions {
            path: path.to_owned(),
            max_age_days: 0,
            max_backups: 0,
            max_size_mb: 0,
        },
        100,
    )
    .unwrap();
    Auditor::new(Policy::parse(policy).unwrap(), sink, Mode::Blocking)
}

/// The events written so far for `id` (waiting up to 5 s for `count` of them).
pub(crate) async fn events(path: &Path, id: &str, count: usize) -> Vec<Value> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        // Complete lines only (the writer may be in the middle of one).
        let complete = &text[..text.rfind('\n').map_or(0, |end| end + 1)];
        let found: Vec<Value> = complete
            .lines()
            .map(|line| serde_json::from_str::<Value>(line).expect("one JSON event per line"))
            .filter(|event| event["auditID"] == id)
            .collect();
        if found.len() >= count || tokio::time::Instant::now() > deadline {
            return found;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub(crate) fn stages(events: &[Value]) -> Vec<&str> {
    events
        .iter()
        .map(|e| e["stage"].as_str().unwrap())
        .collect()
}

/// A create at RequestResponse level with the aggregator's `Audit-ID`: its two events carry
/// that ID, the user, verb, objectRef, 201, both objects and the authorization annotations;
/// a GET at Metadata level gets an ID of its own, answered in `Audit-Id`, and no objects; a
/// 404 records kube-apiserver's Status; `/version` (level None) writes nothing; a watch
/// writes ResponseStarted and, when it ends, ResponseComplete; a failed authentication
/// writes one ResponseStarted with no user.
#[tokio::test]
async fn events_for_writes_reads_errors_watches_and_failed_authentication() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit").join("audit.log");
    let server = TestServer::start_with(Options {
        audit: Some(auditor(POLICY, &path)),
        ..Default::default()
    })
    .await;
    let admin = server.raw(Some(server.admin_identity()), Alpn::Http1);

    let id = "6f9619ff-8b86-d011-b42d-00cf4fc964ff";
    let body = json!({"apiVersion": "farm.example.com/v1alpha", "kind": "Llama",
        "metadata": {"name": "audited"}, "spec": {"weight": 10.0, "height": 1.0}});
    let created = admin
        .send(
            "POST",
            LLAMAS,
            &[
                ("content-type", "application/json"),
                ("audit-id", id),
                ("user-agent", "kubectl/v1.36.0 <&>"),
                ("x-forwarded-for", "10.0.0.7"),
            ],
            Some(body.to_string().into_bytes()),
        )
        .await;
    assert_eq!(created.status, 201);
    assert_eq!(created.header("audit-id"), Some(id));
    let written = events(&path, id, 2).await;
    assert_eq!(stages(&written), ["RequestReceived", "ResponseComplete"]);
    let (received, complete) = (&written[0], &written[1]);
    for event in &written {
        assert_eq!(event["kind"], "Event");
        assert_eq!(event["apiVersion"], "audit.k8s.io/v1");
        assert_eq!(event["level"], "RequestResponse");
        assert_eq!(event["verb"], "create");
        assert_eq!(event["requestURI"], LLAMAS);
        assert_eq!(event["user"]["username"], "farm-dev-admin");
        assert_eq!(event["userAgent"], "kubectl/v1.36.0 <&>");
        // The forwarded address, then the peer's own (kube-apiserver's last hop).
        assert_eq!(event["sourceIPs"], json!(["10.0.0.7", "127.0.0.1"]));
        let reference = &event["objectRef"];
        assert_eq!(reference["resource"], "llamas");
        assert_eq!(reference["namespace"], "default");
        assert_eq!(reference["apiGroup"], "farm.example.com");
        assert_eq!(reference["apiVersion"], "v1alpha");
        // MicroTime: UTC with microseconds.
        let stamp = event["stageTimestamp"].as_str().unwrap();
        assert_eq!(stamp.len(), "2026-11-26T12:00:00.000000Z".len(), "{stamp}");
        assert!(stamp.ends_with('Z'));
    }
    // The name is known once the body is read, as in kube-apiserver's events.
    assert!(received["objectRef"].get("name").is_none());
    assert_eq!(complete["objectRef"]["name"], "audited");
    assert!(received.get("responseStatus").is_none());
    assert!(received.get("annotations").is_none(), "{received}");
    assert_eq!(
        complete["responseStatus"],
        json!({"metadata": {}, "code": 201})
    );
    assert_eq!(complete["requestObject"]["metadata"]["name"], "audited");
    assert_eq!(complete["responseObject"]["metadata"]["name"], "audited");
    assert!(complete["responseObject"]["metadata"]["uid"].is_string());
    // omitManagedFields: the stored object has them, the event does not.
    assert!(created.json()["metadata"]["managedFields"].is_array());
    assert!(
        complete["responseObject"]["metadata"]
            .get("managedFields")
            .is_none()
    );
    assert_eq!(
        complete["annotations"]["authorization.k8s.io/decision"],
        "allow"
    );
    assert!(complete["annotations"]["authorization.k8s.io/reason"].is_string());
    assert_eq!(
        complete["requestReceivedTimestamp"],
        received["requestReceivedTimestamp"]
    );

    // Request level: the patch as sent, no response object.
    let patched = admin
        .send(
            "PATCH",
            &format!("{LLAMAS}/audited"),
            &[
                ("content-type", "application/merge-patch+json"),
                ("audit-id", "patch-1"),
            ],
            Some(br#"{"spec":{"weight":11.0}}"#.to_vec()),
        )
        .await;
    assert_eq!(patched.status, 200);
    let written = events(&path, "patch-1", 2).await;
    assert_eq!(written[1]["level"], "Request");
    assert_eq!(
        written[1]["requestObject"],
        json!({"spec": {"weight": 11.0}})
    );
    assert!(written[1].get("responseObject").is_none());
    assert_eq!(written[1]["responseStatus"]["code"], 200);

    // An update: its body's uid and resourceVersion in objectRef, as kube-apiserver logs them.
    let mut current = admin.get(&format!("{LLAMAS}/audited"), &[]).await.json();
    current["spec"]["height"] = json!(2.0);
    let replaced = admin
        .send(
            "PUT",
            &format!("{LLAMAS}/audited"),
            &[("content-type", "application/json"), ("audit-id", "put-1")],
            Some(current.to_string().into_bytes()),
        )
        .await;
    assert_eq!(replaced.status, 200);
    let written = events(&path, "put-1", 2).await;
    assert_eq!(written[1]["verb"], "update");
    assert_eq!(
        written[1]["objectRef"]["resourceVersion"],
        current["metadata"]["resourceVersion"]
    );
    assert_eq!(written[1]["objectRef"]["uid"], current["metadata"]["uid"]);

    // A read: Metadata, a fresh ID, no objects.
    let read = admin.get(&format!("{LLAMAS}/audited"), &[]).await;
    assert_eq!(read.status, 200);
    let own = read
        .header("audit-id")
        .expect("Audit-Id answered")
        .to_owned();
    assert!(uuid::Uuid::parse_str(&own).is_ok(), "{own}");
    let written = events(&path, &own, 2).await;
    assert_eq!(stages(&written), ["RequestReceived", "ResponseComplete"]);
    assert_eq!(written[1]["level"], "Metadata");
    assert_eq!(written[1]["verb"], "get");
    assert_eq!(
        written[1]["responseStatus"],
        json!({"metadata": {}, "code": 200})
    );
    assert!(written[1].get("requestObject").is_none());
    assert!(written[1].get("responseObject").is_none());

    // An error: kube-apiserver's Status fields.
    let missing = admin
        .get(&format!("{LLAMAS}/nobody"), &[("audit-id", "missing-1")])
        .await;
    assert_eq!(missing.status, 404);
    let written = events(&path, "missing-1", 2).await;
    let status = &written[1]["responseStatus"];
    assert_eq!(status["code"], 404);
    assert_eq!(status["reason"], "NotFound");
    assert_eq!(status["status"], "Failure");
    assert_eq!(status["metadata"], json!({}));
    assert!(
        status["message"]
            .as_str()
            .unwrap()
            .contains("\"nobody\" not found")
    );

    // Level None: nothing, but the ID is still answered.
    let version = admin.get("/version", &[("audit-id", "version-1")]).await;
    assert_eq!(version.status, 200);
    assert_eq!(version.header("audit-id"), Some("version-1"));

    // A watch that ends by itself.
    let watched = admin
        .get(
            &format!("{LLAMAS}?watch=true&timeoutSeconds=1"),
            &[("audit-id", "watch-1")],
        )
        .await;
    assert_eq!(watched.status, 200);
    let written = events(&path, "watch-1", 3).await;
    assert_eq!(
        stages(&written),
        ["RequestReceived", "ResponseStarted", "ResponseComplete"]
    );
    assert_eq!(written[0]["verb"], "watch");

    // No identity: one event, no user, the 401.
    let anonymous = server.raw(None, Alpn::Http1);
    let refused = anonymous.get(LLAMAS, &[("audit-id", "anon-1")]).await;
    assert_eq!(refused.status, 401);
    let written = events(&path, "anon-1", 1).await;
    assert_eq!(stages(&written), ["ResponseStarted"]);
    assert_eq!(written[0]["user"], json!({}));
    assert_eq!(written[0]["responseStatus"]["code"], 401);
    assert_eq!(
        written[0]["responseStatus"]["message"],
        "Authentication failed, no credentials provided"
    );

    // The policy's None: nothing for /version, in a log where everything above is.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(events(&path, "version-1", 0).await.is_empty());
    // Every line is one event, Go's HTML escaping included.
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.ends_with('\n'));
    assert!(!text.contains('<') && !text.contains('>') && !text.contains('&'));
    assert!(text.contains(r#""userAgent":"kubectl/v1.36.0 \u003c\u0026\u003e""#));
    // kube-apiserver's field order, down to the Status's empty metadata.
    assert!(
        text.contains(r#""responseStatus":{"metadata":{},"code":201}"#),
        "{text}"
    );
}

/// Batch mode: a buffer nobody drains fills, and then events are dropped, counted in
/// `apiserver_audit_error_total` while every request is answered at once.
#[tokio::test]
async fn a_full_buffer_drops_events_and_never_holds_a_request() {
    let (sink, _undrained) = log::Sink::channel(2);
    let auditor = Auditor::new(
        Policy::parse(
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules: [{level: RequestResponse}]",
        )
        .unwrap(),
        sink,
        Mode::Batch,
    );
    let server = TestServer::start_with(Options {
        audit: Some(auditor),
        ..Default::default()
    })
    .await;
    let admin = server.raw(Some(server.admin_identity()), Alpn::Http1);
    let started = std::time::Instant::now();
    for _ in 0..20 {
        assert_eq!(admin.get(&format!("{LLAMAS}/dolly"), &[]).await.status, 200);
    }
    assert!(started.elapsed() < Duration::from_secs(10));
    let metrics = admin.get("/metrics", &[]).await;
    let text = String::from_utf8_lossy(&metrics.body);
    let dropped: f64 = text
        .lines()
        .find(|l| l.starts_with("apiserver_audit_error_total{plugin=\"log\"}"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .expect("apiserver_audit_error_total");
    // 20 GETs and the metrics request: two events each, two fit.
    assert!(dropped >= 38.0, "{dropped}");
    let generated: f64 = text
        .lines()
        .find(|l| l.starts_with("apiserver_audit_event_total"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .expect("apiserver_audit_event_total");
    assert!(generated >= 40.0, "{generated}");
}

/// A GET answered at once writes its events there and then when the backend has room; when a
/// blocking backend is full it waits its turn (kube-apiserver's blocking mode). Both write the
/// same events, in order, and nothing is written twice.
#[tokio::test]
async fn a_get_answered_at_once_writes_what_a_waiting_one_writes() {
    let (sink, mut queued) = log::Sink::channel(2);
    let auditor = Auditor::new(
        Policy::parse("apiVersion: audit.k8s.io/v1\nkind: Policy\nrules: [{level: Metadata}]")
            .unwrap(),
        sink,
        Mode::Blocking,
    );
    let server = TestServer::start_with(Options {
        audit: Some(auditor),
        ..Default::default()
    })
    .await;
    let admin = server.raw(Some(server.admin_identity()), Alpn::Http1);
    let url = format!("{LLAMAS}/dolly");
    let at_once = admin.get(&url, &[("audit-id", "at-once")]).await;
    assert_eq!(at_once.status, 200);
    assert_eq!(at_once.header("audit-id"), Some("at-once"));
    // Its two events fill the buffer: the next GET waits for room.
    let waiting = tokio::spawn({
        let (admin, url) = (admin.clone(), url.clone());
        async move { admin.get(&url, &[("audit-id", "waiting")]).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !waiting.is_finished(),
        "a full blocking backend holds the request"
    );
    let mut written = Vec::new();
    while written.len() < 4 {
        match tokio::time::timeout(Duration::from_secs(5), queued.recv()).await {
            Ok(Some(log::Message::Line(line, _))) => {
                written.push(serde_json::from_slice::<Value>(&line).expect("a JSON line"))
            }
            Ok(Some(log::Message::Flush(_))) => {}
            other => panic!("expected four events, got {written:?} and then {other:?}"),
        }
    }
    let waited = waiting.await.unwrap();
    assert_eq!(waited.status, 200);
    assert_eq!(waited.header("audit-id"), Some("waiting"));
    assert!(queued.try_recv().is_err(), "no event written twice");
    let ids: Vec<_> = written.iter().map(|e| e["auditID"].clone()).collect();
    assert_eq!(ids, ["at-once", "at-once", "waiting", "waiting"]);
    let unstamped = |event: &Value| {
        let mut event = event.clone();
        let object = event.as_object_mut().unwrap();
        for key in ["auditID", "requestReceivedTimestamp", "stageTimestamp"] {
            assert!(object.remove(key).is_some(), "{key} in {object:?}");
        }
        event
    };
    assert_eq!(
        stages(&written[..2]),
        ["RequestReceived", "ResponseComplete"]
    );
    for (now, later) in written[..2].iter().zip(&written[2..]) {
        assert_eq!(unstamped(now), unstamped(later));
    }
    assert_eq!(
        written[1]["responseStatus"],
        json!({"metadata": {}, "code": 200})
    );
    assert_eq!(
        written[1]["annotations"]["authorization.k8s.io/decision"],
        "allow"
    );
}

/// A GET on etcd, whose store reads with a future (a consistent read), is answered as on
/// memory: under a policy that writes nothing of it, still with its `Audit-Id` (a fresh one, or
/// the aggregator's); under one that writes it, with both events.
#[tokio::test]
async fn a_get_on_etcd_answers_its_audit_id_whether_or_not_the_policy_writes_it() {
    if common::etcd::binary().is_none() {
        println!("SKIPPED: no etcd (see common::etcd)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.log");
    let policy = "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: None\n  verbs: [get]\n  resources: [{group: farm.example.com, resources: [llamas], resourceNames: [dolly]}]\n- level: Metadata\n";
    let server = TestServer::start_with(Options {
        storage: common::TestStorage::Etcd,
        audit: Some(auditor(policy, &path)),
        ..Default::default()
    })
    .await;
    let admin = server.raw(Some(server.admin_identity()), Alpn::Http2);
    let dolly = format!("{LLAMAS}/dolly");
    let unwritten = admin.get(&dolly, &[("audit-id", "etcd-none-1")]).await;
    assert_eq!(unwritten.status, 200);
    assert_eq!(unwritten.header("audit-id"), Some("etcd-none-1"));
    let fresh = admin.get(&dolly, &[]).await;
    assert_eq!(fresh.status, 200);
    let fresh_id = fresh.header("audit-id").expect("an audit ID made for it");
    assert!(!fresh_id.is_empty());
    // A GET the policy writes: its two events, and its ID answered.
    let missing = admin
        .get(
            &format!("{LLAMAS}/nobody"),
            &[("audit-id", "etcd-written-1")],
        )
        .await;
    assert_eq!(missing.status, 404);
    assert_eq!(missing.header("audit-id"), Some("etcd-written-1"));
    let written = events(&path, "etcd-written-1", 2).await;
    assert_eq!(stages(&written), ["RequestReceived", "ResponseComplete"]);
    assert_eq!(written[1]["responseStatus"]["code"], 404);
    assert!(events(&path, "etcd-none-1", 0).await.is_empty());
}

/// Admission's annotations reach the write's ResponseComplete event: a ValidatingAdmissionPolicy
/// bound with `Audit` (its failure, as kube-apiserver's JSON list), its `auditAnnotations`
/// (`<policy>/<key>`), and a validating webhook's `auditAnnotations` (`<webhook>/<key>`).
#[tokio::test]
async fn admission_annotations_are_audited() {
    let webhook = crate::admission::Webhook::start().await;
    webhook.answer(|_| json!({"allowed": true, "auditAnnotations": {"checked-by": "tests"}}));
    let fake = FakeKube::start().await;
    fake.add(common::fake_kube::namespace("default", false));
    // alice may, with RBAC's kind of reason; bob may not.
    fake.set_policy(|spec| match spec["user"].as_str() {
        Some("alice") => (
            true,
            "RBAC: allowed by ClusterRoleBinding \"farmers\"".into(),
        ),
        _ => (false, "no RBAC policy matched".into()),
    });
    fake.add(crate::admission::validating(
        "audited",
        json!({"clientConfig": webhook.client_config("/validate")}),
    ));
    // A mutating webhook that labels what it sees.
    let labeller = crate::admission::Webhook::start().await;
    labeller.answer(|_| {
        crate::admission::patch(json!([
            {"op": "add", "path": "/metadata/labels", "value": {"seen": "yes"}}
        ]))
    });
    fake.add(crate::admission::mutating(
        "labeller",
        json!({"clientConfig": labeller.client_config("/mutate")}),
    ));
    fake.add(json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": "weights"},
        "spec": {
            "matchConstraints": {"resourceRules": [{"apiGroups": ["farm.example.com"],
                "apiVersions": ["*"], "operations": ["CREATE"], "resources": ["llamas"]}]},
            "validations": [
                {"expression": "object.spec.height < 100.0", "message": "too tall"},
                {"expression": "object.spec.weight < 100.0", "message": "too heavy"},
            ],
            "auditAnnotations": [
                {"key": "weight", "valueExpression": "string(object.spec.weight)"},
                {"key": "skipped", "valueExpression": "null"},
            ],
        },
    }));
    fake.add(json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": "audit-weights"},
        "spec": {"policyName": "weights", "validationActions": ["Audit", "Warn"]},
    }));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.log");
    let server = TestServer::start_with(Options {
        cluster: Some(fake.client().await),
        webhooks: true,
        audit: Some(auditor(POLICY, &path)),
        ..Default::default()
    })
    .await;
    let body = json!({"apiVersion": "farm.example.com/v1alpha", "kind": "Llama",
        "metadata": {"name": "heavy"}, "spec": {"weight": 500.0, "height": 1.0}});
    let alice = server.raw(
        Some(server.dev_ca().issue_client("alice", &["farmers"]).unwrap()),
        Alpn::Http2,
    );
    let created = alice
        .send(
            "POST",
            LLAMAS,
            &[
                ("content-type", "application/json"),
                ("audit-id", "admitted-1"),
            ],
            Some(body.to_string().into_bytes()),
        )
        .await;
    // Audit and Warn only: the write goes through, with the warning.
    assert_eq!(
        created.status,
        201,
        "{}",
        String::from_utf8_lossy(&created.body)
    );
    assert_eq!(webhook.seen().len(), 1);
    let written = events(&path, "admitted-1", 2).await;
    assert_eq!(stages(&written), ["RequestReceived", "ResponseComplete"]);
    let annotations = &written[1]["annotations"];
    assert_eq!(annotations["audited.farm.example.com/checked-by"], "tests");
    // The mutating webhook: called and mutated (Metadata), and its patch (Request and above).
    let mutation: Value = serde_json::from_str(
        annotations["mutation.webhook.admission.k8s.io/round_0_index_0"]
            .as_str()
            .expect("the mutation annotation"),
    )
    .unwrap();
    assert_eq!(
        mutation,
        json!({"configuration": "labeller", "webhook": "labeller.farm.example.com", "mutated": true})
    );
    let patch: Value = serde_json::from_str(
        annotations["patch.webhook.admission.k8s.io/round_0_index_0"]
            .as_str()
            .expect("the patch annotation"),
    )
    .unwrap();
    assert_eq!(patch["patchType"], "JSONPatch");
    assert_eq!(patch["patch"][0]["path"], "/metadata/labels");
    assert_eq!(
        written[1]["responseObject"]["metadata"]["labels"]["seen"],
        "yes"
    );
    assert_eq!(annotations["weights/weight"], "500");
    assert!(annotations.get("weights/skipped").is_none());
    let failure: Value = serde_json::from_str(
        annotations["validation.policy.admission.k8s.io/validation_failure"]
            .as_str()
            .expect("the Audit action's annotation"),
    )
    .unwrap();
    assert_eq!(
        failure,
        json!([{"message": "too heavy", "policy": "weights", "binding": "audit-weights",
                "expressionIndex": 1, "validationActions": ["Audit", "Warn"]}])
    );
    // Authorization's decision and the review's reason.
    assert_eq!(annotations["authorization.k8s.io/decision"], "allow");
    assert_eq!(
        annotations["authorization.k8s.io/reason"],
        "RBAC: allowed by ClusterRoleBinding \"farmers\""
    );
    let bob = server.raw(
        Some(server.dev_ca().issue_client("bob", &["others"]).unwrap()),
        Alpn::Http1,
    );
    let refused = bob
        .get(&format!("{LLAMAS}/heavy"), &[("audit-id", "bob-1")])
        .await;
    assert_eq!(refused.status, 403);
    let written = events(&path, "bob-1", 2).await;
    assert_eq!(
        written[1]["annotations"]["authorization.k8s.io/decision"],
        "forbid"
    );
    assert_eq!(
        written[1]["annotations"]["authorization.k8s.io/reason"],
        "no RBAC policy matched"
    );
    assert_eq!(written[1]["responseStatus"]["reason"], "Forbidden");

    // A client that gives up while its write waits for a webhook (an HTTP/2 stream reset):
    // the request still ends in the log, as kube-apiserver's always do.
    webhook.set_delay(Duration::from_secs(2));
    let gave_up = tokio::time::timeout(
        Duration::from_millis(400),
        alice.send(
            "POST",
            LLAMAS,
            &[
                ("content-type", "application/json"),
                ("audit-id", "gave-up-1"),
            ],
            Some(
                json!({"apiVersion": "farm.example.com/v1alpha", "kind": "Llama",
                    "metadata": {"name": "impatient"}, "spec": {"weight": 1.0, "height": 1.0}})
                .to_string()
                .into_bytes(),
            ),
        ),
    )
    .await;
    assert!(gave_up.is_err(), "the webhook holds the write");
    let written = events(&path, "gave-up-1", 2).await;
    assert_eq!(stages(&written), ["RequestReceived", "ResponseComplete"]);
    assert_eq!(
        written[1]["responseStatus"]["message"],
        "Connection closed early"
    );
}

/// An audit webhook on loopback: HTTPS with a certificate of its own CA; every POST kept
/// (path, content type, body), answered 500 while `failing` says so.
struct AuditReceiver {
    addr: std::net::SocketAddr,
    ca_pem: String,
    posts: Arc<std::sync::Mutex<Vec<(String, String, Value)>>>,
    failing: Arc<std::sync::atomic::AtomicUsize>,
    _dir: tempfile::TempDir,
}

impl AuditReceiver {
    async fn start() -> Self {
        let posts: Arc<std::sync::Mutex<Vec<(String, String, Value)>>> = Arc::default();
        let failing = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let state = (posts.clone(), failing.clone());
        let app = axum::Router::new().fallback(axum::routing::post(
            move |uri: axum::http::Uri, headers: axum::http::HeaderMap, body: axum::body::Bytes| {
                let (posts, failing) = state.clone();
                async move {
                    use std::sync::atomic::Ordering;
                    if failing
                        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                        .is_ok()
                    {
                        return axum::http::StatusCode::INTERNAL_SERVER_ERROR;
                    }
                    let kind = headers
                        .get("content-type")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or_default()
                        .to_owned();
                    let list = serde_json::from_slice(&body).expect("an EventList in JSON");
                    posts
                        .lock()
                        .unwrap()
                        .push((uri.path().to_owned(), kind, list));
                    axum::http::StatusCode::OK
                }
            },
        ));
        let served = common::https::serve(app, "audit-ca", &[]).await;
        Self {
            addr: served.addr,
            ca_pem: served.ca_pem,
            posts,
            failing,
            _dir: served.dir,
        }
    }

    /// The kubeconfig that names it (kube-apiserver's `--audit-webhook-config-file`).
    fn kubeconfig(&self, path: &str) -> String {
        use base64::Engine;
        let ca = base64::engine::general_purpose::STANDARD.encode(&self.ca_pem);
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: audit\n  cluster:\n    server: https://127.0.0.1:{}{path}\n    certificate-authority-data: {ca}\nusers:\n- name: audit\n  user: {{}}\ncontexts:\n- name: audit\n  context:\n    cluster: audit\n    user: audit\ncurrent-context: audit\n",
            self.addr.port()
        )
    }

    /// Every event received, in order.
    fn events(&self) -> Vec<Value> {
        let posts = self.posts.lock().unwrap();
        posts
            .iter()
            .flat_map(|(_, _, list)| list["items"].as_array().cloned().unwrap_or_default())
            .collect()
    }
}

/// `--audit-webhook-config-file`, on the shipped binary beside the log: the same events reach
/// both, the webhook's as `audit.k8s.io/v1` EventLists POSTed to the kubeconfig's server (its
/// path, trusted through its CA); a POST that fails is sent again after the backoff; while
/// the webhook keeps failing, requests are served at once and the dropped events are counted
/// in `apiserver_audit_error_total{plugin="webhook"}`.
#[tokio::test]
async fn the_webhook_backend_gets_event_lists() {
    let receiver = AuditReceiver::start().await;
    // The first POST fails: it is sent again.
    receiver
        .failing
        .store(1, std::sync::atomic::Ordering::SeqCst);
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("policy.yaml");
    std::fs::write(&policy, POLICY).unwrap();
    let kubeconfig = dir.path().join("audit-webhook.kubeconfig");
    std::fs::write(&kubeconfig, receiver.kubeconfig("/audit/events")).unwrap();
    let log = dir.path().join("audit.log");
    let certs = dir.path().join("certs");
    let server = common::process::Running::start([
        "--cert-dir".to_owned(),
        certs.display().to_string(),
        format!("--audit-policy-file={}", policy.display()),
        format!("--audit-log-path={}", log.display()),
        format!("--audit-webhook-config-file={}", kubeconfig.display()),
        "--audit-webhook-batch-max-wait=100ms".to_owned(),
        "--audit-webhook-initial-backoff=100ms".to_owned(),
    ]);
    let client = server.admin(&certs, Alpn::Http1);
    let created = client
        .send(
            "POST",
            LLAMAS,
            &[
                ("content-type", "application/json"),
                ("audit-id", "to-the-webhook"),
            ],
            Some(
                json!({"apiVersion": "farm.example.com/v1alpha", "kind": "Llama",
                    "metadata": {"name": "hooked"}, "spec": {"weight": 1.0, "height": 1.0}})
                .to_string()
                .into_bytes(),
            ),
        )
        .await;
    assert_eq!(created.status, 201);

    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let received = loop {
        let received: Vec<Value> = receiver
            .events()
            .into_iter()
            .filter(|e| e["auditID"] == "to-the-webhook")
            .collect();
        if received.len() >= 2 {
            break received;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the webhook got {:?}",
            receiver.posts.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    {
        let posts = receiver.posts.lock().unwrap();
        for (path, kind, list) in posts.iter() {
            assert_eq!(path, "/audit/events");
            assert_eq!(kind, "application/json");
            assert_eq!(list["kind"], "EventList");
            assert_eq!(list["apiVersion"], "audit.k8s.io/v1");
        }
    }
    assert_eq!(
        receiver.failing.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "the failed POST was sent again"
    );
    let stages: Vec<&str> = received
        .iter()
        .filter_map(|e| e["stage"].as_str())
        .collect();
    assert_eq!(stages, ["RequestReceived", "ResponseComplete"]);
    assert_eq!(received[1]["responseStatus"]["code"], 201);
    assert_eq!(received[1]["objectRef"]["name"], "hooked");
    // The log has the same events, to the byte.
    let logged = events(&log, "to-the-webhook", 2).await;
    assert_eq!(logged, received);

    // A webhook that keeps failing: requests do not wait for it, its events are counted as
    // dropped once the tries are spent (five, 100 ms apart and growing).
    receiver
        .failing
        .store(usize::MAX, std::sync::atomic::Ordering::SeqCst);
    let started = tokio::time::Instant::now();
    let got = client.get(&format!("{LLAMAS}/hooked"), &[]).await;
    assert_eq!(got.status, 200);
    assert!(started.elapsed() < Duration::from_secs(1));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let metrics = client.get("/metrics", &[]).await;
        let text = String::from_utf8_lossy(&metrics.body).into_owned();
        let dropped = text
            .lines()
            .find(|l| l.starts_with("apiserver_audit_error_total{plugin=\"webhook\"}"))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .unwrap_or(0.0);
        if dropped >= 2.0 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{text}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drop(server);
}

/// Impersonation (`Impersonate-User`, `-Group`, `kubectl --as`), as k8s.io/apiserver serves it to
/// a client that calls the server directly: each part impersonated is authorized for the user
/// who authenticated (`impersonate` users, groups), the request is then authorized as the user
/// it becomes, and the audit log names both (`user` and `impersonatedUser`); what is refused
/// gets kube-apiserver's 403 and is audited as the user who asked.
#[tokio::test]
async fn impersonation_acts_as_another_user_and_the_audit_log_names_both() {
    let fake = FakeKube::start().await;
    fake.add(common::fake_kube::namespace("default", false));
    // alice may impersonate bob and the group farmers, and nothing else; bob may read.
    fake.set_policy(|spec| {
        let attributes = &spec["resourceAttributes"];
        let (verb, resource, name) = (
            attributes["verb"].as_str().unwrap_or_default(),
            attributes["resource"].as_str().unwrap_or_default(),
            attributes["name"].as_str().unwrap_or_default(),
        );
        let allowed = match (spec["user"].as_str().unwrap_or_default(), verb) {
            ("alice", "impersonate") => {
                matches!((resource, name), ("users", "bob") | ("groups", "farmers"))
            }
            ("bob", "get" | "list" | "watch") => true,
            ("bob", _) => spec.get("nonResourceAttributes").is_some(),
            _ => false,
        };
        (allowed, String::new())
    });
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.log");
    let server = TestServer::start_with(Options {
        cluster: Some(fake.client().await),
        audit: Some(auditor(POLICY, &path)),
        ..Default::default()
    })
    .await;
    let alice = server.raw(
        Some(server.dev_ca().issue_client("alice", &["staff"]).unwrap()),
        Alpn::Http1,
    );
    let dolly = format!("{LLAMAS}/dolly");

    // As bob, in farmers: read as bob; the audit log names alice and bob.
    let id = "7a1b2c3d-8b86-4011-b42d-00cf4fc964ff";
    let read = alice
        .get(
            &dolly,
            &[
                ("audit-id", id),
                ("impersonate-user", "bob"),
                ("impersonate-group", "farmers"),
            ],
        )
        .await;
    assert_eq!(read.status, 200, "{}", read.json());
    let written = events(&path, id, 2).await;
    assert_eq!(stages(&written), ["RequestReceived", "ResponseComplete"]);
    for event in &written {
        assert_eq!(event["user"]["username"], "alice", "{event}");
        assert_eq!(
            event["user"]["groups"],
            json!(["staff", "system:authenticated"])
        );
        assert_eq!(event["impersonatedUser"]["username"], "bob", "{event}");
        assert_eq!(
            event["impersonatedUser"]["groups"],
            json!(["farmers", "system:authenticated"])
        );
    }
    // alice herself may not read; the request was authorized as bob.
    assert_eq!(alice.get(&dolly, &[]).await.status, 403);

    // A user or group alice may not impersonate: kube-apiserver's 403, audited as alice.
    let id = "7a1b2c3d-8b86-4011-b42d-00cf4fc96500";
    let refused = alice
        .get(&dolly, &[("audit-id", id), ("impersonate-user", "eve")])
        .await;
    assert_eq!(refused.status, 403);
    assert_eq!(
        refused.json()["message"],
        "users \"eve\" is forbidden: User \"alice\" cannot impersonate resource \"users\" in API group \"\" at the cluster scope"
    );
    let written = events(&path, id, 2).await;
    assert_eq!(written[1]["user"]["username"], "alice");
    assert!(
        written[1].get("impersonatedUser").is_none(),
        "{}",
        written[1]
    );
    assert_eq!(written[1]["responseStatus"]["code"], 403);
    let refused = alice
        .get(
            &dolly,
            &[("impersonate-user", "bob"), ("impersonate-group", "admins")],
        )
        .await;
    assert_eq!(refused.status, 403);
    assert!(
        refused.json()["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("groups \"admins\" is forbidden: User \"alice\"")),
        "{}",
        refused.json()
    );
    // Groups without a user: refused (kube-apiserver's words; 400, not its 500).
    let refused = alice.get(&dolly, &[("impersonate-group", "farmers")]).await;
    assert_eq!(refused.status, 400, "{}", refused.json());

    // bob may read, not write: a create as bob is refused as bob's.
    let body = json!({"apiVersion": "farm.example.com/v1alpha", "kind": "Llama",
        "metadata": {"name": "by-bob"}, "spec": {"weight": 1.0, "height": 1.0}});
    let refused = alice
        .send(
            "POST",
            LLAMAS,
            &[
                ("content-type", "application/json"),
                ("impersonate-user", "bob"),
            ],
            Some(body.to_string().into_bytes()),
        )
        .await;
    assert_eq!(refused.status, 403);
    assert!(
        refused.json()["message"]
            .as_str()
            .is_some_and(|m| m.contains("User \"bob\" cannot create resource \"llamas\"")),
        "{}",
        refused.json()
    );

    // kubectl --as, with the development kubeconfig (system:masters may impersonate anyone).
    let cache = server.dir.path().join("kubectl-cache");
    if let Some(mut kubectl) = common::kubectl(&server.kubeconfig(), &cache) {
        kubectl.args(["get", "llama", "dolly", "-o", "name", "--as", "bob"]);
        let (ok, out, err) = common::run(kubectl, None).await;
        assert!(ok, "{err}");
        assert_eq!(out.trim(), "llama.farm.example.com/dolly");
        let mut kubectl = common::kubectl(&server.kubeconfig(), &cache).unwrap();
        kubectl.args(["create", "-f", "-", "--as", "bob"]);
        let (ok, _, err) = common::run(kubectl, Some(&body.to_string())).await;
        assert!(!ok);
        assert!(
            err.contains("User \"bob\" cannot create resource \"llamas\""),
            "{err}"
        );
    }
}

/// The log backend's flags on the shipped binary: `--audit-log-maxsize=1` rotates the log at
/// 1 MiB, `--audit-log-maxbackup=1` keeps one rotated file, named as lumberjack names them.
#[tokio::test]
async fn the_log_rotates_at_max_size_as_the_flags_say() {
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("policy.yaml");
    std::fs::write(
        &policy,
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: RequestResponse\n",
    )
    .unwrap();
    let logs = dir.path().join("logs");
    let log = logs.join("audit.log");
    let certs = dir.path().join("certs");
    let server = common::process::Running::start([
        "--cert-dir".to_owned(),
        certs.display().to_string(),
        format!("--audit-policy-file={}", policy.display()),
        format!("--audit-log-path={}", log.display()),
        "--audit-log-maxsize=1".to_owned(),
        "--audit-log-maxbackup=1".to_owned(),
    ]);
    let client = server.admin(&certs, Alpn::Http1);
    // Lists of the sample Llamas at RequestResponse: several KiB an event, 2.5 MiB in all.
    let names = || -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(&logs)
            .map(|entries| {
                entries
                    .map(|e| e.unwrap().file_name().into_string().unwrap())
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    };
    let mut written = 0;
    while written < 5 * 512 * 1024 {
        let listed = client.get(LLAMAS, &[]).await;
        assert_eq!(listed.status, 200);
        written += 2 * listed.body.len();
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while names().len() < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no rotation: {:?}",
            names()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let names = names();
    assert_eq!(names.len(), 2, "one backup kept: {names:?}");
    assert_eq!(names[1], "audit.log");
    assert!(names[0].starts_with("audit-") && names[0].ends_with(".log"));
    let backup = std::fs::metadata(logs.join(&names[0])).unwrap().len();
    assert!(backup <= 1024 * 1024, "{backup}");
}

/// `--audit-webhook-mode=blocking`, as kube-apiserver's: a request is answered only once its
/// events have reached the webhook (its batch is sent at once, not after the 30 s wait a
/// batch would have), on the path that answers a GET at once as on the one that waits.
#[tokio::test]
async fn a_blocking_webhook_has_the_events_before_the_answer() {
    let receiver = AuditReceiver::start().await;
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("policy.yaml");
    std::fs::write(
        &policy,
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: Metadata\n",
    )
    .unwrap();
    let kubeconfig = dir.path().join("audit-webhook.kubeconfig");
    std::fs::write(&kubeconfig, receiver.kubeconfig("/audit")).unwrap();
    let certs = dir.path().join("certs");
    let server = common::process::Running::start([
        "--cert-dir".to_owned(),
        certs.display().to_string(),
        format!("--audit-policy-file={}", policy.display()),
        format!("--audit-webhook-config-file={}", kubeconfig.display()),
        "--audit-webhook-mode=blocking".to_owned(),
        "--audit-webhook-batch-max-wait=30s".to_owned(),
    ]);
    let client = server.admin(&certs, Alpn::Http1);
    for (attempt, id) in ["blocking-1", "blocking-2", "blocking-3"]
        .iter()
        .enumerate()
    {
        let started = std::time::Instant::now();
        let got = client
            .get(&format!("{LLAMAS}/dolly"), &[("audit-id", id)])
            .await;
        assert_eq!(got.status, 200);
        let stages: Vec<Value> = receiver
            .events()
            .into_iter()
            .filter(|e| e["auditID"] == *id)
            .map(|e| e["stage"].clone())
            .collect();
        assert_eq!(
            stages,
            ["RequestReceived", "ResponseComplete"],
            "attempt {attempt}: the events were at the webhook before the answer"
        );
        assert!(started.elapsed() < Duration::from_secs(10));
    }
}
