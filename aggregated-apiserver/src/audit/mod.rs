//! The audit log (k8s.io/apiserver's `audit`): a policy (`policy`) picks how much of each
//! request is written, and `audit.k8s.io/v1` Events go to the log backend ([`log`]) at the
//! request's stages (RequestReceived, ResponseStarted for a watch, ResponseComplete; one
//! ResponseStarted for a failed authentication). The ID is the request's `Audit-ID` header when
//! it has one (kube-apiserver's aggregator sends its own, so one request has one ID in both
//! logs), a new UUID otherwise; it is answered in `Audit-Id`.
//!
//! What the request's handlers add (the request object, admission's annotations) reaches its
//! [`Record`] through a task-local set around the handler ([`scope`]), as k8s.io/apiserver's
//! handlers reach theirs through the request context. With no policy there is no auditor, and
//! nothing here runs.

mod event;
mod json;
pub mod log;
pub(crate) mod policy;
mod record;
pub mod webhook;

use std::{
    borrow::Cow,
    collections::BTreeMap,
    sync::{Arc, Mutex, OnceLock},
};

use axum::{
    body::{Body, Bytes},
    http::{HeaderMap, HeaderName, HeaderValue, Uri},
    response::Response,
};
use serde::Serialize;
use serde_json::Value;

pub use event::id_header;
use event::*;
pub use policy::{Level, Policy, RequestConfig, Stage};
pub use record::{Open, Record, annotate, current_level, finish, request_body, scope};

use crate::{auth::UserInfo, observe::metrics::Metrics, request_info::RequestInfo};

/// What an event reads of a request: its URI, its headers, and its peer's address.
pub type RequestParts<'r> = (&'r Uri, &'r HeaderMap, Option<std::net::IpAddr>);

/// The header that carries a request's audit ID, both ways.
pub const AUDIT_ID: HeaderName = HeaderName::from_static("audit-id");

/// An allowed request's events answered at once: RequestReceived, then (with authorization's
/// annotations, added after it as kube-apiserver's filter order puts them, and `status`) the
/// `last` stage (ResponseComplete, or Panic), each where the policy writes that stage.
fn allowed_events(
    config: &RequestConfig,
    event: &mut Event<'_>,
    reason: &dyn Fn() -> String,
    (last, status): (Stage, ResponseStatus),
) -> Vec<Vec<u8>> {
    let mut lines = Vec::with_capacity(2);
    if config.writes(Stage::RequestReceived) {
        lines.push(event.line(Stage::RequestReceived));
    }
    event.annotations.insert(
        Cow::Borrowed("authorization.k8s.io/decision"),
        "allow".into(),
    );
    event
        .annotations
        .insert(Cow::Borrowed("authorization.k8s.io/reason"), reason());
    event.response_status = Some(status);
    if config.writes(last) {
        lines.push(event.line(last));
    }
    lines
}

/// `value` `count` times: clones first and itself last, so one backend gets no copy.
fn copies<T: Clone>(value: T, count: usize) -> impl Iterator<Item = T> {
    let mut value = Some(value);
    (1..=count).filter_map(move |n| {
        if n == count {
            value.take()
        } else {
            value.clone()
        }
    })
}

/// What the policy says of a request ([`Auditor::judge`]).
#[derive(Debug)]
pub enum Judged {
    /// Nothing of it is written.
    Unwritten,
    /// It was allowed and is written so.
    Allowed(RequestConfig),
    /// It is written, or may be, and only the way that can wait writes it (authentication
    /// or authorization failed, or is not known yet).
    Deferred,
}

/// What happens when the backend's buffer is full (`--audit-log-mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// The request waits for room (kube-apiserver's default for the log).
    Blocking,
    /// The event is dropped, counted in `apiserver_audit_error_total` and logged.
    Batch,
}

/// The policy and where its events go (every backend gets every event, as kube-apiserver's
/// union of backends).
pub struct Auditor {
    policy: Policy,
    backends: Vec<Backend>,
    metrics: Arc<OnceLock<Arc<Metrics>>>,
}

/// One backend: its buffer, its mode, and its name in `apiserver_audit_error_total`.
struct Backend {
    sink: log::Sink,
    mode: Mode,
    plugin: &'static str,
    /// The request waits until its events are sent, not only buffered: kube-apiserver's
    /// blocking webhook. (A blocking log waits for room in its buffer alone, so that no
    /// request waits on the disk.)
    delivered: bool,
}

impl std::fmt::Debug for Auditor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auditor").finish_non_exhaustive()
    }
}

impl Auditor {
    /// Events of the requests `policy` picks go to `sink` (the log backend's buffer).
    pub fn new(policy: Policy, sink: log::Sink, mode: Mode) -> Arc<Self> {
        Self::with_backends(policy, vec![(sink, mode, "log")], Arc::default())
    }

    /// Events of the requests `policy` picks go to each of `backends` (buffer, mode, and
    /// the backend's name: `log`, `webhook`); `metrics` is shared with backends that count.
    pub fn with_backends(
        policy: Policy,
        backends: Vec<(log::Sink, Mode, &'static str)>,
        metrics: Arc<OnceLock<Arc<Metrics>>>,
    ) -> Arc<Self> {
        let backends = backends
            .into_iter()
            .map(|(sink, mode, plugin)| Backend {
                sink,
                mode,
                plugin,
                delivered: plugin == "webhook" && mode == Mode::Blocking,
            })
            .collect();
        Arc::new(Self {
            policy,
            backends,
            metrics,
        })
    }

    /// The server's metrics, once it has them.
    pub fn set_metrics(&self, metrics: Arc<Metrics>) {
        let _ = self.metrics.set(metrics);
    }

    /// The request's audit ID: its own `Audit-ID`, or a new one.
    pub fn id_of(headers: &HeaderMap) -> String {
        headers
            .get(&AUDIT_ID)
            .and_then(|v| v.to_str().ok())
            .filter(|v| !v.is_empty())
            .map_or_else(
                || {
                    let mut text = uuid::Uuid::encode_buffer();
                    uuid::Uuid::new_v4()
                        .hyphenated()
                        .encode_lower(&mut text)
                        .to_owned()
                },
                str::to_owned,
            )
    }

    /// What the policy says of a request whose authentication and authorization went as far
    /// as `step`.
    pub fn judge(&self, step: &crate::auth::AuthStep, info: &RequestInfo<'_>) -> Judged {
        use crate::auth::AuthStep;
        let (user, allowed) = match step {
            AuthStep::Checked(Ok(user)) => (user.as_deref(), true),
            AuthStep::Checked(Err((_, user))) => (user.as_deref(), false),
            _ => return Judged::Deferred,
        };
        let config = self.policy.evaluate(user, info);
        match (config.level, allowed) {
            (Level::None, _) => Judged::Unwritten,
            (_, true) => Judged::Allowed(config),
            (_, false) => Judged::Deferred,
        }
    }

    /// Writes the events of an allowed request answered at once (a cached GET) by `user`
    /// (`reason`: authorization's, "" without a user), as [`Auditor::begin`] and [`finish`]
    /// would: true when they are written (or dropped by a full batch backend). False, with
    /// nothing written, when a blocking backend has no room for them now or when the answer's
    /// body would have to be read (an error's Status, the RequestResponse level): the request
    /// then goes the way that can wait.
    pub fn complete_sync(
        &self,
        config: &RequestConfig,
        id: &str,
        (user, reason): (Option<&UserInfo>, &dyn Fn() -> String),
        info: &RequestInfo<'_>,
        request: RequestParts<'_>,
        code: u16,
    ) -> bool {
        if code >= 400 || config.level >= Level::RequestResponse {
            return false;
        }
        let mut event = Event::of(config.level, id, user, info, request);
        let lines = allowed_events(
            config,
            &mut event,
            reason,
            (Stage::ResponseComplete, ResponseStatus::code(code)),
        );
        self.send_lines_sync(lines, false)
    }

    /// The events of a request [`Auditor::complete_sync`] would have written whose handler
    /// panicked: RequestReceived, then Panic (500 "APIServer panic'd"), as the record of a
    /// request that waits writes them. Nothing here may wait: a backend without room drops
    /// them (counted).
    pub fn panicked_sync(
        &self,
        config: &RequestConfig,
        id: &str,
        (user, reason): (Option<&UserInfo>, &dyn Fn() -> String),
        info: &RequestInfo<'_>,
        request: RequestParts<'_>,
    ) {
        let mut event = Event::of(config.level, id, user, info, request);
        let lines = allowed_events(
            config,
            &mut event,
            reason,
            (Stage::Panic, ResponseStatus::panicked()),
        );
        self.send_lines_sync(lines, true);
    }

    /// Hands `lines` to every backend at once: true when done (or dropped, counted, by a full
    /// batch backend, or by any full backend when `anyway`); false, nothing sent, when a
    /// blocking backend has no room and not `anyway`.
    fn send_lines_sync(&self, lines: Vec<Vec<u8>>, anyway: bool) -> bool {
        if lines.is_empty() {
            return true;
        }
        // A backend the request waits on is waited on the way that can wait.
        if !anyway && self.backends.iter().any(|b| b.delivered) {
            return false;
        }
        // Room in every backend first: the events go to all of them, or (a blocking one
        // being full) to none yet.
        let mut reserved = Vec::with_capacity(self.backends.len());
        for backend in &self.backends {
            let room = backend.sink.try_reserve(&lines);
            if room.is_none() && backend.mode == Mode::Blocking && !anyway {
                return false;
            }
            reserved.push(room);
        }
        for _ in &lines {
            self.count_event();
        }
        let mut copies = copies(lines, reserved.iter().flatten().count());
        for (backend, room) in self.backends.iter().zip(reserved) {
            match (room, copies.next()) {
                (Some(room), Some(copy)) => room.send(copy),
                _ => self.count_error(
                    backend.plugin,
                    "audit buffer queue blocked: an event was dropped",
                ),
            }
        }
        true
    }

    /// The record of a request by `user` (None when authentication failed), acting as
    /// `impersonated` when it impersonates, or None when the policy writes nothing of it (the
    /// policy judges the user who authenticated, as kube-apiserver's does). Its
    /// RequestReceived event is written here.
    pub async fn begin(
        self: &Arc<Self>,
        id: &str,
        (user, impersonated): (Option<&UserInfo>, Option<&UserInfo>),
        info: &RequestInfo<'_>,
        request: RequestParts<'_>,
    ) -> Option<Arc<Record>> {
        let config = self.policy.evaluate(user, info);
        if config.level == Level::None {
            return None;
        }
        let mut event = Event::of(config.level, id, user, info, request);
        event.impersonated_user = impersonated.map(event::EventUser::of);
        let record = Arc::new(Record {
            auditor: self.clone(),
            event: Mutex::new(event.into_owned()),
            config,
        });
        record.emit(Stage::RequestReceived).await;
        Some(record)
    }

    /// kube-apiserver's one event for a request whose authentication failed: ResponseStarted,
    /// no user, the 401 and its message.
    pub async fn unauthenticated(
        self: &Arc<Self>,
        id: &str,
        info: &RequestInfo<'_>,
        request: RequestParts<'_>,
        message: &str,
    ) {
        let config = self.policy.evaluate(None, info);
        if !config.writes(Stage::ResponseStarted) {
            return;
        }
        let mut event = Event::of(config.level, id, None, info, request).into_owned();
        event.response_status = Some(ResponseStatus {
            message: Some(message.into()),
            ..ResponseStatus::code(401)
        });
        let record = Record {
            auditor: self.clone(),
            config,
            event: Mutex::new(event),
        };
        record.emit(Stage::ResponseStarted).await;
    }

    /// Waits until every event sent so far is written (at exit).
    pub async fn flush(&self) {
        for backend in &self.backends {
            backend.sink.flush().await;
        }
    }

    /// Sends one line to every backend: each waits for room (blocking) or drops it when its
    /// buffer is full (batch).
    async fn send(&self, line: Vec<u8>) {
        self.count_event();
        let copies = copies(line, self.backends.len());
        for (backend, copy) in self.backends.iter().zip(copies) {
            match backend.mode {
                Mode::Blocking => {
                    if backend.sink.send(copy).await.is_err() {
                        self.count_error(
                            backend.plugin,
                            "the audit backend stopped: an event was dropped",
                        );
                    } else if backend.delivered {
                        // Sent now (its batch closed), before the request goes on.
                        backend.sink.flush().await;
                    }
                }
                Mode::Batch => self.try_send(backend, copy),
            }
        }
    }

    /// Sends one line from where nothing can wait (a drop): when a backend blocks, a task
    /// waits for room; batch backends drop it when their buffer is full.
    fn send_sync(self: &Arc<Self>, line: Vec<u8>) {
        if self.backends.iter().any(|b| b.mode == Mode::Blocking)
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            let auditor = self.clone();
            runtime.spawn(async move { auditor.send(line).await });
            return;
        }
        self.count_event();
        for backend in &self.backends {
            self.try_send(backend, line.clone());
        }
    }

    fn try_send(&self, backend: &Backend, line: Vec<u8>) {
        if backend.sink.try_send(line).is_err() {
            self.count_error(
                backend.plugin,
                "audit buffer queue blocked: an event was dropped",
            );
        }
    }

    fn count_event(&self) {
        if let Some(metrics) = self.metrics.get() {
            metrics.audit_events.inc();
        }
    }

    fn count_error(&self, plugin: &'static str, message: &'static str) {
        if let Some(metrics) = self.metrics.get() {
            let dropped = metrics
                .audit_errors
                .get_or_create(&crate::observe::metrics::PluginLabels { plugin })
                .inc();
            // Logged the first time and then once per thousand.
            if dropped % 1000 == 0 {
                tracing::warn!(dropped = dropped + 1, "{message}");
            }
        } else {
            tracing::warn!("{message}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn micro_times_are_go_micro_times() {
        for (text, expected) in [
            (
                "2026-11-26T14:05:09.123456789Z",
                "2026-11-26T14:05:09.123456Z",
            ),
            ("0999-01-02T03:04:05Z", "0999-01-02T03:04:05.000000Z"),
            ("2024-02-29T23:59:59.000001Z", "2024-02-29T23:59:59.000001Z"),
            ("1969-12-31T23:59:59.999999Z", "1969-12-31T23:59:59.999999Z"),
            ("1600-03-01T00:00:00Z", "1600-03-01T00:00:00.000000Z"),
            ("2100-02-28T12:00:00.5Z", "2100-02-28T12:00:00.500000Z"),
            ("9999-12-30T21:59:59.999999Z", "9999-12-30T21:59:59.999999Z"),
        ] {
            let at: jiff::Timestamp = text.parse().unwrap();
            assert_eq!(micro_time(at), expected);
            assert_eq!(
                micro_time(at),
                at.strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()
            );
        }
        // Times in the second written last reuse its text; the next second's does not.
        let start: jiff::Timestamp = "2026-11-26T23:59:59.999990Z".parse().unwrap();
        for micros in 0..20 {
            let at = start + jiff::SignedDuration::from_micros(micros);
            assert_eq!(
                micro_time(at),
                at.strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()
            );
        }
    }

    proptest::proptest! {
        #[test]
        fn any_micro_time_is_strftimes(micros in -62_135_596_800_000_000i64..253_402_207_200_000_000) {
            let at = jiff::Timestamp::from_microsecond(micros).unwrap();
            proptest::prop_assert_eq!(
                micro_time(at),
                at.strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()
            );
        }
    }

    #[test]
    fn copies_are_as_many_as_asked() {
        assert_eq!(copies(vec![1u8], 3).collect::<Vec<_>>(), [[1], [1], [1]]);
        assert_eq!(copies(vec![1u8], 1).collect::<Vec<_>>(), [[1]]);
        assert_eq!(copies(vec![1u8], 0).count(), 0);
    }

    #[test]
    fn source_ips_as_kube_apiserver_reads_them() {
        let headers = |pairs: &[(&'static str, &'static str)]| {
            let mut map = HeaderMap::new();
            for (name, value) in pairs {
                map.append(*name, axum::http::HeaderValue::from_static(value));
            }
            map
        };
        let peer = Some(std::net::IpAddr::from([10, 0, 0, 9]));
        for (pairs, expected) in [
            (&[][..], vec!["10.0.0.9"]),
            (
                &[("x-forwarded-for", "1.2.3.4, bogus, 5.6.7.8")][..],
                vec!["1.2.3.4", "5.6.7.8", "10.0.0.9"],
            ),
            // Only the first X-Forwarded-For header is read; the peer is not named twice.
            (
                &[
                    ("x-forwarded-for", "1.2.3.4, 10.0.0.9"),
                    ("x-forwarded-for", "9.9.9.9"),
                ][..],
                vec!["1.2.3.4", "10.0.0.9"],
            ),
            (
                &[("x-forwarded-for", "1.2.3.4"), ("x-real-ip", "1.2.3.4")][..],
                vec!["1.2.3.4", "10.0.0.9"],
            ),
            (
                &[("x-real-ip", "2001:db8::1")][..],
                vec!["2001:db8::1", "10.0.0.9"],
            ),
        ] {
            assert_eq!(source_ips(&headers(pairs), peer), expected, "{pairs:?}");
        }
        assert!(source_ips(&HeaderMap::new(), None).is_empty());
        for ip in ["0.0.0.0", "10.20.100.255", "127.0.0.1", "2001:db8::1"] {
            assert_eq!(ip_text(ip.parse().unwrap()), ip);
        }
    }

    #[test]
    fn html_is_escaped_as_go_escapes_it() {
        let mut line = br#"{"a":"<b> & c"}"#.to_vec();
        escape_html(&mut line);
        assert_eq!(line, br#"{"a":"\u003cb\u003e \u0026 c"}"#.to_vec());
        let mut plain = br#"{"a":"b"}"#.to_vec();
        escape_html(&mut plain);
        assert_eq!(plain, br#"{"a":"b"}"#.to_vec());
    }
}
