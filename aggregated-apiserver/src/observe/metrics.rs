//! Prometheus metrics in the names kube-apiserver uses (`apiserver_request_total`,
//! `apiserver_request_duration_seconds`, `apiserver_longrunning_requests`,
//! `apiserver_storage_objects`), so existing dashboards read them.

use std::sync::{Arc, OnceLock};

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
/// Where a store stands.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Objects held, in all namespaces (`apiserver_storage_objects`).
    pub objects: usize,
    /// The resourceVersion of the store's last write (what a watch from "now" starts after).
    pub resource_version: u64,
    /// Events kept for watches to resume from (0 for a store that keeps none).
    pub history_events: usize,
    /// What those events hold, estimated in bytes (the objects' JSON three times: the object,
    /// its encoding and its watch line).
    pub history_bytes: usize,
    /// Watchers ended for falling too far behind, since the store was made
    /// (`apiserver_terminated_watchers_total`).
    pub terminated_watchers: u64,
}

/// The labels of `apiserver_request_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// The request's verb (`get`, `list`, `watch`, ...); unknown ones are `other`.
    pub verb: &'static str,
    /// The resource's plural; "" for a request that is not a resource request.
    pub resource: &'static str,
    /// The HTTP status code answered.
    pub code: u16,
}

/// The labels of `apiserver_request_duration_seconds`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DurationLabels {
    /// As in [`RequestLabels::verb`].
    pub verb: &'static str,
    /// As in [`RequestLabels::resource`].
    pub resource: &'static str,
}

/// Request verbs (as [`crate::request_info::RequestInfo::verb`] names them); anything else is
/// `other` (label cardinality stays bounded).
const VERBS: [&str; 13] = [
    "get",
    "list",
    "watch",
    "create",
    "update",
    "patch",
    "delete",
    "deletecollection",
    "post",
    "put",
    "head",
    "options",
    "other",
];
/// Each of [`VERBS`] as kube-apiserver's metrics label it (its `CleanVerb`: the installer's
/// upper-case action, `other` for what it does not serve), so dashboards written for
/// kube-apiserver read ours.
const VERB_LABELS: [&str; 13] = [
    "GET",
    "LIST",
    "WATCH",
    "POST",
    "PUT",
    "PATCH",
    "DELETE",
    "DELETECOLLECTION",
    "POST",
    "PUT",
    "other",
    "other",
    "other",
];
/// The codes this server answers with most; any other (413, 504...) is counted through the
/// family's map.
const CODES: [u16; 15] = [
    200, 201, 304, 400, 401, 403, 404, 405, 406, 409, 410, 415, 422, 500, 503,
];

fn index_of(values: &[&str], value: &str) -> usize {
    values
        .iter()
        .position(|v| *v == value)
        .unwrap_or(values.len() - 1)
}

/// The labels of `apiserver_storage_objects`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResourceLabels {
    /// The group-qualified resource, e.g. `zebras.zoo.example.com`.
    pub resource: String,
}

/// The labels of `apiserver_terminated_watchers_total`, as kube-apiserver's cacher labels it.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GroupResourceLabels {
    /// The API group, e.g. `zoo.example.com`.
    pub group: String,
    /// The resource, e.g. `zebras`.
    pub resource: String,
}

type HistogramFamily = Family<DurationLabels, Histogram, fn() -> Histogram>;

/// The labels of `apiserver_admission_webhook_admission_duration_seconds`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WebhookLabels {
    /// The webhook's name.
    pub name: String,
    /// `CREATE`, `UPDATE` or `DELETE`.
    pub operation: &'static str,
    /// Whether it refused the write (a denial or, under `failurePolicy: Fail`, a failure).
    pub rejected: &'static str,
    /// `admit` (mutating) or `validating`.
    pub r#type: &'static str,
}

/// The labels of `apiserver_admission_webhook_rejection_count`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RejectionLabels {
    /// The webhook's name.
    pub name: String,
    /// `CREATE`, `UPDATE` or `DELETE`.
    pub operation: &'static str,
    /// `admit` (mutating) or `validating`.
    pub r#type: &'static str,
    /// `calling_webhook_error` (it could not be called) or `no_error` (it denied).
    pub error_type: &'static str,
    /// The code the client got.
    pub rejection_code: u16,
}

/// The labels of `apiserver_validating_admission_policy_check_*`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PolicyCheckLabels {
    /// The policy's name.
    pub policy: String,
    /// The binding's name.
    pub policy_binding: String,
    /// `no_error`, `compile_error` or `invalid_error`.
    pub error_type: &'static str,
    /// `allow`, `deny`, `warn` or `audit`.
    pub enforcement_action: &'static str,
}

/// How many policy check series keep their handles (a few per binding: its outcomes).
const POLICY_SERIES_CACHED: usize = 256;

/// One `apiserver_validating_admission_policy_check_*` series' handles.
struct PolicySeries {
    labels: PolicyCheckLabels,
    checks: Counter,
    durations: Histogram,
}

/// The labels of `apiserver_mutating_admission_policy_check_*`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MutationCheckLabels {
    /// The policy's name.
    pub policy: String,
    /// The binding's name.
    pub policy_binding: String,
    /// `no_error`, `compile_error` or `invalid_error`.
    pub error_type: &'static str,
}

fn policy_histogram() -> Histogram {
    // kube-apiserver's buckets for these metrics.
    Histogram::new([0.0000005, 0.001, 0.01, 0.1, 1.0])
}

/// The error type policy metrics name for an expression's failure (None: no failure).
pub fn policy_error_type(failure: Option<&str>) -> &'static str {
    match failure {
        None => "no_error",
        Some(message) if message.contains("compilation failed") => "compile_error",
        Some(_) => "invalid_error",
    }
}

fn webhook_histogram() -> Histogram {
    // kube-apiserver's buckets for this metric.
    Histogram::new([0.005, 0.025, 0.1, 0.5, 1.0, 2.5, 10.0, 25.0])
}

/// The server's metrics and the registry `/metrics` renders. Shared by the edge (requests) and
/// the handlers (watches).
pub struct Metrics {
    registry: Registry,
    /// Resource label values: "" (not a resource request), the served kinds' plurals, and
    /// `other`.
    resources: Vec<&'static str>,
    /// `apiserver_request_total`: requests answered, by verb, resource and code. Count them
    /// with [`Metrics::observe`].
    pub requests: Family<RequestLabels, Counter>,
    /// `apiserver_request_duration_seconds`, by verb and resource; a watch until its stream
    /// starts. Observe with [`Metrics::observe`].
    pub durations: HistogramFamily,
    // Each series' handle, resolved on first use: the families' maps hash the labels on every
    // lookup, which was a few percent of a GET's CPU.
    request_slots: Vec<OnceLock<Counter>>,
    duration_slots: Vec<OnceLock<Histogram>>,
    /// The policy checks' series handles met so far, found by borrowed labels (at most
    /// [`POLICY_SERIES_CACHED`]; further ones are looked up in their families each time).
    policy_series: std::sync::Mutex<Vec<PolicySeries>>,
    /// `apiserver_longrunning_requests`: watch streams open now.
    pub open_watches: Gauge,
    /// `apiserver_storage_objects`: objects stored per resource, refreshed on every scrape.
    pub stored_objects: Family<ResourceLabels, Gauge>,
    /// Requests whose handler panicked (answered 500, see [`crate::observe::recovery`]).
    pub panics: Counter,
    /// `<prefix>_watch_history_events`: events kept for watches to resume from, per
    /// resource, refreshed on every scrape.
    pub history_events: Family<ResourceLabels, Gauge>,
    /// `<prefix>_watch_history_bytes`: what they hold, estimated.
    pub history_bytes: Family<ResourceLabels, Gauge>,
    /// `apiserver_terminated_watchers_total`: watchers ended for falling too far behind,
    /// refreshed from the stores on every scrape (under the lock: two scrapes add once).
    pub terminated_watchers: Family<GroupResourceLabels, Counter>,
    terminated_lock: std::sync::Mutex<()>,
    /// `apiserver_admission_webhook_admission_duration_seconds`: each webhook call.
    pub webhook_durations: Family<WebhookLabels, Histogram, fn() -> Histogram>,
    /// `apiserver_admission_webhook_rejection_count`: writes a webhook refused. Typed as a
    /// gauge that only goes up: the encoder names every counter `<name>_total`, and
    /// kube-apiserver's counter has no such suffix.
    pub webhook_rejections: Family<RejectionLabels, Gauge>,
    /// `apiserver_validating_admission_policy_check_total`: each policy binding's decision.
    pub policy_checks: Family<PolicyCheckLabels, Counter>,
    /// `apiserver_validating_admission_policy_check_duration_seconds`.
    pub policy_durations: Family<PolicyCheckLabels, Histogram, fn() -> Histogram>,
    /// `apiserver_mutating_admission_policy_check_total`: each policy binding's mutations.
    pub mutation_checks: Family<MutationCheckLabels, Counter>,
    /// `apiserver_mutating_admission_policy_check_duration_seconds`.
    pub mutation_durations: Family<MutationCheckLabels, Histogram, fn() -> Histogram>,
    /// `apiserver_current_inflight_requests`: requests counted against the in-flight limits.
    pub inflight: Family<InflightLabels, Gauge>,
    /// `apiserver_audit_event_total`: audit events generated (written or not).
    pub audit_events: Counter,
    /// `apiserver_audit_error_total`: audit events a backend could not take, by backend.
    pub audit_errors: Family<PluginLabels, Counter>,
}

/// The labels of `apiserver_current_inflight_requests`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct InflightLabels {
    /// `readOnly` or `mutating`.
    pub request_kind: &'static str,
}

/// The labels of `apiserver_audit_error_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PluginLabels {
    /// The audit backend (`log`).
    pub plugin: &'static str,
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

impl Metrics {
    /// Metrics for a server of the resources `plurals`.
    pub fn new(plurals: &[&'static str]) -> Arc<Self> {
        Self::named("aggregated_apiserver", plurals)
    }

    /// [`Self::new`], the server's own series (those kube-apiserver has no name for) named
    /// `<prefix>_…` (`sample_apiserver_watch_history_events`).
    pub fn named(prefix: &str, plurals: &[&'static str]) -> Arc<Self> {
        Arc::new(Self::with_resources(prefix, plurals))
    }

    fn with_resources(prefix: &str, plurals: &[&'static str]) -> Self {
        let resources: Vec<&'static str> = std::iter::once("")
            .chain(plurals.iter().copied())
            .chain(std::iter::once("other"))
            .collect();
        let mut registry = Registry::default();
        let requests = Family::<RequestLabels, Counter>::default();
        let durations: HistogramFamily = Family::new_with_constructor(latency_histogram);
        let open_watches = Gauge::default();
        let stored_objects = Family::<ResourceLabels, Gauge>::default();
        let panics = Counter::default();
        let history_events = Family::<ResourceLabels, Gauge>::default();
        let history_bytes = Family::<ResourceLabels, Gauge>::default();
        let terminated_watchers = Family::<GroupResourceLabels, Counter>::default();
        let webhook_durations: Family<WebhookLabels, Histogram, fn() -> Histogram> =
            Family::new_with_constructor(webhook_histogram);
        let webhook_rejections = Family::<RejectionLabels, Gauge>::default();
        let policy_checks = Family::<PolicyCheckLabels, Counter>::default();
        let policy_durations: Family<PolicyCheckLabels, Histogram, fn() -> Histogram> =
            Family::new_with_constructor(policy_histogram);
        let mutation_checks = Family::<MutationCheckLabels, Counter>::default();
        let mutation_durations: Family<MutationCheckLabels, Histogram, fn() -> Histogram> =
            Family::new_with_constructor(policy_histogram);
        let inflight = Family::<InflightLabels, Gauge>::default();
        registry.register(
            "apiserver_current_inflight_requests",
            "Maximal number of currently used inflight request limit of this apiserver per request kind in last second.",
            inflight.clone(),
        );
        let audit_events = Counter::default();
        let audit_errors = Family::<PluginLabels, Counter>::default();
        registry.register(
            "apiserver_audit_event",
            "Counter of audit events generated and sent to the audit backend",
            audit_events.clone(),
        );
        registry.register(
            "apiserver_audit_error",
            "Counter of audit events that failed to be audited properly, by backend",
            audit_errors.clone(),
        );
        registry.register(
            "apiserver_validating_admission_policy_check",
            "Validation admission policy check total, labeled by policy and further identified by binding and enforcement action taken",
            policy_checks.clone(),
        );
        registry.register(
            "apiserver_validating_admission_policy_check_duration_seconds",
            "Validation admission latency for individual validation expressions in seconds, labeled by policy and further including binding and enforcement action taken",
            policy_durations.clone(),
        );
        registry.register(
            "apiserver_mutating_admission_policy_check",
            "Mutation admission policy check total, labeled by policy and further identified by binding",
            mutation_checks.clone(),
        );
        registry.register(
            "apiserver_mutating_admission_policy_check_duration_seconds",
            "Mutation admission latency for individual mutation expressions in seconds, labeled by policy and binding",
            mutation_durations.clone(),
        );
        registry.register(
            "apiserver_admission_webhook_admission_duration_seconds",
            "Admission webhook latency, by webhook, operation, whether it refused, and type (admit or validating)",
            webhook_durations.clone(),
        );
        registry.register(
            "apiserver_admission_webhook_rejection_count",
            "Writes refused by an admission webhook, by webhook, operation, type, error type and code",
            webhook_rejections.clone(),
        );
        registry.register(
            format!("{prefix}_watch_history_events"),
            "Events kept for watches to resume from, by resource",
            history_events.clone(),
        );
        registry.register(
            format!("{prefix}_watch_history_bytes"),
            "What the events kept for watches hold, estimated in bytes, by resource",
            history_bytes.clone(),
        );
        registry.register(
            "apiserver_terminated_watchers",
            "Counter of watchers closed due to unresponsiveness broken by resource type",
            terminated_watchers.clone(),
        );
        registry.register(
            format!("{prefix}_request_panics"),
            "Requests whose handler panicked; each was answered 500 and logged",
            panics.clone(),
        );
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
            request_slots: (0..VERBS.len() * resources.len() * CODES.len())
                .map(|_| OnceLock::new())
                .collect(),
            duration_slots: (0..VERBS.len() * resources.len())
                .map(|_| OnceLock::new())
                .collect(),
            policy_series: std::sync::Mutex::default(),
            resources,
            requests,
            durations,
            open_watches,
            stored_objects,
            panics,
            history_events,
            history_bytes,
            terminated_watchers,
            terminated_lock: std::sync::Mutex::new(()),
            webhook_durations,
            webhook_rejections,
            policy_checks,
            policy_durations,
            mutation_checks,
            mutation_durations,
            inflight,
            audit_events,
            audit_errors,
        }
    }

    /// Counts one answered request and its latency. Verbs and resources outside the known
    /// ones are labelled `other`, so a client cannot grow the series without bound.
    pub fn observe(&self, verb: &str, resource: &str, code: u16, seconds: f64) {
        let (v, r) = (index_of(&VERBS, verb), index_of(&self.resources, resource));
        let (verb, resource) = (VERB_LABELS[v], self.resources[r]);
        let series = v * self.resources.len() + r;
        let labels = || RequestLabels {
            verb,
            resource,
            code,
        };
        match CODES.iter().position(|c| *c == code) {
            Some(c) => self.request_slots[series * CODES.len() + c]
                .get_or_init(|| self.requests.get_or_create(&labels()).clone())
                .inc(),
            None => self.requests.get_or_create(&labels()).inc(),
        };
        self.duration_slots[series]
            .get_or_init(|| {
                self.durations
                    .get_or_create(&DurationLabels { verb, resource })
                    .clone()
            })
            .observe(seconds);
    }

    /// Counts one ValidatingAdmissionPolicy binding's decision and its duration.
    pub fn observe_policy_check(
        &self,
        policy: &str,
        policy_binding: &str,
        error_type: &'static str,
        enforcement_action: &'static str,
        seconds: f64,
    ) {
        let same = |s: &&PolicySeries| {
            s.labels.error_type == error_type
                && s.labels.enforcement_action == enforcement_action
                && s.labels.policy == policy
                && s.labels.policy_binding == policy_binding
        };
        if let Ok(series) = self.policy_series.lock()
            && let Some(found) = series.iter().find(same)
        {
            found.checks.inc();
            found.durations.observe(seconds);
            return;
        }
        let labels = PolicyCheckLabels {
            policy: policy.to_owned(),
            policy_binding: policy_binding.to_owned(),
            error_type,
            enforcement_action,
        };
        let checks = self.policy_checks.get_or_create(&labels).clone();
        let durations = self.policy_durations.get_or_create(&labels).clone();
        checks.inc();
        durations.observe(seconds);
        if let Ok(mut series) = self.policy_series.lock()
            && series.len() < POLICY_SERIES_CACHED
        {
            series.push(PolicySeries {
                labels,
                checks,
                durations,
            });
        }
    }

    /// Sets `apiserver_storage_objects` and the watch history's size for `resource`
    /// (group-qualified).
    pub fn set_stored(&self, resource: &str, stats: &StoreStats) {
        let labels = ResourceLabels {
            resource: resource.to_owned(),
        };
        let gauge = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        self.stored_objects
            .get_or_create(&labels)
            .set(gauge(stats.objects));
        self.history_events
            .get_or_create(&labels)
            .set(gauge(stats.history_events));
        self.history_bytes
            .get_or_create(&labels)
            .set(gauge(stats.history_bytes));
        if let Some((plural, group)) = resource.split_once('.') {
            let labels = GroupResourceLabels {
                group: group.to_owned(),
                resource: plural.to_owned(),
            };
            let _held = self.terminated_lock.lock();
            let counter = self.terminated_watchers.get_or_create(&labels);
            counter.inc_by(stats.terminated_watchers.saturating_sub(counter.get()));
        }
    }

    /// Every metric in the Prometheus text format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verbs_are_labelled_as_kube_apiserver_labels_them() {
        let metrics = Metrics::new(&["zebras"]);
        metrics.observe("create", "zebras", 201, 0.001);
        metrics.observe("list", "zebras", 200, 0.001);
        metrics.observe("watch", "zebras", 200, 0.001);
        metrics.observe("deletecollection", "zebras", 200, 0.001);
        metrics.observe("get", "barns", 404, 0.001);
        let text = metrics.render();
        for series in [
            r#"apiserver_request_total{verb="POST",resource="zebras",code="201"} 1"#,
            r#"apiserver_request_total{verb="LIST",resource="zebras",code="200"} 1"#,
            r#"apiserver_request_total{verb="WATCH",resource="zebras",code="200"} 1"#,
            r#"apiserver_request_total{verb="DELETECOLLECTION",resource="zebras",code="200"} 1"#,
            r#"apiserver_request_total{verb="GET",resource="other",code="404"} 1"#,
        ] {
            assert!(text.contains(series), "{series} in {text}");
        }
    }
}
