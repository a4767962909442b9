//! Writers racing on one Llama through two replicas on one etcd: the write pipeline's one
//! retry loop (#51) tries a lost race again from etcd, so patches and applies that name no
//! resourceVersion all land and none is lost, while writes that name one (a PUT, a delete's
//! precondition) get kube-apiserver's 409 once they lose.

use futures::future::join_all;

use super::{LLAMAS, client, eventually, send, start};
use crate::common::{RawClient, etcd::Etcd, fixtures};

/// The message of kube-apiserver's 409 for a write that lost (its `OptimisticLockErrorMsg`).
const MODIFIED: &str = "Operation cannot be fulfilled on llamas.farm.example.com \"racer\": the object has been modified; please apply your changes to the latest version and try again";

async fn patch(on: &RawClient, path: &str, content_type: &str, body: String) -> (u16, String) {
    let reply = on
        .send(
            "PATCH",
            path,
            &[("content-type", content_type)],
            Some(body.into_bytes()),
        )
        .await;
    (
        reply.status,
        String::from_utf8_lossy(&reply.body).into_owned(),
    )
}

#[tokio::test]
async fn racing_writers_on_two_replicas_lose_nothing_and_pinned_writes_get_409() {
    let Some(etcd) = Etcd::start().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    let (a, b) = (start(&certs, &etcd), start(&certs, &etcd));
    let replicas = [client(&a, &certs), client(&b, &certs)];
    for on in &replicas {
        eventually(on, LLAMAS, |r| r.status == 200).await;
    }
    let created = send(
        &replicas[0],
        "POST",
        LLAMAS,
        &fixtures::llama("racer").json(),
    )
    .await;
    assert_eq!(created.status, 201);
    let path = format!("{LLAMAS}/racer");
    let (replicas, path) = (&replicas, path.as_str());

    // 24 merge patches at once, half on each replica, each adding its own label.
    let patches = (0..24).map(|i| {
        let body = format!(r#"{{"metadata":{{"labels":{{"merge-{i}":"x"}}}}}}"#);
        patch(&replicas[i % 2], path, "application/merge-patch+json", body)
    });
    for (i, (status, body)) in join_all(patches).await.into_iter().enumerate() {
        assert_eq!(status, 200, "merge patch {i}: {body}");
    }
    // 12 server-side applies at once by 12 managers, each of its own label.
    let applies = (0..12).map(|i| {
        let config = format!(
            r#"{{"apiVersion":"farm.example.com/v1alpha","kind":"Llama","metadata":{{"name":"racer","labels":{{"apply-{i}":"x"}}}}}}"#
        );
        let path = format!("{path}?fieldManager=manager-{i}");
        async move {
            patch(&replicas[i % 2], &path, "application/apply-patch+yaml", config).await
        }
    });
    for (i, (status, body)) in join_all(applies).await.into_iter().enumerate() {
        assert_eq!(status, 200, "apply {i}: {body}");
    }
    // Every write landed: no label was lost to a race, on either replica's view.
    for on in replicas {
        let all = eventually(on, path, |r| {
            let labels = &r.json()["metadata"]["labels"];
            labels.as_object().is_some_and(|l| l.len() >= 36)
        })
        .await
        .json();
        let labels = all["metadata"]["labels"].as_object().unwrap();
        for i in 0..24 {
            assert!(labels.contains_key(&format!("merge-{i}")), "merge-{i} lost");
        }
        for i in 0..12 {
            assert!(labels.contains_key(&format!("apply-{i}")), "apply-{i} lost");
            let managers = all["metadata"]["managedFields"].to_string();
            assert!(managers.contains(&format!("manager-{i}")), "{managers}");
        }
    }

    // Eight PUTs at once, all replacing the same resourceVersion: one wins, the others get
    // kube-apiserver's 409, however their attempt lost.
    let current = replicas[0].get(path, &[]).await.json();
    let puts = (0..8).map(|i| {
        let mut object = current.clone();
        object["spec"]["weight"] = serde_json::json!(100 + i);
        let on = &replicas[i % 2];
        async move { send(on, "PUT", path, &object.to_string()).await }
    });
    let puts = join_all(puts).await;
    let won = puts.iter().filter(|r| r.status == 200).count();
    assert_eq!(won, 1, "PUTs of one resourceVersion that succeeded");
    for lost in puts.iter().filter(|r| r.status != 200) {
        assert_eq!(lost.status, 409, "{}", String::from_utf8_lossy(&lost.body));
        let status = lost.json();
        assert_eq!(status["reason"], "Conflict");
        assert_eq!(status["message"], MODIFIED);
    }

    // A delete whose resourceVersion precondition a racing patch overtook is refused; one
    // without a precondition, racing patches, deletes.
    let stale = current["metadata"]["resourceVersion"].clone();
    let precondition = serde_json::json!({"preconditions": {"resourceVersion": stale}});
    let refused = send(&replicas[1], "DELETE", path, &precondition.to_string()).await;
    assert_eq!(
        refused.status,
        409,
        "{}",
        String::from_utf8_lossy(&refused.body)
    );
    let racing = (0..8).map(|i| {
        let body = format!(r#"{{"metadata":{{"labels":{{"late-{i}":"x"}}}}}}"#);
        patch(&replicas[i % 2], path, "application/merge-patch+json", body)
    });
    let deleting = send(&replicas[0], "DELETE", path, "");
    let (patched, deleted) = futures::join!(join_all(racing), deleting);
    assert_eq!(
        deleted.status,
        200,
        "{}",
        String::from_utf8_lossy(&deleted.body)
    );
    for (status, body) in patched {
        // Before the delete, or after it (gone): never a conflict or a server error.
        assert!(status == 200 || status == 404, "{status}: {body}");
    }
    for on in replicas {
        eventually(on, path, |r| r.status == 404).await;
    }
}
