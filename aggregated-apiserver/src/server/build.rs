//! One start-up for the binary and the tests' servers: [`build`] turns a [`Config`] (the flags
//! read, the listener bound, the cluster's client made) into a [`Server`]: the serving
//! certificate, authentication and authorization, the kinds on their storage, admission, the
//! handlers' state and the bound listener. `config::Args::run` serves it until a signal
//! ([`Server::serve`]); a test spawns it and stops it itself ([`Server::spawn`]).

use std::{
    future::Future,
    net::SocketAddr,
    sync::Arc,
    time::{Duration, Instant},
};

use super::{
    AppState, AuthOptions, Bound, Identity, InflightLimits, Running, Shutdown, ShutdownTiming,
    StateOptions, app, bind, serve,
};
use crate::{
    admission::Admission,
    audit::Auditor,
    auth::source::{self, StaticSources},
    group::ApiGroup,
    net::connection,
    net::tls::{ServingFiles, ServingTls},
    rest::RestSettings,
    store::StorageFactory,
    store::namespaces::Namespaces,
};

/// The admission plugins that read the cluster's Namespaces (`--disable-admission-plugins`
/// names): with all of them off, Namespaces are not watched.
const NAMESPACE_READERS: [&str; 5] = [
    "NamespaceLifecycle",
    "MutatingAdmissionPolicy",
    "MutatingAdmissionWebhook",
    "ValidatingAdmissionWebhook",
    "ValidatingAdmissionPolicy",
];

/// How long answers of the cluster's reviews are kept (kube-apiserver's webhook cache TTLs).
#[derive(Debug, Clone, Copy)]
pub struct ReviewCache {
    /// An allowing SubjectAccessReview answer (`--authorization-webhook-cache-authorized-ttl`).
    pub allow: Duration,
    /// A denying one (`--authorization-webhook-cache-unauthorized-ttl`).
    pub deny: Duration,
    /// A TokenReview answer (`--authentication-token-webhook-cache-ttl`).
    pub token: Duration,
}

impl Default for ReviewCache {
    fn default() -> Self {
        let ten = Duration::from_secs(10);
        Self {
            allow: ten,
            deny: ten,
            token: ten,
        }
    }
}

/// Everything [`build`] needs, already read: no flag, file name or environment variable is
/// looked at after this (but the serving files, which are reloaded).
pub struct Config {
    /// The listening socket, bound by the caller: the development certificates and the check
    /// that a kubeconfig does not name this server need its port first.
    pub listener: std::net::TcpListener,
    /// The serving certificate and key (`--tls-cert-file`, or the development ones).
    pub serving: ServingFiles,
    /// How often the serving files are read again; a change is served from the next handshake.
    pub cert_reload_interval: Duration,
    /// The CAs trusted from the start: the flags', and the development CA when the server made
    /// its own certificates.
    pub auth_sources: StaticSources,
    /// How long review answers are cached.
    pub review_cache: ReviewCache,
    /// The cluster: TokenReview, SubjectAccessReview, NamespaceLifecycle, admission webhooks
    /// and policies (views of its objects are the storage's, see [`StorageFactory::viewing`]). None:
    /// standalone, only client certificates authenticate and only `system:masters` is
    /// authorized.
    pub cluster: Option<kube::Client>,
    /// With a cluster, follow its `kube-system/extension-apiserver-authentication` ConfigMap
    /// (the flags still win); the binary always does.
    pub follow_auth_configmap: bool,
    /// Where the kinds' objects live (memory or etcd, and the views' caches).
    pub storage: StorageFactory,
    /// The API group served, its kinds in discovery order, each on its store from `storage`
    /// (the binary's `resources::register`; a test can serve more:
    /// `|storage| register(storage).serve::<Barn>(storage.store())`).
    pub kinds: fn(&StorageFactory) -> ApiGroup,
    /// Watch and request timeouts, the bookmark interval, garbage collection's finalizers.
    pub rest: RestSettings,
    /// Admission plugins turned off (`--disable-admission-plugins`); without a cluster there
    /// is nothing to admit against anyway.
    pub disable_admission_plugins: Vec<String>,
    /// The audit log and webhook (none by default).
    pub audit: Option<Arc<Auditor>>,
    /// The bounds on requests in flight.
    pub inflight: InflightLimits,
    /// The connections' timeouts.
    pub limits: connection::Limits,
    /// Who the server says it is (OpenAPI, `/version`, its own metrics' names).
    pub identity: Identity,
}

impl Config {
    /// A standalone server of `kinds` on `listener` with the certificate in `serving`, its
    /// objects in `storage`, and kube-apiserver's defaults elsewhere: nobody is trusted until
    /// `auth_sources` says so.
    pub fn new(
        listener: std::net::TcpListener,
        serving: ServingFiles,
        storage: StorageFactory,
        kinds: fn(&StorageFactory) -> ApiGroup,
    ) -> Self {
        Self {
            listener,
            serving,
            cert_reload_interval: Duration::from_secs(10),
            auth_sources: StaticSources::default(),
            review_cache: ReviewCache::default(),
            cluster: None,
            follow_auth_configmap: true,
            storage,
            kinds,
            rest: RestSettings::default(),
            disable_admission_plugins: Vec::new(),
            audit: None,
            inflight: InflightLimits::default(),
            limits: connection::Limits::default(),
            identity: Identity::default(),
        }
    }
}

/// A server built and bound, not serving yet.
pub struct Server {
    /// What the handlers share: endpoints, metrics, health, auth.
    pub state: AppState,
    /// Fails readiness and ends watches, as a signal does.
    pub shutdown: Shutdown,
    /// The serving certificate, reloaded when its files change, and the client CAs the
    /// handshake accepts.
    pub serving: Arc<ServingTls>,
    bound: Bound,
}

impl Server {
    /// The address bound (the actual port when bound to port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.bound.local_addr()
    }

    /// Serves until SIGTERM or SIGINT, then stops as `timing` says (see [`serve`]); `startup`
    /// is when start-up began, for the log, and what to call once serving: called when the
    /// listener accepts, and again from a worker once the server is first ready (its caches
    /// filled, start-up's last work done).
    pub async fn serve(
        self,
        timing: ShutdownTiming,
        startup: (Instant, fn()),
    ) -> anyhow::Result<()> {
        let health = self.state.health.clone();
        let on_ready = startup.1;
        tokio::spawn(async move {
            // Polled: readiness is a set of checks, not an event (at most two minutes).
            for _ in 0..2400 {
                if health.is_ready() {
                    on_ready();
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
        serve(self.bound, app(self.state), self.shutdown, timing, startup).await
    }

    /// Serves in the background until `stop`, then gives open connections `grace`.
    pub fn spawn(
        self,
        stop: impl Future<Output = ()> + Send + 'static,
        grace: Duration,
    ) -> Running {
        self.bound.spawn(app(self.state), stop, grace)
    }
}

/// Builds the server `config` describes. Fails when the serving certificate does not load, a
/// kind's schema does not convert for server-side apply (naming the kind), or the listener
/// cannot be set up.
pub async fn build(config: Config) -> anyhow::Result<Server> {
    let Config {
        listener,
        serving,
        cert_reload_interval,
        auth_sources,
        review_cache,
        cluster,
        follow_auth_configmap,
        storage,
        kinds,
        rest,
        disable_admission_plugins,
        audit,
        inflight,
        limits,
        identity,
    } = config;
    let authn = source::build(&auth_sources, None);
    let serving = ServingTls::load(serving, authn.handshake_cas())?;
    tokio::spawn(
        serving
            .clone()
            .reload_loop(cert_reload_interval.max(Duration::from_secs(1))),
    );
    let auth = AuthOptions {
        config: authn,
        cluster: cluster.clone(),
        allow_ttl: review_cache.allow,
        deny_ttl: review_cache.deny,
        token_ttl: review_cache.token,
    }
    .build();
    if let Some(client) = cluster.clone().filter(|_| follow_auth_configmap) {
        tokio::spawn(source::follow_configmap(
            client,
            auth_sources,
            auth.clone(),
            serving.clone(),
        ));
    }
    let enabled = |plugin: &str| !disable_admission_plugins.iter().any(|p| p == plugin);
    // One watch of the cluster's Namespaces serves NamespaceLifecycle and the webhooks' and
    // policies' namespaceSelectors.
    let watched = cluster
        .clone()
        .filter(|_| NAMESPACE_READERS.iter().any(|p| enabled(p)))
        .map(Namespaces::start);
    let namespaces = watched.clone().filter(|_| enabled("NamespaceLifecycle"));
    let admission = match (&cluster, watched) {
        (Some(client), Some(namespaces)) => Admission::for_cluster(client, namespaces, enabled),
        _ => Admission::default(),
    };
    let (state, shutdown) = AppState::new(
        kinds(&storage),
        StateOptions {
            identity,
            rest,
            auth,
            namespaces,
            admission,
            audit,
            inflight,
        },
    )?;
    let bound = bind(listener, serving.config.clone(), limits)?;
    Ok(Server {
        state,
        shutdown,
        serving,
        bound,
    })
}
