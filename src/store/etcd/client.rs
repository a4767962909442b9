//! etcd's v3 API on its client port. Unary calls (`KV/Range`, `KV/Txn`, `KV/Put`,
//! `KV/Compact`) are gRPC over HTTP/2, the fields they use declared here for prost; the watch
//! goes through etcd's JSON gateway (`/v3/watch`, a stream of JSON lines), which needs nothing
//! but HTTP/1.1.
//!
//! Why not the `etcd-client` crate: it generates its gRPC code at build time with `protoc`,
//! which a fresh machine lacks, and every build of farm-apiserver (the embedded default
//! included) would then need it. Why not the gateway for everything, as before: it re-sends
//! each JSON call to etcd's own gRPC server inside etcd, which cost etcd about twice the CPU
//! per consistent read's check (PERFORMANCE.md). In the gateway's JSON (proto3 rules), 64-bit
//! integers are strings, bytes are base64, and fields at their zero value are left out.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use base64::{Engine, engine::general_purpose::STANDARD as B64};
use bytes::Bytes;
use futures::StreamExt;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::TokioExecutor,
};
use serde::{Deserialize, Deserializer};
use tokio::sync::mpsc;

/// What went wrong talking to etcd.
#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    /// No endpoint answered (or answered garbage): the cluster is unreachable from here.
    #[error("etcd is unavailable: {0}")]
    Unavailable(String),
    /// The revision asked for was compacted away.
    #[error("etcd: required revision has been compacted (compacted at {0})")]
    Compacted(i64),
    /// etcd refused the request.
    #[error("etcd: {0}")]
    Refused(String),
}

type Connector = hyper_rustls::HttpsConnector<HttpConnector>;
type RequestBody = http_body_util::combinators::BoxBody<Bytes, std::convert::Infallible>;

/// Where etcd is and how to reach it.
#[derive(Clone, Debug)]
pub struct EtcdConfig {
    /// Client URLs (`http://127.0.0.1:2379`, `https://etcd-0:2379`), tried in turn.
    pub endpoints: Vec<String>,
    /// TLS to etcd (`https://` endpoints): the CA that signs etcd's certificates and a client
    /// certificate, when etcd requires one.
    pub tls: Option<rustls::ClientConfig>,
    /// How long one request may take.
    pub request_timeout: Duration,
}

/// A client of one etcd cluster: requests go to the endpoint that answered last, and move on
/// to the next one when it does not.
pub struct EtcdClient {
    http: Client<Connector, RequestBody>,
    /// HTTP/2 only, for gRPC calls.
    grpc: Client<Connector, RequestBody>,
    endpoints: Vec<String>,
    current: AtomicUsize,
    request_timeout: Duration,
}

/// A key and its value at a revision.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct KeyValue {
    /// The key.
    #[serde(default, deserialize_with = "base64_bytes")]
    pub key: Vec<u8>,
    /// The revision of the key's last change.
    #[serde(default, deserialize_with = "string_i64")]
    pub mod_revision: i64,
    /// The value.
    #[serde(default, deserialize_with = "base64_bytes")]
    pub value: Vec<u8>,
}

/// The header of every response: the store's revision when it was served.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Header {
    /// The store's revision.
    #[serde(default, deserialize_with = "string_i64")]
    pub revision: i64,
}

/// A range read.
#[derive(Debug, Clone, Default)]
pub struct RangeResponse {
    /// The revision the read was served at.
    pub header: Header,
    /// The keys, in key order.
    pub kvs: Vec<KeyValue>,
    /// Whether more keys are in the range than `limit` returned.
    pub more: bool,
    /// How many keys the range holds.
    pub count: i64,
}

/// The outcome of a transaction.
#[derive(Debug)]
pub struct TxnResult {
    /// The revision after it (the new one when it wrote).
    pub revision: i64,
    /// Whether the comparison held (the success operations ran).
    pub succeeded: bool,
    /// The key's value when the comparison failed and the failure branch read it.
    pub current: Option<KeyValue>,
}

/// A comparison a transaction makes on one key.
#[derive(Debug, Clone, Copy)]
pub enum Compare {
    /// The key does not exist.
    Absent,
    /// The key's last change was at this revision.
    ModRevision(i64),
}

/// One event of a watch.
#[derive(Debug, Clone)]
pub enum WatchEvent {
    /// A key was written: its new value.
    Put(KeyValue),
    /// A key was deleted at `revision`; `previous` is its value before.
    Delete {
        /// The deletion's revision.
        revision: i64,
        /// The value before the deletion.
        previous: KeyValue,
    },
    /// Nothing in the range changed up to this revision (a progress notification).
    Progress(i64),
}

#[derive(Debug, Default, Deserialize)]
struct WatchLine {
    #[serde(default)]
    result: Option<WatchReply>,
    #[serde(default)]
    error: Option<GatewayError>,
}

#[derive(Debug, Default, Deserialize)]
struct WatchReply {
    #[serde(default)]
    header: Header,
    #[serde(default)]
    created: bool,
    #[serde(default)]
    canceled: bool,
    #[serde(default, deserialize_with = "string_i64")]
    compact_revision: i64,
    #[serde(default)]
    cancel_reason: String,
    #[serde(default)]
    events: Vec<RawEvent>,
}

#[derive(Debug, Default, Deserialize)]
struct RawEvent {
    #[serde(default, rename = "type")]
    type_: String,
    #[serde(default)]
    kv: KeyValue,
    #[serde(default)]
    prev_kv: Option<KeyValue>,
}

#[derive(Debug, Default, Deserialize)]
struct GatewayError {
    #[serde(default)]
    message: String,
    #[serde(default)]
    code: i32,
}

/// An open watch: its events as they come, and a way to ask for a progress notification.
pub struct Watch {
    /// Batches of events, in revision order; an error ends the watch.
    pub events: futures::stream::BoxStream<'static, Result<Vec<WatchEvent>, EtcdError>>,
    /// Further messages on the watch's request stream.
    pub requests: mpsc::UnboundedSender<Bytes>,
}

/// The message asking a watch for a progress notification (etcd's `RequestProgress`): etcd
/// answers with its current revision once every event before it was sent.
pub const PROGRESS_REQUEST: &[u8] = b"{\"progress_request\":{}}\n";

/// Whether etcd `version` sends a progress notification only after every event before it:
/// fixed in 3.4.31 and 3.5.13 (etcd issues 15220 and 17507). kube-apiserver checks the same
/// versions before it serves consistent reads from its cache.
pub fn orders_progress(version: &str) -> bool {
    let mut parts = version
        .split(['.', '-', '+'])
        .map(|p| p.parse::<u64>().unwrap_or(0));
    let (major, minor, patch) = (
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
    );
    match (major, minor) {
        (3, 4) => patch >= 31,
        (3, 5) => patch >= 13,
        (3, m) => m > 5,
        (m, _) => m > 3,
    }
}

/// The fields of etcd's gRPC messages the unary calls use, and gRPC's framing (etcd's
/// `api/etcdserverpb/rpc.proto` and `api/mvccpb/kv.proto`; fields left out are skipped when
/// decoding and never sent, as in proto3).
mod grpc {
    use bytes::{Buf, BufMut, Bytes, BytesMut};

    use super::EtcdError;

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RangeRequest {
        #[prost(bytes = "vec", tag = "1")]
        pub key: Vec<u8>,
        #[prost(bytes = "vec", tag = "2")]
        pub range_end: Vec<u8>,
        #[prost(int64, tag = "3")]
        pub limit: i64,
        #[prost(int64, tag = "4")]
        pub revision: i64,
        #[prost(bool, tag = "9")]
        pub count_only: bool,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RangeResponse {
        #[prost(message, optional, tag = "1")]
        pub header: Option<ResponseHeader>,
        #[prost(message, repeated, tag = "2")]
        pub kvs: Vec<KeyValue>,
        #[prost(bool, tag = "3")]
        pub more: bool,
        #[prost(int64, tag = "4")]
        pub count: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ResponseHeader {
        #[prost(int64, tag = "3")]
        pub revision: i64,
    }

    /// mvccpb.KeyValue.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct KeyValue {
        #[prost(bytes = "vec", tag = "1")]
        pub key: Vec<u8>,
        #[prost(int64, tag = "3")]
        pub mod_revision: i64,
        #[prost(bytes = "vec", tag = "5")]
        pub value: Vec<u8>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PutRequest {
        #[prost(bytes = "vec", tag = "1")]
        pub key: Vec<u8>,
        #[prost(bytes = "vec", tag = "2")]
        pub value: Vec<u8>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct DeleteRangeRequest {
        #[prost(bytes = "vec", tag = "1")]
        pub key: Vec<u8>,
    }

    /// A reply read for its header alone (Put, Compact).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct HeaderOnly {
        #[prost(message, optional, tag = "1")]
        pub header: Option<ResponseHeader>,
    }

    /// Compare's `target`: `CREATE` and `MOD`; its `result` is left at `EQUAL` (0).
    pub const TARGET_CREATE: i32 = 1;
    pub const TARGET_MOD: i32 = 2;

    /// The revisions are members of a oneof: `optional` gives them the same presence on the
    /// wire, so a create revision of 0 is sent.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Compare {
        #[prost(int32, tag = "2")]
        pub target: i32,
        #[prost(bytes = "vec", tag = "3")]
        pub key: Vec<u8>,
        #[prost(int64, optional, tag = "5")]
        pub create_revision: Option<i64>,
        #[prost(int64, optional, tag = "6")]
        pub mod_revision: Option<i64>,
    }

    /// A oneof of requests: one of these is set.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RequestOp {
        #[prost(message, optional, tag = "1")]
        pub request_range: Option<RangeRequest>,
        #[prost(message, optional, tag = "2")]
        pub request_put: Option<PutRequest>,
        #[prost(message, optional, tag = "3")]
        pub request_delete_range: Option<DeleteRangeRequest>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ResponseOp {
        #[prost(message, optional, tag = "1")]
        pub response_range: Option<RangeResponse>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TxnRequest {
        #[prost(message, repeated, tag = "1")]
        pub compare: Vec<Compare>,
        #[prost(message, repeated, tag = "2")]
        pub success: Vec<RequestOp>,
        #[prost(message, repeated, tag = "3")]
        pub failure: Vec<RequestOp>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TxnResponse {
        #[prost(message, optional, tag = "1")]
        pub header: Option<ResponseHeader>,
        #[prost(bool, tag = "2")]
        pub succeeded: bool,
        #[prost(message, repeated, tag = "3")]
        pub responses: Vec<ResponseOp>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct CompactionRequest {
        #[prost(int64, tag = "1")]
        pub revision: i64,
        #[prost(bool, tag = "2")]
        pub physical: bool,
    }

    /// A message in gRPC's length-prefixed framing (uncompressed).
    pub fn frame(message: &impl prost::Message) -> Bytes {
        let len = message.encoded_len();
        let mut out = BytesMut::with_capacity(5 + len);
        out.put_u8(0);
        out.put_u32(len as u32);
        message.encode_raw(&mut out);
        out.freeze()
    }

    /// The one message of a unary reply.
    pub fn unframe(mut body: Bytes) -> Result<Bytes, String> {
        if body.len() < 5 {
            return Err("a gRPC reply without a message".into());
        }
        if body.get_u8() != 0 {
            return Err("a compressed gRPC reply (none was asked for)".into());
        }
        let len = body.get_u32() as usize;
        if body.len() < len {
            return Err("a truncated gRPC reply".into());
        }
        Ok(body.split_to(len))
    }

    /// etcd's refusal as an [`EtcdError`]: out of range is a compacted revision; codes that
    /// mean "not from this member now" (unavailable, deadline exceeded, aborted) make the
    /// call fail over. Resource exhausted (no space left, a message too large) is the whole
    /// cluster's answer: refused. A read or write answers 503 either way.
    pub fn error(code: &str, message: String) -> EtcdError {
        match code {
            "11" => EtcdError::Compacted(0),
            "4" | "10" | "14" => EtcdError::Unavailable(message),
            _ => EtcdError::Refused(message),
        }
    }
}

impl From<grpc::KeyValue> for KeyValue {
    fn from(kv: grpc::KeyValue) -> Self {
        Self {
            key: kv.key,
            mod_revision: kv.mod_revision,
            value: kv.value,
        }
    }
}

impl From<grpc::RangeResponse> for RangeResponse {
    fn from(reply: grpc::RangeResponse) -> Self {
        Self {
            header: Header {
                revision: reply.header.unwrap_or_default().revision,
            },
            kvs: reply.kvs.into_iter().map(KeyValue::from).collect(),
            more: reply.more,
            count: reply.count,
        }
    }
}

fn string_i64<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
    let text = String::deserialize(d)?;
    text.parse().map_err(serde::de::Error::custom)
}

fn base64_bytes<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
    let text = String::deserialize(d)?;
    B64.decode(text).map_err(serde::de::Error::custom)
}

fn b64(bytes: &[u8]) -> String {
    B64.encode(bytes)
}

/// The end of the range of every key starting with `prefix` (etcd's `WithPrefix`).
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

impl EtcdClient {
    /// A client of the cluster `config` names; nothing is sent until the first request.
    pub fn new(config: EtcdConfig) -> Result<Arc<Self>, EtcdError> {
        if config.endpoints.is_empty() {
            return Err(EtcdError::Unavailable("no etcd endpoints given".into()));
        }
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(Duration::from_secs(2)));
        let tls = match config.tls {
            Some(tls) => tls,
            None => rustls::ClientConfig::builder()
                .with_root_certificates(rustls::RootCertStore::empty())
                .with_no_client_auth(),
        };
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls.clone())
            .https_or_http()
            .enable_http1()
            .wrap_connector(http.clone());
        // gRPC: h2 by ALPN over TLS, by prior knowledge over plain TCP (as etcd's own clients).
        let h2 = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http2()
            .wrap_connector(http);
        Ok(Arc::new(Self {
            http: Client::builder(TokioExecutor::new()).build(connector),
            // Pings find a connection that died silently (a host gone, a partition), which the
            // pool would otherwise keep handing out until TCP gives up. Only while calls are
            // out: etcd refuses pings on an idle connection, and more often than every 5 s.
            grpc: Client::builder(TokioExecutor::new())
                .http2_only(true)
                .timer(hyper_util::rt::TokioTimer::new())
                .http2_keep_alive_interval(Duration::from_secs(10))
                .http2_keep_alive_timeout(Duration::from_secs(5))
                .build(h2),
            endpoints: config
                .endpoints
                .iter()
                .map(|e| e.trim_end_matches('/').to_owned())
                .collect(),
            current: AtomicUsize::new(0),
            request_timeout: config.request_timeout,
        }))
    }

    /// Sends `body` to `path` on the current endpoint; returns the response body.
    async fn post(
        &self,
        path: &str,
        body: RequestBody,
    ) -> Result<hyper::body::Incoming, EtcdError> {
        let index = self.current.load(Ordering::Relaxed) % self.endpoints.len();
        let endpoint = &self.endpoints[index];
        let mut request = http::Request::post(format!("{endpoint}{path}"));
        if http_body::Body::size_hint(&body).exact().is_none() {
            // A streamed body (a watch's): with `Expect: 100-continue` and no content type,
            // etcd's gateway answers while the body is still open (full duplex); otherwise it
            // waits for the body to end.
            request = request.header(http::header::EXPECT, "100-continue");
        } else {
            request = request.header(http::header::CONTENT_TYPE, "application/json");
        }
        let request = request
            .body(body)
            .map_err(|e| EtcdError::Unavailable(e.to_string()))?;
        let response = match tokio::time::timeout(self.request_timeout, self.http.request(request))
            .await
        {
            Ok(Ok(response)) => response,
            Ok(Err(error)) => return Err(EtcdError::Unavailable(format!("{endpoint}: {error}"))),
            Err(_) => {
                return Err(EtcdError::Unavailable(format!(
                    "{endpoint}: no answer within {:?}",
                    self.request_timeout
                )));
            }
        };
        let status = response.status();
        let body = response.into_body();
        if status.is_success() {
            return Ok(body);
        }
        let bytes = tokio::time::timeout(self.request_timeout, body.collect())
            .await
            .ok()
            .and_then(|r| r.ok())
            .map(|c| c.to_bytes())
            .unwrap_or_default();
        Err(gateway_error(&bytes))
    }

    /// Moves on to the next endpoint (the current one did not answer).
    pub fn fail_over(&self) {
        if self.endpoints.len() > 1 {
            self.current.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The keys in `[key, range_end)` at `revision` (0: the latest), at most `limit` (0: all).
    pub async fn range(
        &self,
        key: &[u8],
        range_end: &[u8],
        revision: i64,
        limit: i64,
    ) -> Result<RangeResponse, EtcdError> {
        let request = grpc::RangeRequest {
            key: key.to_vec(),
            range_end: range_end.to_vec(),
            limit,
            revision,
            count_only: false,
        };
        let reply: grpc::RangeResponse =
            self.unary("/etcdserverpb.KV/Range", &request, true).await?;
        Ok(reply.into())
    }

    /// The store's current revision, linearizable: the header of a count of the one key `key`
    /// (no values read), over gRPC.
    pub async fn revision(&self, key: &[u8]) -> Result<i64, EtcdError> {
        let request = grpc::RangeRequest {
            key: key.to_vec(),
            limit: 1,
            count_only: true,
            ..Default::default()
        };
        let reply: grpc::RangeResponse =
            self.unary("/etcdserverpb.KV/Range", &request, true).await?;
        Ok(reply.header.unwrap_or_default().revision)
    }

    /// A unary gRPC call, failing over to the next endpoint when one does not answer. A call
    /// that is not `idempotent` (a transaction) is sent again only when it never left: after
    /// a timeout or an "unavailable" from etcd it may have been applied, and a second try
    /// would then fail its compare (as etcd's own client, which retries only unsent writes).
    async fn unary<T: prost::Message + Default>(
        &self,
        path: &str,
        request: &impl prost::Message,
        idempotent: bool,
    ) -> Result<T, EtcdError> {
        crate::telemetry::in_span_async(
            "etcd",
            Some(("rpc.method", path)),
            self.unary_within(path, request, idempotent),
        )
        .await
    }

    async fn unary_within<T: prost::Message + Default>(
        &self,
        path: &str,
        request: &impl prost::Message,
        idempotent: bool,
    ) -> Result<T, EtcdError> {
        let message = grpc::frame(request);
        let mut last = None;
        for _ in 0..self.endpoints.len() {
            let (reason, sent) =
                match tokio::time::timeout(self.request_timeout, self.unary_once(path, &message))
                    .await
                {
                    Ok(Ok(reply)) => {
                        return T::decode(reply).map_err(|e| {
                            EtcdError::Unavailable(format!("unexpected answer from etcd: {e}"))
                        });
                    }
                    Ok(Err((EtcdError::Unavailable(reason), sent))) => (reason, sent),
                    Ok(Err((other, _))) => return Err(other),
                    Err(_) => (format!("no answer within {:?}", self.request_timeout), true),
                };
            self.fail_over();
            if sent && !idempotent {
                return Err(EtcdError::Unavailable(format!(
                    "{reason} (the write may or may not have been applied)"
                )));
            }
            last = Some(reason);
        }
        Err(EtcdError::Unavailable(last.unwrap_or_default()))
    }

    /// One gRPC call to the current endpoint: the reply's message, or etcd's error and whether
    /// the request may have reached etcd.
    async fn unary_once(&self, path: &str, message: &Bytes) -> Result<Bytes, (EtcdError, bool)> {
        let index = self.current.load(Ordering::Relaxed) % self.endpoints.len();
        let endpoint = &self.endpoints[index];
        let unavailable =
            |e: &dyn std::fmt::Display| EtcdError::Unavailable(format!("{endpoint}: {e}"));
        let request = http::Request::post(format!("{endpoint}{path}"))
            .header(http::header::CONTENT_TYPE, "application/grpc")
            .header(http::header::TE, "trailers")
            // etcd stops working on it when this client stops waiting.
            .header(
                "grpc-timeout",
                format!("{}m", self.request_timeout.as_millis().min(99_999_999)),
            )
            .body(Full::new(message.clone()).boxed())
            .map_err(|e| (unavailable(&e), false))?;
        let response = self
            .grpc
            .request(request)
            .await
            .map_err(|e| (unavailable(&e), !e.is_connect()))?;
        let sent = |e: EtcdError| (e, true);
        if !response.status().is_success() {
            return Err(sent(unavailable(&format!("HTTP {}", response.status()))));
        }
        let (parts, body) = response.into_parts();
        let collected = body.collect().await.map_err(|e| sent(unavailable(&e)))?;
        // grpc-status comes in the trailers, or in the headers of a reply without a body.
        let trailers = collected.trailers().cloned().unwrap_or_default();
        let status = trailers
            .get("grpc-status")
            .or(parts.headers.get("grpc-status"));
        let message = trailers
            .get("grpc-message")
            .or(parts.headers.get("grpc-message"))
            .and_then(|m| m.to_str().ok())
            .map(|m| {
                percent_encoding::percent_decode_str(m)
                    .decode_utf8_lossy()
                    .into_owned()
            })
            .unwrap_or_default();
        match status.and_then(|s| s.to_str().ok()) {
            Some("0") => grpc::unframe(collected.to_bytes()).map_err(|e| sent(unavailable(&e))),
            Some(code) => Err(sent(grpc::error(code, message))),
            None => Err(sent(unavailable(&"a gRPC reply without grpc-status"))),
        }
    }

    /// Puts `value` at `key` unconditionally; returns the revision of the write.
    pub async fn put(&self, key: &[u8], value: &[u8]) -> Result<i64, EtcdError> {
        let request = grpc::PutRequest {
            key: key.to_vec(),
            value: value.to_vec(),
        };
        let reply: grpc::HeaderOnly = self.unary("/etcdserverpb.KV/Put", &request, true).await?;
        Ok(reply.header.unwrap_or_default().revision)
    }

    /// The version of the etcd server at the current endpoint (`/version`, e.g. "3.5.1").
    pub async fn server_version(&self) -> Result<String, EtcdError> {
        #[derive(Deserialize)]
        struct Version {
            etcdserver: String,
        }
        let index = self.current.load(Ordering::Relaxed) % self.endpoints.len();
        let endpoint = &self.endpoints[index];
        let request = http::Request::get(format!("{endpoint}/version"))
            .body(Full::new(Bytes::new()).boxed())
            .map_err(|e| EtcdError::Unavailable(e.to_string()))?;
        let response = tokio::time::timeout(self.request_timeout, async {
            let response = self
                .http
                .request(request)
                .await
                .map_err(|e| EtcdError::Unavailable(format!("{endpoint}: {e}")))?;
            response
                .into_body()
                .collect()
                .await
                .map_err(|e| EtcdError::Unavailable(e.to_string()))
        })
        .await
        .map_err(|_| EtcdError::Unavailable(format!("{endpoint}: no answer to /version")))??;
        let version: Version = serde_json::from_slice(&response.to_bytes())
            .map_err(|e| EtcdError::Unavailable(format!("unexpected /version answer: {e}")))?;
        Ok(version.etcdserver)
    }

    /// If `compare` holds for `key`: puts `value` (Some) or deletes the key (None). Otherwise
    /// reads the key's current value.
    pub async fn txn(
        &self,
        key: &[u8],
        compare: Compare,
        value: Option<&[u8]>,
    ) -> Result<TxnResult, EtcdError> {
        let compare = match compare {
            Compare::Absent => grpc::Compare {
                target: grpc::TARGET_CREATE,
                key: key.to_vec(),
                create_revision: Some(0),
                mod_revision: None,
            },
            Compare::ModRevision(revision) => grpc::Compare {
                target: grpc::TARGET_MOD,
                key: key.to_vec(),
                create_revision: None,
                mod_revision: Some(revision),
            },
        };
        let success = match value {
            Some(value) => grpc::RequestOp {
                request_put: Some(grpc::PutRequest {
                    key: key.to_vec(),
                    value: value.to_vec(),
                }),
                ..Default::default()
            },
            None => grpc::RequestOp {
                request_delete_range: Some(grpc::DeleteRangeRequest { key: key.to_vec() }),
                ..Default::default()
            },
        };
        let failure = grpc::RequestOp {
            request_range: Some(grpc::RangeRequest {
                key: key.to_vec(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let request = grpc::TxnRequest {
            compare: vec![compare],
            success: vec![success],
            failure: vec![failure],
        };
        let reply: grpc::TxnResponse = self.unary("/etcdserverpb.KV/Txn", &request, false).await?;
        let current = (!reply.succeeded)
            .then(|| {
                reply
                    .responses
                    .into_iter()
                    .find_map(|r| r.response_range)
                    .and_then(|r| r.kvs.into_iter().next())
                    .map(KeyValue::from)
            })
            .flatten();
        Ok(TxnResult {
            revision: reply.header.unwrap_or_default().revision,
            succeeded: reply.succeeded,
            current,
        })
    }

    /// Compacts the store's history up to `revision` (tests and operators).
    pub async fn compact(&self, revision: i64) -> Result<(), EtcdError> {
        let request = grpc::CompactionRequest {
            revision,
            physical: true,
        };
        let _: grpc::HeaderOnly = self
            .unary("/etcdserverpb.KV/Compact", &request, false)
            .await?;
        Ok(())
    }

    /// Watches `[key, range_end)` from `start_revision` on: etcd sends each change after it,
    /// with the previous value of deleted keys. The request stays open, so that progress can
    /// be asked for ([`Watch::request_progress`]).
    pub async fn watch(
        &self,
        key: &[u8],
        range_end: &[u8],
        start_revision: i64,
    ) -> Result<Watch, EtcdError> {
        let create = serde_json::json!({"create_request": {
            "key": b64(key),
            "range_end": b64(range_end),
            "start_revision": start_revision.to_string(),
            "prev_kv": true,
        }});
        let (requests, rx) = mpsc::unbounded_channel::<Bytes>();
        let mut first = serde_json::to_vec(&create).unwrap_or_default();
        first.push(b'\n');
        let _ = requests.send(Bytes::from(first));
        let mut rx = rx;
        let frames = futures::stream::poll_fn(move |cx| {
            rx.poll_recv(cx)
                .map(|bytes| bytes.map(|b| Ok(http_body::Frame::data(b))))
        });
        let body = BodyExt::boxed(StreamBody::new(frames));
        let response = self.post("/v3/watch", body).await?;
        let lines = lines(response);
        let events = lines
            .map(|line| {
                let line = line?;
                let parsed: WatchLine = serde_json::from_slice(&line).map_err(|e| {
                    EtcdError::Unavailable(format!("unexpected watch answer from etcd: {e}"))
                })?;
                if let Some(error) = parsed.error {
                    return Err(EtcdError::Refused(error.message));
                }
                let Some(reply) = parsed.result else {
                    return Ok(Vec::new());
                };
                if reply.compact_revision > 0 {
                    return Err(EtcdError::Compacted(reply.compact_revision));
                }
                if reply.canceled {
                    return Err(EtcdError::Unavailable(format!(
                        "etcd cancelled the watch: {}",
                        reply.cancel_reason
                    )));
                }
                if reply.created && reply.events.is_empty() {
                    return Ok(Vec::new());
                }
                if reply.events.is_empty() {
                    return Ok(vec![WatchEvent::Progress(reply.header.revision)]);
                }
                Ok(reply
                    .events
                    .into_iter()
                    .map(|event| match event.type_.as_str() {
                        "DELETE" => WatchEvent::Delete {
                            revision: event.kv.mod_revision,
                            previous: event.prev_kv.unwrap_or(KeyValue {
                                key: event.kv.key,
                                ..Default::default()
                            }),
                        },
                        _ => WatchEvent::Put(event.kv),
                    })
                    .collect())
            })
            .boxed();
        Ok(Watch { events, requests })
    }
}

fn gateway_error(bytes: &[u8]) -> EtcdError {
    match serde_json::from_slice::<GatewayError>(bytes) {
        // gRPC OutOfRange: "mvcc: required revision has been compacted".
        Ok(error) if error.code == 11 => EtcdError::Compacted(0),
        Ok(error) if !error.message.is_empty() => EtcdError::Refused(error.message),
        _ => EtcdError::Unavailable(String::from_utf8_lossy(bytes).into_owned()),
    }
}

/// The newline-separated JSON messages of a streamed response.
fn lines(
    body: hyper::body::Incoming,
) -> impl futures::Stream<Item = Result<Vec<u8>, EtcdError>> + Send + 'static {
    futures::stream::unfold(
        (body, Vec::<u8>::new(), false),
        |(mut body, mut buffer, done)| async move {
            loop {
                if let Some(end) = buffer.iter().position(|b| *b == b'\n') {
                    let line: Vec<u8> = buffer.drain(..=end).collect();
                    if line.iter().all(u8::is_ascii_whitespace) {
                        continue;
                    }
                    return Some((Ok(line), (body, buffer, done)));
                }
                if done {
                    return None;
                }
                match body.frame().await {
                    Some(Ok(frame)) => {
                        if let Ok(data) = frame.into_data() {
                            buffer.extend_from_slice(&data);
                        }
                    }
                    Some(Err(error)) => {
                        return Some((
                            Err(EtcdError::Unavailable(format!("etcd watch broke: {error}"))),
                            (body, buffer, true),
                        ));
                    }
                    None => {
                        return Some((
                            Err(EtcdError::Unavailable("etcd closed the watch".into())),
                            (body, buffer, true),
                        ));
                    }
                }
            }
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_is_ordered_from_3_4_31_and_3_5_13() {
        for (version, ordered) in [
            ("3.4.30", false),
            ("3.4.31", true),
            ("3.5.1", false),
            ("3.5.12", false),
            ("3.5.13", true),
            ("3.6.0", true),
            ("3.3.27", false),
            ("4.0.0", true),
            ("garbage", false),
        ] {
            assert_eq!(orders_progress(version), ordered, "{version}");
        }
    }

    #[test]
    fn grpc_messages_are_etcds_wire_format() {
        let request = grpc::RangeRequest {
            key: b"/k".to_vec(),
            limit: 1,
            count_only: true,
            ..Default::default()
        };
        // Length prefix, then field 1 (bytes "/k"), field 3 (varint 1), field 9 (true): the
        // bytes etcd's Go client sends for the same request.
        assert_eq!(
            grpc::frame(&request)[..],
            [0, 0, 0, 0, 8, 0x0a, 2, b'/', b'k', 0x18, 1, 0x48, 1]
        );
        // A reply with a header (cluster_id 7, revision 42) and a count: the header's revision,
        // the rest skipped.
        let reply = Bytes::from_static(&[0, 0, 0, 0, 8, 0x0a, 4, 0x08, 7, 0x18, 42, 0x20, 1]);
        let message = grpc::unframe(reply).unwrap();
        let decoded = <grpc::RangeResponse as prost::Message>::decode(message).unwrap();
        assert_eq!(decoded.header.unwrap().revision, 42);
        // "Absent" compares the create revision with 0: the 0 must be on the wire (a oneof
        // member), or etcd would see no target value at all.
        let absent = grpc::Compare {
            target: grpc::TARGET_CREATE,
            key: b"/k".to_vec(),
            create_revision: Some(0),
            mod_revision: None,
        };
        assert_eq!(
            grpc::frame(&absent)[5..],
            [0x10, 1, 0x1a, 2, b'/', b'k', 0x28, 0]
        );
        for short in [&[0u8, 0, 0][..], &[0, 0, 0, 0, 9, 1], &[1, 0, 0, 0, 0]] {
            assert!(grpc::unframe(Bytes::copy_from_slice(short)).is_err());
        }
        assert!(matches!(
            grpc::error("14", "etcdserver: no leader".into()),
            EtcdError::Unavailable(_)
        ));
        assert!(matches!(
            grpc::error("3", "etcdserver: key is not provided".into()),
            EtcdError::Refused(_)
        ));
        assert!(matches!(
            grpc::error("8", "etcdserver: mvcc: database space exceeded".into()),
            EtcdError::Refused(_)
        ));
        assert!(matches!(
            grpc::error("11", String::new()),
            EtcdError::Compacted(_)
        ));
    }

    #[test]
    fn prefix_ends() {
        assert_eq!(prefix_end(b"/a/"), b"/a0");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff"), [0]);
    }

    #[test]
    fn proto3_json_is_read() {
        // What the watch's JSON carries.
        let kv: KeyValue =
            serde_json::from_str(r#"{"key":"L2E=","mod_revision":"5","value":"e30="}"#).unwrap();
        assert_eq!(kv.key, b"/a");
        assert_eq!(kv.mod_revision, 5);
        assert_eq!(kv.value, b"{}");
        let header: Header = serde_json::from_str(r#"{"revision":"7"}"#).unwrap();
        assert_eq!(header.revision, 7);
        let empty: KeyValue = serde_json::from_str(r#"{"key":"L2E="}"#).unwrap();
        assert!(empty.value.is_empty() && empty.mod_revision == 0);
        assert!(matches!(
            gateway_error(br#"{"error":"x","code":11,"message":"etcdserver: mvcc: required revision has been compacted"}"#),
            EtcdError::Compacted(_)
        ));
    }
}
