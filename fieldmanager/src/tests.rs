//! Scenario tests for the FieldManager, modelled on apimachinery's
//! `managedfields/internal/*_test.go` with a Llama-like schema.

use serde_json::{Value, json};

use super::managed::encode_json_string;
use super::path::PathElement;
use super::set::FieldSet;
use super::*;

const AV: &str = "farm.example.com/v1alpha";
const NOW: &str = "2026-11-23T15:42:24Z";
const LATER: &str = "2026-11-23T15:50:00Z";

fn schema() -> Schema {
    let components = json!({
        "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta": {"type": "object", "properties": {
            "name": {"type": "string"}, "namespace": {"type": "string"}, "uid": {"type": "string"},
            "resourceVersion": {"type": "string"}, "generation": {"type": "integer"},
            "creationTimestamp": {"type": "string", "format": "date-time"},
            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
            "finalizers": {"type": "array", "items": {"type": "string"}, "x-kubernetes-list-type": "set"},
            "ownerReferences": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["uid"],
                "items": {"type": "object", "properties": {
                    "uid": {"type": "string"}, "name": {"type": "string"}, "kind": {"type": "string"},
                    "apiVersion": {"type": "string"}, "controller": {"type": "boolean"}}}},
            "managedFields": {"type": "array", "x-kubernetes-list-type": "atomic",
                "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
        }},
    });
    let root = json!({"type": "object", "properties": {
        "apiVersion": {"type": "string"}, "kind": {"type": "string"},
        "metadata": {"allOf": [{"$ref": "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}], "default": {}},
        "spec": {"type": "object", "properties": {"weight": {"type": "number"}, "height": {"type": "number"}}},
        "status": {"type": "object", "properties": {"phase": {"type": "string"}, "ready": {"type": "boolean"}}},
    }});
    Schema::from_openapi_v3(&root, components.as_object().expect("components")).expect("schema")
}

fn fm() -> FieldManager {
    let s = schema();
    FieldManager::new(s, AV, "Llama", "").with_status_reset_fields()
}

fn status_fm() -> FieldManager {
    let s = schema();
    FieldManager::new(s, AV, "Llama", "status").with_status_reset_fields()
}

fn llama(spec: Value) -> Value {
    json!({"apiVersion": AV, "kind": "Llama", "metadata": {"name": "l", "namespace": "ns"}, "spec": spec})
}

/// Simulates storage: assigns a uid as the registry would on create.
fn stored(mut obj: Value) -> Value {
    obj["metadata"]["uid"] = json!("0001");
    obj
}

fn mf(obj: &Value) -> &Value {
    &obj["metadata"]["managedFields"]
}

fn mf_string(obj: &Value) -> String {
    encode_json_string(mf(obj)).expect("managedFields")
}

fn entries(obj: &Value) -> Vec<(String, String)> {
    mf(obj)
        .as_array()
        .map(|a| {
            a.iter()
                .map(|e| {
                    (
                        e["manager"].as_str().unwrap_or("").to_string(),
                        e["operation"].as_str().unwrap_or("").to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

fn apply(
    m: &FieldManager,
    live: Option<&Value>,
    cfg: &Value,
    mgr: &str,
    force: bool,
) -> Result<Value, Error> {
    m.apply(live, cfg, mgr, force, NOW).map(stored)
}

#[test]
fn apply_creates_with_exact_managed_fields() {
    let obj = apply(&fm(), None, &llama(json!({"weight": 10})), "m1", false).expect("apply");
    assert_eq!(obj["spec"]["weight"], json!(10));
    assert_eq!(
        mf_string(&obj),
        r#"[{"manager":"m1","operation":"Apply","apiVersion":"farm.example.com/v1alpha","time":"2026-11-23T15:42:24Z","fieldsType":"FieldsV1","fieldsV1":{"f:spec":{"f:weight":{}}}}]"#
    );
}

#[test]
fn reapply_without_field_prunes_it() {
    let m = fm();
    let obj = apply(
        &m,
        None,
        &llama(json!({"weight": 10, "height": 2})),
        "m1",
        false,
    )
    .expect("apply");
    let obj = apply(&m, Some(&obj), &llama(json!({"weight": 10})), "m1", false).expect("apply");
    assert_eq!(obj["spec"], json!({"weight": 10}));
    // Another manager's field is not pruned.
    let mut upd = obj.clone();
    upd["spec"]["height"] = json!(5);
    m.update(Some(&obj), &mut upd, "kubectl-edit", LATER)
        .expect("update");
    let obj = apply(&m, Some(&upd), &llama(json!({})), "m1", false).expect("apply");
    assert_eq!(obj["spec"], json!({"height": 5}));
}

#[test]
fn same_value_is_shared_then_conflicts_and_force() {
    let m = fm();
    let obj = apply(&m, None, &llama(json!({"weight": 10})), "m1", false).expect("apply");
    let obj = apply(&m, Some(&obj), &llama(json!({"weight": 10})), "m2", false).expect("shared");
    // No-op apply: kube records no time for the new manager, so it sorts
    // first (missing time counts as 0).
    assert_eq!(
        entries(&obj),
        vec![("m2".into(), "Apply".into()), ("m1".into(), "Apply".into())]
    );
    assert!(mf(&obj)[0].get("time").is_none());
    let err =
        apply(&m, Some(&obj), &llama(json!({"weight": 11})), "m3", false).expect_err("conflict");
    assert_eq!(
        err.to_string(),
        "Apply failed with 2 conflicts: conflicts with \"m1\":\n- .spec.weight\nconflicts with \"m2\":\n- .spec.weight"
    );
    assert!(matches!(err, Error::Conflicts(_)));
    let obj = apply(&m, Some(&obj), &llama(json!({"weight": 11})), "m3", true).expect("force");
    assert_eq!(entries(&obj), vec![("m3".into(), "Apply".into())]);
    assert_eq!(obj["spec"]["weight"], json!(11));
}

#[test]
fn update_after_apply_moves_ownership_and_conflict_message() {
    let m = fm();
    let obj = apply(
        &m,
        None,
        &llama(json!({"weight": 10, "height": 1})),
        "m1",
        false,
    )
    .expect("apply");
    let mut upd = obj.clone();
    upd["spec"]["weight"] = json!(12);
    m.update(Some(&obj), &mut upd, "kubectl-client-side-apply", LATER)
        .expect("update");
    let e = &mf(&upd)[1];
    assert_eq!(e["operation"], "Update");
    assert_eq!(e["time"], LATER);
    assert_eq!(
        mf_string(&upd),
        r#"[{"manager":"m1","operation":"Apply","apiVersion":"farm.example.com/v1alpha","time":"2026-11-23T15:42:24Z","fieldsType":"FieldsV1","fieldsV1":{"f:spec":{"f:height":{}}}},{"manager":"kubectl-client-side-apply","operation":"Update","apiVersion":"farm.example.com/v1alpha","time":"2026-11-23T15:50:00Z","fieldsType":"FieldsV1","fieldsV1":{"f:spec":{"f:weight":{}}}}]"#
    );
    let err = apply(
        &m,
        Some(&upd),
        &llama(json!({"weight": 10, "height": 1})),
        "m1",
        false,
    )
    .expect_err("conflict");
    assert_eq!(
        err.to_string(),
        "Apply failed with 1 conflict: conflict with \"kubectl-client-side-apply\" using farm.example.com/v1alpha: .spec.weight"
    );
    let Error::Conflicts(conflicts) = err else {
        panic!("{err:?}")
    };
    let shown: Vec<_> = conflicts
        .iter()
        .map(|c| (c.manager_display(), c.path_display()))
        .collect();
    assert_eq!(
        shown,
        [(
            "\"kubectl-client-side-apply\" using farm.example.com/v1alpha".to_string(),
            ".spec.weight".to_string()
        )]
    );
}

#[test]
fn labels_are_granular_finalizers_a_set_owner_refs_keyed() {
    let m = fm();
    let mut c1 = llama(json!({}));
    c1["metadata"]["labels"] = json!({"a": "1"});
    c1["metadata"]["finalizers"] = json!(["x"]);
    c1["metadata"]["ownerReferences"] = json!([{"uid": "u1", "name": "o"}]);
    let obj = apply(&m, None, &c1, "m1", false).expect("apply");
    // (`spec: {}` is an empty map, hence a member.)
    assert_eq!(
        mf_string(&obj),
        r#"[{"manager":"m1","operation":"Apply","apiVersion":"farm.example.com/v1alpha","time":"2026-11-23T15:42:24Z","fieldsType":"FieldsV1","fieldsV1":{"f:metadata":{"f:finalizers":{"v:\"x\"":{}},"f:labels":{"f:a":{}},"f:ownerReferences":{"k:{\"uid\":\"u1\"}":{".":{},"f:name":{},"f:uid":{}}}},"f:spec":{}}}]"#
    );
    let mut c2 = llama(json!({}));
    c2["metadata"]["labels"] = json!({"b": "2"});
    c2["metadata"]["finalizers"] = json!(["y"]);
    c2["metadata"]["ownerReferences"] = json!([{"uid": "u2", "name": "p"}]);
    let obj = apply(&m, Some(&obj), &c2, "m2", false).expect("no conflicts");
    assert_eq!(obj["metadata"]["labels"], json!({"a": "1", "b": "2"}));
    assert_eq!(obj["metadata"]["finalizers"], json!(["x", "y"]));
    assert_eq!(
        obj["metadata"]["ownerReferences"].as_array().map(Vec::len),
        Some(2)
    );
    // m1 drops its label, finalizer and owner reference: pruned, m2's stay.
    let obj = apply(&m, Some(&obj), &llama(json!({"weight": 1})), "m1", false).expect("apply");
    assert_eq!(obj["metadata"]["labels"], json!({"b": "2"}));
    assert_eq!(obj["metadata"]["finalizers"], json!(["y"]));
    assert_eq!(
        obj["metadata"]["ownerReferences"],
        json!([{"uid": "u2", "name": "p"}])
    );
    // Path display in conflicts.
    let mut c3 = llama(json!({}));
    c3["metadata"]["ownerReferences"] = json!([{"uid": "u2", "name": "other"}]);
    let err = apply(&m, Some(&obj), &c3, "m3", false).expect_err("conflict");
    assert_eq!(
        err.to_string(),
        "Apply failed with 1 conflict: conflict with \"m2\": .metadata.ownerReferences[uid=\"u2\"].name"
    );
}

#[test]
fn invalid_configs_are_rejected() {
    let m = fm();
    let mut dup = llama(json!({}));
    dup["metadata"]["finalizers"] = json!(["x", "x"]);
    let err = m.apply(None, &dup, "m", false, NOW).expect_err("dup");
    assert_eq!(
        err,
        Error::Invalid(
            "failed to create typed patch object (ns/l; farm.example.com/v1alpha, Kind=Llama): .metadata.finalizers: duplicate entries for key [=\"x\"]".into()
        )
    );
    let err = m
        .apply(None, &llama(json!({"weight": "heavy"})), "m", false, NOW)
        .expect_err("type");
    assert_eq!(
        err.to_string(),
        "failed to create typed patch object (ns/l; farm.example.com/v1alpha, Kind=Llama): .spec.weight: expected numeric (int or float), got string"
    );
    let err = m
        .apply(None, &llama(json!({"color": "red"})), "m", false, NOW)
        .expect_err("unknown");
    assert!(
        err.to_string()
            .ends_with(".spec.color: field not declared in schema"),
        "{err}"
    );
    let mut wrong = llama(json!({}));
    wrong["kind"] = json!("Alpaca");
    assert_eq!(
        m.apply(None, &wrong, "m", false, NOW),
        Err(Error::BadRequest(
            "invalid object type: farm.example.com/v1alpha, Kind=Alpaca".into()
        ))
    );
    let mut with_mf = llama(json!({}));
    with_mf["metadata"]["managedFields"] = json!([]);
    assert_eq!(
        m.apply(None, &with_mf, "m", false, NOW),
        Err(Error::BadRequest(
            "metadata.managedFields must be nil".into()
        ))
    );
}

#[test]
fn update_tracking_reset_and_skip() {
    let m = fm();
    // Create is tracked.
    let mut obj = llama(json!({"weight": 1}));
    m.update(None, &mut obj, "creator", NOW).expect("create");
    assert_eq!(entries(&obj), vec![("creator".into(), "Update".into())]);
    let obj = stored(obj);
    // Reset with [] (and [{}]): managedFields are stripped entirely (the
    // object then counts as untracked, as in kube).
    for reset in [json!([]), json!([{}])] {
        let mut upd = obj.clone();
        upd["spec"]["height"] = json!(3);
        upd["metadata"]["managedFields"] = reset;
        m.update(Some(&obj), &mut upd, "resetter", LATER)
            .expect("update");
        assert!(upd["metadata"].get("managedFields").is_none());
    }
    // On create, a reset still tracks the creator.
    let mut fresh = llama(json!({"weight": 1}));
    fresh["metadata"]["managedFields"] = json!([]);
    m.update(None, &mut fresh, "creator", NOW).expect("create");
    assert_eq!(entries(&fresh), vec![("creator".into(), "Update".into())]);
    // Existing object with empty managedFields: updates are not tracked.
    let mut bare = obj.clone();
    bare["metadata"]
        .as_object_mut()
        .map(|m| m.remove("managedFields"));
    let mut upd = bare.clone();
    upd["spec"]["weight"] = json!(7);
    m.update(Some(&bare), &mut upd, "x", LATER).expect("update");
    assert!(upd["metadata"].get("managedFields").is_none());
    // managedFields sent by the client replace live's.
    let mut upd = obj.clone();
    upd["metadata"]["managedFields"] = json!([{"manager": "imported", "operation": "Update",
        "apiVersion": AV, "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:weight": {}}}}]);
    m.update(Some(&obj), &mut upd, "x", LATER).expect("update");
    assert_eq!(entries(&upd), vec![("imported".into(), "Update".into())]);
    // Invalid entries fall back to live's.
    let mut upd = obj.clone();
    upd["metadata"]["managedFields"] = json!([{"manager": "bad", "operation": "Delete", "apiVersion": AV, "fieldsType": "FieldsV1"}]);
    m.update(Some(&obj), &mut upd, "x", LATER).expect("update");
    assert_eq!(entries(&upd), vec![("creator".into(), "Update".into())]);
}

#[test]
fn cap_managers_merges_oldest_into_ancient_changes() {
    let m = fm();
    let mut obj = stored(llama(json!({})));
    obj["metadata"]["managedFields"] = json!([{"manager": "seed", "operation": "Update", "apiVersion": AV, "fieldsType": "FieldsV1",
                "time": "2026-01-01T00:00:00Z", "fieldsV1": {"f:spec": {}}}]);
    obj["metadata"]["labels"] = json!({});
    for i in 0..11 {
        let mut upd = obj.clone();
        upd["metadata"]["labels"][format!("l{i}")] = json!("v");
        let now = format!("2026-11-23T15:{:02}:00Z", 10 + i);
        m.update(Some(&obj), &mut upd, &format!("u{i:02}"), &now)
            .expect("update");
        obj = upd;
    }
    let names: Vec<String> = entries(&obj).into_iter().map(|(n, _)| n).collect();
    assert_eq!(names.len(), 10);
    assert_eq!(names[0], "ancient-changes");
    // seed (oldest) + u00 + u01 were merged.
    assert_eq!(
        mf(&obj)[0]["fieldsV1"],
        json!({"f:metadata": {"f:labels": {"f:l0": {}, "f:l1": {}}}, "f:spec": {}})
    );
    assert_eq!(mf(&obj)[0]["time"], "2026-11-23T15:11:00Z");
    assert_eq!(names[9], "u10");
}

#[test]
fn apply_to_untracked_object_records_before_first_apply() {
    let m = fm();
    let live = stored(llama(json!({"weight": 1, "height": 2})));
    let obj = apply(&m, Some(&live), &llama(json!({"weight": 1})), "m1", false).expect("apply");
    assert_eq!(
        entries(&obj),
        vec![
            ("m1".into(), "Apply".into()),
            ("before-first-apply".into(), "Update".into())
        ]
    );
    // `.spec` itself was added relative to the empty object, so it is a
    // member ("."), as kube records for custom resources.
    assert_eq!(
        mf(&obj)[1]["fieldsV1"],
        json!({"f:spec": {".": {}, "f:height": {}, "f:weight": {}}})
    );
    let err =
        apply(&m, Some(&obj), &llama(json!({"height": 3})), "m1", false).expect_err("conflict");
    assert_eq!(
        err.to_string(),
        "Apply failed with 1 conflict: conflict with \"before-first-apply\" using farm.example.com/v1alpha: .spec.height"
    );
}

#[test]
fn kubectl_upgrades_client_side_apply_without_conflicts() {
    let m = fm();
    let mut last = llama(json!({"weight": 1}));
    let last_str = super::gojson::encode(&last) + "\n";
    last["metadata"]["annotations"] = json!({LAST_APPLIED: last_str});
    let mut created = last.clone();
    m.update(None, &mut created, "kubectl-client-side-apply", NOW)
        .expect("create");
    let live = stored(created);
    let cfg = llama(json!({"weight": 2}));
    // Another manager conflicts...
    assert!(matches!(
        apply(&m, Some(&live), &cfg, "other", false),
        Err(Error::Conflicts(_))
    ));
    // ...kubectl does not, and rewrites the annotation to the applied config.
    let obj = apply(&m, Some(&live), &cfg, "kubectl", false).expect("upgrade");
    assert_eq!(obj["spec"]["weight"], json!(2));
    assert_eq!(
        obj["metadata"]["annotations"][LAST_APPLIED],
        json!(
            "{\"apiVersion\":\"farm.example.com/v1alpha\",\"kind\":\"Llama\",\"metadata\":{\"name\":\"l\",\"namespace\":\"ns\"},\"spec\":{\"weight\":2}}\n"
        )
    );
    assert_eq!(entries(&obj)[0], ("kubectl".into(), "Apply".into()));
    // A field changed since the last client-side apply still conflicts.
    let mut changed = live.clone();
    changed["spec"]["weight"] = json!(5);
    let mut changed2 = changed.clone();
    m.update(Some(&live), &mut changed2, "kubectl-edit", LATER)
        .expect("edit");
    let err = apply(&m, Some(&changed2), &cfg, "kubectl", false).expect_err("conflict");
    assert_eq!(
        err.to_string(),
        "Apply failed with 1 conflict: conflict with \"kubectl-edit\" using farm.example.com/v1alpha: .spec.weight"
    );
}

const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

#[test]
fn status_subresource_tracks_only_status() {
    let main = fm();
    let status = status_fm();
    let obj = apply(&main, None, &llama(json!({"weight": 1})), "m1", false).expect("apply");
    // Main resource: status changes are not tracked.
    let mut cfg = llama(json!({"weight": 1}));
    cfg["status"] = json!({"phase": "Running"});
    let obj2 = apply(&main, Some(&obj), &cfg, "m1", false).expect("apply");
    assert_eq!(
        mf(&obj2)[0]["fieldsV1"],
        json!({"f:spec": {"f:weight": {}}})
    );
    // Status subresource: spec changes are ignored, status is tracked with
    // the subresource in the entry.
    let mut upd = obj.clone();
    upd["status"] = json!({"phase": "Running"});
    upd["spec"]["weight"] = json!(9);
    status
        .update(Some(&obj), &mut upd, "controller", LATER)
        .expect("update");
    let e = &mf(&upd)[1];
    assert_eq!(e["manager"], "controller");
    assert_eq!(e["subresource"], "status");
    assert_eq!(e["fieldsV1"], json!({"f:status": {".": {}, "f:phase": {}}}));
    // Subresource requests cannot rewrite managedFields.
    let mut upd2 = upd.clone();
    upd2["metadata"]["managedFields"] = json!([]);
    upd2["status"]["ready"] = json!(true);
    status
        .update(Some(&upd), &mut upd2, "controller", LATER)
        .expect("update");
    assert_eq!(entries(&upd2).len(), 2);
    // Conflicts print the subresource.
    let mut scfg = llama(json!({}));
    scfg["status"] = json!({"phase": "Done"});
    let err = apply(&status, Some(&upd2), &scfg, "other", false).expect_err("conflict");
    assert_eq!(
        err.to_string(),
        "Apply failed with 1 conflict: conflict with \"controller\" with subresource \"status\" using farm.example.com/v1alpha: .status.phase"
    );
}

#[test]
fn typed_operations() {
    let s = schema();
    let live = json!({"apiVersion": AV, "metadata": {"finalizers": ["a", "b"], "labels": {"x": "1"}}, "spec": {"weight": 1}});
    let cfg = json!({"metadata": {"finalizers": ["c", "a"]}, "spec": {"weight": 2.0}});
    let merged = typed::merge(&s, &live, &cfg).expect("merge");
    assert_eq!(merged["metadata"]["finalizers"], json!(["c", "a", "b"]));
    assert_eq!(merged["metadata"]["labels"], json!({"x": "1"}));
    let c = typed::compare(&s, &live, &merged).expect("compare");
    assert_eq!(
        c.modified.to_fields_v1_string(),
        r#"{"f:spec":{"f:weight":{}}}"#
    );
    assert_eq!(
        c.added.to_fields_v1_string(),
        r#"{"f:metadata":{"f:finalizers":{"v:\"c\"":{}}}}"#
    );
    assert!(c.removed.is_empty());
    let set = typed::to_field_set(&s, &live).expect("set");
    let only = FieldSet::from_paths([vec![
        PathElement::field("spec"),
        PathElement::field("weight"),
    ]]);
    assert_eq!(
        typed::extract_items(&s, &live, &only),
        json!({"spec": {"weight": 1}})
    );
    let removed = typed::remove_items(&s, &live, &set.difference(&only));
    assert_eq!(
        removed,
        json!({"metadata": {"finalizers": [], "labels": {}}, "spec": {"weight": 1}})
    );
}

mod versions;
