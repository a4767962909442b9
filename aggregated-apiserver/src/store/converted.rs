//! A kind served at a version other than the one its store holds (kube-apiserver's conversion
//! around its storage): every read converted from the stored version, every write to it. The
//! resourceVersions, continue tokens and history are the store's. A converted watch event is
//! made once however many watchers send it; a converted object is kept with the stored one
//! ([`super::Stored::at_version`]), or, for a cache mirroring another resource at cluster scale,
//! made for each read and kept by none ([`Converted::per_read`]).
//!
//! Selectors are evaluated by the store on the stored version: a kind's selectable fields
//! must have the same names and values in every version it is served at.

use std::{
    marker::PhantomData,
    ops::ControlFlow,
    sync::Arc,
    task::{Context, Poll},
};

use async_trait::async_trait;
use futures::StreamExt;

use super::{
    LendObjects, ListCursor, ListRequest, Object, PageInfo, Preconditions, Store, StoreStats,
    UpdateFrom, WatchItem, WatchRequest, WatchStream, WritableStore,
};
use crate::{
    error::Result,
    resource::{ObjectKey, ServedResource, VersionOf},
};

/// `V` served from a store of `S`.
pub struct Converted<V, S> {
    store: Arc<dyn Store<S>>,
    keep: Keep,
    version: PhantomData<fn() -> V>,
}

/// Whether a converted object is kept with the stored one.
#[derive(Clone, Copy)]
enum Keep {
    /// Made once, on its first read: the objects this server writes, whose GETs and lists at
    /// the other version then cost what the stored version's do.
    WithObject,
    /// Made for each read: a cache of another resource holds each object once, whatever
    /// version its clients read.
    None,
}

impl<V: VersionOf<S>, S: ServedResource> Converted<V, S> {
    /// `V` served from `store`, each object converted once and kept with it.
    pub fn new(store: Arc<dyn Store<S>>) -> Self {
        Self {
            store,
            keep: Keep::WithObject,
            version: PhantomData,
        }
    }

    /// `V` served from `store`, converted on every read and kept by none.
    pub fn per_read(store: Arc<dyn Store<S>>) -> Self {
        Self {
            keep: Keep::None,
            ..Self::new(store)
        }
    }

    fn view(&self, object: &Object<S>) -> Object<V> {
        view(self.keep, object)
    }
}

fn view<V: VersionOf<S>, S: ServedResource>(keep: Keep, object: &Object<S>) -> Object<V> {
    match keep {
        Keep::WithObject => object.at_version(V::from_stored),
        Keep::None => super::Stored::new(V::from_stored(object)),
    }
}

/// A list cursor of `S` lending its objects at `V`.
struct ConvertedObjects<V, S> {
    inner: Box<dyn LendObjects<S>>,
    keep: Keep,
    version: PhantomData<fn() -> V>,
}

impl<V: VersionOf<S>, S: ServedResource> LendObjects<V> for ConvertedObjects<V, S> {
    fn poll_lend(
        &mut self,
        cx: &mut Context<'_>,
        visit: &mut dyn FnMut(&Object<V>) -> ControlFlow<()>,
    ) -> Poll<Result<bool>> {
        let keep = self.keep;
        self.inner
            .poll_lend(cx, &mut |object| visit(&view::<V, S>(keep, object)))
    }
}

#[async_trait]
impl<V: VersionOf<S>, S: ServedResource> Store<V> for Converted<V, S> {
    async fn get(&self, key: &ObjectKey) -> Result<Object<V>> {
        Ok(self.view(&self.store.get(key).await?))
    }

    fn get_sync(&self, namespace: &str, name: &str) -> Option<Result<Object<V>>> {
        self.store
            .get_sync(namespace, name)
            .map(|found| found.map(|object| self.view(&object)))
    }

    async fn list_each(
        &self,
        request: &ListRequest,
        visit: &mut (dyn for<'o> FnMut(&'o Object<V>) + Send),
    ) -> Result<PageInfo> {
        self.store
            .list_each(request, &mut |object| visit(&self.view(object)))
            .await
    }

    async fn list_cursor(&self, request: &ListRequest) -> Result<Option<ListCursor<V>>> {
        Ok(self
            .store
            .list_cursor(request)
            .await?
            .map(|cursor| ListCursor {
                info: cursor.info,
                objects: Box::new(ConvertedObjects::<V, S> {
                    inner: cursor.objects,
                    keep: self.keep,
                    version: PhantomData,
                }),
            }))
    }

    fn count_sync(&self, namespace: Option<&str>) -> Option<usize> {
        self.store.count_sync(namespace)
    }

    async fn watch(&self, request: WatchRequest) -> Result<WatchStream<V>> {
        let stream = self.store.watch(request).await?;
        // An event's conversion is kept with the event (in the store's bounded history), for
        // all its watchers; its objects as `keep` says.
        let keep = self.keep;
        Ok(stream
            .map(move |item| match item {
                WatchItem::Event(event) => {
                    WatchItem::Event(event.at_version(|object| view::<V, S>(keep, object)))
                }
                WatchItem::InitialEventsEnd(rv) => WatchItem::InitialEventsEnd(rv),
                WatchItem::Progress(rv) => WatchItem::Progress(rv),
                WatchItem::Error(error) => WatchItem::Error(error),
            })
            .boxed())
    }

    async fn stats(&self) -> Result<StoreStats> {
        self.store.stats().await
    }

    fn stats_sync(&self) -> Option<StoreStats> {
        self.store.stats_sync()
    }

    fn check_ready(&self) -> Result<()> {
        self.store.check_ready()
    }

    // No readiness checks of its own: the stored version's registration adds the store's.

    fn writable(&self) -> Option<&dyn WritableStore<V>> {
        self.store.writable().map(|_| self as &dyn WritableStore<V>)
    }
}

/// The stored version's own rules (`validate`, `validate_update`) on what a write of another
/// version stores, as kube-apiserver's strategy validates the internal version: an immutable
/// field, or a limit the other version cannot express, holds whatever the version written.
fn validate_stored<S: ServedResource>(stored: &S, current: Option<&S>) -> Result<()> {
    let mut causes = stored.validate();
    if let Some(current) = current {
        causes.extend(stored.validate_update(current));
    }
    if causes.is_empty() {
        return Ok(());
    }
    Err(crate::error::Error::Invalid {
        subject: S::invalid_subject(stored.meta().name.as_deref().unwrap_or("")),
        causes,
    })
}

impl<V: VersionOf<S>, S: ServedResource> Converted<V, S> {
    fn writer(&self) -> Result<&dyn WritableStore<S>> {
        self.store.writable().ok_or_else(|| {
            crate::error::Error::MethodNotAllowed(format!(
                "writes are not supported on resources of kind {:?}",
                V::qualified_resource()
            ))
        })
    }
}

#[async_trait]
impl<V: VersionOf<S>, S: ServedResource> WritableStore<V> for Converted<V, S> {
    async fn get_for_update(&self, key: &ObjectKey, from: UpdateFrom) -> Result<Object<V>> {
        Ok(self.view(&self.writer()?.get_for_update(key, from).await?))
    }

    fn updates_from_a_cache(&self) -> bool {
        self.store
            .writable()
            .is_some_and(|writer| writer.updates_from_a_cache())
    }

    async fn create(&self, object: V, dry_run: bool) -> Result<Object<V>> {
        let stored = object.to_stored(None);
        validate_stored(&stored, None)?;
        let created = self.writer()?.create(stored, dry_run).await?;
        Ok(self.view(&created))
    }

    /// The stored object it replaces keeps what `V` cannot express: read from the cache, or
    /// from the source when the cache's copy is not the one the update names (a stale copy
    /// would fail the compare-and-swap anyway, but must not lend its fields).
    async fn update(&self, object: V, dry_run: bool) -> Result<Object<V>> {
        let writer = self.writer()?;
        let key = ObjectKey::of(object.meta());
        let mut current = writer.get_for_update(&key, UpdateFrom::Cache).await?;
        if current.meta().resource_version != object.meta().resource_version {
            current = writer.get_for_update(&key, UpdateFrom::Source).await?;
        }
        let stored = object.to_stored(Some(current.get()));
        validate_stored(&stored, Some(current.get()))?;
        let updated = writer.update(stored, dry_run).await?;
        Ok(self.view(&updated))
    }

    async fn delete(
        &self,
        key: &ObjectKey,
        preconditions: &Preconditions,
        dry_run: bool,
    ) -> Result<Object<V>> {
        let deleted = self.writer()?.delete(key, preconditions, dry_run).await?;
        Ok(self.view(&deleted))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        store::{MemoryStore, memory::MemoryStoreConfig},
        testing::{self, v1, v1alpha},
    };

    async fn listed<V: ServedResource>(store: &dyn Store<V>) -> Vec<Object<V>> {
        let mut objects = Vec::new();
        store
            .list_each(&ListRequest::default(), &mut |o| objects.push(o.clone()))
            .await
            .unwrap();
        objects
    }

    #[tokio::test]
    async fn a_conversion_is_kept_with_the_object_or_made_per_read() {
        let memory = MemoryStore::<v1::Zebra>::new(MemoryStoreConfig::default());
        memory.insert(testing::synthetic(1)).unwrap();
        let stored: Arc<dyn Store<v1::Zebra>> = Arc::new(memory);
        let kept = Converted::<v1alpha::Zebra, v1::Zebra>::new(stored.clone());
        let per_read = Converted::<v1alpha::Zebra, v1::Zebra>::per_read(stored.clone());

        // Made per read: each list (and GET) converts anew, and the stored object keeps nothing,
        // so a later kept read still makes its own.
        let (a, b) = (listed(&per_read).await, listed(&per_read).await);
        assert!(!Arc::ptr_eq(&a[0], &b[0]));
        let got = per_read.get_sync("bench-1", "zebra-1").unwrap().unwrap();
        assert!(!Arc::ptr_eq(&got, &a[0]));
        assert_eq!(a[0].json(), b[0].json());
        assert!(
            a[0].json()
                .starts_with(br#"{"apiVersion":"zoo.example.com/v1alpha""#)
        );

        // Kept: the first read converts, every later one (list or GET) shares it.
        let (c, d) = (listed(&kept).await, listed(&kept).await);
        assert!(Arc::ptr_eq(&c[0], &d[0]));
        let got = kept.get_sync("bench-1", "zebra-1").unwrap().unwrap();
        assert!(Arc::ptr_eq(&got, &c[0]));
        assert_eq!(c[0].json(), a[0].json());
    }
}
