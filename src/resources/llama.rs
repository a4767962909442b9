//! Llama: a namespaced, writable kind kept in the server's own store, served at two versions.
//! `v1` (the storage version unless `--storage-version v1alpha`) names its units:
//! `spec.weightKg`, `spec.heightMetres`, and has an optional `spec.nickname`; `v1alpha`, the
//! first release's, has `spec.weight` and `spec.height`. Each converts to the other without
//! loss: v1alpha keeps v1's nickname in the annotation [`NICKNAME_ANNOTATION`] (which readers
//! of v1 never see), as HorizontalPodAutoscaler's `autoscaling/v1` keeps what only v2 has.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;

use aggregated_apiserver::{
    error::FieldError,
    resource::columns::{AGE_COLUMN, ColumnDefinition, age},
    resource::{ServedResource, VersionOf},
};

pub use v1alpha::{Llama, LlamaSpec};

/// Where a v1alpha Llama keeps v1's `spec.nickname`, which v1alpha has no field for. Reserved:
/// a v1 Llama may not carry it.
pub const NICKNAME_ANNOTATION: &str = "farm.example.com/v1-nickname";

/// Kubernetes' `number` is a float64, stored and served as sent: a JSON patch `test` of the
/// value a GET showed then matches. The schema says the same (`exclusiveMinimum`), in the words
/// kube-apiserver gives a custom resource.
fn positive(field: &str, value: f64) -> Option<FieldError> {
    if value.is_finite() && value > 0.0 {
        None
    } else {
        Some(FieldError::invalid(
            field,
            aggregated_apiserver::json_patch::go_float(value),
            &format!("{field} in body should be greater than 0"),
        ))
    }
}

fn number(value: f64) -> Value {
    aggregated_apiserver::resource::float64_value(value)
}

/// The Table columns of both versions: the same figures under the same names.
fn columns() -> Vec<ColumnDefinition> {
    vec![
        ColumnDefinition::new("Weight", "number", "Weight of the llama in kilograms.")
            .format("double"),
        ColumnDefinition::new("Height", "number", "Height of the llama in metres.")
            .format("double"),
        AGE_COLUMN,
    ]
}

const DESCRIPTION: &str = "Llama is a llama of the farm, kept by farm-apiserver.";

/// `farm.example.com/v1alpha`, the first release's Llama.
pub mod v1alpha {
    use kube::CustomResource;
    use schemars::JsonSchema;
    use serde::{Deserialize, Serialize};

    use super::*;

    /// LlamaSpec describes one llama of the farm.
    #[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
    #[kube(
        group = "farm.example.com",
        version = "v1alpha",
        kind = "Llama",
        plural = "llamas",
        namespaced,
        shortname = "ll",
        category = "farm",
        derive = "PartialEq"
    )]
    pub struct LlamaSpec {
        /// Weight of the llama in kilograms. Must be a finite number greater than 0.
        #[serde(serialize_with = "aggregated_apiserver::resource::serialize_float64")]
        #[schemars(extend("minimum" = 0, "exclusiveMinimum" = true))]
        pub weight: f64,
        /// Height of the llama at the shoulder, in metres. Must be a finite number greater than 0.
        #[serde(serialize_with = "aggregated_apiserver::resource::serialize_float64")]
        #[schemars(extend("minimum" = 0, "exclusiveMinimum" = true))]
        pub height: f64,
    }

    impl ServedResource for Llama {
        type Spec = LlamaSpec;

        const SINGULAR: &'static str = "llama";
        const CATEGORIES: &'static [&'static str] = &["farm"];
        const DESCRIPTION: &'static str = DESCRIPTION;

        fn columns() -> Vec<ColumnDefinition> {
            columns()
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

        fn decode_stored(json: &[u8]) -> serde_json::Result<Self> {
            aggregated_apiserver::resource::decode_either::<Self, super::v1::Llama>(json)
        }
    }
}

/// `farm.example.com/v1`: units in the field names, and a nickname.
pub mod v1 {
    use kube::CustomResource;
    use schemars::JsonSchema;
    use serde::{Deserialize, Serialize};

    use super::*;

    /// LlamaSpec describes one llama of the farm.
    #[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
    #[kube(
        group = "farm.example.com",
        version = "v1",
        kind = "Llama",
        plural = "llamas",
        namespaced,
        shortname = "ll",
        category = "farm",
        derive = "PartialEq"
    )]
    #[serde(rename_all = "camelCase")]
    pub struct LlamaSpec {
        /// Weight of the llama in kilograms. Must be a finite number greater than 0.
        #[serde(serialize_with = "aggregated_apiserver::resource::serialize_float64")]
        #[schemars(extend("minimum" = 0, "exclusiveMinimum" = true))]
        pub weight_kg: f64,
        /// Height of the llama at the shoulder, in metres. Must be a finite number greater than 0.
        #[serde(serialize_with = "aggregated_apiserver::resource::serialize_float64")]
        #[schemars(extend("minimum" = 0, "exclusiveMinimum" = true))]
        pub height_metres: f64,
        /// What the farm calls the llama (at most 63 characters).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schemars(length(max = 63))]
        pub nickname: Option<String>,
    }

    impl ServedResource for Llama {
        type Spec = LlamaSpec;

        const SINGULAR: &'static str = "llama";
        const CATEGORIES: &'static [&'static str] = &["farm"];
        const DESCRIPTION: &'static str = DESCRIPTION;

        fn columns() -> Vec<ColumnDefinition> {
            columns()
        }

        fn cells(&self, now: jiff::Timestamp) -> Vec<Value> {
            vec![
                number(self.spec.weight_kg),
                number(self.spec.height_metres),
                age(&self.metadata, now),
            ]
        }

        fn validate(&self) -> Vec<FieldError> {
            let mut errors: Vec<FieldError> = positive("spec.weightKg", self.spec.weight_kg)
                .into_iter()
                .chain(positive("spec.heightMetres", self.spec.height_metres))
                .collect();
            if let Some(nickname) = &self.spec.nickname
                && nickname.len() > 63
            {
                errors.push(FieldError::too_long("spec.nickname", nickname, 63));
            }
            if let Some(value) = self
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(NICKNAME_ANNOTATION))
            {
                errors.push(FieldError::forbidden(
                    &format!("metadata.annotations[{NICKNAME_ANNOTATION}]"),
                    value,
                    "reserved for v1alpha's view of spec.nickname",
                ));
            }
            errors
        }

        fn spec_changed(&self, old: &Self) -> bool {
            self.spec != old.spec
        }

        fn decode_stored(json: &[u8]) -> serde_json::Result<Self> {
            aggregated_apiserver::resource::decode_either::<Self, super::v1alpha::Llama>(json)
        }
    }
}

/// v1's metadata at v1alpha: the nickname, when there is one, in [`NICKNAME_ANNOTATION`].
fn down_meta(meta: &ObjectMeta, nickname: Option<&String>) -> ObjectMeta {
    let mut meta = meta.clone();
    if let Some(nickname) = nickname {
        meta.annotations
            .get_or_insert_with(Default::default)
            .insert(NICKNAME_ANNOTATION.to_owned(), nickname.clone());
    }
    meta
}

/// v1alpha's metadata at v1: the annotation taken out (none left: no annotations), and the
/// nickname it held.
fn up_meta(meta: &ObjectMeta) -> (ObjectMeta, Option<String>) {
    let mut meta = meta.clone();
    let nickname = meta
        .annotations
        .as_mut()
        .and_then(|a| a.remove(NICKNAME_ANNOTATION));
    if nickname.is_some() && meta.annotations.as_ref().is_some_and(|a| a.is_empty()) {
        meta.annotations = None;
    }
    (meta, nickname)
}

fn down(llama: &v1::Llama) -> v1alpha::Llama {
    v1alpha::Llama {
        metadata: down_meta(&llama.metadata, llama.spec.nickname.as_ref()),
        spec: v1alpha::LlamaSpec {
            weight: llama.spec.weight_kg,
            height: llama.spec.height_metres,
        },
    }
}

/// A v1alpha Llama at v1; without the annotation, the nickname is `current`'s (an update
/// through v1alpha keeps what it cannot see).
fn up(llama: &v1alpha::Llama, current: Option<&v1::Llama>) -> v1::Llama {
    let (metadata, nickname) = up_meta(&llama.metadata);
    v1::Llama {
        metadata,
        spec: v1::LlamaSpec {
            weight_kg: llama.spec.weight,
            height_metres: llama.spec.height,
            nickname: nickname.or_else(|| current.and_then(|c| c.spec.nickname.clone())),
        },
    }
}

impl VersionOf<v1::Llama> for v1alpha::Llama {
    fn from_stored(stored: &v1::Llama) -> Self {
        down(stored)
    }

    fn to_stored(&self, current: Option<&v1::Llama>) -> v1::Llama {
        up(self, current)
    }
}

impl VersionOf<v1alpha::Llama> for v1::Llama {
    fn from_stored(stored: &v1alpha::Llama) -> Self {
        up(stored, None)
    }

    fn to_stored(&self, _current: Option<&v1alpha::Llama>) -> v1alpha::Llama {
        down(self)
    }
}

/// The sample the standalone store starts with: the seed's `default/dolly`.
pub fn sample() -> v1::Llama {
    v1::Llama {
        metadata: ObjectMeta {
            name: Some("dolly".into()),
            namespace: Some("default".into()),
            uid: Some(uuid::Uuid::new_v4().to_string()),
            generation: Some(1),
            creation_timestamp: Some(aggregated_apiserver::resource::now()),
            ..Default::default()
        },
        spec: v1::LlamaSpec {
            weight_kg: 31.4,
            height_metres: 0.5,
            nickname: None,
        },
    }
}

/// What a memory store of Llamas starts with: the sample `default/dolly` when `sample`, then
/// `synthetic` generated Llamas (benchmarks), at the version `K` the store holds.
pub fn seed<K: VersionOf<v1::Llama>>(
    sample: bool,
    synthetic: usize,
) -> impl Iterator<Item = K> + Send + 'static {
    sample
        .then(self::sample)
        .into_iter()
        .chain((0..synthetic).map(self::synthetic))
        .map(|llama| K::from_stored(&llama))
}

/// Generated Llama `llama-<i>` in namespace `bench-<i % 10>`, for benchmarks.
pub fn synthetic(i: usize) -> v1::Llama {
    let mut llama = sample();
    llama.metadata.name = Some(format!("llama-{i}"));
    llama.metadata.namespace = Some(format!("bench-{}", i % 10));
    llama.spec.weight_kg = 20.0 + (i % 100) as f64;
    llama
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_rejects_non_positive_and_non_finite() {
        let mut llama = Llama::from_stored(&sample());
        assert!(llama.validate().is_empty());
        llama.spec.weight = -1.0;
        llama.spec.height = f64::INFINITY;
        let errors = llama.validate();
        assert_eq!(errors.len(), 2);
        assert_eq!(errors[0].field, "spec.weight");
        assert_eq!(errors[1].field, "spec.height");
    }

    #[test]
    fn v1_refuses_the_annotation_v1alpha_keeps_its_nickname_in() {
        let mut llama = sample();
        assert!(llama.validate().is_empty());
        llama.metadata.annotations = Some([(NICKNAME_ANNOTATION.into(), "x".into())].into());
        llama.spec.nickname = Some("n".repeat(64));
        let fields: Vec<_> = llama.validate().into_iter().map(|e| e.field).collect();
        assert_eq!(
            fields,
            [
                "spec.nickname".to_string(),
                format!("metadata.annotations[{NICKNAME_ANNOTATION}]")
            ]
        );
    }

    #[test]
    fn cells_keep_the_typed_digits() {
        let cells = sample().cells(jiff::Timestamp::now());
        assert_eq!(cells[0].to_string(), "31.4");
        assert_eq!(cells[1].to_string(), "0.5");
    }

    #[test]
    fn serializes_with_type_meta() {
        let json = serde_json::to_value(Llama::from_stored(&sample())).unwrap();
        assert_eq!(json["apiVersion"], "farm.example.com/v1alpha");
        assert_eq!(json["kind"], "Llama");
        assert_eq!(json["spec"]["weight"].as_f64().unwrap(), 31.4);
        let json = serde_json::to_value(sample()).unwrap();
        assert_eq!(json["apiVersion"], "farm.example.com/v1");
        assert_eq!(json["spec"]["weightKg"].as_f64().unwrap(), 31.4);
        assert_eq!(json["spec"]["heightMetres"].as_f64().unwrap(), 0.5);
        assert!(json["spec"].get("nickname").is_none());
    }

    #[test]
    fn an_update_through_v1alpha_keeps_the_nickname_it_cannot_see() {
        let mut stored = sample();
        stored.spec.nickname = Some("Dolly the Great".into());
        let mut seen = Llama::from_stored(&stored);
        // A client that drops the annotation (a replace from its own file) keeps the nickname.
        seen.metadata.annotations = None;
        seen.spec.weight = 40.0;
        let written = seen.to_stored(Some(&stored));
        assert_eq!(written.spec.nickname.as_deref(), Some("Dolly the Great"));
        assert_eq!(written.spec.weight_kg, 40.0);
        assert_eq!(written.metadata.annotations, None);
    }
}
