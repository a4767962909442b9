//! Llama: a namespaced, writable kind kept in the server's own store.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{
    columns::{AGE_COLUMN, ColumnDefinition, age},
    error::FieldError,
    resource::ServedResource,
};

/// LlamaSpec describes one llama of the farm.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "farm.example.com",
    version = "v1alpha",
    kind = "Llama",
    plural = "llamas",
    namespaced,
    shortname = "ll",
    category = "farm"
)]
pub struct LlamaSpec {
    /// Weight of the llama in kilograms. Must be a finite number greater than 0.
    #[serde(serialize_with = "crate::resource::serialize_float64")]
    pub weight: f64,
    /// Height of the llama at the shoulder, in metres. Must be a finite number greater than 0.
    #[serde(serialize_with = "crate::resource::serialize_float64")]
    pub height: f64,
}

/// Kubernetes' `number` is a float64, stored and served as sent: a JSON patch `test` of the
/// value a GET showed then matches.
fn positive(field: &str, value: f64) -> Option<FieldError> {
    if value.is_finite() && value > 0.0 {
        None
    } else {
        Some(FieldError::invalid(
            field,
            value,
            "must be a finite number greater than 0",
        ))
    }
}

fn number(value: f64) -> Value {
    crate::resource::float64_value(value)
}

impl ServedResource for Llama {
    type Spec = LlamaSpec;

    const SINGULAR: &'static str = "llama";
    const CATEGORIES: &'static [&'static str] = &["farm"];
    const DESCRIPTION: &'static str = "Llama is a llama of the farm, kept by farm-apiserver.";

    fn columns() -> Vec<ColumnDefinition> {
        vec![
            ColumnDefinition::new("Weight", "number", "Weight of the llama in kilograms.")
                .format("double"),
            ColumnDefinition::new("Height", "number", "Height of the llama in metres.")
                .format("double"),
            AGE_COLUMN,
        ]
    }

    fn cells(&self, now: jiff::Timestamp) -> Vec<Value> {
        vec![
            number(self.spec.weight),
            number(self.spec.height),
            age(&self.metadata, now),
        ]
    }

    fn validate(&self) -> Vec<FieldError> {
        positive("spec.weight", self.spec.weight)
            .into_iter()
            .chain(positive("spec.height", self.spec.height))
            .collect()
    }

    fn spec_changed(&self, old: &Self) -> bool {
        self.spec != old.spec
    }
}

/// The sample the standalone store starts with: the seed's `default/dolly`.
pub fn sample() -> Llama {
    Llama {
        metadata: ObjectMeta {
            name: Some("dolly".into()),
            namespace: Some("default".into()),
            uid: Some(uuid::Uuid::new_v4().to_string()),
            generation: Some(1),
            creation_timestamp: Some(crate::resource::now()),
            ..Default::default()
        },
        spec: LlamaSpec {
            weight: 31.4,
            height: 0.5,
        },
    }
}

/// What a memory store of Llamas starts with: the sample `default/dolly` when `sample`, then
/// `synthetic` generated Llamas (benchmarks).
pub fn seed(sample: bool, synthetic: usize) -> impl Iterator<Item = Llama> + Send + 'static {
    sample
        .then(self::sample)
        .into_iter()
        .chain((0..synthetic).map(self::synthetic))
}

/// Generated Llama `llama-<i>` in namespace `bench-<i % 10>`, for benchmarks.
pub fn synthetic(i: usize) -> Llama {
    let mut llama = sample();
    llama.metadata.name = Some(format!("llama-{i}"));
    llama.metadata.namespace = Some(format!("bench-{}", i % 10));
    llama.spec.weight = 20.0 + (i % 100) as f64;
    llama
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_rejects_non_positive_and_non_finite() {
        let mut llama = sample();
        assert!(llama.validate().is_empty());
        llama.spec.weight = -1.0;
        llama.spec.height = f64::INFINITY;
        let errors = llama.validate();
        assert_eq!(errors.len(), 2);
        assert_eq!(errors[0].field, "spec.weight");
        assert_eq!(errors[1].field, "spec.height");
    }

    #[test]
    fn cells_keep_the_typed_digits() {
        let cells = sample().cells(jiff::Timestamp::now());
        assert_eq!(cells[0].to_string(), "31.4");
        assert_eq!(cells[1].to_string(), "0.5");
    }

    #[test]
    fn serializes_with_type_meta() {
        let json = serde_json::to_value(sample()).unwrap();
        assert_eq!(json["apiVersion"], "farm.example.com/v1alpha");
        assert_eq!(json["kind"], "Llama");
        assert_eq!(json["spec"]["weight"].as_f64().unwrap(), 31.4);
    }
}
