//! Scenario 10, connection abuse: idle connections, slow headers (slowloris) and clients that
//! ask for a large list and never read it, all at once and for as long as the normal load runs
//! (each abuser opens a new connection when the server closes its last), while normal clients
//! GET a Llama. The normal clients must keep their latency, and every abusive connection must be
//! closed by its timeout (the server runs with short ones: `HEADER_READ`, `WRITE`).

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::client::{Proto, Target};

/// The bounds the server is started with for this scenario (seconds).
pub const HEADER_READ: u64 = 2;
pub const IDLE: u64 = 3;
pub const WRITE: u64 = 2;

/// How long after its bound a connection may take to be closed (timers, scheduling).
const SLACK: Duration = Duration::from_millis(1500);

#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct Abusers {
    /// Abusive connections opened, by kind.
    pub idle: usize,
    pub slow_headers: usize,
    pub not_reading: usize,
    pub ping_keepalive: usize,
    pub header_dribble: usize,
    /// Of all of them, how many the server closed within their bound (plus slack).
    pub closed_in_time: usize,
}

/// Reads until the server closes the connection; when that happened and how many bytes came
/// first, or None if it did not close within `give_up`.
async fn closed_after(
    stream: &mut (impl tokio::io::AsyncRead + Unpin),
    give_up: Duration,
) -> Option<(Instant, usize)> {
    let deadline = Instant::now() + give_up;
    let mut buf = vec![0u8; 64 * 1024];
    let mut read = 0;
    loop {
        let left = deadline.checked_duration_since(Instant::now())?;
        match tokio::time::timeout(left, stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return Some((Instant::now(), read)),
            Ok(Ok(n)) => read += n,
            Err(_) => return None,
        }
    }
}

const GIVE_UP: Duration = Duration::from_secs(30);

/// Handshake, then nothing: closed by the header-read timeout.
async fn idle(t: &Target) -> Option<bool> {
    let mut stream = t.tls(Proto::H1).await.ok()?;
    let opened = Instant::now();
    let (closed, _) = closed_after(&mut stream, GIVE_UP).await?;
    Some(closed - opened <= Duration::from_secs(HEADER_READ) + SLACK)
}

/// A header byte every 500 ms: closed by the header-read timeout all the same.
async fn slow_headers(t: &Target) -> Option<bool> {
    let stream = t.tls(Proto::H1).await.ok()?;
    let opened = Instant::now();
    let (mut read, mut write) = tokio::io::split(stream);
    let writer = tokio::spawn(async move {
        for byte in b"GET /apis HTTP/1.1\r\nHost: localhost\r\nX-Slow: "
            .iter()
            .cycle()
        {
            if write.write_all(&[*byte]).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    });
    let closed = closed_after(&mut read, GIVE_UP).await;
    writer.abort();
    Some(closed?.0 - opened <= Duration::from_secs(HEADER_READ) + SLACK)
}

/// Asks for a large list and does not read: the server's writes stall once the socket buffers
/// are full, and the write timeout ends the connection. What the kernel buffered still comes
/// when the client finally reads; the whole list must not.
async fn not_reading(t: &Target, path: &str, full_bytes: usize) -> Option<bool> {
    let mut stream = t.tls(Proto::H1).await.ok()?;
    let mut request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n");
    for (name, value) in t.headers.iter() {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    tokio::time::sleep(Duration::from_secs(WRITE) + SLACK * 2).await;
    let (_, read) = closed_after(&mut stream, Duration::from_secs(5)).await?;
    Some(read < full_bytes)
}

/// One HTTP/2 frame.
fn h2_frame(frame_type: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = (payload.len() as u32).to_be_bytes()[1..].to_vec();
    out.extend([frame_type, flags]);
    out.extend(stream.to_be_bytes());
    out.extend(payload);
    out
}

/// An HTTP/2 connection (preface, empty SETTINGS) whose writes `client` makes while it is
/// read until the server closes it; how long that took, or None.
async fn h2_until_closed<F, Fut>(t: &Target, client: F) -> Option<Duration>
where
    F: FnOnce(tokio::io::WriteHalf<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let mut stream = t.tls(Proto::H2).await.ok()?;
    let opened = Instant::now();
    stream
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .ok()?;
    stream.write_all(&h2_frame(0x4, 0, 0, &[])).await.ok()?;
    let (mut read, write) = tokio::io::split(stream);
    let writer = tokio::spawn(client(write));
    let closed = closed_after(&mut read, GIVE_UP).await;
    writer.abort();
    Some(closed?.0 - opened)
}

/// HTTP/2 with no request, two PINGs in one write every second: closed at the idle bound.
async fn ping_keepalive(t: &Target) -> Option<bool> {
    let after = h2_until_closed(t, |mut write| async move {
        loop {
            let mut pings = h2_frame(0x6, 0, 0, &[1; 8]);
            pings.extend(h2_frame(0x6, 0, 0, &[2; 8]));
            if write.write_all(&pings).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    })
    .await?;
    Some(after <= Duration::from_secs(IDLE) + SLACK)
}

/// HTTP/2 HEADERS without END_HEADERS, then a CONTINUATION frame a byte every 200 ms: closed
/// at the header-read bound.
async fn header_dribble(t: &Target) -> Option<bool> {
    let after = h2_until_closed(t, |mut write| async move {
        let mut start = h2_frame(0x1, 0, 1, &[0x82]);
        start.extend(&h2_frame(0x9, 0x4, 1, &[0x84; 1000])[..9]);
        if write.write_all(&start).await.is_err() {
            return;
        }
        loop {
            tokio::time::sleep(Duration::from_millis(200)).await;
            if write.write_all(&[0x84]).await.is_err() {
                return;
            }
        }
    })
    .await?;
    Some(after <= Duration::from_secs(HEADER_READ) + SLACK)
}

/// How many abusers of each kind.
#[derive(Debug, Clone, Copy)]
pub struct Counts {
    pub idle: usize,
    pub slow_headers: usize,
    pub not_reading: usize,
    pub ping_keepalive: usize,
    pub header_dribble: usize,
}

/// Keeps the abusers of `counts` connected until `stop`; then how they fared.
pub async fn run(
    t: Target,
    counts: Counts,
    large_list: String,
    large_list_bytes: usize,
    stop: Arc<AtomicBool>,
) -> Abusers {
    let opened: Arc<[AtomicUsize; 5]> = Arc::new(Default::default());
    let in_time = Arc::new(AtomicUsize::new(0));
    let mut slots = Vec::new();
    for (kind, n) in [
        (0usize, counts.idle),
        (1, counts.slow_headers),
        (2, counts.not_reading),
        (3, counts.ping_keepalive),
        (4, counts.header_dribble),
    ] {
        for _ in 0..n {
            let (t, stop, opened, in_time, list) = (
                t.clone(),
                stop.clone(),
                opened.clone(),
                in_time.clone(),
                large_list.clone(),
            );
            slots.push(tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    opened[kind].fetch_add(1, Ordering::Relaxed);
                    let fared = match kind {
                        0 => idle(&t).await,
                        1 => slow_headers(&t).await,
                        2 => not_reading(&t, &list, large_list_bytes).await,
                        3 => ping_keepalive(&t).await,
                        _ => header_dribble(&t).await,
                    };
                    if fared == Some(true) {
                        in_time.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }));
        }
    }
    for slot in slots {
        let _ = slot.await;
    }
    Abusers {
        idle: opened[0].load(Ordering::Relaxed),
        slow_headers: opened[1].load(Ordering::Relaxed),
        not_reading: opened[2].load(Ordering::Relaxed),
        ping_keepalive: opened[3].load(Ordering::Relaxed),
        header_dribble: opened[4].load(Ordering::Relaxed),
        closed_in_time: in_time.load(Ordering::Relaxed),
    }
}
