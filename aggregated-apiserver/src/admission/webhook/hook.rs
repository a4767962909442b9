//! One webhook as dispatch needs it, made from either kind of configuration.

use std::time::Duration;

use k8s_openapi::{
    api::admissionregistration::v1::{MatchCondition, RuleWithOperations, WebhookClientConfig},
    apimachinery::pkg::apis::meta::v1::LabelSelector as ApiLabelSelector,
};

use super::rules;

/// One webhook as dispatch needs it, whichever kind of configuration it came from.
pub(super) struct Hook {
    pub(super) name: String,
    pub(super) client: WebhookClientConfig,
    pub(super) rules: Vec<RuleWithOperations>,
    /// `matchPolicy: Equivalent` (the default): its rules also take writes made through
    /// another version of a kind they name.
    pub(super) equivalent: bool,
    /// `failurePolicy: Fail` (the default): a failed call refuses the write.
    pub(super) fail: bool,
    pub(super) namespace_selector: Option<ApiLabelSelector>,
    pub(super) object_selector: Option<ApiLabelSelector>,
    pub(super) side_effects: String,
    pub(super) timeout: Duration,
    pub(super) review_versions: Vec<String>,
    pub(super) match_conditions: Vec<MatchCondition>,
    /// `reinvocationPolicy: IfNeeded`.
    pub(super) reinvoke: bool,
    /// The configuration it is listed in (for the audit log's annotations).
    pub(super) configuration: String,
}

impl Hook {
    /// The fields both kinds of webhook have (`reinvoke` false).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        name: &str,
        client: &WebhookClientConfig,
        rules: &Option<Vec<RuleWithOperations>>,
        match_policy: &Option<String>,
        failure_policy: &Option<String>,
        namespace_selector: &Option<ApiLabelSelector>,
        object_selector: &Option<ApiLabelSelector>,
        side_effects: &str,
        timeout_seconds: Option<i32>,
        review_versions: &[String],
        match_conditions: &Option<Vec<MatchCondition>>,
    ) -> Self {
        Hook {
            name: name.to_owned(),
            client: client.clone(),
            rules: rules.clone().unwrap_or_default(),
            equivalent: rules::equivalent(match_policy.as_deref()),
            fail: failure_policy.as_deref() != Some("Ignore"),
            namespace_selector: namespace_selector.clone(),
            object_selector: object_selector.clone(),
            side_effects: side_effects.to_owned(),
            timeout: timeout_of(timeout_seconds),
            review_versions: review_versions.to_vec(),
            match_conditions: match_conditions.clone().unwrap_or_default(),
            reinvoke: false,
            configuration: String::new(),
        }
    }
}

/// A webhook of either kind as a [`Hook`] (k8s-openapi's MutatingWebhook and
/// ValidatingWebhook share these fields, but no trait).
macro_rules! hook {
    ($w:expr) => {{
        let w = $w;
        Hook::new(
            &w.name,
            &w.client_config,
            &w.rules,
            &w.match_policy,
            &w.failure_policy,
            &w.namespace_selector,
            &w.object_selector,
            &w.side_effects,
            w.timeout_seconds,
            &w.admission_review_versions,
            &w.match_conditions,
        )
    }};
}

/// A webhook's timeout: `timeoutSeconds` (default 10, at most 30).
pub(super) fn timeout_of(seconds: Option<i32>) -> Duration {
    Duration::from_secs(seconds.unwrap_or(10).clamp(1, 30) as u64)
}
