//! MutatingAdmissionPolicy (k8s.io/apiserver's `plugin/policy/mutating`): for each binding
//! whose policy and match resources take a create or update, the policy's `mutations` in
//! order, each a CEL expression that builds an apply configuration (`Object{...}`, merged as
//! server-side apply merges, without taking ownership) or a JSON patch (`[JSONPatch{...}]`).
//! A failing mutation is the policy's failure, judged by its `failurePolicy` once every policy
//! has run; a JSON patch whose `test` fails changes nothing.

use std::{borrow::Cow, sync::Arc};

use k8s_openapi::{
    api::admissionregistration::v1::{
        MutatingAdmissionPolicy, MutatingAdmissionPolicyBinding, MutatingAdmissionPolicySpec,
        Mutation,
    },
    apimachinery::pkg::apis::meta::v1::{Status, StatusCause, StatusDetails},
};
use serde_json::Value;

use super::{Common, Params, Watched, compile, inputs, matches};
use crate::admission::Environment;
use crate::{
    admission::{AtVersion, Attributes, Operation, cel, reinvocation::Passes, webhook::Patcher},
    error::{Error, Result},
    observe::metrics::{MutationCheckLabels, policy_error_type},
};

/// Merges an apply configuration into an object, as server-side apply merges (the kind's
/// schema; atomic lists, maps and structs refused): the REST layer's.
pub type Merger<'a> = dyn Fn(&Value, &Value) -> std::result::Result<Value, String> + Sync + 'a;

/// How mutations reach the object: the REST layer's bounded JSON patch, and its merge.
pub struct Appliers<'a> {
    /// Applies a JSON patch (bounded as a webhook's).
    pub json_patch: &'a Patcher,
    /// Merges an apply configuration.
    pub apply_configuration: &'a Merger<'a>,
}

/// The cluster's MutatingAdmissionPolicies and their bindings.
pub struct MutatingPolicies {
    watched: Watched<MutatingAdmissionPolicy, MutatingAdmissionPolicyBinding>,
    env: Arc<Environment>,
    /// The param objects policies name.
    params: Arc<Params>,
}

/// A policy failure: its message, and the reason its Status carries (None: Forbidden).
struct Failure {
    message: String,
    reason: Option<&'static str>,
}

impl MutatingPolicies {
    /// Watches `client`'s MutatingAdmissionPolicies and bindings;
    /// namespace labels, metrics and the authorizer from `env`.
    pub fn start(params: Arc<Params>, env: Arc<Environment>) -> Arc<Self> {
        Arc::new(Self {
            watched: Watched::start(params.client()),
            env,
            params,
        })
    }

    /// Whether both watches have listed once.
    pub fn synced(&self) -> bool {
        self.watched.synced()
    }

    /// Whether a create or update may be mutated (a binding exists); a delete never is.
    pub async fn any(&self, attributes: &Attributes<'_>) -> Result<bool> {
        if attributes.operation == Operation::Delete {
            return Ok(false);
        }
        self.watched.ready(attributes).await?;
        Ok(!self.watched.bindings.is_empty())
    }

    /// Runs every binding that takes the write, in name order, on `object`. On the second of
    /// `passes`, only the invocations with `reinvocationPolicy: IfNeeded` that ran before
    /// the object last changed ([`reinvocation`](crate::admission::reinvocation)).
    pub async fn mutate(
        &self,
        attributes: &Attributes<'_>,
        object: &mut Value,
        old: Option<&Value>,
        appliers: &Appliers<'_>,
        passes: &mut Passes,
    ) -> Result<()> {
        self.watched.ready(attributes).await?;
        let again = passes.again;
        passes.policies.begin(again, object);
        let mut failures: Vec<Failure> = Vec::new();
        for binding in self.watched.bindings_by_name() {
            let Some(binding_spec) = &binding.spec else {
                continue;
            };
            let policy_name = binding_spec.policy_name.as_deref().unwrap_or_default();
            let Some(policy) = self.watched.policy(policy_name) else {
                continue;
            };
            let Some(spec) = &policy.spec else {
                continue;
            };
            let namespaces = &self.env.namespaces;
            // The policy's rules say at which version it sees the write.
            let Some(version) = matches(
                namespaces,
                spec.match_constraints.as_ref(),
                attributes,
                Some(object),
                old,
            )
            .await?
            else {
                continue;
            };
            if let Some(resources) = &binding_spec.match_resources
                && matches(namespaces, Some(resources), attributes, Some(object), old)
                    .await?
                    .is_none()
            {
                continue;
            }
            let binding_name = binding.metadata.name.as_deref().unwrap_or_default();
            let fail = spec.failure_policy.as_deref() != Some("Ignore");
            let denied = |message: String| {
                format!(
                    "policy '{policy_name}' with binding '{binding_name}' denied request: {message}"
                )
            };
            let found = self
                .params
                .find(
                    spec.param_kind.as_ref(),
                    binding_spec.param_ref.as_ref(),
                    attributes,
                )
                .await;
            let params = match found {
                Ok(Some(params)) => params,
                Ok(None) => continue,
                Err(message) => {
                    if fail {
                        failures.push(Failure {
                            message: denied(format!("failed to configure binding: {message}")),
                            reason: None,
                        });
                    }
                    continue;
                }
            };
            for param in params {
                let key = format!(
                    "{policy_name}/{binding_name}/{}/{}",
                    param["metadata"]["namespace"].as_str().unwrap_or_default(),
                    param["metadata"]["name"].as_str().unwrap_or_default()
                );
                if !passes.policies.runs(again, &key) {
                    continue;
                }
                let started = std::time::Instant::now();
                let before = object.clone();
                let errors = if version == attributes.version {
                    self.invoke(spec, attributes, object, old, &param, appliers)
                        .await
                } else {
                    self.invoke_at(version, spec, attributes, object, old, &param, appliers)
                        .await
                };
                let changed = *object != before;
                if let Some(metrics) = self.env.metrics() {
                    let labels = MutationCheckLabels {
                        policy: policy_name.to_owned(),
                        policy_binding: binding_name.to_owned(),
                        error_type: policy_error_type(errors.first().map(String::as_str)),
                    };
                    metrics.mutation_checks.get_or_create(&labels).inc();
                    let seconds = started.elapsed().as_secs_f64();
                    metrics
                        .mutation_durations
                        .get_or_create(&labels)
                        .observe(seconds);
                }
                if fail {
                    failures.extend(errors.into_iter().map(|message| Failure {
                        message: denied(message),
                        reason: Some("Invalid"),
                    }));
                }
                let reinvocable = spec.reinvocation_policy.as_deref() == Some("IfNeeded");
                passes
                    .policies
                    .ran(key, changed, reinvocable, &mut passes.changed);
            }
        }
        passes.policies.end(object);
        match failures.into_iter().next() {
            Some(failure) => Err(refused(attributes, failure)),
            None => Ok(()),
        }
    }

    /// [`Self::invoke`] by a policy whose rules take the write at another `version` of the
    /// kind: on the object converted to it, what it leaves converted back. A conversion that
    /// fails is the policy's failure (judged by its failurePolicy), as kube-apiserver's.
    #[allow(clippy::too_many_arguments)]
    async fn invoke_at(
        &self,
        version: &str,
        spec: &MutatingAdmissionPolicySpec,
        attributes: &Attributes<'_>,
        object: &mut Value,
        old: Option<&Value>,
        params: &Value,
        appliers: &Appliers<'_>,
    ) -> Vec<String> {
        let failed =
            |e: crate::error::Error| vec![format!("failed to convert object version: {e}")];
        let (at, before) = match AtVersion::new(attributes, version, Some(&*object), old) {
            Ok(at) => {
                let before = at.object.as_deref().cloned().unwrap_or_default();
                (
                    at.attributes.into_owned(),
                    (before, at.old.map(Cow::into_owned)),
                )
            }
            Err(e) => return failed(e),
        };
        let (before, old) = before;
        let mut converted = before.clone();
        let mut errors = self
            .invoke(spec, &at, &mut converted, old.as_ref(), params, appliers)
            .await;
        if converted != before {
            match attributes.convert(&converted, Some(object)) {
                Ok(back) => *object = back,
                Err(e) => errors.extend(failed(e)),
            }
        }
        errors
    }

    /// What `expressions` see of the write, `object` as it is now.
    async fn inputs(
        &self,
        expressions: &[Arc<cel::Expression>],
        attributes: &Attributes<'_>,
        object: &Value,
        old: Option<&Value>,
        params: &Value,
    ) -> Vec<cel::Input> {
        inputs(
            expressions,
            attributes,
            Some(&Arc::new(object.clone())),
            old.map(|old| Arc::new(old.clone())).as_ref(),
            params.clone(),
            &self.env.namespaces,
            self.env.authorizer(),
        )
        .await
    }

    /// One policy for one param: its matchConditions, variables and mutations, in order, each
    /// seeing the object as the ones before it left it. Returns what failed.
    async fn invoke(
        &self,
        spec: &MutatingAdmissionPolicySpec,
        attributes: &Attributes<'_>,
        object: &mut Value,
        old: Option<&Value>,
        params: &Value,
        appliers: &Appliers<'_>,
    ) -> Vec<String> {
        let common =
            match Common::compile(spec.match_conditions.as_ref(), spec.variables.as_ref()).await {
                Ok(common) => common,
                Err(message) => return vec![message],
            };
        // The conditions are judged once, on the object as it came: an error or a false one
        // skips every mutation.
        let expressions = common.expressions();
        let made = self
            .inputs(&expressions, attributes, object, old, params)
            .await;
        let conditions = common.clone();
        match cel::within(&expressions, made, move |scope| {
            conditions.prepare(scope, true, &[])
        })
        .await
        .and_then(|holds| holds)
        {
            Ok(true) => {}
            Ok(false) => return Vec::new(),
            Err(message) => return vec![message],
        }
        let mut errors = Vec::new();
        for mutation in spec.mutations.iter().flatten() {
            let expression = match expression_of(mutation) {
                Ok(source) => compile(source).await,
                Err(message) => Err(message),
            };
            let expression = match expression {
                Ok(expression) => expression,
                Err(message) => {
                    errors.push(message);
                    continue;
                }
            };
            // Each mutation sees the object as the ones before it left it.
            let mut expressions = common.expressions();
            expressions.push(expression.clone());
            let inputs = self
                .inputs(&expressions, attributes, object, old, params)
                .await;
            let common = common.clone();
            let evaluated = cel::within(&expressions, inputs, move |scope| {
                common.prepare(scope, false, std::slice::from_ref(&expression))?;
                scope.run(&expression)
            })
            .await
            .and_then(|result| result);
            match evaluated {
                Ok(value) => {
                    if let Err(message) = apply(mutation, value, object, appliers) {
                        errors.push(message);
                    }
                }
                Err(message) => errors.push(message),
            }
        }
        errors
    }
}

/// The expression of `mutation`, as its patch type names it.
fn expression_of(mutation: &Mutation) -> std::result::Result<&str, String> {
    match mutation.patch_type.as_str() {
        "ApplyConfiguration" => mutation
            .apply_configuration
            .as_ref()
            .and_then(|a| a.expression.as_deref())
            .ok_or_else(|| "applyConfiguration.expression is required".into()),
        "JSONPatch" => mutation
            .json_patch
            .as_ref()
            .and_then(|p| p.expression.as_deref())
            .ok_or_else(|| "jsonPatch.expression is required".into()),
        other => Err(format!("unsupported patchType {other:?}")),
    }
}

/// Applies what a mutation's expression built (`value`) to `object`.
fn apply(
    mutation: &Mutation,
    value: Value,
    object: &mut Value,
    appliers: &Appliers<'_>,
) -> std::result::Result<(), String> {
    if mutation.patch_type == "ApplyConfiguration" {
        let Value::Object(mut configuration) = value else {
            return Err("an apply configuration must be an Object".into());
        };
        // The configuration is of the object's kind.
        for field in ["apiVersion", "kind"] {
            if let Some(value) = object.get(field) {
                configuration.insert(field.to_owned(), value.clone());
            }
        }
        let merged = (appliers.apply_configuration)(object, &Value::Object(configuration))
            .map_err(|e| format!("error applying patch: {e}"))?;
        *object = merged;
        return Ok(());
    }
    let Value::Array(operations) = value else {
        return Err("type mismatch: JSONPatchType.expression should evaluate to array".into());
    };
    let patch = crate::json_patch::Patch::from_value(&Value::Array(operations))
        .map_err(|e| format!("JSON Patch: {e}"))?;
    let mut patched = object.clone();
    match (appliers.json_patch)(&mut patched, &patch) {
        Ok(()) => {
            *object = patched;
            Ok(())
        }
        // A failed `test` leaves the object as it was (kube-apiserver's ErrTestFailed); the
        // bounded patch names the operation that failed.
        Err(error) if error.test_failed => Ok(()),
        Err(error) => Err(format!("JSON Patch: {error}")),
    }
}

/// The write refused by a policy's failure (`admission.NewForbidden`, its message replaced
/// by the first failure's, its reason by the failure's): 403.
fn refused(attributes: &Attributes<'_>, failure: Failure) -> Error {
    Error::Admission {
        status: Box::new(Status {
            code: Some(403),
            message: Some(failure.message.clone()),
            reason: Some(failure.reason.unwrap_or("Forbidden").to_owned()),
            status: Some("Failure".into()),
            details: Some(StatusDetails {
                name: Some(attributes.name.to_owned()),
                group: Some(attributes.group.to_owned()),
                kind: Some(attributes.resource.to_string()),
                causes: Some(vec![StatusCause {
                    message: Some(failure.message),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        }),
        warnings: Vec::new(),
    }
}
