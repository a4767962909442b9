//! ValidatingAdmissionPolicy (k8s.io/apiserver's `plugin/policy/validating`): for each binding
//! whose policy and match resources take the write, the policy's CEL `validations`, with the
//! binding's `validationActions`. The `Audit` action and the policy's `auditAnnotations` go to
//! the request's audit record (kube-apiserver's keys), when it has one.

use std::{borrow::Cow, collections::HashMap, sync::Arc};

use k8s_openapi::{
    api::admissionregistration::v1::{
        MatchResources, ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
        ValidatingAdmissionPolicySpec,
    },
    apimachinery::pkg::apis::meta::v1::Status,
};
use serde_json::Value;

use super::{Common, Params, Watched, compile, inputs, matches};
use crate::admission::Environment;
use crate::{
    admission::{AtVersion, Attributes, ObjectJson, cel, webhook::forbidden},
    error::{Error, Result},
    observe::metrics::policy_error_type,
    store::namespaces::Namespaces,
};

/// The cluster's ValidatingAdmissionPolicies and their bindings.
pub struct ValidatingPolicies {
    watched: Watched<ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding>,
    env: Arc<Environment>,
    /// The param objects policies name.
    params: Arc<Params>,
    /// Each policy's expressions, compiled for the resourceVersion it had then.
    compiled: std::sync::Mutex<HashMap<String, (String, Arc<Compiled>)>>,
}

/// A validation, compiled.
struct Validation {
    expression: Arc<cel::Expression>,
    message_expression: Option<Arc<cel::Expression>>,
    message: Option<String>,
    reason: Option<String>,
}

/// A policy's expressions, compiled: its conditions and variables, its validations, and all
/// of them (which say where they may run).
struct Compiled {
    common: Arc<Common>,
    checks: Vec<Validation>,
    /// `auditAnnotations`: each key and its value's expression.
    audit_annotations: Vec<(String, Arc<cel::Expression>)>,
    /// Every expression, the common ones first.
    expressions: Vec<Arc<cel::Expression>>,
    /// Where the policy's own expressions (those that may read its variables) start in
    /// `expressions`.
    own: usize,
    /// The top-level fields of `object` and `oldObject` its expressions read; None: any.
    object_fields: Option<Vec<String>>,
}

impl Compiled {
    /// The error is the policy's failure (an expression that does not compile).
    async fn of(spec: &ValidatingAdmissionPolicySpec) -> std::result::Result<Self, String> {
        let common =
            Common::compile(spec.match_conditions.as_ref(), spec.variables.as_ref()).await?;
        let mut checks = Vec::new();
        for validation in spec.validations.iter().flatten() {
            let message_expression = match &validation.message_expression {
                // One that does not compile leaves the message to `message`.
                Some(source) => compile(source).await.ok(),
                None => None,
            };
            checks.push(Validation {
                expression: compile(&validation.expression).await?,
                message_expression,
                message: validation.message.clone(),
                reason: validation.reason.clone(),
            });
        }
        let mut audit_annotations = Vec::new();
        for annotation in spec.audit_annotations.iter().flatten() {
            audit_annotations.push((
                annotation.key.clone(),
                compile(&annotation.value_expression).await?,
            ));
        }
        let mut expressions = common.expressions();
        let own = expressions.len();
        for check in &checks {
            expressions.push(check.expression.clone());
            expressions.extend(check.message_expression.clone());
        }
        expressions.extend(audit_annotations.iter().map(|(_, e)| e.clone()));
        let mut object_fields: Option<Vec<String>> = Some(Vec::new());
        for expression in &expressions {
            object_fields = match (object_fields, expression.object_fields()) {
                (Some(mut fields), Some(read)) => {
                    for field in read {
                        if !fields.contains(field) {
                            fields.push(field.clone());
                        }
                    }
                    Some(fields)
                }
                _ => None,
            };
        }
        Ok(Self {
            common,
            checks,
            audit_annotations,
            expressions,
            own,
            object_fields,
        })
    }
}

/// What one binding decided.
/// A failed validation (or the policy's failure under `failurePolicy: Fail`): its message and
/// reason.
struct Violation {
    message: String,
    reason: String,
    /// The validation's index (0 for the policy's failure).
    index: usize,
}

/// What one policy found for one param: its violations, and its audit annotations (when the
/// request is audited).
#[derive(Default)]
struct Evaluation {
    violations: Vec<Violation>,
    annotations: Vec<(String, String)>,
}

/// An audit annotation's value is cut to this many bytes (kube-apiserver's bound).
const MAX_AUDIT_ANNOTATION_BYTES: usize = 10 * 1024;

impl ValidatingPolicies {
    /// Watches `client`'s ValidatingAdmissionPolicies and bindings;
    /// namespace labels, metrics and the authorizer from `env`.
    pub fn start(params: Arc<Params>, env: Arc<Environment>) -> Arc<Self> {
        Arc::new(Self {
            watched: Watched::start(params.client()),
            env,
            params,
            compiled: std::sync::Mutex::default(),
        })
    }

    /// `policy`'s expressions, compiled once per resourceVersion of it.
    async fn compiled(
        &self,
        policy: &ValidatingAdmissionPolicy,
        spec: &ValidatingAdmissionPolicySpec,
    ) -> std::result::Result<Arc<Compiled>, String> {
        let name = policy.metadata.name.as_deref().unwrap_or_default();
        let version = policy
            .metadata
            .resource_version
            .as_deref()
            .unwrap_or_default();
        if let Ok(cache) = self.compiled.lock()
            && let Some((cached, compiled)) = cache.get(name)
            && cached == version
            && !version.is_empty()
        {
            return Ok(compiled.clone());
        }
        let compiled = Arc::new(Compiled::of(spec).await?);
        if let Ok(mut cache) = self.compiled.lock() {
            cache.insert(name.to_owned(), (version.to_owned(), compiled.clone()));
        }
        Ok(compiled)
    }

    /// Counts one binding's decision for one param.
    fn observe(
        &self,
        policy: &str,
        binding: &str,
        failure: Option<&str>,
        action: &'static str,
        seconds: f64,
    ) {
        let Some(metrics) = self.env.metrics() else {
            return;
        };
        metrics.observe_policy_check(policy, binding, policy_error_type(failure), action, seconds);
    }

    /// Whether both watches have listed once.
    pub fn synced(&self) -> bool {
        self.watched.synced()
    }

    /// Whether any binding exists (a write skips the JSON round trip if not).
    pub async fn any(&self, attributes: &Attributes<'_>) -> Result<bool> {
        self.watched.ready(attributes).await?;
        Ok(!self.watched.bindings.is_empty())
    }

    /// Every binding that takes the write, in name order, every validation of each: the first
    /// denial is the answer, after all are judged (kube-apiserver's dispatcher); each `Warn`
    /// violation comes back as a warning, those of bindings after a denial too.
    pub async fn validate(
        &self,
        attributes: &Attributes<'_>,
        object: Option<&ObjectJson<'_>>,
        old: Option<&ObjectJson<'_>>,
    ) -> Result<Vec<String>> {
        self.watched.ready(attributes).await?;
        let json = |of: Option<&ObjectJson<'_>>, fields: Option<&[String]>| {
            of.map(|o| o.get(fields))
                .transpose()
                .map_err(|e| Error::Internal(format!("encoding the object for admission: {e}")))
        };
        let mut warnings = Vec::new();
        let mut denial: Option<(String, String)> = None;
        for binding in self.watched.bindings_by_name() {
            let binding_spec = &binding.spec;
            let Some(policy) = self.watched.policy(&binding_spec.policy_name) else {
                continue;
            };
            let Some(spec) = &policy.spec else {
                continue;
            };
            // A policy matches nothing without its constraints; a binding narrows them. Only
            // an objectSelector reads the object (its labels).
            let namespaces = &self.env.namespaces;
            let selects =
                |m: Option<&MatchResources>| m.is_some_and(|m| m.object_selector.is_some());
            let (selected, selected_old) = if selects(spec.match_constraints.as_ref())
                || selects(binding_spec.match_resources.as_ref())
            {
                let metadata = ["metadata".to_owned()];
                (json(object, Some(&metadata))?, json(old, Some(&metadata))?)
            } else {
                (None, None)
            };
            let (selected, selected_old) = (selected.as_deref(), selected_old.as_deref());
            // The policy's rules say at which version it sees the write.
            let Some(version) = matches(
                namespaces,
                spec.match_constraints.as_ref(),
                attributes,
                selected,
                selected_old,
            )
            .await?
            else {
                continue;
            };
            if let Some(resources) = &binding_spec.match_resources
                && matches(
                    namespaces,
                    Some(resources),
                    attributes,
                    selected,
                    selected_old,
                )
                .await?
                .is_none()
            {
                continue;
            }
            let policy_name = policy.metadata.name.as_deref().unwrap_or_default();
            let binding_name = binding.metadata.name.as_deref().unwrap_or_default();
            let fail = spec.failure_policy.as_deref() != Some("Ignore");
            let decisions = match self
                .params
                .find(
                    spec.param_kind.as_ref(),
                    binding_spec.param_ref.as_ref(),
                    attributes,
                )
                .await
            {
                // A binding that cannot be configured is judged by the failure policy alone.
                Err(message) if fail => {
                    denial.get_or_insert((
                        format!(
                            "ValidatingAdmissionPolicy '{policy_name}' with binding '{binding_name}' denied request: failed to configure binding: {message}"
                        ),
                        "Invalid".into(),
                    ));
                    continue;
                }
                Err(_) => continue,
                Ok(None) => Vec::new(),
                Ok(Some(params)) => {
                    // A policy of another version sees the write converted to it, whole (a
                    // part of an object does not convert), once; a conversion that fails is
                    // the policy's failure.
                    let converted = if version == attributes.version {
                        None
                    } else {
                        let (whole, whole_old) = (json(object, None)?, json(old, None)?);
                        Some(
                            AtVersion::new(
                                attributes,
                                version,
                                whole.as_deref(),
                                whole_old.as_deref(),
                            )
                            .map(|at| {
                                let owned =
                                    |v: Option<Cow<'_, Value>>| v.map(|v| Arc::new(v.into_owned()));
                                (at.attributes.into_owned(), owned(at.object), owned(at.old))
                            })
                            .map_err(|e| format!("failed to convert object version: {e}")),
                        )
                    };
                    let mut decisions = Vec::new();
                    for param in params {
                        let started = std::time::Instant::now();
                        let decision = match (self.compiled(&policy, spec).await, &converted) {
                            (Err(message), _) => Err(message),
                            (_, Some(Err(message))) => Err(message.clone()),
                            (Ok(compiled), converted) => {
                                let (at, object, old) = match converted {
                                    Some(Ok((at, object, old))) => {
                                        (Cow::Borrowed(at), object.clone(), old.clone())
                                    }
                                    _ => {
                                        let fields = compiled.object_fields.as_deref();
                                        let (object, old) =
                                            (json(object, fields)?, json(old, fields)?);
                                        (Cow::Borrowed(attributes), object, old)
                                    }
                                };
                                evaluate(
                                    compiled,
                                    &at,
                                    object.as_ref(),
                                    old.as_ref(),
                                    param,
                                    &self.env.namespaces,
                                    self.env.authorizer(),
                                )
                                .await
                            }
                        };
                        decisions.push((decision, started.elapsed().as_secs_f64()));
                    }
                    decisions
                }
            };
            for (decision, seconds) in decisions {
                let observe = |failure: Option<&str>, action| {
                    self.observe(policy_name, binding_name, failure, action, seconds)
                };
                let violations = match decision {
                    Ok(Evaluation {
                        violations,
                        annotations,
                    }) => {
                        for (key, value) in annotations {
                            crate::audit::annotate(
                                crate::audit::Level::Metadata,
                                &format!("{policy_name}/{key}"),
                                || value,
                            );
                        }
                        Ok(violations)
                    }
                    Err(message) => Err(message),
                };
                let (violations, failed) = match violations {
                    Ok(violations) if violations.is_empty() => {
                        observe(None, "allow");
                        continue;
                    }
                    Ok(violations) => (violations, false),
                    Err(message) if !fail => {
                        observe(Some(&message), "allow");
                        continue;
                    }
                    Err(message) => (
                        vec![Violation {
                            message,
                            reason: "Invalid".into(),
                            index: 0,
                        }],
                        true,
                    ),
                };
                let actions = &binding_spec.validation_actions;
                let failure = failed.then(|| violations[0].message.as_str());
                for (action, label) in [("Deny", "deny"), ("Warn", "warn"), ("Audit", "audit")] {
                    if actions.iter().any(|a| a == action) {
                        observe(failure, label);
                    }
                }
                for Violation {
                    message,
                    reason,
                    index,
                } in violations
                {
                    if actions.iter().any(|a| a == "Audit") {
                        // kube-apiserver keeps the first failure (the key cannot change).
                        crate::audit::annotate(
                            crate::audit::Level::Metadata,
                            "validation.policy.admission.k8s.io/validation_failure",
                            || {
                                serde_json::json!([{
                                    "message": message,
                                    "policy": policy_name,
                                    "binding": binding_name,
                                    "expressionIndex": index,
                                    "validationActions": actions,
                                }])
                                .to_string()
                            },
                        );
                    }
                    if actions.iter().any(|a| a == "Warn") {
                        warnings.push(format!(
                            "Validation failed for ValidatingAdmissionPolicy '{policy_name}' with binding '{binding_name}': {message}"
                        ));
                    }
                    if actions.iter().any(|a| a == "Deny") && denial.is_none() {
                        denial = Some((
                            format!(
                                "ValidatingAdmissionPolicy '{policy_name}' with binding '{binding_name}' denied request: {message}"
                            ),
                            reason,
                        ));
                    }
                }
            }
        }
        match denial {
            Some((message, reason)) => Err(denied(attributes, &message, &reason, &warnings)),
            None => Ok(warnings),
        }
    }
}

/// One policy for one param: its matchConditions, variables and validations, run in one
/// scope; every failed validation, in order. The error is the policy's failure (an
/// expression that does not evaluate).
async fn evaluate(
    compiled: Arc<Compiled>,
    attributes: &Attributes<'_>,
    object: Option<&Arc<Value>>,
    old: Option<&Arc<Value>>,
    params: Value,
    namespaces: &Namespaces,
    authorizer: Option<&Arc<dyn cel::Checker>>,
) -> std::result::Result<Evaluation, String> {
    // Audit annotations are worked out only for a request the audit log writes.
    let audited = crate::audit::current_level() >= crate::audit::Level::Metadata;
    let inputs = inputs(
        &compiled.expressions,
        attributes,
        object,
        old,
        params,
        namespaces,
        authorizer,
    )
    .await;
    let policy = compiled.clone();
    cel::within(&compiled.expressions, inputs, move |scope| {
        let mut violations = Vec::new();
        if !policy
            .common
            .prepare(scope, true, &policy.expressions[policy.own..])?
        {
            return Ok(Evaluation::default());
        }
        for (index, check) in policy.checks.iter().enumerate() {
            match scope.run(&check.expression)? {
                Value::Bool(true) => continue,
                Value::Bool(false) => {}
                other => {
                    return Err(format!(
                        "expression '{}' gave {other}, not a bool",
                        check.expression.source()
                    ));
                }
            }
            let from_expression = match check.message_expression.as_ref().map(|e| scope.run(e)) {
                Some(Ok(Value::String(text))) if !text.trim().is_empty() => Some(text),
                _ => None,
            };
            let message = from_expression
                .or_else(|| check.message.clone().filter(|m| !m.is_empty()))
                .unwrap_or_else(|| format!("failed expression: {}", check.expression.source()));
            violations.push(Violation {
                message,
                // kube-apiserver's default: Invalid (422).
                reason: check.reason.clone().unwrap_or_else(|| "Invalid".into()),
                index,
            });
        }
        let mut annotations = Vec::new();
        for (key, expression) in policy.audit_annotations.iter().filter(|_| audited) {
            match scope.run(expression)? {
                Value::Null => {}
                Value::String(mut text) => {
                    if text.len() > MAX_AUDIT_ANNOTATION_BYTES {
                        let mut end = MAX_AUDIT_ANNOTATION_BYTES;
                        while !text.is_char_boundary(end) {
                            end -= 1;
                        }
                        text.truncate(end);
                    }
                    annotations.push((key.clone(), text));
                }
                other => {
                    return Err(format!(
                        "valueExpression '{}' resulted in unsupported return type: {other}. Return type must be either string or null.",
                        expression.source()
                    ));
                }
            }
        }
        Ok(Evaluation {
            violations,
            annotations,
        })
    })
    .await?
}

/// A policy's denial as kube-apiserver words it (`admission.NewForbidden`, then the
/// validation's reason and its code).
fn denied(attributes: &Attributes<'_>, message: &str, reason: &str, warnings: &[String]) -> Error {
    // reasonToCode: Invalid (422) for a validation without a reason, an unknown one, or an
    // expression that failed.
    let (reason, code) = match reason {
        "Unauthorized" => ("Unauthorized", 401),
        "Forbidden" => ("Forbidden", 403),
        "RequestEntityTooLarge" => ("RequestEntityTooLarge", 413),
        _ => ("Invalid", 422),
    };
    let text = match forbidden(attributes, message) {
        Error::Forbidden(text) => text,
        other => other.to_string(),
    };
    Error::Admission {
        status: Box::new(Status {
            code: Some(code),
            message: Some(text),
            reason: Some(reason.to_owned()),
            status: Some("Failure".into()),
            details: Some(
                k8s_openapi::apimachinery::pkg::apis::meta::v1::StatusDetails {
                    name: Some(attributes.name.to_owned()),
                    group: Some(attributes.group.to_owned()),
                    kind: Some(attributes.resource.to_string()),
                    causes: Some(vec![
                        k8s_openapi::apimachinery::pkg::apis::meta::v1::StatusCause {
                            message: Some(message.to_owned()),
                            ..Default::default()
                        },
                    ]),
                    ..Default::default()
                },
            ),
            ..Default::default()
        }),
        warnings: warnings.to_vec(),
    }
}
