//! The edge every request but the probes passes once: who is it and may they, the resource
//! endpoint or the router, then metrics and one log line ([`super::App`] calls it).

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use axum::{
    Router,
    extract::Request,
    response::{IntoResponse, Response},
};

use crate::{
    audit,
    auth::{Auth, AuthStep, PeerCertificates, UserInfo, user::Groups},
    error::{Error, ErrorReason},
    net::connection,
    observe::metrics::Metrics,
    observe::recovery,
    request_info::RequestInfo,
    rest,
};

/// Every request but the probes passes here once: who is it and may they (auth), then the
/// resource endpoint or the router, then metrics and one log line labelled as kube-apiserver
/// labels them. [`super::App`] calls it directly rather than through `middleware::from_fn`, which
/// boxes the rest of the stack again for every request.
pub(super) struct Edge {
    /// The health probes, which skip the edge's auth, metrics and log.
    pub(super) probes: Router,
    pub(super) auth: Arc<Auth>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) endpoints: Arc<rest::Endpoints>,
    /// Discovery, OpenAPI, /version, /metrics and the 404 fallback.
    pub(super) router: Router,
    /// What a request other than a watch may take (kube-apiserver's `--request-timeout`).
    pub(super) request_timeout: Duration,
    /// The audit log (None: no policy, and nothing of it runs).
    pub(super) audit: Option<Arc<audit::Auditor>>,
    /// The bound on requests in flight.
    pub(super) inflight: Arc<super::inflight::Inflight>,
}

/// What the edge learned of a request before it had to wait, handed to [`Edge::handle`] so
/// nothing is parsed, routed or checked twice.
pub(super) struct Waiting {
    started: Instant,
    /// The request's span, when requests are traced.
    trace: Option<opentelemetry::Context>,
    auth: AuthStep,
    /// The resource endpoint, or None for the router (discovery, OpenAPI, ...).
    route: Option<rest::Route>,
    log: RequestLog,
}

/// What [`Edge::handle_sync`] made of a request.
pub(super) enum Handled {
    /// Answered.
    Answered(Response),
    /// Checked and admitted, with its answer under way ([`Edge::answer_when_read`]).
    Reading(Box<ReadingGet>),
    /// Everything else ([`Edge::handle`]).
    Waiting(Box<Waiting>),
}

/// A GET answered from the store's own read ([`rest::ItemResponse::Reading`]): all the edge still
/// owes it is the request timeout, its place in flight, its audit ID (under a policy that
/// writes nothing of it), its metrics and its log line.
pub(super) struct ReadingGet {
    started: Instant,
    answer: futures::future::BoxFuture<'static, Response>,
    slot: Option<super::inflight::OwnedSlot>,
    user: Option<Arc<UserInfo>>,
    audit_id: Option<axum::http::HeaderValue>,
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
    /// a cached GET, most of the traffic. A GET of one object whose store reads it with a
    /// future (a consistent read on etcd) waits only for that ([`Handled::Reading`]). Everything
    /// else goes on to [`Edge::handle`] with what was learned here.
    pub(super) fn handle_sync<B>(
        &self,
        peer: Option<&PeerCertificates>,
        remote: Option<std::net::IpAddr>,
        request: &mut axum::http::Request<B>,
    ) -> Handled {
        let started = Instant::now();
        let trace = crate::observe::telemetry::server_span(
            request.headers(),
            request.method(),
            request.uri().path(),
        );
        // Authentication's and authorization's spans go under the request's.
        let current = trace.as_ref().map(|cx| cx.clone().attach());
        // The only step that changes the request (identity headers no verified proxy sent
        // are removed); everything after borrows it.
        let authenticated = self.auth.authenticate_sync(peer, request.headers_mut());
        let request = &*request;
        let uri = request.uri();
        // The path is split once: a resource endpoint's request info is what routing found.
        let target = self.endpoints.find(uri.path());
        let info = match &target {
            Some(target) => target.request_info(request.method(), uri.path(), uri.query()),
            None => RequestInfo::parse(request.method(), uri.path(), uri.query()),
        };
        // Boxed: the answer at once stays small to return.
        let pending = |auth, target: Option<rest::Target<'_>>, trace| {
            Box::new(Waiting {
                started,
                trace,
                auth,
                route: target.map(|t| t.route()),
                log: RequestLog::of(&info),
            })
        };
        let impersonating = crate::auth::impersonation::requested(request.headers());
        let step = self
            .auth
            .authorize_sync(authenticated, peer, &info, (started, impersonating));
        drop(current);
        // A traced request has its spans written on the way, and so has one the audit
        // policy writes unless it was allowed (its events are written here when it is
        // answered here); one the policy leaves out is answered here like any other.
        let audited = match self.audit.as_ref().map(|a| (a, a.judge(&step, &info))) {
            Some((auditor, audit::Judged::Allowed(config))) => Some((auditor, config)),
            Some((_, audit::Judged::Deferred)) => {
                return Handled::Waiting(pending(step, target, trace));
            }
            _ => None,
        };
        if trace.is_some() {
            return Handled::Waiting(pending(step, target, trace));
        }
        let (response, user) = match step {
            AuthStep::Checked(Ok(user)) => {
                let masters = user.as_deref().is_some_and(UserInfo::is_system_masters);
                let slot = match self.inflight.admit(info.verb, masters) {
                    Ok(slot) => slot,
                    // A refusal the policy audits is written the way of any error: later.
                    Err(_) if audited.is_some() => {
                        return Handled::Waiting(pending(
                            AuthStep::Checked(Ok(user)),
                            target,
                            None,
                        ));
                    }
                    Err(refused) => {
                        let fields = LogFields::of(&info);
                        let refused = refused.into_response();
                        return Handled::Answered(self.finish(
                            &fields,
                            user.as_deref(),
                            refused,
                            started,
                        ));
                    }
                };
                let call = || {
                    target.as_ref().and_then(|target| {
                        target.call_sync(request.method(), uri.query(), request.headers())
                    })
                };
                // Authorization's reason, for the audit log.
                let reason = || {
                    user.as_ref().map_or_else(String::new, |user| {
                        self.auth
                            .authz
                            .reason(user, &info, peer.map(|p| &p.decisions))
                    })
                };
                let answered = match &audited {
                    None => call(),
                    // A handler's panic writes the Panic event, as on the way that waits, and
                    // goes on to the recovery's 500.
                    Some((auditor, config)) => {
                        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(call)) {
                            Ok(answered) => answered,
                            Err(panic) => {
                                auditor.panicked_sync(
                                    config,
                                    &audit::Auditor::id_of(request.headers()),
                                    (user.as_deref(), &reason),
                                    &info,
                                    (uri, request.headers(), remote),
                                );
                                std::panic::resume_unwind(panic)
                            }
                        }
                    }
                };
                let mut response = match answered {
                    Some(rest::ItemResponse::Ready(response)) => {
                        drop(slot);
                        response
                    }
                    // The audit policy's events are written on the way that waits.
                    Some(rest::ItemResponse::Reading(answer)) if audited.is_none() => {
                        return Handled::Reading(Box::new(ReadingGet {
                            started,
                            answer,
                            slot: slot.into_owned(&self.inflight),
                            user,
                            audit_id: self.audit.as_ref().and_then(|_| {
                                audit::id_header(&audit::Auditor::id_of(request.headers()))
                            }),
                            log: RequestLog::of(&info),
                        }));
                    }
                    Some(rest::ItemResponse::Reading(_)) | None => {
                        drop(slot);
                        return Handled::Waiting(pending(
                            AuthStep::Checked(Ok(user)),
                            target,
                            None,
                        ));
                    }
                };
                if let Some((auditor, config)) = &audited {
                    let id = audit::Auditor::id_of(request.headers());
                    let written = auditor.complete_sync(
                        config,
                        &id,
                        (user.as_deref(), &reason),
                        &info,
                        (uri, request.headers(), remote),
                        response.status().as_u16(),
                    );
                    if !written {
                        return Handled::Waiting(pending(
                            AuthStep::Checked(Ok(user)),
                            target,
                            None,
                        ));
                    }
                    if let Some(id) = audit::id_header(&id) {
                        response.headers_mut().insert(audit::AUDIT_ID, id);
                    }
                }
                (response, user)
            }
            AuthStep::Checked(Err((error, user))) => (error.into_response(), user),
            step => return Handled::Waiting(pending(step, target, None)),
        };
        let mut response = response;
        if self.audit.is_some()
            && !response.headers().contains_key(audit::AUDIT_ID)
            && let Some(id) = audit::id_header(&audit::Auditor::id_of(request.headers()))
        {
            response.headers_mut().insert(audit::AUDIT_ID, id);
        }
        Handled::Answered(self.finish(&LogFields::of(&info), user.as_deref(), response, started))
    }

    /// A GET [`Edge::handle_sync`] checked and admitted, answered once the store has read the
    /// object, within the request timeout; then as any other: metrics and the log line.
    pub(super) async fn answer_when_read(self: Arc<Self>, later: Box<ReadingGet>) -> Response {
        let ReadingGet {
            started,
            answer,
            slot,
            user,
            audit_id,
            log,
        } = *later;
        let answered = within(Some(self.request_timeout), recovery::catch(answer)).await;
        let mut response = match answered {
            Ok(Some(response)) => response,
            Ok(None) => {
                self.metrics.panics.inc();
                recovery::response()
            }
            Err(_) => timed_out(),
        };
        drop(slot);
        if let Some(id) = audit_id {
            response.headers_mut().insert(audit::AUDIT_ID, id);
        }
        self.finish(&log.fields(), user.as_deref(), response, started)
    }

    /// The rest of a request [`Edge::handle_sync`] could not answer: the review it needs, the
    /// endpoint or router, within the request timeout (a watch within its own).
    pub(super) async fn handle(
        self: Arc<Self>,
        request: Request,
        pending: Box<Waiting>,
    ) -> Response {
        let Waiting {
            started,
            trace,
            auth,
            route,
            log,
        } = *pending;
        let audit_id = self
            .audit
            .as_ref()
            .map(|_| audit::Auditor::id_of(request.headers()));
        // The request's audit record, once it is begun (finished after a timeout too; dropped
        // unfinished with this future, it writes its last event itself).
        let mut open = std::sync::OnceLock::<audit::Open>::new();
        // One future awaited whether or not it has a deadline (a watch has none), made in the
        // call: a future held in a variable first would take its room twice in this one.
        let deadline = (log.verb != "watch").then_some(self.request_timeout);
        let (response, user) = match within(
            deadline,
            crate::observe::telemetry::scope(
                trace.clone(),
                self.answer(request, auth, route, log.verb, audit_id.as_deref(), &open),
            ),
        )
        .await
        {
            Ok(answered) => answered,
            Err(_) => (timed_out(), None),
        };
        let mut response = match open.take() {
            Some(open) => Box::pin(open.finish(response, log.verb == "watch")).await,
            None => response,
        };
        if let Some(value) = audit_id.as_deref().and_then(audit::id_header) {
            response.headers_mut().insert(audit::AUDIT_ID, value);
        }
        if let Some(cx) = &trace {
            crate::observe::telemetry::end_server_span(cx, response.status().as_u16());
        }
        self.finish(&log.fields(), user.as_deref(), response, started)
    }

    /// The checked request answered: authorization's review when one is still to send, the
    /// audit record begun, then the endpoint or the router within the bound on requests in
    /// flight.
    async fn answer(
        &self,
        mut request: Request,
        auth: AuthStep,
        route: Option<rest::Route>,
        verb: &'static str,
        audit_id: Option<&str>,
        open: &std::sync::OnceLock<audit::Open>,
    ) -> (Response, Option<Arc<UserInfo>>) {
        let (checked, impersonator) = match auth {
            AuthStep::Checked(checked) => (checked, None),
            // A review to send (rare: once per user and TTL): it needs the request info
            // again, which borrowed from the request the first step could not keep.
            step => {
                let uri = request.uri().clone();
                let info = RequestInfo::parse(request.method(), uri.path(), uri.query());
                Box::pin(self.auth.finish(step, request.headers_mut(), &info)).await
            }
        };
        if let (Some(auditor), Some(id)) = (&self.audit, audit_id)
            && let Some(begun) = Box::pin(
                self.begin_audit(
                    auditor,
                    id,
                    request.method(),
                    (request.uri(), request.headers()),
                    request
                        .extensions()
                        .get::<connection::RemoteAddr>()
                        .map(|r| r.0),
                    (&checked, impersonator.as_deref()),
                ),
            )
            .await
        {
            let _ = open.set(audit::Open::new(begun));
        }
        match checked {
            Ok(user) => {
                let masters = user.as_deref().is_some_and(UserInfo::is_system_masters);
                let slot = match self.inflight.admit_owned(verb, masters) {
                    Ok(slot) => slot,
                    Err(refused) => return (refused.into_response(), user),
                };
                let response = match route {
                    Some(route) => {
                        // Writes name their user to admission (webhooks see who wrote).
                        if let Some(user) = &user
                            && request.method() != axum::http::Method::GET
                        {
                            request.extensions_mut().insert(user.clone());
                        }
                        let record = open.get().and_then(audit::Open::record);
                        audit::scope(record, route.call(request)).await
                    }
                    None => match tower::Service::call(&mut self.router.clone(), request).await {
                        Ok(response) => response,
                        Err(never) => match never {},
                    },
                };
                // A streamed body (a large list) keeps its place until it is sent.
                let response = held_while_streamed(response, slot);
                (response, user)
            }
            Err((error, user)) => (error.into_response(), user),
        }
    }

    /// The audit record of a request whose authentication and authorization are `checked`:
    /// none when the policy writes nothing of it; for a failed authentication, its one event.
    async fn begin_audit(
        &self,
        auditor: &Arc<audit::Auditor>,
        id: &str,
        method: &axum::http::Method,
        (uri, headers): (&axum::http::Uri, &axum::http::HeaderMap),
        remote: Option<std::net::IpAddr>,
        (checked, impersonator): (&crate::auth::Checked, Option<&UserInfo>),
    ) -> Option<Arc<audit::Record>> {
        let info = RequestInfo::parse(method, uri.path(), uri.query());
        let parts = (uri, headers, remote);
        let user = match checked {
            Err((Error::Unauthorized(_), None)) => {
                // kube-apiserver's words for the audit log.
                let message = if headers.contains_key(axum::http::header::AUTHORIZATION) {
                    "Authentication failed, attempted: bearer"
                } else {
                    "Authentication failed, no credentials provided"
                };
                auditor.unauthenticated(id, &info, parts, message).await;
                return None;
            }
            Ok(user) | Err((_, user)) => user.as_deref(),
        };
        // The user who authenticated, and the one it became (kube-apiserver's
        // `impersonatedUser`).
        let (user, impersonated) = match impersonator {
            Some(impersonator) => (Some(impersonator), user),
            None => (user, None),
        };
        let record = auditor
            .begin(id, (user, impersonated), &info, parts)
            .await?;
        // What authorization decided, as kube-apiserver's authorization filter notes it.
        let decision = match checked {
            Ok(_) => Some("allow"),
            Err((Error::Forbidden(_), _)) => Some("forbid"),
            Err(_) => None,
        };
        if let Some(decision) = decision {
            record.annotate(
                audit::Level::Metadata,
                "authorization.k8s.io/decision",
                decision.into(),
            );
            let reason = match checked {
                Ok(Some(user)) | Err((_, Some(user))) => self.auth.authz.reason(user, &info, None),
                _ => String::new(),
            };
            record.annotate(
                audit::Level::Metadata,
                "authorization.k8s.io/reason",
                reason,
            );
        }
        Some(record)
    }

    /// A request whose handler panicked: 500, counted, in the request log like any other.
    pub(super) fn panicked(&self, method: &axum::http::Method, uri: &axum::http::Uri) -> Response {
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
            target: "aggregated_apiserver::request",
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

/// `response`, keeping `held` until its body is sent when that body is streamed (its size not
/// known in advance); else as it is, `held` dropped now.
pub(super) fn held_while_streamed<G: Send + Unpin + 'static>(
    response: Response,
    held: Option<G>,
) -> Response {
    match held {
        Some(held)
            if http_body::Body::size_hint(response.body())
                .exact()
                .is_none() =>
        {
            response.map(|body| axum::body::Body::new(connection::Holding::new(body, held)))
        }
        _ => response,
    }
}

/// kube-apiserver's 504 for a request past `--request-timeout`.
fn timed_out() -> Response {
    Error::Timeout("request did not complete within the allotted timeout".into()).into_response()
}

/// `work`, given up after `deadline` when there is one.
fn within<F: Future>(
    deadline: Option<Duration>,
    work: F,
) -> impl Future<Output = Result<F::Output, tokio::time::error::Elapsed>> {
    use futures::future::{Either, FutureExt};
    match deadline {
        Some(deadline) => Either::Left(tokio::time::timeout(deadline, work)),
        None => Either::Right(work.map(Ok)),
    }
}

pub(super) async fn not_found() -> Error {
    Error::NoRoute
}
