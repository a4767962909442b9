//! Prometheus metrics in the names kube-apiserver uses (`apiserver_request_total`,
//! `apiserver_request_duration_seconds`, `apiserver_longrunning_requests`,
//! `apiserver_storage_objects`), so existing dashboards read them.

use std::sync::Arc;

use prometheus_client::{
    encoding::{EncodeLabelSet, text::encode},
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets},
    },
    registry::Registry,
};

// Static label values: a request's labels cost no allocation on the hot path.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub verb: &'static str,
    pub resource: &'static str,
    pub code: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DurationLabels {
    pub verb: &'static str,
    pub resource: &'static str,
}

/// Verbs as label values; anything else is `other` (label cardinality stays bounded).
fn verb_label(verb: &str) -> &'static str {
    match verb {
        "get" => "get",
        "list" => "list",
        "watch" => "watch",
        "create" => "create",
        "update" => "update",
        "patch" => "patch",
        "delete" => "delete",
        "deletecollection" => "deletecollection",
        "post" => "post",
        "put" => "put",
        "head" => "head",
        "options" => "options",
        _ => "other",
    }
}

fn resource_label(resource: &str) -> &'static str {
    match resource {
        "" => "",
        "llamas" => "llamas",
        "farmpods" => "farmpods",
        _ => "other",
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResourceLabels {
    pub resource: String,
}

type HistogramFamily = Family<DurationLabels, Histogram, fn() -> Histogram>;

pub struct Metrics {
    registry: Registry,
    pub requests: Family<RequestLabels, Counter>,
    pub durations: HistogramFamily,
    pub open_watches: Gauge,
    pub stored_objects: Family<ResourceLabels, Gauge>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

fn latency_histogram() -> Histogram {
    // 50 µs .. ~100 s
    Histogram::new(exponential_buckets(0.00005, 2.0, 22))
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let requests = Family::<RequestLabels, Counter>::default();
        let durations: HistogramFamily = Family::new_with_constructor(latency_histogram);
        let open_watches = Gauge::default();
        let stored_objects = Family::<ResourceLabels, Gauge>::default();
        registry.register(
            "apiserver_request",
            "Requests by verb, resource and HTTP code",
            requests.clone(),
        );
        registry.register(
            "apiserver_request_duration_seconds",
            "Request latency by verb and resource (watches: until the stream starts)",
            durations.clone(),
        );
        registry.register(
            "apiserver_longrunning_requests",
            "Open watch streams",
            open_watches.clone(),
        );
        registry.register(
            "apiserver_storage_objects",
            "Objects stored, by resource",
            stored_objects.clone(),
        );
        Self {
            registry,
            requests,
            durations,
            open_watches,
            stored_objects,
        }
    }
}

impl Metrics {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    pub fn observe(&self, verb: &str, resource: &str, code: u16, seconds: f64) {
        let (verb, resource) = (verb_label(verb), resource_label(resource));
        self.requests
            .get_or_create(&RequestLabels {
                verb,
                resource,
                code,
            })
            .inc();
        self.durations
            .get_or_create(&DurationLabels { verb, resource })
            .observe(seconds);
    }

    pub fn set_stored(&self, resource: &str, objects: usize) {
        self.stored_objects
            .get_or_create(&ResourceLabels {
                resource: resource.to_owned(),
            })
            .set(i64::try_from(objects).unwrap_or(i64::MAX));
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}
