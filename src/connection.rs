//! What one client connection may hold, as Go's net/http and kube-apiserver bound it:
//!
//! - **idle**: a connection with no request in flight for `idle` (90 s) is closed, HTTP/2 pings
//!   or not (an HTTP/1.1 connection waiting for its next request is also bound by hyper's
//!   header-read timeout);
//! - **stalled writes**: a connection whose writes make no progress for `write_stall` (a client
//!   that stopped reading) is closed;
//! - **request bodies**: a body a handler did not read (an early 401, 413, 415...) is read and
//!   discarded, up to a bound, so that a client that writes its whole body before reading
//!   (Python's http.client, Go's for small bodies) gets the Status and not a connection reset,
//!   as Go's net/http reads up to 256 KiB after a handler for the same reason.

use std::{
    future::Future as _,
    io,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    task::{Context, Poll, ready},
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
    /// How long a connection may stay open with no request in flight (`--idle-timeout`).
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

/// What a connection's requests tell its reader about it: how many are in flight, and since
/// when none has been.
#[derive(Debug)]
pub struct Activity {
    epoch: Instant,
    in_flight: AtomicUsize,
    /// Milliseconds after `epoch` of the last request's start or end.
    last_request: AtomicU64,
}

impl Default for Activity {
    fn default() -> Self {
        Self {
            epoch: Instant::now(),
            in_flight: AtomicUsize::new(0),
            last_request: AtomicU64::new(0),
        }
    }
}

impl Activity {
    fn millis(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn touch(&self) {
        self.last_request.store(self.millis(), Ordering::Relaxed);
    }

    /// A request that takes a while (its response body included): the connection is not idle
    /// until the guard is dropped. (A request answered at once needs none: its response's
    /// writes count as activity.)
    pub fn begin(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::Acquire);
        InFlight(self.clone())
    }

    /// When the connection became idle, or None while a request is in flight.
    fn idle_since(&self) -> Option<Instant> {
        (self.in_flight.load(Ordering::Acquire) == 0)
            .then(|| self.epoch + Duration::from_millis(self.last_request.load(Ordering::Relaxed)))
    }
}

/// A request in flight on a connection ([`Activity::begin`]); dropping it ends the request.
pub struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.touch();
        self.0.in_flight.fetch_sub(1, Ordering::Release);
    }
}

/// Writes this small are HTTP/2 control frames (PING acks, WINDOW_UPDATE, SETTINGS acks): a
/// client's keep-alive pings are not activity, a response is (Go's http2 server counts streams,
/// not pings).
const CONTROL_WRITE: usize = 32;

/// A connection's stream with the idle and stalled-write bounds of [`Limits`].
pub struct Guarded<S> {
    inner: S,
    limits: Limits,
    activity: Arc<Activity>,
    idle: Pin<Box<Sleep>>,
    stalled: Option<Pin<Box<Sleep>>>,
    /// A response was written since the idle timer was last looked at: a cached GET answered
    /// at once, or a large body still going out, keeps the connection from being idle.
    wrote: bool,
}

impl<S> Guarded<S> {
    /// Bounds `inner` by `limits`; `activity` is the one the connection's service was given.
    pub fn new(inner: S, limits: Limits, activity: Arc<Activity>) -> Self {
        let idle = Box::pin(tokio::time::sleep(limits.idle));
        Self {
            inner,
            limits,
            activity,
            idle,
            stalled: None,
            wrote: false,
        }
    }

    /// The wrapped stream (the TLS session, for its client certificates).
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// True when the connection has been idle for the whole bound; otherwise the timer wakes
    /// the reader by then. The timer is moved only when it fires early (requests came since it
    /// was set), not on every request: moving a timer is a trip through the timer wheel.
    fn idle_expired(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(since) = self.activity.idle_since() else {
            return false;
        };
        let deadline = since + self.limits.idle;
        if self.idle.deadline() > deadline {
            self.idle.as_mut().reset(deadline);
        }
        loop {
            if self.idle.as_mut().poll(cx).is_pending() {
                return false;
            }
            if std::mem::take(&mut self.wrote) {
                // Responses went out meanwhile: idle from now, at the earliest.
                self.activity.touch();
                self.idle.as_mut().reset(Instant::now() + self.limits.idle);
                continue;
            }
            if Instant::now() >= deadline {
                return true;
            }
            self.idle.as_mut().reset(deadline);
        }
    }

    fn note_write(&mut self, written: &Poll<io::Result<usize>>) {
        if let Poll::Ready(Ok(n)) = written
            && *n > CONTROL_WRITE
        {
            self.wrote = true;
        }
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

impl<S: AsyncRead + Unpin> AsyncRead for Guarded<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Pending if this.idle_expired(cx) => {
                tracing::debug!("closing an idle connection");
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
        this.note_write(&written);
        written
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let written = this.write_with_deadline(cx, |s, cx| s.poll_write_vectored(cx, bufs));
        this.note_write(&written);
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
pub struct Holding<B> {
    inner: B,
    _in_flight: InFlight,
}

impl<B> Holding<B> {
    /// `inner`, keeping `in_flight` until the body is sent or dropped.
    pub fn new(inner: B, in_flight: InFlight) -> Self {
        Self {
            inner,
            _in_flight: in_flight,
        }
    }
}

impl<B: Body + Unpin> Body for Holding<B> {
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

    #[tokio::test(start_paused = true)]
    async fn idle_is_counted_from_the_last_request_and_never_while_one_is_in_flight() {
        let activity = Arc::new(Activity::default());
        assert!(activity.idle_since().is_some());
        let guard = activity.begin();
        assert_eq!(activity.idle_since(), None);
        tokio::time::advance(Duration::from_secs(5)).await;
        drop(guard);
        let since = activity.idle_since().unwrap();
        assert!(since >= activity.epoch + Duration::from_secs(5));
    }
}
