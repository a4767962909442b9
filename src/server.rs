//! Wiring: the shared state, the one router factory, and serving it over TLS with graceful
//! shutdown.

use std::{
    net::SocketAddr,
    sync::Arc,
    time::{Duration, Instant},
};

use axum::{
    Router,
    extract::{Request, State},
    http::{HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
    routing::get,
};
use tokio_util::sync::CancellationToken;

use crate::{
    auth::{
        self, Auth, AuthStep, Authenticator, AuthnConfig, Authorizer, PeerCertificates, UserInfo,
        authn::Groups,
    },
    connection,
    discovery::{self, DiscoveryDocuments},
    error::{Error, ErrorReason},
    group::{self, ApiGroup},
    health::{self, Health},
    metrics::Metrics,
    openapi::{self, OpenApiDocuments},
    recovery,
    request_info::RequestInfo,
    resources::Llama,
    rest::{self, RestContext, RestSettings},
    store::{PodCache, Store},
    tls,
};

/// Ends watches and tells the health checks the server is going away. Dropping it does
/// neither: only [`Shutdown::end_watches`] ends watches.
#[derive(Clone)]
pub struct Shutdown {
    watches: CancellationToken,
    health: Arc<Health>,
}

impl Shutdown {
    /// Readiness fails from now on.
    pub fn begin(&self) {
        self.health.start_shutdown();
    }

    /// Open watches end cleanly (their streams close).
    pub fn end_watches(&self) {
        self.watches.cancel();
    }
}

/// Everything the handlers share. Cheap to clone.
#[derive(Clone)]
pub struct AppState {
    /// The served kinds' REST endpoints.
    pub endpoints: Arc<rest::Endpoints>,
    /// Authentication and authorization of every request but the probes.
    pub auth: Arc<Auth>,
    /// The registry `/metrics` renders; the same one as in `rest`.
    pub metrics: Arc<Metrics>,
    /// What `/healthz`, `/livez` and `/readyz` answer.
    pub health: Arc<Health>,
    /// The discovery documents, built once from the served kinds.
    pub discovery: Arc<DiscoveryDocuments>,
    /// The OpenAPI v2 and v3 documents, built once from the served kinds.
    pub openapi: Arc<OpenApiDocuments>,
    /// What the resource handlers share: metrics, the watch shutdown token, the timeouts.
    pub rest: RestContext,
}

/// Who is trusted, and the cluster that reviews tokens and access.
#[derive(Clone)]
pub struct AuthOptions {
    /// The trusted CAs and front-proxy settings at start; with a cluster, `config::Args::run`
    /// replaces them whenever the `extension-apiserver-authentication` ConfigMap changes.
    pub config: AuthnConfig,
    /// TokenReview and SubjectAccessReview go here; None = standalone.
    pub cluster: Option<kube::Client>,
    /// How long an allowing SubjectAccessReview answer is cached
    /// (`--authorization-webhook-cache-authorized-ttl`).
    pub allow_ttl: Duration,
    /// How long a denying SubjectAccessReview answer is cached
    /// (`--authorization-webhook-cache-unauthorized-ttl`).
    pub deny_ttl: Duration,
    /// How long a TokenReview answer is cached (`--authentication-token-webhook-cache-ttl`).
    pub token_ttl: Duration,
}

impl Default for AuthOptions {
    fn default() -> Self {
        Self {
            config: AuthnConfig::default(),
            cluster: None,
            allow_ttl: Duration::from_secs(10),
            deny_ttl: Duration::from_secs(10),
            token_ttl: Duration::from_secs(10),
        }
    }
}

impl AuthOptions {
    /// The authenticator and authorizer; bearer tokens are reviewed only with a cluster.
    pub fn build(self) -> Arc<Auth> {
        let tokens = self
            .cluster
            .clone()
            .map(|c| auth::authn::TokenReviewer::new(c, self.token_ttl));
        Arc::new(Auth {
            authn: Authenticator::new(self.config, tokens),
            authz: Authorizer::new(self.cluster, self.allow_ttl, self.deny_ttl),
        })
    }
}

/// What [`AppState::new`] takes besides the kinds.
#[derive(Clone)]
pub struct StateOptions {
    /// Watch and request timeouts, bookmark interval.
    pub rest: RestSettings,
    /// Shared with whatever replaces its configuration (the ConfigMap follower).
    pub auth: Arc<Auth>,
}

impl Default for StateOptions {
    /// Nobody can authenticate: tests and callers set `auth`.
    fn default() -> Self {
        Self {
            rest: RestSettings::default(),
            auth: AuthOptions::default().build(),
        }
    }
}

impl AppState {
    /// farm-apiserver's kinds: Llamas from `llamas`, FarmPods from `farmpods` (whose sync
    /// readiness joins `/readyz`).
    pub fn farm(
        llamas: Arc<dyn Store<Llama>>,
        farmpods: Arc<PodCache>,
        options: StateOptions,
    ) -> (Self, Shutdown) {
        let (state, shutdown) = Self::new(group::farm(llamas, farmpods.clone()), options);
        for check in farmpods.readiness_checks() {
            state.health.add_readiness_check(check);
        }
        (state, shutdown)
    }

    /// Serves the kinds of `group`.
    pub fn new(group: ApiGroup, options: StateOptions) -> (Self, Shutdown) {
        let watches = CancellationToken::new();
        let health = Health::new();
        let plurals: Vec<&'static str> = group.resources().iter().map(|r| r.plural).collect();
        let metrics = Metrics::new(&plurals);
        let rest = RestContext {
            metrics: metrics.clone(),
            shutdown: watches.clone(),
            settings: Arc::new(options.rest),
        };
        let (resources, endpoints) = group.endpoints(&rest);
        let state = Self {
            endpoints: Arc::new(endpoints),
            auth: options.auth,
            metrics,
            health: health.clone(),
            discovery: Arc::new(DiscoveryDocuments::new(&resources)),
            openapi: Arc::new(OpenApiDocuments::new(&resources)),
            rest,
        };
        let shutdown = Shutdown { watches, health };
        (state, shutdown)
    }
}

async fn version() -> Response {
    let info = k8s_openapi::apimachinery::pkg::version::Info {
        major: "0".into(),
        minor: env!("CARGO_PKG_VERSION_MINOR").into(),
        git_version: concat!("v", env!("CARGO_PKG_VERSION")).into(),
        git_commit: option_env!("FARM_GIT_COMMIT").unwrap_or("").into(),
        compiler: "rustc".into(),
        platform: format!("{}/{}", std::env::consts::OS, std::env::consts::ARCH),
        ..Default::default()
    };
    let mut response = axum::Json(info).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

async fn metrics_handler(State(state): State<AppState>) -> Response {
    for (resource, objects) in state.endpoints.stored_objects().await {
        state.metrics.set_stored(&resource, objects);
    }
    let mut response = (StatusCode::OK, state.metrics.render()).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    response
}

/// Every request but the probes passes here once: who is it and may they (auth), then the
/// resource endpoint or the router, then metrics and one log line labelled as kube-apiserver
/// labels them. [`App`] calls it directly rather than through `middleware::from_fn`, which
/// boxes the rest of the stack again for every request.
struct Edge {
    /// The health probes, which skip the edge's auth, metrics and log.
    probes: Router,
    auth: Arc<Auth>,
    metrics: Arc<Metrics>,
    endpoints: Arc<rest::Endpoints>,
    /// Discovery, OpenAPI, /version, /metrics and the 404 fallback.
    router: Router,
    /// What a request other than a watch may take (kube-apiserver's `--request-timeout`).
    request_timeout: Duration,
}

/// What the edge learned of a request before it had to wait, handed to [`Edge::handle`] so
/// nothing is parsed, routed or checked twice.
struct Pending {
    started: Instant,
    auth: AuthStep,
    /// The resource endpoint, or None for the router (discovery, OpenAPI, ...).
    route: Option<rest::Route>,
    log: RequestLog,
}

/// What the request log and the metrics say of a request, owned.
struct RequestLog {
    verb: &'static str,
    resource: String,
    namespace: String,
    name: String,
    path: String,
}

impl RequestLog {
    fn of(info: &RequestInfo<'_>) -> Self {
        let fields = LogFields::of(info);
        Self {
            verb: fields.verb,
            resource: fields.resource.to_owned(),
            namespace: fields.namespace.to_owned(),
            name: fields.name.to_owned(),
            path: fields.path.to_owned(),
        }
    }

    fn fields(&self) -> LogFields<'_> {
        LogFields {
            verb: self.verb,
            resource: &self.resource,
            namespace: &self.namespace,
            name: &self.name,
            path: &self.path,
        }
    }
}

/// [`RequestLog`], borrowed from the request where it is still at hand.
struct LogFields<'a> {
    verb: &'static str,
    /// The resource, or "" for a request that is not a resource request.
    resource: &'a str,
    namespace: &'a str,
    name: &'a str,
    path: &'a str,
}

impl<'a> LogFields<'a> {
    fn of(info: &RequestInfo<'a>) -> Self {
        Self {
            verb: info.verb,
            resource: if info.is_resource_request {
                info.resource
            } else {
                ""
            },
            namespace: info.namespace,
            name: info.name,
            path: info.path,
        }
    }
}

impl Edge {
    /// Answers without a future when everything the request needs is in memory (identity from
    /// the certificate and headers, authorization from the cache, the object from the store):
    /// a cached GET, most of the traffic. Everything else goes on to [`Edge::handle`] with what
    /// was learned here.
    fn handle_sync<B>(
        &self,
        peer: Option<&PeerCertificates>,
        request: &mut axum::http::Request<B>,
    ) -> Result<Response, Box<Pending>> {
        let started = Instant::now();
        // The URI is cheap to clone (shared bytes); the request info borrows from the clone.
        let uri = request.uri().clone();
        let info = RequestInfo::parse(request.method(), uri.path(), uri.query());
        // Boxed: the answer at once stays small to return.
        let pending = |auth, target: Option<rest::Target<'_>>| {
            Box::new(Pending {
                started,
                auth,
                route: target.map(|t| t.route()),
                log: RequestLog::of(&info),
            })
        };
        let (response, user) = match self.auth.check_sync(peer, request.headers_mut(), &info) {
            AuthStep::Checked(Ok(user)) => {
                let target = self.endpoints.find(uri.path());
                let answered = target.as_ref().and_then(|target| {
                    target.call_sync(request.method(), uri.query(), request.headers())
                });
                match answered {
                    Some(response) => (response, user),
                    None => return Err(pending(AuthStep::Checked(Ok(user)), target)),
                }
            }
            AuthStep::Checked(Err((error, user))) => (error.into_response(), user),
            step => return Err(pending(step, self.endpoints.find(uri.path()))),
        };
        Ok(self.finish(&LogFields::of(&info), user.as_ref(), response, started))
    }

    /// The rest of a request [`Edge::handle_sync`] could not answer: the review it needs, the
    /// endpoint or router, within the request timeout (a watch within its own).
    async fn handle(self: Arc<Self>, mut request: Request, pending: Box<Pending>) -> Response {
        let Pending {
            started,
            auth,
            route,
            log,
        } = *pending;
        let work = async {
            let checked = match auth {
                AuthStep::Checked(checked) => checked,
                // A review to send (rare: once per user and TTL): it needs the request info
                // again, which borrowed from the request the first step could not keep.
                step => {
                    let uri = request.uri().clone();
                    let info = RequestInfo::parse(request.method(), uri.path(), uri.query());
                    self.auth.check(step, request.headers_mut(), &info).await
                }
            };
            match checked {
                Ok(user) => {
                    let response = match route {
                        Some(route) => route.call(request).await,
                        None => match tower::Service::call(&mut self.router.clone(), request).await
                        {
                            Ok(response) => response,
                            Err(never) => match never {},
                        },
                    };
                    (response, user)
                }
                Err((error, user)) => (error.into_response(), user),
            }
        };
        let (response, user) = if log.verb == "watch" {
            work.await
        } else {
            match tokio::time::timeout(self.request_timeout, work).await {
                Ok(answered) => answered,
                Err(_) => (
                    Error::Timeout("request did not complete within the allowed duration".into())
                        .into_response(),
                    None,
                ),
            }
        };
        self.finish(&log.fields(), user.as_ref(), response, started)
    }

    /// A request whose handler panicked: 500, counted, in the request log like any other.
    fn panicked(&self, method: &axum::http::Method, uri: &axum::http::Uri) -> Response {
        self.metrics.panics.inc();
        let info = RequestInfo::parse(method, uri.path(), uri.query());
        self.finish(
            &LogFields::of(&info),
            None,
            recovery::response(),
            Instant::now(),
        )
    }

    /// Metrics and the request's log line.
    fn finish(
        &self,
        info: &LogFields<'_>,
        user: Option<&UserInfo>,
        response: Response,
        started: Instant,
    ) -> Response {
        let elapsed = started.elapsed();
        let code = response.status().as_u16();
        let resource = info.resource;
        self.metrics
            .observe(info.verb, resource, code, elapsed.as_secs_f64());
        let reason = response
            .extensions()
            .get::<ErrorReason>()
            .map_or("", |r| r.0);
        tracing::info!(
            target: "farm_apiserver::request",
            user = user.map_or("", |u| u.name.as_str()),
            groups = %Groups(user.map_or(&[], |u| u.groups.as_slice())),
            verb = %info.verb,
            resource,
            namespace = %info.namespace,
            name = %info.name,
            path = %info.path,
            code,
            reason,
            latency_us = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX),
            "request"
        );
        response
    }
}

async fn not_found() -> Error {
    Error::NoRoute
}

/// The whole HTTP surface as one service, for the TLS listener and for `oneshot` tests alike:
/// the probes go straight to [`health`], everything else through the edge. Not an axum
/// `Router` with the edge as fallback (see PERFORMANCE.md).
///
/// The listener makes one per connection, told the connection's verified client certificates
/// ([`tls::ConnectionService`]); requests without them (tests) may carry them as an extension.
///
/// Two `Arc`s: hyper-util's tower glue clones the service for every request.
#[derive(Clone)]
pub struct App {
    edge: Arc<Edge>,
    peer: Option<PeerCertificates>,
    /// The connection's activity, for its idle bound (none in `oneshot` tests).
    activity: Option<Arc<connection::Activity>>,
}

impl tls::ConnectionService for App {
    fn for_connection(
        mut self,
        chain: Vec<rustls_pki_types::CertificateDer<'static>>,
        activity: Arc<connection::Activity>,
    ) -> Self {
        self.peer = Some(PeerCertificates::new(chain));
        self.activity = Some(activity);
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
        use futures::future::Either;
        // A body nobody reads (an early 401, 413...) is still read, so the client sees the
        // answer (see `connection`).
        let drain = request.version() <= axum::http::Version::HTTP_11
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
        let pending = match recovery::catch_sync(|| edge.handle_sync(peer, &mut request)) {
            Some(Ok(response)) => {
                return Either::Left(std::future::ready(Ok(response)));
            }
            Some(Err(pending)) => pending,
            None => {
                let response = edge.panicked(request.method(), request.uri());
                return Either::Left(std::future::ready(Ok(response)));
            }
        };
        let edge = self.edge.clone();
        let request = request.map(axum::body::Body::new);
        let (method, uri) = (request.method().clone(), request.uri().clone());
        let in_flight = self.activity.as_ref().map(|a| a.begin());
        Either::Right(Box::pin(async move {
            let response = match recovery::catch(edge.clone().handle(request, pending)).await {
                Some(response) => response,
                None => edge.panicked(&method, &uri),
            };
            // A streamed body (a watch, a large list) keeps the connection busy until it ends.
            Ok(match in_flight {
                Some(guard)
                    if http_body::Body::size_hint(response.body())
                        .exact()
                        .is_none() =>
                {
                    response
                        .map(|body| axum::body::Body::new(connection::Holding::new(body, guard)))
                }
                _ => response,
            })
        }))
    }
}

/// The service for `state`: [`App`] without a connection yet, as `oneshot` tests use it and
/// [`Bound::spawn`] serves it.
pub fn app(state: AppState) -> App {
    let router = Router::new()
        .merge(discovery::router(state.discovery.clone()))
        .merge(openapi::router(state.openapi.clone()))
        .route("/version", get(version))
        .route("/metrics", get(metrics_handler).with_state(state.clone()))
        .fallback(not_found);
    let endpoints = state.endpoints.clone();
    App {
        edge: Arc::new(Edge {
            probes: health::router(state.health.clone()),
            auth: state.auth.clone(),
            metrics: state.metrics.clone(),
            endpoints,
            router,
            request_timeout: state.rest.settings.request_timeout,
        }),
        peer: None,
        activity: None,
    }
}

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
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(limits.header_read)
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
