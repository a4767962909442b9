//! Serving [`App`] over TLS: bind, accept, serve each connection with hyper, graceful shutdown
//! on signals.
//!
//! The accept loop is our own rather than axum-server's: that one polls two shutdown `Notified`
//! futures every time it polls a connection (a few hundred instructions a GET over HTTP/2, see
//! PERFORMANCE.md). Here a connection learns of a shutdown from a flag it reads when polled,
//! and is woken for it through the waker it registered once.

use std::{
    collections::HashMap,
    future::Future,
    net::SocketAddr,
    pin::pin,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering::SeqCst},
    },
    task::{Poll, Waker},
    time::{Duration, Instant},
};

use axum_server::accept::Accept;
use hyper_util::{
    rt::{TokioExecutor, TokioIo},
    server::conn::auto,
};
use tokio::sync::watch;

use super::{App, Shutdown};
use crate::{net::connection, net::tls};

/// The HTTPS listener, bound and configured, not serving yet (as kubert's `Bound`).
pub struct Bound {
    addr: SocketAddr,
    listener: std::net::TcpListener,
    acceptor: tls::Acceptor,
    builders: Builders,
}

/// The connection builders, one per protocol the TLS handshake can settle: a connection whose
/// ALPN chose `h2` or `http/1.1` is served in it at once, as Go's server does. Only one without
/// ALPN has its first bytes read to tell (hyper-util's sniffing, which also makes HTTP/1.1's
/// first read 24 bytes and so doubles its read buffer, 8 to 16 KiB a connection).
struct Builders {
    sniffing: auto::Builder<TokioExecutor>,
    http1: auto::Builder<TokioExecutor>,
    http2: auto::Builder<TokioExecutor>,
}

impl Builders {
    fn new(sniffing: auto::Builder<TokioExecutor>) -> Self {
        Self {
            http1: sniffing.clone().http1_only(),
            http2: sniffing.clone().http2_only(),
            sniffing,
        }
    }

    /// The builder for a connection that negotiated `alpn`.
    fn for_alpn(&self, alpn: Option<&[u8]>) -> &auto::Builder<TokioExecutor> {
        match alpn {
            Some(b"h2") => &self.http2,
            Some(b"http/1.1") => &self.http1,
            _ => &self.sniffing,
        }
    }
}

/// A listener serving in the background.
pub struct Running {
    /// The address it listens on (the actual port when bound to port 0).
    pub addr: SocketAddr,
    connections: Arc<Connections>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

/// Binds the HTTPS listener as kube-apiserver bounds it: request headers within
/// `limits.header_read` (32 s, also what an HTTP/1.1 connection may wait for its next request),
/// idle connections closed after `limits.idle`, stalled writes after `limits.write_stall`;
/// header lists up to 1 MiB (users with many groups behind the aggregator). No server pings, as
/// kube-apiserver sends none: a peer that is gone is noticed by the idle and write bounds.
pub fn bind(
    listener: std::net::TcpListener,
    tls: axum_server::tls_rustls::RustlsConfig,
    limits: connection::Limits,
) -> std::io::Result<Bound> {
    const MAX_HEADER_BYTES: u32 = 1 << 20;
    listener.set_nonblocking(true)?;
    let addr = listener.local_addr()?;
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        // The header-read bound is the connection guard's (no timer per request).
        .header_read_timeout(None)
        // hyper's 100 headers stay (see PERFORMANCE.md); the aggregator speaks HTTP/2 to us.
        .max_buf_size(MAX_HEADER_BYTES as usize + 64 * 1024);
    builder
        .http2()
        .max_header_list_size(MAX_HEADER_BYTES)
        .max_concurrent_streams(250);
    Ok(Bound {
        addr,
        listener,
        acceptor: tls::Acceptor::new(tls, limits),
        builders: Builders::new(builder),
    })
}

impl Bound {
    /// The address bound (the actual port when bound to port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Serves `app` until `stop` completes; then the listener closes and requests in flight get
    /// `grace` to finish (HTTP/2 connections are sent a GOAWAY, HTTP/1.1 ones close after their
    /// current request); connections still open after it are closed.
    pub fn spawn(
        self,
        app: App,
        stop: impl Future<Output = ()> + Send + 'static,
        grace: Duration,
    ) -> Running {
        let connections = Arc::new(Connections::default());
        let addr = self.addr;
        let task = tokio::spawn(accept_loop(self, app, connections.clone(), stop, grace));
        Running {
            addr,
            connections,
            task,
        }
    }
}

impl Running {
    /// Waits until the listener accepts connections (it does from [`Bound::spawn`] on: the
    /// socket is bound and listening before).
    pub async fn listening(&self) {}

    /// Stops accepting and closes connections now.
    pub fn stop(&self) {
        self.connections.stop(Stop::Immediately);
    }

    /// Waits until the server has stopped.
    pub async fn stopped(self) -> anyhow::Result<()> {
        self.task.await??;
        Ok(())
    }
}

/// How far a shutdown has gone.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Stop {
    #[default]
    Serving,
    /// No new connections; open ones finish what they are doing.
    Graceful,
    /// Every connection closes.
    Immediately,
}

/// The connections being served, and what tells them to stop.
#[derive(Default)]
struct Connections {
    graceful: AtomicBool,
    now: AtomicBool,
    /// The tasks to wake when the stop moves on, by connection.
    wakers: Mutex<HashMap<u64, Waker>>,
    next_id: AtomicU64,
    /// How far the shutdown has gone, and how many connections are open (the accept loop
    /// waits on it).
    state: watch::Sender<(Stop, usize)>,
}

impl Connections {
    fn stop(&self, stop: Stop) {
        match stop {
            Stop::Serving => return,
            Stop::Graceful => self.graceful.store(true, SeqCst),
            Stop::Immediately => {
                self.graceful.store(true, SeqCst);
                self.now.store(true, SeqCst);
            }
        }
        self.state
            .send_modify(|(current, _)| *current = (*current).max(stop));
        // Woken after the flags are set: a connection registers its waker before it reads them.
        if let Ok(wakers) = self.wakers.lock() {
            wakers.values().for_each(Waker::wake_by_ref);
        }
    }

    fn opened(self: &Arc<Self>) -> Registration {
        self.state.send_modify(|(_, open)| *open += 1);
        Registration {
            connections: self.clone(),
            id: self.next_id.fetch_add(1, SeqCst),
            waker: None,
        }
    }
}

/// One open connection's place in [`Connections`]; dropped when it closes.
struct Registration {
    connections: Arc<Connections>,
    id: u64,
    waker: Option<Waker>,
}

impl Registration {
    /// Registers the task's waker when it is new (a spawned task's waker stays the same, so
    /// this locks once), then reads how far a shutdown has gone.
    fn poll_stop(&mut self, waker: &Waker) -> Stop {
        if !self
            .waker
            .as_ref()
            .is_some_and(|known| known.will_wake(waker))
        {
            if let Ok(mut wakers) = self.connections.wakers.lock() {
                wakers.insert(self.id, waker.clone());
            }
            self.waker = Some(waker.clone());
        }
        if self.connections.now.load(SeqCst) {
            Stop::Immediately
        } else if self.connections.graceful.load(SeqCst) {
            Stop::Graceful
        } else {
            Stop::Serving
        }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Ok(mut wakers) = self.connections.wakers.lock() {
            wakers.remove(&self.id);
        }
        self.connections.state.send_modify(|(_, open)| *open -= 1);
    }
}

async fn accept_loop(
    bound: Bound,
    app: App,
    connections: Arc<Connections>,
    stop: impl Future<Output = ()> + Send + 'static,
    grace: Duration,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::from_std(bound.listener)?;
    let builders = Arc::new(bound.builders);
    let acceptor = bound.acceptor;
    {
        let stopping = connections.clone();
        tokio::spawn(async move {
            stop.await;
            stopping.stop(Stop::Graceful);
        });
    }
    let mut state = connections.state.subscribe();
    loop {
        let accepted = tokio::select! {
            biased;
            _ = state.wait_for(|(stop, _)| *stop != Stop::Serving) => break,
            accepted = listener.accept() => accepted,
        };
        let tcp = match accepted {
            Ok((tcp, _)) => tcp,
            Err(error) => {
                // Out of descriptors, mostly: try again shortly rather than spin.
                tracing::warn!(%error, "accepting a connection");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let registration = connections.opened();
        let accept = acceptor.accept(tcp, app.clone());
        let builders = builders.clone();
        tokio::spawn(serve_connection(registration, accept, builders));
    }
    // The listener closes now: new connections are refused rather than left waiting.
    drop(listener);
    let closed = |(_, open): &(Stop, usize)| *open == 0;
    if tokio::time::timeout(grace, state.wait_for(closed))
        .await
        .is_err()
    {
        connections.stop(Stop::Immediately);
        let _ = state.wait_for(closed).await;
    }
    Ok(())
}

async fn serve_connection(
    mut registration: Registration,
    accept: <tls::Acceptor as Accept<tokio::net::TcpStream, App>>::Future,
    builders: Arc<Builders>,
) {
    let mut accept = accept;
    let handshake = std::future::poll_fn(|cx| match registration.poll_stop(cx.waker()) {
        Stop::Immediately => Poll::Ready(None),
        _ => accept.as_mut().poll(cx).map(Some),
    });
    let handshaken = handshake.await;
    // The handshake's state (about 1.5 KiB) is not kept for the connection's life.
    drop(accept);
    let Some(Ok((stream, service))) = handshaken else {
        return; // the handshake failed or timed out, or the server stopped
    };
    let builder = builders.for_alpn(stream.get_ref().get_ref().1.alpn_protocol());
    let mut connection = pin!(builder.serve_connection(TokioIo::new(stream), service));
    let mut draining = false;
    std::future::poll_fn(|cx| {
        match registration.poll_stop(cx.waker()) {
            Stop::Serving => {}
            Stop::Graceful if draining => {}
            Stop::Graceful => {
                connection.as_mut().graceful_shutdown();
                draining = true;
            }
            Stop::Immediately => return Poll::Ready(()),
        }
        connection.as_mut().poll(cx).map(|_| ())
    })
    .await;
}

/// Shutdown timing: see [`serve`].
#[derive(Debug, Clone, Copy)]
pub struct ShutdownTiming {
    /// From the signal (readiness fails at once) to ending watches and closing the listener,
    /// so that load balancers stop sending traffic first.
    pub delay: Duration,
    /// What in-flight requests get to finish once the listener is closed.
    pub grace: Duration,
}

/// Serves `app` on `bound` until SIGTERM/SIGINT, then: readiness fails, after `timing.delay`
/// watches end and the listener stops accepting, in-flight requests get `timing.grace` to
/// finish. `serving` is called once the listener accepts.
pub async fn serve(
    bound: Bound,
    app: App,
    shutdown: Shutdown,
    timing: ShutdownTiming,
    (started, serving): (Instant, fn()),
) -> anyhow::Result<()> {
    let stop = async move {
        wait_for_signal().await;
        tracing::info!("shutting down: readiness now fails");
        shutdown.begin();
        tokio::time::sleep(timing.delay).await;
        shutdown.end_watches();
    };
    let running = bound.spawn(app, stop, timing.grace);
    running.listening().await;
    tracing::info!(
        addr = %running.addr,
        startup_ms = started.elapsed().as_millis() as u64,
        "serving"
    );
    serving();
    running.stopped().await?;
    tracing::info!("stopped");
    Ok(())
}

async fn wait_for_signal() {
    let ctrl_c = async {
        if let Err(error) = tokio::signal::ctrl_c().await {
            tracing::warn!(%error, "cannot listen for Ctrl+C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = terminate => {},
    }
}
