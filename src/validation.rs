//! Object metadata validation, as apimachinery's `ValidateObjectMeta` does it for custom kinds.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::error::FieldError;

const DNS1123_SUBDOMAIN_MESSAGE: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";

/// Total size of all annotations, as kube-apiserver limits it.
const MAX_ANNOTATIONS_BYTES: usize = 256 * 1024;

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, of any length.
fn is_label_shaped(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

/// apimachinery's `IsDNS1123Label`: at most 63 characters.
pub fn is_dns1123_label(s: &str) -> bool {
    s.len() <= 63 && is_label_shaped(s)
}

/// apimachinery's `IsDNS1123Subdomain`: at most 253 characters, dot-separated parts shaped as
/// labels, with no 63-character limit of their own (its regular expression has none).
pub fn is_dns1123_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_label_shaped)
}

/// Validates a name a client gave (path segment or metadata.name).
pub fn validate_name(name: &str) -> Option<FieldError> {
    if is_dns1123_subdomain(name) {
        None
    } else {
        Some(FieldError::invalid(
            "metadata.name",
            format!("{name:?}"),
            DNS1123_SUBDOMAIN_MESSAGE,
        ))
    }
}

/// Validates a namespace a client gave: a DNS-1123 label, as kube-apiserver requires.
pub fn validate_namespace(namespace: &str) -> Option<FieldError> {
    if is_dns1123_label(namespace) {
        None
    } else {
        Some(FieldError::invalid(
            "metadata.namespace",
            format!("{namespace:?}"),
            "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character",
        ))
    }
}

/// The name part of a qualified name (a label key without its prefix), or a non-empty label
/// value: at most 63 alphanumerics, '-', '_' or '.', starting and ending alphanumeric.
pub fn is_label_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

fn is_qualified_name(key: &str) -> bool {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    is_label_name(name) && prefix.is_none_or(|p| !p.is_empty() && is_dns1123_subdomain(p))
}

fn is_label_value(value: &str) -> bool {
    value.is_empty() || is_label_name(value)
}

const NAME_PART_MESSAGE: &str = "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";

/// Why `value` is not a qualified name (apimachinery's `IsQualifiedName`, its messages), or
/// None when it is one.
fn qualified_name_error(value: &str) -> Option<String> {
    let parts: Vec<&str> = value.split('/').collect();
    let (prefix, name) = match parts.as_slice() {
        [name] => (None, *name),
        [prefix, name] => (Some(*prefix), *name),
        _ => {
            return Some("a qualified name must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')".into());
        }
    };
    match prefix {
        Some("") => return Some("prefix part must be non-empty".into()),
        Some(p) if !is_dns1123_subdomain(p) => {
            return Some(format!("prefix part {DNS1123_SUBDOMAIN_MESSAGE}"));
        }
        _ => {}
    }
    if name.is_empty() {
        Some("name part must be non-empty".into())
    } else if name.len() > 63 {
        Some("name part must be no more than 63 bytes".into())
    } else if !is_label_name(name) {
        Some(NAME_PART_MESSAGE.into())
    } else {
        None
    }
}

/// The finalizers' names (apimachinery's `ValidateFinalizerName`: qualified names), and the
/// garbage collector's two, which exclude each other.
pub fn validate_finalizers(meta: &ObjectMeta) -> Vec<FieldError> {
    let finalizers = meta.finalizers.as_deref().unwrap_or_default();
    let mut errors: Vec<FieldError> = finalizers
        .iter()
        .filter_map(|f| {
            qualified_name_error(f)
                .map(|why| FieldError::invalid("metadata.finalizers", format!("{f:?}"), &why))
        })
        .collect();
    let has = |name: &str| finalizers.iter().any(|f| f == name);
    if has("orphan") && has("foregroundDeletion") {
        errors.push(FieldError::invalid(
            "metadata.finalizers",
            format!("{finalizers:?}"),
            "finalizer orphan and foregroundDeletion cannot be both set",
        ));
    }
    errors
}

/// kube-apiserver's warning for a custom resource's finalizer that is not domain-qualified
/// (the standard ones apart).
pub fn finalizer_warnings(meta: &ObjectMeta) -> Vec<String> {
    meta.finalizers
        .as_deref()
        .unwrap_or_default()
        .iter()
        .filter(|f| {
            !f.contains('/') && !matches!(f.as_str(), "kubernetes" | "orphan" | "foregroundDeletion")
        })
        .map(|f| {
            format!(
                "metadata.finalizers: {f:?}: prefer a domain-qualified finalizer name including a path (/) to avoid accidental conflicts with other finalizer writers"
            )
        })
        .collect()
}

/// Labels and annotations a client set.
pub fn validate_metadata(meta: &ObjectMeta) -> Vec<FieldError> {
    let mut errors = Vec::new();
    for (key, value) in meta.labels.iter().flatten() {
        if !is_qualified_name(key) {
            errors.push(FieldError::invalid(
                "metadata.labels",
                format!("{key:?}"),
                "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character",
            ));
        }
        if !is_label_value(value) {
            errors.push(FieldError::invalid(
                "metadata.labels",
                format!("{value:?}"),
                "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character",
            ));
        }
    }
    let mut total = 0;
    for (key, value) in meta.annotations.iter().flatten() {
        total += key.len() + value.len();
        if !is_qualified_name(&key.to_lowercase()) {
            errors.push(FieldError::invalid(
                "metadata.annotations",
                format!("{key:?}"),
                "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character",
            ));
        }
    }
    if total > MAX_ANNOTATIONS_BYTES {
        errors.push(FieldError {
            field: "metadata.annotations".into(),
            reason: "FieldValueTooLong",
            message: format!("Too long: must have at most {MAX_ANNOTATIONS_BYTES} bytes"),
        });
    }
    errors
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_rfc1123() {
        assert!(validate_name("dolly").is_none());
        assert!(validate_name("dolly.the-llama-2").is_none());
        for bad in ["Dolly", "-x", "x-", "a_b", "", &"a".repeat(254)] {
            assert!(validate_name(bad).is_some(), "{bad}");
        }
        assert!(validate_namespace("default").is_none());
        assert!(validate_namespace("a.b").is_some());
    }

    #[test]
    fn labels_are_checked() {
        let meta = ObjectMeta {
            labels: Some([("app".to_string(), "bad value".to_string())].into()),
            ..Default::default()
        };
        assert_eq!(validate_metadata(&meta).len(), 1);
    }
}
