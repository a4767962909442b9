//! JSON patch (RFC 6902) and JSON merge patch (RFC 7386) exactly as kube-apiserver applies them:
//! k8s.io/apiserver's patch handler and its admission webhooks use
//! `gopkg.in/evanphx/json-patch.v4`, which departs from the RFCs in ways clients rely on (kube-rs's
//! `finalizer()` tests a missing member against `null`). Every patch the server applies goes
//! through here: a client's, a webhook's, a mutating policy's.
//!
//! What json-patch.v4 does and the RFC does not:
//! - a path's first segment is skipped whatever it is (`a/b` is `/b`); `""` names the document
//!   only for `replace` and `test`;
//! - `test` of a missing member, or of one that is `null`, passes against `null` or no `value`;
//!   scalars are equal only when their JSON texts are (as the document is encoded: `1` is not
//!   `1.0`, `"<"` is not `"\u003c"`), objects whatever their key order;
//! - negative array indices count from the end (for `add`, `-1` is the end itself);
//! - `replace` of a missing object member adds it; `copy` from a missing member copies `null`;
//! - an operation without `value` uses `null`; an element that is `null` is an unknown operation.
//!
//! Errors carry json-patch.v4's own words.
//!
//! Known departures, none of which a patch made from a GET's object meets: json-patch keeps the
//! raw text of the values a patch adds, so a later `test` in the same patch compares with what
//! was sent (`1.0`), where this compares with what a GET would show (`1`); it tells an
//! explicit `"value": null` from a missing member, where this has one `null`; it passes lone
//! UTF-16 surrogates through, which serde_json refuses (422 here); and under
//! `fieldValidation=Strict` it refuses an operation that names a member twice.

pub mod depth;
mod merge;
mod pointer;
#[cfg(test)]
mod tests;

pub use fieldmanager::{go_float, go_json as go_text};
pub use merge::{BAD_MERGE_PATCH, merge};

use pointer::{add, equal, find_object, get, index, remove};
use serde_json::{Value, value::RawValue};

/// One operation as sent: its members, raw (`None` for an element that is `null`).
#[derive(Debug, Clone)]
pub struct Operation {
    members: Option<Vec<(String, Box<RawValue>)>>,
}

/// A decoded JSON patch: its operations, in order.
#[derive(Debug, Clone, Default)]
pub struct Patch {
    operations: Vec<Operation>,
}

impl serde::Serialize for Patch {
    /// As sent (an audit annotation records a webhook's patch).
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{SerializeMap, SerializeSeq};
        struct Members<'a>(&'a [(String, Box<RawValue>)]);
        impl serde::Serialize for Members<'_> {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                let mut map = serializer.serialize_map(Some(self.0.len()))?;
                for (key, value) in self.0 {
                    map.serialize_entry(key, value)?;
                }
                map.end()
            }
        }
        let mut seq = serializer.serialize_seq(Some(self.operations.len()))?;
        for operation in &self.operations {
            seq.serialize_element(&operation.members.as_deref().map(Members))?;
        }
        seq.end()
    }
}

/// Why a patch did not apply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApplyError {
    /// The operation that failed (0-based).
    pub index: usize,
    /// Its `op` and `path`, as sent (`move "/spec"`).
    pub operation: String,
    /// A `test` whose value did not match (json-patch's `ErrTestFailed`): a mutating policy
    /// ignores the rest of its patch then.
    pub test_failed: bool,
    /// json-patch.v4's message.
    pub message: String,
}

impl std::fmt::Display for ApplyError {
    /// json-patch's message after the operation that failed (which json-patch leaves out).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "operation {} ({}): {}",
            self.index, self.operation, self.message
        )
    }
}

/// What bounds an application: copies' accumulated size and the result's depth.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Bytes `copy` operations may add in all (kube-apiserver's `JSONPatchMaxCopyBytes`).
    pub copy_bytes: usize,
    /// How deep arrays and objects may nest in the result.
    pub depth: usize,
}

/// Go's `json.Unmarshal` type name of a JSON text's first value, as its errors word it.
pub(super) fn json_kind(raw: &str) -> &'static str {
    match raw.trim_start().as_bytes().first() {
        Some(b'{') => "object",
        Some(b'[') => "array",
        Some(b'"') => "string",
        Some(b't' | b'f') => "bool",
        Some(b'n') => "null",
        _ => "number",
    }
}

impl Patch {
    /// Decodes a JSON patch as `jsonpatch.DecodePatch` does (`json.Unmarshal` into
    /// `[]map[string]*json.RawMessage`); the error is its message (kube-apiserver: 400).
    /// The text must already be known to nest no deeper than the server allows.
    pub fn decode(text: &[u8]) -> Result<Self, String> {
        let raw: Box<RawValue> = parse(text)?;
        let top = raw.get().trim_start();
        if top.starts_with("null") {
            return Ok(Self::default());
        }
        if !top.starts_with('[') {
            return Err(format!(
                "json: cannot unmarshal {} into Go value of type jsonpatch.Patch",
                json_kind(top)
            ));
        }
        let elements: Vec<Box<RawValue>> = parse(top.as_bytes())?;
        let mut operations = Vec::with_capacity(elements.len());
        for element in elements {
            let text = element.get().trim_start();
            let members = match json_kind(text) {
                "null" => None,
                "object" => {
                    let map: Vec<(String, Box<RawValue>)> = parse_members(text)?;
                    Some(map)
                }
                other => {
                    return Err(format!(
                        "json: cannot unmarshal {other} into Go value of type jsonpatch.Operation"
                    ));
                }
            };
            operations.push(Operation { members });
        }
        Ok(Self { operations })
    }

    /// Builds a patch from decoded operations (a policy's or a test's).
    pub fn from_value(value: &Value) -> Result<Self, String> {
        Self::decode(value.to_string().as_bytes())
    }

    /// How many operations the patch has.
    pub fn len(&self) -> usize {
        self.operations.len()
    }

    /// Whether the patch has no operation.
    pub fn is_empty(&self) -> bool {
        self.operations.is_empty()
    }

    /// The operations' `op` members as json-patch reads them.
    pub fn kinds(&self) -> impl Iterator<Item = String> + '_ {
        self.operations.iter().map(Operation::kind)
    }

    /// Why the patch is not what kube-apiserver's strict decoding of a JSON patch accepts
    /// (`[]struct{Op, Path, From string; Value any}`): Err is a decoding error (400), Ok holds
    /// the unknown members (strict errors: warnings, or 422 under `fieldValidation=Strict`).
    pub fn strict_check(&self) -> Result<Vec<String>, String> {
        let mut unknown = Vec::new();
        for (index, operation) in self.operations.iter().enumerate() {
            for (name, raw) in operation.members.iter().flatten() {
                match name.as_str() {
                    "op" | "path" | "from" => {
                        let kind = json_kind(raw.get());
                        if kind != "string" && kind != "null" {
                            return Err(format!(
                                "json: cannot unmarshal {kind} into Go struct field jsonPatchOp.{name} of type string"
                            ));
                        }
                    }
                    "value" => {}
                    other => {
                        unknown.push(format!("json patch unknown field \"[{index}].{other}\""))
                    }
                }
            }
        }
        Ok(unknown)
    }

    /// Applies the patch to `document` an operation at a time; on error the document is
    /// partly patched and must be dropped.
    pub fn apply(&self, document: &mut Value, limits: Limits) -> Result<(), ApplyError> {
        let mut copied = 0usize;
        for (index, operation) in self.operations.iter().enumerate() {
            let named = || {
                let path = operation.path().unwrap_or_default();
                format!("{} {path:?}", operation.kind())
            };
            let fail = |message: String| ApplyError {
                index,
                operation: named(),
                test_failed: false,
                message,
            };
            match operation.kind().as_str() {
                "add" => operation.add(document, limits.depth),
                "remove" => operation.remove(document),
                "replace" => operation.replace(document, limits.depth),
                "move" => operation.moved(document, limits.depth),
                "copy" => operation.copy(document, &mut copied, limits),
                "test" => match operation.test(document) {
                    Err(Failure::Test(message)) => {
                        return Err(ApplyError {
                            index,
                            operation: named(),
                            test_failed: true,
                            message,
                        });
                    }
                    other => other,
                },
                kind => Err(Failure::Other(format!("Unexpected kind: {kind}"))),
            }
            .map_err(|failure| fail(failure.into_message()))?;
        }
        Ok(())
    }
}

/// Parses `text` as `T` with no recursion limit (the caller bounded the depth).
pub(super) fn parse<'de, T: serde::Deserialize<'de>>(text: &'de [u8]) -> Result<T, String> {
    let mut deserializer = serde_json::Deserializer::from_slice(text);
    deserializer.disable_recursion_limit();
    let value = T::deserialize(&mut deserializer).map_err(|e| e.to_string())?;
    deserializer.end().map_err(|e| e.to_string())?;
    Ok(value)
}

/// An object's members in order, raw; a member given twice keeps its last value (Go's map).
pub(super) fn parse_members(text: &str) -> Result<Vec<(String, Box<RawValue>)>, String> {
    struct Members(Vec<(String, Box<RawValue>)>);
    impl<'de> serde::Deserialize<'de> for Members {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct Visit;
            impl<'de> serde::de::Visitor<'de> for Visit {
                type Value = Members;
                fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                    f.write_str("an object")
                }
                fn visit_map<A: serde::de::MapAccess<'de>>(
                    self,
                    mut map: A,
                ) -> Result<Members, A::Error> {
                    let mut members: Vec<(String, Box<RawValue>)> = Vec::new();
                    while let Some((key, value)) = map.next_entry::<String, Box<RawValue>>()? {
                        members.retain(|(k, _)| *k != key);
                        members.push((key, value));
                    }
                    Ok(Members(members))
                }
            }
            d.deserialize_map(Visit)
        }
    }
    parse::<Members>(text.as_bytes()).map(|m| m.0)
}

/// How an operation failed: a `test` that did not match, or anything else.
enum Failure {
    Test(String),
    Other(String),
}

impl Failure {
    fn into_message(self) -> String {
        match self {
            Failure::Test(m) | Failure::Other(m) => m,
        }
    }
}

pub(super) const MISSING: &str = "missing value";
pub(super) const INVALID_INDEX: &str = "invalid index referenced";

impl Operation {
    fn member(&self, name: &str) -> Option<&RawValue> {
        self.members
            .as_ref()?
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| &**v)
    }

    /// `op`, or "unknown" when it is missing, null or not a string.
    fn kind(&self) -> String {
        match self.member("op") {
            Some(raw) if json_kind(raw.get()) == "string" => {
                serde_json::from_str(raw.get()).unwrap_or_else(|_| "unknown".into())
            }
            _ => "unknown".into(),
        }
    }

    /// A string member (`path`, `from`): Err(None) when missing or null, Err(Some(message))
    /// when not a string.
    fn string(&self, name: &str) -> Result<String, Option<String>> {
        match self.member(name) {
            None => Err(None),
            Some(raw) => match json_kind(raw.get()) {
                "null" => Err(None),
                "string" => serde_json::from_str(raw.get()).map_err(|e| Some(e.to_string())),
                kind => Err(Some(format!(
                    "json: cannot unmarshal {kind} into Go value of type string"
                ))),
            },
        }
    }

    fn path(&self) -> Result<String, String> {
        self.string("path")
            .map_err(|e| e.unwrap_or_else(|| format!("operation missing path field: {MISSING}")))
    }

    fn from(&self) -> Result<String, String> {
        self.string("from")
            .map_err(|e| e.unwrap_or_else(|| format!("operation, missing from field: {MISSING}")))
    }

    /// `value`, decoded; `null` when missing.
    fn value(&self) -> Result<Value, String> {
        match self.member("value") {
            None => Ok(Value::Null),
            Some(raw) => parse(raw.get().as_bytes()),
        }
    }

    fn add(&self, document: &mut Value, depth: usize) -> Result<(), Failure> {
        let path = self.path().map_err(|_| {
            Failure::Other(format!("add operation failed to decode path: {MISSING}"))
        })?;
        let value = self.value().map_err(Failure::Other)?;
        check_depth(&path, &value, depth)?;
        let Some((container, key)) = find_object(document, &path) else {
            return Err(Failure::Other(format!(
                "add operation does not apply: doc is missing path: \"{path}\": {MISSING}"
            )));
        };
        add(container, &key, value)
            .map_err(|e| Failure::Other(format!("error in add for path: '{path}': {e}")))
    }

    fn remove(&self, document: &mut Value) -> Result<(), Failure> {
        let path = self.path().map_err(|_| {
            Failure::Other(format!("remove operation failed to decode path: {MISSING}"))
        })?;
        let Some((container, key)) = find_object(document, &path) else {
            return Err(Failure::Other(format!(
                "remove operation does not apply: doc is missing path: \"{path}\": {MISSING}"
            )));
        };
        remove(container, &key)
            .map(drop)
            .map_err(|e| Failure::Other(format!("error in remove for path: '{path}': {e}")))
    }

    fn replace(&self, document: &mut Value, depth: usize) -> Result<(), Failure> {
        let path = self
            .path()
            .map_err(|e| Failure::Other(format!("replace operation failed to decode path: {e}")))?;
        let value = self.value().map_err(Failure::Other)?;
        check_depth(&path, &value, depth)?;
        if path.is_empty() {
            if !value.is_object() && !value.is_array() {
                return Err(Failure::Other(
                    "replace operation value must be object or array: %!w(<nil>)".into(),
                ));
            }
            *document = value;
            return Ok(());
        }
        let Some((container, key)) = find_object(document, &path) else {
            return Err(Failure::Other(format!(
                "replace operation does not apply: doc is missing path: {path}: {MISSING}"
            )));
        };
        match container {
            Value::Object(map) => {
                map.insert(key, value);
            }
            Value::Array(items) => {
                let Ok(at) = index(items.len(), &key) else {
                    return Err(Failure::Other(format!(
                        "replace operation does not apply: doc is missing key: {path}: {MISSING}"
                    )));
                };
                items[at] = value;
            }
            _ => {}
        }
        Ok(())
    }

    fn moved(&self, document: &mut Value, depth: usize) -> Result<(), Failure> {
        let from = self
            .from()
            .map_err(|e| Failure::Other(format!("move operation failed to decode from: {e}")))?;
        let Some((container, key)) = find_object(document, &from) else {
            return Err(Failure::Other(format!(
                "move operation does not apply: doc is missing from path: {from}: {MISSING}"
            )));
        };
        let value = remove(container, &key)
            .map_err(|e| Failure::Other(format!("error in move for path: '{key}': {e}")))?;
        let path = self
            .path()
            .map_err(|e| Failure::Other(format!("move operation failed to decode path: {e}")))?;
        check_depth(&path, &value, depth)?;
        let Some((container, key)) = find_object(document, &path) else {
            return Err(Failure::Other(format!(
                "move operation does not apply: doc is missing destination path: {path}: {MISSING}"
            )));
        };
        add(container, &key, value)
            .map_err(|e| Failure::Other(format!("error in move for path: '{path}': {e}")))
    }

    fn copy(
        &self,
        document: &mut Value,
        copied: &mut usize,
        limits: Limits,
    ) -> Result<(), Failure> {
        let from = self
            .from()
            .map_err(|e| Failure::Other(format!("copy operation failed to decode from: {e}")))?;
        let Some((container, key)) = find_object(document, &from) else {
            return Err(Failure::Other(format!(
                "copy operation does not apply: doc is missing from path: {from}: {MISSING}"
            )));
        };
        let value = get(container, &key)
            .map_err(|e| Failure::Other(format!("error in copy for from: '{from}': {e}")))?
            .cloned()
            .unwrap_or(Value::Null);
        let path = self.path().map_err(|_| {
            Failure::Other(format!("copy operation failed to decode path: {MISSING}"))
        })?;
        check_depth(&path, &value, limits.depth)?;
        let Some((container, key)) = find_object(document, &path) else {
            return Err(Failure::Other(format!(
                "copy operation does not apply: doc is missing destination path: {path}: {MISSING}"
            )));
        };
        // A missing member copies nothing that counts (json-patch's nil node).
        // As Go's json.Marshal counts it (`<`, `>`, `&` take six bytes each).
        if !value.is_null() {
            *copied += go_text(&value).len();
        }
        if *copied > limits.copy_bytes {
            return Err(Failure::Other(format!(
                "Unable to complete the copy, the accumulated size increase of copy is {copied}, exceeding the limit {}",
                limits.copy_bytes
            )));
        }
        add(container, &key, value)
            .map_err(|e| Failure::Other(format!("error while adding value during copy: {e}")))
    }

    fn test(&self, document: &mut Value) -> Result<(), Failure> {
        let path = self
            .path()
            .map_err(|e| Failure::Other(format!("test operation failed to decode path: {e}")))?;
        let expected = self.member("value");
        let failed = || Failure::Test(format!("testing value {path} failed: test failed"));
        if path.is_empty() {
            return match expected {
                Some(raw) if equal(document, raw.get()) => Ok(()),
                _ => Err(failed()),
            };
        }
        let Some((container, key)) = find_object(document, &path) else {
            return Err(Failure::Other(format!(
                "test operation does not apply: is missing path: {path}: {MISSING}"
            )));
        };
        let found = get(container, &key)
            .map_err(|e| Failure::Other(format!("error in test for path: '{path}': {e}")))?;
        let expected_null = expected.is_none_or(|raw| json_kind(raw.get()) == "null");
        match (found, expected) {
            // A missing member and a null one are the same to json-patch (a nil node).
            (None | Some(Value::Null), _) if expected_null => Ok(()),
            (None | Some(Value::Null), _) | (Some(_), None) => Err(failed()),
            (Some(found), Some(raw)) if equal(found, raw.get()) => Ok(()),
            (Some(_), Some(_)) => Err(failed()),
        }
    }
}

/// A value placed at `path` may not take the document past `depth`.
fn check_depth(path: &str, value: &Value, depth: usize) -> Result<(), Failure> {
    let above = path.bytes().filter(|&b| b == b'/').count();
    if above + depth::value_depth(value, depth) > depth {
        return Err(Failure::Other(depth::too_deep_message()));
    }
    Ok(())
}

/// Bytes of `value` as JSON, counted without building the text.
pub fn json_len<T: serde::Serialize>(value: &T) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    let _ = serde_json::to_writer(&mut count, value);
    count.0
}
