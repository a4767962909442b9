//! FarmPods over the real TLS listener, fed by a real kube-runtime watcher talking to a fake
//! kube-apiserver: kube::Api<FarmPod>, kubectl, zero upstream requests per FarmPod request,
//! readiness, and survival of upstream failures.

use crate::common;

use std::{sync::Arc, time::Duration};

use aggregated_apiserver::store::ClusterSource;
use common::{
    Alpn, Options, TestServer,
    fake_kube::{FakeKube, pod},
    kubectl, run,
};
use farm_apiserver::resources::FarmPod;
use futures::{StreamExt, TryStreamExt};
use kube::{
    Api,
    api::{ListParams, WatchEvent, WatchParams},
};

async fn wait_until<F: Fn() -> bool>(what: &str, f: F) {
    for _ in 0..200 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("timed out waiting for {what}");
}

async fn ready_server(fake: &Arc<FakeKube>) -> TestServer {
    let cache = ClusterSource::<FarmPod>::start(fake.client().await, Vec::new());
    let server = TestServer::start_with(Options {
        farmpods: Some(cache.clone()),
        ..Default::default()
    })
    .await;
    wait_until("the FarmPod cache to sync", || {
        matches!(
            cache.state(),
            aggregated_apiserver::store::CacheState::Synced { .. }
        )
    })
    .await;
    server
}

#[tokio::test]
async fn farmpods_are_served_from_the_cache_with_no_upstream_request_each() {
    let fake = FakeKube::start().await;
    fake.add(pod("shop", "web-1", &[("app", "web")], 2));
    fake.add(pod("shop", "db-1", &[("app", "db")], 1));
    fake.add(pod("farm", "barn", &[("app", "web")], 3));
    let server = ready_server(&fake).await;
    let client = server.kube_client().await;
    let shop: Api<FarmPod> = Api::namespaced(client.clone(), "shop");
    let all: Api<FarmPod> = Api::all(client);

    let upstream_before = fake.requests();
    for _ in 0..20 {
        let list = all.list(&ListParams::default()).await.unwrap();
        assert_eq!(list.items.len(), 3);
        let web = shop.get("farm-web-1").await.unwrap();
        assert_eq!(web.spec.containers, 2);
        let status = web.status.unwrap();
        assert_eq!((status.ready_containers, status.restarts), (2, 2));
        assert_eq!(status.node_name.as_deref(), Some("node-a"));
        assert_eq!(web.metadata.labels.unwrap()["app"], "web");
        assert!(web.metadata.creation_timestamp.is_some());
        let selected = all
            .list(&ListParams::default().labels("app=web"))
            .await
            .unwrap();
        let mut names: Vec<String> = selected
            .items
            .into_iter()
            .map(|p| p.metadata.name.unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["farm-barn", "farm-web-1"]);
        let by_name = all
            .list(&ListParams::default().fields("metadata.name=farm-db-1"))
            .await
            .unwrap();
        assert_eq!(by_name.items.len(), 1);
    }
    // The same FarmPods at v1alpha (the group's first version), converted from the cache's v1.
    let at_v1alpha: Api<farm_apiserver::resources::farmpod::v1alpha::FarmPod> =
        Api::namespaced(server.kube_client().await, "shop");
    let web = at_v1alpha.get("farm-web-1").await.unwrap();
    assert_eq!(web.spec.containers, 2);
    assert_eq!(web.status.unwrap().node_name.as_deref(), Some("node-a"));
    assert_eq!(
        at_v1alpha
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        2
    );
    // Watch connections the cache holds are not per-request; count requests only.
    assert_eq!(
        fake.requests(),
        upstream_before,
        "FarmPod requests must not reach kube-apiserver"
    );

    let missing = shop.get("farm-nope").await.unwrap_err();
    assert!(
        matches!(missing, kube::Error::Api(ref s) if s.code == 404),
        "{missing:?}"
    );
}

#[tokio::test]
async fn farmpod_watch_follows_pod_events_and_pages_work() {
    let fake = FakeKube::start().await;
    for i in 0..5 {
        fake.add(pod("shop", &format!("p{i}"), &[], 1));
    }
    let server = ready_server(&fake).await;
    let api: Api<FarmPod> = Api::namespaced(server.kube_client().await, "shop");
    let first = api.list(&ListParams::default().limit(2)).await.unwrap();
    assert_eq!(first.items.len(), 2);
    assert_eq!(first.metadata.remaining_item_count, Some(3));
    let rest = api
        .list(
            &ListParams::default()
                .limit(10)
                .continue_token(first.metadata.continue_.as_deref().unwrap()),
        )
        .await
        .unwrap();
    assert_eq!(rest.items.len(), 3);

    let rv = first.metadata.resource_version.unwrap();
    let mut stream = api
        .watch(&WatchParams::default().timeout(10), &rv)
        .await
        .unwrap()
        .boxed();
    fake.add(pod("shop", "new", &[("app", "new")], 4));
    fake.delete("shop", "p0");
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let event = tokio::time::timeout(Duration::from_secs(5), stream.try_next())
            .await
            .expect("event in time")
            .unwrap()
            .unwrap();
        match event {
            WatchEvent::Added(p) => seen.push(format!(
                "ADDED {} {}",
                p.metadata.name.unwrap(),
                p.spec.containers
            )),
            WatchEvent::Deleted(p) => seen.push(format!("DELETED {}", p.metadata.name.unwrap())),
            WatchEvent::Bookmark(_) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(seen, ["ADDED farm-new 4", "DELETED farm-p0"]);
}

#[tokio::test]
async fn farmpods_are_read_only_and_advertised_so() {
    let fake = FakeKube::start().await;
    let server = ready_server(&fake).await;
    let raw = server.raw(Some(server.admin_identity()), Alpn::Http2);
    let discovery = raw.get("/apis/farm.example.com/v1alpha", &[]).await.json();
    let farmpods = discovery["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "farmpods")
        .expect("farmpods advertised")
        .clone();
    assert_eq!(
        farmpods["verbs"],
        serde_json::json!(["get", "list", "watch"])
    );
    assert_eq!(farmpods["kind"], "FarmPod");
    let body = serde_json::json!({"apiVersion": "farm.example.com/v1alpha", "kind": "FarmPod", "metadata": {"name": "farm-x"}, "spec": {"containers": 1}}).to_string();
    for (method, path) in [
        (
            "POST",
            "/apis/farm.example.com/v1alpha/namespaces/shop/farmpods",
        ),
        (
            "PUT",
            "/apis/farm.example.com/v1alpha/namespaces/shop/farmpods/farm-x",
        ),
        (
            "DELETE",
            "/apis/farm.example.com/v1alpha/namespaces/shop/farmpods/farm-x",
        ),
        (
            "PATCH",
            "/apis/farm.example.com/v1alpha/namespaces/shop/farmpods/farm-x",
        ),
    ] {
        let reply = raw
            .send(
                method,
                path,
                &[("content-type", "application/json")],
                Some(body.clone().into_bytes()),
            )
            .await;
        assert_eq!(reply.status, 405, "{method} {path}");
        assert_eq!(reply.json()["reason"], "MethodNotAllowed");
    }
}

#[tokio::test]
async fn without_a_cluster_farmpods_are_503_and_llamas_work() {
    let server = TestServer::start().await;
    let raw = server.raw(Some(server.admin_identity()), Alpn::Http1);
    let reply = raw
        .get("/apis/farm.example.com/v1alpha/farmpods", &[])
        .await;
    assert_eq!(reply.status, 503);
    let status = reply.json();
    assert_eq!(status["reason"], "ServiceUnavailable");
    assert!(
        status["message"].as_str().unwrap().contains("--kubeconfig"),
        "{status}"
    );
    assert_eq!(
        raw.get("/apis/farm.example.com/v1alpha/llamas", &[])
            .await
            .status,
        200
    );
    assert_eq!(
        raw.get("/readyz", &[]).await.status,
        200,
        "Llamas keep the server ready"
    );
}

#[tokio::test]
async fn not_ready_until_synced_then_last_good_view_through_upstream_failures() {
    let fake = FakeKube::start().await;
    fake.add(pod("shop", "web-1", &[], 1));
    fake.fail_next(2);
    let cache = ClusterSource::<FarmPod>::start(fake.client().await, Vec::new());
    let server = TestServer::start_with(Options {
        farmpods: Some(cache.clone()),
        ..Default::default()
    })
    .await;
    let raw = server.raw(Some(server.admin_identity()), Alpn::Http1);
    // The first lists fail: not ready, FarmPods 503, Llamas fine.
    let early = raw
        .get("/apis/farm.example.com/v1alpha/farmpods", &[])
        .await;
    if early.status != 200 {
        assert_eq!(early.status, 503);
        assert_eq!(raw.get("/readyz", &[]).await.status, 500);
        assert!(
            String::from_utf8_lossy(&raw.get("/readyz?verbose", &[]).await.body)
                .contains("[-]farmpod-cache-synced failed")
        );
    }
    // Backoff retries until the list succeeds.
    let mut synced = false;
    for _ in 0..120 {
        if raw
            .get("/apis/farm.example.com/v1alpha/farmpods", &[])
            .await
            .status
            == 200
        {
            synced = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(synced, "the cache recovers from failing lists");
    assert_eq!(raw.get("/readyz", &[]).await.status, 200);

    // Now the upstream breaks: watches cut, requests fail for a while.
    fake.fail_next(2);
    fake.cut_watches();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let during = raw
        .get(
            "/apis/farm.example.com/v1alpha/namespaces/shop/farmpods/farm-web-1",
            &[],
        )
        .await;
    assert_eq!(during.status, 200, "the last good view is served");
    assert_eq!(
        raw.get("/readyz", &[]).await.status,
        200,
        "a broken Pod watch does not make the server unready"
    );

    // Recovery is automatic: a Pod added upstream shows up.
    fake.add(pod("shop", "web-2", &[], 1));
    let mut recovered = false;
    for _ in 0..150 {
        if raw
            .get(
                "/apis/farm.example.com/v1alpha/namespaces/shop/farmpods/farm-web-2",
                &[],
            )
            .await
            .status
            == 200
        {
            recovered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(recovered, "the watch recovers");
    assert_eq!(raw.get("/readyz/farmpod-watch", &[]).await.status, 200);
}

#[tokio::test]
async fn kubectl_get_farmpods() {
    let fake = FakeKube::start().await;
    fake.add(pod("shop", "web-1", &[("app", "web")], 2));
    fake.add(pod("farm", "barn", &[("app", "barn")], 1));
    let server = ready_server(&fake).await;
    let cache = tempfile::tempdir().unwrap();
    let kubeconfig = server.kubeconfig();
    if kubectl(&kubeconfig, cache.path()).is_none() {
        return;
    }
    let k = |args: &[&str]| {
        let mut cmd = kubectl(&kubeconfig, cache.path()).unwrap();
        cmd.args(args);
        cmd
    };
    let (ok, out, err) = run(k(&["get", "farmpods", "-A"]), None).await;
    assert!(ok, "{err}");
    let header: Vec<&str> = out.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "NAMESPACE",
            "NAME",
            "CONTAINERS",
            "READY",
            "STATUS",
            "RESTARTS",
            "AGE"
        ]
    );
    let web = out
        .lines()
        .find(|l| l.contains("farm-web-1"))
        .expect("web row");
    let cells: Vec<&str> = web.split_whitespace().collect();
    assert_eq!(
        &cells[..6],
        ["shop", "farm-web-1", "2", "2/2", "Running", "2"]
    );

    let (ok, out, err) = run(
        k(&["get", "fp", "-A", "-l", "app=barn", "--no-headers"]),
        None,
    )
    .await;
    assert!(ok, "{err}");
    assert_eq!(out.lines().count(), 1);
    assert!(out.contains("farm-barn"));

    let (ok, out, err) = run(k(&["get", "farmpods", "-n", "shop", "-o", "wide"]), None).await;
    assert!(ok, "{err}");
    let header: Vec<&str> = out.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "NAME",
            "CONTAINERS",
            "READY",
            "STATUS",
            "RESTARTS",
            "AGE",
            "NODE",
            "IP"
        ]
    );
    assert!(out.contains("node-a") && out.contains("10.1.2.3"), "{out}");

    // kubectl apply --server-side of a read-only kind, standalone: kubectl reads the OpenAPI
    // v2 document as protobuf first (no PATCH path to take the schema from), then the server
    // answers the patch with its 405, not "failed to download openapi".
    let (ok, yaml, err) = run(
        k(&[
            "get",
            "farmpods.v1.farm.example.com",
            "farm-web-1",
            "-n",
            "shop",
            "-o",
            "yaml",
        ]),
        None,
    )
    .await;
    assert!(ok, "{err}");
    let (ok, _, err) = run(k(&["apply", "--server-side", "-f", "-"]), Some(&yaml)).await;
    assert!(!ok);
    assert!(
        err.contains(
            r#"Error from server (MethodNotAllowed): patch is not supported on resources of kind "farmpods.farm.example.com""#
        ),
        "{err}"
    );

    // -w: the initial rows, then a Pod added upstream appears.
    let mut cmd = k(&["get", "farmpods", "-n", "shop", "-w", "--no-headers"]);
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut rx = common::lines(stdout);
    let first = tokio::time::timeout(Duration::from_secs(20), rx.recv())
        .await
        .unwrap()
        .unwrap();
    assert!(first.contains("farm-web-1"), "{first}");
    fake.add(pod("shop", "web-9", &[("app", "web")], 1));
    let mut found = false;
    for _ in 0..40 {
        match tokio::time::timeout(Duration::from_millis(250), rx.recv()).await {
            Ok(Some(line)) if line.contains("farm-web-9") => {
                found = true;
                break;
            }
            _ => {}
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(found, "kubectl get farmpods -w shows the new Pod");
}

/// The cache's watcher tasks end with it: once the last handle on the FarmPod cache is
/// dropped, its Pod watch is closed (the fake kube-apiserver sees its watch go).
#[tokio::test]
async fn dropping_the_cache_ends_its_watch() {
    use aggregated_apiserver::store::CacheState;
    let fake = FakeKube::start().await;
    let before = fake.open_watches();
    let cache = ClusterSource::<FarmPod>::start(fake.client().await, Vec::new());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !matches!(cache.state(), CacheState::Synced { .. }) || fake.open_watches() <= before {
        assert!(tokio::time::Instant::now() < deadline, "never watched");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(cache);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let mut index = 0;
    while fake.open_watches() > before {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the cache's Pod watch is still open 5 s after the cache was dropped"
        );
        // A watch whose client went away lets its receiver go at the next event.
        index += 1;
        fake.add(pod("shop", &format!("after-{index}"), &[], 1));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// When the upstream Pod watch must relist (kube-apiserver restarted over a compacted etcd:
/// 410 Expired), FarmPods keep answering from the cache until the new list is in, the server
/// stays ready, and a FarmPod watcher is told exactly what changed meanwhile, without a gap
/// and without being ended.
#[tokio::test]
async fn a_relist_keeps_serving_and_tells_watchers_the_difference() {
    let fake = FakeKube::start().await;
    for name in ["web-1", "web-2", "web-3"] {
        fake.add(pod("shop", name, &[("app", "web")], 1));
    }
    let server = ready_server(&fake).await;
    let farmpods: Api<FarmPod> = Api::namespaced(server.kube_client().await, "shop");
    let listed = farmpods.list(&ListParams::default()).await.unwrap();
    let rv = listed.metadata.resource_version.clone().unwrap();
    let mut watch = farmpods
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();

    let lists = || {
        fake.log
            .lock()
            .unwrap()
            .iter()
            .filter(|q| !q.contains("watch=true") && !q.contains("watch=1"))
            .count()
    };
    let lists_before = lists();
    // Meanwhile upstream, unseen by the Pod watch: one Pod gone, one changed, one new.
    fake.compact_with(|apply| {
        apply("DELETED", pod("shop", "web-1", &[("app", "web")], 1));
        apply(
            "MODIFIED",
            pod("shop", "web-2", &[("app", "web"), ("v", "2")], 1),
        );
        apply("ADDED", pod("shop", "web-4", &[("app", "web")], 1));
    });
    let raw = server.raw(Some(server.admin_identity()), Alpn::Http2);
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while seen.len() < 3 {
        // Every read during the relist is answered from the cache.
        let during = raw
            .get(
                "/apis/farm.example.com/v1/namespaces/shop/farmpods/farm-web-3",
                &[],
            )
            .await;
        assert_eq!(during.status, 200, "a FarmPod read during the relist");
        assert_eq!(
            raw.get("/readyz", &[]).await.status,
            200,
            "ready throughout"
        );
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        assert!(
            !left.is_zero(),
            "the relist's changes did not arrive: {seen:?}"
        );
        match tokio::time::timeout(Duration::from_millis(50), watch.try_next()).await {
            Err(_) => continue,
            Ok(Ok(Some(event))) => seen.push(match event {
                WatchEvent::Added(p) => format!("ADDED {}", p.metadata.name.unwrap()),
                WatchEvent::Modified(p) => format!("MODIFIED {}", p.metadata.name.unwrap()),
                WatchEvent::Deleted(p) => format!("DELETED {}", p.metadata.name.unwrap()),
                other => panic!("the watcher got {other:?}"),
            }),
            Ok(other) => panic!("the FarmPod watch ended or failed: {other:?}"),
        }
    }
    assert!(
        lists() > lists_before,
        "the Pods were listed again (410 Expired, not a resumed watch)"
    );
    seen.sort();
    assert_eq!(
        seen,
        [
            "ADDED farm-web-4",
            "DELETED farm-web-1",
            "MODIFIED farm-web-2"
        ],
        "exactly the difference"
    );
    let after = farmpods.list(&ListParams::default()).await.unwrap();
    let names: Vec<_> = after
        .items
        .iter()
        .map(|p| p.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(names, ["farm-web-2", "farm-web-3", "farm-web-4"]);
    let web2 = after
        .items
        .iter()
        .find(|p| p.metadata.name.as_deref() == Some("farm-web-2"));
    assert_eq!(
        web2.and_then(|p| p.metadata.labels.as_ref()?.get("v").cloned()),
        Some("2".to_owned())
    );
}
