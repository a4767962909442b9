//! Go-compatible JSON encoding helpers.
//!
//! kube-apiserver writes FieldsV1 keys with json-iterator and the
//! last-applied annotation with `encoding/json`; both escape strings
//! differently from serde_json (HTML escaping, U+2028/9) and format
//! floats with Go's rules. Byte-exact output needs these helpers.

use serde_json::Value;

/// Appends `s` as a JSON string. `html` selects Go's default escaping
/// (`<`, `>`, `&`, U+2028, U+2029 escaped), used by `encoding/json` and by
/// json-iterator's value encoder; json-iterator's `WriteString` (object
/// keys) does not escape them.
pub(crate) fn write_string(out: &mut String, s: &str, html: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => push_u(out, c as u32),
            '<' | '>' | '&' if html => push_u(out, c as u32),
            '\u{2028}' | '\u{2029}' if html => push_u(out, c as u32),
            c => out.push(c),
        }
    }
    out.push('"');
}

fn push_u(out: &mut String, code: u32) {
    out.push_str(&format!("\\u{code:04x}"));
}

/// Which Go encoder is imitated; they differ only in float exponents.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flavor {
    /// `encoding/json`: trims "e-07" to "e-7".
    EncodingJson,
    /// json-iterator (FieldsV1 keys): strconv's two-digit exponent.
    JsonIter,
}

/// Formats a float as Go's `strconv.AppendFloat(f, 'f' or 'e', -1, 64)`
/// with the encoders' cut-offs (exponent form below 1e-6 and from 1e21).
pub(crate) fn format_float(f: f64, flavor: Flavor) -> String {
    let abs = f.abs();
    if abs != 0.0 && !(1e-6..1e21).contains(&abs) {
        // Rust gives "1.5e-7" / "1e21"; strconv gives "1.5e-07" / "1e+21".
        let s = format!("{f:e}");
        let Some((mant, exp)) = s.split_once('e') else {
            return s;
        };
        let (sign, digits) = match exp.strip_prefix('-') {
            Some(d) => ('-', d),
            None => ('+', exp),
        };
        if digits.len() < 2 && !(flavor == Flavor::EncodingJson && sign == '-') {
            format!("{mant}e{sign}0{digits}")
        } else {
            format!("{mant}e{sign}{digits}")
        }
    } else {
        format!("{f}")
    }
}

/// Appends a JSON number the way Go prints the unstructured value
/// (int64 as integer, float64 via [`format_float`]).
pub(crate) fn write_number(out: &mut String, n: &serde_json::Number, flavor: Flavor) {
    if let Some(i) = n.as_i64() {
        out.push_str(&i.to_string());
    } else if let Some(u) = n.as_u64() {
        out.push_str(&u.to_string());
    } else if let Some(f) = n.as_f64() {
        out.push_str(&format_float(f, flavor));
    }
}

/// Encodes `v` like Go's `encoding/json` encodes an unstructured object:
/// compact, map keys sorted (serde_json's map is already sorted), HTML
/// escaping on.
pub(crate) fn encode(v: &Value) -> String {
    let mut out = String::new();
    write_value(&mut out, v, Flavor::EncodingJson);
    out
}

/// Appends `v` (see [`encode`]).
pub(crate) fn write_value(out: &mut String, v: &Value, flavor: Flavor) {
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => write_number(out, n, flavor),
        Value::String(s) => write_string(out, s, true),
        Value::Array(a) => {
            out.push('[');
            for (i, item) in a.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_value(out, item, flavor);
            }
            out.push(']');
        }
        Value::Object(m) => {
            out.push('{');
            for (i, (k, item)) in m.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(out, k, true);
                out.push(':');
                write_value(out, item, flavor);
            }
            out.push('}');
        }
    }
}

/// Go's `%q` for a string (strconv.Quote), for the printable-ASCII and
/// common-escape cases that occur in manager names.
pub(crate) fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\u{b}' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Parses an RFC 3339 time (as metav1.Time accepts it: fractional seconds and offsets
/// allowed) to Unix seconds, truncating fractions.
pub(crate) fn parse_time(s: &str) -> Option<i64> {
    s.parse::<jiff::Timestamp>().ok().map(|t| t.as_second())
}

/// Formats Unix seconds as metav1.Time does (`2006-01-02T15:04:05Z`, UTC).
pub(crate) fn format_time(t: i64) -> String {
    jiff::Timestamp::from_second(t)
        .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_like_go() {
        let j = Flavor::EncodingJson;
        assert_eq!(format_float(1.0, j), "1");
        assert_eq!(format_float(1.5, j), "1.5");
        assert_eq!(format_float(1e21, j), "1e+21");
        assert_eq!(format_float(1.5e-7, j), "1.5e-7");
        assert_eq!(format_float(1.5e-7, Flavor::JsonIter), "1.5e-07");
        assert_eq!(format_float(0.000001, j), "0.000001");
    }

    #[test]
    fn strings_like_go() {
        let mut s = String::new();
        write_string(&mut s, "a<b>&\"\u{2028}", true);
        assert_eq!(s, "\"a\\u003cb\\u003e\\u0026\\\"\\u2028\"");
        let mut s = String::new();
        write_string(&mut s, "a<b", false);
        assert_eq!(s, "\"a<b\"");
    }
}
