//! [`App`], the whole HTTP surface as one service: hyper's and tower's `Service` over the
//! [`Edge`], one per connection (its verified client certificates, its activity, its peer).

use std::sync::Arc;

use axum::response::Response;

use super::edge::{Edge, Handled, held_while_streamed};
use crate::{
    auth::PeerCertificates, net::connection, net::tls, observe::health, observe::recovery,
    render::compression, rest,
};

/// The whole HTTP surface as one service, for the TLS listener and for `oneshot` tests alike:
/// the probes go straight to `health`, everything else through the edge. Not an axum
/// `Router` with the edge as fallback (see PERFORMANCE.md).
///
/// The listener makes one per connection, told the connection's verified client certificates
/// ([`tls::ConnectionService`]); requests without them (tests) may carry them as an extension.
#[derive(Clone)]
pub struct App {
    pub(super) edge: Arc<Edge>,
    pub(super) peer: Option<PeerCertificates>,
    /// The connection's activity, for its idle bound (none in `oneshot` tests).
    pub(super) activity: Option<Arc<connection::Activity>>,
    /// The peer's address (none in `oneshot` tests).
    pub(super) remote: Option<std::net::IpAddr>,
}

impl tls::ConnectionService for App {
    fn for_connection(
        mut self,
        chain: Vec<rustls_pki_types::CertificateDer<'static>>,
        activity: Arc<connection::Activity>,
        remote: Option<std::net::IpAddr>,
    ) -> Self {
        self.peer = Some(PeerCertificates::new(chain));
        self.activity = Some(activity);
        self.remote = remote;
        self
    }
}

type AppFuture = futures::future::Either<
    std::future::Ready<Result<Response, std::convert::Infallible>>,
    futures::future::BoxFuture<'static, Result<Response, std::convert::Infallible>>,
>;

impl<B> tower::Service<axum::http::Request<B>> for App
where
    B: axum::body::HttpBody<Data = axum::body::Bytes> + Send + Unpin + 'static,
    B::Error: Into<axum::BoxError>,
{
    type Response = Response;
    type Error = std::convert::Infallible;
    type Future = AppFuture;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: axum::http::Request<B>) -> Self::Future {
        self.respond(request)
    }
}

/// What the listener serves: hyper calls it by reference, where hyper-util's tower glue would
/// clone the service (its `Arc`s) and wrap each request in a `Oneshot`.
impl<B> hyper::service::Service<axum::http::Request<B>> for App
where
    B: axum::body::HttpBody<Data = axum::body::Bytes> + Send + Unpin + 'static,
    B::Error: Into<axum::BoxError>,
{
    type Response = Response;
    type Error = std::convert::Infallible;
    type Future = AppFuture;

    fn call(&self, request: axum::http::Request<B>) -> Self::Future {
        self.respond(request)
    }
}

impl App {
    fn respond<B>(&self, request: axum::http::Request<B>) -> AppFuture
    where
        B: axum::body::HttpBody<Data = axum::body::Bytes> + Send + Unpin + 'static,
        B::Error: Into<axum::BoxError>,
    {
        use futures::future::Either;
        // A body nobody reads (an early 401, 413...) is still read, so the client sees the
        // answer (see `connection`). A body already at its end (a GET's) has nothing to drain,
        // and its headers need no lookup.
        let drain = request.version() <= axum::http::Version::HTTP_11
            && !http_body::Body::is_end_stream(request.body())
            && !request.headers().contains_key(axum::http::header::EXPECT);
        let mut request = request.map(|body| connection::Drained::new(body, drain));
        if health::is_probe(request.uri().path()) {
            // Probes: kubelet polls them every few seconds; they are not traffic.
            let request = request.map(axum::body::Body::new);
            return Either::Right(Box::pin(tower::Service::call(
                &mut self.edge.probes.clone(),
                request,
            )));
        }
        let from_request;
        let peer = match &self.peer {
            Some(peer) => Some(peer),
            None => {
                from_request = request.extensions().get::<PeerCertificates>().cloned();
                from_request.as_ref()
            }
        };
        let edge = &self.edge;
        let pending =
            match recovery::catch_sync(|| edge.handle_sync(peer, self.remote, &mut request)) {
                Some(Handled::Answered(response)) => {
                    // Only a body over the threshold (rare here) looks at Accept-Encoding.
                    let gzip = compression::may_compress(&response)
                        && compression::accepts_gzip(request.headers());
                    rest::response::recycle_headers(std::mem::take(request.headers_mut()));
                    if gzip {
                        return Either::Right(Box::pin(async move {
                            Ok(compression::gzip_if_large(response).await)
                        }));
                    }
                    return Either::Left(std::future::ready(Ok(response)));
                }
                Some(Handled::Reading(later)) => {
                    let gzip = compression::accepts_gzip(request.headers());
                    rest::response::recycle_headers(std::mem::take(request.headers_mut()));
                    let busy = self.activity.as_ref().map(|a| a.begin());
                    let answered = edge.clone().answer_when_read(later);
                    return Either::Right(Box::pin(async move {
                        let mut response = answered.await;
                        if gzip {
                            response = compression::gzip_if_large(response).await;
                        }
                        drop(busy);
                        Ok(response)
                    }));
                }
                Some(Handled::Waiting(pending)) => pending,
                None => {
                    let response = edge.panicked(request.method(), request.uri());
                    return Either::Left(std::future::ready(Ok(response)));
                }
            };
        let edge = self.edge.clone();
        let gzip = compression::accepts_gzip(request.headers());
        let mut request = request.map(axum::body::Body::new);
        if let Some(remote) = self.remote {
            request
                .extensions_mut()
                .insert(connection::RemoteAddr(remote));
        }
        let (method, uri) = (request.method().clone(), request.uri().clone());
        let in_flight = self.activity.as_ref().map(|a| a.begin());
        Either::Right(Box::pin(async move {
            let response = match recovery::catch(edge.clone().handle(request, pending)).await {
                Some(response) => response,
                None => edge.panicked(&method, &uri),
            };
            let response = if gzip {
                compression::gzip_if_large(response).await
            } else {
                response
            };
            // A streamed body (a watch, a large list) keeps the connection busy until it ends.
            Ok(held_while_streamed(response, in_flight))
        }))
    }
}
