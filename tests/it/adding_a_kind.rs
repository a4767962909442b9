//! Adding a kind to the binary is its file plus one line: Barn's file (`barn.rs`) and the line
//! below, which `resources::register` would take, give a server built by the binary's start-up
//! (`server::build`, as `config::Args::run` calls it) a fourth kind on the storage the flags
//! chose: created and read back over the real TLS listener, kept in memory or in etcd, listed by
//! kubectl, its readiness in `/readyz`.

use crate::{
    barn::{Barn, BarnSpec},
    common::{self, Alpn, Options, TestServer, TestStorage, kubectl, run},
    on_both_storages,
};

use aggregated_apiserver::{group::ApiGroup, resource::ObjectKey, store::StorageFactory};
use farm_apiserver::resources::{self, Llama};
use kube::api::{Api, ObjectMeta, PostParams};

/// The binary's kinds and Barn: the one line a kind adds to `resources::register`.
fn with_barns(storage: &StorageFactory) -> ApiGroup {
    resources::register(storage).serve::<Barn>(storage.store())
}

async fn a_kind_in_its_file_plus_one_line_is_served_on_the_chosen_storage(storage: TestStorage) {
    if storage == TestStorage::Etcd && common::etcd::binary().is_none() {
        return;
    }
    let server = TestServer::start_with(Options {
        storage,
        kinds: with_barns,
        ..Options::default()
    })
    .await;
    let client = server.kube_client().await;
    let barns: Api<Barn> = Api::namespaced(client.clone(), "farm");
    let barn = Barn {
        metadata: ObjectMeta {
            name: Some("north".into()),
            ..Default::default()
        },
        spec: BarnSpec {
            color: String::new(),
            stalls: 12,
        },
        status: None,
    };
    let created = barns.create(&PostParams::default(), &barn).await.unwrap();
    // Barn's own strategy hook ran: an empty colour is red.
    assert_eq!(created.spec.color, "red");
    let read = barns.get("north").await.unwrap();
    assert_eq!(read.spec, created.spec);
    assert_eq!(read.metadata.uid, created.metadata.uid);
    // The binary's kinds are all still there, in discovery order, the new one last.
    let dolly = Api::<Llama>::namespaced(client, "default")
        .get("dolly")
        .await
        .unwrap();
    assert_eq!(dolly.spec.weight, 31.4);
    let raw = server.raw(Some(server.admin_identity()), Alpn::Http1);
    let discovery = raw.get("/apis/farm.example.com/v1alpha", &[]).await.json();
    let kinds: Vec<&str> = discovery["resources"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["name"].as_str().filter(|n| !n.contains('/')))
        .collect();
    assert_eq!(kinds, ["llamas", "farmpods", "barns"]);

    // Stored where the storage says: the server's Barn store holds it, and on etcd a store of
    // another process (here: a new one) reads it from etcd.
    let key = ObjectKey {
        namespace: "farm".into(),
        name: "north".into(),
    };
    let served = server.storage.store::<Barn>().get(&key).await.unwrap();
    assert_eq!(served.metadata.uid, created.metadata.uid);
    if let Some(etcd) = &server.etcd {
        let elsewhere = StorageFactory::etcd(etcd.client(), "/farm.example.com/").store::<Barn>();
        let mut found = elsewhere.get(&key).await;
        for _ in 0..500 {
            if found.is_ok() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            found = elsewhere.get(&key).await;
        }
        assert_eq!(found.unwrap().metadata.uid, created.metadata.uid);
        // Two kinds in etcd, one `etcd` readiness check that both pass.
        let verbose = raw.get("/readyz?verbose", &[]).await;
        assert_eq!(verbose.status, 200);
        let body = String::from_utf8_lossy(&verbose.body);
        assert_eq!(body.matches("[+]etcd ok").count(), 1, "{body}");
    }

    // kubectl sees it as any kind, with its columns.
    let cache = tempfile::tempdir().unwrap();
    let Some(mut cmd) = kubectl(&server.kubeconfig(), cache.path()) else {
        return;
    };
    cmd.args(["get", "barns", "-n", "farm", "--no-headers"]);
    let (ok, out, err) = run(cmd, None).await;
    assert!(ok, "{err}");
    let cells: Vec<&str> = out.split_whitespace().collect();
    assert_eq!(cells[..2], ["north", "red"], "{out}");
}

on_both_storages!(a_kind_in_its_file_plus_one_line_is_served_on_the_chosen_storage);
