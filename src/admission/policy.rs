//! ValidatingAdmissionPolicy (k8s.io/apiserver's `plugin/policy/validating`): the cluster's
//! policies and their bindings, watched; for each binding whose policy and match resources
//! take the write, the policy's CEL `validations` over `object`, `oldObject`, `request`,
//! `params`, `namespaceObject` and its `variables`, with the binding's `validationActions`.
//! Audit annotations and the `Audit` action wait for an audit log.

use std::sync::Arc;

use k8s_openapi::{
    api::admissionregistration::v1::{
        MatchResources, NamedRuleWithOperations, ParamKind, ParamRef, RuleWithOperations,
        ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding, ValidatingAdmissionPolicySpec,
    },
    apimachinery::pkg::apis::meta::v1::Status,
};
use kube::{
    Api,
    api::{ApiResource, DynamicObject, GroupVersionKind, ListParams},
    runtime::reflector,
};
use serde_json::{Value, json};

use super::{
    Attributes, cel,
    webhook::{READY_WAIT, call, forbidden, rules, watch},
};
use crate::{
    error::{Error, Result},
    namespaces::Namespaces,
};

/// The cluster's ValidatingAdmissionPolicies and their bindings.
pub struct Policies {
    policies: reflector::Store<ValidatingAdmissionPolicy>,
    bindings: reflector::Store<ValidatingAdmissionPolicyBinding>,
    namespaces: Arc<Namespaces>,
    client: kube::Client,
    /// Set once both watches have listed (for `/readyz`).
    synced: Arc<std::sync::atomic::AtomicBool>,
}

/// What one binding decided.
enum Decision {
    /// The write goes on.
    Allow,
    /// A validation failed (or the policy failed under `failurePolicy: Fail`): its message and
    /// reason.
    Violation { message: String, reason: String },
}

impl Policies {
    /// Watches `client`'s ValidatingAdmissionPolicies and bindings; namespace labels from
    /// `namespaces`.
    pub fn start(client: kube::Client, namespaces: Arc<Namespaces>) -> Arc<Self> {
        let policies: reflector::Store<ValidatingAdmissionPolicy> = watch(client.clone());
        let bindings: reflector::Store<ValidatingAdmissionPolicyBinding> = watch(client.clone());
        let synced = Arc::new(std::sync::atomic::AtomicBool::new(false));
        {
            let (policies, bindings, synced) = (policies.clone(), bindings.clone(), synced.clone());
            tokio::spawn(async move {
                if policies.wait_until_ready().await.is_ok()
                    && bindings.wait_until_ready().await.is_ok()
                {
                    synced.store(true, std::sync::atomic::Ordering::SeqCst);
                }
            });
        }
        Arc::new(Self {
            policies,
            bindings,
            namespaces,
            client,
            synced,
        })
    }

    /// Whether both watches have listed once.
    pub fn synced(&self) -> bool {
        self.synced.load(std::sync::atomic::Ordering::SeqCst)
    }

    async fn ready(&self, attributes: &Attributes<'_>) -> Result<()> {
        let ready = async {
            self.policies.wait_until_ready().await.map_err(|_| ())?;
            self.bindings.wait_until_ready().await.map_err(|_| ())
        };
        match tokio::time::timeout(READY_WAIT, ready).await {
            Ok(Ok(())) => Ok(()),
            _ => Err(forbidden(attributes, "not yet ready to handle request")),
        }
    }

    /// Whether any binding exists (a write skips the JSON round trip if not).
    pub async fn any(&self, attributes: &Attributes<'_>) -> Result<bool> {
        self.ready(attributes).await?;
        Ok(!self.bindings.is_empty())
    }

    /// Every binding that takes the write, in name order: the first denial is the answer;
    /// `Warn` violations come back as warnings.
    pub async fn validate(
        &self,
        attributes: &Attributes<'_>,
        object: Option<&Value>,
        old: Option<&Value>,
    ) -> Result<Vec<String>> {
        self.ready(attributes).await?;
        let mut bindings = self.bindings.state();
        bindings.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        let mut warnings = Vec::new();
        for binding in bindings {
            let binding_spec = &binding.spec;
            let Some(policy) = self
                .policies
                .get(&reflector::ObjectRef::new(&binding_spec.policy_name))
            else {
                continue;
            };
            let Some(spec) = &policy.spec else {
                continue;
            };
            // A policy matches nothing without its constraints; a binding narrows them.
            if !self
                .matches(spec.match_constraints.as_ref(), attributes, object, old)
                .await?
            {
                continue;
            }
            if let Some(resources) = &binding_spec.match_resources
                && !self
                    .matches(Some(resources), attributes, object, old)
                    .await?
            {
                continue;
            }
            let policy_name = policy.metadata.name.as_deref().unwrap_or_default();
            let binding_name = binding.metadata.name.as_deref().unwrap_or_default();
            let fail = spec.failure_policy.as_deref() != Some("Ignore");
            let decisions = match self
                .params(
                    spec.param_kind.as_ref(),
                    binding_spec.param_ref.as_ref(),
                    attributes,
                )
                .await
            {
                // A binding that cannot be configured is judged by the failure policy alone.
                Err(message) if fail => {
                    return Err(denied(
                        attributes,
                        &format!(
                            "ValidatingAdmissionPolicy '{policy_name}' with binding '{binding_name}' denied request: failed to configure binding: {message}"
                        ),
                        "Invalid",
                        &warnings,
                    ));
                }
                Err(_) => continue,
                Ok(None) => Vec::new(),
                Ok(Some(params)) => {
                    let mut decisions = Vec::new();
                    for param in params {
                        decisions.push(
                            evaluate(spec, attributes, object, old, param, &self.namespaces).await,
                        );
                    }
                    decisions
                }
            };
            for decision in decisions {
                let (message, reason) = match decision {
                    Ok(Decision::Allow) => continue,
                    Ok(Decision::Violation { message, reason }) => (message, reason),
                    Err(_) if !fail => continue,
                    Err(message) => (message, "Invalid".to_owned()),
                };
                let actions = &binding_spec.validation_actions;
                if actions.iter().any(|a| a == "Warn") {
                    warnings.push(format!(
                        "Validation failed for ValidatingAdmissionPolicy '{policy_name}' with binding '{binding_name}': {message}"
                    ));
                }
                if actions.iter().any(|a| a == "Deny") {
                    return Err(denied(
                        attributes,
                        &format!(
                            "ValidatingAdmissionPolicy '{policy_name}' with binding '{binding_name}' denied request: {message}"
                        ),
                        &reason,
                        &warnings,
                    ));
                }
            }
        }
        Ok(warnings)
    }

    /// MatchResources: resourceRules (with resourceNames; none: every resource),
    /// excludeResourceRules, namespaceSelector and objectSelector. No MatchResources at all
    /// matches nothing (a policy without matchConstraints).
    async fn matches(
        &self,
        resources: Option<&MatchResources>,
        attributes: &Attributes<'_>,
        object: Option<&Value>,
        old: Option<&Value>,
    ) -> Result<bool> {
        let Some(resources) = resources else {
            return Ok(false);
        };
        let named = |rule: &NamedRuleWithOperations| {
            let plain = RuleWithOperations {
                api_groups: rule.api_groups.clone(),
                api_versions: rule.api_versions.clone(),
                operations: rule.operations.clone(),
                resources: rule.resources.clone(),
                scope: rule.scope.clone(),
            };
            rules::rule_matches(&plain, attributes)
                && rule.resource_names.as_ref().is_none_or(|names| {
                    names.is_empty() || names.iter().any(|n| n == attributes.name)
                })
        };
        // No resourceRules takes every resource (a binding narrowing by selectors only).
        let rules = resources.resource_rules.as_deref().unwrap_or_default();
        if (!rules.is_empty() && !rules.iter().any(named))
            || resources.exclude_resource_rules.iter().flatten().any(named)
        {
            return Ok(false);
        }
        let object_selector = rules::selector(resources.object_selector.as_ref())
            .map_err(|e| Error::Internal(format!("objectSelector: {e}")))?;
        if !rules::object_matches(
            &object_selector,
            rules::labels_of(object).as_ref(),
            rules::labels_of(old).as_ref(),
            object.is_some(),
            old.is_some(),
        ) {
            return Ok(false);
        }
        let namespace_selector = rules::selector(resources.namespace_selector.as_ref())
            .map_err(|e| Error::Internal(format!("namespaceSelector: {e}")))?;
        if let Some(selector) = namespace_selector
            && !attributes.namespace.is_empty()
        {
            let labels = self.namespaces.labels(attributes.namespace).await?;
            return Ok(selector.matches(labels.as_ref()));
        }
        Ok(true)
    }

    /// The params a binding names (`paramRef`: by name, or by selector, in its namespace or
    /// the object's): None when the binding is skipped (none found and `Allow`), one `null`
    /// when the policy takes none. The error is the policy's failure.
    async fn params(
        &self,
        kind: Option<&ParamKind>,
        reference: Option<&ParamRef>,
        attributes: &Attributes<'_>,
    ) -> std::result::Result<Option<Vec<Value>>, String> {
        let Some(kind) = kind else {
            return Ok(Some(vec![Value::Null]));
        };
        let Some(reference) = reference else {
            // Evaluated with `params` null, as kube-apiserver does.
            return Ok(Some(vec![Value::Null]));
        };
        let api_version = kind.api_version.as_deref().unwrap_or("v1");
        let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
        let gvk = GroupVersionKind::gvk(group, version, kind.kind.as_deref().unwrap_or_default());
        let resource = ApiResource::from_gvk(&gvk);
        let namespace = reference
            .namespace
            .as_deref()
            .filter(|n| !n.is_empty())
            .unwrap_or(attributes.namespace);
        let api: Api<DynamicObject> = if namespace.is_empty() {
            Api::all_with(self.client.clone(), &resource)
        } else {
            Api::namespaced_with(self.client.clone(), namespace, &resource)
        };
        let mut list = ListParams::default();
        if let Some(name) = &reference.name {
            list = list.fields(&format!("metadata.name={name}"));
        } else if let Some(selector) = &reference.selector {
            let text = rules::selector_text(selector)?;
            if !text.is_empty() {
                list = list.labels(&text);
            }
        }
        let found = api
            .list(&list)
            .await
            .map_err(|e| format!("failed to list params: {e}"))?;
        let params: Vec<Value> = found
            .items
            .into_iter()
            .filter(|item| {
                reference
                    .name
                    .as_ref()
                    .is_none_or(|name| item.metadata.name.as_ref() == Some(name))
            })
            .filter_map(|item| serde_json::to_value(item).ok())
            .collect();
        if params.is_empty() {
            // Only an explicit Deny refuses (kube-apiserver's policy source).
            return match reference.parameter_not_found_action.as_deref() {
                Some("Deny") => Err(
                    "no params found for policy binding with `Deny` parameterNotFoundAction".into(),
                ),
                _ => Ok(None),
            };
        }
        Ok(Some(params))
    }
}

/// One policy for one param: its matchConditions, variables and validations. The error is
/// the policy's failure (an expression that does not compile or evaluate).
async fn evaluate(
    spec: &ValidatingAdmissionPolicySpec,
    attributes: &Attributes<'_>,
    object: Option<&Value>,
    old: Option<&Value>,
    params: Value,
    namespaces: &Namespaces,
) -> std::result::Result<Decision, String> {
    let request = call::request_variable(attributes);
    let namespace_object = if attributes.namespace.is_empty() {
        Value::Null
    } else {
        let labels = namespaces.labels(attributes.namespace).await.ok().flatten();
        json!({"apiVersion": "v1", "kind": "Namespace",
               "metadata": {"name": attributes.namespace, "labels": labels.unwrap_or_default()}})
    };
    // Converted once: the values share their contents, so each expression's copy is cheap.
    let mut variables = vec![
        (
            "object".to_owned(),
            object.map_or(::cel::Value::Null, cel::to_cel),
        ),
        (
            "oldObject".to_owned(),
            old.map_or(::cel::Value::Null, cel::to_cel),
        ),
        ("request".to_owned(), cel::to_cel(&request)),
        ("params".to_owned(), cel::to_cel(&params)),
        ("namespaceObject".to_owned(), cel::to_cel(&namespace_object)),
    ];
    for condition in spec.match_conditions.iter().flatten() {
        match run(&condition.expression, variables.clone()).await? {
            Value::Bool(true) => {}
            Value::Bool(false) => return Ok(Decision::Allow),
            other => {
                return Err(format!(
                    "matchCondition {:?} gave {other}, not a bool",
                    condition.name
                ));
            }
        }
    }
    let mut composed = serde_json::Map::new();
    for variable in spec.variables.iter().flatten() {
        let mut with = variables.clone();
        with.push((
            "variables".to_owned(),
            cel::to_cel(&Value::Object(composed.clone())),
        ));
        let value = run(&variable.expression, with).await?;
        composed.insert(variable.name.clone(), value);
    }
    variables.push((
        "variables".to_owned(),
        cel::to_cel(&Value::Object(composed)),
    ));
    for validation in spec.validations.iter().flatten() {
        match run(&validation.expression, variables.clone()).await? {
            Value::Bool(true) => continue,
            Value::Bool(false) => {}
            other => {
                return Err(format!(
                    "expression '{}' gave {other}, not a bool",
                    validation.expression
                ));
            }
        }
        let from_expression = match &validation.message_expression {
            Some(source) => match run(source, variables.clone()).await {
                Ok(Value::String(text)) if !text.trim().is_empty() => Some(text),
                _ => None,
            },
            None => None,
        };
        let message = from_expression
            .or_else(|| validation.message.clone().filter(|m| !m.is_empty()))
            .unwrap_or_else(|| format!("failed expression: {}", validation.expression));
        return Ok(Decision::Violation {
            message,
            reason: validation
                .reason
                .clone()
                .unwrap_or_else(|| "Forbidden".into()),
        });
    }
    Ok(Decision::Allow)
}

/// Runs one expression; the error names it, as kube-apiserver's do.
async fn run(
    source: &str,
    variables: Vec<(String, ::cel::Value)>,
) -> std::result::Result<Value, String> {
    let expression = cel::Expression::cached(source)
        .await
        .map_err(|e| format!("expression '{source}' {e}"))?;
    cel::evaluate(vec![expression], variables)
        .await
        .pop()
        .unwrap_or_else(|| Err("no result".into()))
        .map_err(|e| format!("expression '{source}' resulted in error: {e}"))
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
