//! The SMD updater (`merge/update.go`): ownership bookkeeping for updates
//! and applies, conflicts, and pruning of fields an applier stopped
//! applying.
//!
//! This server serves one version, so SMD's version converter is the
//! identity for sets of that version; sets recorded at any other version
//! behave as kube's "missing version" (they are dropped).

use std::collections::BTreeMap;

use serde_json::Value;

use super::Error;
use super::conflict::Conflict;
use super::path::values_equal;
use super::schema::Schema;
use super::set::FieldSet;
use super::typed::{self, Comparison};

/// What one manager owns, at which API version, and whether by apply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct VersionedSet {
    /// Owned fields.
    pub(crate) set: FieldSet,
    /// The API version the paths are expressed in.
    pub(crate) api_version: String,
    /// True for appliers (operation Apply).
    pub(crate) applied: bool,
}

/// Manager identifier → owned fields (SMD `fieldpath.ManagedFields`).
pub(crate) type ManagedFields = BTreeMap<String, VersionedSet>;

/// Computes new ownership for updates and merges applied configurations.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Updater<'a> {
    /// Schema of the objects.
    pub(crate) schema: &'a Schema,
    /// Fields never tracked (reset fields; SMD `IgnoredFields`), removed
    /// with everything below them.
    pub(crate) ignored: &'a FieldSet,
}

impl Updater<'_> {
    /// SMD `reconcileManagedFieldsWithSchemaChanges` with a single-version
    /// converter: sets at another version are a missing version and are
    /// dropped (schema changes are not reconciled: the schema is static).
    fn reconcile(&self, managers: ManagedFields, version: &str) -> ManagedFields {
        managers
            .into_iter()
            .filter(|(_, vs)| vs.api_version == version)
            .collect()
    }

    fn compare(&self, live: &Value, new: &Value) -> Result<Comparison, Error> {
        let mut c = typed::compare(self.schema, live, new)
            .map_err(|e| Error::Internal(format!("failed to compare objects: {e}")))?;
        c.exclude_fields(self.ignored);
        Ok(c)
    }

    /// SMD `Updater.update`: other managers lose the fields that changed
    /// (or, without `force`, the change is refused with conflicts), and
    /// everyone loses removed fields; empty managers are dropped.
    fn update_inner(
        &self,
        live: &Value,
        new: &Value,
        version: &str,
        mut managers: ManagedFields,
        workflow: &str,
        force: bool,
    ) -> Result<(ManagedFields, Comparison), Error> {
        let compare = self.compare(live, new)?;
        let changed = compare.modified.union(&compare.added);
        let mut conflicts: BTreeMap<String, FieldSet> = BTreeMap::new();
        managers.retain(|m, vs| m == workflow || vs.api_version == version);
        for (manager, vs) in &managers {
            if manager == workflow {
                continue;
            }
            let c = vs.set.intersection(&changed);
            if !c.is_empty() {
                conflicts.insert(manager.clone(), c);
            }
        }
        if !force && !conflicts.is_empty() {
            let list = conflicts
                .iter()
                .flat_map(|(m, s)| {
                    s.paths().into_iter().map(|p| Conflict {
                        manager: m.clone(),
                        path: p,
                    })
                })
                .collect();
            return Err(Error::Conflicts(list));
        }
        for (manager, vs) in managers.iter_mut() {
            if let Some(c) = conflicts.get(manager) {
                vs.set = vs.set.difference(c);
            }
            if manager != workflow && !compare.removed.is_empty() {
                vs.set = vs.set.difference(&compare.removed);
            }
        }
        managers.retain(|_, vs| !vs.set.is_empty());
        Ok((managers, compare))
    }

    /// SMD `Updater.Update`: `manager` (an identifier) takes ownership of
    /// every field the write added or modified; `live` and `new` must be
    /// valid for the schema.
    pub(crate) fn update(
        &self,
        live: &Value,
        new: &Value,
        version: &str,
        managers: ManagedFields,
        manager: &str,
    ) -> Result<ManagedFields, Error> {
        let managers = self.reconcile(managers, version);
        let (mut managers, compare) =
            self.update_inner(live, new, version, managers, manager, true)?;
        let previous = managers
            .remove(manager)
            .map(|vs| vs.set)
            .unwrap_or_default();
        let set = previous
            .difference(&compare.removed)
            .union(&compare.modified)
            .union(&compare.added)
            .recursive_difference(self.ignored);
        if !set.is_empty() {
            managers.insert(
                manager.to_string(),
                VersionedSet {
                    set,
                    api_version: version.to_string(),
                    applied: false,
                },
            );
        }
        Ok(managers)
    }

    /// SMD `Updater.Apply`: merges `config` into `live`, records what the
    /// applier now owns, prunes what it applied before and no longer
    /// applies (unless someone else owns it), and checks conflicts.
    /// Returns `None` as the object when nothing changed (SMD returns nil
    /// then; kube then keeps the live object and does not bump times).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn apply(
        &self,
        live: &Value,
        config: &Value,
        version: &str,
        managers: ManagedFields,
        manager: &str,
        force: bool,
    ) -> Result<(Option<Value>, ManagedFields), Error> {
        let mut managers = self.reconcile(managers, version);
        let merged = typed::merge(self.schema, live, config)
            .map_err(|e| Error::Internal(format!("failed to merge config: {e}")))?;
        let last = managers.get(manager).cloned();
        let set = typed::to_field_set(self.schema, config)
            .map_err(|e| Error::Internal(format!("failed to get field set: {e}")))?
            .recursive_difference(self.ignored);
        managers.insert(
            manager.to_string(),
            VersionedSet {
                set,
                api_version: version.to_string(),
                applied: true,
            },
        );
        let new = self.prune(merged, &managers, last.as_ref(), version)?;
        let (managers, _) = self.update_inner(live, &new, version, managers, manager, force)?;
        if values_equal(live, &new) {
            return Ok((None, managers));
        }
        Ok((Some(new), managers))
    }

    fn field_set(&self, v: &Value) -> Result<FieldSet, Error> {
        typed::to_field_set(self.schema, v)
            .map_err(|e| Error::Internal(format!("failed to create field set: {e}")))
    }

    fn named(&self, s: &FieldSet) -> FieldSet {
        s.ensure_named_fields_are_members(self.schema, Some(self.schema.root()))
    }

    /// SMD `prune`: removes a field or item iff the applier applied it
    /// last time, did not apply it now, and no other manager owns it.
    fn prune(
        &self,
        merged: Value,
        managers: &ManagedFields,
        last: Option<&VersionedSet>,
        version: &str,
    ) -> Result<Value, Error> {
        let Some(last) = last else { return Ok(merged) };
        if last.set.is_empty() || last.api_version != version {
            return Ok(merged);
        }
        let pruned = typed::remove_items(self.schema, &merged, &self.named(&last.set));
        // addBackOwnedItems (only the served version can be converted).
        let mut managed = FieldSet::new();
        for vs in managers.values().filter(|vs| vs.api_version == version) {
            managed = managed.union(&vs.set);
        }
        let merged_set = self.named(&self.field_set(&merged)?);
        let pruned_set = self.named(&self.field_set(&pruned)?);
        let keep = pruned_set.union(&self.named(&managed));
        let pruned = typed::remove_items(self.schema, &merged, &merged_set.difference(&keep));
        // addBackDanglingItems: only remove what the applier owned before.
        let pruned_set = self.named(&self.field_set(&pruned)?);
        let remove = merged_set
            .difference(&pruned_set)
            .intersection(&self.named(&last.set));
        Ok(typed::remove_items(self.schema, &merged, &remove))
    }
}
