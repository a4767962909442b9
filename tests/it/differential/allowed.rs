//! Every difference from kube-apiserver the differential suite accepts, each with its reason
//! and what kube-apiserver does. Nothing else may differ.

use super::{Answer, Outcome};

/// One accepted difference.
pub(crate) struct Allowed {
    /// What differs.
    pub(crate) what: &'static str,
    /// Why farm-apiserver answers otherwise, and what kube-apiserver does.
    pub(crate) why: &'static str,
    /// Whether an outcome is this difference.
    matches: fn(&Outcome<'_>) -> bool,
}

fn answer<'a>(outcome: &'a Outcome<'_>) -> (&'a Answer, &'a Answer) {
    (&outcome.ours.1, &outcome.theirs.1)
}

pub(crate) const ALLOWED: &[Allowed] = &[
    Allowed {
        what: "server-side apply of a field the schema does not declare, or of a value of the wrong type",
        why: "kube-apiserver answers 500 InternalError (\"failed to create typed patch object (/NAME; farm.example.com/v1, Kind=Llama): .spec.colour: field not declared in schema\", or \".spec: expected map, got &{5}\"): the CRD's field manager cannot type the configuration. A client's mistake is no server error: farm-apiserver answers 400 BadRequest (unknown field) or 422 Invalid (wrong type) as for any other write.",
        matches: |outcome| {
            let (ours, theirs) = answer(outcome);
            outcome.case.content_type.as_deref() == Some("application/apply-patch+yaml")
                && theirs.code == 500
                && (ours.code == 400 || ours.code == 422)
        },
    },
    Allowed {
        what: "a write that sets spec.nickname to null",
        why: "the schema marks spec.nickname `nullable` (an optional field): kube-apiserver keeps an explicit null in the object it stores and serves (`\"nickname\": null`), counts it as a change of the spec (generation + 1) and records it in managedFields; farm-apiserver's Llama has no null nickname, only none (Rust's `Option`), so the null is dropped as the object is decoded and the spec, the generation and the managed fields are unchanged.",
        matches: |outcome| {
            let (ours, theirs) = answer(outcome);
            let nulls = outcome.case.body.as_ref().is_some_and(|b| {
                let text = b.to_string();
                text.contains("\"nickname\":null") || text.contains("\"path\":\"/spec/nickname\"")
            });
            let mut ours = ours.body.clone();
            let mut theirs = theirs.body.clone();
            for body in [&mut ours, &mut theirs] {
                if let Some(meta) = body["metadata"].as_object_mut() {
                    meta.remove("generation");
                    meta.remove("managedFields");
                }
                if let Some(spec) = body["spec"].as_object_mut()
                    && spec.get("nickname").is_some_and(serde_json::Value::is_null)
                {
                    spec.remove("nickname");
                }
            }
            nulls && ours == theirs
        },
    },
    Allowed {
        what: "a JSON patch `test` or `replace` of the whole document (path \"\") without a value",
        why: "kube-apiserver's handler panics (json-patch.v4 dereferences the missing value: `op.value()` is nil in `Patch.test` and `Patch.replace`) and the connection is aborted; farm-apiserver answers 422 Invalid, as for any patch that does not apply.",
        matches: |outcome| {
            let (ours, theirs) = answer(outcome);
            let whole_without_value = outcome.case.body.as_ref().is_some_and(|b| {
                b.as_array().into_iter().flatten().any(|op| {
                    op["path"] == ""
                        && op.get("value").is_none()
                        && (op["op"] == "test" || op["op"] == "replace")
                })
            });
            whole_without_value && theirs.code == 0 && ours.code == 422
        },
    },
    Allowed {
        what: "GET or LIST with resourceVersion=0 just after the object was created",
        why: "resourceVersion=0 lets kube-apiserver answer from its watch cache, which may not have seen the create yet (404, or a list without it); farm-apiserver's cache is written with the object, so it has it.",
        matches: |outcome| {
            let (ours, theirs) = answer(outcome);
            outcome.case.method == "GET"
                && outcome.case.query.contains("resourceVersion=0")
                && ours.code == 200
                && (theirs.code == 404
                    || theirs.body["items"].as_array().is_some_and(Vec::is_empty))
        },
    },
    Allowed {
        what: "GET or LIST with a resourceVersion that is not a number",
        why: "kube-apiserver answers 500 InternalError (\"resourceVersion: Invalid value: \\\"abc\\\": strconv.ParseUint: parsing \\\"abc\\\": invalid syntax\", from the cacher's ParseResourceVersion); a client's mistake is no server error, so farm-apiserver answers 400 BadRequest with the same words.",
        matches: |outcome| {
            let (ours, theirs) = answer(outcome);
            outcome.case.method == "GET"
                && outcome.case.query.contains("resourceVersion=abc")
                && ours.code == 400
                && theirs.code == 500
        },
    },
];

/// The accepted difference `outcome` is, if any.
pub(crate) fn why(outcome: &Outcome<'_>) -> Option<&'static Allowed> {
    // The setups must agree: a difference there is never allowed.
    if outcome.ours.0 != outcome.theirs.0 {
        return None;
    }
    ALLOWED.iter().find(|allowed| (allowed.matches)(outcome))
}
