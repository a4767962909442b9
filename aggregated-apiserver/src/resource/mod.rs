//! What the generic REST machinery needs to know about a served kind. A server's kinds implement
//! [`ServedResource`]; discovery, OpenAPI, Table, list and watch are written once against it.

pub mod columns;
pub mod validation;

use std::fmt::Debug;

use k8s_openapi::{NamespaceResourceScope, apimachinery::pkg::apis::meta::v1::ObjectMeta};
use kube::Resource;
use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::{Serialize, de::DeserializeOwned};

use crate::{
    error::{FieldError, Subject},
    resource::columns::ColumnDefinition,
};

/// Verbs a writable kind supports, in kube-apiserver's order.
pub const READ_WRITE_VERBS: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];
/// Verbs a kind whose store takes no writes supports.
pub const READ_ONLY_VERBS: &[&str] = &["get", "list", "watch"];

/// A kind this server serves: its names come from kube's `#[derive(CustomResource)]`, the rest
/// is declared here once. The defaults of the strategy hooks (`prepare_for_*`, `validate*`,
/// `warnings`, selectable fields) are those of a kind with no rules of its own, as
/// sample-apiserver's strategies are.
pub trait ServedResource:
    Resource<DynamicType = ()>
    + kube::CustomResourceExt
    + Clone
    + Debug
    + Serialize
    + DeserializeOwned
    + Send
    + Sync
    + 'static
{
    /// The type of `.spec`, whose doc comments become `kubectl explain` text.
    type Spec: JsonSchema;

    /// As `#[kube(...)]` names it (a test holds the two together); short names come from the
    /// derive itself ([`kube::CustomResourceExt::shortnames`]).
    const SINGULAR: &'static str;
    /// Discovery categories (`kubectl get <category>` lists every kind in it), as
    /// `#[kube(category = ...)]` names them.
    const CATEGORIES: &'static [&'static str];
    /// One line for the OpenAPI description of the kind.
    const DESCRIPTION: &'static str;

    /// Table columns after `Name`; `priority: 1` columns show only with `-o wide`.
    fn columns() -> Vec<ColumnDefinition>;
    /// One cell per column of [`ServedResource::columns`].
    fn cells(&self, now: jiff::Timestamp) -> Vec<serde_json::Value>;

    /// Appends [`ServedResource::cells`] to a Table row being written, each after a comma. A
    /// kind whose Tables are listed at scale may write them without the `Value`s; it must
    /// write what `cells` gives.
    fn write_cells(&self, now: jiff::Timestamp, out: &mut Vec<u8>) -> serde_json::Result<()> {
        for cell in self.cells(now) {
            out.push(b',');
            serde_json::to_writer(&mut *out, &cell)?;
        }
        Ok(())
    }

    /// Field errors in a create or update; empty when valid.
    fn validate(&self) -> Vec<FieldError> {
        Vec::new()
    }

    /// Field errors of an update beyond [`ServedResource::validate`] (a field that may not
    /// change, say); `old` is the stored object.
    fn validate_update(&self, _old: &Self) -> Vec<FieldError> {
        Vec::new()
    }

    /// A new object, after the server set its metadata and before validation: defaults, or a
    /// status a client may not set.
    fn prepare_for_create(&mut self) {}

    /// A replacement of `old` (update or patch) before validation: keep what the request may
    /// not change (a status, for a kind with a status subresource).
    fn prepare_for_update(&mut self, _old: &Self) {}

    /// Warnings for the client (HTTP `Warning` headers) about a valid object being created
    /// (`old` None) or updated.
    fn warnings(&self, _old: Option<&Self>) -> Vec<String> {
        Vec::new()
    }

    /// Whether the kind has a `status` subresource (`<object>/status`): then its status is
    /// written only through it, and writes of the object keep the stored status, as
    /// kube-apiserver treats a CRD with `subresources.status`.
    const STATUS_SUBRESOURCE: bool = false;

    /// Sets this object's status to `from`'s (a kind with [`ServedResource::STATUS_SUBRESOURCE`]
    /// implements it).
    fn set_status_from(&mut self, _from: &Self) {}

    /// Fields a `fieldSelector` may name besides `metadata.name` and `metadata.namespace`.
    const SELECTABLE_FIELDS: &'static [&'static str] = &[];

    /// The value of one of [`ServedResource::SELECTABLE_FIELDS`] on this object.
    fn field(&self, _name: &str) -> Option<String> {
        None
    }

    /// Namespaced (`namespaces/<ns>/<plural>`) or cluster-scoped (`<plural>`), as the derive's
    /// `namespaced` says.
    fn namespaced() -> bool {
        std::any::TypeId::of::<Self::Scope>() == std::any::TypeId::of::<NamespaceResourceScope>()
    }

    /// Whether a change from `old` to `self` bumps `metadata.generation` (a spec change).
    fn spec_changed(&self, _old: &Self) -> bool {
        false
    }

    /// A status subtree for OpenAPI, when the kind has one.
    fn status_schema(_generator: &mut SchemaGenerator) -> Option<Schema> {
        None
    }

    /// A stored object (etcd's JSON) at this version. A kind served at several versions also
    /// reads one an earlier release stored at another (see [`decode_either`]); it is written
    /// at this version at its next write.
    fn decode_stored(json: &[u8]) -> serde_json::Result<Self> {
        serde_json::from_slice(json)
    }

    /// The API group this type is in, e.g. `zoo.example.com`.
    fn group_name() -> &'static str {
        leak(Self::group(&()))
    }

    /// The version this type is, e.g. `v1alpha`.
    fn version_name() -> &'static str {
        leak(Self::version(&()))
    }

    /// `<group>/<version>`: objects' `apiVersion`, and the path under `/apis/`.
    fn group_version() -> &'static str {
        leak(Self::api_version(&()))
    }

    /// The resource name in URLs, e.g. `zebras`.
    fn plural_name() -> String {
        Self::plural(&()).into_owned()
    }

    /// The Kind, e.g. `Zebra`.
    fn kind_name() -> String {
        Self::kind(&()).into_owned()
    }

    /// `zebras.zoo.example.com`, as errors and authorization name a resource.
    fn qualified_resource() -> String {
        format!("{}.{}", Self::plural(&()), Self::group(&()))
    }

    /// For NotFound / AlreadyExists / Conflict: details.kind is the plural, as apimachinery does.
    fn subject(name: &str) -> Subject {
        Subject {
            resource: Self::qualified_resource(),
            group: Self::group(&()).into_owned(),
            kind: Self::plural_name(),
            name: name.to_owned(),
        }
    }

    /// For Invalid: details.kind is the Kind.
    fn invalid_subject(name: &str) -> Subject {
        Subject {
            kind: Self::kind_name(),
            ..Self::subject(name)
        }
    }
}

/// A version of a kind beside the version `S` its objects are stored at: how an object of one
/// converts to the other, declared in the kind's file. Conversion must lose nothing: what this
/// version has no field for is kept (in an annotation, or from the object a write replaces),
/// and a round trip through the other version gives back the object it started from.
pub trait VersionOf<S: ServedResource>: ServedResource {
    /// A stored object at this version.
    fn from_stored(stored: &S) -> Self;
    /// This object at the stored version. `current` is the stored object it replaces (an
    /// update), whose fields this version cannot express it keeps.
    fn to_stored(&self, current: Option<&S>) -> S;
}

/// [`ServedResource::decode_stored`] for a kind stored at `K` or at `O`: `json` as a `K`, or
/// else as an `O` converted.
pub fn decode_either<K: VersionOf<O>, O: ServedResource>(json: &[u8]) -> serde_json::Result<K> {
    serde_json::from_slice::<K>(json).or_else(|error| match serde_json::from_slice::<O>(json) {
        Ok(other) => Ok(K::from_stored(&other)),
        Err(_) => Err(error),
    })
}

/// Every version is a version of itself.
impl<K: ServedResource> VersionOf<K> for K {
    fn from_stored(stored: &K) -> Self {
        stored.clone()
    }

    fn to_stored(&self, _current: Option<&K>) -> K {
        self.clone()
    }
}

/// The static facts of a kind, for discovery, OpenAPI and metrics (which are not generic).
#[derive(Debug, Clone)]
pub struct ResourceInfo {
    /// The API group, e.g. `zoo.example.com`.
    pub group: &'static str,
    /// The version served, e.g. `v1alpha`.
    pub version: &'static str,
    /// The version its objects are stored at (for discovery's `storageVersionHash`).
    pub storage_version: &'static str,
    /// The resource name in URLs, e.g. `zebras`.
    pub plural: &'static str,
    /// [`ServedResource::SINGULAR`].
    pub singular: &'static str,
    /// The Kind, e.g. `Zebra`.
    pub kind: String,
    /// Short names for kubectl (`ll`), from the derive.
    pub short_names: &'static [&'static str],
    /// [`ServedResource::CATEGORIES`].
    pub categories: &'static [&'static str],
    /// What discovery says the kind supports: [`READ_WRITE_VERBS`] or [`READ_ONLY_VERBS`].
    pub verbs: &'static [&'static str],
    /// [`ServedResource::DESCRIPTION`].
    pub description: &'static str,
    /// Whether its store takes writes: discovery's verbs and OpenAPI's operations follow.
    pub writable: bool,
    /// [`ServedResource::namespaced`].
    pub namespaced: bool,
    /// Whether `<plural>/status` is served ([`ServedResource::STATUS_SUBRESOURCE`]).
    pub status: bool,
    /// Builds the OpenAPI schema of `.spec` (and `.status`) in a given generator.
    pub schema: fn(&mut SchemaGenerator) -> (Schema, Option<Schema>),
}

/// A name as `&'static str`: the derive's names are static already, others are kept for the
/// process (one per served kind).
fn leak(name: std::borrow::Cow<'static, str>) -> &'static str {
    match name {
        std::borrow::Cow::Borrowed(name) => name,
        std::borrow::Cow::Owned(name) => Box::leak(name.into_boxed_str()),
    }
}

impl ResourceInfo {
    /// `K` served from a store that takes writes or not.
    pub fn of<K: ServedResource>(writable: bool) -> Self {
        Self {
            group: K::group_name(),
            version: K::version_name(),
            storage_version: K::version_name(),
            plural: leak(K::plural(&())),
            singular: K::SINGULAR,
            kind: K::kind_name(),
            short_names: K::shortnames(),
            categories: K::CATEGORIES,
            verbs: if writable {
                READ_WRITE_VERBS
            } else {
                READ_ONLY_VERBS
            },
            description: K::DESCRIPTION,
            writable,
            namespaced: K::namespaced(),
            status: K::STATUS_SUBRESOURCE,
            schema: |generator| {
                (
                    generator.subschema_for::<K::Spec>(),
                    K::status_schema(generator),
                )
            },
        }
    }
}

/// The API group of `resources` (one group's kinds; `""` for none).
pub fn group_of(resources: &[ResourceInfo]) -> &'static str {
    resources.first().map_or("", |info| info.group)
}

/// The versions `resources` are served at, the preferred (kube's version priority: GA, then
/// beta, then alpha) first.
pub fn served_versions(resources: &[ResourceInfo]) -> Vec<&'static str> {
    let mut versions: Vec<&'static str> = Vec::new();
    for info in resources {
        if !versions.contains(&info.version) {
            versions.push(info.version);
        }
    }
    versions.sort_by_key(|v| std::cmp::Reverse(kube::core::Version::parse(v).priority()));
    versions
}

/// The kinds of `resources` served at `version`.
pub fn at_version(resources: &[ResourceInfo], version: &str) -> Vec<ResourceInfo> {
    resources
        .iter()
        .filter(|info| info.version == version)
        .cloned()
        .collect()
}

/// The time now as kube-apiserver stores timestamps: at second precision.
pub fn now() -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Time {
    let now = jiff::Timestamp::now();
    k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        jiff::Timestamp::from_second(now.as_second()).unwrap_or(now),
    )
}

/// The metadata key of an object: namespace and name. Ordered as etcd orders keys.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectKey {
    /// "" for a cluster-scoped kind.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
}

impl ObjectKey {
    /// The key of `name` in `namespace`.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// The key as its two parts, for lookups that build no key (see [`KeyParts`]).
    pub fn parts(&self) -> (&str, &str) {
        (&self.namespace, &self.name)
    }

    /// The key of an object from its metadata (an unset namespace or name is "").
    pub fn of(meta: &ObjectMeta) -> Self {
        Self {
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: meta.name.clone().unwrap_or_default(),
        }
    }
}

/// A key as its namespace and name, borrowed: an ordered map of [`ObjectKey`]s can be searched
/// with `&(namespace, name) as &dyn KeyParts`, without building (allocating) a key. Ordered as
/// `ObjectKey` is (namespace, then name), as `Borrow` requires.
pub trait KeyParts {
    /// Namespace and name.
    fn key_parts(&self) -> (&str, &str);
}

impl KeyParts for ObjectKey {
    fn key_parts(&self) -> (&str, &str) {
        self.parts()
    }
}

impl KeyParts for (&str, &str) {
    fn key_parts(&self) -> (&str, &str) {
        (self.0, self.1)
    }
}

impl<'a> std::borrow::Borrow<dyn KeyParts + 'a> for ObjectKey {
    fn borrow(&self) -> &(dyn KeyParts + 'a) {
        self
    }
}

impl PartialEq for dyn KeyParts + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.key_parts() == other.key_parts()
    }
}

impl Eq for dyn KeyParts + '_ {}

impl PartialOrd for dyn KeyParts + '_ {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for dyn KeyParts + '_ {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.key_parts().cmp(&other.key_parts())
    }
}

/// A Kubernetes `number` (float64) as Go's encoding/json writes it: a whole number without a
/// fraction (`120`, not `120.0`), so what clients read, and compare with a JSON patch `test`,
/// is what kube-apiserver would serve. Use with `#[serde(serialize_with = ...)]`.
pub fn serialize_float64<S: serde::Serializer>(
    value: &f64,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    // Whole numbers an i64 holds exactly; beyond, Go writes digits or an exponent as
    // serde_json does.
    const EXACT: f64 = 9_007_199_254_740_992.0; // 2^53
    if value.fract() == 0.0 && value.abs() <= EXACT {
        serializer.serialize_i64(*value as i64)
    } else {
        serializer.serialize_f64(*value)
    }
}

/// [`serialize_float64`] as a JSON value (a Table cell).
pub fn float64_value(value: f64) -> serde_json::Value {
    serde_json::to_value(Float64(value)).unwrap_or(serde_json::Value::Null)
}

struct Float64(f64);

impl Serialize for Float64 {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serialize_float64(&self.0, serializer)
    }
}

#[cfg(test)]
mod tests {
    use kube::CustomResourceExt;

    use super::ServedResource;
    use crate::testing::{Stripe, Zebra};

    /// The names a kind serves are the ones its `#[kube(...)]` derive declares.
    fn names_agree<K: ServedResource>() {
        let crd = K::crd();
        let names = crd.spec.names;
        assert_eq!(names.singular.as_deref(), Some(K::SINGULAR));
        assert_eq!(names.categories.unwrap_or_default(), K::CATEGORIES.to_vec());
        assert_eq!(names.plural, K::plural(&()));
        assert_eq!(names.kind, K::kind(&()));
        assert_eq!(crd.spec.group, K::group(&()));
    }

    #[test]
    fn served_names_are_the_derives() {
        names_agree::<Zebra>();
        names_agree::<Stripe>();
        assert_eq!(Stripe::shortnames(), ["st"]);
        assert_eq!(Zebra::shortnames(), ["zb"]);
    }
}
