//! CEL admission policies (k8s.io/apiserver's `plugin/policy`): ValidatingAdmissionPolicy
//! ([`validating`]) and MutatingAdmissionPolicy ([`mutating`]). What both share is here: a
//! policy kind and its bindings watched, which writes a policy and a binding take
//! (`matchConstraints`, the binding's `matchResources`), the params a binding names, and the
//! variables CEL sees (`object`, `oldObject`, `request`, `params`, `namespaceObject`,
//! `variables`).

pub(crate) mod mutating;
mod params;
pub(crate) mod validating;

use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};

use ::cel::Value as CelValue;
use k8s_openapi::api::admissionregistration::v1::{
    MatchCondition, MatchResources, NamedRuleWithOperations, Variable,
};
use kube::{Resource, runtime::reflector};
use serde_json::{Value, json};

pub use mutating::MutatingPolicies;
pub use params::Params;
pub use validating::ValidatingPolicies;

use super::{
    Attributes, cel,
    webhook::{READY_WAIT, call, forbidden, rules},
};
use crate::{
    error::{Error, Result},
    store::informer::{self, Reflected},
    store::namespaces::Namespaces,
};

/// One kind of policy and its bindings, as the cluster has them now.
pub(crate) struct Watched<
    P: Resource<DynamicType = ()> + 'static,
    B: Resource<DynamicType = ()> + 'static,
> {
    pub(crate) policies: reflector::Store<P>,
    pub(crate) bindings: reflector::Store<B>,
    /// Set once both watches have listed (for `/readyz`).
    synced: Arc<AtomicBool>,
}

impl<P: Reflected, B: Reflected> Watched<P, B> {
    /// Watches `client`'s policies of kind `P` and bindings of kind `B`.
    pub(crate) fn start(client: kube::Client) -> Self {
        let policies: reflector::Store<P> = informer::start(client.clone());
        let bindings: reflector::Store<B> = informer::start(client);
        let synced = Arc::new(AtomicBool::new(false));
        {
            let (policies, bindings, synced) = (policies.clone(), bindings.clone(), synced.clone());
            tokio::spawn(async move {
                if policies.wait_until_ready().await.is_ok()
                    && bindings.wait_until_ready().await.is_ok()
                {
                    synced.store(true, Ordering::SeqCst);
                }
            });
        }
        Self {
            policies,
            bindings,
            synced,
        }
    }

    /// Whether both watches have listed once.
    pub(crate) fn synced(&self) -> bool {
        self.synced.load(Ordering::SeqCst)
    }

    /// Waits (at most [`READY_WAIT`]) for both to be listed; kube-apiserver's "not yet ready".
    pub(crate) async fn ready(&self, attributes: &Attributes<'_>) -> Result<()> {
        let ready = async {
            self.policies.wait_until_ready().await.map_err(|_| ())?;
            self.bindings.wait_until_ready().await.map_err(|_| ())
        };
        match tokio::time::timeout(READY_WAIT, ready).await {
            Ok(Ok(())) => Ok(()),
            _ => Err(forbidden(attributes, "not yet ready to handle request")),
        }
    }

    /// The bindings, in name order.
    pub(crate) fn bindings_by_name(&self) -> Vec<Arc<B>> {
        let mut bindings = self.bindings.state();
        bindings.sort_by(|a, b| a.meta().name.cmp(&b.meta().name));
        bindings
    }

    /// The policy a binding names.
    pub(crate) fn policy(&self, name: &str) -> Option<Arc<P>> {
        self.policies.get(&reflector::ObjectRef::new(name))
    }
}

/// MatchResources: resourceRules (with resourceNames; none: every resource),
/// excludeResourceRules, namespaceSelector and objectSelector, the rules with their
/// `matchPolicy` (`Equivalent`, the default, also takes a write made through another version
/// of a kind they name). The version at which they take the write (a policy sees it
/// converted to that version), or None; no MatchResources at all matches nothing (a policy
/// without matchConstraints).
pub(crate) async fn matches<'a>(
    namespaces: &Namespaces,
    resources: Option<&MatchResources>,
    attributes: &Attributes<'a>,
    object: Option<&Value>,
    old: Option<&Value>,
) -> Result<Option<&'a str>> {
    let Some(resources) = resources else {
        return Ok(None);
    };
    let named = |rule: &NamedRuleWithOperations, version: &str| {
        let plain = rules::Rule {
            api_groups: &rule.api_groups,
            api_versions: &rule.api_versions,
            operations: &rule.operations,
            resources: &rule.resources,
            scope: rule.scope.as_deref(),
        };
        plain.matches_at(attributes, version)
            && rule
                .resource_names
                .as_ref()
                .is_none_or(|names| names.is_empty() || names.iter().any(|n| n == attributes.name))
    };
    let equivalent = rules::equivalent(resources.match_policy.as_deref());
    let excluded = resources
        .exclude_resource_rules
        .as_deref()
        .unwrap_or_default();
    if rules::matched_version(excluded, equivalent, attributes, named).is_some() {
        return Ok(None);
    }
    // No resourceRules takes every resource (a binding narrowing by selectors only).
    let rules = resources.resource_rules.as_deref().unwrap_or_default();
    let version = if rules.is_empty() {
        attributes.version
    } else {
        match rules::matched_version(rules, equivalent, attributes, named) {
            Some(version) => version,
            None => return Ok(None),
        }
    };
    let selected = rules::Selectors::parse(
        resources.object_selector.as_ref(),
        resources.namespace_selector.as_ref(),
    )
    .map_err(Error::Internal)?
    .take(attributes, object, old, namespaces)
    .await?;
    Ok(selected.then_some(version))
}

/// The inputs every policy expression sees: `object`, `oldObject` (typed by the kind's
/// schema), `request`, `params`, `namespaceObject`, and `authorizer` with
/// `authorizer.requestResource` for the writing user (`variables` comes with [`Common`]).
/// Only those `expressions` name are made (a `request` nobody reads costs nothing).
pub(crate) async fn inputs(
    expressions: &[Arc<cel::Expression>],
    attributes: &Attributes<'_>,
    object: Option<&Arc<Value>>,
    old: Option<&Arc<Value>>,
    params: Value,
    namespaces: &Namespaces,
    authorizer: Option<&Arc<dyn cel::Checker>>,
) -> Vec<cel::Input> {
    let needs = |name: &str| expressions.iter().any(|e| e.names(name));
    let namespace_object = if attributes.namespace.is_empty() || !needs("namespaceObject") {
        Value::Null
    } else {
        let labels = namespaces.labels(attributes.namespace).await.ok().flatten();
        json!({"apiVersion": "v1", "kind": "Namespace",
               "metadata": {"name": attributes.namespace, "labels": labels.unwrap_or_default()}})
    };
    let typed = |name, value: Option<&Arc<Value>>| cel::Input {
        name,
        value: value.cloned().unwrap_or_else(|| Arc::new(Value::Null)),
        numbers: attributes.numbers.clone(),
        native: None,
    };
    let plain = |name, value| cel::Input {
        name,
        value: Arc::new(value),
        numbers: None,
        native: None,
    };
    let mut inputs = Vec::with_capacity(5);
    if needs("object") {
        inputs.push(typed("object", object));
    }
    if needs("oldObject") {
        inputs.push(typed("oldObject", old));
    }
    if needs("request") {
        inputs.push(plain("request", call::request_variable(attributes)));
    }
    if needs("params") {
        inputs.push(plain("params", params));
    }
    if needs("namespaceObject") {
        inputs.push(plain("namespaceObject", namespace_object));
    }
    if needs("authorizer") {
        for (name, value) in attributes.authorizer_variables(authorizer) {
            inputs.push(cel::Input::native(name, value));
        }
    }
    inputs
}

/// The `authorizer` of policies: the server's SubjectAccessReviews, cached as requests' are.
pub struct ClusterChecker {
    auth: Arc<crate::auth::Auth>,
    runtime: tokio::runtime::Handle,
}

/// How long a check waits for the cluster's answer.
const CHECK_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

impl ClusterChecker {
    /// Checks with `auth`, reviews sent on the current runtime (None outside one).
    pub fn start(auth: Arc<crate::auth::Auth>) -> Option<Arc<dyn cel::Checker>> {
        let runtime = tokio::runtime::Handle::try_current().ok()?;
        Some(Arc::new(Self { auth, runtime }))
    }
}

impl cel::Checker for ClusterChecker {
    fn check(&self, user: &crate::auth::user::UserInfo, asked: &cel::Asked) -> cel::Decision {
        use k8s_openapi::api::authorization::v1::{NonResourceAttributes, ResourceAttributes};
        let failed = |error: String| cel::Decision {
            error: Some(error),
            ..Default::default()
        };
        if tokio::runtime::Handle::try_current().is_ok() {
            // Expressions calling `check` run on the CEL threads; an async worker never waits.
            return failed("authorizer checks do not run on an async worker".into());
        }
        let (resource, non_resource) = match &asked.path {
            Some(path) => (
                None,
                Some(NonResourceAttributes {
                    path: Some(path.clone()),
                    verb: Some(asked.verb.clone()),
                }),
            ),
            None => (
                Some(ResourceAttributes {
                    group: Some(asked.group.clone()),
                    version: Some("*".into()),
                    resource: Some(asked.resource.clone()),
                    subresource: Some(asked.subresource.clone()),
                    namespace: Some(asked.namespace.clone()),
                    name: Some(asked.name.clone()),
                    verb: Some(asked.verb.clone()),
                    ..Default::default()
                }),
                None,
            ),
        };
        let review = self.auth.authz.review(user, resource, non_resource);
        // The timer is made inside the runtime (it needs its context).
        match self
            .runtime
            .block_on(async { tokio::time::timeout(CHECK_WAIT, review).await })
        {
            Ok(Ok((allowed, reason))) => cel::Decision {
                allowed,
                reason,
                error: None,
            },
            Ok(Err(error)) => failed(error.to_string()),
            Err(_) => failed("authorization check timed out".into()),
        }
    }
}

/// Compiles `source` (once per text); the error names it, as kube-apiserver's do.
pub(crate) async fn compile(source: &str) -> std::result::Result<Arc<cel::Expression>, String> {
    cel::Expression::cached(source)
        .await
        .map_err(|e| format!("expression '{source}' {e}"))
}

/// What every policy has: its `matchConditions` and its `variables`, compiled.
pub(crate) struct Common {
    conditions: Vec<(String, Arc<cel::Expression>)>,
    variables: Vec<(String, Arc<cel::Expression>)>,
}

impl Common {
    /// Compiles a policy's conditions and variables; the error is the policy's failure.
    pub(crate) async fn compile(
        conditions: Option<&Vec<MatchCondition>>,
        variables: Option<&Vec<Variable>>,
    ) -> std::result::Result<Arc<Self>, String> {
        let mut common = Common {
            conditions: Vec::new(),
            variables: Vec::new(),
        };
        for condition in conditions.into_iter().flatten() {
            let expression = compile(&condition.expression).await?;
            common.conditions.push((condition.name.clone(), expression));
        }
        for variable in variables.into_iter().flatten() {
            let expression = compile(&variable.expression).await?;
            common.variables.push((variable.name.clone(), expression));
        }
        Ok(Arc::new(common))
    }

    /// Every expression, to choose where they run (see [`cel::within`]).
    pub(crate) fn expressions(&self) -> Vec<Arc<cel::Expression>> {
        self.conditions
            .iter()
            .chain(&self.variables)
            .map(|(_, e)| e.clone())
            .collect()
    }

    /// In `scope`: whether every matchCondition holds (when `conditions`), then the
    /// `variables` that `users` read (directly or through other variables), each seeing those
    /// before it. As kube-apiserver's are lazy, a variable nobody reads is not evaluated (its
    /// error is nobody's). The error is the policy's failure.
    pub(crate) fn prepare(
        &self,
        scope: &mut cel::Scope<'_>,
        conditions: bool,
        users: &[Arc<cel::Expression>],
    ) -> std::result::Result<bool, String> {
        if conditions {
            for (name, condition) in &self.conditions {
                match scope.evaluate(condition)? {
                    CelValue::Bool(true) => {}
                    CelValue::Bool(false) => return Ok(false),
                    other => {
                        return Err(format!(
                            "matchCondition {name:?} gave {other:?}, not a bool"
                        ));
                    }
                }
            }
        }
        if self.variables.is_empty() || !users.iter().any(|u| u.names("variables")) {
            // Nothing to name: `variables.x` is an error either way.
            return Ok(true);
        }
        // A variable reads only those before it: walked from the last, what is read is known.
        let mut needed = vec![false; self.variables.len()];
        for index in (0..self.variables.len()).rev() {
            let name = &self.variables[index].0;
            needed[index] = users.iter().any(|u| u.reads_variable(name))
                || self.variables[index + 1..]
                    .iter()
                    .zip(&needed[index + 1..])
                    .any(|((_, later), needed)| *needed && later.reads_variable(name));
        }
        // Each variable as CEL made it (a quantity stays a quantity), seen by those after it.
        let mut composed = std::collections::HashMap::new();
        let as_map = |composed: &std::collections::HashMap<_, _>| {
            CelValue::Map(::cel::objects::Map {
                map: Arc::new(composed.clone()),
            })
        };
        scope.set("variables", as_map(&composed));
        for ((name, variable), _) in self.variables.iter().zip(&needed).filter(|(_, n)| **n) {
            let value = scope.evaluate(variable)?;
            if !cel::within_variable_bound(&value) {
                return Err(format!(
                    "variable {name:?} holds more than kube-apiserver's cost limit allows: operation cancelled: actual cost limit exceeded"
                ));
            }
            composed.insert(::cel::objects::Key::String(Arc::new(name.clone())), value);
            scope.set("variables", as_map(&composed));
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn variable(name: &str, expression: &str) -> Variable {
        Variable {
            name: name.into(),
            expression: expression.into(),
        }
    }

    /// kube-apiserver's variables are lazy: one nobody reads is not evaluated, so its error
    /// (or its cost) is nobody's; one read through another is.
    #[tokio::test]
    async fn only_the_variables_read_are_evaluated() {
        let variables = vec![
            variable("broken", "object.nothing.here"),
            variable("name", "object.metadata.name"),
            variable("upper", "variables.name.upperAscii()"),
            variable("costly", "object.items.map(x, object.items).size()"),
        ];
        let common = Common::compile(None, Some(&variables)).await.unwrap();
        let object =
            json!({"metadata": {"name": "dolly"}, "items": (0..20_000).collect::<Vec<_>>()});
        let run = |source: &'static str| {
            let common = common.clone();
            let object = object.clone();
            async move {
                let user = compile(source).await.unwrap();
                let mut expressions = common.expressions();
                expressions.push(user.clone());
                let inputs = vec![cel::Input {
                    name: "object",
                    value: Arc::new(object),
                    numbers: None,
                    native: None,
                }];
                cel::within(&expressions, inputs, move |scope| {
                    common.prepare(scope, false, std::slice::from_ref(&user))?;
                    scope.run(&user)
                })
                .await
                .and_then(|r| r)
            }
        };
        assert_eq!(run("variables.upper == 'DOLLY'").await, Ok(json!(true)));
        assert_eq!(
            run("object.metadata.name == 'dolly'").await,
            Ok(json!(true))
        );
        let broken = run("variables.broken == 1").await.unwrap_err();
        assert!(broken.contains("object.nothing.here"), "{broken}");
        // Evaluated, and stopped: by the cost limit, or on a loaded machine (a debug build
        // among parallel tests) by the deadline, which may come first.
        let costly = run("variables.costly > 0").await.unwrap_err();
        assert!(
            costly.contains(cel::cost::LIMIT_EXCEEDED)
                || costly.contains(cel::cost::DEADLINE_EXCEEDED),
            "{costly}"
        );
        // Read as a whole, every variable is evaluated.
        assert!(run("size(variables) > 0").await.is_err());
    }
}
