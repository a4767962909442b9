//! What the audit log holds: events for every kind of request, a full buffer, fast and slow
//! GETs, etcd, admission annotations.

use super::*;

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
