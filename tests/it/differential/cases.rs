//! The differential suite's cases: the fixed ones (each difference found once, kept) and the
//! proptest strategies that generate the rest. In bodies and queries, `NAME` is the case's
//! object, `RVSET` the resourceVersion its setup object was created with, and
//! `farm.example.com` the group of the side the request goes to.

use proptest::{
    prelude::*,
    strategy::{Strategy, ValueTree},
    test_runner::{Config, RngAlgorithm, TestRng, TestRunner},
};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

/// Where a request goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Target {
    /// `.../llamas`
    Collection,
    /// `.../llamas/NAME`
    Item,
    /// `.../llamas/NAME-missing`: an object that does not exist.
    Missing,
}

/// One request, and the object created before it (if any).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Case {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) setup: Option<Value>,
    pub(crate) method: String,
    pub(crate) target: Target,
    #[serde(default)]
    pub(crate) query: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) content_type: Option<String>,
    /// JSON; a string is sent as it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) body: Option<Value>,
}

const JSON: &str = "application/json";
const MERGE: &str = "application/merge-patch+json";
const JSON_PATCH: &str = "application/json-patch+json";
const APPLY: &str = "application/apply-patch+yaml";

impl Case {
    /// A create of `object`.
    pub(crate) fn create(object: Value) -> Self {
        Case {
            setup: None,
            method: "POST".into(),
            target: Target::Collection,
            query: String::new(),
            content_type: Some(JSON.into()),
            body: Some(object),
        }
    }

    fn on(setup: Value, method: &str, target: Target, content_type: &str, body: Value) -> Self {
        Case {
            setup: Some(setup),
            method: method.into(),
            target,
            query: String::new(),
            content_type: Some(content_type.into()),
            body: Some(body),
        }
    }

    fn query(mut self, query: &str) -> Self {
        self.query = query.into();
        self
    }
}

/// A valid Llama named `NAME`, with `meta` merged into its metadata.
fn llama(meta: Value) -> Value {
    let mut object = json!({
        "apiVersion": "farm.example.com/v1",
        "kind": "Llama",
        "metadata": {"name": "NAME", "labels": {"case": "NAME"}},
        "spec": {"weightKg": 40, "heightMetres": 1.5},
    });
    if let (Some(into), Value::Object(meta)) = (object["metadata"].as_object_mut(), meta) {
        into.extend(meta);
    }
    object
}

/// The cases the issue found and every difference found since: kept, so none comes back.
pub(crate) fn fixed() -> Vec<Case> {
    let with_finalizers = llama(json!({"finalizers": ["example.com/a", "example.com/b"]}));
    let with_label = llama(json!({"labels": {"only": "one"}}));
    vec![
        // kube-rs's finalizer(): test the missing member against null, then add it.
        Case::on(
            llama(json!({})),
            "PATCH",
            Target::Item,
            JSON_PATCH,
            json!([
                {"op": "test", "path": "/metadata/finalizers", "value": null},
                {"op": "add", "path": "/metadata/finalizers", "value": ["example.com/x"]}
            ]),
        ),
        // Negative indices.
        Case::on(
            with_finalizers.clone(),
            "PATCH",
            Target::Item,
            JSON_PATCH,
            json!([{"op": "add", "path": "/metadata/finalizers/-1", "value": "example.com/c"}]),
        ),
        Case::on(
            with_finalizers.clone(),
            "PATCH",
            Target::Item,
            JSON_PATCH,
            json!([{"op": "remove", "path": "/metadata/finalizers/-1"}]),
        ),
        Case::on(
            with_finalizers.clone(),
            "PATCH",
            Target::Item,
            JSON_PATCH,
            json!([{"op": "replace", "path": "/metadata/finalizers/-2", "value": "example.com/z"}]),
        ),
        // replace of a missing member adds it; an operation without value is null.
        Case::on(
            llama(json!({})),
            "PATCH",
            Target::Item,
            JSON_PATCH,
            json!([{"op": "replace", "path": "/spec/nickname", "value": "Dolly"}]),
        ),
        Case::on(
            llama(json!({})),
            "PATCH",
            Target::Item,
            JSON_PATCH,
            json!([{"op": "add", "path": "/spec/nickname"}]),
        ),
        // Removing the last label or finalizer leaves none.
        Case::on(
            with_label.clone(),
            "PATCH",
            Target::Item,
            JSON_PATCH,
            json!([{"op": "remove", "path": "/metadata/labels/only"}, {"op": "remove", "path": "/metadata/labels/case"}]),
        ),
        Case::on(
            llama(json!({"finalizers": ["example.com/a"]})),
            "PATCH",
            Target::Item,
            JSON_PATCH,
            json!([{"op": "remove", "path": "/metadata/finalizers/0"}]),
        ),
        // Wrong types, missing fields, a wrong kind: 422 with a cause per field.
        Case::create(json!({"apiVersion": "farm.example.com/v1", "kind": "Llama",
            "metadata": {"name": "NAME"}, "spec": {"weightKg": "heavy", "heightMetres": 1}})),
        Case::create(json!({"apiVersion": "farm.example.com/v1", "kind": "Llama",
            "metadata": {"name": "NAME"}, "spec": {"heightMetres": 1}})),
        Case::create(json!({"apiVersion": "farm.example.com/v1", "kind": "Llama",
            "metadata": {"name": "NAME"}})),
        Case::create(json!({"apiVersion": "farm.example.com/v1", "kind": "Cow",
            "metadata": {"name": "NAME"}, "spec": {"weightKg": 1, "heightMetres": 1}})),
        Case::on(
            llama(json!({})),
            "PATCH",
            Target::Item,
            MERGE,
            json!({"spec": {"weightKg": null}}),
        ),
        // Empty collections are dropped.
        Case::create(llama(
            json!({"labels": {}, "annotations": {}, "finalizers": [], "ownerReferences": []}),
        )),
        // An owner reference without a uid.
        Case::create(llama(
            json!({"ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": ""}]}),
        )),
        // A PUT of an object that does not exist is 404, whatever it holds.
        Case::on(
            llama(json!({})),
            "PUT",
            Target::Missing,
            JSON,
            llama(json!({"name": "NAME-missing"})),
        ),
        Case::on(
            llama(json!({})),
            "PUT",
            Target::Missing,
            JSON,
            json!({"apiVersion": "farm.example.com/v1", "kind": "Llama", "metadata": {"name": "NAME-missing"}, "spec": {"weightKg": "x"}}),
        ),
        // Found by the generator, kept.
        // An update checks metadata three times (the generic store's common checks, the CRD's).
        Case::on(llama(json!({})), "PATCH", Target::Item, MERGE,
            json!({"metadata": {"labels": {"app.kubernetes.io/name": "-v-"}, "annotations": {"Bad Key": ""}}})),
        // ...and before a wrong kind stops the kind's own checks.
        Case::on(llama(json!({})), "PUT", Target::Item, JSON,
            json!({"apiVersion": "farm.example.com/v1", "kind": "Cow", "metadata": {"name": "NAME", "resourceVersion": "RVSET", "labels": {"a": "bad value"}}, "spec": 5})),
        // Strict: unknown fields are refused (400) before a type is judged.
        Case::on(llama(json!({})), "PUT", Target::Item, JSON,
            json!({"apiVersion": "farm.example.com/v1", "kind": "Llama", "metadata": {"name": "NAME", "resourceVersion": "RVSET"}, "spec": {"colour": "brown", "heightMetres": "x", "weightKg": 40}}))
            .query("?fieldValidation=Strict"),
        // A body's unknown fields are warned of whatever the answer (here a name mismatch).
        Case::on(llama(json!({})), "PUT", Target::Item, JSON,
            json!({"apiVersion": "farm.example.com/v1", "kind": "Llama", "metadata": {"name": "Bad_NAME", "resourceVersion": "RVSET"}, "spec": {"colour": "brown", "heightMetres": 1, "weightKg": 1}})),
        // A stale resourceVersion is a 409 before the object's validity (#51's one pipeline:
        // kube-apiserver's Update compares it before the strategy validates).
        Case::on(llama(json!({})), "PUT", Target::Item, JSON,
            json!({"apiVersion": "farm.example.com/v1", "kind": "Llama", "metadata": {"name": "NAME", "resourceVersion": "1"}, "spec": {"heightMetres": 1, "weightKg": -1}})),
        Case::on(llama(json!({})), "PUT", Target::Item, JSON,
            json!({"apiVersion": "farm.example.com/v1", "kind": "Llama", "metadata": {"name": "NAME", "resourceVersion": "1", "labels": {"a": "bad value"}}, "spec": {"heightMetres": 1, "weightKg": 1}})),
        Case::on(llama(json!({})), "PATCH", Target::Item, MERGE,
            json!({"metadata": {"resourceVersion": "1"}, "spec": {"weightKg": -1}})),
        // Another version of the group: 400, its fields unknown.
        Case::create(json!({"apiVersion": "farm.example.com/v2", "kind": "Llama", "metadata": {"name": "NAME"}, "spec": {"weightKg": 1, "heightMetres": 1}})),
        // No name: every cause at once, not only the name's.
        Case::create(json!({"apiVersion": "farm.example.com/v1", "kind": "Llama", "metadata": {"finalizers": ["a/b/c"]}, "spec": {"weightKg": 0, "heightMetres": 40}})),
        // A generated name that is no DNS name, beside a missing spec.
        Case::create(json!({"apiVersion": "farm.example.com/v1", "kind": "Llama", "metadata": {"generateName": "Bad_"}, "spec": null})),
        // A JSON patch result whose metadata is no ObjectMeta: an invalid `patch` (422).
        Case::on(llama(json!({})), "PATCH", Target::Item, JSON_PATCH,
            json!([{"op": "replace", "path": "/metadata/labels", "value": []}])),
        // A wrong type where the schema has no properties: what it holds is unknown.
        Case::on(llama(json!({})), "PATCH", Target::Item, JSON_PATCH,
            json!([{"op": "replace", "path": "/spec/weightKg", "value": {"weightKg": 2}}])),
        // Numbers compared as texts: 40 is what a GET shows, 40.0 is not.
        Case::on(llama(json!({})), "PATCH", Target::Item, JSON_PATCH,
            Value::String(r#"[{"op": "test", "path": "/spec/weightKg", "value": 40.0}]"#.into())),
        // A test of the whole document without a value (allowed: kube-apiserver panics).
        Case::on(llama(json!({})), "PATCH", Target::Item, JSON_PATCH, json!([{"op": "test", "path": ""}])),
        // A JSON patch whose result has no kind: an invalid `patch` (422), not a bad body.
        Case::on(llama(json!({})), "PATCH", Target::Item, JSON_PATCH,
            json!([{"op": "replace", "path": "", "value": {"heightMetres": 3, "weightKg": 2}}]))
            .query("?fieldValidation=Warn"),
        // Owner references given twice are kept once, with kube-apiserver's warning.
        Case::create(llama(json!({"ownerReferences": [
            {"apiVersion": "v1", "kind": "Event", "name": "", "uid": ""},
            {"apiVersion": "v1", "kind": "Event", "name": "", "uid": ""}]}))),
        Case::on(llama(json!({})), "PATCH", Target::Item, MERGE,
            json!({"metadata": {"ownerReferences": [
                {"apiVersion": "v1", "kind": "ConfigMap", "name": "o", "uid": "u-1"},
                {"apiVersion": "v1", "kind": "ConfigMap", "name": "o", "uid": "u-1"}]}})),
        // ...but only once the PUT names its object (a name mismatch is 400 without it).
        Case::on(llama(json!({})), "PUT", Target::Item, JSON,
            json!({"apiVersion": "farm.example.com/v1", "kind": "Llama", "metadata": {"ownerReferences": [
                {"apiVersion": "apps/v1", "kind": "Event", "name": "owner", "uid": "u-1"},
                {"apiVersion": "apps/v1", "kind": "Event", "name": "owner", "uid": "u-1"}]},
                "spec": {"heightMetres": 40, "weightKg": 1}})),
        // A patched object whose metadata is no ObjectMeta: 422 `patch`, no unknown fields named.
        Case::on(llama(json!({})), "PATCH", Target::Item, JSON_PATCH, json!([
            {"op": "add", "path": "/spec/weightKg", "value": {"heightMetres": 3, "weightKg": 2}},
            {"op": "add", "path": "/metadata/labels/new", "value": {"heightMetres": 3}}])),
        // A foreground delete of an object that names foregroundDeletion twice: the set is the
        // same, so the finalizers stay as they are.
        Case::on(llama(json!({"finalizers": ["foregroundDeletion", "foregroundDeletion"]})), "DELETE", Target::Item, JSON,
            json!({"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Foreground"})),
        // A merge patch that changes nothing but names an unknown field (warned of).
        Case::on(llama(json!({})), "PATCH", Target::Item, MERGE,
            json!({"metadata": {"labels": {"case": "NAME"}}, "spec": {"colour": "brown"}}))
            .query("?fieldValidation=Warn"),
        // A GET with a resourceVersion that is no number (allowed: 400 here, 500 there).
        Case {
            setup: Some(llama(json!({}))),
            method: "GET".into(),
            target: Target::Item,
            query: "?resourceVersion=abc".into(),
            content_type: None,
            body: None,
        },
    ]
}

fn pick<T: Clone + std::fmt::Debug + 'static>(items: &[T]) -> impl Strategy<Value = T> + use<T> {
    proptest::sample::select(items.to_vec())
}

/// A value a spec number may be sent as.
fn number() -> impl Strategy<Value = Option<Value>> {
    prop_oneof![
        6 => pick(&[json!(1), json!(40), json!(2.5), json!(1e3), json!(0.001)]).prop_map(Some),
        1 => pick(&[json!(0), json!(-1), json!(-0.5), json!("x"), json!(null), json!(true), json!([1]), json!({})]).prop_map(Some),
        1 => Just(None),
    ]
}

fn spec() -> impl Strategy<Value = Option<Value>> {
    let nickname = prop_oneof![
        4 => Just(None),
        2 => pick(&[json!("Dolly"), json!("")]).prop_map(Some),
        1 => pick(&[json!(null), json!("n".repeat(64)), json!(5)]).prop_map(Some),
    ];
    let fields = (number(), number(), nickname, proptest::bool::weighted(0.1)).prop_map(
        |(weight, height, nickname, extra)| {
            let mut spec = Map::new();
            for (key, value) in [
                ("weightKg", weight),
                ("heightMetres", height),
                ("nickname", nickname),
            ] {
                if let Some(value) = value {
                    spec.insert(key.into(), value);
                }
            }
            if extra {
                spec.insert("colour".into(), json!("brown"));
            }
            Some(Value::Object(spec))
        },
    );
    prop_oneof![
        12 => fields,
        1 => Just(None),
        1 => pick(&[json!(null), json!(5), json!("spec")]).prop_map(Some),
    ]
}

fn labels() -> impl Strategy<Value = Option<Value>> {
    let key = pick(&[
        "a",
        "app.kubernetes.io/name",
        "bad key",
        "x/y/z",
        "-a",
        "example.com/",
    ]);
    let value = pick(&["v", "", "bad value", "-v-"]);
    prop_oneof![
        3 => Just(None),
        4 => proptest::collection::btree_map(key, value, 0..3)
            .prop_map(|m| Some(json!(m))),
    ]
}

fn metadata() -> impl Strategy<Value = Value> {
    let annotations = proptest::option::weighted(
        0.3,
        proptest::collection::btree_map(
            pick(&["a", "example.com/b", "Bad Key", "UPPER"]),
            pick(&["x", "", "<a & b>"]),
            0..3,
        ),
    );
    let finalizers = proptest::option::weighted(
        0.3,
        proptest::collection::vec(
            pick(&[
                "example.com/f",
                "nodomain",
                "orphan",
                "foregroundDeletion",
                "bad finalizer",
                "a/b/c",
            ]),
            0..3,
        ),
    );
    let owner = (
        pick(&["v1", "", "a/b/c", "apps/v1"]),
        pick(&["ConfigMap", "", "Event"]),
        pick(&["owner", ""]),
        pick(&["u-1", ""]),
        proptest::option::of(any::<bool>()),
    )
        .prop_map(|(api_version, kind, name, uid, controller)| {
            let mut owner =
                json!({"apiVersion": api_version, "kind": kind, "name": name, "uid": uid});
            if let Some(controller) = controller {
                owner["controller"] = json!(controller);
            }
            owner
        });
    let owners = proptest::option::weighted(0.15, proptest::collection::vec(owner, 0..3));
    let name = prop_oneof![
        12 => Just(json!({"name": "NAME"})),
        1 => Just(json!({"name": "Bad_NAME"})),
        1 => Just(json!({"generateName": "NAME-"})),
        1 => Just(json!({"generateName": "Bad_"})),
        1 => Just(json!({})),
    ];
    (name, labels(), annotations, finalizers, owners).prop_map(
        |(name, labels, annotations, finalizers, owners)| {
            let mut meta = name;
            let mut case_label = json!({"case": "NAME"});
            if let Some(Value::Object(labels)) = labels {
                case_label.as_object_mut().unwrap().extend(labels);
            }
            meta["labels"] = case_label;
            if let Some(annotations) = annotations {
                meta["annotations"] = json!(annotations);
            }
            if let Some(finalizers) = finalizers {
                meta["finalizers"] = json!(finalizers);
            }
            if let Some(owners) = owners {
                meta["ownerReferences"] = json!(owners);
            }
            meta
        },
    )
}

/// A whole object: mostly a Llama, sometimes another kind or version, or no metadata.
fn object() -> impl Strategy<Value = Value> {
    let kind = prop_oneof![10 => Just(Some("Llama")), 1 => Just(Some("Cow")), 1 => Just(None)];
    let api_version = prop_oneof![
        12 => Just("farm.example.com/v1"),
        1 => Just("farm.example.com/v2"),
    ];
    (kind, api_version, metadata(), spec()).prop_map(|(kind, api_version, metadata, spec)| {
        let mut object = json!({"apiVersion": api_version, "metadata": metadata});
        if let Some(kind) = kind {
            object["kind"] = json!(kind);
        }
        if let Some(spec) = spec {
            object["spec"] = spec;
        }
        object
    })
}

fn query() -> impl Strategy<Value = &'static str> {
    prop_oneof![
        6 => Just(""),
        1 => Just("?fieldValidation=Strict"),
        1 => Just("?fieldValidation=Warn"),
        1 => Just("?fieldValidation=Ignore"),
        1 => Just("?dryRun=All"),
    ]
}

fn json_patch_operation() -> impl Strategy<Value = Value> {
    let path = || {
        pick(&[
            "/metadata/labels",
            "/metadata/labels/case",
            "/metadata/labels/new",
            "/metadata/finalizers",
            "/metadata/finalizers/0",
            "/metadata/finalizers/-1",
            "/metadata/finalizers/-",
            "/metadata/annotations",
            "/spec/weightKg",
            "/spec/nickname",
            "/spec",
            "/nope/x",
            "",
        ])
    };
    let value = prop_oneof![
        pick(&[
            json!(null),
            json!(5),
            json!(1.0),
            json!("x"),
            json!("example.com/f")
        ]),
        pick(&[
            json!(["example.com/f"]),
            json!({"a": "b"}),
            json!({}),
            json!([]),
            json!(40)
        ]),
        pick(&[json!({"weightKg": 2, "heightMetres": 3})]),
    ];
    let op = pick(&["add", "remove", "replace", "test", "move", "copy", "bogus"]);
    (op, path(), path(), proptest::option::weighted(0.8, value)).prop_map(
        |(op, path, from, value)| {
            let mut operation = json!({"op": op, "path": path});
            if matches!(op, "move" | "copy") {
                operation["from"] = json!(from);
            }
            if let Some(value) = value {
                operation["value"] = value;
            }
            operation
        },
    )
}

fn merge_patch() -> impl Strategy<Value = Value> {
    (metadata(), spec(), proptest::bool::weighted(0.1)).prop_map(|(meta, spec, nulls)| {
        let mut patch = json!({});
        // A patch names a few of the object's fields, not its name.
        let meta = meta.as_object().cloned().unwrap_or_default();
        let mut m = Map::new();
        for key in ["labels", "annotations", "finalizers"] {
            if let Some(value) = meta.get(key) {
                m.insert(key.into(), if nulls { Value::Null } else { value.clone() });
            }
        }
        if !m.is_empty() {
            patch["metadata"] = Value::Object(m);
        }
        if let Some(spec) = spec {
            patch["spec"] = spec;
        }
        patch
    })
}

/// An object a case's request is about, created first: a Llama with generated metadata.
fn setup() -> impl Strategy<Value = Value> {
    metadata().prop_map(|meta| {
        let mut meta = meta;
        meta["name"] = json!("NAME");
        if let Some(m) = meta.as_object_mut() {
            m.remove("generateName");
            m.remove("ownerReferences");
        }
        llama(meta)
    })
}

/// One generated case.
fn case() -> impl Strategy<Value = Case> {
    prop_oneof![
        4 => (object(), query()).prop_map(|(object, query)| Case::create(object).query(query)),
        2 => (setup(), object(), query(), proptest::bool::weighted(0.8), proptest::bool::weighted(0.1))
            .prop_map(|(setup, mut object, query, with_rv, missing)| {
                if with_rv {
                    object["metadata"]["resourceVersion"] = json!("RVSET");
                }
                let target = if missing { Target::Missing } else { Target::Item };
                if missing {
                    object["metadata"]["name"] = json!("NAME-missing");
                }
                Case::on(setup, "PUT", target, JSON, object).query(query)
            }),
        3 => (setup(), merge_patch(), query())
            .prop_map(|(setup, patch, query)| Case::on(setup, "PATCH", Target::Item, MERGE, patch).query(query)),
        4 => (setup(), proptest::collection::vec(json_patch_operation(), 1..4), query())
            .prop_map(|(setup, ops, query)| Case::on(setup, "PATCH", Target::Item, JSON_PATCH, json!(ops)).query(query)),
        2 => (setup(), object(), proptest::bool::ANY)
            .prop_map(|(setup, mut object, force)| {
                object["metadata"]["name"] = json!("NAME");
                let query = if force { "?fieldManager=diff&force=true" } else { "?fieldManager=diff" };
                Case::on(setup, "PATCH", Target::Item, APPLY, object).query(query)
            }),
        1 => (setup(), pick(&["", "Orphan", "Background", "Foreground", "Sideways"]), proptest::bool::weighted(0.2))
            .prop_map(|(setup, policy, precondition)| {
                let mut options = json!({"apiVersion": "v1", "kind": "DeleteOptions"});
                if !policy.is_empty() {
                    options["propagationPolicy"] = json!(policy);
                }
                if precondition {
                    options["preconditions"] = json!({"uid": "not-the-uid"});
                }
                Case::on(setup, "DELETE", Target::Item, JSON, options)
            }),
        // Lists are of the case's own object (others are being written meanwhile).
        1 => (setup(), pick(&["?labelSelector=case%3DNAME", "?resourceVersion=0&labelSelector=case%3DNAME", "?labelSelector=case%3DNAME,a+b", "?labelSelector=case%3DNAME&fieldSelector=metadata.name%3DNAME", "?labelSelector=case%3DNAME&fieldSelector=spec.weightKg%3D1", "?limit=1&labelSelector=case%3DNAME"]))
            .prop_map(|(setup, query)| Case {
                setup: Some(setup),
                method: "GET".into(),
                target: Target::Collection,
                query: query.into(),
                content_type: None,
                body: None,
            }),
        1 => (setup(), pick(&["", "?resourceVersion=0"]), proptest::bool::weighted(0.2))
            .prop_map(|(setup, query, missing)| Case {
                setup: Some(setup),
                method: "GET".into(),
                target: if missing { Target::Missing } else { Target::Item },
                query: query.into(),
                content_type: None,
                body: None,
            }),
    ]
}

/// `count` cases from `seed`.
pub(crate) fn generated(count: usize, seed: u64) -> Vec<Case> {
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &bytes);
    let mut runner = TestRunner::new_with_rng(Config::default(), rng);
    let strategy = case();
    (0..count)
        .map(|_| strategy.new_tree(&mut runner).expect("a case").current())
        .collect()
}
