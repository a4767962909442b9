//! The bound on requests in flight (#31): past `--max-requests-inflight` and
//! `--max-mutating-requests-inflight` a request is answered kube-apiserver's 429, while a watch
//! opened before keeps streaming, the probes answer and `system:masters` is served.

use crate::common;

use std::time::Duration;

use aggregated_apiserver::resource::VersionOf;
use aggregated_apiserver::server::InflightLimits;
use common::{Alpn, Options, TestServer, fake_kube::FakeKube};
use serde_json::json;

const LLAMAS: &str = "/apis/farm.example.com/v1alpha/namespaces/default/llamas";

fn llama(name: &str) -> Vec<u8> {
    json!({"apiVersion": "farm.example.com/v1alpha", "kind": "Llama",
           "metadata": {"name": name}, "spec": {"weight": 1.0, "height": 1.0}})
    .to_string()
    .into_bytes()
}

/// A kubeconfig for the test server as the client certificate `identity` (cert, key PEM).
fn identity_kubeconfig(server: &TestServer, identity: &(String, String)) -> std::path::PathBuf {
    use base64::Engine;
    let encode = |pem: &str| base64::engine::general_purpose::STANDARD.encode(pem);
    let admin = std::fs::read_to_string(server.kubeconfig()).unwrap();
    let text: String = admin
        .lines()
        .map(|line| {
            let indent = &line[..line.len() - line.trim_start().len()];
            match line.trim_start().split_once(": ") {
                Some(("client-certificate-data", _)) => {
                    format!("{indent}client-certificate-data: {}", encode(&identity.0))
                }
                Some(("client-key-data", _)) => {
                    format!("{indent}client-key-data: {}", encode(&identity.1))
                }
                _ => line.to_owned(),
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    let path = server.dir.path().join("alice.kubeconfig");
    std::fs::write(&path, text).unwrap();
    path
}

/// Requests for `resource` ("": not a resource) answered 429 so far, as `/metrics` counts
/// them.
async fn count_429(admin: &common::RawClient, resource: &str) -> f64 {
    let metrics = admin.get("/metrics", &[]).await;
    let label = format!("resource=\"{resource}\",code=\"429\"");
    String::from_utf8_lossy(&metrics.body)
        .lines()
        .filter(|l| l.starts_with("apiserver_request_total{") && l.contains(&label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn counter(metrics: &str, prefix: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A fake cluster with the namespace `default` that authorizes everyone.
async fn allowing_cluster() -> std::sync::Arc<FakeKube> {
    let fake = FakeKube::start().await;
    fake.add(common::fake_kube::namespace("default", false));
    fake.set_policy(|_| (true, "allowed by the test".into()));
    fake
}

/// A server of `fake` (`options` besides) with one place for each kind of request, holding
/// 40,000 Llamas: a list of them whose client stops reading holds the read-only place.
async fn one_place_each(fake: &FakeKube, options: Options) -> TestServer {
    let server = TestServer::start_with(Options {
        cluster: Some(fake.client().await),
        inflight: InflightLimits {
            read_only: 1,
            mutating: 1,
        },
        ..options
    })
    .await;
    let writes = server.llamas.writable().unwrap();
    for i in 0..40_000 {
        writes
            .create(
                farm_apiserver::resources::Llama::from_stored(
                    &farm_apiserver::resources::llama::synthetic(i),
                ),
                false,
            )
            .await
            .unwrap();
    }
    server
}

#[tokio::test]
async fn past_the_limits_requests_get_429_but_watches_probes_and_masters_do_not() {
    // A validating webhook that takes its time: a create holds its place for as long.
    let fake = allowing_cluster().await;
    let webhook = crate::admission::Webhook::start().await;
    fake.add(crate::admission::validating(
        "slow",
        json!({"clientConfig": webhook.client_config("/validate")}),
    ));
    let server = one_place_each(
        &fake,
        Options {
            webhooks: true,
            ..Default::default()
        },
    )
    .await;
    let alice_identity = server.dev_ca().issue_client("alice", &["farmers"]).unwrap();
    let alice = server.raw(Some(alice_identity.clone()), Alpn::Http1);
    let admin = server.raw(Some(server.admin_identity()), Alpn::Http1);

    // A watch opened before the burst: not counted, and it keeps streaming.
    let watcher = alice.clone();
    let watch = tokio::spawn(async move {
        watcher
            .get(&format!("{LLAMAS}?watch=true&timeoutSeconds=4"), &[])
            .await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Mutating: a create waiting for its webhook holds the one place.
    webhook.answer(|_| json!({"allowed": true}));
    webhook.set_delay(Duration::from_millis(1500));
    let slow_client = alice.clone();
    let slow = tokio::spawn(async move {
        slow_client
            .send(
                "POST",
                LLAMAS,
                &[("content-type", "application/json")],
                Some(llama("slow")),
            )
            .await
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let refused = alice
        .send(
            "POST",
            LLAMAS,
            &[("content-type", "application/json")],
            Some(llama("refused")),
        )
        .await;
    assert_eq!(refused.status, 429);
    // Reads have their own limit.
    assert_eq!(alice.get(&format!("{LLAMAS}/dolly"), &[]).await.status, 200);
    assert_eq!(slow.await.unwrap().status, 201);
    webhook.set_delay(Duration::ZERO);
    let retried = alice
        .send(
            "POST",
            LLAMAS,
            &[("content-type", "application/json")],
            Some(llama("retried")),
        )
        .await;
    assert_eq!(retried.status, 201);

    // Read-only: a list of 40,000 Llamas whose client stops reading holds the one place.
    let (status, held_list) = alice
        .connect()
        .await
        .unwrap()
        .get_and_hold("/apis/farm.example.com/v1alpha/llamas")
        .await;
    assert_eq!(status, 200);
    let refused = alice.get(&format!("{LLAMAS}/dolly"), &[]).await;
    assert_eq!(refused.status, 429);
    assert_eq!(refused.header("retry-after"), Some("1"));
    // No audit policy: no audit ID is made or answered (nothing of the audit log runs).
    assert!(refused.header("audit-id").is_none());
    let status = refused.json();
    assert_eq!(status["reason"], "TooManyRequests");
    assert_eq!(
        status["message"],
        "Too many requests, please try again later."
    );
    assert_eq!(status["details"]["retryAfterSeconds"], 1);
    assert_eq!(status["code"], 429);
    // The held list is in flight, as the gauge says.
    let metrics = admin.get("/metrics", &[]).await;
    let in_flight = counter(
        &String::from_utf8_lossy(&metrics.body),
        "apiserver_current_inflight_requests{request_kind=\"readOnly\"}",
    );
    assert!(in_flight >= 1.0, "{in_flight}");
    // Masters are served; the probes answer.
    assert_eq!(admin.get(&format!("{LLAMAS}/dolly"), &[]).await.status, 200);
    assert_eq!(alice.get("/readyz", &[]).await.status, 200);
    // kubectl and kube-rs, refused while the list holds the place, wait as Retry-After says
    // and retry; the list ends (its client goes) and they are served.
    let refused_before = count_429(&admin, "").await;
    let kubeconfig = identity_kubeconfig(&server, &alice_identity);
    let cache = server.dir.path().join("alice-kubectl-cache");
    let kubectl = common::kubectl(&kubeconfig, &cache).map(|mut cmd| {
        cmd.args(["get", "llama", "dolly", "-o", "name"]);
        tokio::spawn(common::run(cmd, None))
    });
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(&kubeconfig).unwrap(),
        &Default::default(),
    )
    .await
    .unwrap();
    let llamas: kube::Api<farm_apiserver::resources::Llama> =
        kube::Api::default_namespaced(kube::Client::try_from(config).unwrap());
    let kube_rs = tokio::spawn(async move { llamas.get("dolly").await });
    // Both have been refused at least once (kubectl takes a while to start): kube-rs on the
    // Llama, kubectl on its discovery first.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while count_429(&admin, "llamas").await < 2.0
        || (kubectl.is_some() && count_429(&admin, "").await < refused_before + 1.0)
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no 429 for the clients"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(held_list);
    let got = tokio::time::timeout(Duration::from_secs(20), kube_rs)
        .await
        .expect("kube-rs retried in time")
        .unwrap()
        .expect("kube-rs served after retrying");
    assert_eq!(got.metadata.name.as_deref(), Some("dolly"));
    if let Some(kubectl) = kubectl {
        let (ok, out, err) = kubectl.await.unwrap();
        assert!(ok, "{err}");
        // Its discovery met the 429 (the only non-resource requests that could), and it
        // retried.
        assert_eq!(out.trim(), "llama.farm.example.com/dolly");
    }
    assert_eq!(alice.get(&format!("{LLAMAS}/dolly"), &[]).await.status, 200);

    // The watch saw the writes made during the burst.
    let watched = watch.await.unwrap();
    assert_eq!(watched.status, 200);
    let text = String::from_utf8_lossy(&watched.body);
    assert!(text.contains("\"slow\""), "{text}");
    assert!(text.contains("\"retried\""), "{text}");
    assert!(!text.contains("\"refused\""), "{text}");

    // Refusals are counted as kube-apiserver counts them.
    let metrics = admin.get("/metrics", &[]).await;
    let metrics = String::from_utf8_lossy(&metrics.body);
    assert!(
        counter(
            &metrics,
            "apiserver_request_total{verb=\"GET\",resource=\"llamas\",code=\"429\"}"
        ) >= 1.0,
        "{metrics}"
    );
    assert!(
        counter(
            &metrics,
            "apiserver_request_total{verb=\"POST\",resource=\"llamas\",code=\"429\"}"
        ) >= 1.0,
        "{metrics}"
    );
    assert!(metrics.contains("apiserver_current_inflight_requests{request_kind=\"readOnly\"}"));
}

/// A refusal the audit policy takes is audited as kube-apiserver audits its 429s: its two
/// events carry the code, and its `Audit-Id` is answered. A GET answered at once (the fast
/// path) is refused the same way as one that waits.
#[tokio::test]
async fn an_audited_refusal_is_written_and_answers_its_audit_id() {
    let fake = allowing_cluster().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.log");
    let policy = "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: Metadata\n";
    let server = one_place_each(
        &fake,
        Options {
            audit: Some(crate::audit::auditor(policy, &path)),
            ..Default::default()
        },
    )
    .await;
    let alice_identity = server.dev_ca().issue_client("alice", &["farmers"]).unwrap();
    let alice = server.raw(Some(alice_identity), Alpn::Http1);
    // Authorized once, so the next GET of dolly is answered on the fast path.
    assert_eq!(alice.get(&format!("{LLAMAS}/dolly"), &[]).await.status, 200);
    let (status, held_list) = alice
        .connect()
        .await
        .unwrap()
        .get_and_hold("/apis/farm.example.com/v1alpha/llamas")
        .await;
    assert_eq!(status, 200);
    let id = "0b4b4b4b-8b86-4011-b42d-00cf4fc964ff";
    let refused = alice
        .get(&format!("{LLAMAS}/dolly"), &[("audit-id", id)])
        .await;
    assert_eq!(refused.status, 429);
    assert_eq!(refused.header("audit-id"), Some(id));
    let written = crate::audit::events(&path, id, 2).await;
    assert_eq!(
        crate::audit::stages(&written),
        ["RequestReceived", "ResponseComplete"]
    );
    assert_eq!(written[1]["responseStatus"]["code"], 429, "{}", written[1]);
    assert_eq!(written[1]["user"]["username"], "alice");
    assert_eq!(written[1]["verb"], "get");
    drop(held_list);
}

/// A server on etcd with one place for each kind of request and `request_timeout`, and alice's
/// HTTP/2 client; None (SKIPPED printed) without etcd.
async fn on_etcd_with_one_place(
    request_timeout: Duration,
) -> Option<(std::sync::Arc<FakeKube>, TestServer, common::RawClient)> {
    if common::etcd::binary().is_none() {
        println!("SKIPPED: no etcd (see common::etcd)");
        return None;
    }
    let fake = allowing_cluster().await;
    let server = TestServer::start_with(Options {
        cluster: Some(fake.client().await),
        storage: common::TestStorage::Etcd,
        request_timeout,
        inflight: InflightLimits {
            read_only: 1,
            mutating: 1,
        },
        ..Default::default()
    })
    .await;
    let alice = server.dev_ca().issue_client("alice", &["farmers"]).unwrap();
    let alice = server.raw(Some(alice), Alpn::Http2);
    Some((fake, server, alice))
}

#[tokio::test]
async fn a_get_on_etcd_holds_its_place_while_etcd_is_paused_and_metrics_still_answer() {
    let Some((_fake, server, alice)) = on_etcd_with_one_place(Duration::from_secs(60)).await else {
        return;
    };
    let admin = server.raw(Some(server.admin_identity()), Alpn::Http1);
    let dolly = format!("{LLAMAS}/dolly");
    assert_eq!(alice.get(&dolly, &[]).await.status, 200);

    // A consistent GET waits for etcd's revision; etcd paused, it waits in its place.
    let etcd = server.etcd.as_ref().expect("an etcd-backed server");
    etcd.pause();
    let waiting_client = alice.clone();
    let waiting_path = dolly.clone();
    let waiting = tokio::spawn(async move { waiting_client.get(&waiting_path, &[]).await });
    let metrics =
        || async { String::from_utf8_lossy(&admin.get("/metrics", &[]).await.body).into_owned() };
    let in_flight = "apiserver_current_inflight_requests{request_kind=\"readOnly\"}";
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    // A scrape does not wait on etcd either: its object counts are the cache's.
    while counter(
        &tokio::time::timeout(Duration::from_secs(1), metrics())
            .await
            .expect("/metrics answers while etcd is paused"),
        in_flight,
    ) < 1.0
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the waiting GET never took its place"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!waiting.is_finished(), "the GET waits for etcd");
    let refused = alice.get(&format!("{LLAMAS}/nope"), &[]).await;
    assert_eq!(
        refused.status,
        429,
        "{}",
        String::from_utf8_lossy(&refused.body)
    );
    etcd.resume();

    let answered = tokio::time::timeout(Duration::from_secs(20), waiting)
        .await
        .expect("the waiting GET is answered once etcd is back")
        .unwrap();
    assert_eq!(answered.status, 200);
    assert_eq!(answered.json()["metadata"]["name"], "dolly");
    // Its place is given back, and a GET of a missing Llama is a 404 Status.
    let missing = alice.get(&format!("{LLAMAS}/nope"), &[]).await;
    assert_eq!(missing.status, 404);
    assert_eq!(missing.json()["reason"], "NotFound");
    // Counted as any GET: two 200s and a 404 for alice's reads, besides the 429.
    let text = metrics().await;
    let count = |code: &str| {
        counter(
            &text,
            &format!("apiserver_request_total{{verb=\"GET\",resource=\"llamas\",code=\"{code}\"}}"),
        )
    };
    assert_eq!(
        (count("200"), count("404"), count("429")),
        (2.0, 1.0, 1.0),
        "{text}"
    );
    assert_eq!(counter(&text, in_flight), 0.0, "{text}");
}

#[tokio::test]
async fn a_get_on_etcd_past_the_request_timeout_is_504_and_gives_its_place_back() {
    let Some((_fake, server, alice)) = on_etcd_with_one_place(Duration::from_millis(800)).await
    else {
        return;
    };
    let dolly = format!("{LLAMAS}/dolly");
    assert_eq!(alice.get(&dolly, &[]).await.status, 200);

    // etcd paused: the GET's check would wait for etcd's own timeout (5 s); the request
    // timeout ends it first, as kube-apiserver's does.
    let etcd = server.etcd.as_ref().expect("an etcd-backed server");
    etcd.pause();
    let started = std::time::Instant::now();
    let timed_out = alice.get(&dolly, &[]).await;
    let took = started.elapsed();
    etcd.resume();
    assert_eq!(
        timed_out.status,
        504,
        "{}",
        String::from_utf8_lossy(&timed_out.body)
    );
    assert_eq!(timed_out.json()["reason"], "Timeout");
    assert!(took < Duration::from_secs(3), "{took:?}");
    // Its place is free again.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let reply = alice.get(&dolly, &[]).await;
        if reply.status == 200 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never served again: {}",
            reply.status
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
