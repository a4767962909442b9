//! Traces, as k8s.io/component-base's tracing gives kube-apiserver and the servers built on
//! k8s.io/apiserver: with `--tracing-config-file` (an `apiserver.config.k8s.io`
//! TracingConfiguration: `endpoint`, `samplingRatePerMillion`) each request is a span named
//! `KubernetesAPI` that continues the caller's W3C `traceparent` (kube-apiserver's aggregator
//! sends its own), with spans for authentication, authorization, admission and etcd calls under
//! it, exported over OTLP/gRPC. The sampler is kube's: a sampled parent is followed, else the
//! configured rate. Without the file nothing here runs: [`enabled`] is one atomic load.

use std::{future::Future, sync::OnceLock, time::SystemTime};

use axum::http::{HeaderMap, Method};
use futures::future::Either;
use opentelemetry::{
    Context, KeyValue,
    context::FutureExt as _,
    propagation::{Extractor, TextMapPropagator},
    trace::{Span as _, SpanKind, TraceContextExt as _, Tracer as _, WithContext},
};
use opentelemetry_sdk::{
    propagation::TraceContextPropagator,
    trace::{Sampler, SdkTracer, SdkTracerProvider},
};
use serde::Deserialize;

static TRACER: OnceLock<SdkTracer> = OnceLock::new();

/// `apiserver.config.k8s.io` TracingConfiguration.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TracingConfiguration {
    api_version: Option<String>,
    kind: Option<String>,
    /// The OTLP/gRPC collector, `host:port` (default `localhost:4317`).
    pub endpoint: Option<String>,
    /// Of a million requests without a sampled parent, how many are traced (default 0).
    pub sampling_rate_per_million: Option<i64>,
}

impl TracingConfiguration {
    /// Reads a configuration file's text (YAML or JSON); the error says what is wrong.
    pub fn parse(text: &str) -> Result<Self, String> {
        let config: Self =
            serde_saphyr::from_str(text).map_err(|e| format!("failed decoding: {e}"))?;
        match (config.api_version.as_deref(), config.kind.as_deref()) {
            (
                Some("apiserver.config.k8s.io/v1")
                | Some("apiserver.config.k8s.io/v1beta1")
                | Some("apiserver.config.k8s.io/v1alpha1"),
                Some("TracingConfiguration"),
            ) => {}
            (version, kind) => {
                return Err(format!(
                    "unknown group version field {}, Kind={} (want apiserver.config.k8s.io/v1, Kind=TracingConfiguration)",
                    version.unwrap_or_default(),
                    kind.unwrap_or_default()
                ));
            }
        }
        if let Some(rate) = config.sampling_rate_per_million
            && !(0..=1_000_000).contains(&rate)
        {
            return Err(format!(
                "samplingRatePerMillion: Invalid value: {rate}: sampling rate must be between 0 and 1,000,000"
            ));
        }
        Ok(config)
    }

    /// The collector's URL for the gRPC client.
    fn url(&self) -> String {
        let endpoint = self.endpoint.as_deref().unwrap_or("localhost:4317");
        if endpoint.contains("://") {
            endpoint.to_owned()
        } else {
            format!("http://{endpoint}")
        }
    }
}

/// Starts exporting (from within the server's runtime) as the service `service`: spans are
/// batched and sent by the SDK's own thread. Shut the provider down at exit to send the last
/// ones.
pub fn start(
    config: &TracingConfiguration,
    service: &'static str,
) -> Result<SdkTracerProvider, String> {
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_otlp::WithExportConfig as _;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(config.url())
        .build()
        .map_err(|e| format!("tracing exporter: {e}"))?;
    let rate = config.sampling_rate_per_million.unwrap_or(0) as f64 / 1_000_000.0;
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
            rate,
        ))))
        .with_resource(
            opentelemetry_sdk::Resource::builder()
                .with_service_name(service)
                .build(),
        )
        .build();
    TRACER
        .set(provider.tracer(service))
        .map_err(|_| "tracing is already started".to_owned())?;
    Ok(provider)
}

/// Whether requests are traced.
pub fn enabled() -> bool {
    TRACER.get().is_some()
}

struct Headers<'a>(&'a HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

/// The request's span (`KubernetesAPI`, as k8s.io/apiserver names it), child of the caller's
/// `traceparent` when it sends one; None when tracing is off.
pub fn server_span(headers: &HeaderMap, method: &Method, path: &str) -> Option<Context> {
    let tracer = TRACER.get()?;
    let parent = TraceContextPropagator::new().extract(&Headers(headers));
    let mut attributes = vec![
        KeyValue::new("http.request.method", method.as_str().to_owned()),
        KeyValue::new("url.path", path.to_owned()),
    ];
    if let Some(agent) = headers
        .get(axum::http::header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
    {
        attributes.push(KeyValue::new("user_agent.original", agent.to_owned()));
    }
    let span = tracer
        .span_builder("KubernetesAPI")
        .with_kind(SpanKind::Server)
        .with_attributes(attributes)
        .start_with_context(tracer, &parent);
    Some(parent.with_span(span))
}

/// Ends the request's span with the answer's code.
pub fn end_server_span(cx: &Context, code: u16) {
    let span = cx.span();
    span.set_attribute(KeyValue::new("http.response.status_code", i64::from(code)));
    span.end();
}

/// Runs `work` in a span `name` under the current one (nothing when tracing is off).
pub fn in_span<T>(name: &'static str, work: impl FnOnce() -> T) -> T {
    let Some(tracer) = TRACER.get() else {
        return work();
    };
    let parent = Context::current();
    if !parent.has_active_span() {
        return work();
    }
    let start = SystemTime::now();
    let result = work();
    let mut span = tracer
        .span_builder(name)
        .with_start_time(start)
        .start_with_context(tracer, &parent);
    span.end_with_timestamp(SystemTime::now());
    result
}

/// `work` as a span `name` (with an attribute, if given) under the current one, which its own
/// spans are under; the span ends when `work` is done with (dropped). As it is, and no larger,
/// when tracing is off.
pub fn in_span_async<F: Future>(
    name: &'static str,
    attribute: Option<(&'static str, &str)>,
    work: F,
) -> Either<WithContext<F>, F> {
    let Some(tracer) = TRACER.get() else {
        return Either::Right(work);
    };
    let parent = Context::current();
    if !parent.has_active_span() {
        return Either::Right(work);
    }
    let span = tracer
        .span_builder(name)
        .with_attributes(
            attribute
                .map(|(key, value)| KeyValue::new(key, value.to_owned()))
                .into_iter()
                .collect::<Vec<_>>(),
        )
        .start_with_context(tracer, &parent);
    Either::Left(work.with_context(parent.with_span(span)))
}

/// `work` with `cx` (the request's span) as the current context, if there is one.
pub fn scope<F: Future>(cx: Option<Context>, work: F) -> Either<WithContext<F>, F> {
    match cx {
        Some(cx) => Either::Left(work.with_context(cx)),
        None => Either::Right(work),
    }
}
