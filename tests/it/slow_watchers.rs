//! Watchers that stop reading, over the real TLS listener: each is ended once it falls a
//! buffer behind (as kube-apiserver's cacher ends it), on HTTP/1.1 and on an HTTP/2 stream
//! whose connection's other stream keeps reading; writes, GETs and the other watcher go on
//! meanwhile, and the server counts the ended watchers in `/metrics`.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::{Request, Response, body::Incoming};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::common::{Alpn, RawClient, TestServer, fixtures::llama};
use farm_apiserver::resources::Llama;

const LLAMAS: &str = "/apis/farm.example.com/v1/namespaces/default/llamas";

/// The events in `body` so far: (type, resourceVersion) of each whole line.
fn events(body: &[u8]) -> Vec<(String, u64)> {
    body.split(|b| *b == b'\n')
        .filter(|line| !line.is_empty())
        .filter_map(|line| serde_json::from_slice::<Value>(line).ok())
        .map(|event| {
            let rv = event["object"]["metadata"]["resourceVersion"]
                .as_str()
                .and_then(|rv| rv.parse().ok())
                .unwrap_or_default();
            (event["type"].as_str().unwrap_or_default().to_owned(), rv)
        })
        .collect()
}

/// Reads `response` to its end (or for `limit`): its bytes, and whether it ended.
async fn drain(response: Response<Incoming>, limit: Duration) -> (Vec<u8>, bool) {
    let mut body = response.into_body();
    let mut bytes = Vec::new();
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(deadline, body.frame()).await {
            Err(_) => return (bytes, false),
            Ok(None) => return (bytes, true),
            Ok(Some(Err(e))) => panic!("the watch failed instead of ending: {e}"),
            Ok(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    bytes.extend_from_slice(data);
                }
            }
        }
    }
}

fn watch_request(port: u16, rv: &str, h2: bool) -> Request<Empty<Bytes>> {
    let path = format!("{LLAMAS}?watch=1&resourceVersion={rv}&fieldSelector=metadata.name%3Dbig");
    let uri = if h2 {
        format!("https://localhost:{port}{path}")
    } else {
        path
    };
    let mut request = Request::get(uri);
    if !h2 {
        request = request.header("Host", format!("localhost:{port}"));
    }
    request.body(Empty::new()).expect("request")
}

/// Merge-patches the Llama `big` with an annotation of about 100 KB (the `i`th); its new
/// resourceVersion.
async fn patch_100_kb(llamas: &Api<Llama>, i: usize) -> u64 {
    let blob = format!("{i:06}").repeat(100 * 1024 / 6);
    let patch = json!({"metadata": {"annotations": {"farm.example.com/blob": blob}}});
    let patched = llamas
        .patch("big", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("a write while a watcher is stuck");
    patched
        .metadata
        .resource_version
        .and_then(|rv| rv.parse().ok())
        .expect("rv")
}

/// Waits (up to 30 s) for the reading watcher to reach the last write, then checks it saw
/// every one, in order.
async fn sees_every_write(seen: &Mutex<Vec<u64>>, written: &[u64]) {
    let last = written.last().copied();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while seen.lock().expect("seen").last().copied() != last {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the reading watcher is stuck too"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        *seen.lock().expect("seen"),
        written,
        "a watcher reading sees every write, in order"
    );
}

async fn terminated_watchers(raw: &RawClient) -> u64 {
    let metrics = raw.get("/metrics", &[]).await;
    let text = String::from_utf8_lossy(&metrics.body).into_owned();
    text.lines()
        .find(|l| {
            l.starts_with("apiserver_terminated_watchers_total{")
                && l.contains(r#"group="farm.example.com""#)
                && l.contains(r#"resource="llamas""#)
        })
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0)
}

#[tokio::test]
async fn watchers_that_stop_reading_are_ended_and_nothing_else_waits() {
    let server = TestServer::start().await;
    let identity = Some(server.admin_identity());
    let h1 = server.raw(identity.clone(), Alpn::Http1);
    let h2 = server.raw(identity, Alpn::Http2);
    let port = server.addr.port();
    let llamas: Api<Llama> = Api::namespaced(server.kube_client().await, "default");
    let created = llamas
        .create(&PostParams::default(), &llama("big").build())
        .await
        .expect("create");
    let rv0 = created.metadata.resource_version.expect("rv");

    // HTTP/1.1: a watch whose connection is never read from again.
    let (mut h1_sender, conn) = hyper::client::conn::http1::handshake(h1.tls_stream().await)
        .await
        .expect("h1 handshake");
    tokio::spawn(conn);
    let stuck_h1 = h1_sender
        .send_request(watch_request(port, &rv0, false))
        .await
        .expect("h1 watch");
    assert_eq!(stuck_h1.status(), 200);

    // HTTP/2: one connection (a small stream window, a large connection window, as Go's
    // client), one stream never read, another read throughout.
    let (h2_sender, conn) =
        hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
            .adaptive_window(false)
            .initial_stream_window_size(64 * 1024)
            .initial_connection_window_size(1 << 30)
            .handshake(h2.tls_stream().await)
            .await
            .expect("h2 handshake");
    tokio::spawn(conn);
    let stuck_h2 = h2_sender
        .clone()
        .send_request(watch_request(port, &rv0, true))
        .await
        .expect("h2 watch");
    assert_eq!(stuck_h2.status(), 200);
    let reading = h2_sender
        .clone()
        .send_request(watch_request(port, &rv0, true))
        .await
        .expect("h2 watch");
    assert_eq!(reading.status(), 200);
    let seen = Arc::new(Mutex::new(Vec::<u64>::new()));
    let reader = tokio::spawn({
        let seen = seen.clone();
        async move {
            let mut body = reading.into_body();
            let mut buf = Vec::new();
            while let Some(Ok(frame)) = body.frame().await {
                if let Some(data) = frame.data_ref() {
                    buf.extend_from_slice(data);
                }
                let whole = buf.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
                let lines: Vec<u8> = buf.drain(..whole).collect();
                let mut seen = seen.lock().expect("seen");
                seen.extend(events(&lines).into_iter().map(|(_, rv)| rv));
            }
        }
    });

    // Large writes until both stuck watchers are ended; a GET and a small write after each.
    let mut written = Vec::new();
    let mut ended = 0;
    for i in 0..2000 {
        written.push(patch_100_kb(&llamas, i).await);
        let got = h1.get(&format!("{LLAMAS}/big"), &[]).await;
        assert_eq!(got.status, 200, "a GET while watchers are stuck");
        if i % 20 == 19 {
            ended = terminated_watchers(&h1).await;
            if ended >= 2 {
                break;
            }
        }
    }
    eprintln!(
        "{ended} stuck watchers ended after {} writes of 100 KB",
        written.len()
    );
    assert_eq!(
        ended,
        2,
        "both stuck watchers ended after {} writes of 100 KB",
        written.len()
    );

    // The stream read throughout, on the stuck stream's connection, saw every write in order.
    sees_every_write(&seen, &written).await;
    reader.abort();

    // Once they read again, the stuck watchers get what was already on its way, then the end:
    // not the backlog.
    for (name, stuck) in [("HTTP/1.1", stuck_h1), ("HTTP/2", stuck_h2)] {
        let (body, ended) = drain(stuck, Duration::from_secs(30)).await;
        let got: Vec<u64> = events(&body).into_iter().map(|(_, rv)| rv).collect();
        eprintln!("the {name} watcher got {} events, then its end", got.len());
        assert!(ended, "the {name} watcher ended");
        assert!(
            got.len() < written.len(),
            "the {name} watcher got {} of {} events: the backlog, not an end",
            got.len(),
            written.len()
        );
        assert_eq!(
            got,
            written[..got.len()],
            "the {name} watcher's events before its end are in order, no gap"
        );
        assert!(got.last() != written.last());
    }
}

/// Through a real kube-apiserver (FARM_E2E_KUBECONFIG): a client's watch that stops reading,
/// proxied by the aggregator, is ended here once kube-apiserver stops taking its events, while
/// the same client's other watch and its writes go on; when it reads again it gets what was on
/// its way, then the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_that_stops_reading_through_kube_apiserver_is_ended() {
    use crate::e2e_cluster::{Cluster, ONE_AT_A_TIME, etcd_from_env, register};
    use futures::StreamExt;
    use kube::api::WatchParams;
    let Some(cluster) = Cluster::from_env() else {
        return;
    };
    let _one = ONE_AT_A_TIME.lock().await;
    let started = std::time::Instant::now();
    let step = |what: &str| eprintln!("[{:>5.1}s] {what}", started.elapsed().as_secs_f64());
    let etcd = etcd_from_env().await;
    let (server, installed) = register(&cluster, Vec::new(), etcd.as_ref(), &[], &step).await;
    let ns = installed.namespace.clone();
    let client = cluster.client().await;
    let llamas: Api<Llama> = Api::namespaced(client.clone(), &ns);
    let created = llamas
        .create(&PostParams::default(), &llama("big").namespace(&ns).build())
        .await
        .expect("create through kube-apiserver");
    let rv0 = created.metadata.resource_version.expect("rv");

    step("a watch that is never read, and one that is");
    let path = format!(
        "/apis/farm.example.com/v1/namespaces/{ns}/llamas?watch=1&resourceVersion={rv0}&fieldSelector=metadata.name%3Dbig"
    );
    let stuck = client
        .send(
            http::Request::get(&path)
                .body(kube::client::Body::empty())
                .expect("request"),
        )
        .await
        .expect("watch through kube-apiserver");
    assert_eq!(stuck.status(), 200);
    let seen = Arc::new(Mutex::new(Vec::<u64>::new()));
    let reader = tokio::spawn({
        let seen = seen.clone();
        let llamas = llamas.clone();
        let rv0 = rv0.clone();
        async move {
            let params = WatchParams::default()
                .fields("metadata.name=big")
                .timeout(290);
            let mut events = llamas.watch(&params, &rv0).await.expect("watch").boxed();
            while let Some(Ok(event)) = events.next().await {
                if let kube::core::WatchEvent::Modified(l) = event
                    && let Some(rv) = l.metadata.resource_version.and_then(|rv| rv.parse().ok())
                {
                    seen.lock().expect("seen").push(rv);
                }
            }
        }
    });

    step("writes of 100 KB through kube-apiserver until the server ends the stuck watcher");
    let mut written = Vec::new();
    let mut ended = false;
    for i in 0..3000 {
        written.push(patch_100_kb(&llamas, i).await);
        while let Ok(line) = server.lines.try_recv() {
            if line.contains("ended a watcher that fell further behind") {
                ended = true;
            }
        }
        if ended {
            break;
        }
    }
    step(&format!("ended: {ended}, after {} writes", written.len()));
    assert!(
        ended,
        "the stuck watcher was not ended after {} writes",
        written.len()
    );

    sees_every_write(&seen, &written).await;
    reader.abort();

    step("the stuck watcher reads again: what was on its way, then the end");
    let mut body = stuck.into_body();
    let mut bytes = Vec::new();
    let end = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(frame) = body.frame().await {
            match frame {
                Ok(frame) => {
                    if let Some(data) = frame.data_ref() {
                        bytes.extend_from_slice(data);
                    }
                }
                Err(e) => panic!("the watch failed instead of ending: {e}"),
            }
        }
    })
    .await;
    let got: Vec<u64> = events(&bytes).into_iter().map(|(_, rv)| rv).collect();
    step(&format!(
        "it got {} of {} events, then its end",
        got.len(),
        written.len()
    ));
    assert!(end.is_ok(), "the stuck watcher's stream did not end");
    assert!(got.len() < written.len(), "it got the backlog, not an end");
    assert_eq!(got, written[..got.len()], "in order, no gap");
    drop(installed);
    drop(server);
}

/// A watcher with events already waiting gets them in one chunk (one TLS record and one write
/// on HTTP/1.1), up to 32 KiB and a line, never waiting for more: the initial events of 200
/// Llamas arrive in a few chunks, each whole lines, none far over the bound, and all of them.
#[tokio::test]
async fn waiting_events_go_out_together() {
    use crate::common::oneshot;
    let app = oneshot::app();
    for i in 0..200 {
        let reply =
            oneshot::create(&app, "default", &oneshot::llama(&format!("l{i}"), 1.0, 1.0)).await;
        assert_eq!(reply.status, 201);
    }
    let uri = format!(
        "{LLAMAS}?watch=true&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan&timeoutSeconds=5"
    );
    let response = oneshot::open(&app, &uri, &[]).await;
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    let (mut chunks, mut lines) = (Vec::new(), 0);
    // 201 Llamas (dolly is there from the start) and the initial-events-end bookmark.
    while lines < 202 {
        let frame = tokio::time::timeout(Duration::from_secs(5), body.frame())
            .await
            .expect("events in time")
            .expect("the watch is open")
            .unwrap();
        let chunk = frame.into_data().unwrap();
        assert!(chunk.ends_with(b"\n"), "whole lines");
        lines += chunk.iter().filter(|b| **b == b'\n').count();
        chunks.push(chunk.len());
    }
    assert_eq!(lines, 202);
    let largest = chunks.iter().max().copied().unwrap_or(0);
    assert!(
        chunks.len() < 20 && largest < 32 * 1024 + 4096,
        "{} chunks for 202 events: {chunks:?}",
        chunks.len()
    );
}
