//! Wiring: the one start-up ([`build()`] from a [`Config`]), the shared state and the one service
//! factory ([`app()`]); `edge.rs` is what every request passes, `app.rs` the service over it,
//! `listen.rs` serves it over TLS with graceful shutdown.

use std::{sync::Arc, time::Duration};

use axum::{
    Router,
    extract::State,
    http::{HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
    routing::get,
};
use tokio_util::sync::CancellationToken;

mod app;
mod build;
mod edge;
mod inflight;
mod listen;
pub use build::{Config, ReviewCache, Server, build};
pub use inflight::InflightLimits;

pub use crate::api::identity::Identity;
pub use app::App;
use edge::{Edge, not_found};
pub use listen::{Bound, Running, ShutdownTiming, bind, serve};

use crate::{
    api::discovery::{self, DiscoveryDocuments},
    api::openapi::{self, OpenApiDocuments},
    auth::{self, Auth, Authenticator, AuthnConfig, Authorizer},
    group::ApiGroup,
    observe::health::{self, Health},
    observe::metrics::Metrics,
    rest::{self, RestContext, RestSettings},
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
    /// The audit log, when a policy is given.
    pub audit: Option<Arc<crate::audit::Auditor>>,
    /// The requests in flight, against their limits.
    pub inflight: Arc<inflight::Inflight>,
    /// Who the server says it is.
    pub identity: Identity,
}

/// Who is trusted, and the cluster that reviews tokens and access.
#[derive(Clone)]
pub struct AuthOptions {
    /// The trusted CAs and front-proxy settings at start; with a cluster, [`build()`] has them
    /// replaced whenever the `extension-apiserver-authentication` ConfigMap changes.
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
    /// Who the server says it is.
    pub identity: Identity,
    /// Watch and request timeouts, bookmark interval.
    pub rest: RestSettings,
    /// Shared with whatever replaces its configuration (the ConfigMap follower).
    pub auth: Arc<Auth>,
    /// NamespaceLifecycle admission of creates (None: no check).
    pub namespaces: Option<Arc<crate::store::namespaces::Namespaces>>,
    /// The cluster's admission webhooks (none by default).
    pub admission: crate::admission::Admission,
    /// The audit log (none by default).
    pub audit: Option<Arc<crate::audit::Auditor>>,
    /// The bounds on requests in flight (kube-apiserver's defaults).
    pub inflight: InflightLimits,
}

impl Default for StateOptions {
    /// Nobody can authenticate: tests and callers set `auth`.
    fn default() -> Self {
        Self {
            identity: Identity::default(),
            rest: RestSettings::default(),
            auth: AuthOptions::default().build(),
            namespaces: None,
            admission: Default::default(),
            audit: None,
            inflight: InflightLimits::default(),
        }
    }
}

impl AppState {
    /// Serves the kinds of `group`, ready when their stores are. Fails, naming the kind, when
    /// a kind's schema does not convert for field management (server-side apply).
    pub fn new(group: ApiGroup, options: StateOptions) -> anyhow::Result<(Self, Shutdown)> {
        let watches = CancellationToken::new();
        let health = Health::new();
        let plurals: Vec<&'static str> = group.resources().iter().map(|r| r.plural).collect();
        let metrics = Metrics::named(&options.identity.metrics_prefix(), &plurals);
        let rest = RestContext {
            metrics: metrics.clone(),
            shutdown: watches.clone(),
            settings: Arc::new(options.rest),
            work: rest::body::Work::default(),
            namespaces: options.namespaces,
            admission: options.admission,
        };
        rest.admission.set_metrics(metrics.clone());
        if let Some(checker) = crate::admission::policy::ClusterChecker::start(options.auth.clone())
        {
            rest.admission.set_authorizer(checker);
        }
        if let Some(auditor) = &options.audit {
            auditor.set_metrics(metrics.clone());
        }
        if let Some(check) = rest.admission.readiness_check() {
            health.add_readiness_check(check);
        }
        for check in group.readiness_checks() {
            health.add_readiness_check(check.clone());
        }
        let name = group.name();
        let (resources, endpoints) = group.endpoints(&rest)?;
        let inflight = Arc::new(inflight::Inflight::new(options.inflight, &metrics));
        let state = Self {
            endpoints: Arc::new(endpoints),
            auth: options.auth,
            metrics,
            health: health.clone(),
            discovery: Arc::new(DiscoveryDocuments::new(name, &resources)),
            openapi: Arc::new(OpenApiDocuments::new(&options.identity, &resources)),
            identity: options.identity,
            rest,
            audit: options.audit,
            inflight,
        };
        let shutdown = Shutdown { watches, health };
        Ok((state, shutdown))
    }
}

async fn version(State(state): State<AppState>) -> Response {
    let identity = state.identity;
    let mut numbers = identity.version.split('.');
    let info = k8s_openapi::apimachinery::pkg::version::Info {
        major: numbers.next().unwrap_or("0").into(),
        minor: numbers.next().unwrap_or("").into(),
        git_version: format!("v{}", identity.version),
        git_commit: identity.git_commit.into(),
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
    state.inflight.report();
    for (resource, stats) in state.endpoints.stored_objects() {
        state.metrics.set_stored(&resource, &stats);
    }
    let mut response = (StatusCode::OK, state.metrics.render()).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    response
}

/// The service for `state`: [`App`] without a connection yet, as `oneshot` tests use it and
/// [`Bound::spawn`] serves it.
pub fn app(state: AppState) -> App {
    let router = Router::new()
        .merge(discovery::router(state.discovery.clone()))
        .merge(openapi::router(state.openapi.clone()))
        .route("/version", get(version).with_state(state.clone()))
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
            audit: state.audit.clone(),
            inflight: state.inflight.clone(),
        }),
        peer: None,
        activity: None,
        remote: None,
    }
}
