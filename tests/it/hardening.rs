//! What an attacker or a careless client must not be able to do: panic the server, grow its
//! memory without bound, hold its connections, or lose data. Each test here failed before the
//! fix it names.

use crate::common;

use std::sync::Arc;

use aggregated_apiserver::{
    Result,
    group::ApiGroup,
    recovery,
    resource::ObjectKey,
    server::{self, AppState},
    store::{
        ListRequest, MemoryStore, Object, PageInfo, Preconditions, Store, StoreStats, WatchRequest,
        WatchStream, WritableStore,
    },
};
use async_trait::async_trait;
use axum::http::StatusCode;
use common::{oneshot::*, oneshot_identity};
use farm_apiserver::resources::Llama;
use http_body_util::BodyExt;
use serde_json::{Value, json};

const LLAMAS: &str = "/apis/farm.example.com/v1alpha/namespaces/default/llamas";

/// `?watch=true&timeoutSeconds=18446744073709551615` overflowed the deadline and panicked. As
/// in kube-apiserver (Go's ParseInt into an int64) that is now 400, and the largest timeout an
/// int64 holds is served.
#[tokio::test]
async fn huge_watch_timeouts_are_400_or_served_never_a_panic() {
    let app = app();
    let message = get(
        &app,
        &format!("{LLAMAS}?watch=true&timeoutSeconds=18446744073709551615"),
    )
    .await
    .status(400, "BadRequest");
    assert_eq!(
        message,
        "strconv.ParseInt: parsing \"18446744073709551615\": value out of range"
    );
    let events = watch_events(
        &app,
        &format!("{LLAMAS}?watch=true&timeoutSeconds={}", i64::MAX),
        "application/json",
        1,
    )
    .await;
    assert_eq!(events[0]["type"], "ADDED");
    assert_eq!(events[0]["object"]["metadata"]["name"], "dolly");
}

/// ListOptions are checked as kube-apiserver checks them: a malformed `timeoutSeconds` is 400
/// on a list and on a deletecollection (which deleted before), a parameter given twice takes
/// its first value, and a negative `limit` means no limit.
#[tokio::test]
async fn list_options_as_kube_apiserver_reads_them() {
    let app = app();
    for _ in 0..3 {
        create(
            &app,
            "default",
            &llama(&format!("l{}", rand_suffix()), 1.0, 1.0),
        )
        .await;
    }
    let message = get(&app, &format!("{LLAMAS}?timeoutSeconds=abc"))
        .await
        .status(400, "BadRequest");
    assert_eq!(message, "strconv.ParseInt: parsing \"abc\": invalid syntax");
    let before = get(&app, LLAMAS).await.json()["items"]
        .as_array()
        .unwrap()
        .len();
    call(
        &app,
        "DELETE",
        &format!("{LLAMAS}?timeoutSeconds=abc"),
        &[],
        "",
    )
    .await
    .status(400, "BadRequest");
    assert_eq!(
        get(&app, LLAMAS).await.json()["items"]
            .as_array()
            .unwrap()
            .len(),
        before,
        "nothing was deleted"
    );
    let page = get(&app, &format!("{LLAMAS}?limit=1&limit=3")).await.json();
    assert_eq!(
        page["items"].as_array().unwrap().len(),
        1,
        "the first limit counts"
    );
    let all = get(&app, &format!("{LLAMAS}?limit=-1")).await.json();
    assert_eq!(all["items"].as_array().unwrap().len(), before);
    assert!(all["metadata"].get("continue").is_none());
}

fn rand_suffix() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..8].to_owned()
}

/// A non-ASCII `generateName` over 58 bytes was cut inside a character and panicked; it is a
/// name validation would refuse anyway, so it is refused (422), as kube-apiserver does.
#[tokio::test]
async fn a_long_non_ascii_generate_name_is_invalid_not_a_panic() {
    let app = app();
    for prefix in ["é".repeat(40), format!("a{}", "ü".repeat(29))] {
        let body = json!({
            "apiVersion": "farm.example.com/v1alpha",
            "kind": "Llama",
            "metadata": {"generateName": prefix},
            "spec": {"weight": 1, "height": 1},
        });
        let reply = create(&app, "default", &body.to_string()).await;
        let message = reply.status(422, "Invalid");
        assert!(
            message.contains("metadata.name: Invalid value"),
            "{message}"
        );
    }
    // An ASCII prefix of any length is trimmed to 58 bytes plus 5 random characters.
    let body = json!({
        "apiVersion": "farm.example.com/v1alpha",
        "kind": "Llama",
        "metadata": {"generateName": "g".repeat(80)},
        "spec": {"weight": 1, "height": 1},
    });
    let reply = create(&app, "default", &body.to_string()).await;
    assert_eq!(
        reply.status,
        201,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    let name = reply.json()["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(name.len(), 63);
    assert!(name.starts_with(&"g".repeat(58)));
}

/// Names are DNS-1123 subdomains: up to 253 characters, no 63-character limit per part.
#[tokio::test]
async fn names_follow_is_dns1123_subdomain() {
    let app = app();
    for name in [
        "a".repeat(64),
        format!("{}.{}", "b".repeat(100), "c".repeat(152)),
    ] {
        let reply = create(&app, "default", &llama(&name, 1.0, 1.0)).await;
        assert_eq!(
            reply.status,
            201,
            "{}: {}",
            name.len(),
            String::from_utf8_lossy(&reply.body)
        );
        assert_eq!(get(&app, &format!("{LLAMAS}/{name}")).await.status, 200);
    }
    for name in ["d".repeat(254), "-a".into(), "a..b".into(), "A".into()] {
        let reply = create(&app, "default", &llama(&name, 1.0, 1.0)).await;
        reply.status(422, "Invalid");
    }
}

/// A store that panics on the Llama named `boom`, in its answer without waiting (a cached GET)
/// and in the waiting one (a list in namespace `boom`), and is a memory store otherwise.
struct Panicky(MemoryStore<Llama>);

fn boom(name: &str) {
    if name == "boom" {
        panic!("the store cannot bear {name}");
    }
}

#[async_trait]
impl Store<Llama> for Panicky {
    async fn get(&self, key: &ObjectKey) -> Result<Object<Llama>> {
        boom(&key.name);
        self.0.get(key).await
    }
    fn get_sync(&self, namespace: &str, name: &str) -> Option<Result<Object<Llama>>> {
        boom(name);
        self.0.get_sync(namespace, name)
    }
    async fn list_each(
        &self,
        request: &ListRequest,
        visit: &mut (dyn for<'o> FnMut(&'o Object<Llama>) + Send),
    ) -> Result<PageInfo> {
        boom(request.namespace.as_deref().unwrap_or(""));
        self.0.list_each(request, visit).await
    }
    async fn watch(&self, request: WatchRequest) -> Result<WatchStream<Llama>> {
        self.0.watch(request).await
    }
    async fn stats(&self) -> Result<StoreStats> {
        Store::stats(&self.0).await
    }
    fn writable(&self) -> Option<&dyn WritableStore<Llama>> {
        Some(self)
    }
}

#[async_trait::async_trait]
impl WritableStore<Llama> for Panicky {
    async fn create(&self, object: Llama, dry_run: bool) -> Result<Object<Llama>> {
        self.0.create(object, dry_run).await
    }
    async fn update(&self, object: Llama, dry_run: bool) -> Result<Object<Llama>> {
        self.0.update(object, dry_run).await
    }
    async fn delete(
        &self,
        key: &ObjectKey,
        preconditions: &Preconditions,
        dry_run: bool,
    ) -> Result<Object<Llama>> {
        self.0.delete(key, preconditions, dry_run).await
    }
}

/// A panic in a handler is a 500 Status (kube-apiserver's words), counted, and the server goes
/// on serving: on the path that answers at once and on the one that waits.
#[tokio::test]
async fn a_panicking_handler_is_a_500_and_the_server_serves_on() {
    let (options, peer) = oneshot_identity();
    let group = ApiGroup::new(farm_apiserver::resources::GROUP)
        .serve::<Llama>(Arc::new(Panicky(MemoryStore::default())));
    let (state, _shutdown) = AppState::new(group, options).unwrap();
    let app = App {
        router: server::app(state.clone()),
        peer,
    };
    let before = create(&app, "default", &llama("calm", 1.0, 1.0)).await;
    assert_eq!(before.status, 201);
    for uri in [
        format!("{LLAMAS}/boom"),
        "/apis/farm.example.com/v1alpha/namespaces/boom/llamas".to_owned(),
    ] {
        let reply = get(&app, &uri).await;
        let message = reply.status(500, "InternalError");
        assert_eq!(
            message,
            format!("Internal error occurred: {}", recovery::MESSAGE)
        );
        assert_eq!(get(&app, &format!("{LLAMAS}/calm")).await.status, 200);
    }
    let metrics = String::from_utf8(get(&app, "/metrics").await.body).unwrap();
    assert!(
        metrics.contains("farm_apiserver_request_panics_total 2"),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"apiserver_request_total{verb="GET",resource="llamas",code="500"} 1"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"apiserver_request_total{verb="LIST",resource="llamas",code="500"} 1"#),
        "{metrics}"
    );
}

/// With an audit log, a handler's panic writes kube-apiserver's Panic event (500 "APIServer
/// panic'd") after RequestReceived, on the path that answers at once as on the one that
/// waits; the server serves on.
#[tokio::test]
async fn a_panicking_handler_is_audited() {
    let (mut options, peer) = oneshot_identity();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.log");
    options.audit = Some(crate::audit::auditor(
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: Metadata\n",
        &path,
    ));
    let group = ApiGroup::new(farm_apiserver::resources::GROUP)
        .serve::<Llama>(Arc::new(Panicky(MemoryStore::default())));
    let (state, _shutdown) = AppState::new(group, options).unwrap();
    let app = App {
        router: server::app(state.clone()),
        peer,
    };
    for (uri, id) in [
        (
            format!("{LLAMAS}/boom"),
            "11111111-8b86-4011-b42d-00cf4fc964ff",
        ),
        (
            "/apis/farm.example.com/v1alpha/namespaces/boom/llamas".to_owned(),
            "22222222-8b86-4011-b42d-00cf4fc964ff",
        ),
    ] {
        let reply = call(&app, "GET", &uri, &[("audit-id", id)], "").await;
        assert_eq!(reply.status, 500);
        let written = crate::audit::events(&path, id, 2).await;
        assert_eq!(
            crate::audit::stages(&written),
            ["RequestReceived", "Panic"],
            "{uri}"
        );
        let status = &written[1]["responseStatus"];
        assert_eq!(status["code"], 500);
        assert_eq!(status["message"], "APIServer panic'd");
        assert_eq!(written[1]["user"]["username"], "farm-dev-admin");
    }
    assert_eq!(get(&app, &format!("{LLAMAS}/calm")).await.status, 404);
}

/// The spec is float64 (Kubernetes' `number`), stored and served as sent: a JSON patch `test`
/// of the value a GET shows matches (with f32 it was 31.399999618530273 inside and 422).
#[tokio::test]
async fn json_patch_test_matches_the_value_get_shows() {
    let app = app();
    let shown = get(&app, &format!("{LLAMAS}/dolly")).await.json();
    assert_eq!(shown["spec"]["weight"], json!(31.4));
    let patch = json!([
        {"op": "test", "path": "/spec/weight", "value": shown["spec"]["weight"]},
        {"op": "replace", "path": "/spec/height", "value": 0.1},
    ]);
    let reply = call(
        &app,
        "PATCH",
        &format!("{LLAMAS}/dolly"),
        &[("content-type", "application/json-patch+json")],
        &patch.to_string(),
    )
    .await;
    assert_eq!(
        reply.status,
        200,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    assert_eq!(reply.json()["spec"], json!({"weight": 31.4, "height": 0.1}));
    // Full float64 precision survives a round trip.
    let precise = 0.1 + 0.2;
    let reply = create(&app, "default", &llama("precise", precise, 1e300)).await;
    assert_eq!(reply.status, 201);
    let got = get(&app, &format!("{LLAMAS}/precise")).await.json();
    assert_eq!(got["spec"]["weight"].as_f64(), Some(precise));
    assert_eq!(got["spec"]["height"].as_f64(), Some(1e300));
}

// ---- connections: timeouts and bodies nobody read ----

use common::{Alpn, Options, TestServer, fake_kube::FakeKube};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn short_limits() -> aggregated_apiserver::connection::Limits {
    aggregated_apiserver::connection::Limits {
        header_read: Duration::from_millis(800),
        idle: Duration::from_millis(1200),
        write_stall: Duration::from_millis(800),
    }
}

/// Reads until the server closes the connection (EOF or reset); how long that took and what
/// was read.
async fn until_closed(
    stream: &mut (impl tokio::io::AsyncRead + Unpin),
    within: Duration,
) -> (Duration, Vec<u8>) {
    let started = Instant::now();
    let mut read = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    loop {
        match tokio::time::timeout(within, stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return (started.elapsed(), read),
            Ok(Ok(n)) => read.extend_from_slice(&buf[..n]),
            Err(_) => panic!("the connection was still open after {within:?}"),
        }
    }
}

/// An unauthenticated client that finished the handshake and sends nothing, or sends its
/// headers a byte at a time, is cut off by the header-read timeout (kube-apiserver: 32 s).
#[tokio::test]
async fn silent_and_slowloris_connections_are_closed() {
    let server = TestServer::start_with(Options {
        limits: short_limits(),
        ..Default::default()
    })
    .await;
    let anonymous = server.raw(None, Alpn::Http1);
    let mut silent = anonymous.tls().await;
    let (after, _) = until_closed(&mut silent, Duration::from_secs(5)).await;
    assert!(after >= Duration::from_millis(700), "{after:?}");

    let mut slow = anonymous.tls().await;
    let writer = tokio::spawn(async move {
        let started = Instant::now();
        for byte in b"GET /apis HTTP/1.1\r\nHost: localhost\r\nX-Slow: "
            .iter()
            .cycle()
        {
            if slow.write_all(&[*byte]).await.is_err() || started.elapsed() > Duration::from_secs(5)
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        started.elapsed()
    });
    let cut_after = writer.await.unwrap();
    assert!(
        cut_after < Duration::from_secs(4),
        "slowloris was not cut off: {cut_after:?}"
    );
    // Normal requests were served throughout.
    let admin = server.raw(Some(server.admin_identity()), Alpn::Http2);
    assert_eq!(
        admin
            .get("/apis/farm.example.com/v1alpha", &[])
            .await
            .status,
        200
    );
}

/// An HTTP/2 connection with no request in flight is closed after the idle timeout
/// (kube-apiserver: 90 s), its pings notwithstanding; one with an open watch is not.
#[tokio::test]
async fn idle_http2_connections_are_closed_busy_ones_are_not() {
    let server = TestServer::start_with(Options {
        limits: short_limits(),
        ..Default::default()
    })
    .await;
    let client = server.raw(Some(server.admin_identity()), Alpn::Http2);
    let connect = || async {
        let io = hyper_util::rt::TokioIo::new(client.tls().await);
        let mut builder =
            hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new());
        builder
            .timer(hyper_util::rt::TokioTimer::new())
            .keep_alive_interval(Duration::from_millis(200))
            .keep_alive_while_idle(true);
        let (sender, conn) = builder.handshake(io).await.unwrap();
        (sender, tokio::spawn(conn))
    };
    let request = |path: &str| {
        hyper::Request::get(format!("https://localhost{path}"))
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .unwrap()
    };
    let (mut idle, idle_conn) = connect().await;
    let reply = idle.send_request(request(LLAMAS)).await.unwrap();
    assert_eq!(reply.status(), 200);
    drop(reply);
    let started = Instant::now();
    let _ = tokio::time::timeout(Duration::from_secs(5), idle_conn)
        .await
        .expect("the idle connection was closed");
    assert!(started.elapsed() >= Duration::from_millis(1000));

    // Busy with requests answered at once (a cached GET): not idle either.
    let (mut chatty, chatty_conn) = connect().await;
    for _ in 0..10 {
        let reply = chatty
            .send_request(request(&format!("{LLAMAS}/dolly")))
            .await
            .unwrap();
        assert_eq!(reply.status(), 200);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(
        !chatty_conn.is_finished(),
        "a connection in use is not idle"
    );

    let (mut busy, busy_conn) = connect().await;
    let watch = busy
        .send_request(request(&format!("{LLAMAS}?watch=true&timeoutSeconds=3")))
        .await
        .unwrap();
    assert_eq!(watch.status(), 200);
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(
        !busy_conn.is_finished(),
        "a connection with a watch is not idle"
    );
    drop(watch);
}

/// A graceful stop (SIGTERM after the shutdown delay) closes the listener and the connections
/// that have nothing in flight at once (HTTP/2 with a GOAWAY, HTTP/1.1 after its last
/// response), and those still busy (a watch) at the grace; then the server has stopped.
#[tokio::test]
async fn a_stop_closes_idle_connections_at_once_and_busy_ones_at_the_grace() {
    let mut server = TestServer::start().await;
    let client = server.raw(Some(server.admin_identity()), Alpn::Http2);
    let connect = || async {
        let io = hyper_util::rt::TokioIo::new(client.tls().await);
        let builder =
            hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new());
        let (sender, conn) = builder.handshake(io).await.unwrap();
        (sender, tokio::spawn(conn))
    };
    let request = |path: &str| {
        hyper::Request::get(format!("https://localhost{path}"))
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .unwrap()
    };
    let (mut idle, idle_conn) = connect().await;
    let reply = idle.send_request(request(LLAMAS)).await.unwrap();
    assert_eq!(reply.status(), 200);
    drop(reply);
    let (mut busy, busy_conn) = connect().await;
    let watch = busy
        .send_request(request(&format!("{LLAMAS}?watch=true")))
        .await
        .unwrap();
    assert_eq!(watch.status(), 200);
    let mut kept_alive = server
        .raw(Some(server.admin_identity()), Alpn::Http1)
        .tls()
        .await;
    kept_alive
        .write_all(b"GET /readyz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    let mut head = [0u8; 12];
    kept_alive.read_exact(&mut head).await.unwrap();
    assert_eq!(&head, b"HTTP/1.1 200");

    server.stop_gracefully();
    let started = Instant::now();
    let _ = tokio::time::timeout(Duration::from_millis(700), idle_conn)
        .await
        .expect("the idle HTTP/2 connection closes at once");
    let (after, _) = until_closed(&mut kept_alive, Duration::from_millis(700)).await;
    assert!(after < Duration::from_millis(700), "{after:?}");
    assert!(
        tokio::net::TcpStream::connect(server.addr).await.is_err(),
        "the listener is closed"
    );
    assert!(!busy_conn.is_finished(), "a watch has the grace to end");
    let _ = tokio::time::timeout(Duration::from_secs(3), busy_conn)
        .await
        .expect("the busy connection is closed at the grace");
    let busy_for = started.elapsed();
    assert!(busy_for >= Duration::from_millis(900), "{busy_for:?}");
    drop(watch);
    tokio::time::timeout(Duration::from_secs(2), server.stopped())
        .await
        .expect("stopped after the grace")
        .unwrap();
}

/// A client that asks for a large list and stops reading does not hold its connection, nor
/// what the list pins, past the write timeout.
#[tokio::test]
async fn a_client_that_stops_reading_is_cut_off() {
    let server = TestServer::start_with(Options {
        limits: short_limits(),
        farmpods: Some(farm_apiserver::resources::farmpod::synthetic_view(20_000)),
        ..Default::default()
    })
    .await;
    let client = server.raw(Some(server.admin_identity()), Alpn::Http1);
    let mut stream = client.tls().await;
    stream
        .write_all(
            b"GET /apis/farm.example.com/v1alpha/farmpods HTTP/1.1\r\nHost: localhost\r\n\r\n",
        )
        .await
        .unwrap();
    // Not reading: the server's writes stall on the full socket buffers.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (_, read) = until_closed(&mut stream, Duration::from_secs(5)).await;
    // The list is about 8.6 MB; the kernel's loopback buffers (send and receive, autotuned)
    // hold about 4 MB of it, sometimes a little more.
    assert!(
        read.len() < 6_000_000,
        "the list was cut off, not sent whole: {} bytes",
        read.len()
    );
}

/// A request that takes longer than the request timeout (kube-apiserver: 60 s) is answered
/// 504, here while its SubjectAccessReview is slow.
#[tokio::test]
async fn a_request_past_the_request_timeout_is_504() {
    let fake = FakeKube::start().await;
    fake.delay_reviews(Duration::from_secs(3));
    let server = TestServer::start_with(Options {
        cluster: Some(fake.client().await),
        request_timeout: Duration::from_millis(500),
        ..Default::default()
    })
    .await;
    let (cert, key) = server.dev_ca().issue_client("slowpoke", &[]).unwrap();
    let raw = server.raw(Some((cert, key)), Alpn::Http2);
    let started = Instant::now();
    let reply = raw.get(LLAMAS, &[]).await;
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(reply.status, 504);
    let status = reply.json();
    assert_eq!(status["reason"], "Timeout");
    assert_eq!(status["code"], 504);
}

/// Sends the request line, headers and the whole body before reading, as Python's
/// http.client does (the body in 32 KiB pieces, as a network delivers it); returns the status
/// line the server answered with.
async fn write_all_then_read(client: &common::RawClient, head: &str, body: &[u8]) -> String {
    let mut stream = client.tls().await;
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(b"\r\n").await.unwrap();
    for piece in body.chunks(32 * 1024) {
        tokio::time::timeout(Duration::from_secs(20), stream.write_all(piece))
            .await
            .expect("the server reads the body")
            .expect("the whole body is written: the server did not close on it");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let (_, read) = until_closed(&mut stream, Duration::from_secs(20)).await;
    let text = String::from_utf8_lossy(&read).into_owned();
    text.lines().next().unwrap_or_default().to_owned()
}

/// An early answer (401 before the body is read, 413 after 3 MiB of it) reaches a client that
/// writes its whole body first: the rest of the body is read and discarded, not left to make
/// the kernel reset the connection.
#[tokio::test]
async fn early_errors_reach_clients_that_write_their_whole_body_first() {
    let server = TestServer::start().await;
    let anonymous = server.raw(None, Alpn::Http1);
    let body = vec![b' '; 200 * 1024];
    for _ in 0..5 {
        let line = write_all_then_read(
            &anonymous,
            &format!(
                "POST {LLAMAS} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n",
                body.len()
            ),
            &body,
        )
        .await;
        assert_eq!(line, "HTTP/1.1 401 Unauthorized");
    }
    let admin = server.raw(Some(server.admin_identity()), Alpn::Http1);
    let big = vec![b' '; 4 * 1024 * 1024 - 1024];
    let line = write_all_then_read(
        &admin,
        &format!(
            "POST {LLAMAS} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n",
            big.len()
        ),
        &big,
    )
    .await;
    assert_eq!(line, "HTTP/1.1 413 Payload Too Large");
}

/// Users with many groups behind the aggregator send large header lists: up to 1 MiB is
/// read, over HTTP/2 and HTTP/1.1 (kube-apiserver's MaxHeaderBytes).
#[tokio::test]
async fn header_lists_up_to_a_mebibyte_are_read() {
    let server = TestServer::start().await;
    // HTTP/2: 1,500 headers, 300 KB; HTTP/1.1: 90 headers (hyper's count, 100), 720 KB.
    for (alpn, count, size) in [(Alpn::Http2, 1500, 200), (Alpn::Http1, 90, 8000)] {
        let padding = "x".repeat(size);
        let headers: Vec<(String, String)> = (0..count)
            .map(|i| (format!("x-padding-{i}"), padding.clone()))
            .collect();
        let headers: Vec<(&str, &str)> = headers
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_str()))
            .collect();
        let raw = server.raw(Some(server.admin_identity()), alpn);
        let reply = raw.get(LLAMAS, &headers).await;
        assert_eq!(reply.status, 200, "{alpn:?}");
    }
}

// ---- patches ----

async fn json_patch(app: &App, name: &str, query: &str, patch: &Value) -> Reply {
    call(
        app,
        "PATCH",
        &format!("{LLAMAS}/{name}{query}"),
        &[("content-type", "application/json-patch+json")],
        &patch.to_string(),
    )
    .await
}

/// A 2 KB JSON patch whose copies each double the document (the class of CVE-2019-1002100)
/// took 1.7 GB; copies are now capped at 3 MiB in all, as kube-apiserver caps them, dry run
/// or not, and the Llama is left as it was.
#[tokio::test]
async fn json_patch_copies_are_capped() {
    let app = app();
    let before = get(&app, &format!("{LLAMAS}/dolly")).await.json();
    let mut operations =
        vec![json!({"op": "add", "path": "/zz", "value": {"a": "x".repeat(1024)}})];
    operations
        .extend((0..24).map(|i| json!({"op": "copy", "from": "/zz", "path": format!("/zz/b{i}")})));
    let patch = Value::Array(operations);
    assert!(patch.to_string().len() < 3000);
    for query in ["", "?dryRun=All"] {
        let reply = json_patch(&app, "dolly", query, &patch).await;
        let message = reply.status(422, "Invalid");
        assert!(
            message
                .contains("Unable to complete the copy, the accumulated size increase of copy is")
                && message.contains("exceeding the limit 3145728"),
            "{message}"
        );
    }
    assert_eq!(get(&app, &format!("{LLAMAS}/dolly")).await.json(), before);

    // Copies below the cap are fine.
    let small = json!([
        {"op": "add", "path": "/metadata/labels", "value": {"a": "b"}},
        {"op": "copy", "from": "/metadata/labels/a", "path": "/metadata/labels/c"},
    ]);
    let reply = json_patch(&app, "dolly", "", &small).await;
    assert_eq!(
        reply.status,
        200,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    assert_eq!(
        reply.json()["metadata"]["labels"],
        json!({"a": "b", "c": "b"})
    );
}

/// More than 10,000 operations is 413 with kube-apiserver's message, before any is applied;
/// a failed operation names itself (no empty field name).
#[tokio::test]
async fn json_patch_operations_are_capped_and_failures_named() {
    let app = app();
    let many = Value::Array(vec![
        json!({"op": "test", "path": "/kind", "value": "Llama"});
        10_001
    ]);
    let reply = json_patch(&app, "dolly", "", &many).await;
    assert_eq!(
        reply.status(413, "RequestEntityTooLarge"),
        "Request entity too large: The allowed maximum operations in a JSON patch is 10000, got 10001"
    );
    let failing = json!([{"op": "test", "path": "/spec/weight", "value": 1}]);
    let message = json_patch(&app, "dolly", "", &failing)
        .await
        .status(422, "Invalid");
    assert!(
        message.contains("operation 0 (test \"/spec/weight\"): testing value /spec/weight failed"),
        "{message}"
    );
    assert!(!message.contains(": :"), "{message}");
}

// ---- watch events in the requested form ----

/// The first `n` events of a watch, as JSON.
async fn watch_events(app: &App, uri: &str, accept: &str, n: usize) -> Vec<Value> {
    let response = open(app, uri, &[("accept", accept)]).await;
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    let mut text = Vec::new();
    while text.iter().filter(|b| **b == b'\n').count() < n {
        let frame = tokio::time::timeout(Duration::from_secs(5), body.frame())
            .await
            .expect("an event in time")
            .expect("the watch is open")
            .unwrap();
        text.extend_from_slice(&frame.into_data().unwrap());
    }
    text.split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .take(n)
        .map(|l| serde_json::from_slice(l).unwrap())
        .collect()
}

/// client-go's metadata informer (the garbage collector's and quota's) watches with
/// sendInitialEvents and a PartialObjectMetadata Accept: the initial-events-end BOOKMARK must
/// come as a PartialObjectMetadata too, or it gives up on the stream and relists. In Table form
/// the bookmark is a Table whose one row's object carries the annotation, as kube-apiserver
/// converts it.
#[tokio::test]
async fn bookmarks_come_in_the_form_the_client_asked_for() {
    let app = app();
    let uri = format!(
        "{LLAMAS}?watch=true&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan&timeoutSeconds=5"
    );
    let metadata_accept = "application/vnd.kubernetes.protobuf;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json";
    let events = watch_events(&app, &uri, metadata_accept, 2).await;
    assert_eq!(events[0]["type"], "ADDED");
    assert_eq!(events[0]["object"]["kind"], "PartialObjectMetadata");
    let bookmark = &events[1];
    assert_eq!(bookmark["type"], "BOOKMARK");
    assert_eq!(bookmark["object"]["kind"], "PartialObjectMetadata");
    assert_eq!(bookmark["object"]["apiVersion"], "meta.k8s.io/v1");
    assert_eq!(
        bookmark["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );
    assert!(bookmark["object"]["metadata"]["resourceVersion"].is_string());

    let events = watch_events(&app, &uri, TABLE_ACCEPT, 2).await;
    assert_eq!(events[0]["object"]["kind"], "Table");
    assert!(events[0]["object"]["columnDefinitions"].is_array());
    let bookmark = &events[1]["object"];
    assert_eq!(events[1]["type"], "BOOKMARK");
    assert_eq!(bookmark["kind"], "Table");
    assert!(bookmark.get("columnDefinitions").is_none(), "headers once");
    assert!(bookmark["metadata"]["resourceVersion"].is_string());
    let row_object = &bookmark["rows"][0]["object"];
    assert_eq!(row_object["kind"], "PartialObjectMetadata");
    assert_eq!(
        row_object["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );
    // The kind's own form is unchanged.
    let events = watch_events(&app, &uri, "application/json", 2).await;
    assert_eq!(events[1]["object"]["kind"], "Llama");
}

/// A metadata watcher (kube-rs, as client-go's metadata informer) syncs by watch-list alone and
/// never falls back to LIST. (kube-rs reads a bookmark of any kind; client-go does not, which
/// is what the wire-form test above holds the server to.)
#[tokio::test]
async fn a_metadata_watcher_syncs_by_watch_list_alone() {
    use futures::StreamExt;
    use kube::runtime::watcher::{self, Event};
    let server = TestServer::start().await;
    let client = server.kube_client().await;
    let api: kube::Api<kube::core::PartialObjectMeta<Llama>> =
        kube::Api::namespaced(client, "default");
    let mut stream = watcher::watcher(api, watcher::Config::default().streaming_lists()).boxed();
    let mut names = Vec::new();
    loop {
        let event = tokio::time::timeout(Duration::from_secs(5), stream.next())
            .await
            .expect("the watcher syncs")
            .expect("the stream goes on")
            .expect("no error");
        match event {
            Event::InitApply(meta) => names.push(meta.metadata.name.unwrap_or_default()),
            Event::InitDone => break,
            _ => {}
        }
    }
    assert_eq!(names, ["dolly"]);
    let metrics = server
        .raw(Some(server.admin_identity()), Alpn::Http2)
        .get("/metrics", &[])
        .await;
    let metrics = String::from_utf8_lossy(&metrics.body).into_owned();
    assert!(
        !metrics.contains(r#"apiserver_request_total{verb="LIST",resource="llamas""#),
        "no LIST: {metrics}"
    );
}

/// Versions the store has not reached: a plain watch from one is 410 Expired (only another
/// process can have handed it out); a watch-list or a list from one is refused with "Too large
/// resource version", as kube-apiserver refuses them; either way the client relists.
#[tokio::test]
async fn versions_from_the_future() {
    let app = app();
    let list = get(&app, LLAMAS).await.json();
    let rv: u64 = list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    // This store is the Llamas' source of truth: a version above its own can only be an
    // earlier process's (a clock that ran ahead), so a watch from one is told to relist.
    let events = watch_events(
        &app,
        &format!(
            "{LLAMAS}?watch=true&resourceVersion={}&timeoutSeconds=5",
            rv + 2
        ),
        "application/json",
        1,
    )
    .await;
    assert_eq!(events[0]["type"], "ERROR");
    assert_eq!(events[0]["object"]["code"], 410);
    assert_eq!(events[0]["object"]["reason"], "Expired");
    // A watch-list: 200 and an ERROR event (as kube-apiserver's watch cache answers it).
    let events = watch_events(
        &app,
        &format!(
            "{LLAMAS}?watch=true&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan&resourceVersion={}",
            rv + 1000
        ),
        "application/json",
        1,
    )
    .await;
    assert_eq!(events[0]["type"], "ERROR");
    let status = &events[0]["object"];
    assert_eq!(status["code"], 504);
    assert_eq!(status["reason"], "Timeout");
    assert!(
        status["message"]
            .as_str()
            .unwrap()
            .starts_with("Timeout: Too large resource version: "),
        "{status}"
    );
    assert_eq!(
        status["details"]["causes"][0]["reason"],
        "ResourceVersionTooLarge"
    );
    // A list: 504 with Retry-After.
    let reply = get(
        &app,
        &format!(
            "{LLAMAS}?resourceVersion={}&resourceVersionMatch=NotOlderThan",
            rv + 1000
        ),
    )
    .await;
    let message = reply.status(504, "Timeout");
    assert!(
        message.starts_with("Timeout: Too large resource version"),
        "{message}"
    );
    assert_eq!(reply.headers["retry-after"], "1");
    assert_eq!(reply.json()["details"]["retryAfterSeconds"], 1);
}

/// Content-Type as kube-apiserver reads it: a create without one is JSON (kube-apiserver
/// accepts it, "for backwards compatibility"), a malformed or unknown one is 415, and a patch
/// must say which kind of patch it is (415 without).
#[tokio::test]
async fn content_types_as_kube_apiserver_reads_them() {
    let app = app();
    let reply = call(&app, "POST", LLAMAS, &[], &llama("untyped", 1.0, 1.0)).await;
    assert_eq!(
        reply.status,
        201,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    for content_type in [
        "text/plain",
        "application/json; charset",
        "application/json; =utf-8",
        "not a media type",
    ] {
        let reply = call(
            &app,
            "POST",
            LLAMAS,
            &[("content-type", content_type)],
            &llama("typed", 1.0, 1.0),
        )
        .await;
        let message = reply.status(415, "UnsupportedMediaType");
        assert!(
            message.starts_with("the body of the request was in an unknown format"),
            "{content_type}: {message}"
        );
    }
    // YAML, as kube-apiserver decodes it for a create or an update, not for a patch.
    let yaml = "apiVersion: farm.example.com/v1alpha\nkind: Llama\nmetadata:\n  name: yaml\nspec:\n  weight: 2\n  height: 1.5\n";
    let reply = call(
        &app,
        "POST",
        LLAMAS,
        &[("content-type", "application/yaml")],
        yaml,
    )
    .await;
    assert_eq!(
        reply.status,
        201,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    assert_eq!(reply.json()["spec"], json!({"weight": 2, "height": 1.5}));
    let stored = reply.json();
    let update = format!(
        "{}metadata:\n  name: yaml\n  resourceVersion: \"{}\"\nspec:\n  weight: 3\n  height: 1.5\n",
        "apiVersion: farm.example.com/v1alpha\nkind: Llama\n",
        stored["metadata"]["resourceVersion"].as_str().unwrap()
    );
    let reply = call(
        &app,
        "PUT",
        &format!("{LLAMAS}/yaml"),
        &[("content-type", "application/yaml")],
        &update,
    )
    .await;
    assert_eq!(
        reply.status,
        200,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    assert_eq!(reply.json()["spec"]["weight"], 3);
    for content_type in [None, Some("application/yaml")] {
        let headers: Vec<(&str, &str)> = content_type
            .map(|c| ("content-type", c))
            .into_iter()
            .collect();
        let reply = call(
            &app,
            "PATCH",
            &format!("{LLAMAS}/dolly"),
            &headers,
            r#"{"spec":{"weight":2}}"#,
        )
        .await;
        reply.status(415, "UnsupportedMediaType");
    }
}

/// Authorization judges the verb that is served: the watch parameter is read as the handler
/// reads it (the first one, percent-decoded), so a user allowed to list cannot open a watch by
/// spelling it differently, nor be refused a list by repeating it.
#[tokio::test]
async fn the_verb_authorized_is_the_verb_served() {
    let fake = FakeKube::start().await;
    fake.set_policy(|spec| {
        let verb = spec["resourceAttributes"]["verb"].as_str().unwrap_or("");
        (verb == "list", String::new())
    });
    let server = TestServer::start_with(Options {
        cluster: Some(fake.client().await),
        ..Default::default()
    })
    .await;
    let (cert, key) = server.dev_ca().issue_client("lister", &[]).unwrap();
    let raw = server.raw(Some((cert, key)), Alpn::Http2);
    // Served as a list (the first value counts): allowed.
    let reply = raw
        .get(&format!("{LLAMAS}?watch=false&watch=true"), &[])
        .await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.json()["kind"], "LlamaList");
    // Served as a watch (the name escaped): refused, as a watch.
    for query in ["wat%63h=true", "watch=%31"] {
        let reply = raw
            .get(&format!("{LLAMAS}?{query}&timeoutSeconds=1"), &[])
            .await;
        assert_eq!(reply.status, 403, "{query}");
        assert!(
            reply.json()["message"]
                .as_str()
                .unwrap()
                .contains("cannot watch resource \"llamas\""),
            "{query}"
        );
    }
}

/// Patch after patch cannot grow a Llama past what one request may send (3 MiB): each patch
/// is within every bound, the object it would make is not.
#[tokio::test]
async fn patches_cannot_grow_an_object_without_bound() {
    let app = app();
    let mut refused = None;
    for i in 0..16 {
        // 3,000 finalizers a patch, about 250 KB (and as much again in managedFields).
        let mut operations = Vec::new();
        if i == 0 {
            operations.push(json!({"op": "add", "path": "/metadata/finalizers", "value": []}));
        }
        for j in 0..3000 {
            let value = format!("farm.example.com/f-{i}-{j:0>50}");
            operations.push(json!({"op": "add", "path": "/metadata/finalizers/-", "value": value}));
        }
        let reply = call(
            &app,
            "PATCH",
            &format!("{LLAMAS}/dolly"),
            &[("content-type", "application/json-patch+json")],
            &Value::Array(operations).to_string(),
        )
        .await;
        if reply.status == 413 {
            refused = Some((i, reply.status(413, "RequestEntityTooLarge")));
            break;
        }
        assert_eq!(reply.status, 200, "patch {i}");
    }
    let (i, message) = refused.expect("refused before it grew past 3 MiB");
    assert!(i >= 5, "{i}");
    assert!(message.contains("limit is 3145728"), "{message}");
}

/// Smaller differences from kube-apiserver, each as it answers: a JSON patch `test` compares
/// numbers by value, and whole float64s are served as Go writes them (`120`, not `120.0`); a
/// uid other than the stored one is refused (a PUT's as a precondition, 409; a patched one as
/// immutable, 422); a malformed `resourceVersion` is 400 on a GET too, and `+1` is malformed;
/// a watch whose `timeoutSeconds` has passed already ends at once.
#[tokio::test]
async fn smaller_differences_from_kube_apiserver() {
    let app = app();
    let created = create(&app, "default", &llama("whole", 120.0, 1.5)).await;
    assert_eq!(created.status, 201);
    assert!(
        String::from_utf8_lossy(&created.body).contains(r#""spec":{"weight":120,"height":1.5}"#),
        "{}",
        String::from_utf8_lossy(&created.body)
    );
    // json-patch compares numbers as texts, as kube-apiserver does (a CRD answers the same):
    // 120 is what a GET shows; 120.0 is not it.
    for (value, code) in [("120", 200), ("120.0", 422)] {
        let patch = format!(
            r#"[{{"op": "test", "path": "/spec/weight", "value": {value}}}, {{"op": "replace", "path": "/spec/height", "value": 2}}]"#
        );
        let reply = json_patch(
            &app,
            "whole",
            "",
            &serde_json::from_str::<Value>(&patch).unwrap(),
        )
        .await;
        assert_eq!(
            reply.status,
            code,
            "{value}: {}",
            String::from_utf8_lossy(&reply.body)
        );
    }
    let reply = json_patch(
        &app,
        "whole",
        "",
        &json!([{"op": "test", "path": "/spec/weight", "value": 121}]),
    )
    .await;
    assert!(reply.status(422, "Invalid").contains("test failed"));

    // A uid that is not the stored one.
    let mut current = get(&app, &format!("{LLAMAS}/whole")).await.json();
    let stored_uid = current["metadata"]["uid"].as_str().unwrap().to_owned();
    current["metadata"]["uid"] = json!("not-the-uid");
    let message = call(
        &app,
        "PUT",
        &format!("{LLAMAS}/whole"),
        &[("content-type", "application/json")],
        &current.to_string(),
    )
    .await
    .status(409, "Conflict");
    assert_eq!(
        message,
        format!(
            "Operation cannot be fulfilled on llamas.farm.example.com \"whole\": Precondition failed: UID in precondition: not-the-uid, UID in object meta: {stored_uid}"
        )
    );
    let message = call(
        &app,
        "PATCH",
        &format!("{LLAMAS}/whole"),
        &[("content-type", "application/merge-patch+json")],
        r#"{"metadata":{"uid":"not-the-uid"}}"#,
    )
    .await
    .status(422, "Invalid");
    assert_eq!(
        message,
        "Llama.farm.example.com \"whole\" is invalid: metadata.uid: Invalid value: \"not-the-uid\": field is immutable"
    );
    let after = get(&app, &format!("{LLAMAS}/whole")).await.json();
    assert_eq!(after["metadata"]["uid"], stored_uid.as_str());

    // Malformed resourceVersions.
    let message = get(&app, &format!("{LLAMAS}/whole?resourceVersion=abc"))
        .await
        .status(400, "BadRequest");
    assert_eq!(
        message,
        "invalid resource version: resourceVersion: Invalid value: \"abc\": strconv.ParseUint: parsing \"abc\": invalid syntax"
    );
    let message = get(&app, &format!("{LLAMAS}?resourceVersion=%2B1"))
        .await
        .status(400, "BadRequest");
    assert_eq!(
        message,
        "invalid resource version: resourceVersion: Invalid value: \"+1\": strconv.ParseUint: parsing \"+1\": invalid syntax"
    );

    // A watch that is over before it starts.
    let reply = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        get(&app, &format!("{LLAMAS}?watch=true&timeoutSeconds=-1")),
    )
    .await
    .expect("the watch ended");
    assert_eq!(reply.status, 200);
}

/// The watch history kept the last 10,000 events whatever their size: a large Llama patched
/// with one label at a time grew the process by megabytes a patch (3 GB after 500 patches of
/// a 2 MB Llama). It is now bounded in bytes too: the oldest events go, a watch from before
/// them is 410 Expired, and the history's size is a metric.
#[tokio::test]
async fn the_watch_history_is_bounded_in_bytes() {
    const LIMIT: u64 = 64 * 1024 * 1024;
    let app = app();
    let mut big: Value = serde_json::from_str(&llama("big", 1.0, 1.0)).unwrap();
    big["metadata"]["annotations"] = json!({ "ballast": "x".repeat(250 * 1024) });
    let created = create(&app, "default", &big.to_string()).await;
    assert_eq!(created.status, 201);
    let first = created.json()["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_owned();
    for i in 0..300 {
        let reply = call(
            &app,
            "PATCH",
            &format!("{LLAMAS}/big"),
            &[("content-type", "application/merge-patch+json")],
            &json!({"metadata": {"labels": {"n": i.to_string()}}}).to_string(),
        )
        .await;
        assert_eq!(reply.status, 200);
    }
    let metrics = String::from_utf8(get(&app, "/metrics").await.body).unwrap();
    let figure = |name: &str| -> u64 {
        let prefix = format!("{name}{{resource=\"llamas.farm.example.com\"}} ");
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .unwrap_or_else(|| panic!("no {name} in {metrics}"))
            .parse()
            .unwrap()
    };
    let (bytes, events) = (
        figure("farm_apiserver_watch_history_bytes"),
        figure("farm_apiserver_watch_history_events"),
    );
    assert!(bytes <= LIMIT, "{bytes} bytes in {events} events");
    // Each event holds about 3 x 256 KiB (object, JSON, watch line): about 85 of them fit.
    assert!((70..=95).contains(&events), "{events} events");
    let events = watch_events(
        &app,
        &format!("{LLAMAS}?watch=true&resourceVersion={first}"),
        "application/json",
        1,
    )
    .await;
    assert_eq!(events[0]["type"], "ERROR");
    assert_eq!(events[0]["object"]["code"], 410);
    assert!(
        events[0]["object"]["message"]
            .as_str()
            .unwrap()
            .starts_with(&format!("too old resource version: {first} (")),
        "{}",
        events[0]
    );
}

// ---- HTTP/2 frames that are not requests ----

/// One HTTP/2 frame.
fn h2_frame(frame_type: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = (payload.len() as u32).to_be_bytes()[1..].to_vec();
    out.extend([frame_type, flags]);
    out.extend(stream.to_be_bytes());
    out.extend(payload);
    out
}

/// The frame types in what the server sent (whole frames only).
fn h2_frame_types(mut bytes: &[u8]) -> Vec<u8> {
    let mut types = Vec::new();
    while bytes.len() >= 9 {
        let len = usize::from(bytes[0]) << 16 | usize::from(bytes[1]) << 8 | usize::from(bytes[2]);
        types.push(bytes[3]);
        bytes = &bytes[(9 + len).min(bytes.len())..];
    }
    types
}

/// What a client that speaks HTTP/2 frame by frame meets: the bounds with these limits.
fn h2_limits() -> aggregated_apiserver::connection::Limits {
    aggregated_apiserver::connection::Limits {
        header_read: Duration::from_millis(800),
        idle: Duration::from_millis(3000),
        write_stall: Duration::from_millis(800),
    }
}

/// Opens an HTTP/2 connection by hand (preface and an empty SETTINGS), then runs `client` on
/// its writing half while the test reads until the server closes; how long that took and the
/// frame types the server sent.
async fn h2_abuser<F, Fut>(server: &TestServer, client: F) -> (Duration, Vec<u8>)
where
    F: FnOnce(tokio::io::WriteHalf<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let raw = server.raw(Some(server.admin_identity()), Alpn::Http2);
    let mut stream = raw.tls().await;
    stream
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .unwrap();
    stream.write_all(&h2_frame(0x4, 0, 0, &[])).await.unwrap();
    let (mut read, write) = tokio::io::split(stream);
    let writer = tokio::spawn(client(write));
    let (after, bytes) = until_closed(&mut read, Duration::from_secs(10)).await;
    writer.abort();
    (after, h2_frame_types(&bytes))
}

/// HTTP/2 connections that never send a request are closed at the idle bound with a GOAWAY:
/// one that sends nothing (it closed at twice the bound), and one that sends two PINGs in
/// one write every 300 ms (their acks counted as responses and kept it open forever).
#[tokio::test]
async fn http2_pings_are_not_requests() {
    let server = TestServer::start_with(Options {
        limits: h2_limits(),
        ..Default::default()
    })
    .await;
    let (after, frames) = h2_abuser(&server, |_write| async {}).await;
    assert!(
        after >= Duration::from_millis(2900) && after < Duration::from_millis(3700),
        "{after:?}"
    );
    assert_eq!(frames.last(), Some(&0x7), "a GOAWAY last: {frames:?}");
    let (after, frames) = h2_abuser(&server, |mut write| async move {
        loop {
            let mut pings = h2_frame(0x6, 0, 0, &[1; 8]);
            pings.extend(h2_frame(0x6, 0, 0, &[2; 8]));
            if write.write_all(&pings).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    })
    .await;
    assert!(
        after >= Duration::from_millis(2900) && after < Duration::from_millis(3700),
        "{after:?}"
    );
    assert!(frames.contains(&0x6), "the pings were answered: {frames:?}");
    assert_eq!(frames.last(), Some(&0x7), "a GOAWAY last: {frames:?}");
}

/// A header block dribbled a byte at a time is cut off at the header-read bound, as an
/// HTTP/1.1 request's headers are (it was cut only at twice the idle bound).
#[tokio::test]
async fn http2_header_blocks_get_the_header_read_bound() {
    let server = TestServer::start_with(Options {
        limits: h2_limits(),
        ..Default::default()
    })
    .await;
    // A HEADERS frame without END_HEADERS, then a CONTINUATION frame of 1,000 bytes sent a
    // byte every 100 ms.
    let (after, frames) = h2_abuser(&server, |mut write| async move {
        let mut start = h2_frame(0x1, 0, 1, &[0x82]);
        start.extend(&h2_frame(0x9, 0x4, 1, &[0x84; 1000])[..9]);
        if write.write_all(&start).await.is_err() {
            return;
        }
        loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if write.write_all(&[0x84]).await.is_err() {
                return;
            }
        }
    })
    .await;
    assert_eq!(frames.last(), Some(&0x7), "a GOAWAY last: {frames:?}");
    assert!(
        after >= Duration::from_millis(750) && after < Duration::from_millis(1500),
        "{after:?}"
    );
}
