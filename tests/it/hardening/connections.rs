//! What a connection may hold: silent, slowloris, idle and stalled connections, timeouts, early
//! errors, large headers, HTTP/2 abuse.

use super::*;

pub(super) fn short_limits() -> aggregated_apiserver::net::connection::Limits {
    aggregated_apiserver::net::connection::Limits {
        header_read: Duration::from_millis(800),
        idle: Duration::from_millis(1200),
        write_stall: Duration::from_millis(800),
    }
}

/// Reads until the server closes the connection (EOF or reset); how long that took and what
/// was read.
pub(super) async fn until_closed(
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
pub(super) async fn write_all_then_read(
    client: &common::RawClient,
    head: &str,
    body: &[u8],
) -> String {
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

/// One HTTP/2 frame.
pub(super) fn h2_frame(frame_type: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = (payload.len() as u32).to_be_bytes()[1..].to_vec();
    out.extend([frame_type, flags]);
    out.extend(stream.to_be_bytes());
    out.extend(payload);
    out
}

/// The frame types in what the server sent (whole frames only).
pub(super) fn h2_frame_types(mut bytes: &[u8]) -> Vec<u8> {
    let mut types = Vec::new();
    while bytes.len() >= 9 {
        let len = usize::from(bytes[0]) << 16 | usize::from(bytes[1]) << 8 | usize::from(bytes[2]);
        types.push(bytes[3]);
        bytes = &bytes[(9 + len).min(bytes.len())..];
    }
    types
}

/// What a client that speaks HTTP/2 frame by frame meets: the bounds with these limits.
pub(super) fn h2_limits() -> aggregated_apiserver::net::connection::Limits {
    aggregated_apiserver::net::connection::Limits {
        header_read: Duration::from_millis(800),
        idle: Duration::from_millis(3000),
        write_stall: Duration::from_millis(800),
    }
}

/// Opens an HTTP/2 connection by hand (preface and an empty SETTINGS), then runs `client` on
/// its writing half while the test reads until the server closes; how long that took and the
/// frame types the server sent.
pub(super) async fn h2_abuser<F, Fut>(server: &TestServer, client: F) -> (Duration, Vec<u8>)
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
