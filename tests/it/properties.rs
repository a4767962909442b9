//! Property tests over everything a client sends that the server parses: whatever the input,
//! no panic, and every refusal is a `meta/v1 Status` with a client-error code (never a 500).
//! Inputs mix arbitrary bytes with fragments of the real grammar, so the parsers are driven
//! deep as well as wide.

use crate::common;

use aggregated_apiserver::{
    resource::validation,
    store::memory::ContinueToken,
    store::selector::{FieldSelector, LabelSelector},
};
use common::oneshot::*;
use proptest::prelude::*;
use serde_json::Value;

const LLAMAS: &str = "/apis/farm.example.com/v1alpha/namespaces/default/llamas";

/// Strings built from the selector, query and JSON grammars' own pieces, and arbitrary text.
fn grammar_soup() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        Just("app".to_owned()),
        Just("=".to_owned()),
        Just("==".to_owned()),
        Just("!=".to_owned()),
        Just(",".to_owned()),
        Just(" in ".to_owned()),
        Just(" notin ".to_owned()),
        Just("(".to_owned()),
        Just(")".to_owned()),
        Just("!".to_owned()),
        Just("metadata.name".to_owned()),
        Just("metadata.namespace".to_owned()),
        Just("/".to_owned()),
        Just("é".to_owned()),
        Just("\u{0}".to_owned()),
        Just("-".to_owned()),
        Just(".".to_owned()),
        "[a-z0-9]{0,70}",
        any::<String>(),
    ];
    prop::collection::vec(piece, 0..12).prop_map(|pieces| pieces.concat())
}

fn query_soup() -> impl Strategy<Value = String> {
    let name = prop_oneof![
        Just("labelSelector"),
        Just("fieldSelector"),
        Just("limit"),
        Just("continue"),
        Just("resourceVersion"),
        Just("resourceVersionMatch"),
        Just("timeoutSeconds"),
        Just("sendInitialEvents"),
        Just("allowWatchBookmarks"),
        Just("includeObject"),
        Just("dryRun"),
        Just("fieldValidation"),
        Just("pretty"),
        Just("%zz"),
    ];
    let value = prop_oneof![
        grammar_soup(),
        Just("-1".to_owned()),
        Just("18446744073709551616".to_owned()),
        Just("0".to_owned()),
        Just("NotOlderThan".to_owned()),
        Just("Exact".to_owned()),
        Just("true".to_owned()),
        Just("%".to_owned()),
    ];
    prop::collection::vec((name, value), 0..6).prop_map(|pairs| {
        pairs
            .into_iter()
            .map(|(n, v)| {
                format!(
                    "{n}={}",
                    percent_encoding::utf8_percent_encode(&v, percent_encoding::NON_ALPHANUMERIC)
                )
            })
            .collect::<Vec<_>>()
            .join("&")
    })
}

/// JSON documents shaped like Llamas, patches and lists, with any values in them.
fn json_soup() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<f64>()
            .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        any::<i64>().prop_map(|i| Value::Number(i.into())),
        grammar_soup().prop_map(Value::String),
    ];
    let value = leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(
                prop_oneof![
                    Just("apiVersion".to_owned()),
                    Just("kind".to_owned()),
                    Just("metadata".to_owned()),
                    Just("name".to_owned()),
                    Just("generateName".to_owned()),
                    Just("labels".to_owned()),
                    Just("annotations".to_owned()),
                    Just("spec".to_owned()),
                    Just("weight".to_owned()),
                    Just("op".to_owned()),
                    Just("path".to_owned()),
                    Just("from".to_owned()),
                    Just("value".to_owned()),
                    "[a-z]{1,8}",
                ],
                inner,
                0..6
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    });
    prop_oneof![
        8 => value.prop_map(|v| v.to_string()),
        1 => any::<String>(),
    ]
}

/// A GET's status, and its body only when it is an error (a watch's body never ends).
async fn head_of(app: &App, uri: &str) -> Reply {
    use http_body_util::BodyExt;
    let response = crate::common::oneshot::open(app, uri, &[]).await;
    let (status, headers) = (response.status(), response.headers().clone());
    let body = if status.as_u16() >= 400 {
        response
            .into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec()
    } else {
        Vec::new()
    };
    Reply {
        status,
        headers,
        body,
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A reply is a success, or a Status with a client-error code.
fn client_error_or_success(reply: &Reply) -> Result<(), TestCaseError> {
    let code = reply.status.as_u16();
    prop_assert!(
        code < 500,
        "{code}: {}",
        String::from_utf8_lossy(&reply.body)
    );
    if code >= 400 {
        let body: Value = serde_json::from_slice(&reply.body)
            .map_err(|e| TestCaseError::fail(format!("{code} not JSON: {e}")))?;
        prop_assert_eq!(&body["kind"], "Status");
        prop_assert_eq!(body["code"].as_u64(), Some(u64::from(code)));
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn selectors_parse_or_refuse(input in grammar_soup()) {
        let _ = LabelSelector::parse(&input);
        let _ = FieldSelector::parse(&input);
    }

    #[test]
    fn names_and_continue_tokens_never_panic(input in grammar_soup()) {
        let _ = validation::validate_name(&input);
        let _ = validation::validate_namespace(&input);
        let _ = ContinueToken::decode(&input);
    }

    #[test]
    fn list_and_watch_queries_are_answered_or_refused(query in query_soup(), watch in any::<bool>()) {
        let app = app();
        let query = if watch { format!("{query}&watch=true") } else { query };
        let reply = runtime().block_on(head_of(&app, &format!("{LLAMAS}?{query}")));
        client_error_or_success(&reply)?;
    }

    #[test]
    fn bodies_are_created_or_refused(body in json_soup()) {
        let app = app();
        let reply = runtime().block_on(call(&app, "POST", LLAMAS, &[("content-type", "application/json")], &body));
        client_error_or_success(&reply)?;
    }

    #[test]
    fn patches_apply_or_are_refused(body in json_soup(), json_patch in any::<bool>(), dry_run in any::<bool>()) {
        let app = app();
        let content_type = if json_patch { "application/json-patch+json" } else { "application/merge-patch+json" };
        let uri = format!("{LLAMAS}/dolly{}", if dry_run { "?dryRun=All" } else { "" });
        let reply = runtime().block_on(call(&app, "PATCH", &uri, &[("content-type", content_type)], &body));
        client_error_or_success(&reply)?;
        // A refused patch leaves the Llama as it was.
        if reply.status.as_u16() >= 400 || dry_run {
            let after = runtime().block_on(get(&app, &format!("{LLAMAS}/dolly"))).json();
            prop_assert_eq!(&after["spec"], &serde_json::json!({"weight": 31.4, "height": 0.5}));
        }
    }
}

/// How a deep value is nested: arrays, objects, or both by turns.
#[derive(Debug, Clone, Copy)]
enum Shape {
    Arrays,
    Objects,
    Mixed,
}

/// A JSON value `depth` levels deep in `shape` (flow style, so also YAML).
fn nested(depth: usize, shape: Shape) -> String {
    let mut open = String::with_capacity(depth * 6);
    let mut close = String::with_capacity(depth * 2);
    for level in 0..depth {
        let object = match shape {
            Shape::Arrays => false,
            Shape::Objects => true,
            Shape::Mixed => level % 2 == 0,
        };
        if object {
            open.push_str("{\"k\":");
            close.push('}');
        } else {
            open.push('[');
            close.push(']');
        }
    }
    format!("{open}1{}", close.chars().rev().collect::<String>())
}

proptest! {
    // Each case sends a body up to 10,040 levels deep through the whole stack: few cases.
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Depth near Go's bound × shape × verb × encoding: every reply is a success or a
    /// client error; past the bound it is always a refusal; nothing is stored from a refusal,
    /// and the server answers a GET afterwards (a crash would end the test process).
    #[test]
    fn nesting_depth_and_body_shape(
        offset in -40i64..40,
        shape in prop_oneof![Just(Shape::Arrays), Just(Shape::Objects), Just(Shape::Mixed)],
        verb in 0usize..5,
        yaml in any::<bool>(),
    ) {
        let app = app();
        // The Llama itself and `spec` are two levels: the value goes at depth 3.
        let depth = usize::try_from(9_998 + offset).unwrap_or(1);
        let value = nested(depth, shape);
        let object = format!(
            r#"{{"apiVersion":"farm.example.com/v1alpha","kind":"Llama","metadata":{{"name":"deep"}},"spec":{{"weight":1,"height":1,"deep":{value}}}}}"#
        );
        let (method, uri, content_type, body) = match verb {
            0 => ("POST", format!("{LLAMAS}?fieldValidation=Ignore"), if yaml { "application/yaml" } else { "application/json" }, object),
            1 => ("PATCH", format!("{LLAMAS}/dolly?fieldValidation=Ignore"), "application/merge-patch+json", format!(r#"{{"spec":{{"deep":{value}}}}}"#)),
            2 => ("PATCH", format!("{LLAMAS}/dolly?fieldValidation=Ignore"), "application/json-patch+json", format!(r#"[{{"op":"add","path":"/spec/deep","value":{value}}}]"#)),
            3 => ("PATCH", format!("{LLAMAS}/deep?fieldManager=p"), "application/apply-patch+yaml", object),
            _ => ("PATCH", format!("{LLAMAS}/dolly?fieldValidation=Ignore"), "application/json-patch+json", format!(r#"[{{"op":"add","path":"/spec/a","value":{value}}},{{"op":"move","from":"/spec/a","path":"/spec/b"}},{{"op":"copy","from":"/spec/b","path":"/spec/c"}}]"#)),
        };
        let reply = runtime().block_on(call(&app, method, &uri, &[("content-type", content_type)], &body));
        client_error_or_success(&reply)?;
        if depth + 2 > 10_000 {
            prop_assert!(reply.status.as_u16() >= 400, "{depth} levels accepted by {method} {content_type}");
        }
        let after = runtime().block_on(get(&app, &format!("{LLAMAS}/dolly")));
        prop_assert_eq!(after.status.as_u16(), 200);
        prop_assert_eq!(&after.json()["spec"], &serde_json::json!({"weight": 31.4, "height": 0.5}));
    }
}

/// Paths under the group's version (and beside it) made of the API's own segments and a few
/// others, with stray and doubled slashes.
fn path_soup() -> impl Strategy<Value = String> {
    let prefix = prop_oneof![
        4 => Just("/apis/farm.example.com/v1alpha/"),
        1 => Just("/apis/farm.example.com/v1alpha"),
        1 => Just("//apis/farm.example.com/v1alpha/"),
        1 => Just("/apis/farm.example.com/v1/"),
        1 => Just("/api/v1/"),
        1 => Just(""),
    ];
    let segment = prop_oneof![
        Just("namespaces"),
        Just("default"),
        Just("llamas"),
        Just("farmpods"),
        Just("dolly"),
        Just("status"),
        Just("scale"),
        Just(""),
        Just("d%2Fx"),
        Just("%zz"),
    ];
    (prefix, prop::collection::vec(segment, 0..6), any::<bool>()).prop_map(
        |(prefix, segments, trail)| {
            format!(
                "{prefix}{}{}",
                segments.join("/"),
                if trail { "/" } else { "" }
            )
        },
    )
}

/// The served kinds' endpoints, built once for the property below.
fn endpoints() -> &'static aggregated_apiserver::rest::Endpoints {
    static ENDPOINTS: std::sync::OnceLock<std::sync::Arc<aggregated_apiserver::rest::Endpoints>> =
        std::sync::OnceLock::new();
    ENDPOINTS.get_or_init(|| {
        let (options, _) = common::oneshot_identity();
        runtime().block_on(async {
            let (state, _shutdown) = common::memory_state(false, options);
            state.endpoints.clone()
        })
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4096, ..ProptestConfig::default() })]

    /// Authorization judges what is served: where routing finds a resource endpoint, the
    /// request info built from what it found (the edge's one split of the path) is what
    /// kube-apiserver's RequestInfo parsing of the whole path gives.
    #[test]
    fn routed_request_info_is_the_parsed_one(
        path in path_soup(),
        method in prop_oneof![Just("GET"), Just("POST"), Just("PUT"), Just("PATCH"), Just("DELETE"), Just("HEAD")],
        query in prop_oneof![Just(None), Just(Some("watch=true")), Just(Some("watch=1&limit=2")), Just(Some("watch=false"))],
    ) {
        use aggregated_apiserver::request_info::RequestInfo;
        let method = axum::http::Method::from_bytes(method.as_bytes()).unwrap();
        if let Some(target) = endpoints().find(&path) {
            prop_assert_eq!(
                target.request_info(&method, &path, query),
                RequestInfo::parse(&method, &path, query)
            );
        }
    }
}

/// The property above routes: these are resource endpoints, whose request info is the parsed
/// one; the others are not.
#[test]
fn routing_finds_the_resource_endpoints() {
    use aggregated_apiserver::request_info::RequestInfo;
    let base = "/apis/farm.example.com/v1alpha";
    for (path, routed) in [
        (format!("{base}/llamas"), true),
        (format!("{base}/namespaces/default/llamas"), true),
        (format!("{base}/namespaces/default/llamas/dolly"), true),
        // Llamas have no status subresource (the Barns of third_kind do).
        (
            format!("{base}/namespaces/default/llamas/dolly/status"),
            false,
        ),
        (format!("{base}/namespaces/default/farmpods/p"), true),
        (
            format!("{base}/namespaces/default/farmpods/p/status"),
            false,
        ),
        (format!("{base}/namespaces/default/llamas/dolly/"), false),
        (format!("{base}/llamas/dolly"), false),
        (format!("{base}//llamas"), false),
        (format!("/{base}/llamas"), false),
        (format!("{base}/namespaces//llamas"), false),
        (
            format!("{base}/namespaces/default/llamas/dolly/scale"),
            false,
        ),
    ] {
        let target = endpoints().find(&path);
        assert_eq!(target.is_some(), routed, "{path}");
        if let Some(target) = target {
            let method = axum::http::Method::GET;
            assert_eq!(
                target.request_info(&method, &path, None),
                RequestInfo::parse(&method, &path, None),
                "{path}"
            );
        }
    }
}
