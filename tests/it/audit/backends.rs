//! The webhook backend, impersonation named in the log, rotation, and blocking webhooks.

use super::*;

/// An audit webhook on loopback: HTTPS with a certificate of its own CA; every POST kept
/// (path, content type, body), answered 500 while `failing` says so.
pub(super) struct AuditReceiver {
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
