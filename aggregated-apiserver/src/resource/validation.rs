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

const QUALIFIED_NAME_REGEX: &str = "(e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";

/// apimachinery's `IsDNS1123Subdomain` messages for `value`.
fn subdomain_errors(value: &str) -> Vec<String> {
    let mut errors = Vec::new();
    if value.len() > 253 {
        errors.push("must be no more than 253 characters".to_owned());
    }
    if !value.split('.').all(is_label_shaped) {
        errors.push(DNS1123_SUBDOMAIN_MESSAGE.to_owned());
    }
    errors
}

/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`, of any length.
fn is_name_part_shaped(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// Why `value` is not a qualified name: apimachinery's `IsQualifiedName`, every message it
/// gives (a prefix and a name part may both be wrong).
fn qualified_name_errors(value: &str) -> Vec<String> {
    let parts: Vec<&str> = value.split('/').collect();
    let mut errors = Vec::new();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                errors.push("prefix part must be non-empty".to_owned());
            } else {
                errors.extend(
                    subdomain_errors(prefix)
                        .into_iter()
                        .map(|m| format!("prefix part {m}")),
                );
            }
            *name
        }
        _ => {
            return vec![format!(
                "a qualified name must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character {QUALIFIED_NAME_REGEX} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
            )];
        }
    };
    if name.is_empty() {
        errors.push("name part must be non-empty".to_owned());
    } else if name.len() > 63 {
        errors.push("name part must be no more than 63 characters".to_owned());
    }
    if !is_name_part_shaped(name) {
        errors.push(format!(
            "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character {QUALIFIED_NAME_REGEX}"
        ));
    }
    errors
}

/// apimachinery's `IsValidLabelValue` messages.
fn label_value_errors(value: &str) -> Vec<String> {
    let mut errors = Vec::new();
    if value.len() > 63 {
        errors.push("must be no more than 63 characters".to_owned());
    }
    if !value.is_empty() && !is_name_part_shaped(value) {
        errors.push("a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')".to_owned());
    }
    errors
}

/// A Go `%q`-like rendering of a string value in a message.
fn quoted(value: &str) -> String {
    format!("{value:?}")
}

/// `generateName`, as apimachinery's `ValidateObjectMetaAccessor` checks it: a DNS subdomain
/// once its trailing dashes are masked.
pub fn validate_generate_name(meta: &ObjectMeta) -> Vec<FieldError> {
    let Some(prefix) = meta.generate_name.as_deref().filter(|p| !p.is_empty()) else {
        return Vec::new();
    };
    // apimachinery's `maskTrailingDash`: a prefix may end with the dash before the suffix.
    let masked = match prefix.strip_suffix('-') {
        Some(head) => format!("{head}a"),
        None => prefix.to_owned(),
    };
    subdomain_errors(&masked)
        .iter()
        .map(|m| FieldError::invalid("metadata.generateName", quoted(prefix), m))
        .collect()
}

/// apimachinery's `ValidateOwnerReferences`: apiVersion (with a version), kind, name and uid
/// set on each, no Event as owner, at most one controller.
pub fn validate_owner_references(meta: &ObjectMeta) -> Vec<FieldError> {
    const FIELD: &str = "metadata.ownerReferences";
    let references = meta.owner_references.as_deref().unwrap_or_default();
    let mut errors = Vec::new();
    let mut first_controller: Option<String> = None;
    for reference in references {
        // schema.ParseGroupVersion: "v1", "group/v1"; more slashes is no version at all.
        let version = match reference.api_version.matches('/').count() {
            0 => reference.api_version.as_str(),
            1 => reference.api_version.split_once('/').map_or("", |(_, v)| v),
            _ => "",
        };
        if version.is_empty() {
            errors.push(FieldError::invalid(
                &format!("{FIELD}.apiVersion"),
                quoted(&reference.api_version),
                "version must not be empty",
            ));
        }
        for (field, value) in [
            ("kind", &reference.kind),
            ("name", &reference.name),
            ("uid", &reference.uid),
        ] {
            if value.is_empty() {
                errors.push(FieldError::invalid(
                    &format!("{FIELD}.{field}"),
                    "\"\"",
                    "must not be empty",
                ));
            }
        }
        if reference.api_version == "v1" && reference.kind == "Event" {
            errors.push(FieldError::invalid(
                FIELD,
                serde_json::to_string(reference).unwrap_or_default(),
                "/v1, Kind=Event is disallowed from being an owner",
            ));
        }
        if reference.controller == Some(true) {
            let name = format!("{}/{}", reference.kind, reference.name);
            match &first_controller {
                Some(first) => errors.push(FieldError::invalid(
                    FIELD,
                    serde_json::to_string(references).unwrap_or_default(),
                    &format!(
                        "Only one reference can have Controller set to true. Found \"true\" in references for {first} and {name}"
                    ),
                )),
                None => first_controller = Some(name),
            }
        }
    }
    errors
}

/// The finalizers' names (apimachinery's `ValidateFinalizerName`: qualified names), and the
/// garbage collector's two, which exclude each other.
pub fn validate_finalizers(meta: &ObjectMeta) -> Vec<FieldError> {
    let finalizers = meta.finalizers.as_deref().unwrap_or_default();
    let mut errors: Vec<FieldError> = finalizers
        .iter()
        .flat_map(|f| {
            qualified_name_errors(f)
                .into_iter()
                .map(move |why| FieldError::invalid("metadata.finalizers", quoted(f), &why))
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

/// kube-apiserver's warnings for a custom resource's finalizers that `old` did not have
/// (apiextensions-apiserver's `generateWarningsFromObj`: each new name once, sorted): what
/// `IsQualifiedName` says of it, and a name with no path (the standard ones apart).
pub fn finalizer_warnings(meta: &ObjectMeta, old: Option<&ObjectMeta>) -> Vec<String> {
    const FIELD: &str = "metadata.finalizers";
    let before: std::collections::BTreeSet<&String> = old
        .and_then(|m| m.finalizers.as_deref())
        .unwrap_or_default()
        .iter()
        .collect();
    let added: std::collections::BTreeSet<&String> = meta
        .finalizers
        .as_deref()
        .unwrap_or_default()
        .iter()
        .filter(|f| !before.contains(f))
        .collect();
    let mut warnings = Vec::new();
    for finalizer in added {
        for why in qualified_name_errors(finalizer) {
            warnings.push(format!("{FIELD}: {}: {why}", quoted(finalizer)));
        }
        if !finalizer.contains('/')
            && !matches!(
                finalizer.as_str(),
                "kubernetes" | "orphan" | "foregroundDeletion"
            )
        {
            let path = if finalizer.contains('.') {
                " including a path (/)"
            } else {
                ""
            };
            warnings.push(format!(
                "{FIELD}: {}: prefer a domain-qualified finalizer name{path} to avoid accidental conflicts with other finalizer writers",
                quoted(finalizer)
            ));
        }
    }
    warnings
}

/// Labels, annotations and owner references a client set (apimachinery's `ValidateLabels`,
/// `ValidateAnnotations`, `ValidateOwnerReferences`).
pub fn validate_metadata(meta: &ObjectMeta) -> Vec<FieldError> {
    let mut errors = Vec::new();
    for (key, value) in meta.labels.iter().flatten() {
        for why in qualified_name_errors(key) {
            errors.push(FieldError::invalid("metadata.labels", quoted(key), &why));
        }
        for why in label_value_errors(value) {
            errors.push(FieldError::invalid("metadata.labels", quoted(value), &why));
        }
    }
    let mut total = 0;
    for (key, value) in meta.annotations.iter().flatten() {
        total += key.len() + value.len();
        for why in qualified_name_errors(&key.to_lowercase()) {
            errors.push(FieldError::invalid(
                "metadata.annotations",
                quoted(key),
                &why,
            ));
        }
    }
    if total > MAX_ANNOTATIONS_BYTES {
        errors.push(FieldError {
            field: "metadata.annotations".into(),
            reason: "FieldValueTooLong",
            message: format!("Too long: may not be more than {MAX_ANNOTATIONS_BYTES} bytes"),
        });
    }
    errors.extend(validate_owner_references(meta));
    errors
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_rfc1123() {
        assert!(validate_name("dolly").is_none());
        assert!(validate_name("dolly.the-zebra-2").is_none());
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
