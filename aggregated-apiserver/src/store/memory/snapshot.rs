//! List snapshots: the objects at one resourceVersion with their label index, the pages a
//! `continue` token walks through them, and the token itself.

use super::*;

/// The opaque `continue` token: where the next page starts, in which snapshot.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ContinueToken {
    /// Always `meta.k8s.io/v1`, as kube-apiserver's tokens say.
    pub v: String,
    /// The resourceVersion of the snapshot the list reads.
    pub rv: u64,
    /// Namespace and name of the last item returned.
    pub start: (String, String),
    /// Items already returned, for `remainingItemCount`.
    pub offset: usize,
}

impl ContinueToken {
    /// The token as sent: unpadded URL-safe base64 of its JSON.
    pub fn encode(&self) -> String {
        use base64::Engine;
        let json = serde_json::to_vec(self).unwrap_or_default();
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(json)
    }

    /// Reads a token [`ContinueToken::encode`] made; 400 BadRequest for anything else.
    pub fn decode(token: &str) -> Result<Self> {
        use base64::Engine;
        let bad = || Error::BadRequest(format!("continue key is not valid: {token:?}"));
        let json = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(token)
            .map_err(|_| bad())?;
        let token: Self = serde_json::from_slice(&json).map_err(|_| bad())?;
        if token.v != "meta.k8s.io/v1" {
            return Err(bad());
        }
        Ok(token)
    }
}

#[derive(Clone)]
pub(super) struct Snapshot<K> {
    pub(super) objects: OrdMap<ObjectKey, Object<K>>,
    pub(super) per_namespace: PHashMap<String, usize>,
    /// The objects carrying each `key=value` label (by pair hash): a `-l app=x` list visits
    /// its candidates, not every object, and reads them here rather than looking each one up
    /// again in `objects`.
    pub(super) by_label: PHashMap<u64, OrdMap<ObjectKey, Object<K>>>,
    pub(super) resource_version: u64,
}

impl<K> Snapshot<K> {
    pub(super) fn empty(resource_version: u64) -> Self {
        Self {
            objects: OrdMap::new(),
            per_namespace: PHashMap::new(),
            by_label: PHashMap::new(),
            resource_version,
        }
    }

    /// Puts `object` at `key`, keeping the label index and the namespace counts; returns the
    /// object it replaced.
    pub(super) fn put(&mut self, key: ObjectKey, object: Object<K>) -> Option<Object<K>> {
        let previous = self.remove(&key);
        for hash in &object.label_hashes {
            let mut set = self.by_label.get(hash).cloned().unwrap_or_default();
            set.insert(key.clone(), object.clone());
            self.by_label.insert(*hash, set);
        }
        *self.per_namespace.entry(key.namespace.clone()).or_insert(0) += 1;
        self.objects.insert(key, object);
        previous
    }

    /// Removes the object at `key`, keeping the label index and the namespace counts.
    pub(super) fn remove(&mut self, key: &ObjectKey) -> Option<Object<K>> {
        let previous = self.objects.remove(key)?;
        for hash in &previous.label_hashes {
            if let Some(set) = self.by_label.get(hash) {
                let mut set = set.clone();
                set.remove(key);
                if set.is_empty() {
                    self.by_label.remove(hash);
                } else {
                    self.by_label.insert(*hash, set);
                }
            }
        }
        match self.per_namespace.get(&key.namespace).copied() {
            Some(n) if n > 1 => {
                self.per_namespace.insert(key.namespace.clone(), n - 1);
            }
            _ => {
                self.per_namespace.remove(&key.namespace);
            }
        }
        Some(previous)
    }

    /// Objects in `namespace`, or in all of them.
    pub(super) fn count_in(&self, namespace: Option<&str>) -> usize {
        match namespace {
            Some(ns) => self.per_namespace.get(ns).copied().unwrap_or(0),
            None => self.objects.len(),
        }
    }
}

impl<K: ServedResource> Snapshot<K> {
    /// `objects` as of `resource_version`.
    pub(super) fn build(
        objects: impl IntoIterator<Item = Object<K>>,
        resource_version: u64,
    ) -> Self {
        let mut snapshot = Self::empty(resource_version);
        for object in objects {
            snapshot.put(ObjectKey::of(object.meta()), object);
        }
        snapshot
    }
}

pub(super) fn scope_matches(namespace: Option<&str>, key: &ObjectKey) -> bool {
    namespace.is_none_or(|ns| ns == key.namespace)
}

/// The one key a name-pinning field selector in a namespace names, on a first page: such a
/// list is one lookup, not a scan.
pub(super) fn pinned_key(request: &ListRequest) -> Option<ObjectKey> {
    match (&request.namespace, request.filter.fields.exact_name()) {
        (Some(ns), Some(name)) if request.continue_token.is_none() => {
            Some(ObjectKey::new(ns, name))
        }
        _ => None,
    }
}

/// Where a list starts: after a continue token's last item, at a namespace's first key, or at
/// the first key of all.
pub(super) fn lower_bound(
    token: Option<&ContinueToken>,
    namespace: Option<&str>,
) -> Bound<ObjectKey> {
    match (token, namespace) {
        (Some(t), _) => Bound::Excluded(ObjectKey::new(t.start.0.clone(), t.start.1.clone())),
        (None, Some(ns)) => Bound::Included(ObjectKey::new(ns, "")),
        (None, None) => Bound::Unbounded,
    }
}

/// The objects a list looks at from `lower` on, in key order: with an `=` label requirement,
/// only those carrying that label.
pub(super) fn candidates<'s, K>(
    snapshot: &'s Snapshot<K>,
    filter: &Filter,
    lower: Bound<ObjectKey>,
) -> Box<dyn Iterator<Item = (&'s ObjectKey, &'s Object<K>)> + 's> {
    match filter.labels.indexed_hash() {
        Some(hash) => match snapshot.by_label.get(&hash) {
            Some(labelled) => Box::new(labelled.range((lower, Bound::Unbounded))),
            None => Box::new(std::iter::empty()),
        },
        None => Box::new(snapshot.objects.range((lower, Bound::Unbounded))),
    }
}

/// A candidate passes the list's selectors (the label hashes rule most out unread).
pub(super) fn selected<K: ServedResource>(
    filter: &Filter,
    key: &ObjectKey,
    object: &Object<K>,
) -> bool {
    filter.labels.may_match(&object.label_hashes) && filter.matches(key, object.get())
}

/// An unlimited list's objects, lent a piece at a time from the snapshot it started on.
pub(super) struct SnapshotObjects<K> {
    pub(super) snapshot: Snapshot<K>,
    pub(super) namespace: Option<String>,
    pub(super) filter: Filter,
    /// Where the next piece starts.
    pub(super) lower: Bound<ObjectKey>,
    pub(super) done: bool,
}

impl<K: ServedResource> LendObjects<K> for SnapshotObjects<K> {
    /// Never waits: the snapshot is in memory.
    fn poll_lend(
        &mut self,
        _: &mut Context<'_>,
        visit: &mut dyn FnMut(&Object<K>) -> ControlFlow<()>,
    ) -> Poll<Result<bool>> {
        Poll::Ready(Ok(self.lend(visit)))
    }
}

impl<K: ServedResource> SnapshotObjects<K> {
    pub(super) fn lend(&mut self, visit: &mut dyn FnMut(&Object<K>) -> ControlFlow<()>) -> bool {
        if self.done {
            return false;
        }
        let namespace = self.namespace.as_deref();
        let selects_all = self.filter.is_empty();
        let lower = std::mem::replace(&mut self.lower, Bound::Unbounded);
        let range = candidates(&self.snapshot, &self.filter, lower)
            .take_while(|(k, _)| scope_matches(namespace, k));
        for (key, object) in range {
            if (selects_all || selected(&self.filter, key, object)) && visit(object).is_break() {
                self.lower = Bound::Excluded(key.clone());
                return true;
            }
        }
        self.done = true;
        false
    }
}

/// The snapshots lists read from and continue through.
impl<K: ServedResource> MemoryStore<K> {
    pub(super) fn snapshot_for_list(
        &self,
        request: &ListRequest,
    ) -> Result<(Snapshot<K>, Option<ContinueToken>)> {
        let state = self.shared.state.read().map_err(|_| lock_poisoned())?;
        let current_rv = state.current.resource_version;
        if let Some(token) = &request.continue_token {
            let token = ContinueToken::decode(token)?;
            if token.rv == current_rv {
                return Ok((state.current.clone(), Some(token)));
            }
            return match state.snapshots.get(&token.rv) {
                Some((taken, snapshot)) if taken.elapsed() < self.shared.config.snapshot_ttl => {
                    Ok((snapshot.clone(), Some(token)))
                }
                _ => Err(expired_continue()),
            };
        }
        let snapshot = match request.read_at {
            ReadAt::Latest | ReadAt::Any => state.current.clone(),
            ReadAt::NotOlderThan(rv) if rv <= current_rv => state.current.clone(),
            ReadAt::Exact(rv) if rv == current_rv => state.current.clone(),
            ReadAt::Exact(rv) if rv < current_rv => match state.snapshots.get(&rv) {
                Some((_, snapshot)) => snapshot.clone(),
                None => {
                    return Err(Error::Expired(too_old(rv, state.oldest_watchable)));
                }
            },
            ReadAt::NotOlderThan(rv) | ReadAt::Exact(rv) => {
                return Err(crate::store::too_large(rv, current_rv));
            }
        };
        Ok((snapshot, None))
    }

    pub(super) fn remember_snapshot(&self, snapshot: &Snapshot<K>) -> Result<()> {
        let mut state = self.write()?;
        if state.snapshots.contains_key(&snapshot.resource_version) {
            return Ok(());
        }
        state.snapshots.insert(
            snapshot.resource_version,
            (Instant::now(), snapshot.clone()),
        );
        while state.snapshots.len() > self.shared.config.max_snapshots {
            state.snapshots.pop_first();
        }
        Ok(())
    }
}
