//! The SMD updater (`merge/update.go`): ownership bookkeeping for updates
//! and applies, conflicts, and pruning of fields an applier stopped
//! applying.
//!
//! A kind served in several versions has its managers' sets at each of
//! them: the updater compares, and prunes, in each manager's own version,
//! converting the objects there ([`crate::Versions`], SMD's `Converter`).
//! Sets at a version the kind does not have are SMD's "missing version":
//! they are dropped.

use std::{borrow::Cow, collections::BTreeMap};

use serde_json::Value;

use super::conflict::Conflict;
use super::path::values_equal;
use super::schema::Schema;
use super::set::FieldSet;
use super::typed::{self, Comparison};
use super::{Error, Versions};

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
#[derive(Clone, Copy)]
pub(crate) struct Updater<'a> {
    /// Schema of the objects, at the version written.
    pub(crate) schema: &'a Schema,
    /// Fields never tracked (reset fields; SMD `IgnoredFields`), removed
    /// with everything below them.
    pub(crate) ignored: &'a FieldSet,
    /// The kind's other versions; None: only the version written.
    pub(crate) versions: Option<&'a dyn Versions>,
}

/// An object at one version, with that version's schema and ignored fields.
struct AtVersion<'a> {
    object: Cow<'a, Value>,
    schema: &'a Schema,
    ignored: Cow<'a, FieldSet>,
}

impl<'a> Updater<'a> {
    /// `object` (at `from`) at `version`: itself, or
    /// converted; None for a version the kind does not have (SMD's missing
    /// version).
    fn at<'v>(&self, object: &'v Value, from: &str, version: &str) -> Option<AtVersion<'v>>
    where
        'a: 'v,
    {
        if version == from {
            return Some(AtVersion {
                object: Cow::Borrowed(object),
                schema: self.schema,
                ignored: Cow::Borrowed(self.ignored),
            });
        }
        let versions = self.versions?;
        let schema = versions.schema(version)?;
        let object = versions.convert(object, version)?;
        Some(AtVersion {
            object: Cow::Owned(object),
            schema,
            // The reset fields are top-level fields, the same in every version.
            ignored: Cow::Borrowed(self.ignored),
        })
    }

    /// Whether the kind has `version` (besides `written`).
    fn has(&self, version: &str, written: &str) -> bool {
        version == written || self.versions.is_some_and(|v| v.schema(version).is_some())
    }

    /// SMD `reconcileManagedFieldsWithSchemaChanges`: sets at a version
    /// the kind does not have are dropped (schema changes are not
    /// reconciled: the schemas are static).
    fn reconcile(&self, managers: ManagedFields, version: &str) -> ManagedFields {
        managers
            .into_iter()
            .filter(|(_, vs)| self.has(&vs.api_version, version))
            .collect()
    }

    fn compare(&self, live: &Value, new: &Value) -> Result<Comparison, Error> {
        compare_at(self.schema, self.ignored, live, new)
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
        // Each manager's set is compared with the change at its version.
        let mut at_versions: BTreeMap<String, Option<Comparison>> = BTreeMap::new();
        let mut conflicts: BTreeMap<String, FieldSet> = BTreeMap::new();
        let mut removed: BTreeMap<String, FieldSet> = BTreeMap::new();
        let mut missing = Vec::new();
        for (manager, vs) in &managers {
            if manager == workflow {
                continue;
            }
            let compare = if vs.api_version == version {
                &compare
            } else {
                if !at_versions.contains_key(&vs.api_version) {
                    let c = self.compare_at_version(live, new, version, &vs.api_version)?;
                    at_versions.insert(vs.api_version.clone(), c);
                }
                match &at_versions[&vs.api_version] {
                    Some(c) => c,
                    // A version the kind lacks is dropped; one the objects do not convert to
                    // (an object the write leaves incomplete) keeps its set as it is.
                    None if !self.has(&vs.api_version, version) => {
                        missing.push(manager.clone());
                        continue;
                    }
                    None => continue,
                }
            };
            let c = vs.set.intersection(&compare.modified.union(&compare.added));
            if !c.is_empty() {
                conflicts.insert(manager.clone(), c);
            }
            if !compare.removed.is_empty() {
                removed.insert(manager.clone(), compare.removed.clone());
            }
        }
        for manager in missing {
            managers.remove(&manager);
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
            if let Some(r) = removed.get(manager) {
                vs.set = vs.set.difference(r);
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

    /// SMD `prune`: removes a field or item iff the applier applied it
    /// last time, did not apply it now, and no other manager owns it.
    /// SMD `prune` at the version of the applier's last set, then back at
    /// `version` (the version written).
    fn prune(
        &self,
        merged: Value,
        managers: &ManagedFields,
        last: Option<&VersionedSet>,
        version: &str,
    ) -> Result<Value, Error> {
        let Some(last) = last else { return Ok(merged) };
        if last.set.is_empty() {
            return Ok(merged);
        }
        let Some(at) = self.at(&merged, version, &last.api_version) else {
            return Ok(merged);
        };
        let (schema, merged_at) = (at.schema, at.object.as_ref());
        let pruned = typed::remove_items(schema, merged_at, &named(schema, &last.set));
        // addBackOwnedItems: every version's managers, the pruned one's first.
        let mut managed_at: BTreeMap<&str, FieldSet> = BTreeMap::new();
        for vs in managers.values() {
            let set = managed_at.entry(&vs.api_version).or_default();
            *set = set.union(&vs.set);
        }
        let mut pruned = Cow::Owned(pruned);
        let mut merged_here: Cow<Value> = Cow::Borrowed(merged_at);
        let mut here = last.api_version.as_str();
        let first = managed_at.remove_entry(here);
        for (v, managed) in first.into_iter().chain(managed_at) {
            let (Some(m), Some(p)) = (self.at(&merged_here, here, v), self.at(&pruned, here, v))
            else {
                return Err(Error::Internal(format!(
                    "failed to convert the object to {v}"
                )));
            };
            let schema = m.schema;
            let merged_set = named(schema, &field_set(schema, &m.object)?);
            let pruned_set = named(schema, &field_set(schema, &p.object)?);
            let keep = pruned_set.union(&named(schema, &managed));
            let kept = typed::remove_items(schema, &m.object, &merged_set.difference(&keep));
            merged_here = Cow::Owned(m.object.into_owned());
            pruned = Cow::Owned(kept);
            here = v;
        }
        // addBackDanglingItems: only remove what the applier owned before
        // (at the last set's version).
        let (Some(m), Some(p)) = (
            self.at(&merged_here, here, &last.api_version),
            self.at(&pruned, here, &last.api_version),
        ) else {
            return Ok(merged);
        };
        let schema = m.schema;
        let merged_set = named(schema, &field_set(schema, &m.object)?);
        let pruned_set = named(schema, &field_set(schema, &p.object)?);
        let remove = merged_set
            .difference(&pruned_set)
            .intersection(&named(schema, &last.set));
        let pruned = typed::remove_items(schema, &m.object, &remove);
        match self.at(&pruned, &last.api_version, version) {
            Some(back) => Ok(back.object.into_owned()),
            None => Err(Error::Internal(format!(
                "failed to convert the object to {version}"
            ))),
        }
    }

    /// The comparison of `live` and `new` (at `written`) at `version`;
    /// None when the kind has no such version.
    fn compare_at_version(
        &self,
        live: &Value,
        new: &Value,
        written: &str,
        version: &str,
    ) -> Result<Option<Comparison>, Error> {
        let (Some(live), Some(new)) = (
            self.at(live, written, version),
            self.at(new, written, version),
        ) else {
            return Ok(None);
        };
        compare_at(live.schema, &live.ignored, &live.object, &new.object).map(Some)
    }
}

fn compare_at(
    schema: &Schema,
    ignored: &FieldSet,
    live: &Value,
    new: &Value,
) -> Result<Comparison, Error> {
    let mut c = typed::compare(schema, live, new)
        .map_err(|e| Error::Internal(format!("failed to compare objects: {e}")))?;
    c.exclude_fields(ignored);
    Ok(c)
}

fn field_set(schema: &Schema, v: &Value) -> Result<FieldSet, Error> {
    typed::to_field_set(schema, v)
        .map_err(|e| Error::Internal(format!("failed to create field set: {e}")))
}

fn named(schema: &Schema, s: &FieldSet) -> FieldSet {
    s.ensure_named_fields_are_members(schema, Some(schema.root()))
}
