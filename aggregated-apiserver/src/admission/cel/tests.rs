//! The compiler and the scopes, run as policies run them.

use super::*;
use serde_json::json;

fn run(source: &str, object: &Value) -> Result<cel::Value, String> {
    Expression::compile(source)?.run(&[("object".to_owned(), to_cel(object))])
}

#[test]
fn expressions_over_objects() {
    let object = json!({"metadata": {"name": "dolly", "labels": {"team": "a"}}, "spec": {"weight": 500.0, "height": 1}});
    for source in [
        "object.spec.weight > 100",
        "object.spec.height == 1",
        "object.metadata.name.startsWith('dol')",
        "has(object.metadata.labels) && object.metadata.labels.team == 'a'",
        "'team' in object.metadata.labels",
        "object.metadata.labels.all(k, k.size() < 10)",
        "object.metadata.name.matches('^d.*y$')",
        "object.metadata.name.lowerAscii() == 'dolly'",
        // JSON integers are ints: they mix with int literals.
        "object.spec.height + 1 == 2",
        "size(object.metadata.labels) * 2 == object.spec.height * 2",
    ] {
        assert_eq!(run(source, &object), Ok(cel::Value::Bool(true)), "{source}");
    }
    assert!(run("object.spec.nothing > 1", &object).is_err());
    assert!(Expression::compile("object.spec.weight >").is_err());
}

#[test]
fn long_and_deep_texts_are_refused() {
    assert!(Expression::compile("[1, 2].all(x, [3].exists(y, x < y))").is_ok());
    assert!(Expression::compile("[1, 2].all(x, x > 0) && [3].exists(y, y > 2)").is_ok());
    assert!(Expression::compile(&"1 + ".repeat(2000).to_string()).is_err());
    assert!(Expression::compile(&format!("{}1{}", "(".repeat(100), ")".repeat(100))).is_err());
    assert!(Expression::compile(&format!("{}1{}", "(".repeat(10), ")".repeat(10))).is_ok());
    // A long chain of operators nests its syntax tree.
    assert!(Expression::compile(&format!("1{}", " + 1".repeat(200))).is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evaluation_is_bounded_in_time() {
    let object = json!({"items": (0..300_000).collect::<Vec<_>>()});
    let slow = Arc::new(Expression::compile("object.items.map(x, x + 1).size() > 0").unwrap());
    let started = std::time::Instant::now();
    let results = evaluate(vec![slow], vec![("object".into(), to_cel(&object))]).await;
    assert!(started.elapsed() < BUDGET + Duration::from_millis(200));
    assert!(results[0].is_err() || results[0] == Ok(json!(true)));
}

#[test]
fn mutations_build_objects_and_json_patches() {
    let object = json!({"spec": {"height": 1}});
    let built = |source: &str| {
        let expression = Expression::compile(source)?;
        to_json(&expression.run(&[("object".to_owned(), to_cel(&object))])?)
    };
    assert_eq!(
        built(
            "Object{metadata: Object.metadata{labels: {'a': 'b'}}, spec: Object.spec{height: 2}}"
        ),
        Ok(json!({"metadata": {"labels": {"a": "b"}}, "spec": {"height": 2}}))
    );
    // Types must be named for their place.
    let mismatch = built("Object{spec: Object.metadata{}}").unwrap_err();
    assert!(mismatch.contains("expected \"Object.spec\""), "{mismatch}");
    assert_eq!(
        built(
            "[JSONPatch{op: 'add', path: '/metadata/labels/' + jsonpatch.escapeKey('a/b~c'), value: 'x'}]"
        ),
        Ok(json!([{"op": "add", "path": "/metadata/labels/a~1b~0c", "value": "x"}]))
    );
    assert!(built("JSONPatch{op: 'add', nothing: 1}").is_err());
}

#[test]
fn numbers_follow_the_schema() {
    let components = serde_json::Map::from_iter([(
        "Spec".to_owned(),
        json!({"properties": {"height": {"type": "number"}, "count": {"type": "integer"},
               "sizes": {"items": {"type": "number"}}}}),
    )]);
    let schema =
        json!({"properties": {"spec": {"allOf": [{"$ref": "#/components/schemas/Spec"}]}}});
    let numbers = Numbers::from_openapi(&schema, &components);
    let object = json!({"spec": {"height": 1, "count": 2, "sizes": [3, 4.5]}});
    let typed = to_cel_typed(&object, Some(&numbers));
    let run = |source: &str| {
        Expression::compile(source)
            .unwrap()
            .run(&[("object".to_owned(), typed.clone())])
    };
    assert_eq!(
        run("object.spec.height * 2.0 == 2.0"),
        Ok(cel::Value::Bool(true))
    );
    assert_eq!(
        run("object.spec.count + 1 == 3"),
        Ok(cel::Value::Bool(true))
    );
    assert_eq!(
        run("object.spec.sizes[0] + 0.5 == 3.5"),
        Ok(cel::Value::Bool(true))
    );
}

#[test]
fn lazily_converted_objects_behave_as_maps() {
    let object = json!({"metadata": {"name": "dolly", "labels": {"a": "b"}, "managedFields": [{"manager": "m"}]},
                        "spec": {"weight": 5, "tags": ["x", "y"]}});
    let inputs = vec![
        Input {
            name: "object",
            value: Arc::new(object.clone()),
            numbers: None,
            native: None,
        },
        Input {
            name: "oldObject",
            value: Arc::new(object.clone()),
            numbers: None,
            native: None,
        },
    ];
    let mut scope = Scope::new(&inputs, None);
    let mut run = |source: &str| scope.run(&Expression::compile(source).unwrap());
    for source in [
        "object.metadata.name == 'dolly'",
        "has(object.metadata.labels) && !has(object.metadata.annotations)",
        "'a' in object.metadata.labels && !('z' in object.metadata.labels)",
        "size(object.metadata.labels) == 1 && size(object) == 2",
        "object.metadata.labels.all(k, object.metadata.labels[k] == 'b')",
        "object.spec.tags.exists(t, t == 'y')",
        "object == oldObject && object.metadata == oldObject.metadata",
        "object.metadata.labels == {'a': 'b'}",
        "{'a': 'b'} == object.metadata.labels",
        "object.metadata.managedFields[0].manager == 'm'",
        "object.spec.weight + 1 == 6",
        "[object.metadata.labels].size() == 1",
    ] {
        assert_eq!(run(source), Ok(json!(true)), "{source}");
    }
    assert_eq!(run("object.metadata.labels"), Ok(json!({"a": "b"})));
    assert_eq!(run("object.spec"), Ok(object["spec"].clone()));
    assert!(run("object.metadata.nothing == 1").is_err());
    assert_eq!(
        run("object.metadata.?nothing.orValue('none')"),
        Ok(json!("none"))
    );
}

#[test]
fn only_constant_cost_expressions_may_run_inline() {
    for (source, simple) in [
        (
            "object.spec.weight <= 1000.0 && has(object.metadata.labels)",
            true,
        ),
        (
            "'a' in object.metadata.labels && object.metadata.name.startsWith('d')",
            true,
        ),
        ("'ab'.replace('', 'ab')", false),
        ("object.metadata.name + 'x' == 'y'", false),
        ("[1, 2].all(x, x > 0)", false),
    ] {
        assert_eq!(
            Expression::compile(source).unwrap().simple,
            simple,
            "{source}"
        );
    }
    // A result too large to write out is an error, not a memory bomb.
    let doubled = format!("{}1{}", "[".repeat(70), "]".repeat(70));
    assert!(
        Expression::compile(&doubled).is_err()
            || to_json(&Expression::compile(&doubled).unwrap().run(&[]).unwrap()).is_err()
    );
}

#[test]
fn values_come_back_as_json() {
    let labels = json!({"a": "b", "n": 3});
    let value = Expression::compile("object")
        .unwrap()
        .run(&[("object".to_owned(), to_cel(&labels))])
        .unwrap();
    assert_eq!(to_json(&value), Ok(labels));
}
