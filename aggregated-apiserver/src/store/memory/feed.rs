//! The feed of a watch cache (a view's cache, the etcd store): objects applied at the
//! versions another server gave them, resets to a relist, and the snapshots lists read from.

use super::*;

impl<K: ServedResource> MemoryStore<K> {
    /// Upserts an object at an externally given resourceVersion (a watch cache of another
    /// server's objects). Older or equal versions than the current state are ignored.
    pub fn apply_external(&self, mut object: K) -> Result<()> {
        let rv = object
            .meta()
            .resource_version
            .as_deref()
            .and_then(parse_resource_version)
            .unwrap_or(0);
        let mut state = self.write()?;
        let rv = rv.max(state.current.resource_version + 1);
        // The object carries the version its event has, so clients resume from it exactly.
        set_resource_version(&mut object, rv);
        let key = ObjectKey::of(object.meta());
        let type_ = if state.current.objects.contains_key(&key) {
            EventType::Modified
        } else {
            EventType::Added
        };
        Self::commit(&mut state, &self.shared, rv, type_, Stored::new(object));
        Ok(())
    }

    /// Makes the store hold exactly `objects` (each at its own resourceVersion) as of
    /// `revision`: the first list of a watch cache, or its relist after its watch was lost.
    /// Differences from what it held are sent to its watchers at `revision`.
    pub fn reset_at(&self, objects: Vec<K>, revision: u64) -> Result<()> {
        let mut state = self.write()?;
        let incoming: BTreeMap<ObjectKey, K> = objects
            .into_iter()
            .map(|o| (ObjectKey::of(o.meta()), o))
            .collect();
        if state.current.objects.is_empty() && state.history.is_empty() {
            // Nobody has seen anything yet: load, no events.
            for (key, object) in incoming {
                state.current.put(key, Stored::new(object));
            }
            state.current.resource_version = revision.max(state.current.resource_version);
            state.oldest_watchable = state.current.resource_version;
            return Ok(());
        }
        let revision = revision.max(state.current.resource_version + 1);
        let gone: Vec<Object<K>> = state
            .current
            .objects
            .iter()
            .filter(|(k, _)| !incoming.contains_key(*k))
            .map(|(_, v)| v.clone())
            .collect();
        for object in gone {
            let mut deleted = (*object).clone();
            set_resource_version(&mut deleted, revision);
            Self::commit(
                &mut state,
                &self.shared,
                revision,
                EventType::Deleted,
                Stored::new(deleted),
            );
        }
        for (key, object) in incoming {
            let type_ = match state.current.objects.get(&key) {
                Some(current)
                    if current.meta().resource_version == object.meta().resource_version =>
                {
                    continue;
                }
                Some(_) => EventType::Modified,
                None => EventType::Added,
            };
            Self::commit(
                &mut state,
                &self.shared,
                revision,
                type_,
                Stored::new(object),
            );
        }
        state.current.resource_version = revision;
        Ok(())
    }

    /// The snapshot `request` reads that this store lacks, if any: a continue token from
    /// another replica (or one whose snapshot expired here), or an Exact list older than the
    /// snapshots kept. A watch cache loads it from its source ([`MemoryStore::remember_at`]).
    pub fn missing_snapshot(&self, request: &ListRequest) -> Result<Option<u64>> {
        let state = self.shared.state.read().map_err(|_| lock_poisoned())?;
        let current = state.current.resource_version;
        let wanted = match (&request.continue_token, request.read_at) {
            (Some(token), _) => ContinueToken::decode(token)?.rv,
            (None, ReadAt::Exact(rv)) if rv < current => rv,
            _ => return Ok(None),
        };
        let kept = wanted == current
            || state
                .snapshots
                .get(&wanted)
                .is_some_and(|(taken, _)| taken.elapsed() < self.shared.config.snapshot_ttl);
        Ok((!kept).then_some(wanted))
    }

    /// Keeps `objects` as the snapshot at `revision` (read from the cache's source), for the
    /// continue tokens and Exact lists [`MemoryStore::missing_snapshot`] named.
    pub fn remember_at(&self, objects: Vec<K>, revision: u64) -> Result<()> {
        let snapshot = Snapshot::build(objects.into_iter().map(Stored::new), revision);
        let mut state = self.write()?;
        state.snapshots.remove(&revision);
        drop(state);
        self.remember_snapshot(&snapshot)
    }

    /// The store is current as of `revision` with no change since its last one (a watch
    /// cache told so by its source).
    pub fn advance(&self, revision: u64) -> Result<()> {
        let mut state = self.write()?;
        if revision > state.current.resource_version {
            state.current.resource_version = revision;
        }
        Ok(())
    }

    /// Removes an object at an externally given resourceVersion.
    pub fn delete_external(&self, mut object: K) -> Result<()> {
        let mut state = self.write()?;
        let key = ObjectKey::of(object.meta());
        if !state.current.objects.contains_key(&key) {
            return Ok(());
        }
        let rv = object
            .meta()
            .resource_version
            .as_deref()
            .and_then(parse_resource_version)
            .unwrap_or(0)
            .max(state.current.resource_version + 1);
        set_resource_version(&mut object, rv);
        Self::commit(
            &mut state,
            &self.shared,
            rv,
            EventType::Deleted,
            Stored::new(object),
        );
        Ok(())
    }

    /// What a relist brought for `object`, against what the store holds: only its key when the
    /// store has it at the same resourceVersion, so a relist of a large cache buffers the
    /// changes, not a second copy of everything.
    /// A store it cannot read (a poisoned lock) counts it as changed: it is kept whole.
    pub fn listed(&self, object: K) -> Listed<K> {
        let key = ObjectKey::of(object.meta());
        let unchanged = self.shared.state.read().is_ok_and(|state| {
            state.current.objects.get(&key).is_some_and(|current| {
                current.meta().resource_version == object.meta().resource_version
            })
        });
        if unchanged {
            Listed::Unchanged(key)
        } else {
            Listed::Changed(object)
        }
    }

    /// Replaces the content within `namespace` (all when None) after a relist, emitting the
    /// differences as events.
    pub fn replace_external_in(
        &self,
        namespace: Option<&str>,
        objects: impl IntoIterator<Item = Listed<K>>,
    ) -> Result<()> {
        let mut changed = Vec::new();
        let mut listed = std::collections::BTreeSet::new();
        for object in objects {
            match object {
                Listed::Unchanged(key) => {
                    listed.insert(key);
                }
                Listed::Changed(object) => {
                    listed.insert(ObjectKey::of(object.meta()));
                    changed.push(object);
                }
            }
        }
        let gone: Vec<Object<K>> = {
            let state = self.shared.state.read().map_err(|_| lock_poisoned())?;
            state
                .current
                .objects
                .iter()
                .filter(|(k, _)| scope_matches(namespace, k) && !listed.contains(*k))
                .map(|(_, v)| v.clone())
                .collect()
        };
        drop(listed);
        for object in gone {
            self.delete_external((*object).clone())?;
        }
        for object in changed {
            if let Listed::Changed(object) = self.listed(object) {
                self.apply_external(object)?;
            }
        }
        Ok(())
    }
}

/// One object of a relist ([`MemoryStore::listed`]).
pub enum Listed<K> {
    /// The store holds it at this resourceVersion already.
    Unchanged(ObjectKey),
    /// New, or changed since the store's copy.
    Changed(K),
}
