//! The audit log (k8s.io/apiserver's `audit`): a policy ([`policy`]) picks how much of each
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

mod json;
pub mod log;
pub mod policy;
pub mod webhook;

use std::{
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

pub use policy::{Level, Policy, RequestConfig, Stage};

use crate::{auth::UserInfo, metrics::Metrics, request_info::RequestInfo};

/// What an event reads of a request: its URI, its headers, and its peer's address.
pub type RequestParts<'r> = (&'r Uri, &'r HeaderMap, Option<std::net::IpAddr>);

/// The header that carries a request's audit ID, both ways.
pub const AUDIT_ID: HeaderName = HeaderName::from_static("audit-id");

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
            .map(|(sink, mode, plugin)| Backend { sink, mode, plugin })
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
            .map_or_else(|| uuid::Uuid::new_v4().to_string(), str::to_owned)
    }

    /// Whether the policy writes anything of a request whose authentication went as far as
    /// `step` (true when that is not known yet: the request is then judged later).
    pub fn writes(&self, step: &crate::auth::AuthStep, info: &RequestInfo<'_>) -> bool {
        use crate::auth::AuthStep;
        let user = match step {
            AuthStep::Checked(Ok(user)) | AuthStep::Checked(Err((_, user))) => user.as_deref(),
            _ => return true,
        };
        self.policy.evaluate(user, info).level > Level::None
    }

    /// The record of a request by `user` (None when authentication failed), or None when the
    /// policy writes nothing of it. Its RequestReceived event is written here.
    pub async fn begin(
        self: &Arc<Self>,
        id: &str,
        user: Option<&UserInfo>,
        info: &RequestInfo<'_>,
        request: RequestParts<'_>,
    ) -> Option<Arc<Record>> {
        let config = self.policy.evaluate(user, info);
        if config.level == Level::None {
            return None;
        }
        let record = Arc::new(Record {
            auditor: self.clone(),
            event: Mutex::new(Event::of(config.level, id, user, info, request)),
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
        let mut event = Event::of(config.level, id, None, info, request);
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
        let last = self.backends.len().saturating_sub(1);
        let mut line = Some(line);
        for (index, backend) in self.backends.iter().enumerate() {
            let copy = if index == last {
                line.take().unwrap_or_default()
            } else {
                line.clone().unwrap_or_default()
            };
            match backend.mode {
                Mode::Blocking => {
                    if backend.sink.send(copy).await.is_err() {
                        self.count_error(
                            backend.plugin,
                            "the audit backend stopped: an event was dropped",
                        );
                    }
                }
                Mode::Batch => self.try_send(backend, copy),
            }
        }
    }

    /// Sends one line from where nothing can wait (a drop): when a backend blocks, a task
    /// waits for room; batch backends drop it when their buffer is full.
    fn send_now(self: &Arc<Self>, line: Vec<u8>) {
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
                .get_or_create(&crate::metrics::PluginLabels { plugin })
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

/// One request's audit event as it grows, and what the policy says of it.
#[derive(Debug)]
pub struct Record {
    auditor: Arc<Auditor>,
    config: RequestConfig,
    event: Mutex<Event>,
}

impl Record {
    /// How much of the request is written.
    pub fn level(&self) -> Level {
        self.config.level
    }

    /// Adds an annotation to the events still to come, if the record's level is at least
    /// `level`; a key keeps its first value (kube-apiserver refuses to change one).
    pub fn annotate(&self, level: Level, key: &str, value: String) {
        if self.config.level < level {
            return;
        }
        if let Ok(mut event) = self.event.lock() {
            event.annotations.entry(key.to_owned()).or_insert(value);
        }
    }

    /// The request's body as its object, at Request level and above, when it is JSON shallow
    /// enough to write (a create's name fills `objectRef.name`, as kube-apiserver's does).
    pub fn request_body(&self, body: &[u8]) {
        let Some(mut object) = shallow_json(body) else {
            return;
        };
        let Ok(mut event) = self.event.lock() else {
            return;
        };
        if let Some(reference) = &mut event.object_ref {
            let meta = object.get("metadata");
            let field = |name: &str| {
                meta.and_then(|m| m.get(name))
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned()
            };
            if reference.name.is_empty() {
                reference.name = field("name");
            }
            if reference.namespace.is_empty() {
                reference.namespace = field("namespace");
            }
            // An update's body names the version it replaces, as kube-apiserver logs it.
            reference.uid = field("uid");
            reference.resource_version = field("resourceVersion");
        }
        if self.config.level >= Level::Request {
            if self.config.omit_managed_fields {
                omit_managed_fields(&mut object);
            }
            event.request_object = Some(object);
        }
    }

    /// The answer: its code, its Status when it is one (Metadata and above), and its body
    /// as the response object at RequestResponse.
    pub fn response(&self, code: u16, body: Option<&[u8]>) {
        let object = body.and_then(shallow_json);
        let Ok(mut event) = self.event.lock() else {
            return;
        };
        let status = object
            .as_ref()
            .filter(|o| o.get("kind").and_then(Value::as_str) == Some("Status"));
        let field = |name: &str| status.and_then(|s| s.get(name)).cloned();
        event.response_status = Some(ResponseStatus {
            status: field("status"),
            message: field("message"),
            reason: field("reason"),
            details: field("details"),
            ..ResponseStatus::code(code)
        });
        if self.config.level >= Level::RequestResponse
            && let Some(mut object) = object
        {
            if self.config.omit_managed_fields {
                omit_managed_fields(&mut object);
            }
            event.response_object = Some(object);
        }
    }

    /// Writes the event at `stage`, unless the policy omits it.
    pub async fn emit(&self, stage: Stage) {
        if let Some(line) = self.line(stage) {
            self.auditor.send(line).await;
        }
    }

    /// [`Record::emit`] without waiting (the end of a watch, from a drop).
    pub fn emit_now(self: &Arc<Self>, stage: Stage) {
        if let Some(line) = self.line(stage) {
            self.auditor.send_now(line);
        }
    }

    fn line(&self, stage: Stage) -> Option<Vec<u8>> {
        if !self.config.writes(stage) {
            return None;
        }
        let Ok(mut event) = self.event.lock() else {
            self.auditor
                .count_error("log", "an audit event could not be written");
            return None;
        };
        event.stage = stage;
        if stage != Stage::RequestReceived {
            event.stage_timestamp = micro_time(jiff::Timestamp::now());
        }
        let mut line = Vec::with_capacity(1024);
        event.write_json(&mut line);
        drop(event);
        escape_html(&mut line);
        line.push(b'\n');
        Some(line)
    }
}

/// How large an answer's body may be to be read for the event (a Status, or the response
/// object at RequestResponse); larger ones are written without it.
const MAX_LOGGED_BODY: u64 = 3 * 1024 * 1024;

/// Writes `record`'s last events for `response` and gives the response back: ResponseComplete
/// now, or for a watch's stream ResponseStarted now and ResponseComplete when it ends.
pub async fn finish(record: &Arc<Record>, response: Response, watch: bool) -> Response {
    use http_body::Body as _;
    use http_body_util::BodyExt;
    let code = response.status().as_u16();
    if watch && code < 300 {
        record.response(code, None);
        record.emit(Stage::ResponseStarted).await;
        let record = Some(record.clone());
        return response.map(|body| Body::new(Completing { body, record }));
    }
    let wanted = code >= 400 || record.level() >= Level::RequestResponse;
    if wanted
        && response
            .body()
            .size_hint()
            .exact()
            .is_some_and(|n| n <= MAX_LOGGED_BODY)
    {
        let (parts, body) = response.into_parts();
        let response = match body.collect().await {
            Ok(collected) => {
                let bytes = collected.to_bytes();
                record.response(code, Some(&bytes));
                Response::from_parts(parts, Body::from(bytes))
            }
            Err(error) => {
                let failed =
                    crate::error::Error::Internal(format!("writing the response: {error}"));
                let failed = axum::response::IntoResponse::into_response(failed);
                record.response(failed.status().as_u16(), None);
                failed
            }
        };
        record.emit(Stage::ResponseComplete).await;
        return response;
    }
    record.response(code, None);
    record.emit(Stage::ResponseComplete).await;
    response
}

/// A watch's body: the record's ResponseComplete when the stream ends (or its client goes).
struct Completing {
    body: Body,
    record: Option<Arc<Record>>,
}

impl http_body::Body for Completing {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

impl Drop for Completing {
    fn drop(&mut self) {
        if let Some(record) = self.record.take() {
            record.emit_now(Stage::ResponseComplete);
        }
    }
}

/// A begun record until its last event is written ([`Open::finish`]). Dropped before, with
/// the request's future (its client went, the server stopped, a handler panicked), it writes
/// the last event itself, as kube-apiserver always does: Panic (500 "APIServer panic'd"), or
/// ResponseComplete ("Connection closed early", kube-apiserver's words for a handler that
/// wrote nothing).
#[derive(Debug)]
pub struct Open(Option<Arc<Record>>);

impl Open {
    /// Holds `record` until it is finished.
    pub fn new(record: Arc<Record>) -> Self {
        Self(Some(record))
    }

    /// The record, for the handler ([`scope`]).
    pub fn record(&self) -> Option<Arc<Record>> {
        self.0.clone()
    }

    /// Writes the last events for `response` (see [`finish`]).
    pub async fn finish(mut self, response: Response, watch: bool) -> Response {
        match self.0.take() {
            Some(record) => finish(&record, response, watch).await,
            None => response,
        }
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        let Some(record) = self.0.take() else {
            return;
        };
        let (stage, status) = if std::thread::panicking() {
            let status = ResponseStatus {
                status: Some("Failure".into()),
                message: Some("APIServer panic'd".into()),
                reason: Some("InternalError".into()),
                ..ResponseStatus::code(500)
            };
            (Stage::Panic, status)
        } else {
            let status = ResponseStatus {
                status: Some("Success".into()),
                message: Some("Connection closed early".into()),
                ..ResponseStatus::code(200)
            };
            (Stage::ResponseComplete, status)
        };
        if let Ok(mut event) = record.event.lock() {
            event.response_status = Some(status);
        }
        record.emit_now(stage);
    }
}

tokio::task_local! {
    static CURRENT: Arc<Record>;
}

/// `work` with `record` as the request's record (for [`annotate`] and [`request_body`]); as
/// it is without one (no larger a future).
pub fn scope<F: Future>(
    record: Option<Arc<Record>>,
    work: F,
) -> futures::future::Either<tokio::task::futures::TaskLocalFuture<Arc<Record>, F>, F> {
    use futures::future::Either;
    match record {
        Some(record) => Either::Left(CURRENT.scope(record, work)),
        None => Either::Right(work),
    }
}

/// Adds an annotation to the current request's record at `level` (see [`Record::annotate`]);
/// nothing without one.
pub fn annotate(level: Level, key: &str, value: impl FnOnce() -> String) {
    let _ = CURRENT.try_with(|record| {
        if record.level() >= level {
            record.annotate(level, key, value());
        }
    });
}

/// How much of the current request is written (None without a record).
pub fn current_level() -> Level {
    CURRENT
        .try_with(|record| record.level())
        .unwrap_or(Level::None)
}

/// The current request's body (see [`Record::request_body`]); nothing without a record.
pub fn request_body(body: &[u8]) {
    let _ = CURRENT.try_with(|record| record.request_body(body));
}

/// A body parsed as JSON when it is a JSON object or array. serde_json's own bound (128
/// levels) refuses deeper ones without recursing further, so what is kept can be written
/// and dropped by recursion.
fn shallow_json(body: &[u8]) -> Option<Value> {
    let first = body.iter().find(|b| !b.is_ascii_whitespace())?;
    if !matches!(first, b'{' | b'[') {
        return None;
    }
    serde_json::from_slice(body).ok()
}

/// Without `metadata.managedFields`, on the object, each item of a list and each row's
/// object of a Table.
fn omit_managed_fields(object: &mut Value) {
    fn strip(object: &mut Value) {
        if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.remove("managedFields");
        }
    }
    strip(object);
    if let Some(items) = object.get_mut("items").and_then(Value::as_array_mut) {
        items.iter_mut().for_each(strip);
    }
    if let Some(rows) = object.get_mut("rows").and_then(Value::as_array_mut) {
        for row in rows {
            if let Some(inner) = row.get_mut("object") {
                strip(inner);
            }
        }
    }
}

/// Go's encoder escapes `<`, `>` and `&` in strings; they appear nowhere else in JSON.
fn escape_html(line: &mut Vec<u8>) {
    if memchr::memchr3(b'<', b'>', b'&', line).is_none() {
        return;
    }
    let mut out = Vec::with_capacity(line.len() + 16);
    for &b in line.iter() {
        match b {
            b'<' => out.extend_from_slice(b"\\u003c"),
            b'>' => out.extend_from_slice(b"\\u003e"),
            b'&' => out.extend_from_slice(b"\\u0026"),
            _ => out.push(b),
        }
    }
    *line = out;
}

/// `metav1.MicroTime` as JSON writes it: UTC, microseconds (`2006-01-02T15:04:05.000000Z`).
/// Written digit by digit: `strftime` cost more than the rest of an event's metadata.
fn micro_time(at: jiff::Timestamp) -> String {
    let micros = at.as_microsecond();
    let (seconds, micro) = (micros.div_euclid(1_000_000), micros.rem_euclid(1_000_000));
    let (days, of_day) = (seconds.div_euclid(86_400), seconds.rem_euclid(86_400));
    // The civil date of a day count since 1970-01-01 (Howard Hinnant's `civil_from_days`),
    // cheaper than a time zone's conversion.
    let z = days + 719_468;
    let (era, of_era) = (z.div_euclid(146_097), z.rem_euclid(146_097));
    let year_of_era = (of_era - of_era / 1460 + of_era / 36_524 - of_era / 146_096) / 365;
    let day_of_year = of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let shifted_month = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * shifted_month + 2) / 5 + 1;
    let month = if shifted_month < 10 {
        shifted_month + 3
    } else {
        shifted_month - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    let mut out = [0u8; 27];
    let parts = [
        (year, 0, 4, b'-'),
        (month, 5, 2, b'-'),
        (day, 8, 2, b'T'),
        (of_day / 3600, 11, 2, b':'),
        (of_day / 60 % 60, 14, 2, b':'),
        (of_day % 60, 17, 2, b'.'),
        (micro, 20, 6, b'Z'),
    ];
    for (value, at, width, after) in parts {
        let mut rest = value.unsigned_abs();
        for slot in out[at..at + width].iter_mut().rev() {
            *slot = b'0' + (rest % 10) as u8;
            rest /= 10;
        }
        out[at + width] = after;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The client's addresses as k8s.io/apiserver's `SourceIPs` reads them: the first
/// `X-Forwarded-For` header's, then `X-Real-Ip` when not already named, then the peer's own
/// address (`remote`) unless it is the last already: it cannot be spoofed.
fn source_ips(headers: &HeaderMap, remote: Option<std::net::IpAddr>) -> Vec<String> {
    let mut ips: Vec<String> = headers
        .get("x-forwarded-for")
        .and_then(|v| v.to_str().ok())
        .into_iter()
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|ip| ip.parse::<std::net::IpAddr>().is_ok())
        .map(str::to_owned)
        .collect();
    if let Some(real) = headers
        .get("x-real-ip")
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|ip| ip.parse::<std::net::IpAddr>().is_ok())
        && !ips.iter().any(|ip| ip == real)
    {
        ips.push(real.to_owned());
    }
    if let Some(remote) = remote {
        let last = ips
            .last()
            .and_then(|ip| ip.parse::<std::net::IpAddr>().ok());
        if last != Some(remote) {
            ips.push(ip_text(remote));
        }
    }
    ips
}

/// An address as text: an IPv4 one digit by digit (`Display` costs more than the rest of
/// its event's header).
fn ip_text(ip: std::net::IpAddr) -> String {
    let std::net::IpAddr::V4(v4) = ip else {
        return ip.to_string();
    };
    let mut text = String::with_capacity(15);
    for (index, octet) in v4.octets().into_iter().enumerate() {
        if index > 0 {
            text.push('.');
        }
        if octet >= 100 {
            text.push(char::from(b'0' + octet / 100));
        }
        if octet >= 10 {
            text.push(char::from(b'0' + octet / 10 % 10));
        }
        text.push(char::from(b'0' + octet % 10));
    }
    text
}

/// User agents past 1024 bytes are cut, as kube-apiserver cuts them.
fn truncate_agent(agent: &str) -> String {
    const MAX: usize = 1024;
    if agent.len() <= MAX {
        return agent.to_owned();
    }
    let mut end = MAX;
    while !agent.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...TRUNCATED", &agent[..end])
}

/// The answer's `Audit-Id` header.
pub fn id_header(id: &str) -> Option<HeaderValue> {
    HeaderValue::from_str(id).ok()
}

/// `audit.k8s.io/v1` Event, its fields in kube-apiserver's order.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
struct Event {
    kind: &'static str,
    api_version: &'static str,
    level: Level,
    #[serde(rename = "auditID")]
    audit_id: String,
    stage: Stage,
    #[serde(rename = "requestURI")]
    request_uri: String,
    verb: &'static str,
    user: EventUser,
    #[serde(rename = "sourceIPs", skip_serializing_if = "Vec::is_empty")]
    source_ips: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    user_agent: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    object_ref: Option<ObjectRef>,
    #[serde(skip_serializing_if = "Option::is_none")]
    response_status: Option<ResponseStatus>,
    #[serde(skip_serializing_if = "Option::is_none")]
    request_object: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    response_object: Option<Value>,
    request_received_timestamp: String,
    stage_timestamp: String,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    annotations: BTreeMap<String, String>,
}

impl Event {
    /// A request's event as it is received.
    fn of(
        level: Level,
        id: &str,
        user: Option<&UserInfo>,
        info: &RequestInfo<'_>,
        (uri, headers, remote): RequestParts<'_>,
    ) -> Self {
        let now = micro_time(jiff::Timestamp::now());
        Self {
            kind: "Event",
            api_version: "audit.k8s.io/v1",
            level,
            audit_id: id.to_owned(),
            stage: Stage::RequestReceived,
            request_uri: uri
                .path_and_query()
                .map_or_else(|| uri.path().to_owned(), |p| p.as_str().to_owned()),
            verb: info.verb,
            user: user.map(EventUser::of).unwrap_or_default(),
            source_ips: source_ips(headers, remote),
            user_agent: headers
                .get(axum::http::header::USER_AGENT)
                .map(|v| truncate_agent(&String::from_utf8_lossy(v.as_bytes()))),
            object_ref: info.is_resource_request.then(|| ObjectRef {
                resource: info.resource.to_owned(),
                namespace: info.namespace.to_owned(),
                name: info.name.to_owned(),
                uid: String::new(),
                api_group: info.api_group.to_owned(),
                api_version: info.api_version.to_owned(),
                resource_version: String::new(),
                subresource: info.subresource.to_owned(),
            }),
            response_status: None,
            request_object: None,
            response_object: None,
            request_received_timestamp: now.clone(),
            stage_timestamp: now,
            annotations: BTreeMap::new(),
        }
    }
}

/// An event's `responseStatus`: the part of a `meta/v1` Status kube-apiserver keeps, in its
/// order (its empty `metadata` included).
#[derive(Debug, Clone, Serialize)]
struct ResponseStatus {
    metadata: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    details: Option<Value>,
    code: u16,
}

impl ResponseStatus {
    fn code(code: u16) -> Self {
        Self {
            metadata: BTreeMap::new(),
            status: None,
            message: None,
            reason: None,
            details: None,
            code,
        }
    }
}

#[derive(Debug, Clone, Default, Serialize)]
struct EventUser {
    #[serde(skip_serializing_if = "String::is_empty")]
    username: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    uid: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    groups: Vec<String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    extra: BTreeMap<String, Vec<String>>,
}

impl EventUser {
    fn of(user: &UserInfo) -> Self {
        Self {
            username: user.name.clone(),
            uid: user.uid.clone(),
            groups: user.groups.clone(),
            extra: user.extra.clone(),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
struct ObjectRef {
    #[serde(skip_serializing_if = "String::is_empty")]
    resource: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    namespace: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    name: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    uid: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    api_group: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    api_version: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    resource_version: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    subresource: String,
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
