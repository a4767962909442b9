//! The closed-loop load generator, built like wrk: one OS thread per core, each with its own
//! single-threaded runtime, and on it one task per connection that sends a request, reads the
//! whole response, and sends the next. HTTP/1.1 writes precomputed request bytes and parses the
//! response in place (httparse); HTTP/2 is framed by hand in the same task. A hyper client costs
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

/// HTTP/2: one stream at a time per connection, as wrk does per HTTP/1.1 connection, framed
/// by hand in the connection's one task (h2's client needs a second task per connection and a
/// cross-task wake-up per frame, which made it cost as much CPU per request as the server it
/// measures). Request headers are HPACK-indexed on the first request and sent as dynamic-table
/// references afterwards, as Go's and h2's clients do.
struct H2 {
    tls: Tls,
    /// The first request's HEADERS frame (literals with incremental indexing), then the one
    /// every later request sends (indexed references); bytes 5..9 are the stream id.
    first: Vec<u8>,
    rest: Vec<u8>,
    stream: u32,
    buf: BytesMut,
    /// DATA bytes received since the last connection-level WINDOW_UPDATE.
    unacknowledged: u64,
}

const FRAME_DATA: u8 = 0x0;
const FRAME_HEADERS: u8 = 0x1;
const FRAME_RST_STREAM: u8 = 0x3;
const FRAME_SETTINGS: u8 = 0x4;
const FRAME_PING: u8 = 0x6;
const FRAME_GOAWAY: u8 = 0x7;
const FRAME_WINDOW_UPDATE: u8 = 0x8;
const FLAG_END_STREAM: u8 = 0x1;
const FLAG_ACK: u8 = 0x1;
const FLAG_END_HEADERS: u8 = 0x4;
const MAX_WINDOW: u32 = (1 << 31) - 1;

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut out = Vec::with_capacity(9 + payload.len());
    out.extend_from_slice(&len.to_be_bytes()[1..]);
    out.extend_from_slice(&[kind, flags]);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// An HPACK integer with an `n`-bit prefix whose high bits are `first`.
fn hpack_int(out: &mut Vec<u8>, first: u8, n: u32, mut value: usize) {
    let max = (1usize << n) - 1;
    if value < max {
        out.push(first | value as u8);
        return;
    }
    out.push(first | max as u8);
    value -= max;
    while value >= 128 {
        out.push((value % 128) as u8 | 0x80);
        value /= 128;
    }
    out.push(value as u8);
}

fn hpack_string(out: &mut Vec<u8>, s: &str) {
    hpack_int(out, 0, 7, s.len());
    out.extend_from_slice(s.as_bytes());
}

/// The status of a response header block, when it starts with an indexed `:status` (h2 and Go
/// encode 200, 204, 206, 304, 400, 404 and 500 so); 0 for anything else.
fn hpack_status(block: &[u8]) -> u16 {
    match block.first() {
        Some(0x88) => 200,
        Some(0x89) => 204,
        Some(0x8a) => 206,
        Some(0x8b) => 304,
        Some(0x8c) => 400,
        Some(0x8d) => 404,
        Some(0x8e) => 500,
        _ => 0,
    }
}

impl H2 {
    async fn new(mut tls: Tls, target: &Target, request: &Request) -> Result<Self> {
        let authority = format!("localhost:{}", target.addr.port());
        // (static-table name index or 0 for a new name, name, value)
        let mut fields: Vec<(u8, String, String)> = vec![
            (1, ":authority".into(), authority),
            (4, ":path".into(), request.path.clone()),
        ];
        for (k, v) in target.headers.iter().chain(&request.headers) {
            fields.push((0, k.to_ascii_lowercase(), v.clone()));
        }
        // :method GET and :scheme https are static-table entries 2 and 7.
        let (mut first, mut rest) = (vec![0x82, 0x87], vec![0x82, 0x87]);
        for (name_index, name, value) in &fields {
            if *name_index > 0 {
                hpack_int(&mut first, 0x40, 6, usize::from(*name_index));
            } else {
                first.push(0x40);
                hpack_string(&mut first, name);
            }
            hpack_string(&mut first, value);
        }
        // The dynamic table now holds the fields newest first, from index 62.
        for i in 0..fields.len() {
            hpack_int(&mut rest, 0x80, 7, 62 + fields.len() - 1 - i);
        }
        let table: usize = fields.iter().map(|(_, n, v)| n.len() + v.len() + 32).sum();
        anyhow::ensure!(table <= 4096, "request headers overflow the HPACK table");

        let mut preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        // SETTINGS: ENABLE_PUSH 0, INITIAL_WINDOW_SIZE max; then the connection window to max.
        let mut settings = vec![0, 2, 0, 0, 0, 0, 0, 4];
        settings.extend_from_slice(&MAX_WINDOW.to_be_bytes());
        preface.extend(frame(FRAME_SETTINGS, 0, 0, &settings));
        preface.extend(frame(
            FRAME_WINDOW_UPDATE,
            0,
            0,
            &(MAX_WINDOW - 65_535).to_be_bytes(),
        ));
        tls.write_all(&preface).await?;
        tls.flush().await?;
        Ok(Self {
            tls,
            first: frame(FRAME_HEADERS, FLAG_END_STREAM | FLAG_END_HEADERS, 1, &first),
            rest: frame(FRAME_HEADERS, FLAG_END_STREAM | FLAG_END_HEADERS, 0, &rest),
            stream: 0,
            buf: BytesMut::with_capacity(64 * 1024),
            unacknowledged: 0,
        })
    }

    /// Status and body length of one exchange.
    async fn round_trip(&mut self) -> Result<(u16, usize)> {
        self.stream = if self.stream == 0 { 1 } else { self.stream + 2 };
        anyhow::ensure!(self.stream < MAX_WINDOW, "stream ids exhausted");
        if self.stream == 1 {
            self.tls.write_all(&self.first).await?;
        } else {
            self.rest[5..9].copy_from_slice(&self.stream.to_be_bytes());
            self.tls.write_all(&self.rest).await?;
        }
        self.tls.flush().await?;
        let (mut status, mut length) = (0, 0);
        loop {
            while self.buf.len() < 9
                || self.buf.len()
                    < 9 + u32::from_be_bytes([0, self.buf[0], self.buf[1], self.buf[2]]) as usize
            {
                self.fill().await?;
            }
            let len = u32::from_be_bytes([0, self.buf[0], self.buf[1], self.buf[2]]) as usize;
            let (kind, flags) = (self.buf[3], self.buf[4]);
            let stream = u32::from_be_bytes([self.buf[5], self.buf[6], self.buf[7], self.buf[8]])
                & MAX_WINDOW;
            let frame_bytes = self.buf.split_to(9 + len);
            let payload = &frame_bytes[9..];
            let ours = stream == self.stream;
            match kind {
                // Response headers; a trailer block, later, carries no :status.
                FRAME_HEADERS if ours && status == 0 => status = hpack_status(payload),
                FRAME_DATA => {
                    if ours {
                        length += len;
                    }
                    self.unacknowledged += len as u64;
                    if self.unacknowledged >= 1 << 30 {
                        let increment = self.unacknowledged as u32;
                        self.unacknowledged = 0;
                        self.tls
                            .write_all(&frame(FRAME_WINDOW_UPDATE, 0, 0, &increment.to_be_bytes()))
                            .await?;
                    }
                }
                FRAME_SETTINGS if flags & FLAG_ACK == 0 => {
                    self.tls
                        .write_all(&frame(FRAME_SETTINGS, FLAG_ACK, 0, &[]))
                        .await?;
                    self.tls.flush().await?;
                }
                FRAME_PING if flags & FLAG_ACK == 0 => {
                    self.tls
                        .write_all(&frame(FRAME_PING, FLAG_ACK, 0, payload))
                        .await?;
                    self.tls.flush().await?;
                }
                FRAME_RST_STREAM if ours => bail!("stream reset"),
                FRAME_GOAWAY => bail!("connection closed by GOAWAY"),
                _ => {}
            }
            if ours && matches!(kind, FRAME_HEADERS | FRAME_DATA) && flags & FLAG_END_STREAM != 0 {
                return Ok((status, length));
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hpack_integers_follow_rfc_7541_examples() {
        // C.1.1: 10 with a 5-bit prefix; C.1.2: 1337 with a 5-bit prefix.
        let mut out = Vec::new();
        hpack_int(&mut out, 0, 5, 10);
        assert_eq!(out, [0x0a]);
        out.clear();
        hpack_int(&mut out, 0, 5, 1337);
        assert_eq!(out, [0x1f, 0x9a, 0x0a]);
        out.clear();
        hpack_int(&mut out, 0x80, 7, 127);
        assert_eq!(out, [0xff, 0x00]);
    }
}
