//! The document as json-patch.v4 walks it: paths split and unescaped, array indices (negative
//! ones counting from the end), the container a path's last token is in, and equality as
//! `lazyNode.equal` decides it.

use serde_json::{Value, value::RawValue};

use super::{INVALID_INDEX, MISSING, go_text, json_kind, parse, parse_members};

/// RFC 6901's unescaping, as json-patch.v4's `strings.Replacer` does it (one pass).
fn unescape(token: &str) -> String {
    if !token.contains('~') {
        return token.to_owned();
    }
    let mut out = String::with_capacity(token.len());
    let mut chars = token.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, chars.peek()) {
            ('~', Some('1')) => {
                out.push('/');
                chars.next();
            }
            ('~', Some('0')) => {
                out.push('~');
                chars.next();
            }
            _ => out.push(c),
        }
    }
    out
}

/// Go's `strconv.Atoi`: an optional sign and decimal digits, within an i64.
fn atoi(key: &str) -> Result<i64, String> {
    let digits = key.strip_prefix(['+', '-']).unwrap_or(key);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "strconv.Atoi: parsing {}: invalid syntax",
            go_quote(key)
        ));
    }
    key.trim_start_matches('+').parse::<i64>().map_err(|_| {
        format!(
            "strconv.Atoi: parsing {}: value out of range",
            go_quote(key)
        )
    })
}

/// Go's `%q` of a string (close enough for the ASCII keys an index is made of).
fn go_quote(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

fn invalid_index(index: i64) -> String {
    format!("Unable to access invalid index: {index}: {INVALID_INDEX}")
}

/// The element an index names in an array of `len` (negative counts from the end).
pub(super) fn index(len: usize, key: &str) -> Result<usize, String> {
    let at = atoi(key)?;
    let len = len as i64;
    let resolved = if at < 0 {
        if at < -len {
            return Err(invalid_index(at));
        }
        at + len
    } else {
        at
    };
    if resolved >= len {
        return Err(invalid_index(at));
    }
    Ok(resolved as usize)
}

/// json-patch.v4's `findObject`: the container that holds the last token of `path`, and that
/// token. Every token before it must name an object or array (not `null`).
pub(super) fn find_object<'a>(
    document: &'a mut Value,
    path: &str,
) -> Option<(&'a mut Value, String)> {
    let mut tokens: Vec<&str> = path.split('/').collect();
    if tokens.len() < 2 {
        return None;
    }
    let key = unescape(tokens.pop()?);
    let mut node = document;
    for token in &tokens[1..] {
        let token = unescape(token);
        node = match node {
            Value::Object(map) => map.get_mut(&token)?,
            Value::Array(items) => {
                let at = index(items.len(), &token).ok()?;
                items.get_mut(at)?
            }
            _ => return None,
        };
        if !node.is_object() && !node.is_array() {
            return None;
        }
    }
    Some((node, key))
}

/// The member or element `key` names (None: a missing member, which is no error).
pub(super) fn get<'a>(container: &'a Value, key: &str) -> Result<Option<&'a Value>, String> {
    match container {
        Value::Object(map) => Ok(map.get(key)),
        Value::Array(items) => Ok(Some(&items[index(items.len(), key)?])),
        _ => Ok(None),
    }
}

pub(super) fn add(container: &mut Value, key: &str, value: Value) -> Result<(), String> {
    match container {
        Value::Object(map) => {
            map.insert(key.to_owned(), value);
            Ok(())
        }
        Value::Array(items) => {
            if key == "-" {
                items.push(value);
                return Ok(());
            }
            let at = atoi(key)
                .map_err(|e| format!("value was not a proper array index: '{key}': {e}"))?;
            // One more place than elements: `len` is the end, and so is `-1`.
            let size = items.len() as i64 + 1;
            if at >= size || at < -size {
                return Err(invalid_index(at));
            }
            let at = if at < 0 { at + size } else { at };
            items.insert(at as usize, value);
            Ok(())
        }
        _ => Err("unknown object type".into()),
    }
}

pub(super) fn remove(container: &mut Value, key: &str) -> Result<Value, String> {
    match container {
        Value::Object(map) => map
            .remove(key)
            .ok_or_else(|| format!("Unable to remove nonexistent key: {key}: {MISSING}")),
        Value::Array(items) => {
            let at = index(items.len(), key)?;
            Ok(items.remove(at))
        }
        _ => Err("unknown object type".into()),
    }
}

/// json-patch.v4's `lazyNode.equal` of a document's value and a patch's raw value: objects
/// member by member whatever their order, arrays element by element, scalars by their JSON
/// texts (the document's as Go encodes it, the patch's as sent).
pub(super) fn equal(found: &Value, raw: &str) -> bool {
    let raw = raw.trim();
    match found {
        Value::Object(map) => {
            if !raw.starts_with('{') {
                return false;
            }
            let Ok(members) = parse_members(raw) else {
                return false;
            };
            members.len() == map.len()
                && members.iter().all(|(key, raw)| match map.get(key) {
                    None => false,
                    Some(Value::Null) => json_kind(raw.get()) == "null",
                    Some(_) if json_kind(raw.get()) == "null" => false,
                    Some(value) => equal(value, raw.get()),
                })
        }
        Value::Array(items) => {
            if !raw.starts_with('[') {
                return false;
            }
            let Ok(elements) = parse::<Vec<Box<RawValue>>>(raw.as_bytes()) else {
                return false;
            };
            elements.len() == items.len()
                && items
                    .iter()
                    .zip(&elements)
                    .all(|(value, raw)| equal(value, raw.get()))
        }
        scalar => go_text(scalar) == raw,
    }
}
