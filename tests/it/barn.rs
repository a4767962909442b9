//! Barn, a kind of the test crate alone, in one file: its type (kube's derive) and what it
//! declares as a served kind (`ServedResource`): a status subresource, columns, strategy hooks
//! and a selectable field. `third_kind` serves it with `ApiGroup::serve`; `adding_a_kind` adds
//! it to the binary's kinds with one line.

use aggregated_apiserver::{
    error::FieldError,
    resource::ServedResource,
    resource::columns::{AGE_COLUMN, ColumnDefinition, age},
};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// A barn of the farm.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "farm.example.com",
    version = "v1alpha",
    kind = "Barn",
    plural = "barns",
    namespaced,
    status = "BarnStatus",
    shortname = "bn",
    category = "farm"
)]
pub struct BarnSpec {
    /// Colour of the barn; defaults to red.
    #[serde(default)]
    pub color: String,
    /// Stalls in the barn; fixed once built.
    pub stalls: u32,
}

/// What the barn's controller observed.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct BarnStatus {
    /// Whether the barn is ready for llamas.
    pub ready: bool,
    /// What the controller last did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl ServedResource for Barn {
    type Spec = BarnSpec;
    const STATUS_SUBRESOURCE: bool = true;

    fn set_status_from(&mut self, from: &Self) {
        self.status = from.status.clone();
    }

    fn status_schema(generator: &mut schemars::SchemaGenerator) -> Option<schemars::Schema> {
        Some(generator.subschema_for::<BarnStatus>())
    }

    const SINGULAR: &'static str = "barn";
    const CATEGORIES: &'static [&'static str] = &["farm"];
    const DESCRIPTION: &'static str = "Barn is a barn of the farm (a test kind).";
    const SELECTABLE_FIELDS: &'static [&'static str] = &["spec.color"];

    fn columns() -> Vec<ColumnDefinition> {
        vec![
            ColumnDefinition::new("Color", "string", "Colour of the barn."),
            AGE_COLUMN,
        ]
    }

    fn cells(&self, now: jiff::Timestamp) -> Vec<Value> {
        vec![json!(self.spec.color), age(&self.metadata, now)]
    }

    fn prepare_for_create(&mut self) {
        // The status is the controller's, written through /status only.
        self.status = None;
        if self.spec.color.is_empty() {
            self.spec.color = "red".into();
        }
    }

    fn validate_update(&self, old: &Self) -> Vec<FieldError> {
        (self.spec.stalls != old.spec.stalls)
            .then(|| FieldError::invalid("spec.stalls", self.spec.stalls, "field is immutable"))
            .into_iter()
            .collect()
    }

    fn warnings(&self, _old: Option<&Self>) -> Vec<String> {
        (self.spec.stalls > 100)
            .then(|| "more than 100 stalls is a lot of barn".to_owned())
            .into_iter()
            .collect()
    }

    fn field(&self, name: &str) -> Option<String> {
        (name == "spec.color").then(|| self.spec.color.clone())
    }
}

/// Barn's second version, declared in the same file: `spec.stalls` is `spec.stallCount`
/// there; the colour, the selectable field, keeps its name (selectors are evaluated on the
/// stored version). Served beside v1alpha with `ApiGroup::serve_versions` (`versions.rs`).
pub mod v1beta1 {
    use aggregated_apiserver::resource::VersionOf;

    use super::*;

    /// A barn of the farm.
    #[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
    #[kube(
        group = "farm.example.com",
        version = "v1beta1",
        kind = "Barn",
        plural = "barns",
        namespaced,
        status = "BarnStatus",
        shortname = "bn",
        category = "farm"
    )]
    #[serde(rename_all = "camelCase")]
    pub struct BarnSpec {
        /// Colour of the barn; defaults to red.
        #[serde(default)]
        pub color: String,
        /// Stalls in the barn; fixed once built.
        pub stall_count: u32,
    }

    impl ServedResource for Barn {
        type Spec = BarnSpec;
        const STATUS_SUBRESOURCE: bool = true;

        fn set_status_from(&mut self, from: &Self) {
            self.status = from.status.clone();
        }

        fn status_schema(generator: &mut schemars::SchemaGenerator) -> Option<schemars::Schema> {
            Some(generator.subschema_for::<BarnStatus>())
        }

        const SINGULAR: &'static str = "barn";
        const CATEGORIES: &'static [&'static str] = &["farm"];
        const DESCRIPTION: &'static str = "Barn is a barn of the farm (a test kind).";
        const SELECTABLE_FIELDS: &'static [&'static str] = &["spec.color"];

        fn columns() -> Vec<ColumnDefinition> {
            super::Barn::columns()
        }

        fn cells(&self, now: jiff::Timestamp) -> Vec<Value> {
            vec![json!(self.spec.color), age(&self.metadata, now)]
        }

        fn field(&self, name: &str) -> Option<String> {
            (name == "spec.color").then(|| self.spec.color.clone())
        }
    }

    fn up(barn: &super::Barn) -> Barn {
        Barn {
            metadata: barn.metadata.clone(),
            spec: BarnSpec {
                color: barn.spec.color.clone(),
                stall_count: barn.spec.stalls,
            },
            status: barn.status.clone(),
        }
    }

    fn down(barn: &Barn) -> super::Barn {
        super::Barn {
            metadata: barn.metadata.clone(),
            spec: super::BarnSpec {
                color: barn.spec.color.clone(),
                stalls: barn.spec.stall_count,
            },
            status: barn.status.clone(),
        }
    }

    impl VersionOf<super::Barn> for Barn {
        fn from_stored(stored: &super::Barn) -> Self {
            up(stored)
        }
        fn to_stored(&self, _current: Option<&super::Barn>) -> super::Barn {
            down(self)
        }
    }

    impl VersionOf<Barn> for super::Barn {
        fn from_stored(stored: &Barn) -> Self {
            down(stored)
        }
        fn to_stored(&self, _current: Option<&Barn>) -> Barn {
            up(self)
        }
    }
}
