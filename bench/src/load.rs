//! The closed-loop load generator, built like wrk: one OS thread per core, each with its own
//! single-threaded runtime, and on it one task per connection that sends a request, reads the
//! whole response, and sends the next. HTTP/1.1 writes precomputed request bytes and parses the
//! response in place (httparse); HTTP/2 drives the `h2` crate directly. A hyper client costs
//! about twice the CPU per request of the server it measures, and on a 2-core machine that CPU
//! (and the cross-thread wake-ups of a work-stealing runtime) shows up as the server's latency.

use std::{sync::mpsc, time::Instant};

use anyhow::{Context, Result, bail};
use bytes::{Buf, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::client::{Load, Proto, Target};

/// What every connection sends.
#[derive(Clone)]
pub struct Request {
    pub path: String,
    /// Headers besides the target's identity headers.
    pub headers: Vec<(String, String)>,
}

/// Runs `connections` kept-alive connections spread over `threads` threads. `on_ready` is called
/// once every connection is established and returns the window to measure: requests sent between
/// its two instants are counted, the ones before are warm-up.
pub fn closed_loop(
    target: &Target,
    proto: Proto,
    connections: usize,
    threads: usize,
    request: &Request,
    on_ready: impl FnOnce() -> (Instant, Instant),
) -> Result<Load> {
    let threads = threads.clamp(1, connections.max(1));
    let (ready_tx, ready_rx) = mpsc::channel::<Result<()>>();
    let mut windows = Vec::new();
    let mut handles = Vec::new();
    for t in 0..threads {
        let share = connections / threads + usize::from(t < connections % threads);
        let (window_tx, window_rx) = mpsc::channel::<(Instant, Instant)>();
        windows.push(window_tx);
        let (target, request, ready_tx) = (target.clone(), request.clone(), ready_tx.clone());
        handles.push(std::thread::spawn(move || -> Result<Vec<Sample>> {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            runtime.block_on(async move {
                let conns = match connect_all(&target, proto, share, &request).await {
                    Ok(conns) => {
                        let _ = ready_tx.send(Ok(()));
                        conns
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return Ok(Vec::new());
                    }
                };
                // The window is only known once every thread is connected.
                let (start, end) = window_rx.recv().context("no window")?;
                let tasks: Vec<_> = conns
                    .into_iter()
                    .map(|conn| tokio::spawn(conn.run(start, end)))
                    .collect();
                let mut samples = Vec::new();
                for task in tasks {
                    samples.push(task.await?);
                }
                Ok(samples)
            })
        }));
    }
    drop(ready_tx);
    for _ in 0..threads {
        ready_rx.recv().context("a load thread exited")??;
    }
    let (start, end) = on_ready();
    for window in windows {
        let _ = window.send((start, end));
    }
    let mut load = Load {
        seconds: (end - start).as_secs_f64(),
        ..Default::default()
    };
    for handle in handles {
        let samples = handle
            .join()
            .map_err(|_| anyhow::anyhow!("a load thread panicked"))??;
        for sample in samples {
            load.requests += sample.latencies_us.len() as u64;
            load.errors += sample.errors;
            load.response_bytes = load.response_bytes.max(sample.bytes);
            load.latencies_us.extend(sample.latencies_us);
        }
    }
    load.latencies_us.sort_unstable();
    Ok(load)
}

#[derive(Default)]
struct Sample {
    latencies_us: Vec<u32>,
    errors: u64,
    bytes: usize,
}

async fn connect_all(
    target: &Target,
    proto: Proto,
    count: usize,
    request: &Request,
) -> Result<Vec<LoadConn>> {
    let mut conns = Vec::with_capacity(count);
    for _ in 0..count {
        let tls = target.tls(proto).await?;
        conns.push(match proto {
            Proto::H1 => LoadConn::H1(Box::new(H1::new(tls, target, request))),
            Proto::H2 => LoadConn::H2(Box::new(H2::new(tls, target, request).await?)),
        });
    }
    Ok(conns)
}

type Tls = tokio_rustls::client::TlsStream<tokio::net::TcpStream>;

enum LoadConn {
    H1(Box<H1>),
    H2(Box<H2>),
}

impl LoadConn {
    async fn run(mut self, start: Instant, end: Instant) -> Sample {
        let mut sample = Sample {
            latencies_us: Vec::with_capacity(200_000),
            ..Default::default()
        };
        loop {
            let sent = Instant::now();
            if sent >= end {
                break;
            }
            let reply = match &mut self {
                LoadConn::H1(c) => c.round_trip().await,
                LoadConn::H2(c) => c.round_trip().await,
            };
            if sent < start {
                continue;
            }
            match reply {
                Ok((200, bytes)) => {
                    sample.bytes = bytes;
                    sample
                        .latencies_us
                        .push(u32::try_from(sent.elapsed().as_micros()).unwrap_or(u32::MAX));
                }
                Ok(_) => sample.errors += 1,
                Err(_) => {
                    // A broken connection stays broken: count the rest of the window as lost.
                    sample.errors += 1;
                    break;
                }
            }
        }
        sample
    }
}

/// HTTP/1.1: the request is the same bytes every time.
struct H1 {
    tls: Tls,
    request: Vec<u8>,
    buf: BytesMut,
}

impl H1 {
    fn new(tls: Tls, target: &Target, request: &Request) -> Self {
        let mut head = format!(
            "GET {} HTTP/1.1\r\nhost: localhost:{}\r\n",
            request.path,
            target.addr.port()
        );
        for (k, v) in target.headers.iter().chain(&request.headers) {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        Self {
            tls,
            request: head.into_bytes(),
            buf: BytesMut::with_capacity(64 * 1024),
        }
    }

    /// Status and body length of one exchange.
    async fn round_trip(&mut self) -> Result<(u16, usize)> {
        self.tls.write_all(&self.request).await?;
        self.tls.flush().await?;
        loop {
            if let Some((head, status, body)) = parse_head(&self.buf)? {
                while self.buf.len() < head + body {
                    self.fill().await?;
                }
                self.buf.advance(head + body);
                return Ok((status, body));
            }
            self.fill().await?;
        }
    }

    async fn fill(&mut self) -> Result<()> {
        if self.buf.capacity() - self.buf.len() < 16 * 1024 {
            self.buf.reserve(64 * 1024);
        }
        if self.tls.read_buf(&mut self.buf).await? == 0 {
            bail!("connection closed");
        }
        Ok(())
    }
}

/// The head's length, the status and the body's length, once the whole head is in `buf`.
fn parse_head(buf: &[u8]) -> Result<Option<(usize, u16, usize)>> {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut response = httparse::Response::new(&mut headers);
    let httparse::Status::Complete(head) = response.parse(buf)? else {
        return Ok(None);
    };
    let status = response.code.unwrap_or(0);
    let length = response
        .headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("content-length"))
        .and_then(|h| std::str::from_utf8(h.value).ok()?.parse().ok())
        .context("the load generator reads only responses with a Content-Length")?;
    Ok(Some((head, status, length)))
}

/// HTTP/2: one stream at a time per connection, as wrk does per HTTP/1.1 connection.
struct H2 {
    sender: h2::client::SendRequest<bytes::Bytes>,
    // `http::Request` is not `Clone`: each stream gets a new one from these.
    uri: http::Uri,
    headers: http::HeaderMap,
}

impl H2 {
    async fn new(tls: Tls, target: &Target, request: &Request) -> Result<Self> {
        let (sender, connection) = h2::client::handshake(tls).await?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        let mut headers = http::HeaderMap::new();
        for (k, v) in target.headers.iter().chain(&request.headers) {
            headers.append(
                http::HeaderName::from_bytes(k.as_bytes())?,
                http::HeaderValue::from_str(v)?,
            );
        }
        Ok(Self {
            sender,
            uri: format!("https://localhost:{}{}", target.addr.port(), request.path).parse()?,
            headers,
        })
    }

    async fn round_trip(&mut self) -> Result<(u16, usize)> {
        std::future::poll_fn(|cx| self.sender.poll_ready(cx)).await?;
        let mut request = http::Request::new(());
        *request.uri_mut() = self.uri.clone();
        *request.headers_mut() = self.headers.clone();
        let (response, _) = self.sender.send_request(request, true)?;
        let response = response.await?;
        let status = response.status().as_u16();
        let mut body = response.into_body();
        let mut length = 0;
        while let Some(chunk) = body.data().await {
            let chunk = chunk?;
            length += chunk.len();
            body.flow_control().release_capacity(chunk.len())?;
        }
        Ok((status, length))
    }
}
