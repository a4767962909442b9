//! A request's audit record: its events as the request goes (the request and response
//! objects, annotations from the handlers through a task-local [`scope`]), ended once whatever
//! happens to the request.

use super::*;

/// One request's audit event as it grows, and what the policy says of it.
#[derive(Debug)]
pub struct Record {
    pub(super) auditor: Arc<Auditor>,
    pub(super) config: RequestConfig,
    pub(super) event: Mutex<Event<'static>>,
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
            event
                .annotations
                .entry(Cow::Owned(key.to_owned()))
                .or_insert(value);
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
                Cow::Owned(
                    meta.and_then(|m| m.get(name))
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_owned(),
                )
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
    pub fn emit_sync(self: &Arc<Self>, stage: Stage) {
        if let Some(line) = self.line(stage) {
            self.auditor.send_sync(line);
        }
    }

    pub(super) fn line(&self, stage: Stage) -> Option<Vec<u8>> {
        if !self.config.writes(stage) {
            return None;
        }
        let Ok(mut event) = self.event.lock() else {
            self.auditor
                .count_error("log", "an audit event could not be written");
            return None;
        };
        Some(event.line(stage))
    }
}

/// How large an answer's body may be to be read for the event (a Status, or the response
/// object at RequestResponse); larger ones are written without it.
pub(super) const MAX_LOGGED_BODY: u64 = 3 * 1024 * 1024;

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
pub(super) struct Completing {
    pub(super) body: Body,
    pub(super) record: Option<Arc<Record>>,
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
            record.emit_sync(Stage::ResponseComplete);
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
            (Stage::Panic, ResponseStatus::panicked())
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
        record.emit_sync(stage);
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
pub(super) fn shallow_json(body: &[u8]) -> Option<Value> {
    let first = body.iter().find(|b| !b.is_ascii_whitespace())?;
    if !matches!(first, b'{' | b'[') {
        return None;
    }
    serde_json::from_slice(body).ok()
}

/// Without `metadata.managedFields`, on the object, each item of a list and each row's
/// object of a Table.
pub(super) fn omit_managed_fields(object: &mut Value) {
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
