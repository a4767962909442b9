//! What one client connection may hold, as Go's net/http and kube-apiserver bound it:
//!
//! - **idle**: an HTTP/2 connection with no request for `idle` (90 s) is closed with a GOAWAY;
//!   PING, SETTINGS and WINDOW_UPDATE frames and their acks are not requests, in either
//!   direction (Go's http2 server counts streams, not frames);
//! - **headers**: a request's headers must arrive within `header_read` (32 s): an HTTP/2 header
//!   block (HEADERS and its CONTINUATIONs) as an HTTP/1.1 request's; an HTTP/1.1 connection
//!   waits that long for its next request;
//! - **stalled writes**: a connection whose writes make no progress for `write_stall` (a client
//!   that stopped reading) is closed;
//! - **request bodies**: a body a handler did not read (an early 401, 413, 415...) is read and
//!   discarded, up to a bound, so that a client that writes its whole body before reading
//!   (Python's http.client, Go's for small bodies) gets the Status and not a connection reset,
//!   as Go's net/http reads up to 256 KiB after a handler for the same reason.
//!
//! Cheap by construction: a request sets a flag (HTTP/2 frames are told apart by their 9-byte
//! headers as they pass), and one timer per connection, moved once per eighth of the shortest
//! bound rather than per request, turns flags into times and closes what has overstayed. A
//! bound is then kept to within an eighth of itself.

/// The address of a request's peer, set on the requests that leave the fast path (for the
/// audit log's `sourceIPs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteAddr(pub std::net::IpAddr);

use std::{
    future::Future as _,
    io,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    task::{Context, Poll, Waker, ready},
    time::Duration,
};

use axum::body::Bytes;
use bytes::Buf;
use http_body::{Body, Frame, SizeHint};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    time::{Instant, Sleep},
};

/// The bounds of every connection.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// What a client gets to send a request's headers (`--header-read-timeout`); also how long
    /// an HTTP/1.1 connection may wait for its next request.
    pub header_read: Duration,
    /// How long an HTTP/2 connection may stay open with no request (`--idle-timeout`).
    pub idle: Duration,
    /// How long a connection's writes may make no progress before it is closed
    /// (`--write-timeout`).
    pub write_stall: Duration,
}

impl Default for Limits {
    /// kube-apiserver's `ReadHeaderTimeout` (32 s) and `IdleTimeout` (90 s); writes get as long
    /// as a whole non-long-running request (60 s).
    fn default() -> Self {
        Self {
            header_read: Duration::from_secs(32),
            idle: Duration::from_secs(90),
            write_stall: Duration::from_secs(60),
        }
    }
}

/// What a connection's requests tell its guard: how many are still running (a watch, a
/// request that waits), and that one ended since the guard last looked.
#[derive(Debug, Default)]
pub struct Activity {
    in_flight: AtomicUsize,
    ended: AtomicBool,
}

impl Activity {
    /// A request that takes a while (its response body included): the connection is not idle
    /// until the guard is dropped. (A request answered at once needs none: its frames count.)
    pub fn begin(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::Acquire);
        InFlight(self.clone())
    }

    /// A request is running, or one ended since the last look.
    fn busy(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) > 0 || self.ended.swap(false, Ordering::Relaxed)
    }
}

/// A request in flight on a connection ([`Activity::begin`]); dropping it ends the request.
pub struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.ended.store(true, Ordering::Relaxed);
        self.0.in_flight.fetch_sub(1, Ordering::Release);
    }
}

/// The client's first bytes on an HTTP/2 connection (RFC 9113 3.4).
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Frame types that are requests and responses: DATA, HEADERS, CONTINUATION.
fn carries_a_request(frame_type: u8) -> bool {
    matches!(frame_type, 0x0 | 0x1 | 0x9)
}

/// HEADERS or CONTINUATION: part of a header block.
fn is_header_block(frame_type: u8) -> bool {
    matches!(frame_type, 0x1 | 0x9)
}

const END_HEADERS: u8 = 0x4;

/// Where one direction of an HTTP/2 connection is: in a frame's 9-byte header, or in its
/// payload. Fed the bytes as they pass; says which frames went by.
#[derive(Debug, Default)]
struct Frames {
    head: [u8; 9],
    have: usize,
    /// Payload bytes of the current frame still to come.
    left: usize,
    /// The current frame's type and flags (valid once its header is complete).
    frame_type: u8,
    flags: u8,
}

/// What passed in one [`Frames::feed`].
#[derive(Debug, Default, Clone, Copy)]
struct Seen {
    /// A request or response frame started.
    request: bool,
    /// A header block without END_HEADERS is open at the end of the bytes fed.
    header_open: bool,
    /// The highest stream id of a HEADERS frame.
    last_stream: u32,
}

impl Frames {
    fn feed(&mut self, mut bytes: &[u8]) -> Seen {
        let mut seen = Seen::default();
        loop {
            // Inside a payload: pass over it.
            let n = self.left.min(bytes.len());
            self.left -= n;
            bytes = &bytes[n..];
            if bytes.is_empty() {
                break;
            }
            // A frame header: read in place when it is whole (nearly always), else assembled.
            let head = match bytes.first_chunk::<9>() {
                Some(head) if self.have == 0 => {
                    bytes = &bytes[9..];
                    *head
                }
                _ => {
                    let n = (9 - self.have).min(bytes.len());
                    self.head[self.have..self.have + n].copy_from_slice(&bytes[..n]);
                    self.have += n;
                    bytes = &bytes[n..];
                    if self.have < 9 {
                        break;
                    }
                    self.have = 0;
                    self.head
                }
            };
            let [l0, l1, l2, frame_type, flags, s0, s1, s2, s3] = head;
            self.left = usize::from(l0) << 16 | usize::from(l1) << 8 | usize::from(l2);
            self.frame_type = frame_type;
            self.flags = flags;
            seen.request |= carries_a_request(frame_type);
            if frame_type == 0x1 {
                let stream = u32::from_be_bytes([s0 & 0x7f, s1, s2, s3]);
                seen.last_stream = seen.last_stream.max(stream);
            }
        }
        // Open while a header block's frame is still arriving or wants a CONTINUATION.
        seen.header_open =
            is_header_block(self.frame_type) && (self.left > 0 || self.flags & END_HEADERS == 0);
        seen
    }

    /// Between two frames: a frame of our own may be written.
    fn at_boundary(&self) -> bool {
        self.have == 0 && self.left == 0
    }
}

/// The protocol a connection speaks, told by its first bytes (not by ALPN alone: HTTP/2 may
/// come with prior knowledge).
#[derive(Debug)]
enum Protocol {
    /// The first `n` bytes matched the HTTP/2 preface so far.
    Unknown(usize),
    Http1,
    Http2 {
        reads: Frames,
        writes: Frames,
        last_stream: u32,
        header_open: bool,
        goaway_sent: bool,
    },
}

/// A connection's stream with the bounds of [`Limits`].
pub struct Guarded<S> {
    inner: S,
    limits: Limits,
    activity: Arc<Activity>,
    protocol: Protocol,
    /// One timer: every `period` it turns what passed into times and checks the bounds.
    timer: Pin<Box<Sleep>>,
    /// The waker the timer was last polled with: while it is this task's, the timer will wake
    /// the task when it fires, and a read that waits need not poll it again (that costs more
    /// than the read; an HTTP/2 request waits several times).
    timer_waker: Option<Waker>,
    period: Duration,
    /// A request or response passed since the timer last looked.
    active: bool,
    /// When the connection was last seen active (by the timer, so to within `period`).
    last_active: Instant,
    /// When the timer first saw an HTTP/2 header block open.
    header_open_since: Option<Instant>,
    stalled: Option<Pin<Box<Sleep>>>,
}

impl<S> Guarded<S> {
    /// Bounds `inner` by `limits`; `activity` is the one the connection's service was given.
    pub fn new(inner: S, limits: Limits, activity: Arc<Activity>) -> Self {
        let shortest = limits.header_read.min(limits.idle);
        let period = (shortest / 8).max(Duration::from_millis(10));
        let now = Instant::now();
        Self {
            inner,
            limits,
            activity,
            protocol: Protocol::Unknown(0),
            timer: Box::pin(tokio::time::sleep_until(now + period)),
            timer_waker: None,
            period,
            active: false,
            last_active: now,
            header_open_since: None,
            stalled: None,
        }
    }

    /// The wrapped stream (the TLS session, for its client certificates).
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// Reads `bytes` the client sent: which protocol, and on HTTP/2 which frames.
    fn note_read(&mut self, mut bytes: &[u8]) {
        if let Protocol::Unknown(matched) = self.protocol {
            let n = (PREFACE.len() - matched).min(bytes.len());
            if bytes[..n] != PREFACE[matched..matched + n] {
                self.protocol = Protocol::Http1;
                return;
            }
            bytes = &bytes[n..];
            self.protocol = if matched + n < PREFACE.len() {
                Protocol::Unknown(matched + n)
            } else {
                Protocol::Http2 {
                    reads: Frames::default(),
                    writes: Frames::default(),
                    last_stream: 0,
                    header_open: false,
                    goaway_sent: false,
                }
            };
        }
        if let Protocol::Http2 {
            reads,
            last_stream,
            header_open,
            ..
        } = &mut self.protocol
            && !bytes.is_empty()
        {
            let seen = reads.feed(bytes);
            self.active |= seen.request;
            *last_stream = (*last_stream).max(seen.last_stream);
            *header_open = seen.header_open;
        }
    }

    /// Notes `bytes` the server wrote: on HTTP/2 only requests' frames are activity.
    fn note_write(&mut self, bytes: &[u8]) {
        match &mut self.protocol {
            Protocol::Http2 { writes, .. } => self.active |= writes.feed(bytes).request,
            _ => self.active |= !bytes.is_empty(),
        }
    }

    /// True when a bound has passed; otherwise the timer wakes the reader by the next look.
    fn expired(&mut self, cx: &mut Context<'_>) -> bool {
        if !self.timer.is_elapsed()
            && self
                .timer_waker
                .as_ref()
                .is_some_and(|w| w.will_wake(cx.waker()))
        {
            return false;
        }
        while self.timer.as_mut().poll(cx).is_ready() {
            let now = Instant::now();
            if std::mem::take(&mut self.active) || self.activity.busy() {
                self.last_active = now;
            }
            let limits = self.limits;
            let over = match &self.protocol {
                Protocol::Http2 { header_open, .. } => {
                    self.header_open_since = match (*header_open, self.header_open_since) {
                        (false, _) => None,
                        (true, since) => Some(since.unwrap_or(now)),
                    };
                    now >= self.last_active + limits.idle
                        || self
                            .header_open_since
                            .is_some_and(|since| now >= since + limits.header_read)
                }
                // Waiting for a request's headers, the first or the next.
                Protocol::Unknown(_) | Protocol::Http1 => {
                    now >= self.last_active + limits.header_read
                }
            };
            if over {
                return true;
            }
            self.timer.as_mut().reset(now + self.period);
        }
        // Pending: the timer holds this waker now.
        if !self
            .timer_waker
            .as_ref()
            .is_some_and(|w| w.will_wake(cx.waker()))
        {
            self.timer_waker = Some(cx.waker().clone());
        }
        false
    }

    /// Runs a write; a write that has waited `write_stall` without progress fails.
    fn write_with_deadline<T>(
        &mut self,
        cx: &mut Context<'_>,
        write: impl FnOnce(Pin<&mut S>, &mut Context<'_>) -> Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>>
    where
        S: Unpin,
    {
        match write(Pin::new(&mut self.inner), cx) {
            Poll::Ready(result) => {
                self.stalled = None;
                Poll::Ready(result)
            }
            Poll::Pending => {
                let limit = self.limits.write_stall;
                let stalled = self
                    .stalled
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
                ready!(stalled.as_mut().poll(cx));
                Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the client has not read for the write timeout",
                )))
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> Guarded<S> {
    /// Tells an HTTP/2 client the connection is closing (GOAWAY, NO_ERROR, the last stream it
    /// opened), when our writes are between frames; best effort, once.
    fn send_goaway(&mut self, cx: &mut Context<'_>) {
        let Protocol::Http2 {
            writes,
            last_stream,
            goaway_sent,
            ..
        } = &mut self.protocol
        else {
            return;
        };
        if *goaway_sent || !writes.at_boundary() {
            return;
        }
        *goaway_sent = true;
        let mut frame = [0u8; 17];
        frame[2] = 8; // payload length
        frame[3] = 0x7; // GOAWAY
        frame[9..13].copy_from_slice(&last_stream.to_be_bytes());
        if let Poll::Ready(Ok(17)) = Pin::new(&mut self.inner).poll_write(cx, &frame) {
            let _ = Pin::new(&mut self.inner).poll_flush(cx);
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for Guarded<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                this.note_read(&buf.filled()[before..]);
                Poll::Ready(Ok(()))
            }
            Poll::Pending if this.expired(cx) => {
                tracing::debug!("closing a connection past its idle or header bound");
                this.send_goaway(cx);
                // End of stream: the server closes the connection as a client would.
                Poll::Ready(Ok(()))
            }
            other => other,
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Guarded<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let written = this.write_with_deadline(cx, |s, cx| s.poll_write(cx, buf));
        if let Poll::Ready(Ok(n)) = written {
            this.note_write(&buf[..n]);
        }
        written
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let written = this.write_with_deadline(cx, |s, cx| s.poll_write_vectored(cx, bufs));
        if let Poll::Ready(Ok(mut n)) = written {
            for buf in bufs {
                let part = n.min(buf.len());
                this.note_write(&buf[..part]);
                n -= part;
                if n == 0 {
                    break;
                }
            }
        }
        written
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut()
            .write_with_deadline(cx, |s, cx| s.poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut()
            .write_with_deadline(cx, |s, cx| s.poll_shutdown(cx))
    }
}

/// How much of a request body nobody read is still read (and discarded) after the response:
/// enough for any body this server accepts and the 413 it answers to a larger one.
pub const DRAIN_BYTES: u64 = 4 * 1024 * 1024;
/// How long such a body is still read after the response.
pub const DRAIN_TIME: Duration = Duration::from_secs(10);

/// A response body that keeps its connection counted as busy until it is sent or dropped
/// (a watch, a streamed list).
/// (Or anything else held while a body is sent: a place among the requests in flight.)
pub struct Holding<B, G = InFlight> {
    inner: B,
    _held: G,
}

impl<B, G> Holding<B, G> {
    /// `inner`, keeping `held` until the body is sent or dropped.
    pub fn new(inner: B, held: G) -> Self {
        Self { inner, _held: held }
    }
}

impl<B: Body + Unpin, G: Unpin> Body for Holding<B, G> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A request body that, dropped before its end, is read to its end in the background (up to
/// [`DRAIN_BYTES`] and [`DRAIN_TIME`]), so the client's writes complete and it reads the
/// response.
pub struct Drained<B: Body + Send + Unpin + 'static> {
    inner: Option<B>,
    read: u64,
    /// Finished, or not to be drained: HTTP/2 resets a stream whose response ended first
    /// (RFC 9113 8.1), and a client waiting for `100 Continue` sends nothing until asked.
    done: bool,
}

impl<B: Body + Send + Unpin + 'static> Drained<B> {
    /// `inner`, drained when dropped early if `drain` (the server passes false for HTTP/2 and
    /// for requests with an `Expect` header, whose unread bodies are left alone).
    pub fn new(inner: B, drain: bool) -> Self {
        Self {
            inner: Some(inner),
            read: 0,
            done: !drain,
        }
    }
}

impl<B> Body for Drained<B>
where
    B: Body<Data = Bytes> + Send + Unpin + 'static,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.get_mut();
        let Some(inner) = this.inner.as_mut() else {
            return Poll::Ready(None);
        };
        let frame = ready!(Pin::new(inner).poll_frame(cx));
        match &frame {
            None | Some(Err(_)) => this.done = true,
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    this.read += data.len() as u64;
                }
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), Body::size_hint)
    }
}

impl<B: Body + Send + Unpin + 'static> Drop for Drained<B> {
    fn drop(&mut self) {
        let Some(mut inner) = self.inner.take() else {
            return;
        };
        if self.done || inner.is_end_stream() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let mut budget = DRAIN_BYTES.saturating_sub(self.read);
        runtime.spawn(async move {
            let drain = async {
                use http_body_util::BodyExt;
                while budget > 0 {
                    match inner.frame().await {
                        Some(Ok(frame)) => {
                            let len = frame.data_ref().map_or(0, |d| d.remaining() as u64);
                            budget = budget.saturating_sub(len);
                        }
                        _ => break,
                    }
                }
            };
            let _ = tokio::time::timeout(DRAIN_TIME, drain).await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(frame_type: u8, flags: u8, stream: u32, payload: usize) -> Vec<u8> {
        let mut out = vec![0u8; 9 + payload];
        out[0..3].copy_from_slice(&(payload as u32).to_be_bytes()[1..]);
        out[3] = frame_type;
        out[4] = flags;
        out[5..9].copy_from_slice(&stream.to_be_bytes());
        out
    }

    #[test]
    fn control_frames_are_not_requests_in_any_split() {
        let mut bytes = Vec::new();
        for _ in 0..5 {
            bytes.extend(frame(0x6, 0, 0, 8)); // PING
            bytes.extend(frame(0x6, 0x1, 0, 8)); // PING ack
            bytes.extend(frame(0x4, 0, 0, 12)); // SETTINGS
            bytes.extend(frame(0x8, 0, 0, 4)); // WINDOW_UPDATE
        }
        for chunk in [1, 7, 9, 17, 1000] {
            let mut frames = Frames::default();
            let seen: Vec<Seen> = bytes.chunks(chunk).map(|c| frames.feed(c)).collect();
            assert!(seen.iter().all(|s| !s.request && !s.header_open), "{chunk}");
            assert!(frames.at_boundary());
        }
        let mut frames = Frames::default();
        let mut request = frame(0x6, 0, 0, 8);
        request.extend(frame(0x1, END_HEADERS, 3, 20));
        let seen = frames.feed(&request);
        assert!(seen.request && !seen.header_open);
        assert_eq!(seen.last_stream, 3);
    }

    #[test]
    fn a_header_block_is_open_until_its_end_headers_frame_is_whole() {
        let mut frames = Frames::default();
        assert!(frames.feed(&frame(0x1, 0, 1, 10)).header_open);
        let continuation = frame(0x9, END_HEADERS, 1, 10);
        assert!(frames.feed(&continuation[..12]).header_open);
        assert!(!frames.feed(&continuation[12..]).header_open);
        assert!(frames.at_boundary());
    }

    #[tokio::test(start_paused = true)]
    async fn busy_means_in_flight_or_ended_since_the_last_look() {
        let activity = Arc::new(Activity::default());
        assert!(!activity.busy());
        let guard = activity.begin();
        assert!(activity.busy());
        drop(guard);
        assert!(activity.busy());
        assert!(!activity.busy());
    }
}
