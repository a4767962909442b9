//! json-patch.v4's behaviour, case by case.

use super::*;
use serde_json::Value;
use serde_json::json;

const LIMITS: Limits = Limits {
    copy_bytes: 3 * 1024 * 1024,
    depth: 10_000,
};

fn apply(document: Value, patch: Value) -> Result<Value, String> {
    let mut document = document;
    Patch::from_value(&patch)?
        .apply(&mut document, LIMITS)
        .map_err(|e| e.message)?;
    Ok(document)
}

#[test]
fn a_missing_member_tested_against_null_passes() {
    // kube-rs's finalizer(): test that there are no finalizers, then add them.
    let doc = json!({"metadata": {"name": "a"}});
    let patched = apply(
        doc.clone(),
        json!([
            {"op": "test", "path": "/metadata/finalizers", "value": null},
            {"op": "add", "path": "/metadata/finalizers", "value": ["x"]}
        ]),
    );
    assert_eq!(
        patched,
        Ok(json!({"metadata": {"name": "a", "finalizers": ["x"]}}))
    );
    // No value at all is null too; a value against a missing member fails.
    assert!(apply(doc.clone(), json!([{"op": "test", "path": "/metadata/x"}])).is_ok());
    assert_eq!(
        apply(
            doc,
            json!([{"op": "test", "path": "/metadata/x", "value": 1}])
        ),
        Err("testing value /metadata/x failed: test failed".into())
    );
}

#[test]
fn negative_indices_count_from_the_end() {
    let doc = json!({"a": [1, 2, 3]});
    assert_eq!(
        apply(
            doc.clone(),
            json!([{"op": "add", "path": "/a/-1", "value": 9}])
        ),
        Ok(json!({"a": [1, 2, 3, 9]}))
    );
    assert_eq!(
        apply(
            doc.clone(),
            json!([{"op": "add", "path": "/a/-4", "value": 9}])
        ),
        Ok(json!({"a": [9, 1, 2, 3]}))
    );
    assert_eq!(
        apply(doc.clone(), json!([{"op": "remove", "path": "/a/-1"}])),
        Ok(json!({"a": [1, 2]}))
    );
    assert_eq!(
        apply(
            doc.clone(),
            json!([{"op": "replace", "path": "/a/-3", "value": 0}])
        ),
        Ok(json!({"a": [0, 2, 3]}))
    );
    assert_eq!(
        apply(doc.clone(), json!([{"op": "remove", "path": "/a/-4"}])),
        Err("error in remove for path: '/a/-4': Unable to access invalid index: -4: invalid index referenced".into())
    );
    assert_eq!(
        apply(doc, json!([{"op": "add", "path": "/a/5", "value": 1}])),
        Err("error in add for path: '/a/5': Unable to access invalid index: 5: invalid index referenced".into())
    );
}

#[test]
fn replace_of_a_missing_member_adds_it_and_a_missing_value_is_null() {
    let doc = json!({"spec": {"a": 1}});
    assert_eq!(
        apply(
            doc.clone(),
            json!([{"op": "replace", "path": "/spec/b", "value": 2}])
        ),
        Ok(json!({"spec": {"a": 1, "b": 2}}))
    );
    assert_eq!(
        apply(doc.clone(), json!([{"op": "add", "path": "/spec/b"}])),
        Ok(json!({"spec": {"a": 1, "b": null}}))
    );
    assert_eq!(
        apply(
            doc.clone(),
            json!([{"op": "copy", "from": "/spec/x", "path": "/spec/b"}])
        ),
        Ok(json!({"spec": {"a": 1, "b": null}}))
    );
    assert_eq!(
        apply(doc, json!([{"op": "add", "path": "/nope/b", "value": 1}])),
        Err("add operation does not apply: doc is missing path: \"/nope/b\": missing value".into())
    );
}

#[test]
fn scalars_are_equal_only_as_texts() {
    let doc = json!({"n": 1, "f": 1.5, "s": "a<b"});
    let test = |path: &str, raw: &str| {
        let patch = format!(r#"[{{"op":"test","path":"{path}","value":{raw}}}]"#);
        let mut doc = doc.clone();
        Patch::decode(patch.as_bytes())
            .unwrap()
            .apply(&mut doc, LIMITS)
            .is_ok()
    };
    assert!(test("/n", "1"));
    assert!(!test("/n", "1.0"));
    assert!(test("/f", "1.5"));
    assert!(test("/s", r#""a\u003cb""#));
    assert!(!test("/s", r#""a<b""#));
    assert!(test("", r#"{"s":"a\u003cb","f":1.5,"n":1}"#));
}

#[test]
fn paths_skip_their_first_token_and_unescape() {
    let doc = json!({"a/b": {"~c": 1}});
    assert_eq!(
        apply(doc.clone(), json!([{"op": "remove", "path": "x/a~1b"}])),
        Ok(json!({}))
    );
    assert_eq!(
        apply(doc, json!([{"op": "remove", "path": "/a~1b/~0c"}])),
        Ok(json!({"a/b": {}}))
    );
}

#[test]
fn decoding_errors_are_go_s() {
    assert_eq!(
        Patch::decode(b"{}").unwrap_err(),
        "json: cannot unmarshal object into Go value of type jsonpatch.Patch"
    );
    assert_eq!(
        Patch::decode(b"[1]").unwrap_err(),
        "json: cannot unmarshal number into Go value of type jsonpatch.Operation"
    );
    assert!(Patch::decode(b"null").unwrap().is_empty());
    assert_eq!(
        apply(json!({}), json!([null])),
        Err("Unexpected kind: unknown".into())
    );
}

#[test]
fn merge_patches_prune_nulls_as_json_patch_v4() {
    let mut doc = json!({"a": {"b": 1, "c": 2}, "d": [1], "e": "x"});
    merge(
        &mut doc,
        json!({"a": {"b": null}, "d": [{"x": null, "y": 1}, null], "e": null, "f": {"g": null}}),
    )
    .unwrap();
    assert_eq!(doc, json!({"a": {"c": 2}, "d": [{"y": 1}, null], "f": {}}));
    assert_eq!(merge(&mut doc, Value::Null), Err(BAD_MERGE_PATCH));
    assert_eq!(merge(&mut doc, json!(5)), Err(BAD_MERGE_PATCH));
}

#[test]
fn floats_are_written_as_go_writes_them() {
    assert_eq!(go_float(1.5), "1.5");
    assert_eq!(go_float(1e21), "1e+21");
    assert_eq!(go_float(1.5e-7), "1.5e-7");
    assert_eq!(go_float(123456.0), "123456");
    assert_eq!(go_float(1e-6), "0.000001");
}
