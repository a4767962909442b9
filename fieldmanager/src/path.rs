//! Path elements and paths (structured-merge-diff `fieldpath/element.go`,
//! `path.go`, `serialize-pe.go`) plus SMD's value ordering and equality
//! (`value/value.go`), which path-element ordering depends on.

use std::cmp::Ordering;
use std::fmt;

use serde_json::Value;

use super::gojson::{self, Flavor};

/// One step of a field path.
///
/// The derived-looking comparison is SMD's `PathElement.Compare`: field
/// names sort before keys, keys before values, values before indexes; the
/// FieldsV1 encoding and conflict ordering depend on it.
#[derive(Debug, Clone)]
pub(crate) enum PathElement {
    /// A struct field or map key (`f:<name>`).
    FieldName(String),
    /// An associative-list item identified by its key fields (`k:{...}`),
    /// sorted by field name.
    Key(Vec<(String, Value)>),
    /// A set item identified by its scalar value (`v:<json>`).
    Value(Value),
    /// A list item identified by position (`i:<n>`); SMD never produces
    /// these for typed objects but they can be decoded.
    Index(i64),
}

/// A field path: the sequence of elements from the object root.
pub(crate) type Path = Vec<PathElement>;

impl PathElement {
    /// Builds a field-name element.
    pub(crate) fn field(name: &str) -> Self {
        PathElement::FieldName(name.to_string())
    }

    /// Builds a key element from (name, value) pairs, sorting them by
    /// name as SMD's `KeyByFields` does.
    pub(crate) fn key(fields: Vec<(String, Value)>) -> Self {
        let mut fields = fields;
        fields.sort_by(|a, b| a.0.cmp(&b.0));
        PathElement::Key(fields)
    }

    fn type_rank(&self) -> u8 {
        match self {
            PathElement::FieldName(_) => 0,
            PathElement::Key(_) => 1,
            PathElement::Value(_) => 2,
            PathElement::Index(_) => 3,
        }
    }

    /// Serializes the element as a FieldsV1 object key
    /// (`serializePathElementToWriter`), byte-for-byte as Go does.
    pub(crate) fn to_fields_v1_key(&self) -> String {
        let mut out = String::new();
        match self {
            PathElement::FieldName(n) => {
                out.push_str("f:");
                out.push_str(n);
            }
            PathElement::Key(fields) => {
                out.push_str("k:{");
                for (i, (name, v)) in fields.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    // json-iterator WriteObjectField: no HTML escaping.
                    gojson::write_string(&mut out, name, false);
                    out.push(':');
                    gojson::write_value(&mut out, v, Flavor::JsonIter);
                }
                out.push('}');
            }
            PathElement::Value(v) => {
                out.push_str("v:");
                gojson::write_value(&mut out, v, Flavor::JsonIter);
            }
            PathElement::Index(i) => {
                out.push_str("i:");
                out.push_str(&i.to_string());
            }
        }
        out
    }

    /// Parses a FieldsV1 key (`DeserializePathElement`). `Ok(None)` is an
    /// unknown element type, which Go skips silently.
    pub(crate) fn from_fields_v1_key(s: &str) -> Result<Option<Self>, String> {
        let bytes = s.as_bytes();
        if bytes.len() < 2 {
            return Err("key must be 2 characters long:".to_string());
        }
        if bytes[1] != b':' {
            return Err(format!("missing colon: {s}"));
        }
        let rest = &s[2..];
        match bytes[0] {
            b'f' => Ok(Some(PathElement::FieldName(rest.to_string()))),
            b'v' => {
                let v: Value = serde_json::from_str(rest).map_err(|e| e.to_string())?;
                Ok(Some(PathElement::Value(v)))
            }
            b'k' => {
                let v: Value = serde_json::from_str(rest).map_err(|e| e.to_string())?;
                let Value::Object(m) = v else {
                    return Err(format!("expected object for key path element: {rest}"));
                };
                Ok(Some(PathElement::key(m.into_iter().collect())))
            }
            b'i' => {
                let i: i64 = rest.parse().map_err(|e| format!("strconv.Atoi: {e}"))?;
                Ok(Some(PathElement::Index(i)))
            }
            _ => Ok(None),
        }
    }
}

impl PartialEq for PathElement {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for PathElement {}

impl PartialOrd for PathElement {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for PathElement {
    fn cmp(&self, other: &Self) -> Ordering {
        match (self, other) {
            (PathElement::FieldName(a), PathElement::FieldName(b)) => a.cmp(b),
            (PathElement::Key(a), PathElement::Key(b)) => compare_field_lists(a, b),
            (PathElement::Value(a), PathElement::Value(b)) => compare_values(a, b),
            (PathElement::Index(a), PathElement::Index(b)) => a.cmp(b),
            _ => self.type_rank().cmp(&other.type_rank()),
        }
    }
}

/// SMD's `FieldList.Compare`: pairwise by name, then value, shorter first.
fn compare_field_lists(a: &[(String, Value)], b: &[(String, Value)]) -> Ordering {
    for ((an, av), (bn, bv)) in a.iter().zip(b.iter()) {
        let c = an.cmp(bn).then_with(|| compare_values(av, bv));
        if c != Ordering::Equal {
            return c;
        }
    }
    a.len().cmp(&b.len())
}

impl fmt::Display for PathElement {
    /// SMD's `PathElement.String()`, used in conflict messages.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PathElement::FieldName(n) => write!(f, ".{n}"),
            PathElement::Key(fields) => {
                let parts: Vec<String> = fields
                    .iter()
                    .map(|(n, v)| format!("{n}={}", value_to_string(v)))
                    .collect();
                write!(f, "[{}]", parts.join(","))
            }
            PathElement::Value(v) => write!(f, "[={}]", value_to_string(v)),
            PathElement::Index(i) => write!(f, "[{i}]"),
        }
    }
}

/// SMD's `Path.String()`: the elements' strings concatenated, e.g.
/// `.metadata.ownerReferences[uid="u1"]`.
pub(crate) fn path_to_string(p: &[PathElement]) -> String {
    p.iter().map(|e| e.to_string()).collect()
}

/// SMD's `value.ToString` (Go `%v`/`%q` formatting).
pub(crate) fn value_to_string(v: &Value) -> String {
    match v {
        Value::Null => "null".to_string(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => match num(n) {
            Num::I(i) => i.to_string(),
            Num::F(x) => go_v_float(x),
        },
        Value::String(s) => gojson::quote(s),
        Value::Array(a) => {
            let parts: Vec<String> = a.iter().map(value_to_string).collect();
            format!("[{}]", parts.join(","))
        }
        Value::Object(m) => m
            .iter()
            .map(|(k, v)| format!("{k}={}", value_to_string(v)))
            .collect(),
    }
}

/// Go's `%v` for a float64 (`%g` with the shortest representation).
fn go_v_float(x: f64) -> String {
    if x == 0.0 {
        return "0".to_string();
    }
    let e = format!("{x:e}");
    let Some((mant, exp)) = e.split_once('e') else {
        return e;
    };
    let exp: i32 = exp.parse().unwrap_or(0);
    // strconv's shortest %g switches to exponent form outside [-4, 6).
    if !(-4..6).contains(&exp) {
        let sign = if exp < 0 { '-' } else { '+' };
        return format!("{mant}e{sign}{:02}", exp.abs());
    }
    format!("{x}")
}

#[derive(Clone, Copy)]
enum Num {
    I(i64),
    F(f64),
}

fn num(n: &serde_json::Number) -> Num {
    match n.as_i64() {
        Some(i) => Num::I(i),
        None => Num::F(n.as_f64().unwrap_or(0.0)),
    }
}

fn rank(v: &Value) -> u8 {
    match v {
        Value::Number(_) => 0,
        Value::String(_) => 1,
        Value::Bool(_) => 2,
        Value::Array(_) => 3,
        Value::Object(_) => 4,
        Value::Null => 5,
    }
}

/// SMD's `value.Compare`: numbers (ints and floats compared numerically)
/// < strings < booleans < lists < maps < null.
pub(crate) fn compare_values(a: &Value, b: &Value) -> Ordering {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (num(x), num(y)) {
            (Num::I(i), Num::I(j)) => i.cmp(&j),
            (Num::I(i), Num::F(f)) => float_cmp(i as f64, f),
            (Num::F(f), Num::I(j)) => float_cmp(f, j as f64),
            (Num::F(f), Num::F(g)) => float_cmp(f, g),
        },
        (Value::String(x), Value::String(y)) => x.cmp(y),
        (Value::Bool(x), Value::Bool(y)) => x.cmp(y),
        (Value::Array(x), Value::Array(y)) => {
            for (l, r) in x.iter().zip(y.iter()) {
                let c = compare_values(l, r);
                if c != Ordering::Equal {
                    return c;
                }
            }
            x.len().cmp(&y.len())
        }
        (Value::Object(x), Value::Object(y)) => {
            // MapCompareUsing with lexical key order.
            if x.is_empty() && y.is_empty() {
                return Ordering::Equal;
            }
            let mut keys: Vec<&String> = x.keys().chain(y.keys()).collect();
            keys.sort();
            keys.dedup();
            for (i, k) in keys.into_iter().enumerate() {
                let c = if i == x.len() {
                    Ordering::Less
                } else if i == y.len() {
                    Ordering::Greater
                } else {
                    match (x.get(k), y.get(k)) {
                        (None, _) => Ordering::Greater,
                        (_, None) => Ordering::Less,
                        (Some(l), Some(r)) => compare_values(l, r),
                    }
                };
                if c != Ordering::Equal {
                    return c;
                }
            }
            Ordering::Equal
        }
        (Value::Null, Value::Null) => Ordering::Equal,
        _ => rank(a).cmp(&rank(b)),
    }
}

fn float_cmp(a: f64, b: f64) -> Ordering {
    if a > b {
        Ordering::Greater
    } else if a < b {
        Ordering::Less
    } else {
        Ordering::Equal
    }
}

/// SMD's `value.Equals`: like JSON equality, except that an int and a
/// float with the same numeric value are equal.
pub(crate) fn values_equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (num(x), num(y)) {
            (Num::I(i), Num::I(j)) => i == j,
            (Num::I(i), Num::F(f)) | (Num::F(f), Num::I(i)) => i as f64 == f,
            (Num::F(f), Num::F(g)) => f == g,
        },
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y.iter()).all(|(l, r)| values_equal(l, r))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, l)| y.get(k).is_some_and(|r| values_equal(l, r)))
        }
        _ => a == b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn element_order_matches_smd() {
        let mut v = [
            PathElement::Index(0),
            PathElement::Value(json!("a")),
            PathElement::key(vec![("uid".into(), json!("x"))]),
            PathElement::field("b"),
            PathElement::field("a"),
            PathElement::Value(json!(1)),
        ];
        v.sort();
        let s: Vec<String> = v.iter().map(|e| e.to_fields_v1_key()).collect();
        assert_eq!(
            s,
            vec!["f:a", "f:b", "k:{\"uid\":\"x\"}", "v:1", "v:\"a\"", "i:0"]
        );
    }

    #[test]
    fn path_strings() {
        let p = vec![
            PathElement::field("metadata"),
            PathElement::field("ownerReferences"),
            PathElement::key(vec![("uid".into(), json!("u1"))]),
        ];
        assert_eq!(path_to_string(&p), ".metadata.ownerReferences[uid=\"u1\"]");
        let p = vec![
            PathElement::field("metadata"),
            PathElement::field("finalizers"),
            PathElement::Value(json!("x")),
        ];
        assert_eq!(path_to_string(&p), ".metadata.finalizers[=\"x\"]");
        let k = PathElement::key(vec![
            ("protocol".into(), json!("TCP")),
            ("port".into(), json!(80)),
        ]);
        assert_eq!(k.to_string(), "[port=80,protocol=\"TCP\"]");
        assert_eq!(PathElement::Value(json!(1.5)).to_string(), "[=1.5]");
        assert_eq!(PathElement::Value(json!(1e6)).to_string(), "[=1e+06]");
    }

    #[test]
    fn key_roundtrip() {
        let k = PathElement::key(vec![
            ("name".into(), json!("a<b")),
            ("containerPort".into(), json!(8080)),
        ]);
        let s = k.to_fields_v1_key();
        assert_eq!(s, "k:{\"containerPort\":8080,\"name\":\"a\\u003cb\"}");
        assert_eq!(PathElement::from_fields_v1_key(&s), Ok(Some(k)));
        assert_eq!(PathElement::from_fields_v1_key("x:1"), Ok(None));
        assert!(PathElement::from_fields_v1_key("f").is_err());
        assert!(PathElement::from_fields_v1_key("fa").is_err());
    }
}
