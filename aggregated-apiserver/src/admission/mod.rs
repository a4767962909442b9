//! Admission of writes, as k8s.io/apiserver's chain runs it for every server built on it, after
//! NamespaceLifecycle: the cluster's MutatingAdmissionPolicies and mutating webhooks, then
//! (after the kind's own validation) its ValidatingAdmissionPolicies and validating webhooks. kube-apiserver runs no admission for the APIs it proxies to an
//! aggregated server (its proxy forwards the request with the `X-Remote-*` identity and nothing
//! else), so the server that owns a resource is the one that must call them.
//!
//! Standalone (no cluster) there are no configurations and nothing is called. With a cluster,
//! a write waits for the configurations to be listed once (as the webhook plugin waits for its
//! informers) and is refused if they cannot be (403, as kube-apiserver's "not yet ready").

pub(crate) mod cel;
pub(crate) mod policy;
pub(crate) mod reinvocation;
pub mod webhook;

use std::{
    borrow::Cow,
    sync::{Arc, OnceLock},
};

use serde_json::Value;

use crate::{auth::UserInfo, resource::ServedResource};

/// What a write does, as admission names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// A create (POST, or an apply or PUT that creates).
    Create,
    /// An update (PUT, every patch, an apply of an existing object; `/status` too).
    Update,
    /// A delete (one object, or each object of a deletecollection).
    Delete,
}

impl Operation {
    /// The name rules and AdmissionReviews use (`CREATE`, `UPDATE`, `DELETE`).
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Create => "CREATE",
            Operation::Update => "UPDATE",
            Operation::Delete => "DELETE",
        }
    }

    /// The options kind an AdmissionReview names for it.
    fn options_kind(self) -> &'static str {
        match self {
            Operation::Create => "CreateOptions",
            Operation::Update => "UpdateOptions",
            Operation::Delete => "DeleteOptions",
        }
    }
}

/// One write as admission sees it (k8s.io/apiserver's `admission.Attributes`).
#[derive(Debug, Clone)]
pub struct Attributes<'a> {
    /// What the write does.
    pub operation: Operation,
    /// The group of the kind written.
    pub group: &'a str,
    /// Its version.
    pub version: &'a str,
    /// Its resource (plural).
    pub resource: Cow<'static, str>,
    /// Its Kind.
    pub kind: Cow<'static, str>,
    /// `status` for the status subresource, else "".
    pub subresource: &'a str,
    /// The object's namespace ("" for a cluster-scoped kind).
    pub namespace: &'a str,
    /// The object's name (what the path names; a create's as it will be stored).
    pub name: &'a str,
    /// Who writes (None only for writes the server makes itself).
    pub user: Option<&'a UserInfo>,
    /// `?dryRun=All`: nothing is stored, and webhooks with side effects are not called.
    pub dry_run: bool,
    /// The request's options (CreateOptions, UpdateOptions or DeleteOptions fields), sent to
    /// webhooks with their kind and apiVersion.
    pub options: Value,
    /// Where the kind's schema has numbers (CEL reads them as `double`).
    pub numbers: Option<Arc<cel::Numbers>>,
    /// The kind's other served versions, for rules with `matchPolicy: Equivalent` (None: it
    /// is served at one).
    pub equivalents: Option<Arc<dyn Equivalents>>,
    /// The version the request named, when a hook judges the write at an equivalent one
    /// ([`Attributes::at_version`]); None: `version` is it.
    pub requested_version: Option<&'a str>,
}

/// A write as one hook judges it: at the version the hook's rules took
/// (`webhook::rules::matched_version`), the object and the old object converted to it;
/// borrowed as they came when that is the version requested.
pub struct AtVersion<'v, 'a> {
    /// The write at that version.
    pub attributes: Cow<'v, Attributes<'a>>,
    /// The object (None on a delete).
    pub object: Option<Cow<'v, Value>>,
    /// The stored object (None on a create).
    pub old: Option<Cow<'v, Value>>,
}

impl<'v, 'a> AtVersion<'v, 'a> {
    /// `object` and `old` (at the version requested) as a hook that takes the write at
    /// `version` sees them; 500 if they do not convert.
    pub fn new(
        attributes: &'v Attributes<'a>,
        version: &'a str,
        object: Option<&'v Value>,
        old: Option<&'v Value>,
    ) -> crate::error::Result<Self> {
        if version == attributes.version {
            return Ok(Self {
                attributes: Cow::Borrowed(attributes),
                object: object.map(Cow::Borrowed),
                old: old.map(Cow::Borrowed),
            });
        }
        let at = attributes.at_version(version);
        // The old object first: what the object's version cannot say is kept from it.
        let old = old.map(|old| at.convert(old, None)).transpose()?;
        let object = object
            .map(|object| at.convert(object, old.as_ref()))
            .transpose()?;
        Ok(Self {
            object: object.map(Cow::Owned),
            old: old.map(Cow::Owned),
            attributes: Cow::Owned(at),
        })
    }

    /// Whether the hook judges the write at another version than the one requested.
    pub fn converted(&self) -> bool {
        matches!(self.attributes, Cow::Owned(_))
    }
}

/// A kind's served versions and conversion between them: what k8s.io/apiserver's
/// EquivalentResourceMapper and converter give admission, so a webhook or policy whose rules
/// name one version of a kind (`matchPolicy: Equivalent`, the default) sees writes made
/// through another, converted to the version it names.
pub trait Equivalents: Send + Sync + std::fmt::Debug {
    /// Every version the kind is served at.
    fn versions(&self) -> &[&'static str];
    /// `object`, at one of them (its `apiVersion`), converted to `version` as a write is
    /// (`current`: the object as stored, at `version`, which keeps what `object`'s version
    /// cannot say); None if it does not convert.
    fn convert_to(&self, object: &Value, version: &str, current: Option<&Value>) -> Option<Value>;
    /// Where `version`'s schema has numbers (CEL reads them as `double`).
    fn numbers(&self, version: &str) -> Option<Arc<cel::Numbers>>;
}

impl<'a> Attributes<'a> {
    /// A write of `K` (its group, version, resource and Kind filled in).
    pub fn of<K: ServedResource>(
        operation: Operation,
        subresource: &'a str,
        namespace: &'a str,
        name: &'a str,
    ) -> Self {
        Attributes {
            operation,
            group: K::group_name(),
            version: K::version_name(),
            resource: K::plural(&()),
            kind: K::kind(&()),
            subresource,
            namespace,
            name,
            user: None,
            dry_run: false,
            options: Value::Null,
            numbers: None,
            equivalents: None,
            requested_version: None,
        }
    }

    /// The same write judged at the kind's `version` (matched through `matchPolicy:
    /// Equivalent`): `kind` and `resource` name it, `requestKind` and `requestResource` still
    /// the version requested.
    pub fn at_version(&self, version: &'a str) -> Self {
        let numbers = match &self.equivalents {
            Some(equivalents) => equivalents.numbers(version),
            None => self.numbers.clone(),
        };
        Attributes {
            version,
            requested_version: Some(self.request_version()),
            numbers,
            ..self.clone()
        }
    }

    /// The version the request named.
    pub fn request_version(&self) -> &'a str {
        self.requested_version.unwrap_or(self.version)
    }

    /// `object` (JSON at any version of the kind) converted to this write's `version`
    /// (`current`: the object as it is at that version, when there is one); a null (a
    /// delete's object) stays null. 500 if it does not convert.
    pub fn convert(&self, object: &Value, current: Option<&Value>) -> crate::error::Result<Value> {
        if object.is_null()
            || object.get("apiVersion").and_then(Value::as_str)
                == Some(&format!("{}/{}", self.group, self.version))
        {
            return Ok(object.clone());
        }
        self.equivalents
            .as_ref()
            .and_then(|equivalents| equivalents.convert_to(object, self.version, current))
            .ok_or_else(|| {
                crate::error::Error::Internal(format!(
                    "failed to convert the {} for admission to {}/{}",
                    self.kind, self.group, self.version
                ))
            })
    }

    /// `authorizer` and `authorizer.requestResource` as CEL sees them, for the writing user
    /// (none for the server's own writes).
    pub fn authorizer_variables(
        &self,
        checker: Option<&Arc<dyn cel::Checker>>,
    ) -> Vec<(&'static str, ::cel::Value)> {
        let (Some(checker), Some(user)) = (checker, self.user) else {
            return Vec::new();
        };
        let user = Arc::new(user.clone());
        let own = cel::Asked {
            group: self.group.to_owned(),
            resource: self.resource.to_string(),
            subresource: self.subresource.to_owned(),
            namespace: self.namespace.to_owned(),
            name: self.name.to_owned(),
            ..Default::default()
        };
        vec![
            ("authorizer", cel::authorizer(checker.clone(), user.clone())),
            (
                "authorizer.requestResource",
                cel::request_resource(checker.clone(), user, own),
            ),
        ]
    }

    /// The object (or old object) written, as CEL reads it: typed by the kind's schema.
    pub fn object_to_cel(&self, object: Option<&Value>) -> ::cel::Value {
        object.map_or(::cel::Value::Null, |object| {
            cel::to_cel_typed(object, self.numbers.as_deref())
        })
    }

    /// The options as an AdmissionReview carries them: their kind and `meta.k8s.io/v1`.
    fn options_object(&self) -> Value {
        let mut options = match &self.options {
            Value::Object(map) => map.clone(),
            _ => serde_json::Map::new(),
        };
        options.insert(
            "kind".into(),
            Value::String(self.operation.options_kind().into()),
        );
        options.insert("apiVersion".into(), Value::String("meta.k8s.io/v1".into()));
        Value::Object(options)
    }
}

/// The object a write admits, as JSON, made only as far as its readers need: a
/// ValidatingAdmissionPolicy the top-level fields its expressions read (`object.spec.weight`:
/// `spec`, not `metadata.managedFields`), a webhook the whole object. What was made is kept,
/// and made again, larger, only for a reader that needs more.
pub struct ObjectJson<'a> {
    make: &'a MakeJson<'a>,
    /// The fields made (None: all) and the JSON.
    made: std::sync::Mutex<Option<Made>>,
}

/// Converts an object to JSON, keeping the top-level fields it is given (all for None).
pub type MakeJson<'a> = dyn Fn(Option<&[String]>) -> Result<Value, String> + Send + Sync + 'a;

/// What an [`ObjectJson`] made: the top-level fields (None: all), and the JSON.
type Made = (Option<Vec<String>>, Arc<Value>);

impl<'a> ObjectJson<'a> {
    /// `make` converts the object, keeping the top-level fields it is given (all for None).
    pub fn new(make: &'a MakeJson<'a>) -> Self {
        Self {
            make,
            made: std::sync::Mutex::new(None),
        }
    }

    /// The object with at least the top-level `fields` (None: whole).
    pub fn get(&self, fields: Option<&[String]>) -> Result<Arc<Value>, String> {
        let mut made = self
            .made
            .lock()
            .map_err(|_| "the admitted object's JSON was poisoned".to_owned())?;
        let want = match (&*made, fields) {
            (None, fields) => fields.map(<[String]>::to_vec),
            (Some((None, value)), _) => return Ok(value.clone()),
            (Some((Some(have), value)), Some(fields))
                if fields.iter().all(|f| have.contains(f)) =>
            {
                return Ok(value.clone());
            }
            (Some((Some(_), _)), None) => None,
            (Some((Some(have), _)), Some(fields)) => {
                let mut union = have.clone();
                union.extend(fields.iter().filter(|f| !have.contains(f)).cloned());
                Some(union)
            }
        };
        let value = Arc::new((self.make)(want.as_deref())?);
        *made = Some((want, value.clone()));
        Ok(value)
    }
}

/// What every admission plugin reads besides its own configurations: the cluster's
/// namespaces (for `namespaceSelector`), and the server's metrics and the authorizer that
/// expressions and `matchConditions` call, both given once the server has them.
pub struct Environment {
    pub(crate) namespaces: Arc<crate::store::namespaces::Namespaces>,
    metrics: OnceLock<Arc<crate::observe::metrics::Metrics>>,
    authorizer: OnceLock<Arc<dyn cel::Checker>>,
}

impl Environment {
    /// Namespace labels from `namespaces`; no metrics or authorizer yet.
    pub fn new(namespaces: Arc<crate::store::namespaces::Namespaces>) -> Arc<Self> {
        Arc::new(Self {
            namespaces,
            metrics: OnceLock::new(),
            authorizer: OnceLock::new(),
        })
    }

    /// Where the plugins count decisions and calls, once the server has them.
    pub fn metrics(&self) -> Option<&Arc<crate::observe::metrics::Metrics>> {
        self.metrics.get()
    }

    /// The authorizer, once the server has one.
    pub fn authorizer(&self) -> Option<&Arc<dyn cel::Checker>> {
        self.authorizer.get()
    }
}

/// The admission chain of a server: the cluster's webhooks, or nothing.
#[derive(Clone, Default)]
pub struct Admission {
    /// What the plugins share (None without a cluster).
    env: Option<Arc<Environment>>,
    webhooks: Option<Arc<webhook::Webhooks>>,
    policies: Option<Arc<policy::ValidatingPolicies>>,
    mutating_policies: Option<Arc<policy::MutatingPolicies>>,
}

impl Admission {
    /// The chain k8s.io/apiserver's RecommendedOptions turn on for `client`'s cluster, each
    /// plugin where `enabled(name)` says so (`--disable-admission-plugins`): the mutating
    /// and validating policies (one watch per param kind shared by both) and webhooks, their
    /// `namespaceSelector`s read from `namespaces`.
    pub fn for_cluster(
        client: &kube::Client,
        namespaces: Arc<crate::store::namespaces::Namespaces>,
        enabled: impl Fn(&str) -> bool,
    ) -> Self {
        let params = policy::Params::new(client.clone());
        let env = Environment::new(namespaces);
        let mut admission = Self {
            env: Some(env.clone()),
            ..Self::default()
        };
        if enabled("MutatingAdmissionPolicy") {
            admission = admission.with_mutating_policies(policy::MutatingPolicies::start(
                params.clone(),
                env.clone(),
            ));
        }
        if enabled("MutatingAdmissionWebhook") || enabled("ValidatingAdmissionWebhook") {
            admission = admission.with_webhooks(webhook::Webhooks::start(
                client.clone(),
                env.clone(),
                enabled("MutatingAdmissionWebhook"),
                enabled("ValidatingAdmissionWebhook"),
            ));
        }
        if enabled("ValidatingAdmissionPolicy") {
            admission = admission.with_policies(policy::ValidatingPolicies::start(params, env));
        }
        admission
    }

    /// Calls the webhooks `webhooks` finds in the cluster.
    pub fn with_webhooks(self, webhooks: Arc<webhook::Webhooks>) -> Self {
        Self {
            webhooks: Some(webhooks),
            ..self
        }
    }

    /// Applies the ValidatingAdmissionPolicies `policies` finds in the cluster.
    pub fn with_policies(self, policies: Arc<policy::ValidatingPolicies>) -> Self {
        Self {
            policies: Some(policies),
            ..self
        }
    }

    /// Answers the `authorizer` checks of policies' expressions and webhooks'
    /// `matchConditions` with `checker`.
    pub fn set_authorizer(&self, checker: Arc<dyn cel::Checker>) {
        if let Some(env) = &self.env {
            let _ = env.authorizer.set(checker);
        }
    }

    /// Counts the plugins' decisions and calls in `metrics`.
    pub fn set_metrics(&self, metrics: Arc<crate::observe::metrics::Metrics>) {
        if let Some(env) = &self.env {
            let _ = env.metrics.set(metrics);
        }
    }

    /// Applies the MutatingAdmissionPolicies `policies` finds in the cluster.
    pub fn with_mutating_policies(self, policies: Arc<policy::MutatingPolicies>) -> Self {
        Self {
            mutating_policies: Some(policies),
            ..self
        }
    }

    /// `/readyz`'s `informer-sync` (as k8s.io/apiserver's): not ready until the admission
    /// configurations have been listed, since writes wait for them (and are refused, 403, when
    /// they cannot be read, e.g. without the RBAC in `manifests/`). None with no admission.
    pub fn readiness_check(&self) -> Option<crate::observe::health::ReadinessCheck> {
        if self.webhooks.is_none() && self.policies.is_none() && self.mutating_policies.is_none() {
            return None;
        }
        let (webhooks, policies, mutating) = (
            self.webhooks.clone(),
            self.policies.clone(),
            self.mutating_policies.clone(),
        );
        Some(crate::observe::health::ReadinessCheck::new(
            "informer-sync",
            move || {
                let synced = webhooks.as_ref().is_none_or(|w| w.synced())
                    && policies.as_ref().is_none_or(|p| p.synced())
                    && mutating.as_ref().is_none_or(|p| p.synced());
                if synced {
                    Ok(())
                } else {
                    Err(
                        "the admission webhook and policy configurations have not been listed yet"
                            .into(),
                    )
                }
            },
        ))
    }

    /// The cluster's ValidatingAdmissionPolicies, when the server applies them.
    pub fn policies(&self) -> Option<&policy::ValidatingPolicies> {
        self.policies.as_deref()
    }

    /// The cluster's MutatingAdmissionPolicies, when the server applies them.
    pub fn mutating_policies(&self) -> Option<&policy::MutatingPolicies> {
        self.mutating_policies.as_deref()
    }

    /// The cluster's webhooks, when the server calls them.
    pub fn webhooks(&self) -> Option<&webhook::Webhooks> {
        self.webhooks.as_deref()
    }
}
