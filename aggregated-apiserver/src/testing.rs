//! The kinds the library's own tests serve: Zebra at `zoo.example.com/v1alpha` (spec weight and
//! height) and at `v1` (the same figures, stored), and Stripe, a view of the cluster's
//! ConfigMaps. Servers of real kinds declare theirs in their own crates.

use k8s_openapi::{api::core::v1::ConfigMap, apimachinery::pkg::apis::meta::v1::ObjectMeta};
use serde_json::Value;

use crate::{
    error::FieldError,
    resource::columns::{AGE_COLUMN, ColumnDefinition, age},
    resource::{ServedResource, VersionOf},
    store::View,
};

pub use v1alpha::{Zebra, ZebraSpec};

fn columns() -> Vec<ColumnDefinition> {
    vec![
        ColumnDefinition::new("Weight", "number", "Weight in kilograms.").format("double"),
        ColumnDefinition::new("Height", "number", "Height in metres.").format("double"),
        AGE_COLUMN,
    ]
}

fn positive(field: &str, value: f64) -> Option<FieldError> {
    (!(value.is_finite() && value > 0.0)).then(|| {
        FieldError::invalid(
            field,
            crate::json_patch::go_float(value),
            "must be greater than 0",
        )
    })
}

/// `zoo.example.com/v1alpha`.
pub(crate) mod v1alpha {
    use kube::CustomResource;
    use schemars::JsonSchema;
    use serde::{Deserialize, Serialize};

    use super::*;

    /// ZebraSpec describes one zebra.
    #[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
    #[kube(
        group = "zoo.example.com",
        version = "v1alpha",
        kind = "Zebra",
        plural = "zebras",
        namespaced,
        shortname = "zb",
        category = "zoo",
        derive = "PartialEq"
    )]
    pub struct ZebraSpec {
        /// Weight in kilograms.
        #[serde(serialize_with = "crate::resource::serialize_float64")]
        pub weight: f64,
        /// Height in metres.
        #[serde(serialize_with = "crate::resource::serialize_float64")]
        pub height: f64,
    }

    impl ServedResource for Zebra {
        type Spec = ZebraSpec;
        const SINGULAR: &'static str = "zebra";
        const CATEGORIES: &'static [&'static str] = &["zoo"];
        const DESCRIPTION: &'static str = "Zebra is a kind of the library's tests.";

        fn columns() -> Vec<ColumnDefinition> {
            columns()
        }

        fn cells(&self, now: jiff::Timestamp) -> Vec<Value> {
            vec![
                crate::resource::float64_value(self.spec.weight),
                crate::resource::float64_value(self.spec.height),
                age(&self.metadata, now),
            ]
        }

        fn validate(&self) -> Vec<FieldError> {
            positive("spec.weight", self.spec.weight)
                .into_iter()
                .chain(positive("spec.height", self.spec.height))
                .collect()
        }
    }
}

/// `zoo.example.com/v1`, the stored version.
pub(crate) mod v1 {
    use kube::CustomResource;
    use schemars::JsonSchema;
    use serde::{Deserialize, Serialize};

    use super::*;

    /// ZebraSpec describes one zebra.
    #[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
    #[kube(
        group = "zoo.example.com",
        version = "v1",
        kind = "Zebra",
        plural = "zebras",
        namespaced,
        shortname = "zb",
        category = "zoo",
        derive = "PartialEq"
    )]
    pub struct ZebraSpec {
        /// Weight in kilograms.
        #[serde(serialize_with = "crate::resource::serialize_float64")]
        pub weight: f64,
        /// Height in metres.
        #[serde(serialize_with = "crate::resource::serialize_float64")]
        pub height: f64,
    }

    impl ServedResource for Zebra {
        type Spec = ZebraSpec;
        const SINGULAR: &'static str = "zebra";
        const CATEGORIES: &'static [&'static str] = &["zoo"];
        const DESCRIPTION: &'static str = "Zebra is a kind of the library's tests.";

        fn columns() -> Vec<ColumnDefinition> {
            columns()
        }

        fn cells(&self, now: jiff::Timestamp) -> Vec<Value> {
            vec![
                crate::resource::float64_value(self.spec.weight),
                crate::resource::float64_value(self.spec.height),
                age(&self.metadata, now),
            ]
        }
    }
}

impl VersionOf<v1::Zebra> for v1alpha::Zebra {
    fn from_stored(stored: &v1::Zebra) -> Self {
        Self {
            metadata: stored.metadata.clone(),
            spec: ZebraSpec {
                weight: stored.spec.weight,
                height: stored.spec.height,
            },
        }
    }

    fn to_stored(&self, _current: Option<&v1::Zebra>) -> v1::Zebra {
        v1::Zebra {
            metadata: self.metadata.clone(),
            spec: v1::ZebraSpec {
                weight: self.spec.weight,
                height: self.spec.height,
            },
        }
    }
}

impl VersionOf<v1alpha::Zebra> for v1::Zebra {
    fn from_stored(stored: &v1alpha::Zebra) -> Self {
        stored.to_stored(None)
    }

    fn to_stored(&self, _current: Option<&v1alpha::Zebra>) -> v1alpha::Zebra {
        v1alpha::Zebra::from_stored(self)
    }
}

/// Marty, in `default`, at v1.
pub fn sample() -> v1::Zebra {
    v1::Zebra {
        metadata: ObjectMeta {
            name: Some("marty".into()),
            namespace: Some("default".into()),
            uid: Some(uuid::Uuid::new_v4().to_string()),
            generation: Some(1),
            creation_timestamp: Some(crate::resource::now()),
            ..Default::default()
        },
        spec: v1::ZebraSpec {
            weight: 31.4,
            height: 0.5,
        },
    }
}

/// `zebra-<i>` in `bench-<i % 10>`, at v1.
pub fn synthetic(i: usize) -> v1::Zebra {
    let mut zebra = sample();
    zebra.metadata.name = Some(format!("zebra-{i}"));
    zebra.metadata.namespace = Some(format!("bench-{}", i % 10));
    zebra.spec.weight = 20.0 + (i % 100) as f64;
    zebra
}

/// StripeSpec is what a Stripe shows of its ConfigMap.
#[derive(
    kube::CustomResource,
    Clone,
    Debug,
    Default,
    PartialEq,
    serde::Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
)]
#[kube(
    group = "zoo.example.com",
    version = "v1",
    kind = "Stripe",
    plural = "stripes",
    namespaced,
    shortname = "st",
    derive = "PartialEq"
)]
pub struct StripeSpec {
    /// How many keys the ConfigMap has.
    pub keys: u32,
}

impl ServedResource for Stripe {
    type Spec = StripeSpec;
    const SINGULAR: &'static str = "stripe";
    const CATEGORIES: &'static [&'static str] = &[];
    const DESCRIPTION: &'static str = "Stripe is a view of a ConfigMap, for the library's tests.";

    fn columns() -> Vec<ColumnDefinition> {
        vec![AGE_COLUMN]
    }

    fn cells(&self, now: jiff::Timestamp) -> Vec<Value> {
        vec![age(&self.metadata, now)]
    }
}

impl View for Stripe {
    type Of = ConfigMap;

    fn project(map: &ConfigMap) -> Self {
        Self {
            metadata: ObjectMeta {
                name: map.metadata.name.clone(),
                namespace: map.metadata.namespace.clone(),
                resource_version: map.metadata.resource_version.clone(),
                ..Default::default()
            },
            spec: StripeSpec {
                keys: map.data.as_ref().map_or(0, |d| d.len() as u32),
            },
        }
    }
}
