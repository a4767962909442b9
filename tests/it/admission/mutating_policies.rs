//! MutatingAdmissionPolicies: mutations of writes, and none that breaks a write.

use super::*;

/// No MutatingAdmissionPolicy, whatever its mutations (JSON patches to any path with any
/// value, the name, uid, kind or resourceVersion included; apply configurations of any shape;
/// expressions that fail), makes a 5xx that is not kube-apiserver's `Internal error`, renames
/// or re-creates an object, or changes an object when the write is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_mutating_policy_breaks_a_write() {
    use proptest::{prelude::*, strategy::ValueTree};
    let path = prop::sample::select(vec![
        "/metadata/name",
        "/metadata/uid",
        "/metadata/namespace",
        "/metadata/resourceVersion",
        "/metadata/labels/extra",
        "/metadata/labels",
        "/metadata/finalizers",
        "/metadata/finalizers/-",
        "/metadata/deletionTimestamp",
        "/spec/weight",
        "/spec/height",
        "/spec/extra",
        "/spec",
        "/kind",
        "/apiVersion",
        "/status",
        "",
        "/nowhere/deep",
    ]);
    let value = prop::sample::select(vec![
        "'x'",
        "-1.0",
        "5.0",
        "7",
        "null",
        "true",
        "{'a': 'b'}",
        "['a', 'b']",
        "'a'.repeat(1)",
        "object.spec.weight * 2.0",
        "object.metadata.name + '-renamed'",
        "[object.spec, object.spec]",
    ]);
    let op = prop::sample::select(vec!["add", "replace", "remove", "test", "move", "copy"]);
    let patch = (op, path.clone(), path, value).prop_map(|(op, path, from, value)| {
        format!("JSONPatch{{op: '{op}', path: '{path}', from: '{from}', value: {value}}}")
    });
    let json_patch = prop::collection::vec(patch, 0..4)
        .prop_map(|ops| json!({"patchType": "JSONPatch", "jsonPatch": {"expression": format!("[{}]", ops.join(", "))}}));
    let apply = prop::sample::select(vec![
        "Object{metadata: Object.metadata{name: 'renamed'}}",
        "Object{metadata: Object.metadata{uid: 'other'}}",
        "Object{metadata: Object.metadata{labels: {'a': 'b'}, finalizers: ['farm.example.com/x']}}",
        "Object{metadata: Object.metadata{namespace: 'elsewhere'}}",
        "Object{spec: Object.spec{weight: 'heavy'}}",
        "Object{spec: Object.spec{weight: 3.0, extra: 1}}",
        "Object{spec: Object.metadata{}}",
        "Object{kind: 'Pod'}",
        "Object{status: {'x': 1}}",
        "Object{}",
        "object",
        "1 / 0",
        "Object{spec: Object.spec{height: object.spec.nothing}}",
    ])
    .prop_map(|expression| json!({"patchType": "ApplyConfiguration", "applyConfiguration": {"expression": expression}}));
    let mutations = prop::collection::vec(prop_oneof![json_patch, apply], 1..3);
    let failure = prop::sample::select(vec!["Fail", "Ignore"]);
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let cases: Vec<(Vec<Value>, &str)> = (0..48)
        .map(|_| {
            (mutations.clone(), failure.clone())
                .new_tree(&mut runner)
                .unwrap()
                .current()
        })
        .collect();
    let mut configurations = Vec::new();
    for (index, (mutations, failure)) in cases.iter().enumerate() {
        let mut policy = mutating_policy(
            &format!("p{index}"),
            json!({"failurePolicy": failure, "mutations": mutations}),
        );
        policy["spec"]["matchConstraints"]["resourceRules"][0]["operations"] =
            json!(["CREATE", "UPDATE"]);
        configurations.push(policy);
        configurations.push(mutating_binding(
            &format!("p{index}"),
            &format!("p{index}"),
            None,
            json!({"matchLabels": {"case": index.to_string()}}),
        ));
    }
    let (server, _fake) = server_with(TestStorage::Memory, &configurations)
        .await
        .unwrap();
    for index in 0..cases.len() {
        let created = send(
            &server,
            "POST",
            LLAMAS,
            Some(llama(&format!("u-{index}"), 2.0, json!({}))),
        )
        .await;
        assert_eq!(created.status, 201, "{}", created.json());
    }
    let check = |case: &(Vec<Value>, &str), reply: &common::RawResponse| {
        let status = reply.json();
        let message = status["message"].as_str().unwrap_or_default().to_owned();
        assert!(
            reply.status < 500 || message.starts_with("Internal error occurred: "),
            "{case:?}: {} {message}",
            reply.status
        );
        message
    };
    let mut outcomes = Vec::new();
    for (index, case) in cases.iter().enumerate() {
        // A create: stored as answered (a mutation may name it, as in kube-apiserver, whose
        // storage keys a create by the admitted object), in the request's namespace, or not
        // at all.
        let name = format!("c-{index}");
        let created = send(
            &server,
            "POST",
            LLAMAS,
            Some(llama(&name, 2.0, json!({"case": index.to_string()}))),
        )
        .await;
        check(case, &created);
        outcomes.push(created.status);
        if created.status == 201 {
            let answered = created.json()["metadata"]["name"]
                .as_str()
                .unwrap()
                .to_owned();
            let stored = send(&server, "GET", &format!("{LLAMAS}/{answered}"), None).await;
            assert_eq!(stored.status, 200, "{case:?}");
            assert_eq!(
                stored.json()["metadata"]["namespace"],
                "default",
                "{case:?}"
            );
            assert_eq!(
                stored.json()["metadata"]["uid"],
                created.json()["metadata"]["uid"]
            );
            let deleted = send(&server, "DELETE", &format!("{LLAMAS}/{answered}"), None).await;
            assert_eq!(deleted.status, 200, "{case:?}");
        } else {
            let stored = send(&server, "GET", &format!("{LLAMAS}/{name}"), None).await;
            assert_eq!(stored.status, 404, "{case:?}: {}", created.json());
        }
        // An update: the same object, or unchanged.
        let path = format!("{LLAMAS}/u-{index}");
        let before = send(&server, "GET", &path, None).await.json();
        let patched = send(
            &server,
            "PATCH",
            &path,
            Some(format!(r#"{{"metadata":{{"labels":{{"case":"{index}"}}}}}}"#).into_bytes()),
        )
        .await;
        let message = check(case, &patched);
        let after = send(&server, "GET", &path, None).await.json();
        assert_eq!(
            after["metadata"]["uid"], before["metadata"]["uid"],
            "{case:?}"
        );
        assert_eq!(after["metadata"]["name"], format!("u-{index}"), "{case:?}");
        if patched.status >= 400 {
            assert_eq!(
                after["metadata"]["resourceVersion"], before["metadata"]["resourceVersion"],
                "{case:?}: {message}"
            );
        } else {
            assert_eq!(patched.status, 200, "{case:?}");
        }
        outcomes.push(patched.status);
    }
    // The cases cover writes that go through and writes refused, mutated or not.
    outcomes.sort_unstable();
    outcomes.dedup();
    eprintln!("answers: {outcomes:?}");
    assert!(
        outcomes.contains(&201) && outcomes.contains(&200),
        "{outcomes:?}"
    );
    assert!(outcomes.iter().any(|code| *code >= 400), "{outcomes:?}");
}
