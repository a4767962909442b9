//! The Rust operator pattern through a real kube-apiserver, as the kube-rs tutorials teach it:
//! kube-runtime's `Controller` with `finalizer()` on Llamas (the finalizer is added by a JSON
//! patch that tests the missing `metadata/finalizers` against null), reconcile patching the
//! object, deletion running the cleanup before the Llama goes; `Api::entry()`, a reflector on
//! streaming lists (`sendInitialEvents`) and a metadata watcher.
//!
//! Runs when `FARM_E2E_KUBECONFIG` names the lab's cluster (see `e2e_cluster`).

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use farm_apiserver::resources::llama::v1::{Llama, LlamaSpec};
use futures::StreamExt;
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, PartialObjectMeta, Patch, PatchParams, PostParams, entry::Entry},
    runtime::{
        Controller, WatchStreamExt,
        controller::Action,
        finalizer::{self, Event, finalizer},
        reflector, watcher,
    },
};
use serde_json::json;

use crate::e2e_cluster::{Cluster, ONE_AT_A_TIME, register};

const FINALIZER: &str = "farm.example.com/cleanup";
const RECONCILED: &str = "farm.example.com/reconciled";

struct Context {
    api: Api<Llama>,
    /// The Llamas whose cleanup ran, in order.
    cleaned: Mutex<Vec<String>>,
}

type ReconcileError = finalizer::Error<kube::Error>;

async fn reconcile(llama: Arc<Llama>, context: Arc<Context>) -> Result<Action, ReconcileError> {
    let api = context.api.clone();
    finalizer(&api, FINALIZER, llama, |event| async {
        match event {
            Event::Apply(llama) => {
                if !llama.annotations().contains_key(RECONCILED) {
                    let mark = json!({"metadata": {"annotations": {RECONCILED: "yes"}}});
                    context
                        .api
                        .patch(
                            &llama.name_any(),
                            &PatchParams::default(),
                            &Patch::Merge(mark),
                        )
                        .await?;
                }
                Ok(Action::await_change())
            }
            Event::Cleanup(llama) => {
                context.cleaned.lock().unwrap().push(llama.name_any());
                Ok(Action::await_change())
            }
        }
    })
    .await
}

fn error_policy(_: Arc<Llama>, error: &ReconcileError, _: Arc<Context>) -> Action {
    eprintln!("reconcile failed: {error}");
    Action::requeue(Duration::from_millis(500))
}

fn llama(name: &str, weight: f64) -> Llama {
    Llama::new(
        name,
        LlamaSpec {
            weight_kg: weight,
            height_metres: 1.2,
            nickname: None,
        },
    )
}

/// Waits up to 30 s for `check` to hold of the Llama `name` (None: it is gone).
async fn until(api: &Api<Llama>, name: &str, what: &str, check: impl Fn(Option<&Llama>) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let found = api.get_opt(name).await.expect("get");
        if check(found.as_ref()) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{name}: {what} did not happen: {found:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_runtime_controllers_with_finalizers() {
    let Some(cluster) = Cluster::from_env() else {
        return;
    };
    let _one = ONE_AT_A_TIME.lock().await;
    let started = Instant::now();
    let step = |what: &str| eprintln!("[{:>5.1}s] {what}", started.elapsed().as_secs_f64());
    let (server, installed) = register(&cluster, Vec::new(), None, &[], &step).await;
    let api: Api<Llama> = Api::namespaced(cluster.client().await, &installed.namespace);

    step("a Controller with finalizer() on streaming lists");
    let context = Arc::new(Context {
        api: api.clone(),
        cleaned: Mutex::default(),
    });
    let controller = tokio::spawn(
        Controller::new(api.clone(), watcher::Config::default().streaming_lists())
            .run(reconcile, error_policy, context.clone())
            .for_each(|_| async {}),
    );

    step("reconcile adds the finalizer, then patches the object");
    api.create(&PostParams::default(), &llama("op-1", 40.0))
        .await
        .expect("create op-1");
    until(&api, "op-1", "finalizer and annotation", |l| {
        l.is_some_and(|l| {
            l.finalizers().contains(&FINALIZER.to_owned())
                && l.annotations().contains_key(RECONCILED)
        })
    })
    .await;

    step("deletion runs the cleanup, then the finalizer goes and so does the Llama");
    api.delete("op-1", &DeleteParams::default())
        .await
        .expect("delete op-1");
    until(&api, "op-1", "deletion", |l| l.is_none()).await;
    assert_eq!(*context.cleaned.lock().unwrap(), ["op-1"]);

    step("Api::entry(): insert when vacant, modify when occupied");
    api.entry("op-2")
        .await
        .expect("entry")
        .or_insert(|| llama("op-2", 30.0))
        .commit(&PostParams::default())
        .await
        .expect("entry insert");
    until(&api, "op-2", "reconcile", |l| {
        l.is_some_and(|l| l.annotations().contains_key(RECONCILED))
    })
    .await;
    match api
        .entry("op-2")
        .await
        .expect("entry")
        .and_modify(|l| l.spec.nickname = Some("Entry".into()))
    {
        Entry::Occupied(mut occupied) => occupied
            .commit(&PostParams::default())
            .await
            .expect("entry modify"),
        Entry::Vacant(_) => panic!("op-2 is there"),
    }
    let op2 = api.get("op-2").await.unwrap();
    assert_eq!(op2.spec.nickname.as_deref(), Some("Entry"));
    assert!(op2.finalizers().contains(&FINALIZER.to_owned()));

    step("a reflector on streaming lists");
    let (reader, writer) = reflector::store();
    let reflected = tokio::spawn(
        reflector(
            writer,
            watcher(api.clone(), watcher::Config::default().streaming_lists()),
        )
        .applied_objects()
        .for_each(|_| async {}),
    );
    tokio::time::timeout(Duration::from_secs(30), reader.wait_until_ready())
        .await
        .expect("the reflector's initial list within 30 s")
        .expect("the reflector is ready");
    let names: Vec<String> = reader.state().iter().map(|l| l.name_any()).collect();
    assert_eq!(names, ["op-2"]);

    step("a metadata watcher sees a new Llama");
    let metadata_api: Api<PartialObjectMeta<Llama>> =
        Api::namespaced(cluster.client().await, &installed.namespace);
    let mut metadata = watcher(metadata_api, watcher::Config::default())
        .applied_objects()
        .boxed();
    api.create(&PostParams::default(), &llama("op-3", 20.0))
        .await
        .expect("create op-3");
    let seen = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(event) = metadata.next().await {
            let meta = event.expect("metadata event");
            if meta.name_any() == "op-3" {
                return meta;
            }
        }
        panic!("the metadata watch ended");
    })
    .await
    .expect("op-3 within 30 s");
    assert_eq!(
        seen.types.as_ref().map(|t| t.kind.as_str()),
        Some("PartialObjectMetadata")
    );
    // The reflector has seen it too.
    let deadline = Instant::now() + Duration::from_secs(30);
    while reader.state().len() < 2 {
        assert!(Instant::now() < deadline, "the reflector did not see op-3");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    step("the rest goes through the controller's cleanup");
    for name in ["op-2", "op-3"] {
        api.delete(name, &DeleteParams::default())
            .await
            .expect("delete");
        until(&api, name, "deletion", |l| l.is_none()).await;
    }
    let mut cleaned = context.cleaned.lock().unwrap().clone();
    cleaned.sort();
    assert_eq!(cleaned, ["op-1", "op-2", "op-3"]);
    controller.abort();
    reflected.abort();
    drop(installed);
    drop(server);
    step("done");
}
