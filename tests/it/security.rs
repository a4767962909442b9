//! Who gets in: the front proxy's certificate and headers, client-CA certificates, bearer tokens,
//! SubjectAccessReview with its cache, the auth ConfigMap followed live, and serving-certificate
//! rotation without a restart. Certificates are made in the test; the cluster is a fake
//! kube-apiserver on loopback.

use crate::common;

use std::{sync::Arc, time::Duration};

use aggregated_apiserver::net::tls::DevCa;
use common::{
    Alpn, Options, RawClient, TestServer,
    fake_kube::{FakeKube, auth_configmap},
};
use serde_json::Value;

const LLAMAS: &str = "/apis/farm.example.com/v1alpha/namespaces/default/llamas";

struct Setup {
    server: TestServer,
    fake: Arc<FakeKube>,
    proxy_ca: DevCa,
    _dirs: Vec<tempfile::TempDir>,
}

fn new_ca() -> (DevCa, tempfile::TempDir) {
    common::install_crypto();
    let dir = tempfile::tempdir().unwrap();
    (DevCa::load_or_create(dir.path()).unwrap(), dir)
}

/// A server with flags for the front proxy (CA + allowed CN `front-proxy-client`), a separate
/// client CA (the dev CA), and a fake cluster for reviews.
async fn setup() -> Setup {
    let fake = FakeKube::start().await;
    let (proxy_ca, dir) = new_ca();
    let server = TestServer::start_with(Options {
        requestheader: Some((proxy_ca.cert_pem.clone(), vec!["front-proxy-client".into()])),
        cluster: Some(fake.client().await),
        ..Default::default()
    })
    .await;
    Setup {
        server,
        fake,
        proxy_ca,
        _dirs: vec![dir],
    }
}

fn client(server: &TestServer, identity: Option<(String, String)>) -> RawClient {
    server.raw(identity, Alpn::Http1)
}

/// The status of a GET, or None when the TLS handshake refused the client certificate.
async fn try_get(raw: &RawClient, path: &str, headers: &[(&str, &str)]) -> Option<u16> {
    let mut conn = raw.connect().await.ok()?;
    conn.get(path, headers).await.ok().map(|r| r.status)
}

#[tokio::test]
async fn identity_headers_without_a_proxy_certificate_are_not_trusted() {
    let s = setup().await;
    let anonymous = client(&s.server, None);
    let reply = anonymous
        .get(
            LLAMAS,
            &[
                ("X-Remote-User", "admin"),
                ("X-Remote-Group", "system:masters"),
            ],
        )
        .await;
    assert_eq!(reply.status, 401);
    let status = reply.json();
    assert_eq!(status["kind"], "Status");
    assert_eq!(status["reason"], "Unauthorized");
    // Probes need no identity.
    for path in ["/healthz", "/livez", "/readyz", "/readyz/ping"] {
        assert_eq!(anonymous.get(path, &[]).await.status, 200, "{path}");
    }
    // Everything else does, discovery and metrics included.
    for path in [
        "/apis",
        "/apis/farm.example.com/v1alpha",
        "/openapi/v2",
        "/metrics",
        "/version",
    ] {
        assert_eq!(anonymous.get(path, &[]).await.status, 401, "{path}");
    }

    // A client-CA user cannot pose as someone else through the headers either.
    let (cert, key) = s.server.dev_ca().issue_client("mallory", &[]).unwrap();
    s.fake
        .set_policy(|spec| (spec["user"] == "admin", String::new()));
    let reply = client(&s.server, Some((cert, key)))
        .get(LLAMAS, &[("X-Remote-User", "admin")])
        .await;
    assert_eq!(reply.status, 403);
    assert!(
        reply.json()["message"]
            .as_str()
            .unwrap()
            .contains("User \"mallory\"")
    );
}

#[tokio::test]
async fn a_certificate_from_an_unknown_ca_is_rejected() {
    let s = setup().await;
    let (stranger, _dir) = new_ca();
    let identity = stranger.issue_client("front-proxy-client", &[]).unwrap();
    let raw = client(&s.server, Some(identity));
    // TLS 1.3 reports a rejected client certificate on the first read, not in connect().
    let rejected = match raw.connect().await {
        Err(_) => true,
        Ok(mut conn) => conn
            .get(
                LLAMAS,
                &[
                    ("X-Remote-User", "admin"),
                    ("X-Remote-Group", "system:masters"),
                ],
            )
            .await
            .is_err(),
    };
    assert!(rejected, "the handshake must fail for an unknown CA");
}

#[tokio::test]
async fn proxy_ca_with_a_cn_not_allowed_is_401() {
    let s = setup().await;
    let identity = s.proxy_ca.issue_client("not-the-aggregator", &[]).unwrap();
    let reply = client(&s.server, Some(identity))
        .get(
            LLAMAS,
            &[
                ("X-Remote-User", "admin"),
                ("X-Remote-Group", "system:masters"),
            ],
        )
        .await;
    assert_eq!(reply.status, 401);
}

#[tokio::test]
async fn the_front_proxy_identity_comes_from_the_headers() {
    let s = setup().await;
    s.fake.set_policy(|spec| {
        let ok = spec["user"] == "alice" && spec["resourceAttributes"]["verb"] == "list";
        (
            ok,
            if ok {
                String::new()
            } else {
                "no RBAC rule".into()
            },
        )
    });
    let proxy = client(
        &s.server,
        Some(s.proxy_ca.issue_client("front-proxy-client", &[]).unwrap()),
    );
    let headers = [
        ("X-Remote-User", "alice"),
        ("X-Remote-Group", "farmers"),
        ("X-Remote-Group", "system:authenticated"),
        ("X-Remote-Uid", "uid-alice"),
        (
            "X-Remote-Extra-Authentication.kubernetes.io%2fcredential-Id",
            "X509SHA256=abc",
        ),
    ];
    let reply = proxy.get(LLAMAS, &headers).await;
    assert_eq!(
        reply.status,
        200,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    let review = s.fake.reviews.lock().unwrap().last().cloned().unwrap();
    assert_eq!(review["user"], "alice");
    assert_eq!(review["uid"], "uid-alice");
    assert_eq!(
        review["groups"],
        serde_json::json!(["farmers", "system:authenticated"])
    );
    assert_eq!(
        review["extra"]["authentication.kubernetes.io/credential-id"][0],
        "X509SHA256=abc"
    );
    assert_eq!(review["resourceAttributes"]["verb"], "list");
    assert_eq!(review["resourceAttributes"]["group"], "farm.example.com");
    assert_eq!(review["resourceAttributes"]["version"], "v1alpha");
    assert_eq!(review["resourceAttributes"]["resource"], "llamas");
    assert_eq!(review["resourceAttributes"]["namespace"], "default");

    // Denied: kube-apiserver's wording, with the reviewer's reason.
    let reply = proxy.get(&format!("{LLAMAS}/dolly"), &headers).await;
    assert_eq!(reply.status, 403);
    let status = reply.json();
    assert_eq!(status["reason"], "Forbidden");
    assert_eq!(
        status["message"],
        "llamas.farm.example.com \"dolly\" is forbidden: User \"alice\" cannot get resource \"llamas\" in API group \"farm.example.com\" in the namespace \"default\": no RBAC rule"
    );
}

/// The aggregator multiplexes its users over a few connections, and the server remembers the
/// users and decisions of each connection's recent requests: every request must still be its
/// own user's, with more users than a connection remembers, alternating on one connection.
#[tokio::test]
async fn one_proxy_connection_carries_many_users_each_judged_as_itself() {
    let s = setup().await;
    // Allowed: users with an even number, and anyone in the group "trusted".
    s.fake.set_policy(|spec| {
        let user = spec["user"].as_str().unwrap_or_default();
        let n: u32 = user.trim_start_matches("user-").parse().unwrap_or(1);
        let trusted = spec["groups"]
            .as_array()
            .is_some_and(|g| g.iter().any(|g| g == "trusted"));
        (n.is_multiple_of(2) || trusted, "odd".into())
    });
    let proxy = client(
        &s.server,
        Some(s.proxy_ca.issue_client("front-proxy-client", &[]).unwrap()),
    );
    let mut conn = proxy.connect().await.unwrap();
    let names: Vec<String> = (0..12).map(|i| format!("user-{i}")).collect();
    for round in 0..3 {
        for (i, name) in names.iter().enumerate() {
            for (path, groups) in [
                (LLAMAS.to_owned(), vec![]),
                (format!("{LLAMAS}/dolly"), vec![]),
                (LLAMAS.to_owned(), vec!["trusted"]),
            ] {
                let mut headers = vec![("X-Remote-User", name.as_str())];
                headers.extend(groups.iter().map(|g| ("X-Remote-Group", *g)));
                let reply = conn.get(&path, &headers).await.unwrap();
                let allowed = i % 2 == 0 || !groups.is_empty();
                let want = if allowed { 200 } else { 403 };
                assert_eq!(
                    reply.status,
                    want,
                    "round {round}, {name} in {groups:?}, GET {path}: {}",
                    String::from_utf8_lossy(&reply.body)
                );
                if want == 403 {
                    let message = reply.json()["message"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned();
                    assert!(message.contains(&format!("User \"{name}\"")), "{message}");
                }
            }
        }
    }
    // Each distinct user and request reviewed once; the rest came from the caches.
    assert_eq!(s.fake.sar_count(), 12 * 3);
}

/// kube-apiserver's default RBAC for non-resource paths: `system:discovery` and
/// `system:public-info-viewer` are bound to the group `system:authenticated`, never to a user.
fn default_rbac(spec: &Value) -> (bool, String) {
    let authenticated = spec["groups"]
        .as_array()
        .is_some_and(|g| g.iter().any(|g| g == "system:authenticated"));
    let path = spec["nonResourceAttributes"]["path"].as_str().unwrap_or("");
    let discovery = [
        "/openapi",
        "/openapi/*",
        "/apis",
        "/apis/*",
        "/api",
        "/version",
    ]
    .iter()
    .any(|p| match p.strip_suffix('*') {
        Some(prefix) => path.starts_with(prefix),
        None => path == *p,
    });
    if authenticated && discovery && spec["nonResourceAttributes"]["verb"] == "get" {
        (true, String::new())
    } else {
        (false, String::new())
    }
}

/// The aggregator downloads the OpenAPI as `system:aggregator` with no group at all (recorded
/// from kube-apiserver v1.36). Every authenticated user is in `system:authenticated`, as
/// k8s.io/apiserver's AuthenticatedGroupAdder makes it, so the default RBAC lets it through.
#[tokio::test]
async fn every_authenticated_user_is_in_system_authenticated() {
    let s = setup().await;
    s.fake.set_policy(default_rbac);
    let proxy = client(
        &s.server,
        Some(s.proxy_ca.issue_client("front-proxy-client", &[]).unwrap()),
    );
    let recorded: Vec<Value> = include_str!("fixtures/aggregator-requests.jsonl")
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["path"].as_str().unwrap_or("").starts_with("/openapi/"))
        .collect();
    assert_eq!(
        recorded.len(),
        2,
        "the fixture holds /openapi/v2 and /openapi/v3"
    );
    for entry in &recorded {
        let headers: Vec<(&str, &str)> = entry["headers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| (h[0].as_str().unwrap(), h[1].as_str().unwrap()))
            .collect();
        assert!(!headers.iter().any(|(n, _)| *n == "X-Remote-Group"));
        let path = entry["path"].as_str().unwrap();
        let reply = proxy.get(path, &headers).await;
        assert_eq!(
            reply.status,
            200,
            "{path}: {}",
            String::from_utf8_lossy(&reply.body)
        );
    }
    let reviews = s.fake.reviews.lock().unwrap().clone();
    assert_eq!(reviews.len(), 2, "{reviews:?}");
    for review in &reviews {
        assert_eq!(review["user"], "system:aggregator");
        assert_eq!(
            review["groups"],
            serde_json::json!(["system:authenticated"])
        );
    }

    // The group is part of the user, so of the review cache's key: naming it again changes
    // nothing, and the cached answer is reused.
    let with_group = proxy
        .get(
            "/openapi/v2",
            &[
                ("X-Remote-User", "system:aggregator"),
                ("X-Remote-Group", "system:authenticated"),
            ],
        )
        .await;
    assert_eq!(with_group.status, 200);
    assert_eq!(s.fake.sar_count(), 2, "answered from the cache");

    // A client certificate whose O already says so is not given the group twice.
    let (cert, key) = s
        .server
        .dev_ca()
        .issue_client("ivan", &["system:authenticated"])
        .unwrap();
    assert_eq!(
        client(&s.server, Some((cert, key)))
            .get("/version", &[])
            .await
            .status,
        200
    );
    let review = s.fake.reviews.lock().unwrap().last().cloned().unwrap();
    assert_eq!(review["user"], "ivan");
    assert_eq!(
        review["groups"],
        serde_json::json!(["system:authenticated"])
    );

    // A bearer token's user gets it too (TokenReview answers with the user's own groups).
    s.fake
        .tokens
        .lock()
        .unwrap()
        .insert("judy-token".into(), ("judy".into(), vec!["farmers".into()]));
    let reply = client(&s.server, None)
        .get("/openapi/v2", &[("Authorization", "Bearer judy-token")])
        .await;
    assert_eq!(reply.status, 200);
    let review = s.fake.reviews.lock().unwrap().last().cloned().unwrap();
    assert_eq!(review["user"], "judy");
    assert_eq!(
        review["groups"],
        serde_json::json!(["farmers", "system:authenticated"])
    );

    // Anonymous callers are never made members: still 401, and no review is sent.
    let before = s.fake.sar_count();
    assert_eq!(
        client(&s.server, None).get("/openapi/v2", &[]).await.status,
        401
    );
    assert_eq!(s.fake.sar_count(), before);
}

#[tokio::test]
async fn client_ca_certificates_authenticate_as_cn_and_o() {
    let s = setup().await;
    s.fake
        .set_policy(|spec| (spec["user"] == "carol", String::new()));
    let (cert, key) = s
        .server
        .dev_ca()
        .issue_client("carol", &["herders"])
        .unwrap();
    let reply = client(&s.server, Some((cert, key))).get(LLAMAS, &[]).await;
    assert_eq!(reply.status, 200);
    let review = s.fake.reviews.lock().unwrap().last().cloned().unwrap();
    assert_eq!(review["user"], "carol");
    assert_eq!(
        review["groups"],
        serde_json::json!(["herders", "system:authenticated"])
    );
}

#[tokio::test]
async fn concurrent_first_requests_share_one_review() {
    let s = setup().await;
    let (cert, key) = s.server.dev_ca().issue_client("gina", &[]).unwrap();
    let gina = client(&s.server, Some((cert, key)));
    let replies = futures::future::join_all((0..32).map(|_| gina.get(LLAMAS, &[]))).await;
    assert!(replies.iter().all(|r| r.status == 200));
    assert_eq!(
        s.fake.sar_count(),
        1,
        "one review for 32 concurrent identical requests"
    );
}

#[tokio::test]
async fn reviews_are_cached_allow_and_deny() {
    let s = setup().await;
    s.fake
        .set_policy(|spec| (spec["resourceAttributes"]["verb"] == "list", String::new()));
    let (cert, key) = s.server.dev_ca().issue_client("dave", &[]).unwrap();
    let dave = client(&s.server, Some((cert, key)));
    for _ in 0..10 {
        assert_eq!(dave.get(LLAMAS, &[]).await.status, 200);
        assert_eq!(dave.get(&format!("{LLAMAS}/dolly"), &[]).await.status, 403);
    }
    assert_eq!(
        s.fake.sar_count(),
        2,
        "one review per distinct request, then the cache answers"
    );
    assert_eq!(
        s.server
            .state
            .auth
            .authz
            .reviews
            .load(std::sync::atomic::Ordering::Relaxed),
        2
    );
}

#[tokio::test]
async fn bearer_tokens_go_through_a_cached_token_review() {
    let s = setup().await;
    s.fake.tokens.lock().unwrap().insert(
        "good-token".into(),
        ("erin".into(), vec!["system:masters".into()]),
    );
    let raw = client(&s.server, None);
    for _ in 0..5 {
        let reply = raw
            .get(LLAMAS, &[("Authorization", "Bearer good-token")])
            .await;
        assert_eq!(reply.status, 200);
    }
    assert_eq!(
        s.fake
            .token_reviews
            .load(std::sync::atomic::Ordering::SeqCst),
        1,
        "cached"
    );
    assert_eq!(
        raw.get(LLAMAS, &[("Authorization", "Bearer bad-token")])
            .await
            .status,
        401
    );
}

#[tokio::test]
async fn standalone_only_the_dev_identity_gets_in() {
    let server = TestServer::start().await;
    let admin = client(&server, Some(server.admin_identity()));
    assert_eq!(admin.get(LLAMAS, &[]).await.status, 200);
    let (cert, key) = server.dev_ca().issue_client("frank", &["farmers"]).unwrap();
    let reply = client(&server, Some((cert, key))).get(LLAMAS, &[]).await;
    assert_eq!(reply.status, 403);
    assert!(reply.json()["message"].as_str().unwrap().starts_with(
        "llamas.farm.example.com is forbidden: User \"frank\" cannot list resource \"llamas\""
    ));
    // A server given a provided certificate never trusts a dev CA: here, nothing is trusted.
    let strict = TestServer::start_with(Options {
        trust_dev_ca: false,
        ..Default::default()
    })
    .await;
    let reply = strict
        .raw(Some(strict.admin_identity()), Alpn::Http1)
        .connect()
        .await;
    if let Ok(mut conn) = reply {
        let status = conn.get(LLAMAS, &[]).await.map(|r| r.status);
        assert!(status.is_err() || status == Ok(401), "{status:?}");
    }
}

#[tokio::test]
async fn the_auth_configmap_is_followed_without_restart() {
    let fake = FakeKube::start().await;
    let (ca_a, _a) = new_ca();
    let (ca_b, _b) = new_ca();
    fake.add(auth_configmap(
        &ca_a.cert_pem,
        &["front-proxy-client"],
        None,
    ));
    let server = TestServer::start_with(Options {
        cluster: Some(fake.client().await),
        follow_configmap: true,
        ..Default::default()
    })
    .await;
    let headers = [
        ("X-Remote-User", "system:kube-aggregator"),
        ("X-Remote-Group", "system:masters"),
    ];
    let via = |ca: &DevCa| {
        client(
            &server,
            Some(ca.issue_client("front-proxy-client", &[]).unwrap()),
        )
    };
    let mut ok = false;
    for _ in 0..100 {
        if try_get(&via(&ca_a), LLAMAS, &headers).await == Some(200) {
            ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(ok, "the ConfigMap's request-header CA is trusted");

    // kube-apiserver rotates its front-proxy CA: the new one is trusted, the old one not.
    fake.add(auth_configmap(
        &ca_b.cert_pem,
        &["front-proxy-client"],
        None,
    ));
    let mut switched = false;
    for _ in 0..100 {
        if try_get(&via(&ca_b), LLAMAS, &headers).await == Some(200) {
            switched = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(switched, "the new CA is trusted without a restart");
    let old = try_get(&via(&ca_a), LLAMAS, &headers).await;
    assert!(
        old.is_none() || old == Some(401),
        "the old CA is no longer trusted: {old:?}"
    );
}

fn serial(der: &[u8]) -> String {
    let (_, cert) = x509_parser::parse_x509_certificate(der).unwrap();
    cert.raw_serial_as_string()
}

#[tokio::test]
async fn serving_certificate_rotates_live() {
    let server = TestServer::start().await;
    tokio::spawn(
        server
            .serving
            .clone()
            .reload_loop(Duration::from_millis(100)),
    );
    let raw = client(&server, Some(server.admin_identity()));
    let mut old = raw.connect().await.unwrap();
    assert_eq!(old.get(LLAMAS, &[]).await.unwrap().status, 200);
    let before = serial(&old.server_cert);

    // A Secret update: new cert and key land in the files.
    let (cert, key) = server
        .dev_ca()
        .issue_serving(farm_apiserver::certs::DEV_SANS)
        .unwrap();
    std::fs::write(server.dir.path().join("tls.key"), key).unwrap();
    std::fs::write(server.dir.path().join("tls.crt"), cert).unwrap();
    let mut after = before.clone();
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let fresh = raw.connect().await.unwrap();
        after = serial(&fresh.server_cert);
        if after != before {
            break;
        }
    }
    assert_ne!(after, before, "new handshakes get the new certificate");
    // The kept-alive connection from before still works.
    let reply = old.get(LLAMAS, &[]).await.unwrap();
    assert_eq!(reply.status, 200);
    let list: Value = reply.json();
    assert_eq!(list["kind"], "LlamaList");
}
