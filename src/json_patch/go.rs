//! JSON texts as Go's encoding/json writes them: what json-patch compares a `test` against.

use serde_json::Value;

/// A scalar's JSON text as Go's encoding/json writes it: `<`, `>`, `&`, U+2028 and U+2029
/// escaped in strings, floats in their shortest form without a `.0` (`1e+21`, `1e-7`).
pub fn go_text(value: &Value) -> String {
    match value {
        Value::String(s) => go_string(s),
        Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => i.to_string(),
            (_, Some(u), _) => u.to_string(),
            (_, _, Some(f)) => go_float(f),
            _ => n.to_string(),
        },
        other => other.to_string(),
    }
}

fn go_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '<' | '>' | '&' | '\u{2028}' | '\u{2029}' => {
                out.push_str(&format!("\\u{:04x}", c as u32));
            }
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Go's encoding/json float64: `strconv.AppendFloat(f, 'f', -1)` between 1e-6 and 1e21,
/// else `'e'` with a one-digit exponent kept short (`1e-07` becomes `1e-7`).
pub fn go_float(f: f64) -> String {
    let abs = f.abs();
    if abs == 0.0 || (1e-6..1e21).contains(&abs) {
        let s = format!("{f}");
        return s;
    }
    // Rust's `{:e}` is the shortest round-trip digits: `1e21`, `1.5e-7`.
    let s = format!("{f:e}");
    match s.split_once('e') {
        Some((mantissa, exponent)) => {
            let (sign, digits) = match exponent.strip_prefix('-') {
                Some(d) => ('-', d),
                None => ('+', exponent),
            };
            format!("{mantissa}e{sign}{digits:0>2}")
                .replace("e-0", "e-")
                .replace("e+0", "e+")
        }
        None => s,
    }
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
