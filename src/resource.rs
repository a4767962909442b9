//! What the generic REST machinery needs to know about a served kind. Llama and FarmPod implement
//! [`ServedResource`]; discovery, OpenAPI, Table, list and watch are written once against it.

use std::fmt::Debug;

use k8s_openapi::{NamespaceResourceScope, apimachinery::pkg::apis::meta::v1::ObjectMeta};
use kube::Resource;
use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::{Serialize, de::DeserializeOwned};

use crate::{
    columns::ColumnDefinition,
    error::{FieldError, Subject},
};

pub const GROUP: &str = "farm.example.com";
pub const VERSION: &str = "v1alpha";
pub const GROUP_VERSION: &str = "farm.example.com/v1alpha";

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
pub const READ_ONLY_VERBS: &[&str] = &["get", "list", "watch"];

pub trait ServedResource:
    Resource<DynamicType = (), Scope = NamespaceResourceScope>
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
    const CATEGORIES: &'static [&'static str];
    /// Read-only kinds answer get/list/watch and 405 for everything else.
    const READ_ONLY: bool;
    /// One line for the OpenAPI description of the kind.
    const DESCRIPTION: &'static str;

    /// Table columns after `Name`; `priority: 1` columns show only with `-o wide`.
    fn columns() -> Vec<ColumnDefinition>;
    /// One cell per column of [`ServedResource::columns`].
    fn cells(&self, now: jiff::Timestamp) -> Vec<serde_json::Value>;

    /// Field errors in a create or update; empty when valid.
    fn validate(&self) -> Vec<FieldError> {
        Vec::new()
    }

    /// Whether a change from `old` to `self` bumps `metadata.generation` (a spec change).
    fn spec_changed(&self, _old: &Self) -> bool {
        false
    }

    /// A status subtree for OpenAPI, when the kind has one.
    fn status_schema(_generator: &mut SchemaGenerator) -> Option<Schema> {
        None
    }

    fn verbs() -> &'static [&'static str] {
        if Self::READ_ONLY {
            READ_ONLY_VERBS
        } else {
            READ_WRITE_VERBS
        }
    }

    fn plural_name() -> String {
        Self::plural(&()).into_owned()
    }

    fn kind_name() -> String {
        Self::kind(&()).into_owned()
    }

    /// `llamas.farm.example.com`, as errors and authorization name a resource.
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

/// The static facts of a kind, for discovery and OpenAPI (which are not generic).
#[derive(Debug, Clone)]
pub struct ResourceInfo {
    pub plural: String,
    pub singular: &'static str,
    pub kind: String,
    pub short_names: &'static [&'static str],
    pub categories: &'static [&'static str],
    pub verbs: &'static [&'static str],
    pub description: &'static str,
    pub read_only: bool,
    /// Builds the OpenAPI schema of `.spec` (and `.status`) in a given generator.
    pub schema: fn(&mut SchemaGenerator) -> (Schema, Option<Schema>),
}

impl ResourceInfo {
    pub fn of<K: ServedResource>() -> Self {
        Self {
            plural: K::plural_name(),
            singular: K::SINGULAR,
            kind: K::kind_name(),
            short_names: K::shortnames(),
            categories: K::CATEGORIES,
            verbs: K::verbs(),
            description: K::DESCRIPTION,
            read_only: K::READ_ONLY,
            schema: |generator| {
                (
                    generator.subschema_for::<K::Spec>(),
                    K::status_schema(generator),
                )
            },
        }
    }
}

/// The metadata key of an object: namespace and name. Ordered as etcd orders keys.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectKey {
    pub namespace: String,
    pub name: String,
}

impl ObjectKey {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    pub fn of(meta: &ObjectMeta) -> Self {
        Self {
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: meta.name.clone().unwrap_or_default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use kube::CustomResourceExt;

    use super::ServedResource;
    use crate::resources::{FarmPod, Llama};

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
        names_agree::<Llama>();
        names_agree::<FarmPod>();
        assert_eq!(FarmPod::shortnames(), ["fp"]);
        assert_eq!(Llama::shortnames(), ["ll"]);
    }
}
