//! A view of one of the cluster's kinds is its file plus one line too: Placard (`placard.rs`,
//! a view of ConfigMaps) added to the binary's kinds with the line below is served from one
//! watch cache of the cluster's ConfigMaps (here a fake kube-apiserver's): read with kube's
//! client over the real TLS listener, watched as ConfigMaps come, listed by kubectl with its
//! columns, read-only, its readiness in `/readyz`.

use std::time::Duration;

use aggregated_apiserver::{group::ApiGroup, store::StorageFactory};
use farm_apiserver::resources;
use futures::StreamExt;
use kube::{
    Api,
    api::{PostParams, WatchEvent, WatchParams},
};
use serde_json::json;

use crate::{
    common::{Alpn, Options, TestServer, fake_kube::FakeKube, kubectl, run},
    placard::{Placard, PlacardSpec},
};

/// The binary's kinds and Placard: the one line a view adds to `resources::register`.
fn with_placards(storage: &StorageFactory) -> ApiGroup {
    resources::register(storage).serve::<Placard>(storage.view())
}

fn config_map(name: &str, keys: &[&str]) -> serde_json::Value {
    let data: serde_json::Map<String, serde_json::Value> =
        keys.iter().map(|k| ((*k).to_owned(), json!("x"))).collect();
    json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "notices"}, "data": data})
}

#[tokio::test]
async fn a_view_in_its_file_plus_one_line_is_served_from_the_clusters_objects() {
    let fake = FakeKube::start().await;
    fake.add(config_map("gate", &["open", "shut"]));
    let server = TestServer::start_with(Options {
        cluster: Some(fake.client().await),
        kinds: with_placards,
        ..Options::default()
    })
    .await;
    let raw = server.raw(Some(server.admin_identity()), Alpn::Http1);
    // Ready once the ConfigMaps are listed: the view's own check.
    let mut verbose = raw.get("/readyz?verbose", &[]).await;
    for _ in 0..500 {
        if verbose.status == 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        verbose = raw.get("/readyz?verbose", &[]).await;
    }
    let body = String::from_utf8_lossy(&verbose.body);
    assert_eq!(verbose.status, 200, "{body}");
    assert!(body.contains("[+]placard-cache-synced ok"), "{body}");

    let placards: Api<Placard> = Api::namespaced(server.kube_client().await, "notices");
    let gate = placards.get("gate").await.unwrap();
    assert_eq!(gate.spec.keys, ["open", "shut"]);
    let listed = placards.list(&Default::default()).await.unwrap();
    assert_eq!(listed.items.len(), 1);

    // A ConfigMap made in the cluster reaches a watcher of the view.
    let version = listed.metadata.resource_version.clone().unwrap();
    let mut events = placards
        .watch(&WatchParams::default().timeout(10), &version)
        .await
        .unwrap()
        .boxed();
    fake.add(config_map("hay", &["bales"]));
    let added = tokio::time::timeout(Duration::from_secs(10), events.next())
        .await
        .expect("an event within 10 s")
        .expect("the watch goes on")
        .unwrap();
    match added {
        WatchEvent::Added(placard) => {
            assert_eq!(placard.metadata.name.as_deref(), Some("hay"));
            assert_eq!(placard.spec.keys, ["bales"]);
        }
        other => panic!("expected ADDED hay, got {other:?}"),
    }

    // Read-only: the view's store takes no writes (kube-apiserver's 405 for a verb not served).
    let refused = placards
        .create(
            &PostParams::default(),
            &Placard::new("mine", PlacardSpec::default()),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, kube::Error::Api(status) if status.code == 405),
        "{refused:?}"
    );

    // Discovery lists it with the binary's kinds, read-only.
    let discovery = raw.get("/apis/farm.example.com/v1alpha", &[]).await.json();
    let placard = discovery["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "placards")
        .expect("placards in discovery")
        .clone();
    assert_eq!(placard["verbs"], json!(["get", "list", "watch"]));

    // kubectl sees it as any kind, with its columns.
    let cache = tempfile::tempdir().unwrap();
    let Some(mut cmd) = kubectl(&server.kubeconfig(), cache.path()) else {
        return;
    };
    cmd.args(["get", "placards", "-n", "notices", "--no-headers"]);
    let (ok, out, err) = run(cmd, None).await;
    assert!(ok, "{err}");
    let rows: Vec<Vec<&str>> = out
        .lines()
        .map(|line| line.split_whitespace().collect())
        .collect();
    assert_eq!(rows.len(), 2, "{out}");
    assert_eq!(rows[0][..2], ["gate", "2"], "{out}");
    assert_eq!(rows[1][..2], ["hay", "1"], "{out}");
}
