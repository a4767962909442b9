//! etcd's v3 API on its client port, over gRPC (tonic): unary calls (`KV/Range`, `KV/Txn`,
//! `KV/Put`, `KV/Compact`, `Maintenance/Status`) and the watch as one bidirectional stream
//! (`Watch/Watch`). The messages and clients are generated from a subset of etcd's protos by
//! `etcd-proto/` and checked in (`proto/`), so no build needs `protoc`; the connection is the
//! server's own rustls, with the CA and client certificate of the `--etcd-*` flags.
//!
//! The generated clients call hyper's pooled HTTP/2 client directly rather than tonic's
//! `Channel`, which hands every call to a buffer task of its own: on a busy server that task is
//! one more place in the run queue between a consistent read's check and the wire.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use futures::StreamExt;
use http::Uri;
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::{TokioExecutor, TokioTimer},
};
use tokio::sync::mpsc;

/// The code etcd-proto generates from `etcd-proto/proto` (see its `src/main.rs`).
#[allow(dead_code, missing_docs, clippy::all, clippy::pedantic)]
mod proto {
    pub mod etcdserverpb {
        include!("proto/etcdserverpb.rs");
    }
    pub mod mvccpb {
        include!("proto/mvccpb.rs");
    }
}

use proto::etcdserverpb::{
    self as pb, compare, kv_client::KvClient, maintenance_client::MaintenanceClient, request_op,
    response_op, watch_client::WatchClient, watch_request,
};
use proto::mvccpb;

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

/// The HTTP/2 connections to the cluster's members (one per member, made at its first call
/// and again whenever it breaks), shared by every call.
type Transport = Client<Connector, tonic::body::Body>;

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
    endpoints: Vec<Member>,
    transport: Transport,
    current: AtomicUsize,
    request_timeout: Duration,
}

/// One endpoint: its URL as given, and parsed as the origin its calls go to.
struct Member {
    url: String,
    origin: Uri,
}

/// Where a call goes: the shared connections, and the origin of the member in use.
struct Link {
    transport: Transport,
    origin: Uri,
}

impl Link {
    fn kv(self) -> KvClient<Transport> {
        KvClient::with_origin(self.transport, self.origin)
    }

    fn watch(self) -> WatchClient<Transport> {
        WatchClient::with_origin(self.transport, self.origin)
    }

    fn maintenance(self) -> MaintenanceClient<Transport> {
        MaintenanceClient::with_origin(self.transport, self.origin)
    }
}

/// A key and its value at a revision.
#[derive(Debug, Clone, Default)]
pub struct KeyValue {
    /// The key.
    pub key: Vec<u8>,
    /// The revision of the key's last change.
    pub mod_revision: i64,
    /// The value.
    pub value: Vec<u8>,
}

/// The header of every response: the store's revision when it was served.
#[derive(Debug, Clone, Default)]
pub struct Header {
    /// The store's revision.
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

/// An open watch: its events as they come, and a way to ask for a progress notification.
pub struct Watch {
    /// Batches of events, in revision order; an error ends the watch.
    pub events: futures::stream::BoxStream<'static, Result<Vec<WatchEvent>, EtcdError>>,
    /// Asks this watch for progress notifications.
    pub progress: Progress,
}

/// Asks a watch for a progress notification (etcd's `RequestProgress`): etcd answers with its
/// current revision once every event before it was sent.
#[derive(Clone, Debug)]
pub struct Progress(mpsc::UnboundedSender<pb::WatchRequest>);

impl Progress {
    /// Sends the request on the watch's stream; false when the watch has ended.
    pub fn request(&self) -> bool {
        let request = pb::WatchRequest {
            request_union: Some(watch_request::RequestUnion::ProgressRequest(
                pb::WatchProgressRequest {},
            )),
        };
        self.0.send(request).is_ok()
    }
}

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

impl From<mvccpb::KeyValue> for KeyValue {
    fn from(kv: mvccpb::KeyValue) -> Self {
        Self {
            key: kv.key,
            mod_revision: kv.mod_revision,
            value: kv.value,
        }
    }
}

impl From<pb::RangeResponse> for RangeResponse {
    fn from(reply: pb::RangeResponse) -> Self {
        Self {
            header: Header {
                revision: revision(reply.header),
            },
            kvs: reply.kvs.into_iter().map(KeyValue::from).collect(),
            more: reply.more,
            count: reply.count,
        }
    }
}

fn revision(header: Option<pb::ResponseHeader>) -> i64 {
    header.map_or(0, |h| h.revision)
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

/// A gRPC failure as an [`EtcdError`], and whether the request may have reached etcd.
///
/// etcd's own answers: out of range is a compacted revision; codes that mean "not from this
/// member now" (unavailable, deadline exceeded, aborted) make the call fail over. Resource
/// exhausted (no space left, a message too large) is the whole cluster's answer: refused. A
/// read or write answers 503 either way. A failure of this side's connection (a status with a
/// source error) is unavailable; one while connecting means the request never left.
fn grpc_error(url: &str, status: &tonic::Status) -> (EtcdError, bool) {
    use std::error::Error as _;
    use tonic::Code;
    let mut source = status.source();
    let local = source.map(crate::error::chain);
    while let Some(error) = source {
        if let Some(failed) = error.downcast_ref::<hyper_util::client::legacy::Error>()
            && failed.is_connect()
        {
            return (
                EtcdError::Unavailable(format!("{url}: {}", crate::error::chain(error))),
                false,
            );
        }
        source = error.source();
    }
    let message = status.message().to_owned();
    let error = match (status.code(), local) {
        (Code::OutOfRange, _) => EtcdError::Compacted(0),
        (_, Some(local)) => EtcdError::Unavailable(format!("{url}: {local}")),
        (Code::Unavailable | Code::DeadlineExceeded | Code::Aborted, None) => {
            EtcdError::Unavailable(message)
        }
        _ => EtcdError::Refused(message),
    };
    (error, true)
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
        // h2 by ALPN over TLS, by prior knowledge over plain TCP (as etcd's own clients).
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http2()
            .wrap_connector(http);
        let endpoints = config
            .endpoints
            .iter()
            .map(|url| {
                let url = url.trim_end_matches('/').to_owned();
                let origin = url
                    .parse::<Uri>()
                    .ok()
                    .filter(|uri| uri.scheme().is_some() && uri.authority().is_some())
                    .ok_or_else(|| EtcdError::Unavailable(format!("{url}: not a URL")))?;
                Ok(Member { url, origin })
            })
            .collect::<Result<_, EtcdError>>()?;
        let transport = Client::builder(TokioExecutor::new())
            .http2_only(true)
            .timer(TokioTimer::new())
            // One connection per member, kept until it breaks: the watch and every call share it.
            .pool_idle_timeout(None)
            // Pings find a connection that died silently (a host gone, a partition), which
            // would otherwise be used until TCP gives up. Only while calls are out: etcd
            // refuses pings on an idle connection, and more often than every 5 s.
            .http2_keep_alive_interval(Duration::from_secs(10))
            .http2_keep_alive_timeout(Duration::from_secs(5))
            .http2_keep_alive_while_idle(false)
            .build(connector);
        Ok(Arc::new(Self {
            endpoints,
            transport,
            current: AtomicUsize::new(0),
            request_timeout: config.request_timeout,
        }))
    }

    /// The endpoint in use: its URL, and where its calls go.
    fn member(&self) -> (&str, Link) {
        let index = self.current.load(Ordering::Relaxed) % self.endpoints.len();
        let member = &self.endpoints[index];
        let link = Link {
            transport: self.transport.clone(),
            origin: member.origin.clone(),
        };
        (&member.url, link)
    }

    /// `message` as a request that etcd stops working on when this client stops waiting.
    fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        request.set_timeout(self.request_timeout);
        request
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
        let request = pb::RangeRequest {
            key: key.to_vec(),
            range_end: range_end.to_vec(),
            limit,
            revision,
            ..Default::default()
        };
        let reply = self.range_call(request).await?;
        Ok(reply.into())
    }

    /// The store's current revision, linearizable: the header of a count of the one key `key`
    /// (no values read).
    pub async fn revision(&self, key: &[u8]) -> Result<i64, EtcdError> {
        let request = pb::RangeRequest {
            key: key.to_vec(),
            limit: 1,
            count_only: true,
            ..Default::default()
        };
        let reply = self.range_call(request).await?;
        Ok(revision(reply.header))
    }

    /// One Range call (a read: sent again to the next endpoint when one does not answer).
    async fn range_call(&self, request: pb::RangeRequest) -> Result<pb::RangeResponse, EtcdError> {
        self.unary("/etcdserverpb.KV/Range", true, |link| {
            let request = self.request(request.clone());
            async move { link.kv().range(request).await }
        })
        .await
    }

    /// A unary gRPC call, failing over to the next endpoint when one does not answer. A call
    /// that is not `idempotent` (a transaction) is sent again only when it never left: after
    /// a timeout or an "unavailable" from etcd it may have been applied, and a second try
    /// would then fail its compare (as etcd's own client, which retries only unsent writes).
    async fn unary<T, F>(
        &self,
        method: &'static str,
        idempotent: bool,
        call: impl Fn(Link) -> F,
    ) -> Result<T, EtcdError>
    where
        F: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        crate::observe::telemetry::in_span_async(
            "etcd",
            Some(("rpc.method", method)),
            self.unary_within(idempotent, call),
        )
        .await
    }

    async fn unary_within<T, F>(
        &self,
        idempotent: bool,
        call: impl Fn(Link) -> F,
    ) -> Result<T, EtcdError>
    where
        F: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let mut last = None;
        for _ in 0..self.endpoints.len() {
            let (url, link) = self.member();
            let (reason, sent) = match tokio::time::timeout(self.request_timeout, call(link)).await
            {
                Ok(Ok(reply)) => return Ok(reply.into_inner()),
                Ok(Err(status)) => match grpc_error(url, &status) {
                    (EtcdError::Unavailable(reason), sent) => (reason, sent),
                    (other, _) => return Err(other),
                },
                Err(_) => (
                    format!("{url}: no answer within {:?}", self.request_timeout),
                    true,
                ),
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

    /// Puts `value` at `key` unconditionally; returns the revision of the write.
    pub async fn put(&self, key: &[u8], value: &[u8]) -> Result<i64, EtcdError> {
        let request = pb::PutRequest {
            key: key.to_vec(),
            value: value.to_vec(),
            ..Default::default()
        };
        let reply = self
            .unary("/etcdserverpb.KV/Put", true, |link| {
                let request = self.request(request.clone());
                async move { link.kv().put(request).await }
            })
            .await?;
        Ok(revision(reply.header))
    }

    /// The version of the etcd server at the current endpoint (`Maintenance/Status`, e.g.
    /// "3.5.1").
    pub async fn server_version(&self) -> Result<String, EtcdError> {
        let (url, link) = self.member();
        let mut client = link.maintenance();
        let call = client.status(self.request(pb::StatusRequest {}));
        match tokio::time::timeout(self.request_timeout, call).await {
            Ok(Ok(reply)) => Ok(reply.into_inner().version),
            Ok(Err(status)) => Err(grpc_error(url, &status).0),
            Err(_) => Err(EtcdError::Unavailable(format!(
                "{url}: no answer to Status"
            ))),
        }
    }

    /// If `compare` holds for `key`: puts `value` (Some) or deletes the key (None). Otherwise
    /// reads the key's current value.
    pub async fn txn(
        &self,
        key: &[u8],
        compare: Compare,
        value: Option<&[u8]>,
    ) -> Result<TxnResult, EtcdError> {
        // The compared revision is a oneof member: a create revision of 0 is on the wire.
        let (target, revision_union) = match compare {
            Compare::Absent => (
                compare::CompareTarget::Create,
                compare::TargetUnion::CreateRevision(0),
            ),
            Compare::ModRevision(revision) => (
                compare::CompareTarget::Mod,
                compare::TargetUnion::ModRevision(revision),
            ),
        };
        let compare = pb::Compare {
            result: compare::CompareResult::Equal as i32,
            target: target as i32,
            key: key.to_vec(),
            target_union: Some(revision_union),
            ..Default::default()
        };
        let success = match value {
            Some(value) => request_op::Request::RequestPut(pb::PutRequest {
                key: key.to_vec(),
                value: value.to_vec(),
                ..Default::default()
            }),
            None => request_op::Request::RequestDeleteRange(pb::DeleteRangeRequest {
                key: key.to_vec(),
                ..Default::default()
            }),
        };
        let failure = request_op::Request::RequestRange(pb::RangeRequest {
            key: key.to_vec(),
            ..Default::default()
        });
        let request = pb::TxnRequest {
            compare: vec![compare],
            success: vec![pb::RequestOp {
                request: Some(success),
            }],
            failure: vec![pb::RequestOp {
                request: Some(failure),
            }],
        };
        let reply = self
            .unary("/etcdserverpb.KV/Txn", false, |link| {
                let request = self.request(request.clone());
                async move { link.kv().txn(request).await }
            })
            .await?;
        let current = (!reply.succeeded)
            .then(|| {
                reply.responses.into_iter().find_map(|r| match r.response {
                    Some(response_op::Response::ResponseRange(range)) => {
                        range.kvs.into_iter().next().map(KeyValue::from)
                    }
                    _ => None,
                })
            })
            .flatten();
        Ok(TxnResult {
            revision: revision(reply.header),
            succeeded: reply.succeeded,
            current,
        })
    }

    /// Compacts the store's history up to `revision` (tests and operators).
    pub async fn compact(&self, revision: i64) -> Result<(), EtcdError> {
        let request = pb::CompactionRequest {
            revision,
            physical: true,
        };
        self.unary("/etcdserverpb.KV/Compact", false, |link| {
            let request = self.request(request);
            async move { link.kv().compact(request).await }
        })
        .await?;
        Ok(())
    }

    /// Watches `[key, range_end)` from `start_revision` on: etcd sends each change after it,
    /// with the previous value of deleted keys. The request stream stays open, so that
    /// progress can be asked for ([`Watch::progress`]).
    pub async fn watch(
        &self,
        key: &[u8],
        range_end: &[u8],
        start_revision: i64,
    ) -> Result<Watch, EtcdError> {
        let create = pb::WatchRequest {
            request_union: Some(watch_request::RequestUnion::CreateRequest(
                pb::WatchCreateRequest {
                    key: key.to_vec(),
                    range_end: range_end.to_vec(),
                    start_revision,
                    prev_kv: true,
                    ..Default::default()
                },
            )),
        };
        let (requests, mut rx) = mpsc::unbounded_channel();
        let _ = requests.send(create);
        let outbound = futures::stream::poll_fn(move |cx| rx.poll_recv(cx));
        let (url, link) = self.member();
        let mut client = link.watch();
        let call = client.watch(outbound);
        let replies = match tokio::time::timeout(self.request_timeout, call).await {
            Ok(Ok(replies)) => replies.into_inner(),
            Ok(Err(status)) => return Err(grpc_error(url, &status).0),
            Err(_) => {
                return Err(EtcdError::Unavailable(format!(
                    "{url}: no answer within {:?}",
                    self.request_timeout
                )));
            }
        };
        let url = url.to_owned();
        let events = replies
            .map(move |reply| watch_events(reply.map_err(|status| grpc_error(&url, &status).0)?))
            .chain(futures::stream::once(async {
                Err(EtcdError::Unavailable("etcd closed the watch".into()))
            }))
            .boxed();
        Ok(Watch {
            events,
            progress: Progress(requests),
        })
    }
}

/// The events of one watch response: none for the watch's creation, a progress notification
/// for a response without events, an error when etcd cancelled the watch (a compacted start
/// revision among the reasons).
fn watch_events(reply: pb::WatchResponse) -> Result<Vec<WatchEvent>, EtcdError> {
    if reply.compact_revision > 0 {
        return Err(EtcdError::Compacted(reply.compact_revision));
    }
    if reply.canceled {
        return Err(EtcdError::Unavailable(format!(
            "etcd cancelled the watch: {}",
            reply.cancel_reason
        )));
    }
    if reply.events.is_empty() {
        return Ok(if reply.created {
            Vec::new()
        } else {
            vec![WatchEvent::Progress(revision(reply.header))]
        });
    }
    Ok(reply
        .events
        .into_iter()
        .map(|event| {
            let kind = event.r#type();
            let kv = event.kv.unwrap_or_default();
            match kind {
                mvccpb::event::EventType::Delete => WatchEvent::Delete {
                    revision: kv.mod_revision,
                    previous: event.prev_kv.map_or_else(
                        || KeyValue {
                            key: kv.key,
                            ..Default::default()
                        },
                        KeyValue::from,
                    ),
                },
                mvccpb::event::EventType::Put => WatchEvent::Put(kv.into()),
            }
        })
        .collect())
}

#[cfg(test)]
mod tests;
