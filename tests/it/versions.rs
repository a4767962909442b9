//! Llama at two versions, v1 (stored) and v1alpha, over the real TLS listener with kube-rs
//! typed clients of each version and a raw client: writes through one version read through the
//! other, a watch of one version during writes through the other, v1's nickname kept through
//! v1alpha updates, each version's body refused at the other's path, what etcd holds at each
//! storage version, and conversion round trips over generated objects.

use std::time::Duration;

use aggregated_apiserver::resource::VersionOf;
use farm_apiserver::resources::llama::{self, NICKNAME_ANNOTATION, v1, v1alpha};
use futures::{StreamExt, TryStreamExt};
use kube::api::{
    Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams, WatchEvent,
    WatchParams,
};
use proptest::prelude::*;
use serde_json::{Value, json};

use crate::{
    common::{self, Alpn, Options, TestServer, TestStorage},
    on_both_storages,
};

const V1: &str = "/apis/farm.example.com/v1/namespaces/default/llamas";
const V1ALPHA: &str = "/apis/farm.example.com/v1alpha/namespaces/default/llamas";

fn v1_llama(name: &str, weight: f64, nickname: Option<&str>) -> v1::Llama {
    v1::Llama {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some([("herd".to_string(), "gold".to_string())].into()),
            ..Default::default()
        },
        spec: v1::LlamaSpec {
            weight_kg: weight,
            height_metres: 1.6,
            nickname: nickname.map(Into::into),
        },
    }
}

async fn written_through_one_version_read_through_the_other(storage: TestStorage) {
    let Some(server) = TestServer::start_on(storage).await else {
        return;
    };
    let client = server.kube_client().await;
    let newer: Api<v1::Llama> = Api::namespaced(client.clone(), "default");
    let older: Api<v1alpha::Llama> = Api::namespaced(client.clone(), "default");
    let created = newer
        .create(
            &PostParams::default(),
            &v1_llama("kuzco", 80.0, Some("Emperor")),
        )
        .await
        .expect("create through v1");

    // v1alpha sees the same object: its fields renamed, the nickname in the annotation.
    let seen = older.get("kuzco").await.expect("get through v1alpha");
    assert_eq!(seen.spec.weight, 80.0);
    assert_eq!(seen.spec.height, 1.6);
    assert_eq!(
        seen.metadata.resource_version,
        created.metadata.resource_version
    );
    assert_eq!(seen.metadata.uid, created.metadata.uid);
    assert_eq!(
        seen.metadata.annotations.as_ref().unwrap()[NICKNAME_ANNOTATION],
        "Emperor"
    );

    // A v1alpha replace that drops every annotation keeps the nickname it cannot see.
    let mut replaced = seen.clone();
    replaced.metadata.annotations = None;
    replaced.spec.weight = 81.0;
    older
        .replace("kuzco", &PostParams::default(), &replaced)
        .await
        .expect("replace through v1alpha");
    let read = newer.get("kuzco").await.unwrap();
    assert_eq!(read.spec.weight_kg, 81.0);
    assert_eq!(read.spec.nickname.as_deref(), Some("Emperor"));
    assert_eq!(read.metadata.annotations, None, "hidden from v1's readers");

    // Merge and JSON patches apply to the requested version's form.
    older
        .patch(
            "kuzco",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"weight": 82}})),
        )
        .await
        .expect("merge patch through v1alpha");
    let patch: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/spec/weightKg", "value": 82},
        {"op": "replace", "path": "/spec/nickname", "value": "Kuzco"}
    ]))
    .unwrap();
    newer
        .patch("kuzco", &PatchParams::default(), &Patch::<()>::Json(patch))
        .await
        .expect("JSON patch through v1");
    let seen = older.get("kuzco").await.unwrap();
    assert_eq!(seen.spec.weight, 82.0);
    assert_eq!(
        seen.metadata.annotations.as_ref().unwrap()[NICKNAME_ANNOTATION],
        "Kuzco"
    );

    // Lists, Tables and field selectors in each version.
    let raw = server.raw(Some(server.admin_identity()), Alpn::Http1);
    for (path, weight) in [(V1, "weightKg"), (V1ALPHA, "weight")] {
        let list = raw.get(path, &[]).await.json();
        let kuzco = list["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|item| item["metadata"]["name"] == "kuzco")
            .expect("listed")
            .clone();
        assert_eq!(kuzco["apiVersion"], list["apiVersion"]);
        assert_eq!(kuzco["spec"][weight], 82.0, "{path}");
        let table = raw
            .get(
                &format!("{path}?fieldSelector=metadata.name%3Dkuzco"),
                &[("accept", "application/json;as=Table;v=v1;g=meta.k8s.io")],
            )
            .await
            .json();
        let rows = table["rows"].as_array().unwrap();
        assert_eq!(rows.len(), 1, "{path}");
        assert_eq!(rows[0]["cells"][1], 82.0, "the Weight column in {path}");
    }

    // deletecollection through v1alpha, by label: gone in v1 too.
    older
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().labels("herd=gold"),
        )
        .await
        .expect("deletecollection through v1alpha");
    assert!(newer.get_opt("kuzco").await.unwrap().is_none());
}

/// A watch of one version during writes through the other: every event converted.
async fn a_watch_in_one_version_sees_writes_in_the_other(storage: TestStorage) {
    let Some(server) = TestServer::start_on(storage).await else {
        return;
    };
    let client = server.kube_client().await;
    let newer: Api<v1::Llama> = Api::namespaced(client.clone(), "default");
    let older: Api<v1alpha::Llama> = Api::namespaced(client.clone(), "default");
    let rv = older
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut old_events = older
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();
    let mut new_events = newer
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();

    newer
        .create(
            &PostParams::default(),
            &v1_llama("pacha", 90.0, Some("Big guy")),
        )
        .await
        .unwrap();
    let mut through_older = v1alpha::Llama::from_stored(&v1_llama("chicha", 70.0, None));
    through_older.spec.height = 1.4;
    older
        .create(&PostParams::default(), &through_older)
        .await
        .unwrap();

    let pacha: v1alpha::Llama = next(&mut old_events).await;
    assert_eq!(pacha.metadata.name.as_deref(), Some("pacha"));
    assert_eq!(pacha.spec.weight, 90.0);
    assert_eq!(
        pacha.metadata.annotations.as_ref().unwrap()[NICKNAME_ANNOTATION],
        "Big guy"
    );
    let chicha: v1alpha::Llama = next(&mut old_events).await;
    assert_eq!(chicha.spec.height, 1.4);

    let pacha: v1::Llama = next(&mut new_events).await;
    assert_eq!(pacha.spec.nickname.as_deref(), Some("Big guy"));
    let chicha: v1::Llama = next(&mut new_events).await;
    assert_eq!(chicha.metadata.name.as_deref(), Some("chicha"));
    assert_eq!(chicha.spec.height_metres, 1.4);
    assert_eq!(chicha.spec.nickname, None);
}

/// The next ADDED object of a watch (bookmarks skipped).
pub(crate) async fn next<K: Clone + std::fmt::Debug>(
    events: &mut futures::stream::BoxStream<'_, kube::Result<WatchEvent<K>>>,
) -> K {
    loop {
        match tokio::time::timeout(Duration::from_secs(10), events.try_next())
            .await
            .expect("an event in time")
            .expect("a watch event")
            .expect("the stream goes on")
        {
            WatchEvent::Added(object) => return object,
            WatchEvent::Bookmark(_) => continue,
            other => panic!("{other:?}"),
        }
    }
}

/// A body of one version sent to the other's path: kube-apiserver's 400, nothing stored.
async fn a_body_of_the_other_version_is_refused(storage: TestStorage) {
    let Some(server) = TestServer::start_on(storage).await else {
        return;
    };
    let raw = server.raw(Some(server.admin_identity()), Alpn::Http1);
    let json = [("content-type", "application/json")];
    let older = json!({"apiVersion": "farm.example.com/v1alpha", "kind": "Llama",
        "metadata": {"name": "izma"}, "spec": {"weight": 50, "height": 1.2}});
    let newer = json!({"apiVersion": "farm.example.com/v1", "kind": "Llama",
        "metadata": {"name": "izma"}, "spec": {"weightKg": 50, "heightMetres": 1.2}});
    for (path, body, sent, expected) in [
        (
            V1,
            &older,
            "farm.example.com/v1alpha",
            "farm.example.com/v1",
        ),
        (
            V1ALPHA,
            &newer,
            "farm.example.com/v1",
            "farm.example.com/v1alpha",
        ),
    ] {
        let reply = raw
            .send("POST", path, &json, Some(serde_json::to_vec(body).unwrap()))
            .await;
        assert_eq!(
            reply.status,
            400,
            "{}",
            String::from_utf8_lossy(&reply.body)
        );
        let message = reply.json()["message"].as_str().unwrap().to_owned();
        assert!(
            message.contains(&format!(
                "the API version in the data ({sent}) does not match the expected API version ({expected})"
            )),
            "{message}"
        );
        assert_eq!(raw.get(&format!("{path}/izma"), &[]).await.status, 404);
    }
    // What v1alpha cannot check itself is checked at the stored version: a nickname (in its
    // annotation) longer than v1 allows is refused, not stored.
    let long = json!({"apiVersion": "farm.example.com/v1alpha", "kind": "Llama",
        "metadata": {"name": "izma", "annotations": {NICKNAME_ANNOTATION: "n".repeat(64)}},
        "spec": {"weight": 50, "height": 1.2}});
    let reply = raw
        .send(
            "POST",
            V1ALPHA,
            &json,
            Some(serde_json::to_vec(&long).unwrap()),
        )
        .await;
    assert_eq!(
        reply.status,
        422,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    assert!(
        reply.json()["message"]
            .as_str()
            .unwrap()
            .contains("spec.nickname: Too long: may not be more than 63 bytes"),
        "{}",
        reply.json()
    );
    assert_eq!(raw.get(&format!("{V1ALPHA}/izma"), &[]).await.status, 404);
}

/// Discovery's storageVersionHash is kube-apiserver's: the same for both versions of a kind,
/// from the version it is stored at.
async fn discovery_names_the_storage_version(storage: TestStorage) {
    let Some(server) = TestServer::start_on(storage).await else {
        return;
    };
    let raw = server.raw(Some(server.admin_identity()), Alpn::Http1);
    let hash = |version: &'static str| {
        let raw = &raw;
        async move {
            let list = raw
                .get(&format!("/apis/farm.example.com/{version}"), &[])
                .await
                .json();
            list["resources"]
                .as_array()
                .unwrap()
                .iter()
                .find(|r| r["name"] == "llamas")
                .unwrap()["storageVersionHash"]
                .as_str()
                .unwrap()
                .to_owned()
        }
    };
    use base64::Engine;
    use sha2::Digest;
    let expected = base64::engine::general_purpose::STANDARD
        .encode(&sha2::Sha256::digest(b"farm.example.com/v1/Llama")[..8]);
    assert_eq!(hash("v1").await, expected);
    assert_eq!(hash("v1alpha").await, expected);
}

on_both_storages!(
    written_through_one_version_read_through_the_other,
    a_watch_in_one_version_sees_writes_in_the_other,
    a_body_of_the_other_version_is_refused,
    discovery_names_the_storage_version,
);

/// etcd holds each object at the storage version; one an earlier release stored at the other
/// version reads through both, and is rewritten at the storage version at its next write.
#[tokio::test]
async fn etcd_holds_the_storage_version_and_reads_the_other() {
    if common::etcd::binary().is_none() {
        return;
    }
    for (storage_version, other) in [("v1", "v1alpha"), ("v1alpha", "v1")] {
        let server = TestServer::start_with(Options {
            storage: TestStorage::Etcd,
            storage_version,
            ..Options::default()
        })
        .await;
        let etcd = server.etcd.as_ref().unwrap().client();
        let stored_at = |name: &'static str| {
            let etcd = etcd.clone();
            async move {
                let key = format!("/farm.example.com/llamas/default/{name}");
                let got = etcd.range(key.as_bytes(), &[], 0, 1).await.unwrap();
                let value: Value = serde_json::from_slice(&got.kvs[0].value).unwrap();
                value
            }
        };
        let client = server.kube_client().await;
        let newer: Api<v1::Llama> = Api::namespaced(client.clone(), "default");
        newer
            .create(
                &PostParams::default(),
                &v1_llama("rudy", 60.0, Some("Rudy")),
            )
            .await
            .unwrap();
        let held = stored_at("rudy").await;
        assert_eq!(
            held["apiVersion"],
            format!("farm.example.com/{storage_version}")
        );
        if storage_version == "v1alpha" {
            assert_eq!(held["metadata"]["annotations"][NICKNAME_ANNOTATION], "Rudy");
            assert_eq!(held["spec"]["weight"], 60.0);
        }

        // Written by an earlier release at the other version.
        let earlier = match other {
            "v1alpha" => json!({"apiVersion": "farm.example.com/v1alpha", "kind": "Llama",
                "metadata": {"name": "old", "namespace": "default", "uid": "0001",
                             "creationTimestamp": "2026-01-01T00:00:00Z"},
                "spec": {"weight": 40, "height": 1.1}}),
            _ => json!({"apiVersion": "farm.example.com/v1", "kind": "Llama",
                "metadata": {"name": "old", "namespace": "default", "uid": "0001",
                             "creationTimestamp": "2026-01-01T00:00:00Z"},
                "spec": {"weightKg": 40, "heightMetres": 1.1, "nickname": "Oldie"}}),
        };
        etcd.put(
            b"/farm.example.com/llamas/default/old",
            &serde_json::to_vec(&earlier).unwrap(),
        )
        .await
        .unwrap();
        let raw = server.raw(Some(server.admin_identity()), Alpn::Http1);
        let mut seen = raw.get(&format!("{V1}/old"), &[]).await;
        for _ in 0..200 {
            if seen.status == 200 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
            seen = raw.get(&format!("{V1}/old"), &[]).await;
        }
        assert_eq!(seen.status, 200, "{}", String::from_utf8_lossy(&seen.body));
        assert_eq!(seen.json()["spec"]["weightKg"], 40.0);
        assert_eq!(
            raw.get(&format!("{V1ALPHA}/old"), &[]).await.json()["spec"]["weight"],
            40.0
        );
        // Its next write stores it at the storage version, nothing lost.
        newer
            .patch(
                "old",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"heightMetres": 1.2}})),
            )
            .await
            .unwrap();
        let held = stored_at("old").await;
        assert_eq!(
            held["apiVersion"],
            format!("farm.example.com/{storage_version}")
        );
        let read = newer.get("old").await.unwrap();
        assert_eq!(read.spec.height_metres, 1.2);
        assert_eq!(read.spec.weight_kg, 40.0);
        if other == "v1" {
            assert_eq!(read.spec.nickname.as_deref(), Some("Oldie"));
        }
    }
}

fn meta() -> impl Strategy<Value = ObjectMeta> {
    (
        "[a-z][a-z0-9-]{0,20}",
        proptest::option::of(proptest::collection::btree_map(
            "[a-z]{1,8}",
            "[a-z0-9]{0,8}",
            0..3,
        )),
        proptest::option::of(proptest::collection::btree_map(
            "[a-z]{1,8}/[a-z]{1,8}",
            ".{0,12}",
            0..3,
        )),
    )
        .prop_map(|(name, labels, annotations)| ObjectMeta {
            name: Some(name),
            namespace: Some("default".into()),
            labels,
            // No annotations and none at all are one value on the wire (Kubernetes omits an
            // empty map): conversion gives the first when it took out the nickname's.
            annotations: annotations.filter(|a| !a.is_empty()),
            ..Default::default()
        })
}

fn number() -> impl Strategy<Value = f64> {
    prop_oneof![0.001f64..1e6, (1u32..100_000).prop_map(f64::from)]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// v1alpha -> v1 -> v1alpha is the identity (the nickname annotation included).
    #[test]
    fn v1alpha_through_v1_and_back(
        metadata in meta(),
        nickname in proptest::option::of(".{0,20}"),
        weight in number(),
        height in number(),
    ) {
        let mut metadata = metadata;
        if let Some(nickname) = nickname {
            metadata.annotations.get_or_insert_with(Default::default).insert(NICKNAME_ANNOTATION.into(), nickname);
        }
        let older = v1alpha::Llama { metadata, spec: v1alpha::LlamaSpec { weight, height } };
        let newer: v1::Llama = older.to_stored(None);
        prop_assert_eq!(v1alpha::Llama::from_stored(&newer), older.clone());
        // The same through the other impl, as when v1alpha is the storage version.
        let newer = v1::Llama::from_stored(&older);
        prop_assert_eq!(VersionOf::<v1alpha::Llama>::to_stored(&newer, None), older);
    }

    /// v1 -> v1alpha -> v1 is the identity.
    #[test]
    fn v1_through_v1alpha_and_back(
        metadata in meta(),
        nickname in proptest::option::of(".{0,20}"),
        weight_kg in number(),
        height_metres in number(),
    ) {
        let newer = v1::Llama { metadata, spec: v1::LlamaSpec { weight_kg, height_metres, nickname } };
        let older = v1alpha::Llama::from_stored(&newer);
        prop_assert_eq!(VersionOf::<v1::Llama>::to_stored(&older, None), newer.clone());
        let older: v1alpha::Llama = newer.to_stored(None);
        prop_assert_eq!(v1::Llama::from_stored(&older), newer);
    }
}

/// The sample, generated at v1, is the same llama at v1alpha.
#[test]
fn the_sample_is_dolly_at_both_versions() {
    let older: v1alpha::Llama = v1alpha::Llama::from_stored(&llama::sample());
    assert_eq!(older.metadata.name.as_deref(), Some("dolly"));
    assert_eq!((older.spec.weight, older.spec.height), (31.4, 0.5));
}

/// The third kind declares two versions too (`barn.rs`): Barn at v1beta1 beside v1alpha, stored
/// at v1alpha, its status subresource and field selector at both.
#[tokio::test]
async fn a_kind_of_the_tests_at_two_versions() {
    use crate::barn::{self, Barn, BarnStatus};
    use aggregated_apiserver::{group::ApiGroup, store::StorageFactory};
    fn kinds(storage: &StorageFactory) -> ApiGroup {
        farm_apiserver::resources::register(storage)
            .serve_versions::<barn::v1beta1::Barn, Barn>(&storage.clone().storing_at("v1alpha"))
    }
    let server = TestServer::start_with(Options {
        kinds,
        ..Options::default()
    })
    .await;
    let client = server.kube_client().await;
    let newer: Api<barn::v1beta1::Barn> = Api::namespaced(client.clone(), "default");
    let older: Api<Barn> = Api::namespaced(client, "default");
    let built = barn::v1beta1::Barn::new(
        "east",
        barn::v1beta1::BarnSpec {
            color: "blue".into(),
            stall_count: 12,
        },
    );
    newer.create(&PostParams::default(), &built).await.unwrap();
    let seen = older.get("east").await.unwrap();
    assert_eq!(seen.spec.stalls, 12);
    assert_eq!(seen.spec.color, "blue");

    // The status through v1alpha's /status, read through v1beta1.
    let mut with_status = seen.clone();
    with_status.status = Some(BarnStatus {
        ready: true,
        note: Some("swept".into()),
    });
    older
        .replace_status("east", &PostParams::default(), &with_status)
        .await
        .unwrap();
    let read = newer.get("east").await.unwrap();
    assert_eq!(read.status.as_ref().map(|s| s.ready), Some(true));
    assert_eq!(read.spec.stall_count, 12);

    // The selectable field at both versions.
    for path in [
        "/apis/farm.example.com/v1beta1/namespaces/default/barns?fieldSelector=spec.color%3Dblue",
        "/apis/farm.example.com/v1alpha/namespaces/default/barns?fieldSelector=spec.color%3Dblue",
    ] {
        let raw = server.raw(Some(server.admin_identity()), Alpn::Http1);
        let list = raw.get(path, &[]).await.json();
        assert_eq!(list["items"].as_array().unwrap().len(), 1, "{path}: {list}");
    }
    // Immutable stalls are checked at the stored version whatever the version written.
    let mut more = read.clone();
    more.spec.stall_count = 13;
    more.status = None;
    let err = newer
        .replace("east", &PostParams::default(), &more)
        .await
        .expect_err("stalls are immutable");
    assert!(
        err.to_string().contains("immutable") || err.to_string().contains("Invalid"),
        "{err}"
    );
}
