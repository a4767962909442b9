//! Placard, a view of the cluster's ConfigMaps declared in the test crate alone, in one file:
//! its type (kube's derive), what it declares as a served kind (`ServedResource`) and what it is
//! a view of (`View`: the kind, and how one object projects). `adding_a_view` adds it to the
//! binary's kinds with one line.

use aggregated_apiserver::{
    resource::ServedResource,
    resource::columns::{AGE_COLUMN, ColumnDefinition, age},
    store::View,
};
use k8s_openapi::{api::core::v1::ConfigMap, apimachinery::pkg::apis::meta::v1::ObjectMeta};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What a ConfigMap of the cluster shows on the farm's notice board: its keys.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "farm.example.com",
    version = "v1alpha",
    kind = "Placard",
    plural = "placards",
    namespaced,
    shortname = "pl",
    category = "farm",
    derive = "PartialEq"
)]
pub struct PlacardSpec {
    /// The ConfigMap's keys (of `data`), in order.
    pub keys: Vec<String>,
}

impl ServedResource for Placard {
    type Spec = PlacardSpec;
    const SINGULAR: &'static str = "placard";
    const CATEGORIES: &'static [&'static str] = &["farm"];
    const DESCRIPTION: &'static str =
        "Placard is a ConfigMap of the cluster as the farm's notice board shows it (a test kind).";

    fn columns() -> Vec<ColumnDefinition> {
        vec![
            ColumnDefinition::new("Keys", "integer", "How many keys the ConfigMap has."),
            AGE_COLUMN,
        ]
    }

    fn cells(&self, now: jiff::Timestamp) -> Vec<Value> {
        vec![Value::from(self.spec.keys.len()), age(&self.metadata, now)]
    }
}

impl View for Placard {
    type Of = ConfigMap;

    fn project(map: &ConfigMap) -> Self {
        let meta = &map.metadata;
        Placard {
            metadata: ObjectMeta {
                name: meta.name.clone(),
                namespace: meta.namespace.clone(),
                uid: meta.uid.clone(),
                resource_version: meta.resource_version.clone(),
                creation_timestamp: meta.creation_timestamp.clone(),
                labels: meta.labels.clone(),
                generation: Some(1),
                ..Default::default()
            },
            spec: PlacardSpec {
                keys: map
                    .data
                    .as_ref()
                    .map(|data| data.keys().cloned().collect())
                    .unwrap_or_default(),
            },
        }
    }
}
