//! Traces (#31): the shipped binary with `--tracing-config-file`, a local OTLP/gRPC collector,
//! and requests carrying kube-apiserver's W3C `traceparent`: the server's spans join that
//! trace (its `KubernetesAPI` span under the caller's, authentication, authorization and
//! admission under it); a request without a sampled parent is not traced at rate 0.

use crate::common;

use std::time::Duration;

use common::{
    Alpn,
    otlp::{Collector, attribute, hex},
    process::Running,
};
use opentelemetry_proto::tonic::trace::v1::Span;

/// The shipped binary tracing to a local collector at `rate` per million (its flags `args`
/// besides), with an admin client; the temporary directory holds its configuration.
async fn traced(
    rate: u32,
    args: Vec<String>,
) -> (Collector, Running, common::RawClient, tempfile::TempDir) {
    let (collector, port) = Collector::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("tracing.yaml");
    std::fs::write(
        &config,
        format!(
            "apiVersion: apiserver.config.k8s.io/v1\nkind: TracingConfiguration\nendpoint: 127.0.0.1:{port}\nsamplingRatePerMillion: {rate}\n"
        ),
    )
    .unwrap();
    let certs = dir.path().join("certs");
    let mut all = vec![
        "--cert-dir".to_owned(),
        certs.display().to_string(),
        "--tracing-config-file".to_owned(),
        config.display().to_string(),
    ];
    all.extend(args);
    let server = Running::start_with_env(
        all,
        // Batches go out at once rather than every 5 s.
        &[("OTEL_BSP_SCHEDULE_DELAY", std::ffi::OsStr::new("100"))],
    );
    let client = server.admin(&certs, Alpn::Http1);
    (collector, server, client, dir)
}

#[tokio::test]
async fn spans_join_the_callers_trace() {
    // Llamas on etcd, when there is one: its calls are spans too.
    let etcd = common::etcd::Etcd::start().await;
    let args = etcd.as_ref().map_or_else(Vec::new, |etcd| {
        vec![
            "--storage=etcd".to_owned(),
            format!("--etcd-servers={}", etcd.endpoint()),
        ]
    });
    let (collector, server, client, _dir) = traced(0, args).await;

    // kube-apiserver's span, sampled.
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let parent_id = "00f067aa0ba902b7";
    let traceparent = format!("00-{trace_id}-{parent_id}-01");
    let llamas = "/apis/farm.example.com/v1alpha/namespaces/default/llamas";
    if etcd.is_some() {
        // An etcd-backed server starts empty.
        let seeded = client
            .send(
                "POST",
                llamas,
                &[("content-type", "application/json")],
                Some(
                    serde_json::json!({"apiVersion": "farm.example.com/v1alpha", "kind": "Llama",
                        "metadata": {"name": "dolly"}, "spec": {"weight": 1.0, "height": 1.0}})
                    .to_string()
                    .into_bytes(),
                ),
            )
            .await;
        assert_eq!(seeded.status, 201);
    }
    let got = client
        .get(&format!("{llamas}/dolly"), &[("traceparent", &traceparent)])
        .await;
    assert_eq!(got.status, 200);
    let created = client
        .send(
            "POST",
            llamas,
            &[
                ("traceparent", &traceparent),
                ("content-type", "application/json"),
            ],
            Some(
                serde_json::json!({"apiVersion": "farm.example.com/v1alpha", "kind": "Llama",
                    "metadata": {"name": "traced"}, "spec": {"weight": 1.0, "height": 1.0}})
                .to_string()
                .into_bytes(),
            ),
        )
        .await;
    assert_eq!(created.status, 201);
    // No parent, rate 0: not traced.
    assert_eq!(client.get("/version", &[]).await.status, 200);

    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    let spans = loop {
        let spans = collector.spans();
        let servers = spans
            .iter()
            .filter(|(_, s)| s.name == "KubernetesAPI")
            .count();
        let admissions = spans.iter().filter(|(_, s)| s.name == "admission").count();
        if servers >= 2 && admissions >= 2 {
            break spans;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "spans received: {:?}",
            spans.iter().map(|(_, s)| &s.name).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    for (service, span) in &spans {
        assert_eq!(service, "farm-apiserver");
        assert_eq!(hex(&span.trace_id), trace_id, "{}: one trace", span.name);
    }
    let servers: Vec<&Span> = spans
        .iter()
        .map(|(_, s)| s)
        .filter(|s| s.name == "KubernetesAPI")
        .collect();
    assert_eq!(servers.len(), 2, "the two traced requests; /version is not");
    for server_span in &servers {
        assert_eq!(
            hex(&server_span.parent_span_id),
            parent_id,
            "under the caller's span"
        );
        // SPAN_KIND_SERVER
        assert_eq!(server_span.kind, 2);
        assert!(server_span.end_time_unix_nano >= server_span.start_time_unix_nano);
    }
    let get = servers
        .iter()
        .find(|s| attribute(s, "http.request.method").as_deref() == Some("GET"))
        .unwrap();
    assert_eq!(
        attribute(get, "url.path").as_deref(),
        Some(&*format!("{llamas}/dolly"))
    );
    assert_eq!(
        attribute(get, "http.response.status_code").as_deref(),
        Some("200")
    );
    let post = servers
        .iter()
        .find(|s| attribute(s, "http.request.method").as_deref() == Some("POST"))
        .unwrap();
    assert_eq!(
        attribute(post, "http.response.status_code").as_deref(),
        Some("201")
    );
    // Under each request's span: authentication and authorization; under the write's, its
    // admission (mutating and validating).
    for (request, expected) in [
        (get, &["authentication", "authorization"][..]),
        (
            post,
            &["admission", "admission", "authentication", "authorization"][..],
        ),
    ] {
        let mut children: Vec<&str> = spans
            .iter()
            .map(|(_, s)| s)
            .filter(|s| s.parent_span_id == request.span_id && s.name != "etcd")
            .map(|s| s.name.as_str())
            .collect();
        children.sort_unstable();
        assert_eq!(children, expected);
    }
    // The create's etcd calls (its transaction) under its span, with their method.
    if etcd.is_some() {
        let calls: Vec<String> = spans
            .iter()
            .map(|(_, s)| s)
            .filter(|s| s.parent_span_id == post.span_id && s.name == "etcd")
            .filter_map(|s| attribute(s, "rpc.method"))
            .collect();
        assert!(
            calls.iter().any(|m| m == "/etcdserverpb.KV/Txn"),
            "{calls:?}"
        );
    }
    drop(server);
}

/// `samplingRatePerMillion: 1000000`: a request with no parent starts a trace of its own; one
/// whose parent is not sampled stays untraced (kube-apiserver's parent-based sampler).
#[tokio::test]
async fn the_sampling_rate_starts_traces_and_an_unsampled_parent_is_followed() {
    let (collector, _server, client, _dir) = traced(1_000_000, Vec::new()).await;
    let dolly = "/apis/farm.example.com/v1alpha/namespaces/default/llamas/dolly";
    let unsampled = "4bf92f3577b34da6a3ce929d0e0e4799";
    let traceparent = format!("00-{unsampled}-00f067aa0ba902b7-00");
    assert_eq!(
        client
            .get(dolly, &[("traceparent", &traceparent)])
            .await
            .status,
        200
    );
    assert_eq!(client.get(dolly, &[]).await.status, 200);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while !collector
        .spans()
        .iter()
        .any(|(_, s)| s.name == "KubernetesAPI")
    {
        assert!(tokio::time::Instant::now() < deadline, "no span received");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Give a span of the unsampled request time to arrive, were it sent.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let servers: Vec<Span> = collector
        .spans()
        .into_iter()
        .map(|(_, s)| s)
        .filter(|s| s.name == "KubernetesAPI")
        .collect();
    assert_eq!(servers.len(), 1, "only the request without a parent");
    assert!(servers[0].parent_span_id.is_empty(), "a trace of its own");
    assert_ne!(hex(&servers[0].trace_id), unsampled);
}
