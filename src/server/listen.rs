//! Serving [`App`] over TLS: bind, spawn with a stop future, graceful shutdown on signals.

use std::{
    net::SocketAddr,
    time::{Duration, Instant},
};

use super::{App, Shutdown};
use crate::{connection, tls};

/// The HTTPS listener, bound and configured, not serving yet (as kubert's `Bound`).
pub struct Bound {
    addr: SocketAddr,
    server: axum_server::Server<SocketAddr, tls::Acceptor>,
}

/// A listener serving in the background.
pub struct Running {
    /// The address it listens on (the actual port when bound to port 0).
    pub addr: SocketAddr,
    handle: axum_server::Handle<SocketAddr>,
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
    let mut server = axum_server::from_tcp(listener)?.acceptor(tls::Acceptor::new(tls, limits));
    let builder = server.http_builder();
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
    Ok(Bound { addr, server })
}

impl Bound {
    /// The address bound (the actual port when bound to port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Serves `app` until `stop` completes; then the listener stops accepting and requests in
    /// flight get `grace` to finish.
    pub fn spawn(
        self,
        app: App,
        stop: impl std::future::Future<Output = ()> + Send + 'static,
        grace: Duration,
    ) -> Running {
        let handle = axum_server::Handle::<SocketAddr>::new();
        let stopping = handle.clone();
        tokio::spawn(async move {
            stop.await;
            stopping.graceful_shutdown(Some(grace));
        });
        let server = self.server.handle(handle.clone());
        let task = tokio::spawn(async move { server.serve(tower::make::Shared::new(app)).await });
        Running {
            addr: self.addr,
            handle,
            task,
        }
    }
}

impl Running {
    /// Waits until the listener accepts connections.
    pub async fn listening(&self) {
        let _ = self.handle.listening().await;
    }

    /// Stops accepting and closes connections now.
    pub fn stop(&self) {
        self.handle.shutdown();
    }

    /// Waits until the server has stopped.
    pub async fn stopped(self) -> anyhow::Result<()> {
        self.task.await??;
        Ok(())
    }
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
/// finish.
pub async fn serve(
    bound: Bound,
    app: App,
    shutdown: Shutdown,
    timing: ShutdownTiming,
    started: Instant,
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
        "serving farm.example.com/v1alpha"
    );
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
