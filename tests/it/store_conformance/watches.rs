//! The watch checks every store passes: resuming, initial state, scoping, selection
//! transitions, the event window, lagging watchers.

use super::*;

/// A watch from a version gets exactly the changes after it, in order, each with its version.
pub(super) async fn watch_after_resumes<H: Harness>(make: impl AsyncFn(&[Seed]) -> H) {
    let h = make(&fixture()).await;
    let store = h.store();
    let rv0 = stats(store).await.resource_version;
    let x = h.key("a", "x");
    let r1 = h.put("a", "x", WEB).await;
    let r2 = h.put("a", "x", DB).await;
    let r3 = h.remove("a", "x").await;
    let r4 = h.put("b", "o1", WEB).await;
    assert!(rv0 < r1 && r1 < r2 && r2 < r3 && r3 < r4);
    let b1 = h.key("b", "o1");

    let mut all = watch(store, watch_request(WatchStart::After(rv0))).await;
    assert_eq!(
        next_events(&mut all, 4).await,
        [
            (EventType::Added, x.clone(), r1),
            (EventType::Modified, x.clone(), r2),
            (EventType::Deleted, x.clone(), r3),
            (EventType::Modified, b1.clone(), r4),
        ]
    );
    assert_quiet(&mut all).await;

    let mut later = watch(store, watch_request(WatchStart::After(r2))).await;
    assert_eq!(
        next_events(&mut later, 2).await,
        [
            (EventType::Deleted, x.clone(), r3),
            (EventType::Modified, b1, r4)
        ]
    );
    assert_quiet(&mut later).await;

    // From the newest version: nothing until the next change, which comes live.
    let mut live = watch(store, watch_request(WatchStart::After(r4))).await;
    assert_quiet(&mut live).await;
    let r5 = h.put("a", "x", WEB).await;
    assert_eq!(
        next_events(&mut live, 1).await,
        [(EventType::Added, x.clone(), r5)]
    );
    // The watches opened earlier get it too.
    assert_eq!(next_events(&mut all, 1).await, [(EventType::Added, x, r5)]);
}

/// A watch of the initial state sends ADDED for each current object, then the end of the
/// initial events at the store's version, then live changes.
pub(super) async fn watch_initial_state<H: Harness>(make: impl AsyncFn(&[Seed]) -> H) {
    let seeds = fixture();
    let h = make(&seeds).await;
    let store = h.store();
    let current = stats(store).await.resource_version;
    let listed = list(store, &ListRequest::default()).await;

    let mut watch_all = watch(store, watch_request(WatchStart::InitialState)).await;
    let mut initial = next_events(&mut watch_all, seeds.len()).await;
    initial.sort_by(|a, b| a.1.cmp(&b.1));
    let expected: Vec<Seen> = listed
        .items
        .iter()
        .map(|o| (EventType::Added, key_of(o.get()), rv_of(o.get())))
        .collect();
    assert_eq!(initial, expected);
    match next_item(&mut watch_all).await {
        Some(WatchItem::InitialEventsEnd(rv)) => assert_eq!(rv, current),
        other => panic!("expected the end of the initial events, got {other:?}"),
    }
    assert_quiet(&mut watch_all).await;

    let mut scoped = watch(
        store,
        WatchRequest {
            namespace: Some("b".into()),
            filter: labelled("app=web"),
            start: WatchStart::InitialState,
        },
    )
    .await;
    let mut initial = next_events(&mut scoped, 2).await;
    initial.sort_by(|a, b| a.1.cmp(&b.1));
    assert_eq!(
        initial.iter().map(|s| s.1.clone()).collect::<Vec<_>>(),
        [h.key("b", "o0"), h.key("b", "o2")]
    );
    match next_item(&mut scoped).await {
        Some(WatchItem::InitialEventsEnd(rv)) => assert_eq!(rv, current),
        other => panic!("expected the end of the initial events, got {other:?}"),
    }

    let r = h.put("b", "new", WEB).await;
    let new = h.key("b", "new");
    assert_eq!(
        next_events(&mut watch_all, 1).await,
        [(EventType::Added, new.clone(), r)]
    );
    assert_eq!(
        next_events(&mut scoped, 1).await,
        [(EventType::Added, new, r)]
    );
}

/// A watch sees the changes in its namespace that its selectors select, and no others.
pub(super) async fn watch_scoped<H: Harness>(make: impl AsyncFn(&[Seed]) -> H) {
    let h = make(&fixture()).await;
    let store = h.store();
    let rv0 = stats(store).await.resource_version;
    let mut in_b = watch(
        store,
        WatchRequest {
            namespace: Some("b".into()),
            filter: Filter::default(),
            start: WatchStart::After(rv0),
        },
    )
    .await;
    let mut web = watch(
        store,
        WatchRequest {
            namespace: None,
            filter: labelled("app=web"),
            start: WatchStart::After(rv0),
        },
    )
    .await;
    let r1 = h.put("a", "x", WEB).await;
    let r2 = h.put("b", "y", DB).await;
    h.remove("a", "o1").await;
    let r4 = h.remove("b", "o3").await;
    let r5 = h.put("b", "z", WEB).await;

    assert_eq!(
        events_until_quiet(&mut in_b).await,
        [
            (EventType::Added, h.key("b", "y"), r2),
            (EventType::Deleted, h.key("b", "o3"), r4),
            (EventType::Added, h.key("b", "z"), r5),
        ]
    );
    assert_eq!(
        events_until_quiet(&mut web).await,
        [
            (EventType::Added, h.key("a", "x"), r1),
            (EventType::Added, h.key("b", "z"), r5),
        ]
    );
}

/// As kube-apiserver does for a watch with a selector: an object that comes to match it is
/// ADDED, one that stays matched is MODIFIED, one that stops matching is DELETED (the watcher
/// would otherwise keep it forever), and changes of objects it never matched are not sent.
pub(super) async fn watch_selection_transitions<H: Harness>(make: impl AsyncFn(&[Seed]) -> H) {
    let h = make(&fixture()).await;
    let store = h.store();
    let rv0 = stats(store).await.resource_version;
    let mut web = watch(
        store,
        WatchRequest {
            namespace: None,
            filter: labelled("app=web"),
            start: WatchStart::After(rv0),
        },
    )
    .await;
    let x = h.key("a", "x");
    h.put("a", "x", DB).await;
    let enters = h.put("a", "x", WEB).await;
    let stays = h.put("a", "x", WEB_FRONT).await;
    let leaves = h.put("a", "x", DB).await;
    h.remove("a", "x").await;
    assert_eq!(
        events_until_quiet(&mut web).await,
        [
            (EventType::Added, x.clone(), enters),
            (EventType::Modified, x.clone(), stays),
            (EventType::Deleted, x, leaves),
        ]
    );
}

/// With `window` events kept, a watch from before them is 410 Expired (and ends); one from
/// the version just before the oldest kept event resumes with exactly the kept events.
pub(super) async fn watch_before_window_expired<H: Harness>(
    make: impl AsyncFn(&[Seed]) -> H,
    window: usize,
) {
    let h = make(&[]).await;
    let store = h.store();
    let start = stats(store).await.resource_version;
    let mut rvs = Vec::new();
    for i in 0..window + 4 {
        rvs.push(h.put("a", &format!("w{i}"), WEB).await);
    }
    for old in [start, rvs[0], rvs[rvs.len() - window - 2]] {
        let mut expired = watch(store, watch_request(WatchStart::After(old))).await;
        match next_item(&mut expired).await {
            Some(WatchItem::Error(Error::Expired(_))) => {}
            other => {
                panic!("a watch from {old} (before the window): expected Expired, got {other:?}")
            }
        }
        assert!(
            next_item(&mut expired).await.is_none(),
            "the watch ends after its error"
        );
    }
    let from = rvs[rvs.len() - window - 1];
    let mut resumed = watch(store, watch_request(WatchStart::After(from))).await;
    let got: Vec<u64> = next_events(&mut resumed, window)
        .await
        .into_iter()
        .map(|s| s.2)
        .collect();
    assert_eq!(got, rvs[rvs.len() - window..]);
    assert_quiet(&mut resumed).await;
}

/// A watcher that falls more than `buffer` events behind is ended, as kube-apiserver's cacher
/// ends it: its stream ends (no error), what it got before is in order and without a gap, it is
/// counted, a watcher keeping up meanwhile is not disturbed, and resuming from the last version
/// it saw gets the rest.
pub(super) async fn lagging_watcher_ended<H: Harness>(
    make: impl AsyncFn(&[Seed]) -> H,
    buffer: usize,
) {
    let h = make(&fixture()).await;
    let store = h.store();
    let rv0 = stats(store).await.resource_version;
    let mut slow = watch(store, watch_request(WatchStart::After(rv0))).await;
    let mut keeping_up = watch(store, watch_request(WatchStart::After(rv0))).await;
    let mut rvs = Vec::new();
    let mut kept_up = Vec::new();
    // The slow watcher reads nothing while the events are written; the other reads each.
    for i in 0..buffer * 4 {
        rvs.push(h.put("a", &format!("lag{}", i % 8), WEB).await);
        match next_item(&mut keeping_up).await {
            Some(WatchItem::Event(event)) => kept_up.push(event.resource_version),
            other => panic!("a watcher keeping up got {other:?}"),
        }
    }
    assert_eq!(kept_up, rvs, "a watcher keeping up sees every event");
    let mut got = Vec::new();
    while let Some(item) = next_item(&mut slow).await {
        match item {
            WatchItem::Event(event) => got.push(event.resource_version),
            other => panic!(
                "after {} of {} events: expected more or the end, got {other:?}",
                got.len(),
                rvs.len()
            ),
        }
    }
    assert!(
        got.len() < rvs.len(),
        "a watcher {} events behind was not ended (buffer {buffer})",
        rvs.len()
    );
    assert_eq!(
        got,
        rvs[..got.len()],
        "the events before the end are in order, no gap"
    );
    assert_eq!(
        store.stats().await.expect("stats").terminated_watchers,
        1,
        "the ended watcher is counted, the one keeping up is not"
    );
    // As client-go does: resume from the last version seen; the history still holds the rest.
    let last = got.last().copied().unwrap_or(rv0);
    let mut resumed = watch(store, watch_request(WatchStart::After(last))).await;
    let mut rest = Vec::new();
    while rest.len() < rvs.len() - got.len() {
        match next_item(&mut resumed).await {
            Some(WatchItem::Event(event)) => rest.push(event.resource_version),
            other => panic!("a resumed watch got {other:?}"),
        }
    }
    assert_eq!(rest, rvs[got.len()..], "resumed where it was ended, no gap");
}
