//! Request bodies as an attacker shapes them: nested as deep as a decoder allows, patched
//! into something deeper, or slow to read. None may crash the server, hold its workers or go
//! past the request timeout; each gets kube-apiserver's answer. Each test here failed at
//! 96fc46f (the first crashed the whole test process).

use crate::common;

use std::time::Duration;

use common::{Alpn, Options, TestServer, oneshot::*};
use serde_json::{Value, json};

const LLAMAS: &str = "/apis/farm.example.com/v1alpha/namespaces/default/llamas";

/// `[[[...1...]]]`, `depth` arrays deep.
fn nested(depth: usize) -> String {
    format!("{}1{}", "[".repeat(depth), "]".repeat(depth))
}

/// A Llama whose `spec.deep` holds `value` (an unknown field: dropped unless strict).
fn llama_with(name: &str, value: &str) -> String {
    format!(
        r#"{{"apiVersion":"farm.example.com/v1alpha","kind":"Llama","metadata":{{"name":"{name}"}},"spec":{{"weight":1,"height":1,"deep":{value}}}}}"#
    )
}

/// The issue's patch, scaled: each round adds a 120-deep array and moves the object's own
/// nesting into its innermost slot, 120 levels deeper every round.
fn nesting_patch(rounds: usize) -> String {
    let mut inner = json!([]);
    for _ in 0..119 {
        inner = json!([inner]);
    }
    let mut ops = vec![json!({"op": "add", "path": "/spec/x", "value": []})];
    for _ in 0..rounds {
        ops.push(json!({"op": "add", "path": "/spec/t", "value": inner}));
        ops.push(json!({"op": "move", "from": "/spec/x", "path": format!("/spec/t{}/-", "/0".repeat(119))}));
        ops.push(json!({"op": "move", "from": "/spec/t", "path": "/spec/x"}));
    }
    Value::Array(ops).to_string()
}

/// A JSON patch whose moves nest the object past Go's 10,000 levels killed the process with
/// a stack overflow. Now the operation that would pass the bound is refused (422), nothing is
/// written, and the server serves on.
#[tokio::test]
async fn a_json_patch_cannot_nest_an_object_past_the_bound() {
    let app = app();
    let before = get(&app, &format!("{LLAMAS}/dolly")).await.json();
    let reply = call(
        &app,
        "PATCH",
        &format!("{LLAMAS}/dolly?fieldValidation=Ignore"),
        &[("content-type", "application/json-patch+json")],
        &nesting_patch(100),
    )
    .await;
    let message = reply.status(422, "Invalid");
    assert!(message.contains("exceeded max depth"), "{message}");
    // Operation 251 is the 84th round's deep move: 9,961 levels moved 122 levels down.
    assert!(message.contains("operation 251 (move"), "{message}");
    let after = get(&app, &format!("{LLAMAS}/dolly")).await.json();
    assert_eq!(
        after["metadata"]["resourceVersion"],
        before["metadata"]["resourceVersion"]
    );
    // Under the bound the same patch applies (the unknown fields are then dropped).
    let reply = call(
        &app,
        "PATCH",
        &format!("{LLAMAS}/dolly?fieldValidation=Ignore"),
        &[("content-type", "application/json-patch+json")],
        &nesting_patch(20),
    )
    .await;
    assert_eq!(
        reply.status,
        200,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    assert_eq!(reply.json()["spec"], json!({"weight": 31.4, "height": 0.5}));
}

/// Bodies are read as Go's decoder reads them: 10,000 levels are fine, one more is 400 with
/// kube-apiserver's message, in every encoding and for every verb that takes a body.
#[tokio::test]
async fn bodies_nest_up_to_ten_thousand_levels() {
    let app = app();
    let ignore = format!("{LLAMAS}?fieldValidation=Ignore");
    let json_type = [("content-type", "application/json")];
    // At the bound (spec and the object itself are two of the levels).
    let reply = call(
        &app,
        "POST",
        &ignore,
        &json_type,
        &llama_with("deepest", &nested(9_998)),
    )
    .await;
    assert_eq!(
        reply.status,
        201,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    assert_eq!(reply.json()["spec"], json!({"weight": 1, "height": 1}));
    // One past it.
    let body = llama_with("deeper", &nested(9_999));
    let message = call(&app, "POST", &ignore, &json_type, &body)
        .await
        .status(400, "BadRequest");
    assert_eq!(
        message,
        format!(
            "the object provided is unrecognized (must be of type Llama): couldn't get version/kind; json parse error: invalid character '[' exceeded max depth ({} ...)",
            &body[..30]
        )
    );
    // The same as YAML (a flow sequence), and a PUT.
    let body = llama_with("dolly", &nested(12_000));
    let message = call(
        &app,
        "PUT",
        &format!("{LLAMAS}/dolly"),
        &[("content-type", "application/yaml")],
        &body,
    )
    .await
    .status(400, "BadRequest");
    assert_eq!(
        message,
        format!(
            "the object provided is unrecognized (must be of type Llama): couldn't get version/kind; yaml: exceeded max depth of 10000 ({} ...)",
            &body[..30]
        )
    );
    // Patches: a merge patch and a JSON patch body.
    for (content_type, body) in [
        (
            "application/merge-patch+json",
            format!(r#"{{"spec":{{"deep":{}}}}}"#, nested(20_000)),
        ),
        (
            "application/json-patch+json",
            format!(
                r#"[{{"op":"add","path":"/spec/deep","value":{}}}]"#,
                nested(20_000)
            ),
        ),
    ] {
        let message = call(
            &app,
            "PATCH",
            &format!("{LLAMAS}/dolly"),
            &[("content-type", content_type)],
            &body,
        )
        .await
        .status(400, "BadRequest");
        assert_eq!(
            message,
            "error decoding patch: invalid character '[' exceeded max depth"
        );
    }
    // Apply, JSON or YAML.
    for body in [
        llama_with("applied", &nested(60_000)),
        format!(
            "apiVersion: farm.example.com/v1alpha\nkind: Llama\nmetadata:\n  name: applied\nspec:\n  deep: {}\n",
            nested(60_000)
        ),
    ] {
        let message = call(
            &app,
            "PATCH",
            &format!("{LLAMAS}/applied?fieldManager=deep"),
            &[("content-type", "application/apply-patch+yaml")],
            &body,
        )
        .await
        .status(400, "BadRequest");
        assert_eq!(
            message,
            "error decoding YAML: error converting YAML to JSON: yaml: exceeded max depth of 10000"
        );
    }
    // A managed fields entry is held to its own, smaller bound.
    let mut fields = json!({});
    for _ in 0..100 {
        fields = json!({ "f:x": fields });
    }
    let body = json!({
        "apiVersion": "farm.example.com/v1alpha", "kind": "Llama",
        "metadata": {"name": "managed", "managedFields": [{
            "manager": "m", "operation": "Update", "apiVersion": "farm.example.com/v1alpha",
            "fieldsType": "FieldsV1", "fieldsV1": fields,
        }]},
        "spec": {"weight": 1, "height": 1},
    });
    let message = call(&app, "POST", LLAMAS, &json_type, &body.to_string())
        .await
        .status(400, "BadRequest");
    assert_eq!(
        message,
        "metadata.managedFields[0].fieldsV1: nested deeper than 64 levels"
    );
    assert_eq!(get(&app, &format!("{LLAMAS}/dolly")).await.status, 200);
}

/// An apply body whose reading takes long: twenty values each nested 9,990 levels (within the
/// bound), a few seconds of parsing in a debug build.
fn slow_apply_body() -> String {
    let mut body =
        "apiVersion: farm.example.com/v1alpha\nkind: Llama\nmetadata:\n  name: slow\nspec:\n"
            .to_owned();
    for i in 0..20 {
        body.push_str(&format!("  deep{i}: {}\n", nested(9_990)));
    }
    body
}

/// Reading a deep apply body takes long (it took time that grew with the square of its
/// depth); it ran on the async worker and held every other request (and `/readyz`) until it
/// was done. Now it runs off the workers: a GET sent while two such bodies are read is
/// answered first.
#[tokio::test]
async fn deep_bodies_do_not_hold_other_requests() {
    let app = app();
    let body = slow_apply_body();
    let slow: Vec<_> = (0..2)
        .map(|_| {
            let (app, body) = (app.clone(), body.clone());
            tokio::spawn(async move {
                call(
                    &app,
                    "PATCH",
                    &format!("{LLAMAS}/slow?fieldManager=deep"),
                    &[("content-type", "application/apply-patch+yaml")],
                    &body,
                )
                .await
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let reply = get(&app, &format!("{LLAMAS}/dolly")).await;
    assert_eq!(reply.status, 200);
    let still_reading = slow.iter().filter(|task| !task.is_finished()).count();
    for task in slow {
        assert_eq!(task.await.unwrap().status, 400);
    }
    assert!(
        still_reading > 0,
        "the deep bodies were read before the GET was answered"
    );
}

/// A body that takes longer to work on than the request timeout is answered 504 in
/// kube-apiserver's words when the timeout passes, not when the work ends.
#[tokio::test]
async fn slow_body_work_ends_at_the_request_timeout() {
    let server = TestServer::start_with(Options {
        request_timeout: Duration::from_millis(300),
        ..Default::default()
    })
    .await;
    let raw = server.raw(Some(server.admin_identity()), Alpn::Http2);
    let body = slow_apply_body();
    let started = std::time::Instant::now();
    let reply = raw
        .send(
            "PATCH",
            &format!("{LLAMAS}/slow?fieldManager=deep"),
            &[("content-type", "application/apply-patch+yaml")],
            Some(body.into_bytes()),
        )
        .await;
    assert_eq!(reply.status, 504);
    assert!(started.elapsed() < Duration::from_secs(2));
    let status = reply.json();
    assert_eq!(status["reason"], "Timeout");
    assert_eq!(
        status["message"],
        "Timeout: request did not complete within the allotted timeout"
    );
}
