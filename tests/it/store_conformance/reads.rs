//! The read checks every store passes: get, stats, pages and continue tokens, selectors,
//! namespaces, reads at a version, cursors.

use super::*;

/// Get returns each stored object under its key; a missing key, or a name in another
/// namespace, is NotFound; the sync path agrees with the async one.
pub(super) async fn get_and_missing<H: Harness>(make: impl AsyncFn(&[Seed]) -> H) {
    let seeds = fixture();
    let h = make(&seeds).await;
    let store = h.store();
    let current = stats(store).await.resource_version;
    for seed in &seeds {
        let key = h.key(seed.ns, seed.name);
        let object = store
            .get(&key)
            .await
            .unwrap_or_else(|e| panic!("get {key:?}: {e}"));
        assert_eq!(key_of(object.get()), key);
        assert_eq!(labels_of(object.get()), label_map(seed.labels));
        assert!(
            rv_of(object.get()) <= current,
            "{key:?} is newer than the store"
        );
        if let Some(sync) = store.get_sync(&key.namespace, &key.name) {
            let sync = sync.unwrap_or_else(|e| panic!("get_sync {key:?}: {e}"));
            assert_eq!(rv_of(sync.get()), rv_of(object.get()));
        }
    }
    for (ns, name) in [("a", "missing"), ("zz", "o0"), ("", "o0")] {
        let key = h.key(ns, name);
        assert_err!(store.get(&key).await, Error::NotFound(_));
        if let Some(sync) = store.get_sync(&key.namespace, &key.name) {
            assert_err!(sync, Error::NotFound(_));
        }
    }
}

/// Stats count the objects and name the revision lists are at; they follow every change.
pub(super) async fn stats_agree<H: Harness>(make: impl AsyncFn(&[Seed]) -> H) {
    let h = make(&fixture()).await;
    let store = h.store();
    let before = stats(store).await;
    assert_eq!(before.objects, 12);
    assert_eq!(
        list(store, &ListRequest::default())
            .await
            .info
            .resource_version,
        before.resource_version
    );
    for (ns, count) in [(None, 12), (Some("b"), 4), (Some("zz"), 0)] {
        if let Some(n) = store.count_sync(ns) {
            assert_eq!(n, count, "count_sync({ns:?})");
        }
    }

    let added = h.put("b", "new", WEB).await;
    assert!(added > before.resource_version);
    assert_eq!(
        stats(store).await,
        StoreStats {
            objects: 13,
            resource_version: added,
            ..Default::default()
        }
    );
    let modified = h.put("b", "new", DB).await;
    assert!(modified > added);
    assert_eq!(
        stats(store).await,
        StoreStats {
            objects: 13,
            resource_version: modified,
            ..Default::default()
        }
    );
    let deleted = h.remove("a", "o1").await;
    assert!(deleted > modified);
    assert_eq!(
        stats(store).await,
        StoreStats {
            objects: 12,
            resource_version: deleted,
            ..Default::default()
        }
    );
    assert_eq!(
        list(store, &ListRequest::default())
            .await
            .info
            .resource_version,
        deleted
    );
    if let Some(n) = store.count_sync(Some("a")) {
        assert_eq!(n, 3);
    }
}

/// Paged lists go in key order, every page at the first page's version, each object exactly
/// once, with remainingItemCount counting what is still to come.
pub(super) async fn pages_and_continue<H: Harness>(make: impl AsyncFn(&[Seed]) -> H) {
    let seeds = fixture();
    let h = make(&seeds).await;
    let store = h.store();
    let full = list(store, &ListRequest::default()).await;
    let mut expected: Vec<ObjectKey> = seeds.iter().map(|s| h.key(s.ns, s.name)).collect();
    expected.sort();
    assert_eq!(
        keys(&full.items),
        expected,
        "an unlimited list is in key order"
    );
    assert_eq!(full.info.continue_token, None);
    assert_eq!(full.info.remaining_item_count, None);

    for limit in [1, 5, 11, 12, 13] {
        let pages = page_through(store, &limited(limit)).await;
        check_pages(&pages, limit, Some(12));
        assert_eq!(pages[0].info.resource_version, full.info.resource_version);
        assert_eq!(
            keys(&all_items(&pages)),
            expected,
            "pages of {limit}: every object once, in key order"
        );
        assert_eq!(pages.len(), 12usize.div_ceil(limit), "pages of {limit}");
    }
    // A limit of 0 is no limit.
    let zero = list(store, &limited(0)).await;
    assert_eq!(keys(&zero.items), expected);
    assert_eq!(zero.info.continue_token, None);
}

/// Paging with label and field selectors: only matching objects, in order, once each, and no
/// remainingItemCount (kube-apiserver cannot know it with a selector either).
pub(super) async fn pages_with_selectors<H: Harness>(make: impl AsyncFn(&[Seed]) -> H) {
    let seeds = fixture();
    let h = make(&seeds).await;
    let store = h.store();
    let expect = |wanted: &dyn Fn(&Seed) -> bool| {
        let mut keys: Vec<ObjectKey> = seeds
            .iter()
            .filter(|s| wanted(s))
            .map(|s| h.key(s.ns, s.name))
            .collect();
        keys.sort();
        keys
    };
    let cases: [(Filter, Vec<ObjectKey>); 3] = [
        (
            labelled("app=web"),
            expect(&|s| s.labels.contains(&("app", "web"))),
        ),
        (
            labelled("app!=web"),
            expect(&|s| !s.labels.contains(&("app", "web"))),
        ),
        (by_fields("metadata.namespace!=a"), expect(&|s| s.ns != "a")),
    ];
    for (filter, wanted) in cases {
        for limit in [1, 2, 5] {
            let request = ListRequest {
                filter: filter.clone(),
                limit: Some(limit),
                ..Default::default()
            };
            let pages = page_through(store, &request).await;
            check_pages(&pages, limit, None);
            assert_eq!(
                keys(&all_items(&pages)),
                wanted,
                "{filter:?} in pages of {limit}"
            );
        }
    }
}

/// A change between pages does not show in later pages: they keep the first page's state, and
/// that state stays readable at its version (`ReadAt::Exact`) after the change.
pub(super) async fn writes_between_pages<H: Harness>(make: impl AsyncFn(&[Seed]) -> H) {
    let seeds = fixture();
    let h = make(&seeds).await;
    let store = h.store();
    let before = list(store, &ListRequest::default()).await;
    let first = list(store, &limited(5)).await;
    let rv0 = first.info.resource_version;
    assert_eq!(rv0, before.info.resource_version);
    assert_eq!(
        keys(&first.items),
        [
            h.key("a", "o0"),
            h.key("a", "o1"),
            h.key("a", "o2"),
            h.key("a", "o3"),
            h.key("b", "o0")
        ]
    );
    let token = first.info.continue_token.clone().expect("a continue token");

    // Changes after the first page: in the part still to come and in the part already served.
    h.put("c", "o9", WEB).await;
    h.put("b", "o2", DB).await;
    h.remove("c", "o1").await;
    h.put("a", "o5", WEB).await;
    let last = h.remove("a", "o1").await;

    let rest = page_through(
        store,
        &ListRequest {
            limit: Some(5),
            continue_token: Some(token),
            ..Default::default()
        },
    )
    .await;
    let mut pages = vec![first];
    pages.extend(rest);
    check_pages(&pages, 5, Some(12));
    assert_eq!(
        contents(&all_items(&pages)),
        contents(&before.items),
        "the later pages show the state of the first"
    );

    // The new state, at the last change.
    let now = list(store, &ListRequest::default()).await;
    assert_eq!(now.info.resource_version, last);
    let mut expected: Vec<ObjectKey> = seeds
        .iter()
        .map(|s| h.key(s.ns, s.name))
        .filter(|k| *k != h.key("c", "o1") && *k != h.key("a", "o1"))
        .chain([h.key("c", "o9"), h.key("a", "o5")])
        .collect();
    expected.sort();
    assert_eq!(keys(&now.items), expected);
    let b2 = now
        .items
        .iter()
        .find(|o| key_of(o.get()) == h.key("b", "o2"))
        .expect("b/o2");
    assert_eq!(labels_of(b2.get()), label_map(DB));

    // The first page's state is still there at its version.
    let exact = store
        .list(&ListRequest {
            read_at: ReadAt::Exact(rv0),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("a list at {rv0}, the version a served page showed: {e}"));
    assert_eq!(exact.info.resource_version, rv0);
    assert_eq!(contents(&exact.items), contents(&before.items));
}

/// A continue token that is not one is 400 Bad Request.
pub(super) async fn malformed_continue<H: Harness>(make: impl AsyncFn(&[Seed]) -> H) {
    let h = make(&fixture()).await;
    // Not base64; base64 of `{}`; base64 of `not json`; an empty token.
    for token in ["!!not a token!!", "e30", "bm90IGpzb24", ""] {
        let request = ListRequest {
            limit: Some(2),
            continue_token: Some(token.into()),
            ..Default::default()
        };
        match h.store().list(&request).await {
            Err(Error::BadRequest(_)) => {}
            other => panic!(
                "continue {token:?}: expected BadRequest, got {:?}",
                other.map(|p| keys(&p.items))
            ),
        }
    }
}

/// A continue token whose snapshot the store no longer keeps is 410 Expired (never a page of
/// some other state). `kept` is how many list snapshots the store keeps.
pub(super) async fn continue_after_snapshot_gone<H: Harness>(
    make: impl AsyncFn(&[Seed]) -> H,
    kept: usize,
) {
    let h = make(&fixture()).await;
    let store = h.store();
    let first = list(store, &limited(2)).await;
    let old = first.info.continue_token.expect("a continue token");
    let mut latest = None;
    for i in 0..kept {
        h.put("z", &format!("s{i}"), WEB).await;
        let page = list(store, &limited(2)).await;
        latest = Some(page.info.continue_token.expect("a continue token"));
    }
    let continued = store
        .list(&ListRequest {
            limit: Some(2),
            continue_token: latest,
            ..Default::default()
        })
        .await;
    assert!(
        continued.is_ok(),
        "the newest token still works: {:?}",
        continued.err()
    );
    assert_err!(
        store
            .list(&ListRequest {
                limit: Some(2),
                continue_token: Some(old),
                ..Default::default()
            })
            .await,
        Error::Expired(_),
    );
}

/// What each `ReadAt` gives: the latest state, a state not older than asked, exactly the state
/// asked (or 410 when it is gone), and "Too large resource version" for one not reached.
pub(super) async fn read_at_versions<H: Harness>(make: impl AsyncFn(&[Seed]) -> H) {
    let h = make(&fixture()).await;
    let store = h.store();
    let r1 = h.put("a", "x1", WEB).await;
    let r2 = h.put("a", "x2", WEB).await;
    assert!(r2 > r1);
    let at = |read_at| ListRequest {
        read_at,
        ..Default::default()
    };

    let latest = list(store, &at(ReadAt::Latest)).await;
    assert_eq!(latest.info.resource_version, r2);
    assert_eq!(latest.items.len(), 14);
    let any = list(store, &at(ReadAt::Any)).await;
    assert!(any.info.resource_version <= r2);
    for floor in [r1, r2] {
        let page = list(store, &at(ReadAt::NotOlderThan(floor))).await;
        assert!(page.info.resource_version >= floor);
    }
    let exact = list(store, &at(ReadAt::Exact(r2))).await;
    assert_eq!(exact.info.resource_version, r2);
    assert_eq!(contents(&exact.items), contents(&latest.items));

    // An older version: exactly that state, or 410 when the store has no longer got it.
    match store.list(&at(ReadAt::Exact(r1))).await {
        Ok(page) => {
            assert_eq!(page.info.resource_version, r1);
            let keys = keys(&page.items);
            assert!(keys.contains(&h.key("a", "x1")));
            assert!(
                !keys.contains(&h.key("a", "x2")),
                "a list at {r1} shows a later change"
            );
        }
        Err(Error::Expired(_)) => {}
        Err(e) => panic!("a list at the older version {r1}: {e}"),
    }

    for future in [r2 + 1, r2 + 1000] {
        assert_err!(
            store.list(&at(ReadAt::NotOlderThan(future))).await,
            Error::TooLargeResourceVersion(_),
        );
        assert_err!(
            store.list(&at(ReadAt::Exact(future))).await,
            Error::TooLargeResourceVersion(_),
        );
    }
}

/// Label and field selectors select what they say, with and without a namespace.
pub(super) async fn selectors<H: Harness>(make: impl AsyncFn(&[Seed]) -> H) {
    let seeds = fixture();
    let h = make(&seeds).await;
    let store = h.store();
    let o2 = h.key("a", "o2").name;
    fn has(s: &Seed, pair: (&str, &str)) -> bool {
        s.labels.contains(&pair)
    }
    fn has_key(s: &Seed, key: &str) -> bool {
        s.labels.iter().any(|(k, _)| *k == key)
    }
    type Wanted = fn(&Seed) -> bool;
    let cases: Vec<(Option<&str>, Filter, Wanted)> = vec![
        (None, labelled("app=web"), |s| has(s, ("app", "web"))),
        (None, labelled("app==db"), |s| has(s, ("app", "db"))),
        (None, labelled("app!=web"), |s| !has(s, ("app", "web"))),
        (None, labelled("app in (web,db)"), |_| true),
        (None, labelled("app notin (web)"), |s| {
            !has(s, ("app", "web"))
        }),
        (None, labelled("tier"), |s| has_key(s, "tier")),
        (None, labelled("!tier"), |s| !has_key(s, "tier")),
        (None, labelled("app=web,tier=front"), |s| {
            has(s, ("app", "web")) && has(s, ("tier", "front"))
        }),
        (None, labelled("app=nope"), |_| false),
        (Some("b"), labelled("app=db"), |s| {
            s.ns == "b" && has(s, ("app", "db"))
        }),
        (None, by_fields(&format!("metadata.name={o2}")), |s| {
            s.name == "o2"
        }),
        (Some("b"), by_fields(&format!("metadata.name={o2}")), |s| {
            s.ns == "b" && s.name == "o2"
        }),
        (Some("b"), by_fields("metadata.name=nope"), |_| false),
        (None, by_fields("metadata.namespace!=a"), |s| s.ns != "a"),
        (
            None,
            Filter {
                labels: LabelSelector::parse("app=web").expect("selector"),
                fields: FieldSelector::parse("metadata.namespace=c").expect("selector"),
            },
            |s| s.ns == "c" && has(s, ("app", "web")),
        ),
    ];
    for (namespace, filter, wanted) in cases {
        let mut expected: Vec<ObjectKey> = seeds
            .iter()
            .filter(|s| wanted(s))
            .map(|s| h.key(s.ns, s.name))
            .collect();
        expected.sort();
        let request = ListRequest {
            namespace: namespace.map(str::to_owned),
            filter: filter.clone(),
            ..Default::default()
        };
        let page = list(store, &request).await;
        assert_eq!(keys(&page.items), expected, "{namespace:?} {filter:?}");
        assert_eq!(page.info.continue_token, None);
    }
}

/// A namespace's list shows that namespace only (not one its name is a prefix of), pages
/// within it, and counts what remains of it.
pub(super) async fn namespace_scoping<H: Harness>(make: impl AsyncFn(&[Seed]) -> H) {
    let h = make(&fixture()).await;
    let store = h.store();
    h.put("ab", "o0", WEB).await;
    h.put("aa", "o9", WEB).await;
    let in_ns = |ns: &str| ListRequest {
        namespace: Some(ns.into()),
        ..Default::default()
    };
    let a = list(store, &in_ns("a")).await;
    assert_eq!(
        keys(&a.items),
        ["o0", "o1", "o2", "o3"].map(|n| h.key("a", n))
    );
    assert_eq!(
        keys(&list(store, &in_ns("ab")).await.items),
        [h.key("ab", "o0")]
    );
    let none = list(store, &in_ns("zz")).await;
    assert!(none.items.is_empty());
    assert_eq!(
        none.info.resource_version,
        stats(store).await.resource_version
    );

    let pages = page_through(
        store,
        &ListRequest {
            limit: Some(3),
            ..in_ns("a")
        },
    )
    .await;
    check_pages(&pages, 3, Some(4));
    assert_eq!(keys(&all_items(&pages)), keys(&a.items));
    assert_err!(store.get(&h.key("ab", "o1")).await, Error::NotFound(_));
}

/// An unlimited list read as a cursor lends what `list` returns, in order, from the snapshot it
/// started on (a change after it opened does not show). `streams`: the store offers cursors.
pub(super) async fn cursor_agrees_with_list<H: Harness>(
    make: impl AsyncFn(&[Seed]) -> H,
    streams: bool,
) {
    let h = make(&fixture()).await;
    let store = h.store();
    let requests = [
        ListRequest::default(),
        ListRequest {
            namespace: Some("b".into()),
            filter: labelled("app=web"),
            ..Default::default()
        },
    ];
    for request in requests {
        let expected = list(store, &request).await;
        let cursor = store
            .list_cursor(&request)
            .await
            .unwrap_or_else(|e| panic!("list_cursor {request:?}: {e}"));
        let Some(cursor) = cursor else {
            assert!(!streams, "the store offers no cursor for {request:?}");
            continue;
        };
        h.put("b", &format!("late{}", expected.items.len()), WEB)
            .await;
        let (info, objects) = drain(cursor, 2).await;
        assert_eq!(info.resource_version, expected.info.resource_version);
        assert_eq!(info.continue_token, None);
        assert_eq!(contents(&objects), contents(&expected.items), "{request:?}");
    }
    // A page is never a cursor: the REST layer streams whatever cursor it gets, whole.
    assert!(
        store
            .list_cursor(&limited(2))
            .await
            .expect("list_cursor")
            .is_none()
    );
}
