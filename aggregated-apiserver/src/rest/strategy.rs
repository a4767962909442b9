//! What happens to an object between its decoding ([`super::decode`]) and the store:
//! server-owned metadata on create and update, validation (k8s.io/apiserver's `registry/rest`
//! strategy).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use rand::Rng;

use super::lifecycle;
use crate::{
    error::{Error, FieldError, Result},
    resource::ServedResource,
    resource::validation,
};

/// Validates an object to be created (`old` None) or to replace `old`: its metadata, then the
/// kind's own rules. Returns the kind's warnings for a valid object.
pub(crate) fn validate<K: ServedResource>(object: &K, old: Option<&K>) -> Result<Vec<String>> {
    let meta = object.meta();
    let name = meta.name.clone().unwrap_or_default();
    let mut causes: Vec<FieldError> = Vec::new();
    if old.is_none() {
        causes.extend(new_name_causes(&name, meta));
    }
    if K::namespaced() {
        causes.extend(validation::validate_namespace(
            meta.namespace.as_deref().unwrap_or(""),
        ));
    }
    causes.extend(validation::validate_metadata(meta));
    causes.extend(validation::validate_finalizers(meta));
    if old.is_some() {
        // kube-apiserver's generic store checks an update's metadata (`validateCommonFields`:
        // ObjectMeta, then ObjectMeta's update rules) before the kind's own update rules check
        // it again (a CRD's `ValidateObjectMetaAccessorUpdate`): what is wrong with labels,
        // annotations or owner references is said three times.
        let again = validation::validate_metadata(meta);
        causes.extend(again.clone());
        causes.extend(again);
    }
    causes.extend(object.validate());
    if let Some(old) = old {
        causes.extend(object.validate_update(old));
    }
    if causes.is_empty() {
        let mut warnings = validation::finalizer_warnings(meta, old.map(|o| o.meta()));
        warnings.extend(object.warnings(old));
        return Ok(warnings);
    }
    Err(Error::Invalid {
        subject: K::invalid_subject(&name),
        causes,
    })
}

/// A new object's name (required unless generated) and generateName, as
/// `ValidateObjectMetaAccessor` checks them once the name is generated.
pub(crate) fn new_name_causes(name: &str, meta: &ObjectMeta) -> Vec<FieldError> {
    let mut causes = Vec::new();
    if name.is_empty() {
        causes.push(FieldError::required(
            "metadata.name",
            "name or generateName is required",
        ));
    } else {
        causes.extend(validation::validate_name(name));
    }
    causes.extend(validation::validate_generate_name(meta));
    causes
}

pub(crate) const GENERATE_NAME_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

pub(crate) fn generate_name(prefix: &str) -> String {
    let mut rng = rand::rng();
    let suffix: String = (0..5)
        .map(|_| GENERATE_NAME_ALPHABET[rng.random_range(0..GENERATE_NAME_ALPHABET.len())] as char)
        .collect();
    // kube-apiserver trims the prefix to 58 bytes so the result stays a valid name; here at a
    // character boundary (a prefix that is not ASCII is refused by validation anyway).
    let mut end = prefix.len().min(63 - 5);
    while !prefix.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{suffix}", prefix.get(..end).unwrap_or_default())
}

/// Server-owned metadata of a new object; clears what clients may not set.
/// `namespace` is the request's ("" for a cluster-scoped kind, whose objects have none).
pub(crate) fn prepare_create<K: ServedResource>(object: &mut K, namespace: &str) -> Result<()> {
    let meta = object.meta_mut();
    match meta.namespace.as_deref() {
        // kube-apiserver clears the namespace of a cluster-scoped object.
        _ if !K::namespaced() => meta.namespace = None,
        None | Some("") => meta.namespace = Some(namespace.to_owned()),
        Some(ns) if ns == namespace => {}
        Some(_) => {
            return Err(Error::BadRequest(
                "the namespace of the provided object does not match the namespace sent on the request".into(),
            ));
        }
    }
    if meta
        .resource_version
        .as_deref()
        .is_some_and(|rv| !rv.is_empty())
    {
        return Err(Error::BadRequest(
            "resourceVersion should not be set on objects to be created".into(),
        ));
    }
    // No name and no generateName: validation says so, with whatever else is wrong.
    if meta.name.as_deref().unwrap_or("").is_empty()
        && let Some(prefix) = meta.generate_name.as_deref().filter(|p| !p.is_empty())
    {
        meta.name = Some(generate_name(prefix));
    }
    meta.uid = Some(uuid::Uuid::new_v4().to_string());
    meta.creation_timestamp = Some(crate::resource::now());
    meta.generation = Some(1);
    meta.deletion_timestamp = None;
    meta.deletion_grace_period_seconds = None;
    meta.self_link = None;
    object.prepare_for_create();
    Ok(())
}

/// Carries the server-owned metadata of `current` into the replacement `next`.
/// Which part of an object a write may change: the object (its status kept when the kind has a
/// status subresource) or, through `/status`, its status alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Subresource {
    Object,
    Status,
}

/// What a write of `part` makes of `sent`: for `/status`, the stored object with the status
/// sent (anything else sent is ignored, as kube-apiserver does).
pub(crate) fn written_part<K: ServedResource>(sent: K, current: &K, part: Subresource) -> K {
    match part {
        Subresource::Object => sent,
        Subresource::Status => {
            let mut next = current.clone();
            next.set_status_from(&sent);
            next.meta_mut().resource_version = sent.meta().resource_version.clone();
            next
        }
    }
}

/// Server-owned metadata of an update (`BeforeUpdate`), and what an update may not do to an
/// object's deletion ([`lifecycle::check_update`]: 422).
pub(crate) fn prepare_update<K: ServedResource>(
    next: &mut K,
    current: &K,
    part: Subresource,
) -> Result<()> {
    if K::STATUS_SUBRESOURCE && part == Subresource::Object {
        next.set_status_from(current);
    }
    let spec_changed = next.spec_changed(current);
    let old = current.meta();
    let generation = old.generation.unwrap_or(1) + i64::from(spec_changed);
    let meta = next.meta_mut();
    meta.uid = old.uid.clone();
    meta.creation_timestamp = old.creation_timestamp.clone();
    meta.generation = Some(generation);
    meta.namespace = old.namespace.clone();
    meta.self_link = None;
    let causes = lifecycle::check_update(meta, old);
    if !causes.is_empty() {
        return Err(Error::Invalid {
            subject: K::invalid_subject(old.name.as_deref().unwrap_or("")),
            causes,
        });
    }
    next.prepare_for_update(current);
    Ok(())
}

/// How a write that names a uid other than the stored object's is refused, as in
/// kube-apiserver: a PUT's uid is a precondition (409); a patched or applied object's uid is
/// immutable metadata (422). An empty uid is the stored one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum UidSent {
    /// In a PUT body.
    Precondition,
    /// In the result of a patch or apply.
    Field,
}

pub(crate) fn check_uid<K: ServedResource>(sent: &K, current: &K, how: UidSent) -> Result<()> {
    let (Some(uid), Some(stored)) = (
        sent.meta().uid.as_deref().filter(|u| !u.is_empty()),
        current.meta().uid.as_deref(),
    ) else {
        return Ok(());
    };
    if uid == stored {
        return Ok(());
    }
    let name = current.meta().name.as_deref().unwrap_or("");
    Err(match how {
        UidSent::Precondition => Error::Conflict {
            subject: K::subject(name),
            message: format!(
                "Precondition failed: UID in precondition: {uid}, UID in object meta: {stored}"
            ),
        },
        UidSent::Field => Error::Invalid {
            subject: K::invalid_subject(name),
            causes: vec![FieldError::invalid(
                "metadata.uid",
                format!("{uid:?}"),
                "field is immutable",
            )],
        },
    })
}

pub(crate) fn check_name<K: ServedResource>(object: &K, name: &str) -> Result<()> {
    match object.meta().name.as_deref() {
        Some(n) if n == name => Ok(()),
        other => Err(Error::BadRequest(format!(
            "the name of the object ({}) does not match the name on the URL ({name})",
            other.unwrap_or("")
        ))),
    }
}

pub(crate) fn check_namespace<K: ServedResource>(object: &K, namespace: &str) -> Result<()> {
    match object.meta().namespace.as_deref() {
        _ if !K::namespaced() => Ok(()),
        None | Some("") => Ok(()),
        Some(ns) if ns == namespace => Ok(()),
        Some(_) => Err(Error::BadRequest(
            "the namespace of the provided object does not match the namespace sent on the request"
                .into(),
        )),
    }
}
