//! kube-apiserver's GuaranteedUpdate, for every write that starts from the stored object
//! (update, every patch, apply, delete), whatever the store: an attempt reads the object, the
//! verb transforms it, and `write()` stores the result only if nobody wrote in between
//! (compare-and-swap on the resourceVersion read). `retry` owns when an attempt is tried
//! again; `write()` owns what storing a result means: nothing for an unchanged object, a
//! delete for an object being deleted whose last finalizer the write removed ([`lifecycle`]).

use super::lifecycle;
use crate::{
    error::{Error, Result},
    resource::{ObjectKey, ServedResource},
    store::{Object, Preconditions, Stored, UpdateFrom, WritableStore},
};

/// Attempts in all for a write that keeps losing races to other writers.
const MAX_ATTEMPTS: usize = 64;

/// Where a write's first attempt reads the object it starts from: the cache when the store
/// has one (one read of the source less per write), else the source.
pub(crate) fn first_read<K: ServedResource>(writer: &dyn WritableStore<K>) -> UpdateFrom {
    if writer.updates_from_a_cache() {
        UpdateFrom::Cache
    } else {
        UpdateFrom::Source
    }
}

/// Why an attempt at a write failed, as [`retry`] must tell it.
#[derive(Debug)]
pub(crate) enum Failed {
    /// The store did not write: the object changed, went or came since the attempt read it
    /// (a lost race). Tried again from the source.
    Raced(Error),
    /// The write was refused (a precondition the client set, its resourceVersion included,
    /// validation, admission): final, unless a cached copy's staleness can explain it.
    Refused(Error),
}

impl Failed {
    /// A store's write error: its conflicts are lost races.
    pub(crate) fn of_store(error: Error) -> Self {
        match error {
            Error::Conflict { .. } | Error::AlreadyExists(_) | Error::NotFound(_) => {
                Self::Raced(error)
            }
            error => Self::Refused(error),
        }
    }

    /// The same failure with its error changed (warnings added, for one).
    pub(crate) fn map(self, change: impl FnOnce(Error) -> Error) -> Self {
        match self {
            Self::Raced(error) => Self::Raced(change(error)),
            Self::Refused(error) => Self::Refused(change(error)),
        }
    }
}

impl From<Error> for Failed {
    fn from(error: Error) -> Self {
        Self::Refused(error)
    }
}

impl From<Failed> for Error {
    fn from(failed: Failed) -> Self {
        match failed {
            Failed::Raced(error) | Failed::Refused(error) => error,
        }
    }
}

/// Runs `attempt` until it succeeds or fails for good, as GuaranteedUpdate does: a lost race
/// is tried again from the source (where the attempt then meets the client's own
/// preconditions, which are final); what was refused on the word of a cached copy in a way
/// its staleness can explain (a conflict, a JSON patch `test`, validation, an apply conflict,
/// a missing object) is tried once more from the source. Other failures are final: an
/// admission webhook's refusal is not asked again.
pub(crate) async fn retry<K: ServedResource, T, F>(
    writer: &dyn WritableStore<K>,
    mut attempt: impl FnMut(UpdateFrom) -> F,
) -> Result<T>
where
    F: Future<Output = std::result::Result<T, Failed>>,
{
    let mut from = first_read(writer);
    let mut attempts = 0;
    loop {
        attempts += 1;
        match attempt(from).await {
            Ok(done) => return Ok(done),
            Err(Failed::Raced(_)) if attempts < MAX_ATTEMPTS => from = UpdateFrom::Source,
            Err(Failed::Refused(error)) if from == UpdateFrom::Cache && may_be_stale(&error) => {
                from = UpdateFrom::Source;
            }
            Err(failed) => return Err(failed.into()),
        }
    }
}

/// Whether an attempt that read a cached copy may have failed because the copy was stale (a
/// JSON patch's `test` included), whatever warnings the error carries.
fn may_be_stale(error: &Error) -> bool {
    match error {
        Error::Warned { error, .. } => may_be_stale(error),
        error => matches!(
            error,
            Error::Conflict { .. }
                | Error::AlreadyExists(_)
                | Error::Invalid { .. }
                | Error::ApplyConflict { .. }
                | Error::NotFound(_)
                | Error::PatchNotApplied(_)
        ),
    }
}

/// The refusal of a write whose resourceVersion is not `current`'s (kube-apiserver's
/// `OptimisticLockErrorMsg`): final once `current` was read from the source.
pub(crate) fn stale<K: ServedResource>(current: &Object<K>) -> Failed {
    let name = current.meta().name.as_deref().unwrap_or("");
    Failed::Refused(crate::store::outdated::<K>(name))
}

/// Stores `next` in place of `current` (read by the same attempt): nothing when it changes
/// nothing (the object keeps its resourceVersion and watchers hear nothing, as in
/// kube-apiserver's storage); a delete when `current` is being deleted and `next` has no
/// finalizer left, answered with `next` as kube-apiserver answers it. Either is refused (409)
/// if the object changed since `current` was read.
///
/// `from` is where `current` was read: nothing is skipped on the word of a cached copy (it may
/// be stale), so an unchanged result from the cache is a conflict that [`retry`] takes back to
/// the source.
pub(crate) async fn write<K: ServedResource>(
    writer: &dyn WritableStore<K>,
    next: K,
    current: &Object<K>,
    from: UpdateFrom,
    dry_run: bool,
) -> std::result::Result<Object<K>, Failed> {
    if next.meta().resource_version != current.meta().resource_version {
        // The client's resourceVersion is not the one stored: refused like any update.
        return Err(stale(current));
    }
    if lifecycle::deletes_on_update(next.meta(), current.meta()) {
        let read = Preconditions {
            uid: current.meta().uid.clone(),
            resource_version: current.meta().resource_version.clone(),
        };
        writer
            .delete(&ObjectKey::of(current.meta()), &read, dry_run)
            .await
            .map_err(Failed::of_store)?;
        return Ok(Stored::new(next));
    }
    if serde_json::to_vec(&next).is_ok_and(|json| json[..] == current.json()[..]) {
        if from == UpdateFrom::Cache {
            return Err(stale(current));
        }
        return Ok(current.clone());
    }
    writer.update(next, dry_run).await.map_err(Failed::of_store)
}

/// A delete's attempt: either the object is gone, or it waits for its finalizers.
pub(crate) enum Deleted<K> {
    /// Deleted; its last state.
    Gone(Object<K>),
    /// Marked deleting (or already so); as it is stored now.
    Finalizing(Object<K>),
}

/// Deletes `current` (read by the same attempt) as kube-apiserver's store does: with
/// `finalizers` left (its own, with the garbage collector's as the propagation policy set
/// them) it is marked deleting and kept; with none it is deleted, if it did not change since
/// it was read.
pub(crate) async fn delete<K: ServedResource>(
    writer: &dyn WritableStore<K>,
    current: &Object<K>,
    finalizers: Vec<String>,
    from: UpdateFrom,
    dry_run: bool,
) -> std::result::Result<Deleted<K>, Failed> {
    if finalizers.is_empty() {
        let read = Preconditions {
            uid: current.meta().uid.clone(),
            resource_version: current.meta().resource_version.clone(),
        };
        let deleted = writer
            .delete(&ObjectKey::of(current.meta()), &read, dry_run)
            .await
            .map_err(Failed::of_store)?;
        return Ok(Deleted::Gone(deleted));
    }
    let mut next = current.get().clone();
    let meta = next.meta_mut();
    meta.finalizers = Some(finalizers);
    lifecycle::mark_deleting(meta);
    // A repeated delete of an object being deleted writes nothing.
    Ok(Deleted::Finalizing(
        write(writer, next, current, from, dry_run).await?,
    ))
}
