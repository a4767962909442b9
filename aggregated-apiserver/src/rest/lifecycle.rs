//! Deleting as Kubernetes deletes, after k8s.io/apiserver's generic store (`store.go`:
//! `deletionFinalizersForGarbageCollection`, `markAsDeleting`, `ShouldDeleteDuringUpdate`) and
//! apimachinery's object metadata rules (`ValidateObjectMetaUpdate`, `ValidateDeleteOptions`):
//!
//! - a DELETE of an object with finalizers marks it deleting (`deletionTimestamp`,
//!   `deletionGracePeriodSeconds: 0`) and leaves it to whoever owns the finalizers;
//! - the propagation policy adds the garbage collector's finalizer (`orphan`,
//!   `foregroundDeletion`), when there is a garbage collector (a cluster);
//! - the write that removes the last finalizer of an object being deleted deletes it;
//! - while an object is being deleted, its deletion fields stay as the server set them and no
//!   finalizer may be added.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{DeleteOptions, ObjectMeta};

use crate::error::{Error, FieldError, Result, Subject};

/// The garbage collector's finalizer that orphans the dependents.
pub const ORPHAN: &str = "orphan";
/// The garbage collector's finalizer that deletes the dependents first.
pub const FOREGROUND: &str = "foregroundDeletion";

/// kube-apiserver's checks of DeleteOptions (422 `DeleteOptions.meta.k8s.io "" is invalid`).
pub(crate) fn validate_delete_options(options: &DeleteOptions) -> Result<()> {
    let mut causes = Vec::new();
    if let Some(policy) = options.propagation_policy.as_deref() {
        if options.orphan_dependents.is_some() {
            causes.push(FieldError {
                field: "propagationPolicy".into(),
                reason: "FieldValueInvalid",
                message: format!(
                    "Invalid value: {policy:?}: orphanDependents and deletionPropagation cannot be both set"
                ),
            });
        }
        if !matches!(policy, "Foreground" | "Background" | "Orphan") {
            causes.push(FieldError {
                field: "propagationPolicy".into(),
                reason: "FieldValueNotSupported",
                message: format!(
                    "Unsupported value: {policy:?}: supported values: \"Foreground\", \"Background\", \"Orphan\", \"nil\""
                ),
            });
        }
    }
    if causes.is_empty() {
        return Ok(());
    }
    Err(Error::Invalid {
        subject: Subject {
            resource: String::new(),
            group: "meta.k8s.io".into(),
            kind: "DeleteOptions".into(),
            name: String::new(),
        },
        causes,
    })
}

/// The finalizers an object keeps when it is deleted with `options`: its own, with the
/// garbage collector's set as the propagation policy says (the legacy `orphanDependents`
/// first, then `propagationPolicy`, then the finalizers it already has; the default policy is
/// background). Without a garbage collector (`gc` false) nobody would remove them: none added.
pub(crate) fn finalizers_on_delete(
    current: &[String],
    options: &DeleteOptions,
    gc: bool,
) -> Vec<String> {
    if !gc {
        return current.to_vec();
    }
    let has = |f: &str| current.iter().any(|c| c == f);
    let (orphan, foreground) = match (
        options.orphan_dependents,
        options.propagation_policy.as_deref(),
    ) {
        (Some(orphan), _) => (orphan, false),
        (None, Some(policy)) => (policy == "Orphan", policy == "Foreground"),
        (None, None) => (has(ORPHAN), has(FOREGROUND)),
    };
    let mut kept: Vec<String> = current
        .iter()
        .filter(|f| *f != ORPHAN && *f != FOREGROUND)
        .cloned()
        .collect();
    if orphan {
        kept.push(ORPHAN.to_owned());
    }
    if foreground {
        kept.push(FOREGROUND.to_owned());
    }
    // The same set (in another order, or with a name given twice) is no change and no write,
    // as kube-apiserver compares the two as sets.
    let same = kept.iter().all(|f| current.contains(f)) && current.iter().all(|f| kept.contains(f));
    if same { current.to_vec() } else { kept }
}

/// Marks an object deleting, as `markAsDeleting`: the first time, the deletion time is now and
/// the generation moves; the grace period of a kind without graceful deletion is 0.
pub(crate) fn mark_deleting(meta: &mut ObjectMeta) {
    if meta.deletion_timestamp.is_none() {
        meta.deletion_timestamp = Some(crate::resource::now());
        if let Some(generation) = meta.generation.filter(|g| *g > 0) {
            meta.generation = Some(generation + 1);
        }
    }
    meta.deletion_grace_period_seconds = Some(0);
}

/// True when an update leaves an object that is being deleted with no finalizer: the store
/// then deletes it (`ShouldDeleteDuringUpdate`).
pub(crate) fn deletes_on_update(next: &ObjectMeta, current: &ObjectMeta) -> bool {
    current.deletion_timestamp.is_some()
        && current.deletion_grace_period_seconds.unwrap_or(0) == 0
        && next.finalizers.as_deref().unwrap_or_default().is_empty()
}

/// What an update may not do to the deletion fields, and what it keeps of them (`BeforeUpdate`
/// and `ValidateObjectMetaUpdate`): a deletion time or grace period the server set stays; a
/// client may not set one; no finalizer may be added to an object being deleted.
pub(crate) fn check_update(next: &mut ObjectMeta, current: &ObjectMeta) -> Vec<FieldError> {
    let mut causes = Vec::new();
    if current.deletion_timestamp.is_some() {
        next.deletion_timestamp = current.deletion_timestamp.clone();
    } else if let Some(sent) = &next.deletion_timestamp {
        causes.push(FieldError::invalid(
            "metadata.deletionTimestamp",
            format!("{:?}", sent.0.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()),
            "field is immutable",
        ));
    }
    if next.deletion_grace_period_seconds.is_none() {
        next.deletion_grace_period_seconds = current.deletion_grace_period_seconds;
    }
    if next.deletion_grace_period_seconds != current.deletion_grace_period_seconds {
        causes.push(FieldError::invalid(
            "metadata.deletionGracePeriodSeconds",
            next.deletion_grace_period_seconds.unwrap_or_default(),
            "field is immutable",
        ));
    }
    if current.deletion_timestamp.is_some() {
        let old = current.finalizers.as_deref().unwrap_or_default();
        let mut added: Vec<&String> = next
            .finalizers
            .as_deref()
            .unwrap_or_default()
            .iter()
            .filter(|f| !old.contains(f))
            .collect();
        if !added.is_empty() {
            added.sort();
            added.dedup();
            causes.push(FieldError {
                field: "metadata.finalizers".into(),
                reason: "FieldValueForbidden",
                message: format!(
                    "Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers []string{{{}}}",
                    added
                        .iter()
                        .map(|f| format!("{f:?}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            });
        }
    }
    causes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(orphan: Option<bool>, policy: Option<&str>) -> DeleteOptions {
        DeleteOptions {
            orphan_dependents: orphan,
            propagation_policy: policy.map(str::to_owned),
            ..Default::default()
        }
    }

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn the_propagation_policy_sets_the_garbage_collectors_finalizers() {
        let held = strings(&["zoo.example.com/hold"]);
        /// (orphanDependents, propagationPolicy, collector finalizers before, after)
        type Case<'a> = (Option<bool>, Option<&'a str>, &'a [&'a str], &'a [&'a str]);
        let cases: &[Case] = &[
            (None, None, &[], &[]),
            (None, Some("Background"), &["orphan"], &[]),
            (None, Some("Orphan"), &[], &["orphan"]),
            (
                None,
                Some("Foreground"),
                &["orphan"],
                &["foregroundDeletion"],
            ),
            (Some(true), None, &[], &["orphan"]),
            (Some(false), None, &["orphan"], &[]),
            (None, None, &["foregroundDeletion"], &["foregroundDeletion"]),
        ];
        for (orphan, policy, before, after) in cases {
            let mut current = held.clone();
            current.extend(strings(before));
            let mut expected = held.clone();
            expected.extend(strings(after));
            assert_eq!(
                finalizers_on_delete(&current, &options(*orphan, *policy), true),
                expected,
                "{orphan:?} {policy:?} {before:?}"
            );
        }
        // No garbage collector: nothing added, nothing taken.
        assert_eq!(
            finalizers_on_delete(&held, &options(None, Some("Orphan")), false),
            held
        );
    }

    #[test]
    fn delete_options_are_validated_with_kube_apiservers_messages() {
        assert!(validate_delete_options(&options(None, Some("Orphan"))).is_ok());
        let message = |o| validate_delete_options(&o).unwrap_err().to_string();
        assert_eq!(
            message(options(None, Some("Sideways"))),
            "DeleteOptions.meta.k8s.io \"\" is invalid: propagationPolicy: Unsupported value: \"Sideways\": supported values: \"Foreground\", \"Background\", \"Orphan\", \"nil\""
        );
        assert_eq!(
            message(options(Some(true), Some("Orphan"))),
            "DeleteOptions.meta.k8s.io \"\" is invalid: propagationPolicy: Invalid value: \"Orphan\": orphanDependents and deletionPropagation cannot be both set"
        );
    }

    #[test]
    fn an_object_being_deleted_keeps_its_deletion_fields_and_takes_no_new_finalizer() {
        let mut current = ObjectMeta {
            finalizers: Some(strings(&["a/x"])),
            generation: Some(1),
            ..Default::default()
        };
        mark_deleting(&mut current);
        assert_eq!(current.generation, Some(2));
        assert_eq!(current.deletion_grace_period_seconds, Some(0));
        let mut next = ObjectMeta {
            finalizers: Some(strings(&["a/x", "b/y"])),
            ..Default::default()
        };
        let causes = check_update(&mut next, &current);
        assert_eq!(next.deletion_timestamp, current.deletion_timestamp);
        assert_eq!(
            causes[0].message,
            "Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers []string{\"b/y\"}"
        );
        // Not being deleted: a client may not start it.
        let mut next = ObjectMeta {
            deletion_grace_period_seconds: Some(5),
            ..Default::default()
        };
        let causes = check_update(&mut next, &ObjectMeta::default());
        assert_eq!(causes[0].field, "metadata.deletionGracePeriodSeconds");
        assert!(deletes_on_update(&ObjectMeta::default(), &current));
        assert!(!deletes_on_update(&current.clone(), &current));
    }
}
