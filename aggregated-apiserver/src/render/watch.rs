//! The watch wire format: newline-delimited `{"type":…,"object":…}` events, sent as they
//! happen (the events already waiting for a watcher go in one HTTP chunk), with bookmarks, the
//! `k8s.io/initial-events-end` bookmark, `timeoutSeconds` and a clean end on shutdown.

use std::{sync::Arc, time::Duration};

use axum::{
    body::Body,
    http::{HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};
use bytes::{Bytes, BytesMut};
use futures::{FutureExt, StreamExt};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ListMeta, ObjectMeta};
use kube::core::{
    TypeMeta,
    watch::{Bookmark, BookmarkMeta},
};
use serde::Serialize;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::{
    observe::metrics::Metrics,
    render::negotiate::Output,
    render::table::{self, IncludeObject, PartialObjectMetadata},
    resource::ServedResource,
    resource::columns,
    store::{Event, WatchItem, WatchStream},
};

/// The annotation client-go's watch-list waits for after the initial events.
pub const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";

/// kube's `WatchEvent` owns its object and renders errors without `kind`; this borrows.
#[derive(Serialize)]
struct Line<'a, T: Serialize> {
    #[serde(rename = "type")]
    type_: &'a str,
    object: &'a T,
}

/// A watch line around an object's JSON already encoded: copied, not encoded again.
fn encoded_event_line(type_: &str, json: &[u8]) -> Bytes {
    let mut buf = Vec::with_capacity(json.len() + type_.len() + 24);
    buf.extend_from_slice(b"{\"type\":\"");
    buf.extend_from_slice(type_.as_bytes());
    buf.extend_from_slice(b"\",\"object\":");
    buf.extend_from_slice(json);
    buf.extend_from_slice(b"}\n");
    Bytes::from(buf)
}

/// One watch event as sent: `{"type":<type_>,"object":<object>}` and a newline.
pub fn event_line<T: Serialize>(type_: &str, object: &T) -> Bytes {
    let mut buf = Vec::with_capacity(256);
    // Serializing our own types into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut buf, &Line { type_, object });
    buf.push(b'\n');
    Bytes::from(buf)
}

/// How one watch is sent, from its query and the server's settings.
#[derive(Debug, Clone)]
pub struct WatchOptions {
    /// The shape of each event's object, from `Accept`.
    pub output: Output,
    /// `includeObject`, for Table output.
    pub include: IncludeObject,
    /// `allowWatchBookmarks`: send a BOOKMARK every `bookmark_interval` when the watch's
    /// resourceVersion moved since the last one.
    pub allow_bookmarks: bool,
    /// Send the `initial-events-end` bookmark (sendInitialEvents=true).
    pub send_initial_events_end: bool,
    /// How long the stream lasts before it ends cleanly: `timeoutSeconds`, or a random time
    /// from `--min-request-timeout`.
    pub timeout: Duration,
    /// How often a bookmark may be sent ([`crate::rest::RestSettings::bookmark_interval`]).
    pub bookmark_interval: Duration,
}

/// A chunk grows with the events already waiting until it holds this much (then one more line
/// at most): a watcher that fell behind catches up in fewer, larger writes (on HTTP/1.1 each
/// chunk is a TLS record and a `writev` of its own) without ever waiting for an event.
const BATCH_BYTES: usize = 32 * 1024;

/// What one watch item makes.
enum Made {
    Line(Bytes),
    /// Nothing to send (progress, or an end of initial events nobody asked to see).
    Nothing,
    /// The watch ends, after this last line when there is one.
    End(Option<Bytes>),
}

struct Watcher<K> {
    stream: WatchStream<K>,
    options: WatchOptions,
    last_rv: u64,
    bookmarked_rv: u64,
    first_table: bool,
    shutdown: CancellationToken,
    deadline: tokio::time::Instant,
    ticker: tokio::time::Interval,
    done: bool,
    _open: OpenWatch,
}

/// Counts open watches in the metrics while a watch response lives.
struct OpenWatch(Arc<Metrics>);

impl OpenWatch {
    fn new(metrics: Arc<Metrics>) -> Self {
        metrics.open_watches.inc();
        Self(metrics)
    }
}

impl Drop for OpenWatch {
    fn drop(&mut self) {
        self.0.open_watches.dec();
    }
}

impl<K: ServedResource> Watcher<K> {
    /// A BOOKMARK in the form the client asked for, as kube-apiserver converts every watch
    /// event: the kind's own object, a PartialObjectMetadata (metadata informers), or a Table
    /// whose one row holds the bookmark's PartialObjectMetadata (the row object is always the
    /// metadata when it carries the initial-events-end annotation). Each carries the
    /// resourceVersion and, for the end of the initial events, the annotation client-go waits for.
    fn bookmark(&mut self, rv: u64, initial_end: bool) -> Bytes {
        let mut annotations = std::collections::BTreeMap::new();
        if initial_end {
            annotations.insert(INITIAL_EVENTS_END.to_owned(), "true".to_owned());
        }
        let metadata = ObjectMeta {
            resource_version: Some(rv.to_string()),
            annotations: (!annotations.is_empty()).then(|| annotations.clone()),
            ..Default::default()
        };
        match self.options.output {
            Output::Table(version) => {
                let with_columns = std::mem::take(&mut self.first_table);
                let mut cells = vec![Value::String(String::new())];
                cells.extend(K::columns().iter().map(|c| {
                    if c.name == columns::AGE_COLUMN.name {
                        columns::age(&metadata, jiff::Timestamp::now())
                    } else {
                        Value::Null
                    }
                }));
                let object = match (self.options.include, initial_end) {
                    (IncludeObject::None, false) => None,
                    _ => Some(table::RowObject::Metadata(PartialObjectMetadata::new(
                        &metadata, version,
                    ))),
                };
                let table = table::Table {
                    kind: "Table",
                    api_version: version.api_version(),
                    metadata: ListMeta {
                        resource_version: Some(rv.to_string()),
                        ..Default::default()
                    },
                    column_definitions: with_columns.then(table::columns::<K>),
                    rows: vec![table::TableRow { cells, object }],
                };
                event_line("BOOKMARK", &table)
            }
            Output::PartialObjectMetadata(version) => {
                event_line("BOOKMARK", &PartialObjectMetadata::new(&metadata, version))
            }
            Output::Json => event_line(
                "BOOKMARK",
                &Bookmark {
                    types: TypeMeta::resource::<K>(),
                    metadata: BookmarkMeta {
                        resource_version: rv.to_string(),
                        annotations,
                    },
                },
            ),
        }
    }

    fn event(&mut self, event: &Event<K>) -> Bytes {
        let type_ = event.type_.as_str();
        match self.options.output {
            Output::Json => {
                event.json_line(|e| encoded_event_line(e.type_.as_str(), e.object.json()))
            }
            Output::PartialObjectMetadata(version) => event_line(
                type_,
                &PartialObjectMetadata::new(event.object.meta(), version),
            ),
            Output::Table(version) => {
                let with_columns = std::mem::take(&mut self.first_table);
                let metadata = ListMeta {
                    resource_version: Some(event.resource_version.to_string()),
                    ..Default::default()
                };
                let table = table::write(
                    std::slice::from_ref(&event.object),
                    &metadata,
                    self.options.include,
                    version,
                    with_columns,
                )
                .unwrap_or_default();
                let mut line = Vec::with_capacity(table.len() + 32);
                line.extend_from_slice(b"{\"type\":\"");
                line.extend_from_slice(type_.as_bytes());
                line.extend_from_slice(b"\",\"object\":");
                line.extend_from_slice(&table);
                line.extend_from_slice(b"}\n");
                Bytes::from(line)
            }
        }
    }

    /// What `item` makes, the watcher's resourceVersions moved along.
    fn made(&mut self, item: Option<WatchItem<K>>) -> Made {
        match item {
            None => {
                self.done = true;
                Made::End(None)
            }
            Some(WatchItem::Event(event)) => {
                self.last_rv = event.resource_version;
                Made::Line(self.event(&event))
            }
            Some(WatchItem::InitialEventsEnd(rv)) => {
                self.last_rv = self.last_rv.max(rv);
                if self.options.send_initial_events_end {
                    self.bookmarked_rv = rv;
                    Made::Line(self.bookmark(rv, true))
                } else {
                    Made::Nothing
                }
            }
            Some(WatchItem::Progress(rv)) => {
                self.last_rv = self.last_rv.max(rv);
                Made::Nothing
            }
            Some(WatchItem::Error(error)) => {
                self.done = true;
                Made::End(Some(event_line("ERROR", &error.to_status())))
            }
        }
    }

    /// `first`, then the lines of the items already waiting, up to [`BATCH_BYTES`].
    fn with_waiting(&mut self, first: Bytes) -> Bytes {
        let mut chunk: Option<BytesMut> = None;
        while !self.done && chunk.as_ref().map_or(first.len(), BytesMut::len) < BATCH_BYTES {
            // Polled without a waker of ours: the next `next_chunk` polls the stream again,
            // with one, before it waits.
            let Some(item) = self.stream.next().now_or_never() else {
                break;
            };
            match self.made(item) {
                Made::Line(line) | Made::End(Some(line)) => chunk
                    .get_or_insert_with(|| BytesMut::from(&first[..]))
                    .extend_from_slice(&line),
                Made::Nothing | Made::End(None) => {}
            }
        }
        chunk.map_or(first, BytesMut::freeze)
    }

    /// The next chunk to send, or None when the watch ends.
    async fn next_chunk(&mut self) -> Option<Bytes> {
        loop {
            if self.done {
                return None;
            }
            tokio::select! {
                biased;
                _ = self.shutdown.cancelled() => {
                    self.done = true;
                    return None;
                }
                _ = tokio::time::sleep_until(self.deadline) => {
                    self.done = true;
                    return None;
                }
                item = self.stream.next() => match self.made(item) {
                    Made::Line(line) => return Some(self.with_waiting(line)),
                    Made::Nothing => {}
                    Made::End(last) => return last,
                },
                _ = self.ticker.tick(), if self.options.allow_bookmarks => {
                    if self.last_rv > self.bookmarked_rv {
                        self.bookmarked_rv = self.last_rv;
                        return Some(self.bookmark(self.last_rv, false));
                    }
                }
            }
        }
    }
}

/// The 200 streaming `stream` as watch events, resourceVersions counted from `start_rv`
/// (for bookmarks). It ends after `options.timeout`, when `shutdown` is cancelled, or after an
/// ERROR event; counted in `apiserver_longrunning_requests` while it lives.
pub fn response<K: ServedResource>(
    stream: WatchStream<K>,
    options: WatchOptions,
    start_rv: u64,
    shutdown: CancellationToken,
    metrics: Arc<Metrics>,
) -> Response {
    let interval = options.bookmark_interval.max(Duration::from_millis(10));
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Any timeoutSeconds a client sends (up to u64::MAX) ends somewhere: past what an Instant
    // can hold, the watch lasts until the server stops.
    let now = tokio::time::Instant::now();
    let deadline = now
        .checked_add(options.timeout)
        .unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 24 * 3600));
    let watcher = Watcher {
        stream,
        deadline,
        options,
        last_rv: start_rv,
        bookmarked_rv: start_rv,
        first_table: true,
        shutdown,
        ticker,
        done: false,
        _open: OpenWatch::new(metrics),
    };
    let body = futures::stream::unfold(watcher, |mut w| async move {
        w.next_chunk()
            .await
            .map(|chunk| (Ok::<_, std::convert::Infallible>(chunk), w))
    });
    let mut response = (StatusCode::OK, Body::from_stream(body)).into_response();
    // Events go out as they happen: never held to be compressed.
    response
        .extensions_mut()
        .insert(crate::render::compression::Unbuffered);
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}
