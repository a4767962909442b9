//! Kubernetes' `authorizer` CEL library (k8s.io/apiserver `pkg/cel/library/authz.go`): a
//! policy asks whether the requesting user (or a service account) may do something else,
//! `authorizer.group('apps').resource('deployments').namespace('ns').name('n').check('get')`,
//! `authorizer.path('/healthz').check('get')`, `authorizer.requestResource.check('approve')`,
//! then `allowed()`, `reason()`, `errored()` and `error()` on the decision. The answer comes
//! from a [`Checker`] (the server's SubjectAccessReviews); expressions calling `check` never
//! run on an async worker (see [`super::within`]), as the checker waits for the cluster.

use std::sync::Arc;

use super::library::answer;
use cel::{
    Env, ExecutionError, Value,
    common::{
        types::{CelString, STRING_TYPE, Type},
        value::CowVal,
    },
    objects::Opaque,
};

use crate::auth::user::UserInfo;

/// What a check asks: a path (non-resource), or a resource's attributes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Asked {
    /// Set for a path check.
    pub path: Option<String>,
    /// The API group ("" for the core group).
    pub group: String,
    /// The resource's plural.
    pub resource: String,
    /// Its subresource, or "".
    pub subresource: String,
    /// Its namespace, or "".
    pub namespace: String,
    /// The object's name, or "".
    pub name: String,
    /// The verb checked.
    pub verb: String,
}

/// An authorizer's answer: allowed or not, with its reason; an error when it could not say.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Decision {
    /// Whether the user may.
    pub allowed: bool,
    /// The authorizer's reason.
    pub reason: String,
    /// Why there is no answer.
    pub error: Option<String>,
}

/// Answers checks for a user, synchronously (called on the CEL threads).
pub trait Checker: Send + Sync {
    /// Whether `user` may do what `asked` names.
    fn check(&self, user: &UserInfo, asked: &Asked) -> Decision;
}

/// The stages of a check being built, with kube-apiserver's type names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Authorizer,
    Path,
    Group,
    Resource,
}

impl Stage {
    const fn name(self) -> &'static str {
        match self {
            Stage::Authorizer => "kubernetes.authorization.Authorizer",
            Stage::Path => "kubernetes.authorization.PathCheck",
            Stage::Group => "kubernetes.authorization.GroupCheck",
            Stage::Resource => "kubernetes.authorization.ResourceCheck",
        }
    }
}

const DECISION: &str = "kubernetes.authorization.Decision";

/// An authorizer, or a check built from one.
#[derive(Clone)]
pub struct AccessCheck {
    stage: Stage,
    checker: Arc<dyn Checker>,
    user: Arc<UserInfo>,
    asked: Asked,
}

impl std::fmt::Debug for AccessCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}({:?})", self.stage.name(), self.asked)
    }
}

impl PartialEq for AccessCheck {
    fn eq(&self, other: &Self) -> bool {
        self.stage == other.stage
            && self.asked == other.asked
            && self.user.name == other.user.name
            && Arc::ptr_eq(&self.checker, &other.checker)
    }
}

impl Eq for AccessCheck {}

impl Opaque for AccessCheck {
    fn runtime_type_name(&self) -> &str {
        self.stage.name()
    }
}

impl Opaque for Decision {
    fn runtime_type_name(&self) -> &str {
        DECISION
    }
}

/// The `authorizer` variable: checks as `user`.
pub fn authorizer(checker: Arc<dyn Checker>, user: Arc<UserInfo>) -> Value {
    Value::Opaque(Arc::new(AccessCheck {
        stage: Stage::Authorizer,
        checker,
        user,
        asked: Asked::default(),
    }))
}

/// The `authorizer.requestResource` variable: the request's own resource, for a check of
/// another verb on it.
pub fn request_resource(checker: Arc<dyn Checker>, user: Arc<UserInfo>, asked: Asked) -> Value {
    Value::Opaque(Arc::new(AccessCheck {
        stage: Stage::Resource,
        checker,
        user,
        asked,
    }))
}

fn of(stage: Stage) -> Type {
    Type::new_opaque_type(stage.name())
}

/// Adds the library to `env`.
pub(super) fn add(env: &mut Env) -> Result<(), cel::DeclarationError> {
    use Stage::*;
    type F = cel::common::functions::Function;
    let two = vec![STRING_TYPE, STRING_TYPE];
    for (name, id, target, args, function) in [
        (
            "path",
            "authorizer_path",
            Authorizer,
            vec![STRING_TYPE],
            path as F,
        ),
        (
            "group",
            "authorizer_group",
            Authorizer,
            vec![STRING_TYPE],
            group,
        ),
        (
            "serviceAccount",
            "authorizer_serviceaccount",
            Authorizer,
            two,
            service_account,
        ),
        (
            "resource",
            "groupcheck_resource",
            Group,
            vec![STRING_TYPE],
            resource,
        ),
        (
            "subresource",
            "resourcecheck_subresource",
            Resource,
            vec![STRING_TYPE],
            subresource,
        ),
        (
            "namespace",
            "resourcecheck_namespace",
            Resource,
            vec![STRING_TYPE],
            namespace,
        ),
        (
            "name",
            "resourcecheck_name",
            Resource,
            vec![STRING_TYPE],
            name,
        ),
        ("check", "pathcheck_check", Path, vec![STRING_TYPE], check),
        (
            "check",
            "resourcecheck_check",
            Resource,
            vec![STRING_TYPE],
            check,
        ),
    ] {
        env.add_member_overload(name, id, of(target), args, function)?;
    }
    let decision = || Type::new_opaque_type(DECISION);
    for (name, id, function) in [
        ("allowed", "decision_allowed", allowed as F),
        ("reason", "decision_reason", reason),
        ("errored", "decision_errored", errored),
        ("error", "decision_error", error),
    ] {
        env.add_member_overload(name, id, decision(), vec![], function)?;
    }
    Ok(())
}

fn opaque<T: Opaque + Clone>(
    function: &str,
    arg: Option<&CowVal<'_, '_>>,
) -> Result<T, ExecutionError> {
    match arg.map(|arg| Value::try_from(arg.as_ref())) {
        Some(Ok(Value::Opaque(o))) => o.downcast_ref::<T>().cloned(),
        _ => None,
    }
    .ok_or_else(|| ExecutionError::function_error(function, "wrong receiver"))
}

fn text<'a>(function: &str, arg: Option<&'a CowVal<'_, '_>>) -> Result<&'a str, ExecutionError> {
    arg.and_then(|arg| arg.as_ref().downcast_ref::<CelString>())
        .map(|s| s.inner())
        .ok_or_else(|| ExecutionError::function_error(function, "not a string"))
}

/// A check one step further: `edit` sets what the step names.
fn step<'b, 'v>(
    function: &str,
    args: &[CowVal<'b, 'v>],
    stage: Stage,
    edit: impl FnOnce(&mut Asked, &str),
) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let mut next: AccessCheck = opaque(function, args.first())?;
    edit(&mut next.asked, text(function, args.get(1))?);
    next.stage = stage;
    answer(Value::Opaque(Arc::new(next)))
}

fn path<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    step("path", &args, Stage::Path, |a, v| {
        a.path = Some(v.to_owned())
    })
}

fn group<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    step("group", &args, Stage::Group, |a, v| a.group = v.to_owned())
}

fn resource<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    step("resource", &args, Stage::Resource, |a, v| {
        a.resource = v.to_owned()
    })
}

fn subresource<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    step("subresource", &args, Stage::Resource, |a, v| {
        a.subresource = v.to_owned()
    })
}

fn namespace<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    step("namespace", &args, Stage::Resource, |a, v| {
        a.namespace = v.to_owned()
    })
}

fn name<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    step("name", &args, Stage::Resource, |a, v| a.name = v.to_owned())
}

/// `authorizer.serviceAccount(namespace, name)`: checks as that service account
/// (`system:serviceaccount:<ns>:<name>`, in `system:serviceaccounts` and
/// `system:serviceaccounts:<ns>`).
fn service_account<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let mut next: AccessCheck = opaque("serviceAccount", args.first())?;
    let namespace = text("serviceAccount", args.get(1))?;
    let name = text("serviceAccount", args.get(2))?;
    next.user = Arc::new(UserInfo {
        name: format!("system:serviceaccount:{namespace}:{name}"),
        uid: String::new(),
        groups: vec![
            "system:serviceaccounts".into(),
            format!("system:serviceaccounts:{namespace}"),
            crate::auth::user::ALL_AUTHENTICATED.into(),
        ],
        extra: Default::default(),
    });
    answer(Value::Opaque(Arc::new(next)))
}

fn check<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let check: AccessCheck = opaque("check", args.first())?;
    let mut asked = check.asked.clone();
    asked.verb = text("check", args.get(1))?.to_owned();
    let decision = check.checker.check(&check.user, &asked);
    answer(Value::Opaque(Arc::new(decision)))
}

fn decision(function: &str, args: &[CowVal<'_, '_>]) -> Result<Decision, ExecutionError> {
    opaque(function, args.first())
}

fn allowed<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    answer(Value::Bool(decision("allowed", &args)?.allowed))
}

fn reason<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    answer(Value::String(Arc::new(decision("reason", &args)?.reason)))
}

fn errored<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    answer(Value::Bool(decision("errored", &args)?.error.is_some()))
}

fn error<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    answer(Value::String(Arc::new(
        decision("error", &args)?.error.unwrap_or_default(),
    )))
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::{Asked, Checker, Decision, authorizer, request_resource};
    use crate::{admission::cel::Expression, auth::user::UserInfo};

    /// Allows `get` on anything, and remembers what it was asked and for whom.
    #[derive(Default)]
    struct Recorder(Mutex<Vec<(String, Asked)>>);

    impl Checker for Recorder {
        fn check(&self, user: &UserInfo, asked: &Asked) -> Decision {
            self.0
                .lock()
                .unwrap()
                .push((user.name.clone(), asked.clone()));
            Decision {
                allowed: asked.verb == "get",
                reason: format!("{} may {}", user.name, asked.verb),
                error: (asked.verb == "broken").then(|| "no answer".into()),
            }
        }
    }

    #[test]
    fn checks_ask_what_they_name() {
        let recorder = Arc::new(Recorder::default());
        let user = Arc::new(UserInfo {
            name: "alice".into(),
            uid: String::new(),
            groups: vec![],
            extra: Default::default(),
        });
        let variables = vec![
            (
                "authorizer".to_owned(),
                authorizer(recorder.clone(), user.clone()),
            ),
            (
                "authorizer.requestResource".to_owned(),
                request_resource(
                    recorder.clone(),
                    user,
                    Asked {
                        group: "zoo.example.com".into(),
                        resource: "zebras".into(),
                        namespace: "default".into(),
                        name: "dolly".into(),
                        ..Default::default()
                    },
                ),
            ),
        ];
        let run = |source: &str| Expression::compile(source).and_then(|e| e.run(&variables));
        for source in [
            "authorizer.group('apps').resource('deployments').namespace('ns').name('web').check('get').allowed()",
            "!authorizer.path('/healthz').check('post').allowed()",
            "authorizer.requestResource.check('approve').reason() == 'alice may approve'",
            "authorizer.serviceAccount('kube-system', 'gc').group('').resource('pods').check('get').reason() == 'system:serviceaccount:kube-system:gc may get'",
            "authorizer.path('/x').check('broken').errored() && authorizer.path('/x').check('broken').error() == 'no answer'",
            "!authorizer.path('/x').check('get').errored()",
        ] {
            assert_eq!(run(source), Ok(cel::Value::Bool(true)), "{source}");
        }
        let asked = recorder.0.lock().unwrap().clone();
        assert_eq!(
            asked[0].1,
            Asked {
                group: "apps".into(),
                resource: "deployments".into(),
                namespace: "ns".into(),
                name: "web".into(),
                verb: "get".into(),
                ..Default::default()
            }
        );
        assert_eq!(asked[1].1.path.as_deref(), Some("/healthz"));
        assert_eq!(asked[2].1.resource, "zebras");
        assert_eq!(asked[2].1.verb, "approve");
        // A resource check is built from a group, not from the authorizer.
        assert!(run("authorizer.resource('pods')").is_err());
    }
}
