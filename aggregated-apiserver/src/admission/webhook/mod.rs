//! The cluster's admission webhooks (k8s.io/apiserver's `plugin/webhook`): their
//! configurations from a watch of each kind, which of them a write calls, and what their
//! answers do to it.

pub(crate) mod call;
#[macro_use]
mod hook;
pub(crate) mod rules;

use std::{sync::Arc, time::Duration};

use k8s_openapi::{
    api::admissionregistration::v1::{
        MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
    },
    apimachinery::pkg::apis::meta::v1::Status,
};
use kube::runtime::reflector;
use serde_json::Value;

use super::{AtVersion, Attributes, Environment, Operation, cel, reinvocation::Passes};
use crate::{
    error::{Error, Result},
    observe::metrics::{RejectionLabels, WebhookLabels},
    store::informer,
};
use hook::Hook;

/// How long a write waits for the configurations to be listed the first time.
pub(crate) const READY_WAIT: Duration = Duration::from_secs(10);

/// Applies a webhook's JSONPatch to the object (the REST layer's bounded JSON patch).
pub type Patcher = dyn Fn(
        &mut Value,
        &crate::json_patch::Patch,
    ) -> std::result::Result<(), crate::json_patch::ApplyError>
    + Sync;

/// The webhooks of the cluster, as its configurations say now.
pub struct Webhooks {
    /// None when the MutatingAdmissionWebhook plugin is off.
    mutating: Option<reflector::Store<MutatingWebhookConfiguration>>,
    /// None when the ValidatingAdmissionWebhook plugin is off.
    validating: Option<reflector::Store<ValidatingWebhookConfiguration>>,
    env: Arc<Environment>,
    clients: call::Clients,
    /// Set once every configuration watch has listed (for `/readyz`).
    synced: Arc<std::sync::atomic::AtomicBool>,
}

/// A watched kind's configurations in name order (kube-apiserver calls webhooks so).
fn by_name<C: kube::Resource + Clone>(store: Option<&reflector::Store<C>>) -> Vec<Arc<C>>
where
    C::DynamicType: Eq + std::hash::Hash + Clone,
{
    let mut configurations = store.map(|s| s.state()).unwrap_or_default();
    configurations.sort_by(|a, b| a.meta().name.cmp(&b.meta().name));
    configurations
}

impl Webhooks {
    /// Watches `client`'s MutatingWebhookConfigurations (when `mutating`) and
    /// ValidatingWebhookConfigurations (when `validating`); namespace labels (for
    /// `namespaceSelector`), metrics and the authorizer from `env`.
    pub fn start(
        client: kube::Client,
        env: Arc<Environment>,
        mutating: bool,
        validating: bool,
    ) -> Arc<Self> {
        let mutating: Option<reflector::Store<MutatingWebhookConfiguration>> =
            mutating.then(|| informer::start(client.clone()));
        let validating: Option<reflector::Store<ValidatingWebhookConfiguration>> =
            validating.then(|| informer::start(client.clone()));
        let synced = Arc::new(std::sync::atomic::AtomicBool::new(false));
        {
            let (mutating, validating, synced) =
                (mutating.clone(), validating.clone(), synced.clone());
            tokio::spawn(async move {
                if let Some(store) = mutating
                    && store.wait_until_ready().await.is_err()
                {
                    return;
                }
                if let Some(store) = validating
                    && store.wait_until_ready().await.is_err()
                {
                    return;
                }
                synced.store(true, std::sync::atomic::Ordering::SeqCst);
            });
        }
        Arc::new(Self {
            mutating,
            validating,
            env,
            clients: call::Clients::new(client),
            synced,
        })
    }

    /// Whether every configuration watch has listed once.
    pub fn synced(&self) -> bool {
        self.synced.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Counts a call of `hook` that took `seconds` and, when it refused the write, the code.
    fn observe(
        &self,
        hook: &Hook,
        attributes: &Attributes<'_>,
        mutating: bool,
        seconds: f64,
        refused: Option<(&'static str, u16)>,
    ) {
        let Some(metrics) = self.env.metrics() else {
            return;
        };
        let r#type = if mutating { "admit" } else { "validating" };
        metrics
            .webhook_durations
            .get_or_create(&WebhookLabels {
                name: hook.name.clone(),
                operation: attributes.operation.as_str(),
                rejected: if refused.is_some() { "true" } else { "false" },
                r#type,
            })
            .observe(seconds);
        if let Some((error_type, rejection_code)) = refused {
            metrics
                .webhook_rejections
                .get_or_create(&RejectionLabels {
                    name: hook.name.clone(),
                    operation: attributes.operation.as_str(),
                    r#type,
                    error_type,
                    rejection_code,
                })
                .inc();
        }
    }

    /// The configurations have been listed (or 403 after [`READY_WAIT`], as the plugin
    /// answers before its informers sync).
    async fn ready(&self, attributes: &Attributes<'_>) -> Result<()> {
        let ready = async {
            if let Some(store) = &self.mutating {
                store.wait_until_ready().await.map_err(|_| ())?;
            }
            if let Some(store) = &self.validating {
                store.wait_until_ready().await.map_err(|_| ())?;
            }
            Ok::<(), ()>(())
        };
        // A watch that ended before its first list never fails open.
        match tokio::time::timeout(READY_WAIT, ready).await {
            Ok(Ok(())) => Ok(()),
            _ => Err(forbidden(attributes, "not yet ready to handle request")),
        }
    }

    fn mutating_hooks(&self) -> Vec<Hook> {
        let configurations = by_name(self.mutating.as_ref());
        configurations
            .iter()
            .flat_map(|c| c.webhooks.iter().flatten().map(move |w| (c, w)))
            .map(|(c, w)| Hook {
                reinvoke: w.reinvocation_policy.as_deref() == Some("IfNeeded"),
                configuration: c.metadata.name.clone().unwrap_or_default(),
                ..hook!(w)
            })
            .collect()
    }

    fn validating_hooks(&self) -> Vec<Hook> {
        let configurations = by_name(self.validating.as_ref());
        configurations
            .iter()
            .flat_map(|c| c.webhooks.iter().flatten())
            .map(|w| hook!(w))
            .collect()
    }

    /// Whether any mutating webhook is configured (a write skips the JSON round trip if not).
    pub async fn any_mutating(&self, attributes: &Attributes<'_>) -> Result<bool> {
        self.ready(attributes).await?;
        Ok(self.mutating.as_ref().is_some_and(|s| !s.is_empty()))
    }

    /// Whether any validating webhook is configured.
    pub async fn any_validating(&self, attributes: &Attributes<'_>) -> Result<bool> {
        self.ready(attributes).await?;
        Ok(self.validating.as_ref().is_some_and(|s| !s.is_empty()))
    }

    /// ShouldCallHook: the rules first, here. The version at which `hook` takes the write:
    /// the one requested, or with `matchPolicy: Equivalent` another version of the kind its
    /// rules name, where it sees the write converted. None: it does not take it.
    fn matched<'a>(hook: &Hook, attributes: &Attributes<'a>) -> Option<&'a str> {
        rules::matched_version(&hook.rules, hook.equivalent, attributes, |rule, version| {
            rules::rule_matches_at(rule, attributes, version)
        })
    }

    /// ShouldCallHook past the rules ([`Self::matched`]): the objectSelector and
    /// namespaceSelector (an error of one counts only if the rules match), on the write as
    /// requested (labels are the same at every version), before anything is converted.
    async fn selected(
        &self,
        hook: &Hook,
        attributes: &Attributes<'_>,
        object: Option<&Value>,
        old: Option<&Value>,
    ) -> Result<bool> {
        rules::Selectors::parse(
            hook.object_selector.as_ref(),
            hook.namespace_selector.as_ref(),
        )
        .map_err(|e| Error::Internal(format!("webhook {:?}: {e}", hook.name)))?
        .take(attributes, object, old, &self.env.namespaces)
        .await
    }

    /// The last of ShouldCallHook: the `matchConditions`, on the write at the version the
    /// rules took.
    async fn conditions(
        &self,
        hook: &Hook,
        attributes: &Attributes<'_>,
        object: Option<&Value>,
        old: Option<&Value>,
    ) -> Result<bool> {
        if hook.match_conditions.is_empty() {
            return Ok(true);
        }
        self.conditions_hold(hook, attributes, object, old).await
    }

    /// `matchConditions` (CEL over `object`, `oldObject`, `request` and `authorizer`): a false one skips the
    /// webhook; with none false, one that fails to compile or evaluate refuses the write under
    /// `failurePolicy: Fail` (403) and skips the webhook under `Ignore`.
    async fn conditions_hold(
        &self,
        hook: &Hook,
        attributes: &Attributes<'_>,
        object: Option<&Value>,
        old: Option<&Value>,
    ) -> Result<bool> {
        let mut errors: Vec<String> = Vec::new();
        let mut compiled = Vec::new();
        let mut names = Vec::new();
        for condition in &hook.match_conditions {
            match cel::Expression::cached(&condition.expression).await {
                Ok(expression) => {
                    compiled.push(expression);
                    names.push(condition.name.as_str());
                }
                Err(error) => errors.push(format!("matchCondition {:?}: {error}", condition.name)),
            }
        }
        let request = call::request_variable(attributes);
        let mut variables = vec![
            ("object".to_owned(), attributes.object_to_cel(object)),
            ("oldObject".to_owned(), attributes.object_to_cel(old)),
            ("request".to_owned(), cel::to_cel(&request)),
        ];
        if compiled.iter().any(|e| e.names("authorizer")) {
            for (name, value) in attributes.authorizer_variables(self.env.authorizer()) {
                variables.push((name.to_owned(), value));
            }
        }
        for (name, result) in names.iter().zip(cel::evaluate(compiled, variables).await) {
            match result {
                Ok(Value::Bool(false)) => return Ok(false),
                Ok(Value::Bool(true)) => {}
                Ok(other) => errors.push(format!(
                    "matchCondition {name:?}: expected a bool, got {other}"
                )),
                Err(error) => errors.push(format!("matchCondition {name:?}: {error}")),
            }
        }
        match (errors.is_empty(), hook.fail) {
            (true, _) => Ok(true),
            (false, true) => Err(forbidden(
                attributes,
                &format!("webhook {:?}: {}", hook.name, errors.join("; ")),
            )),
            (false, false) => Ok(false),
        }
    }

    /// Calls `hook`; a failure to call it is an error under `failurePolicy: Fail` (500) and
    /// None under `Ignore` (logged; the write goes on).
    async fn call(
        &self,
        hook: &Hook,
        attributes: &Attributes<'_>,
        object: Option<&Value>,
        old: Option<&Value>,
        mutating: bool,
    ) -> Result<Option<call::Verdict>> {
        if attributes.dry_run && !matches!(hook.side_effects.as_str(), "None" | "NoneOnDryRun") {
            return Err(Error::BadRequest(format!(
                "admission webhook {:?} does not support dry run",
                hook.name
            )));
        }
        let started = std::time::Instant::now();
        let outcome = if !hook.review_versions.iter().any(|v| v == "v1") {
            Err("webhook does not accept known AdmissionReview versions (v1)".to_owned())
        } else {
            let uid = uuid::Uuid::new_v4().to_string();
            let review = call::review(attributes, &uid, object, old);
            self.clients
                .call(&hook.client, hook.timeout, &review, &uid, mutating)
                .await
        };
        let seconds = started.elapsed().as_secs_f64();
        match outcome {
            Ok(answer) => {
                let refused = (!answer.allowed).then(|| {
                    let code = answer.status.as_ref().and_then(|s| s.code).unwrap_or(400);
                    ("no_error", u16::try_from(code.max(400)).unwrap_or(400))
                });
                self.observe(hook, attributes, mutating, seconds, refused);
                Ok(Some(answer))
            }
            Err(reason) if hook.fail => {
                self.observe(
                    hook,
                    attributes,
                    mutating,
                    seconds,
                    Some(("calling_webhook_error", 500)),
                );
                Err(Error::Internal(format!(
                    "failed calling webhook {:?}: {reason}",
                    hook.name
                )))
            }
            Err(reason) => {
                self.observe(hook, attributes, mutating, seconds, None);
                tracing::warn!(webhook = %hook.name, %reason, "failed calling webhook, failing open");
                Ok(None)
            }
        }
    }

    /// The mutating webhooks, in order (configurations by name, webhooks as listed), each on
    /// the object as the ones before left it. On the second of `passes`, only those with
    /// `reinvocationPolicy: IfNeeded` that ran before the object last changed
    /// (`reinvocation`).
    pub async fn mutate(
        &self,
        attributes: &Attributes<'_>,
        object: &mut Value,
        old: Option<&Value>,
        apply: &Patcher,
        passes: &mut Passes,
    ) -> Result<Vec<String>> {
        self.ready(attributes).await?;
        let hooks = self.mutating_hooks();
        let again = passes.again;
        passes.webhooks.begin(again, object);
        let mut warnings = Vec::new();
        for (index, hook) in hooks.iter().enumerate() {
            if !passes.webhooks.runs(again, &index) {
                continue;
            }
            let (called, changed) = self
                .mutate_once(
                    hook,
                    (usize::from(again), index),
                    attributes,
                    object,
                    old,
                    apply,
                    &mut warnings,
                )
                .await?;
            // Only a webhook that was called is called again.
            if called {
                passes
                    .webhooks
                    .ran(index, changed, hook.reinvoke, &mut passes.changed);
            }
        }
        passes.webhooks.end(object);
        Ok(warnings)
    }

    /// One mutating webhook on `object`, if it should be called: whether it was called (its
    /// failure ignored counts), and whether it changed the object.
    #[allow(clippy::too_many_arguments)]
    async fn mutate_once(
        &self,
        hook: &Hook,
        round_and_index: (usize, usize),
        attributes: &Attributes<'_>,
        object: &mut Value,
        old: Option<&Value>,
        apply: &Patcher,
        warnings: &mut Vec<String>,
    ) -> Result<(bool, bool)> {
        let Some(version) = Self::matched(hook, attributes) else {
            return Ok((false, false));
        };
        let present = (attributes.operation != Operation::Delete).then_some(&*object);
        if !self.selected(hook, attributes, present, old).await? {
            return Ok((false, false));
        }
        if version == attributes.version {
            return self
                .mutate_at(
                    hook,
                    round_and_index,
                    attributes,
                    object,
                    old,
                    apply,
                    warnings,
                )
                .await;
        }
        // A hook of another version mutates the object converted to it; what it leaves is
        // converted back.
        let at = AtVersion::new(attributes, version, Some(object), old)?;
        let mut converted = at.object.as_deref().cloned().unwrap_or_default();
        let (called, changed) = self
            .mutate_at(
                hook,
                round_and_index,
                &at.attributes,
                &mut converted,
                at.old.as_deref(),
                apply,
                warnings,
            )
            .await?;
        if changed {
            *object = attributes.convert(&converted, Some(object))?;
        }
        Ok((called, changed))
    }

    /// [`Self::mutate_once`] at the version the hook takes the write at.
    #[allow(clippy::too_many_arguments)]
    async fn mutate_at(
        &self,
        hook: &Hook,
        round_and_index: (usize, usize),
        attributes: &Attributes<'_>,
        object: &mut Value,
        old: Option<&Value>,
        apply: &Patcher,
        warnings: &mut Vec<String>,
    ) -> Result<(bool, bool)> {
        let present = (attributes.operation != Operation::Delete).then_some(&*object);
        if !self.conditions(hook, attributes, present, old).await? {
            return Ok((false, false));
        }
        let Some(answer) = self.call(hook, attributes, present, old, true).await? else {
            return Ok((true, false));
        };
        warnings.extend(answer.warnings.iter().cloned());
        audit_annotations(&hook.name, &answer);
        let changed = self.apply_answer(
            hook,
            attributes,
            object,
            apply,
            answer,
            warnings,
            round_and_index,
        );
        // kube-apiserver's note of every mutating webhook called, and whether it mutated.
        let (round, index) = round_and_index;
        crate::audit::annotate(
            crate::audit::Level::Metadata,
            &format!("mutation.webhook.admission.k8s.io/round_{round}_index_{index}"),
            || {
                serde_json::json!({
                    "configuration": hook.configuration,
                    "webhook": hook.name,
                    "mutated": matches!(changed, Ok(true)),
                })
                .to_string()
            },
        );
        Ok((true, changed?))
    }

    /// A mutating webhook's answer on `object`: whether it changed it.
    #[allow(clippy::too_many_arguments)]
    fn apply_answer(
        &self,
        hook: &Hook,
        attributes: &Attributes<'_>,
        object: &mut Value,
        apply: &Patcher,
        answer: call::Verdict,
        warnings: &[String],
        (round, index): (usize, usize),
    ) -> Result<bool> {
        if !answer.allowed {
            return Err(denied(&hook.name, answer.status, warnings));
        }
        let Some(patch) = answer.patch.filter(|p| !p.is_empty()) else {
            return Ok(false);
        };
        if attributes.operation == Operation::Delete {
            return Err(Error::Internal(format!(
                "admission webhook {:?} attempted to modify the object, which is not supported for this operation",
                hook.name
            )));
        }
        // The patch itself, at Request level and above (kube-apiserver's).
        crate::audit::annotate(
            crate::audit::Level::Request,
            &format!("patch.webhook.admission.k8s.io/round_{round}_index_{index}"),
            || {
                serde_json::json!({
                    "configuration": hook.configuration,
                    "webhook": hook.name,
                    "patch": patch,
                    "patchType": "JSONPatch",
                })
                .to_string()
            },
        );
        let mut patched = object.clone();
        apply(&mut patched, &patch).map_err(|e| {
            Error::Internal(format!(
                "admission webhook {:?} returned a patch that cannot be applied: {e}",
                hook.name
            ))
        })?;
        let changed = patched != *object;
        *object = patched;
        Ok(changed)
    }

    /// The validating webhooks that match, called in parallel; the first refusal (in their
    /// order) is the answer, with every webhook's warnings.
    pub async fn validate(
        &self,
        attributes: &Attributes<'_>,
        object: Option<&Value>,
        old: Option<&Value>,
    ) -> Result<Vec<String>> {
        self.ready(attributes).await?;
        let mut calls = Vec::new();
        // The write at each version a hook takes it at, converted once.
        let mut versions: Vec<Arc<AtVersion<'_, '_>>> = Vec::new();
        for hook in self.validating_hooks() {
            let Some(version) = Self::matched(&hook, attributes) else {
                continue;
            };
            if !self.selected(&hook, attributes, object, old).await? {
                continue;
            }
            let at = match versions.iter().find(|at| at.attributes.version == version) {
                Some(at) => at.clone(),
                None => {
                    let at = Arc::new(AtVersion::new(attributes, version, object, old)?);
                    versions.push(at.clone());
                    at
                }
            };
            let (judged, object, old) = (&at.attributes, at.object.as_deref(), at.old.as_deref());
            if self.conditions(&hook, judged, object, old).await? {
                calls.push((hook, at));
            }
        }
        let answers = futures::future::join_all(calls.iter().map(|(hook, at)| {
            self.call(
                hook,
                &at.attributes,
                at.object.as_deref(),
                at.old.as_deref(),
                false,
            )
        }))
        .await;
        let mut warnings = Vec::new();
        let mut refusal = None;
        for ((hook, _), answer) in calls.iter().zip(answers) {
            match answer {
                Ok(Some(answer)) => {
                    warnings.extend(answer.warnings.iter().cloned());
                    audit_annotations(&hook.name, &answer);
                    if !answer.allowed && refusal.is_none() {
                        refusal = Some((hook.name.clone(), answer.status));
                    }
                }
                Ok(None) => {}
                Err(error) => return Err(error),
            }
        }
        match refusal {
            Some((name, status)) => Err(denied(&name, status, &warnings)),
            None => Ok(warnings),
        }
    }
}

/// A webhook's `auditAnnotations`, each as `<webhook name>/<key>` in the request's audit
/// record (kube-apiserver's keys).
fn audit_annotations(webhook: &str, answer: &call::Verdict) {
    for (key, value) in &answer.audit_annotations {
        crate::audit::annotate(
            crate::audit::Level::Metadata,
            &format!("{webhook}/{key}"),
            || value.clone(),
        );
    }
}

/// kube-apiserver's Forbidden for the object written, e.g. `zebras.zoo.example.com "dolly"
/// is forbidden: ...`.
pub(crate) fn forbidden(attributes: &Attributes<'_>, message: &str) -> Error {
    Error::Forbidden(format!(
        "{}.{} {:?} is forbidden: {message}",
        attributes.resource, attributes.group, attributes.name
    ))
}

/// A webhook's refusal (`ToStatusErr`): its Status, the code at least 400, the message
/// prefixed with who denied the request.
fn denied(name: &str, status: Option<Status>, warnings: &[String]) -> Error {
    let mut status = status.unwrap_or_default();
    let denied_by = format!("admission webhook {name:?} denied the request");
    if status.code.is_none_or(|code| code < 400) {
        status.code = Some(400);
    }
    status.status = Some("Failure".into());
    status.message = Some(
        match (status.message.as_deref(), status.reason.as_deref()) {
            (Some(message), _) if !message.is_empty() => format!("{denied_by}: {message}"),
            (_, Some(reason)) if !reason.is_empty() => format!("{denied_by}: {reason}"),
            _ => format!("{denied_by} without explanation"),
        },
    );
    Error::Admission {
        status: Box::new(status),
        warnings: warnings.to_vec(),
    }
}
