//! The etcd store's writes: compare-and-swap transactions on the key's `mod_revision`, which is
//! the object's resourceVersion. They go to etcd, never to the cache, which sees them through
//! its watch.

use async_trait::async_trait;

use super::{EtcdStore, client::Compare, unavailable};
use crate::{
    error::{Error, Result},
    resource::{ObjectKey, ServedResource},
    store::{
        Object, Preconditions, Store, Stored, UpdateFrom, WritableStore, check_preconditions,
        outdated,
    },
};

/// The object's JSON as stored: without its resourceVersion (the key's revision is).
fn encode<K: ServedResource>(object: &K) -> Result<Vec<u8>> {
    let mut object = object.clone();
    object.meta_mut().resource_version = None;
    serde_json::to_vec(&object).map_err(|e| Error::Internal(format!("encoding: {e}")))
}

#[async_trait]
impl<K: ServedResource> WritableStore<K> for EtcdStore<K> {
    /// From the cache first, without waiting for it to catch up (that would serialize writes
    /// behind reads): a copy older than etcd's fails the update's compare-and-swap, and the
    /// retry reads etcd ([`UpdateFrom::Source`]), as does an object the cache does not hold
    /// yet (just created through another replica).
    async fn get_for_update(&self, key: &ObjectKey, from: UpdateFrom) -> Result<Object<K>> {
        self.check_ready()?;
        let cache = &self.sink().cache;
        if from == UpdateFrom::Cache
            && let Ok(cached) = cache.get(key).await
        {
            return Ok(cached);
        }
        let etcd = self.source();
        let kv = etcd
            .read_key(&etcd.key::<K>(key))
            .await?
            .ok_or_else(|| Error::NotFound(K::subject(&key.name)))?;
        // The cached object when it is that version: its JSON is encoded already.
        if let Ok(cached) = cache.get(key).await
            && cached.meta().resource_version.as_deref() == Some(&kv.mod_revision.to_string())
        {
            return Ok(cached);
        }
        Ok(Stored::new(etcd.decode(&kv, kv.mod_revision)?))
    }

    fn updates_from_a_cache(&self) -> bool {
        true
    }

    async fn create(&self, mut object: K, dry_run: bool) -> Result<Object<K>> {
        let etcd = self.source();
        let key = ObjectKey::of(object.meta());
        let etcd_key = etcd.key::<K>(&key);
        if dry_run {
            if etcd.read_key(&etcd_key).await?.is_some() {
                return Err(Error::AlreadyExists(K::subject(&key.name)));
            }
            return Ok(Stored::new(object));
        }
        let value = encode(&object)?;
        let done = etcd
            .client
            .txn(&etcd_key, Compare::Absent, Some(&value))
            .await
            .map_err(unavailable)?;
        if !done.succeeded {
            return Err(Error::AlreadyExists(K::subject(&key.name)));
        }
        object.meta_mut().resource_version = Some(done.revision.to_string());
        Ok(Stored::new(object))
    }

    async fn update(&self, mut object: K, dry_run: bool) -> Result<Object<K>> {
        let etcd = self.source();
        let key = ObjectKey::of(object.meta());
        let etcd_key = etcd.key::<K>(&key);
        let expected: i64 = object
            .meta()
            .resource_version
            .as_deref()
            .and_then(|rv| rv.parse().ok())
            .ok_or_else(|| outdated::<K>(&key.name))?;
        if dry_run {
            return match etcd.read_key(&etcd_key).await? {
                None => Err(Error::NotFound(K::subject(&key.name))),
                Some(kv) if kv.mod_revision != expected => Err(outdated::<K>(&key.name)),
                Some(_) => Ok(Stored::new(object)),
            };
        }
        let value = encode(&object)?;
        let done = etcd
            .client
            .txn(&etcd_key, Compare::ModRevision(expected), Some(&value))
            .await
            .map_err(unavailable)?;
        if !done.succeeded {
            return Err(match done.current {
                None => Error::NotFound(K::subject(&key.name)),
                Some(_) => outdated::<K>(&key.name),
            });
        }
        object.meta_mut().resource_version = Some(done.revision.to_string());
        Ok(Stored::new(object))
    }

    async fn delete(
        &self,
        key: &ObjectKey,
        preconditions: &Preconditions,
        dry_run: bool,
    ) -> Result<Object<K>> {
        let etcd = self.source();
        let etcd_key = etcd.key::<K>(key);
        // One compare-and-swap on the revision read: a lost race is a conflict, which the
        // write's one retry loop (rest::guaranteed) takes back to a new read.
        let Some(kv) = etcd.read_key(&etcd_key).await? else {
            return Err(Error::NotFound(K::subject(&key.name)));
        };
        let current = etcd.decode(&kv, kv.mod_revision)?;
        check_preconditions(&current, preconditions)?;
        if dry_run {
            return Ok(Stored::new(current));
        }
        let done = etcd
            .client
            .txn(&etcd_key, Compare::ModRevision(kv.mod_revision), None)
            .await
            .map_err(unavailable)?;
        if !done.succeeded {
            return Err(match done.current {
                None => Error::NotFound(K::subject(&key.name)),
                Some(_) => outdated::<K>(&key.name),
            });
        }
        let mut deleted = current;
        deleted.meta_mut().resource_version = Some(done.revision.to_string());
        Ok(Stored::new(deleted))
    }
}
