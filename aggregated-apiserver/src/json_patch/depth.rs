//! How deep a JSON document nests, as Go's decoders bound it: the bounds, and the depth of a
//! text or a value counted without recursion.

use serde_json::Value;

/// How deep arrays and objects may nest in anything the server reads or builds: Go's
/// encoding/json (and sigs.k8s.io/json, which kube-apiserver decodes with) stops at 10,000.
pub const MAX_DEPTH: usize = 10_000;

/// Values up to this deep are handled anywhere (serde's recursion at this depth fits any
/// thread's stack); deeper ones only inside `rest::body::Work::run`.
pub const SHALLOW: usize = 128;

/// The message Go's decoder gives a body nested too deep (encoding/json's scanner).
pub fn too_deep_message() -> String {
    "json: exceeded max depth".to_owned()
}

/// The deepest nesting of arrays and objects in a JSON text (or in YAML's flow collections,
/// counted the same way), scanned without parsing; stops counting past `limit`. Brackets in
/// strings do not count.
pub fn text_depth(text: &[u8], limit: usize) -> usize {
    scan(text, limit).0
}

/// The bracket (`[` or `{`) that takes a JSON text past [`MAX_DEPTH`], for Go's message.
pub fn too_deep_bracket(text: &[u8]) -> char {
    char::from(scan(text, MAX_DEPTH).1.unwrap_or(b'['))
}

/// [`text_depth`], and the bracket that went past `limit` if one did.
fn scan(text: &[u8], limit: usize) -> (usize, Option<u8>) {
    let (mut depth, mut deepest) = (0usize, 0usize);
    let mut bytes = text.iter();
    while let Some(&b) = bytes.next() {
        match b {
            b'"' => {
                // Skip the string, escapes included.
                while let Some(&c) = bytes.next() {
                    match c {
                        b'\\' => {
                            bytes.next();
                        }
                        b'"' => break,
                        _ => {}
                    }
                }
            }
            b'[' | b'{' => {
                depth += 1;
                if depth > deepest {
                    deepest = depth;
                    if deepest > limit {
                        return (deepest, Some(b));
                    }
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    (deepest, None)
}

/// How deeply arrays and objects nest in `value` (a scalar is 0, `[1]` is 1), walked without
/// recursion; stops counting past `limit`.
pub fn value_depth(value: &Value, limit: usize) -> usize {
    let mut deepest = 0;
    let mut stack: Vec<(&Value, usize)> = vec![(value, 0)];
    while let Some((value, above)) = stack.pop() {
        let children: &mut dyn Iterator<Item = &Value> = match value {
            Value::Array(items) => &mut items.iter(),
            Value::Object(map) => &mut map.values(),
            _ => continue,
        };
        let depth = above + 1;
        if depth > deepest {
            deepest = depth;
            if deepest > limit {
                return deepest;
            }
        }
        stack.extend(children.map(|child| (child, depth)));
    }
    deepest
}
