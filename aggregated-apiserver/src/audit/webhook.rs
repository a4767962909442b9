//! The audit webhook backend (`--audit-webhook-config-file`), as kube-apiserver's batch mode
//! runs it: events gather in a bounded buffer and go out as one `audit.k8s.io/v1` EventList
//! per POST to the kubeconfig's server, at most `max_size` events at a time and at the latest
//! `max_wait` after the first of them, at most `throttle_qps` POSTs a second (bursts of
//! `throttle_burst`). A POST that fails is tried again with kube-apiserver's backoff
//! (`initial_backoff`, then ×1.5, five tries in all); a batch that still fails is dropped,
//! counted in `apiserver_audit_error_total{plugin="webhook"}` and logged.

use std::{path::Path, time::Duration};

use anyhow::Context;
use http_body_util::BodyExt;
use tokio::{
    sync::{mpsc, oneshot},
    time::Instant,
};

use super::log::{Message, Sink};
use crate::observe::metrics::Metrics;

/// How the batches are made and sent (kube-apiserver's `--audit-webhook-batch-*` flags).
#[derive(Debug, Clone)]
pub struct WebhookOptions {
    /// Events the buffer holds.
    pub buffer_size: usize,
    /// Events per POST at most.
    pub max_size: usize,
    /// How long an event waits for others before its batch is sent.
    pub max_wait: Duration,
    /// POSTs a second at most (None: no limit).
    pub throttle: Option<(f64, u32)>,
    /// The wait before a failed POST is tried again (growing ×1.5 each time).
    pub initial_backoff: Duration,
}

/// Tries of one batch in all (kube-apiserver's `DefaultRetryBackoffWithInitialDelay`).
const TRIES: u32 = 5;

/// An EventList's beginning and end around its events' lines.
const LIST_HEAD: &[u8] =
    br#"{"kind":"EventList","apiVersion":"audit.k8s.io/v1","metadata":{},"items":["#;
const LIST_TAIL: &[u8] = b"]}";

/// Where the batches go: the kubeconfig's client and its server's URL.
struct Endpoint {
    client: kube::Client,
    uri: http::Uri,
}

impl Endpoint {
    /// The kubeconfig at `path` (its current context): its server, trusted and authenticated
    /// as any kubeconfig says (CA, client certificate, token).
    async fn load(path: &Path) -> anyhow::Result<Self> {
        let kubeconfig = kube::config::Kubeconfig::read_from(path)
            .with_context(|| format!("reading {}", path.display()))?;
        let mut config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
        // The POST goes to the server's URL as written, path included: the client is given
        // only its scheme and authority.
        let uri = config.cluster_url.clone();
        let mut parts = uri.clone().into_parts();
        parts.path_and_query = Some(http::uri::PathAndQuery::from_static("/"));
        config.cluster_url = http::Uri::from_parts(parts)?;
        let client = crate::net::client_tls::kube_client(config)?;
        Ok(Self { client, uri })
    }

    async fn post(&self, body: Vec<u8>) -> Result<(), String> {
        let path = self
            .uri
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_owned();
        let request = http::Request::post(path)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(body)
            .map_err(|e| e.to_string())?;
        let response = self
            .client
            .send(request.map(kube::client::Body::from))
            .await
            .map_err(|e| e.to_string())?;
        let status = response.status();
        if status.is_success() {
            return Ok(());
        }
        let text = response
            .into_body()
            .collect()
            .await
            .map(|b| String::from_utf8_lossy(&b.to_bytes()).into_owned())
            .unwrap_or_default();
        Err(format!("the audit webhook answered {status}: {text}"))
    }
}

/// Starts the backend for the kubeconfig at `config_file`; events sent to the returned sink
/// are POSTed in batches.
pub async fn start(
    config_file: &Path,
    options: WebhookOptions,
    metrics: std::sync::Arc<std::sync::OnceLock<std::sync::Arc<Metrics>>>,
) -> anyhow::Result<Sink> {
    let endpoint = Endpoint::load(config_file).await?;
    let (sink, receiver) = Sink::channel(options.buffer_size);
    tokio::spawn(run(endpoint, options, receiver, metrics));
    Ok(sink)
}

/// Takes events from `receiver` and sends them in batches until the sink is dropped.
async fn run(
    endpoint: Endpoint,
    options: WebhookOptions,
    mut receiver: mpsc::Receiver<Message>,
    metrics: std::sync::Arc<std::sync::OnceLock<std::sync::Arc<Metrics>>>,
) {
    let mut throttle = options.throttle.map(|(qps, burst)| Bucket::new(qps, burst));
    let mut open = true;
    while open {
        // The first event (or flush) opens a batch; others join it until it is full or
        // `max_wait` has passed.
        let Some(first) = receiver.recv().await else {
            break;
        };
        let mut lines: Vec<Vec<u8>> = Vec::new();
        let mut flushed: Vec<oneshot::Sender<()>> = Vec::new();
        let take = |message: Message, lines: &mut Vec<_>, flushed: &mut Vec<_>| match message {
            // The event's share of the buffer is free once it is in a batch.
            Message::Line(line, _permit) => lines.push(line),
            Message::Flush(done) => flushed.push(done),
        };
        take(first, &mut lines, &mut flushed);
        let deadline = Instant::now() + options.max_wait;
        while lines.len() < options.max_size && flushed.is_empty() {
            match tokio::time::timeout_at(deadline, receiver.recv()).await {
                Ok(Some(message)) => take(message, &mut lines, &mut flushed),
                Ok(None) => {
                    open = false;
                    break;
                }
                Err(_) => break,
            }
        }
        if !lines.is_empty() {
            if let Some(bucket) = &mut throttle {
                bucket.take().await;
            }
            send(&endpoint, &options, lines, &metrics).await;
        }
        for done in flushed {
            let _ = done.send(());
        }
    }
}

/// POSTs one batch, trying again with backoff; a batch that cannot be sent is counted.
async fn send(
    endpoint: &Endpoint,
    options: &WebhookOptions,
    lines: Vec<Vec<u8>>,
    metrics: &std::sync::OnceLock<std::sync::Arc<Metrics>>,
) {
    let count = lines.len();
    let body = event_list(lines);
    let mut wait = options.initial_backoff;
    for attempt in 1..=TRIES {
        match endpoint.post(body.clone()).await {
            Ok(()) => return,
            Err(error) if attempt == TRIES => {
                if let Some(metrics) = metrics.get() {
                    let errors = metrics.audit_errors.get_or_create(
                        &crate::observe::metrics::PluginLabels { plugin: "webhook" },
                    );
                    for _ in 0..count {
                        errors.inc();
                    }
                }
                tracing::error!(%error, events = count, "audit webhook: a batch was dropped");
            }
            Err(error) => {
                tracing::warn!(%error, attempt, "audit webhook: sending again");
                tokio::time::sleep(wait).await;
                wait = wait.mul_f64(1.5);
            }
        }
    }
}

/// The EventList of events' JSON lines.
fn event_list(lines: Vec<Vec<u8>>) -> Vec<u8> {
    let size = LIST_HEAD.len() + LIST_TAIL.len() + lines.iter().map(Vec::len).sum::<usize>();
    let mut body = Vec::with_capacity(size);
    body.extend_from_slice(LIST_HEAD);
    for (index, line) in lines.iter().enumerate() {
        if index > 0 {
            body.push(b',');
        }
        body.extend_from_slice(line.strip_suffix(b"\n").unwrap_or(line));
    }
    body.extend_from_slice(LIST_TAIL);
    body
}

/// A token bucket: `burst` POSTs at once, then `qps` a second.
struct Bucket {
    qps: f64,
    burst: f64,
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn new(qps: f64, burst: u32) -> Self {
        let burst = f64::from(burst.max(1));
        Self {
            qps: qps.max(f64::MIN_POSITIVE),
            burst,
            tokens: burst,
            at: Instant::now(),
        }
    }

    async fn take(&mut self) {
        let now = Instant::now();
        self.tokens =
            (self.tokens + now.duration_since(self.at).as_secs_f64() * self.qps).min(self.burst);
        self.at = now;
        if self.tokens < 1.0 {
            let wait = Duration::from_secs_f64((1.0 - self.tokens) / self.qps);
            tokio::time::sleep(wait).await;
            self.tokens = 1.0;
            self.at = Instant::now();
        }
        self.tokens -= 1.0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_make_one_event_list() {
        let list = event_list(vec![b"{\"a\":1}\n".to_vec(), b"{\"b\":2}\n".to_vec()]);
        let value: serde_json::Value = serde_json::from_slice(&list).unwrap();
        assert_eq!(value["kind"], "EventList");
        assert_eq!(value["apiVersion"], "audit.k8s.io/v1");
        assert_eq!(value["items"], serde_json::json!([{"a": 1}, {"b": 2}]));
    }
}
