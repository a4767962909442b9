//! The checks run on the memory store (Llamas) and on the FarmPod view, with what only they do.

use super::*;

conformance!(memory: run, memory, [
    get_and_missing,
    stats_agree,
    pages_and_continue,
    pages_with_selectors,
    writes_between_pages,
    malformed_continue,
    read_at_versions,
    selectors,
    namespace_scoping,
    watch_after_resumes,
    watch_initial_state,
    watch_scoped,
    watch_selection_transitions,
]);

conformance!(memory_writes: run, memory_store, [
    create_assigns_versions,
    update_compare_and_swap,
    delete_preconditions,
    dry_runs_change_nothing,
    stats_follow_writes,
]);

#[tokio::test]
async fn memory_continue_after_snapshot_gone() {
    let kept = 2;
    let make = async |seeds: &[Seed]| {
        memory_with(
            MemoryStoreConfig {
                max_snapshots: kept,
                ..Default::default()
            },
            seeds,
        )
        .await
    };
    run(continue_after_snapshot_gone(make, kept)).await;
}

#[tokio::test]
async fn memory_cursor_agrees_with_list() {
    run(cursor_agrees_with_list(memory, true)).await;
}

#[tokio::test]
async fn memory_watch_before_window_expired() {
    let window = 3;
    let make = async |seeds: &[Seed]| memory_with(small_window(window), seeds).await;
    run(watch_before_window_expired(make, window)).await;
}

#[tokio::test]
async fn memory_lagging_watcher_ended() {
    let buffer = 16;
    let make = async |seeds: &[Seed]| {
        memory_with(
            MemoryStoreConfig {
                watch_buffer: buffer,
                ..Default::default()
            },
            seeds,
        )
        .await
    };
    run(lagging_watcher_ended(make, buffer)).await;
}

/// A relist's changes share one resourceVersion. A watcher ended between two of them would miss
/// the rest if it resumed from that version, so it is told 410 Expired (and relists) instead of
/// a clean end.
#[tokio::test]
async fn memory_watcher_ended_inside_a_relist_is_told_to_relist() {
    let store = MemoryStore::<Llama>::new(MemoryStoreConfig {
        watch_buffer: 16,
        first_resource_version: 0,
        authoritative: false,
        ..Default::default()
    });
    let at = |mut llama: Llama, rv: u64| {
        llama.metadata.resource_version = Some(rv.to_string());
        llama
    };
    let seed = at(llama("a", "seed", 1.0), 5);
    store.apply_external(seed.clone()).unwrap();
    let mut slow = watch(&store, watch_request(WatchStart::After(5))).await;
    // A relist at revision 10 finds 12 new objects (within the buffer): 12 ADDED events at 10.
    let mut listed: Vec<Llama> = (0..12)
        .map(|i| at(llama("a", &format!("r{i}"), 1.0), 6 + i))
        .collect();
    listed.push(seed);
    store.reset_at(listed, 10).unwrap();
    let first = match next_item(&mut slow).await {
        Some(WatchItem::Event(event)) => event.resource_version,
        other => panic!("expected the relist's first event, got {other:?}"),
    };
    // Later changes push it past its buffer while it is inside the relist's group.
    for i in 0..40 {
        store
            .apply_external(at(llama("b", &format!("later{i}"), 1.0), 100 + i))
            .unwrap();
    }
    let mut rest = 0;
    loop {
        match next_item(&mut slow).await {
            Some(WatchItem::Event(event)) if event.resource_version == first => rest += 1,
            Some(WatchItem::Error(Error::Expired(_))) => break,
            other => panic!("after {rest} more of the relist: expected 410 Expired, got {other:?}"),
        }
    }
    assert!(rest < 11, "the watcher was ended inside the group");
    assert!(
        next_item(&mut slow).await.is_none(),
        "the watch ends after its error"
    );
}

#[tokio::test]
async fn memory_is_writable() {
    assert!(memory_store().await.writable().is_some());
}

conformance!(pod_cache: run, pod_cache, [
    get_and_missing,
    stats_agree,
    pages_and_continue,
    pages_with_selectors,
    writes_between_pages,
    malformed_continue,
    read_at_versions,
    selectors,
    namespace_scoping,
    watch_after_resumes,
    watch_initial_state,
    watch_scoped,
    watch_selection_transitions,
]);

#[tokio::test]
async fn pod_cache_continue_after_snapshot_gone() {
    // The cache keeps as many list snapshots as a default memory store.
    let kept = MemoryStoreConfig::default().max_snapshots;
    run(continue_after_snapshot_gone(pod_cache, kept)).await;
}

#[tokio::test]
async fn pod_cache_cursor_agrees_with_list() {
    run(cursor_agrees_with_list(pod_cache, true)).await;
}

#[tokio::test]
async fn pod_cache_is_read_only() {
    let h = pod_cache(&fixture()).await;
    assert!(h.store().writable().is_none());
    assert!(
        farm_apiserver::resources::farmpod::synthetic_view(3)
            .writable()
            .is_none()
    );
}
