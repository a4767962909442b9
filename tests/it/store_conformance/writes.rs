//! The write checks every writable store passes: versions, compare-and-swap, preconditions,
//! dry runs, stats.

use super::*;

/// Create stores the object at a version above every earlier one; a taken key is 409
/// AlreadyExists and changes nothing.
pub(super) async fn create_assigns_versions<S: Store<Llama>>(make: impl AsyncFn() -> S) {
    let store = make().await;
    let writes = store.writable().expect("a writable store");
    let before = stats(&store).await;
    let x = writes
        .create(with_labels(llama("a", "x", 10.0), WEB), false)
        .await
        .expect("create");
    let rx = rv_of(x.get());
    assert!(rx > before.resource_version);
    assert_eq!(x.spec.weight, 10.0);
    assert_eq!(labels_of(x.get()), label_map(WEB));
    assert_eq!(x.metadata.uid.as_deref(), Some("uid-a-x"));
    let got = store.get(&ObjectKey::new("a", "x")).await.expect("get");
    assert_eq!(rv_of(got.get()), rx);
    assert_eq!(got.spec.weight, 10.0);
    assert_eq!(
        stats(&store).await,
        StoreStats {
            objects: before.objects + 1,
            resource_version: rx,
            ..Default::default()
        }
    );

    let y = writes
        .create(llama("a", "y", 11.0), false)
        .await
        .expect("create");
    let ry = rv_of(y.get());
    assert!(ry > rx);

    assert_err!(
        writes.create(llama("a", "x", 99.0), false).await,
        Error::AlreadyExists(_)
    );
    let got = store.get(&ObjectKey::new("a", "x")).await.expect("get");
    assert_eq!((rv_of(got.get()), got.spec.weight), (rx, 10.0));
    assert_eq!(
        stats(&store).await,
        StoreStats {
            objects: before.objects + 2,
            resource_version: ry,
            ..Default::default()
        }
    );
    // The same name in another namespace is another object.
    writes
        .create(llama("b", "x", 12.0), false)
        .await
        .expect("create b/x");
}

/// Update is compare-and-swap on resourceVersion: the current version succeeds and raises it,
/// a stale one is 409 Conflict and changes nothing; a missing object is NotFound.
pub(super) async fn update_compare_and_swap<S: Store<Llama>>(make: impl AsyncFn() -> S) {
    let store = make().await;
    let writes = store.writable().expect("a writable store");
    let x = writes
        .create(llama("a", "x", 10.0), false)
        .await
        .expect("create");
    let rx = rv_of(x.get());

    let mut next = x.get().clone();
    next.spec.weight = 20.0;
    let updated = writes
        .update(next, false)
        .await
        .expect("update at the current version");
    let ru = rv_of(updated.get());
    assert!(ru > rx);
    assert_eq!(updated.spec.weight, 20.0);
    let got = store.get(&ObjectKey::new("a", "x")).await.expect("get");
    assert_eq!((rv_of(got.get()), got.spec.weight), (ru, 20.0));
    assert_eq!(
        stats(&store).await,
        StoreStats {
            objects: 1,
            resource_version: ru,
            ..Default::default()
        }
    );

    let mut stale = x.get().clone();
    stale.spec.weight = 30.0;
    assert_err!(writes.update(stale, false).await, Error::Conflict { .. });
    let got = store.get(&ObjectKey::new("a", "x")).await.expect("get");
    assert_eq!((rv_of(got.get()), got.spec.weight), (ru, 20.0));
    assert_eq!(stats(&store).await.resource_version, ru);

    let mut missing = llama("a", "missing", 1.0);
    missing.metadata.resource_version = Some(ru.to_string());
    assert_err!(writes.update(missing, false).await, Error::NotFound(_));

    // The updated object is the base of the next update.
    let mut again = updated.get().clone();
    again.spec.weight = 21.0;
    let r2 = rv_of(
        writes
            .update(again, false)
            .await
            .expect("second update")
            .get(),
    );
    assert!(r2 > ru);
}

/// Delete honours its preconditions (uid, resourceVersion: 409 Conflict when they do not
/// hold), removes the object at a new version, and a missing object is NotFound.
pub(super) async fn delete_preconditions<S: Store<Llama>>(make: impl AsyncFn() -> S) {
    let store = make().await;
    let writes = store.writable().expect("a writable store");
    let x = writes
        .create(llama("a", "x", 10.0), false)
        .await
        .expect("create");
    let rx = rv_of(x.get());
    let key = ObjectKey::new("a", "x");
    let before = stats(&store).await;

    let wrong_uid = Preconditions {
        uid: Some("someone-else".into()),
        resource_version: None,
    };
    assert_err!(
        writes.delete(&key, &wrong_uid, false).await,
        Error::Conflict { .. }
    );
    let wrong_rv = Preconditions {
        uid: None,
        resource_version: Some((rx - 1).to_string()),
    };
    assert_err!(
        writes.delete(&key, &wrong_rv, false).await,
        Error::Conflict { .. }
    );
    let right_uid_wrong_rv = Preconditions {
        uid: Some("uid-a-x".into()),
        resource_version: Some("1".into()),
    };
    assert_err!(
        writes.delete(&key, &right_uid_wrong_rv, false).await,
        Error::Conflict { .. }
    );
    assert_eq!(rv_of(store.get(&key).await.expect("still there").get()), rx);
    assert_eq!(stats(&store).await, before);

    let matching = Preconditions {
        uid: Some("uid-a-x".into()),
        resource_version: Some(rx.to_string()),
    };
    let deleted = writes.delete(&key, &matching, false).await.expect("delete");
    let rd = rv_of(deleted.get());
    assert!(rd > rx);
    assert_eq!(key_of(deleted.get()), key);
    assert_err!(store.get(&key).await, Error::NotFound(_));
    assert_eq!(
        stats(&store).await,
        StoreStats {
            objects: before.objects - 1,
            resource_version: rd,
            ..Default::default()
        }
    );

    assert_err!(
        writes.delete(&key, &Preconditions::default(), false).await,
        Error::NotFound(_)
    );
    assert_err!(
        writes
            .delete(
                &ObjectKey::new("a", "never"),
                &Preconditions::default(),
                false
            )
            .await,
        Error::NotFound(_)
    );
    assert_eq!(stats(&store).await.resource_version, rd);
}

/// Dry runs check what the real write would (AlreadyExists, Conflict, NotFound) and change
/// nothing: no object, no version, no watch event.
pub(super) async fn dry_runs_change_nothing<S: Store<Llama>>(make: impl AsyncFn() -> S) {
    let store = make().await;
    let writes = store.writable().expect("a writable store");
    let x = writes
        .create(llama("a", "x", 10.0), false)
        .await
        .expect("create");
    let rx = rv_of(x.get());
    let key = ObjectKey::new("a", "x");
    let before = stats(&store).await;
    let mut events = watch(
        &store,
        watch_request(WatchStart::After(before.resource_version)),
    )
    .await;

    let dry = writes
        .create(llama("a", "y", 1.0), true)
        .await
        .expect("dry create");
    assert_eq!(key_of(dry.get()), ObjectKey::new("a", "y"));
    assert_err!(
        store.get(&ObjectKey::new("a", "y")).await,
        Error::NotFound(_)
    );
    assert_err!(
        writes.create(llama("a", "x", 1.0), true).await,
        Error::AlreadyExists(_)
    );

    let mut next = x.get().clone();
    next.spec.weight = 99.0;
    writes.update(next, true).await.expect("dry update");
    let mut stale = x.get().clone();
    stale.metadata.resource_version = Some((rx - 1).to_string());
    assert_err!(writes.update(stale, true).await, Error::Conflict { .. });

    let wrong_uid = Preconditions {
        uid: Some("someone-else".into()),
        resource_version: None,
    };
    assert_err!(
        writes.delete(&key, &wrong_uid, true).await,
        Error::Conflict { .. }
    );
    writes
        .delete(&key, &Preconditions::default(), true)
        .await
        .expect("dry delete");
    assert_err!(
        writes
            .delete(&ObjectKey::new("a", "y"), &Preconditions::default(), true)
            .await,
        Error::NotFound(_)
    );

    let got = store.get(&key).await.expect("x survives a dry delete");
    assert_eq!((rv_of(got.get()), got.spec.weight), (rx, 10.0));
    assert_eq!(stats(&store).await, before);
    assert_eq!(list(&store, &ListRequest::default()).await.items.len(), 1);

    // The first event the watch gets is the next real write's.
    let z = writes
        .create(llama("a", "z", 1.0), false)
        .await
        .expect("create");
    assert_eq!(
        next_events(&mut events, 1).await,
        [(EventType::Added, ObjectKey::new("a", "z"), rv_of(z.get()))]
    );
}

/// The store's revision is its last write's version and its count follows creates and deletes.
pub(super) async fn stats_follow_writes<S: Store<Llama>>(make: impl AsyncFn() -> S) {
    let store = make().await;
    let writes = store.writable().expect("a writable store");
    let start = stats(&store).await;
    let mut last = start.resource_version;
    let mut objects = start.objects;
    for name in ["a", "b", "c"] {
        let created = writes
            .create(llama("n", name, 5.0), false)
            .await
            .expect("create");
        objects += 1;
        assert!(rv_of(created.get()) > last);
        last = rv_of(created.get());
        assert_eq!(
            stats(&store).await,
            StoreStats {
                objects,
                resource_version: last,
                ..Default::default()
            }
        );
    }
    let current = store.get(&ObjectKey::new("n", "b")).await.expect("get");
    let mut next = current.get().clone();
    next.spec.weight = 6.0;
    last = rv_of(writes.update(next, false).await.expect("update").get());
    assert_eq!(
        stats(&store).await,
        StoreStats {
            objects,
            resource_version: last,
            ..Default::default()
        }
    );
    let deleted = writes
        .delete(&ObjectKey::new("n", "a"), &Preconditions::default(), false)
        .await
        .expect("delete");
    objects -= 1;
    last = rv_of(deleted.get());
    assert_eq!(
        stats(&store).await,
        StoreStats {
            objects,
            resource_version: last,
            ..Default::default()
        }
    );
    let page = list(&store, &ListRequest::default()).await;
    assert_eq!(
        (page.items.len(), page.info.resource_version),
        (objects, last)
    );
}

pub(super) async fn memory_store() -> MemoryStore<Llama> {
    MemoryStore::new(MemoryStoreConfig::default())
}

/// A memory store keeping only `window` events.
pub(super) fn small_window(window: usize) -> MemoryStoreConfig {
    MemoryStoreConfig {
        event_window: window,
        ..Default::default()
    }
}
