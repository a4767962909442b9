//! A kind in two versions: v1alpha's `weight` is v1's `weightKg`; v1's `nickname` has no
//! v1alpha field (SMD's converter drops it there, as a conversion to an older version does).

use super::*;

const V1: &str = "farm.example.com/v1";

fn v1_schema() -> Schema {
    let components = json!({
        "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta": {"type": "object", "properties": {
            "name": {"type": "string"}, "namespace": {"type": "string"}, "uid": {"type": "string"},
            "resourceVersion": {"type": "string"},
            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            "managedFields": {"type": "array", "x-kubernetes-list-type": "atomic",
                "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
        }},
    });
    let root = json!({"type": "object", "properties": {
        "apiVersion": {"type": "string"}, "kind": {"type": "string"},
        "metadata": {"allOf": [{"$ref": "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}], "default": {}},
        "spec": {"type": "object", "properties": {
            "weightKg": {"type": "number"}, "heightMetres": {"type": "number"}, "nickname": {"type": "string"}}},
        "status": {"type": "object", "properties": {"phase": {"type": "string"}, "ready": {"type": "boolean"}}},
    }});
    Schema::from_openapi_v3(&root, components.as_object().expect("components")).expect("schema")
}

#[derive(Debug)]
struct Two {
    v1alpha: Schema,
    v1: Schema,
}

/// Renames the spec's fields; what the target lacks is dropped.
fn rename(object: &Value, version: &str, names: &[(&str, &str)]) -> Value {
    let mut out = object.clone();
    out["apiVersion"] = json!(version);
    if let Some(spec) = object.get("spec").and_then(Value::as_object) {
        let mut renamed = serde_json::Map::new();
        for (from, to) in names {
            if let Some(v) = spec.get(*from) {
                renamed.insert((*to).to_string(), v.clone());
            }
        }
        out["spec"] = Value::Object(renamed);
    }
    out
}

impl Versions for Two {
    fn schema(&self, version: &str) -> Option<&Schema> {
        match version {
            AV => Some(&self.v1alpha),
            V1 => Some(&self.v1),
            _ => None,
        }
    }
    fn convert(&self, object: &Value, version: &str) -> Option<Value> {
        let from = object.get("apiVersion")?.as_str()?;
        match (from, version) {
            (a, b) if a == b => Some(object.clone()),
            (AV, V1) => Some(rename(
                object,
                V1,
                &[("weight", "weightKg"), ("height", "heightMetres")],
            )),
            (V1, AV) => Some(rename(
                object,
                AV,
                &[("weightKg", "weight"), ("heightMetres", "height")],
            )),
            _ => None,
        }
    }
}

fn two() -> std::sync::Arc<dyn Versions> {
    std::sync::Arc::new(Two {
        v1alpha: schema(),
        v1: v1_schema(),
    })
}

fn fm_alpha() -> FieldManager {
    FieldManager::new(schema(), AV, "Llama", "").with_versions(two())
}

fn fm_v1() -> FieldManager {
    FieldManager::new(v1_schema(), V1, "Llama", "").with_versions(two())
}

fn versions_of(obj: &Value) -> Vec<(String, String)> {
    mf(obj)
        .as_array()
        .map(|a| {
            a.iter()
                .map(|e| {
                    (
                        e["manager"].as_str().unwrap_or("").to_string(),
                        e["apiVersion"].as_str().unwrap_or("").to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

fn v1_llama(spec: Value) -> Value {
    json!({"apiVersion": V1, "kind": "Llama", "metadata": {"name": "l", "namespace": "ns"}, "spec": spec})
}

#[test]
fn a_manager_at_another_version_keeps_its_fields_and_conflicts_there() {
    // alice applies weight through v1alpha.
    let live = stored(
        fm_alpha()
            .apply(None, &llama(json!({"weight": 10.0})), "alice", false, NOW)
            .expect("create"),
    );
    // The object is read through v1: alice's entry stays at v1alpha.
    let live_v1 = Two {
        v1alpha: schema(),
        v1: v1_schema(),
    }
    .convert(&live, V1)
    .expect("convert");
    // bob applies the height through v1: no conflict, and alice keeps her entry.
    let after = fm_v1()
        .apply(
            Some(&live_v1),
            &v1_llama(json!({"heightMetres": 1.5})),
            "bob",
            false,
            LATER,
        )
        .expect("no conflict");
    assert_eq!(
        versions_of(&after),
        [
            ("alice".to_string(), AV.to_string()),
            ("bob".to_string(), V1.to_string())
        ]
    );
    // bob applies the weight through v1: it is alice's field at v1alpha.
    let err = fm_v1()
        .apply(
            Some(&after),
            &v1_llama(json!({"heightMetres": 1.5, "weightKg": 12.0})),
            "bob",
            false,
            LATER,
        )
        .expect_err("conflict");
    assert_eq!(
        err.to_string(),
        "Apply failed with 1 conflict: conflict with \"alice\": .spec.weight"
    );
    // Forced: bob takes it, and alice, owning nothing else, is gone.
    let forced = fm_v1()
        .apply(
            Some(&after),
            &v1_llama(json!({"heightMetres": 1.5, "weightKg": 12.0})),
            "bob",
            true,
            LATER,
        )
        .expect("forced");
    assert_eq!(versions_of(&forced), [("bob".to_string(), V1.to_string())]);
    assert_eq!(forced["spec"]["weightKg"], json!(12.0));
}

#[test]
fn an_update_at_another_version_takes_the_changed_field_from_its_owner() {
    let live = stored(
        fm_alpha()
            .apply(
                None,
                &llama(json!({"weight": 10.0, "height": 1.0})),
                "alice",
                false,
                NOW,
            )
            .expect("create"),
    );
    let two = Two {
        v1alpha: schema(),
        v1: v1_schema(),
    };
    let live_v1 = two.convert(&live, V1).expect("convert");
    let mut new = live_v1.clone();
    new["spec"]["weightKg"] = json!(11.0);
    fm_v1().update_no_errors(Some(&live_v1), &mut new, "kubectl-edit", LATER);
    let owners = versions_of(&new);
    assert_eq!(
        owners,
        [
            ("alice".to_string(), AV.to_string()),
            ("kubectl-edit".to_string(), V1.to_string())
        ]
    );
    // alice now owns only the height, at v1alpha.
    let alice = &mf(&new)[0]["fieldsV1"];
    assert_eq!(alice, &json!({"f:spec": {"f:height": {}}}));
    let editor = &mf(&new)[1]["fieldsV1"];
    assert_eq!(editor, &json!({"f:spec": {"f:weightKg": {}}}));
}

#[test]
fn an_applier_at_another_version_prunes_what_it_stopped_applying() {
    // alice applies weight and height through v1alpha, then applies only the weight through
    // v1: the height she applied before (at v1alpha) is removed.
    let live = stored(
        fm_alpha()
            .apply(
                None,
                &llama(json!({"weight": 10.0, "height": 1.0})),
                "alice",
                false,
                NOW,
            )
            .expect("create"),
    );
    let two = Two {
        v1alpha: schema(),
        v1: v1_schema(),
    };
    let live_v1 = two.convert(&live, V1).expect("convert");
    let after = fm_v1()
        .apply(
            Some(&live_v1),
            &v1_llama(json!({"weightKg": 10.0})),
            "alice",
            false,
            LATER,
        )
        .expect("apply");
    assert_eq!(after["spec"], json!({"weightKg": 10.0}));
    assert_eq!(versions_of(&after), [("alice".to_string(), V1.to_string())]);
}

#[test]
fn a_set_at_a_version_the_kind_lacks_is_dropped() {
    let mut live = stored(
        fm_alpha()
            .apply(None, &llama(json!({"weight": 10.0})), "alice", false, NOW)
            .expect("create"),
    );
    live["metadata"]["managedFields"][0]["apiVersion"] = json!("farm.example.com/v0");
    let mut new = live.clone();
    new["spec"]["height"] = json!(2.0);
    fm_alpha().update_no_errors(Some(&live), &mut new, "bob", LATER);
    assert_eq!(versions_of(&new), [("bob".to_string(), AV.to_string())]);
}
