//! End to end over the real TLS listener: kube::Client, kubectl with the generated kubeconfig, and
//! a raw HTTPS client replaying kube-apiserver's aggregator requests header for header.

use crate::common;

use std::{process::Stdio, time::Duration};

use aggregated_apiserver::resource::VersionOf;
use common::{Alpn, TestServer, TestStorage, kubectl, run};
use farm_apiserver::resources::{Llama, LlamaSpec};
use futures::{StreamExt, TryStreamExt};
use kube::{
    Api,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams},
};
use serde_json::{Value, json};

async fn kube_client_crud_and_watch_from_list_resource_version(storage: TestStorage) {
    let Some(server) = TestServer::start_on(storage).await else {
        return;
    };
    let client = server.kube_client().await;
    let api: Api<Llama> = Api::namespaced(client.clone(), "default");

    let dolly = api.get("dolly").await.expect("get dolly");
    assert_eq!(dolly.spec.weight, 31.4);

    let list = api.list(&ListParams::default()).await.expect("list");
    assert_eq!(list.items.len(), 1);
    let rv = list.metadata.resource_version.clone().expect("list rv");

    let mut stream = api
        .watch(&WatchParams::default().timeout(10), &rv)
        .await
        .expect("watch")
        .boxed();

    let created = api
        .create(
            &PostParams::default(),
            &Llama::new(
                "kuzco",
                LlamaSpec {
                    weight: 120.0,
                    height: 1.7,
                },
            ),
        )
        .await
        .expect("create");
    assert!(created.metadata.uid.is_some());
    let patched = api
        .patch(
            "kuzco",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"height": 1.9}})),
        )
        .await
        .expect("patch");
    assert_eq!(patched.spec.height, 1.9);
    api.delete("kuzco", &DeleteParams::default())
        .await
        .expect("delete");

    let mut seen = Vec::new();
    while seen.len() < 3 {
        let event = tokio::time::timeout(Duration::from_secs(5), stream.try_next())
            .await
            .expect("event in time")
            .expect("stream ok")
            .expect("stream open");
        match event {
            WatchEvent::Added(l) => seen.push(("ADDED", l.spec.height)),
            WatchEvent::Modified(l) => seen.push(("MODIFIED", l.spec.height)),
            WatchEvent::Deleted(l) => seen.push(("DELETED", l.spec.height)),
            WatchEvent::Bookmark(_) => {}
            WatchEvent::Error(e) => panic!("watch error {e:?}"),
        }
    }
    assert_eq!(seen, [("ADDED", 1.7), ("MODIFIED", 1.9), ("DELETED", 1.9)]);

    let missing = api.get("kuzco").await.expect_err("gone");
    match missing {
        kube::Error::Api(status) => {
            assert_eq!(status.code, 404);
            assert_eq!(status.reason, "NotFound");
        }
        other => panic!("unexpected {other:?}"),
    }

    // All namespaces, as `kubectl get -A` and informers do.
    let all: Api<Llama> = Api::all(client);
    assert_eq!(
        all.list(&ListParams::default())
            .await
            .expect("list all")
            .items
            .len(),
        1
    );
}

#[tokio::test]
async fn watch_resumes_without_gap_bookmarks_and_expires() {
    let server = TestServer::start().await;
    let client = server.kube_client().await;
    let api: Api<Llama> = Api::namespaced(client, "default");
    let rv: u64 = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap()
        .parse()
        .unwrap();
    for i in 0..3 {
        api.create(
            &PostParams::default(),
            &Llama::new(
                &format!("w{i}"),
                LlamaSpec {
                    weight: 1.0,
                    height: 1.0,
                },
            ),
        )
        .await
        .unwrap();
    }
    // Starting from the list's rv replays exactly the three creates, then bookmarks arrive.
    let mut stream = api
        .watch(&WatchParams::default().timeout(5), &rv.to_string())
        .await
        .unwrap()
        .boxed();
    let mut names = Vec::new();
    let mut bookmark = None;
    while bookmark.is_none() {
        match tokio::time::timeout(Duration::from_secs(5), stream.try_next())
            .await
            .expect("in time")
            .unwrap()
            .expect("open")
        {
            WatchEvent::Added(l) => names.push(l.metadata.name.unwrap()),
            WatchEvent::Bookmark(b) => bookmark = Some(b.metadata.resource_version),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(names, ["w0", "w1", "w2"]);
    assert_eq!(bookmark.unwrap(), (rv + 3).to_string());

    // Starting after the second create yields only the third.
    let mut stream = api
        .watch(&WatchParams::default().timeout(2), &(rv + 2).to_string())
        .await
        .unwrap()
        .boxed();
    match stream.try_next().await.unwrap().unwrap() {
        WatchEvent::Added(l) => assert_eq!(l.metadata.name.as_deref(), Some("w2")),
        other => panic!("unexpected {other:?}"),
    }
    // timeoutSeconds ends the stream (bookmarks may come first).
    let end = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match stream.try_next().await {
                Ok(Some(WatchEvent::Bookmark(_))) => continue,
                other => return other,
            }
        }
    })
    .await
    .expect("closed by timeoutSeconds");
    assert!(matches!(end, Ok(None)), "{end:?}");
}

#[tokio::test]
async fn too_old_resource_version_is_410_error_event() {
    use aggregated_apiserver::store::{MemoryStore, memory::MemoryStoreConfig};
    // A tiny event window so "too old" is reachable.
    common::install_crypto();
    let store = MemoryStore::<Llama>::new(MemoryStoreConfig {
        event_window: 2,
        ..Default::default()
    });
    let (options, peer) = common::oneshot_identity();
    let group = aggregated_apiserver::group::ApiGroup::new(farm_apiserver::resources::GROUP)
        .serve::<Llama>(std::sync::Arc::new(store));
    let (state, _shutdown) = aggregated_apiserver::server::AppState::new(group, options).unwrap();
    let app = aggregated_apiserver::server::app(state.clone());
    for i in 0..5 {
        let body = json!({"apiVersion": "farm.example.com/v1alpha", "kind": "Llama", "metadata": {"name": format!("o{i}")}, "spec": {"weight": 1, "height": 1}});
        let request =
            axum::http::Request::post("/apis/farm.example.com/v1alpha/namespaces/default/llamas")
                .extension(peer.clone())
                .header("content-type", "application/json")
                .body(axum::body::Body::from(body.to_string()))
                .unwrap();
        tower::ServiceExt::oneshot(app.clone(), request)
            .await
            .unwrap();
    }
    let request = axum::http::Request::get(
        "/apis/farm.example.com/v1alpha/llamas?watch=true&resourceVersion=1&timeoutSeconds=1",
    )
    .extension(peer)
    .body(axum::body::Body::empty())
    .unwrap();
    let response = tower::ServiceExt::oneshot(app, request).await.unwrap();
    assert_eq!(response.status(), 200);
    let body = http_body_util::BodyExt::collect(response.into_body())
        .await
        .unwrap()
        .to_bytes();
    let event: Value = serde_json::from_slice(body.split(|b| *b == b'\n').next().unwrap()).unwrap();
    assert_eq!(event["type"], "ERROR");
    assert_eq!(event["object"]["kind"], "Status");
    assert_eq!(event["object"]["code"], 410);
    assert_eq!(event["object"]["reason"], "Expired");
    assert!(
        event["object"]["message"]
            .as_str()
            .unwrap()
            .starts_with("too old resource version: 1")
    );
}

async fn watch_list_sends_initial_events_end_bookmark(storage: TestStorage) {
    let Some(server) = TestServer::start_on(storage).await else {
        return;
    };
    let raw = server.raw(Some(server.admin_identity()), Alpn::Http1);
    let reply = raw
        .get(
            "/apis/farm.example.com/v1alpha/llamas?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&timeoutSeconds=1",
            &[],
        )
        .await;
    assert_eq!(reply.status, 200);
    let events: Vec<Value> = reply
        .body
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice(l).unwrap())
        .collect();
    assert_eq!(events[0]["type"], "ADDED");
    assert_eq!(events[0]["object"]["metadata"]["name"], "dolly");
    assert_eq!(events[1]["type"], "BOOKMARK");
    assert_eq!(
        events[1]["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );
    assert_eq!(events[1]["object"]["kind"], "Llama");
}

/// A server behind a front proxy as kube-apiserver runs it: a front-proxy CA with allowed name
/// `front-proxy-client`, and a (fake) cluster answering SubjectAccessReviews. Returns the proxy's
/// client identity.
async fn behind_the_aggregator() -> (
    TestServer,
    std::sync::Arc<common::fake_kube::FakeKube>,
    (String, String),
) {
    let fake = common::fake_kube::FakeKube::start().await;
    let proxy_dir = tempfile::tempdir().unwrap();
    let proxy_ca = aggregated_apiserver::net::tls::DevCa::load_or_create(proxy_dir.path()).unwrap();
    let server = TestServer::start_with(common::Options {
        requestheader: Some((proxy_ca.cert_pem.clone(), vec!["front-proxy-client".into()])),
        cluster: Some(fake.client().await),
        ..Default::default()
    })
    .await;
    let identity = proxy_ca.issue_client("front-proxy-client", &[]).unwrap();
    (server, fake, identity)
}

fn fixtures() -> Vec<Value> {
    include_str!("../fixtures/aggregator-requests.jsonl")
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).expect("fixture line"))
        .collect()
}

/// Headers of a recorded request, as sent (Host dropped on HTTP/2, where :authority carries it).
fn recorded_headers(entry: &Value, alpn: Alpn) -> Vec<(String, String)> {
    entry["headers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| {
            (
                h[0].as_str().unwrap().to_owned(),
                h[1].as_str().unwrap().to_owned(),
            )
        })
        .filter(|(n, _)| !(alpn == Alpn::Http2 && n.eq_ignore_ascii_case("host")))
        .collect()
}

#[tokio::test]
async fn replays_the_aggregators_requests_over_h1_and_h2() {
    // The aggregator's proxy client certificate (kubeadm names it front-proxy-client).
    let (server, fake, proxy_identity) = behind_the_aggregator().await;
    for alpn in [Alpn::Http1, Alpn::Http2] {
        let raw = server.raw(Some(proxy_identity.clone()), alpn);
        for entry in fixtures() {
            let headers = recorded_headers(&entry, alpn);
            let headers: Vec<(&str, &str)> = headers
                .iter()
                .map(|(n, v)| (n.as_str(), v.as_str()))
                .collect();
            let path = entry["path"].as_str().unwrap();
            let reply = raw.get(path, &headers).await;
            assert_eq!(
                reply.status,
                200,
                "{alpn:?} {path}: {}",
                String::from_utf8_lossy(&reply.body)
            );
            let accept = headers
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case("accept"))
                .map(|(_, v)| *v)
                .unwrap_or("");
            if path == "/healthz" {
                assert_eq!(&reply.body[..], b"ok");
                continue;
            }
            let body = reply.json();
            match path {
                "/apis" => {
                    assert_eq!(
                        reply.header("content-type"),
                        Some(
                            "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
                        )
                    );
                    assert_eq!(body["items"][0]["versions"][0]["freshness"], "Current");
                }
                "/apis/farm.example.com/v1alpha" => {
                    assert_eq!(body["groupVersion"], "farm.example.com/v1alpha")
                }
                "/openapi/v2" => {
                    assert!(body["definitions"]["com.example.farm.v1alpha.Llama"].is_object())
                }
                "/openapi/v3" => assert!(
                    body["paths"]["apis/farm.example.com/v1alpha"]["serverRelativeURL"]
                        .as_str()
                        .unwrap()
                        .contains("?hash=")
                ),
                _ if accept.contains("as=Table") => {
                    assert_eq!(body["kind"], "Table", "{path}");
                    assert_eq!(body["rows"][0]["cells"][0], "dolly");
                }
                _ => assert!(
                    body["kind"] == "LlamaList" || body["kind"] == "Llama",
                    "{path}: {body}"
                ),
            }
        }
    }
    // Requests of users outside system:masters were reviewed with the headers' identity;
    // system:masters (the availability probe, lab-admin) needed no review.
    let reviews = fake.reviews.lock().unwrap().clone();
    assert!(!reviews.is_empty());
    assert!(
        reviews.iter().all(|r| !r["groups"]
            .as_array()
            .unwrap()
            .iter()
            .any(|g| g == "system:masters")),
        "system:masters needs no review: {reviews:?}"
    );
    let bob = reviews
        .iter()
        .find(|r| r["user"] == "bob")
        .expect("bob's list was reviewed");
    assert_eq!(bob["resourceAttributes"]["verb"], "list");
    assert_eq!(bob["resourceAttributes"]["resource"], "llamas");
    assert_eq!(bob["resourceAttributes"]["namespace"], "default");
    assert!(
        bob["extra"]["authentication.kubernetes.io/credential-id"][0]
            .as_str()
            .unwrap()
            .starts_with("X509SHA256=")
    );
    let openapi = reviews
        .iter()
        .find(|r| r["nonResourceAttributes"]["path"] == "/openapi/v2")
        .expect("the aggregator's OpenAPI download was authorized");
    assert_eq!(openapi["nonResourceAttributes"]["verb"], "get");
}

const AGGREGATOR: (&str, &str) = ("X-Remote-User", "system:kube-aggregator");
const MASTERS: (&str, &str) = ("X-Remote-Group", "system:masters");
const OPENAPI_USER: (&str, &str) = ("X-Remote-User", "system:aggregator");

#[tokio::test]
async fn availability_probe_discovery_etag_and_openapi() {
    let (server, _fake, proxy_identity) = behind_the_aggregator().await;
    let raw = server.raw(Some(proxy_identity), Alpn::Http2);
    let probe_headers = [
        ("User-Agent", "Go-http-client/1.1"),
        ("X-Remote-Group", "system:masters"),
        ("X-Remote-User", "system:kube-aggregator"),
        ("Accept-Encoding", "gzip"),
    ];
    // The availability controller's 5 parallel discovery GETs: every one must be 2xx.
    let probes = futures::future::join_all(
        (0..5).map(|_| raw.get("/apis/farm.example.com/v1alpha", &probe_headers)),
    )
    .await;
    for reply in &probes {
        assert_eq!(reply.status, 200);
        assert_eq!(reply.json()["kind"], "APIResourceList");
    }
    let accept = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList";
    let first = raw
        .get(
            "/apis",
            &[
                ("Accept", accept),
                ("X-Remote-User", "system:kube-aggregator"),
                ("X-Remote-Group", "system:masters"),
            ],
        )
        .await;
    assert_eq!(first.status, 200);
    let etag = first.header("etag").unwrap().to_owned();
    let second = raw
        .get(
            "/apis",
            &[
                ("Accept", accept),
                ("If-None-Match", &etag),
                AGGREGATOR,
                MASTERS,
            ],
        )
        .await;
    assert_eq!(second.status, 304);
    assert_eq!(second.header("etag"), Some(etag.as_str()));

    let v2 = raw
        .get(
            "/openapi/v2",
            &[
                ("Accept", "application/json"),
                ("X-Remote-User", "system:aggregator"),
            ],
        )
        .await;
    assert_eq!(v2.status, 200);
    let v2_etag = v2.header("etag").unwrap().to_owned();
    assert_eq!(
        raw.get("/openapi/v2", &[("If-None-Match", &v2_etag), OPENAPI_USER])
            .await
            .status,
        304
    );

    let root = raw.get("/openapi/v3", &[OPENAPI_USER]).await.json();
    let url = root["paths"]["apis/farm.example.com/v1alpha"]["serverRelativeURL"]
        .as_str()
        .unwrap()
        .to_owned();
    let doc = raw.get(&url, &[OPENAPI_USER]).await;
    assert_eq!(doc.status, 200);
    assert_eq!(doc.header("cache-control"), Some("public, immutable"));
    assert!(doc.header("expires").is_some());
    let doc_json = doc.json();
    let schema = &doc_json["components"]["schemas"]["com.example.farm.v1alpha.Llama"];
    assert_eq!(
        schema["x-kubernetes-group-version-kind"][0]["kind"],
        "Llama"
    );
    let stale = raw
        .get(
            "/openapi/v3/apis/farm.example.com/v1alpha?hash=DEADBEEF",
            &[OPENAPI_USER],
        )
        .await;
    assert_eq!(stale.status, 301);
    assert_eq!(stale.header("location"), Some(url.as_str()));
}

#[tokio::test]
async fn http2_and_http1_are_both_negotiated() {
    let server = TestServer::start().await;
    for alpn in [Alpn::Http1, Alpn::Http2] {
        let reply = server
            .raw(Some(server.admin_identity()), alpn)
            .get(
                "/apis/farm.example.com/v1alpha/namespaces/default/llamas/dolly",
                &[],
            )
            .await;
        assert_eq!(reply.status, 200, "{alpn:?}");
    }
}

mod kubectl;
