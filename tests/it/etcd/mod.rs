//! Llamas on etcd through the shipped binary: several replicas behave as one server, Llamas
//! survive restarts, and an unreachable etcd is a 503 and not ready until it is back. Needs a
//! real etcd (see `common::etcd`).

use std::{
    path::Path,
    time::{Duration, Instant},
};

use crate::common::{Alpn, RawClient, RawResponse, etcd::Etcd, fixtures, process::Running};

const LLAMAS: &str = "/apis/farm.example.com/v1alpha/namespaces/default/llamas";

fn start(certs: &Path, etcd: &Etcd) -> Running {
    start_on(certs, &etcd.endpoint())
}

/// The server on the etcd at `servers` (comma-separated client URLs).
fn start_on(certs: &Path, servers: &str) -> Running {
    let endpoint = servers.to_owned();
    Running::start([
        "--cert-dir",
        certs.to_str().expect("utf-8 path"),
        "--standalone",
        "--storage",
        "etcd",
        "--etcd-servers",
        &endpoint,
    ])
}

fn client(server: &Running, certs: &Path) -> RawClient {
    server.admin(certs, Alpn::Http2)
}

async fn send(client: &RawClient, method: &str, path: &str, body: &str) -> RawResponse {
    let content_type = [("content-type", "application/json")];
    client
        .send(method, path, &content_type, Some(body.as_bytes().to_vec()))
        .await
}

/// Waits until `check` holds of `GET path` (the server's cache or etcd catching up).
async fn eventually(
    client: &RawClient,
    path: &str,
    check: impl Fn(&RawResponse) -> bool,
) -> RawResponse {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let reply = client.get(path, &[]).await;
        if check(&reply) {
            return reply;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "GET {path} never passed: {} {}",
            reply.status,
            String::from_utf8_lossy(&reply.body)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn two_replicas_on_one_etcd_behave_as_one_server_and_llamas_survive_restarts() {
    let Some(etcd) = Etcd::start().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    let a = start(&certs, &etcd);
    let b = start(&certs, &etcd);
    let (on_a, on_b) = (client(&a, &certs), client(&b, &certs));
    // etcd mode starts empty: no sample.
    eventually(&on_a, LLAMAS, |r| r.status == 200).await;
    assert_eq!(on_b.get(&format!("{LLAMAS}/dolly"), &[]).await.status, 404);

    let created = send(
        &on_a,
        "POST",
        LLAMAS,
        &fixtures::llama("kuzco").weight(120.0).json(),
    )
    .await;
    assert_eq!(
        created.status,
        201,
        "{}",
        String::from_utf8_lossy(&created.body)
    );
    let created = created.json();
    let rv = created["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_owned();

    // Written on A: the very next read on B sees it (consistent reads).
    let got = on_b.get(&format!("{LLAMAS}/kuzco"), &[]).await;
    assert_eq!(got.status, 200, "{}", String::from_utf8_lossy(&got.body));
    assert_eq!(got.json()["metadata"]["resourceVersion"], rv.as_str());
    let list = on_b.get(LLAMAS, &[]).await.json();
    assert_eq!(list["items"].as_array().unwrap().len(), 1);
    assert!(
        list["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .parse::<u64>()
            .unwrap()
            >= rv.parse::<u64>().unwrap()
    );

    // A watch on B from that version hears of an update made on A.
    let watch_path = format!("{LLAMAS}?watch=true&resourceVersion={rv}&timeoutSeconds=3");
    let watching = tokio::spawn({
        let on_b = client(&b, &certs);
        async move { on_b.get(&watch_path, &[]).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut updated = created.clone();
    updated["spec"]["weight"] = serde_json::json!(121.0);
    let on_a_update = send(
        &on_a,
        "PUT",
        &format!("{LLAMAS}/kuzco"),
        &updated.to_string(),
    )
    .await;
    assert_eq!(on_a_update.status, 200);
    let events = watching.await.unwrap();
    let text = String::from_utf8_lossy(&events.body);
    assert!(
        text.contains("\"MODIFIED\"") && text.contains("121"),
        "{text}"
    );

    // The same stale update on B: 409, as on one server.
    let stale = send(
        &on_b,
        "PUT",
        &format!("{LLAMAS}/kuzco"),
        &updated.to_string(),
    )
    .await;
    assert_eq!(
        stale.status,
        409,
        "{}",
        String::from_utf8_lossy(&stale.body)
    );
    assert!(
        stale.json()["message"]
            .as_str()
            .unwrap()
            .contains("the object has been modified")
    );

    // Both replicas gone and back: the Llama is still there.
    drop(a);
    drop(b);
    let a = start(&certs, &etcd);
    let on_a = client(&a, &certs);
    let back = eventually(&on_a, &format!("{LLAMAS}/kuzco"), |r| r.status == 200).await;
    assert_eq!(back.json()["spec"]["weight"], 121.0);
}

/// Read-your-writes across replicas, many times over, while another program writes keys
/// outside farm-apiserver's prefix (etcd shared with others): every write's revision moves
/// past what the watch sends, and reads still neither wait out their deadline nor answer with
/// an older version.
#[tokio::test]
async fn reads_on_one_replica_see_writes_on_another_while_foreign_keys_move_the_revision() {
    let Some(etcd) = Etcd::start().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    let a = start(&certs, &etcd);
    let b = start(&certs, &etcd);
    let (on_a, on_b) = (client(&a, &certs), client(&b, &certs));
    eventually(&on_a, LLAMAS, |r| r.status == 200).await;
    eventually(&on_b, LLAMAS, |r| r.status == 200).await;

    let foreign = etcd.client();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = tokio::spawn({
        let stop = stop.clone();
        async move {
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                foreign
                    .put(b"/someone-else/key", n.to_string().as_bytes())
                    .await
                    .expect("foreign put");
                n += 1;
            }
            n
        }
    });

    let created = send(&on_a, "POST", LLAMAS, &fixtures::llama("yzma").json()).await;
    assert_eq!(created.status, 201);
    let started = std::time::Instant::now();
    for weight in 1..=40 {
        let patched = on_a
            .send(
                "PATCH",
                &format!("{LLAMAS}/yzma"),
                &[("content-type", "application/merge-patch+json")],
                Some(format!(r#"{{"spec":{{"weight":{weight}}}}}"#).into_bytes()),
            )
            .await;
        assert_eq!(
            patched.status,
            200,
            "{}",
            String::from_utf8_lossy(&patched.body)
        );
        let rv = patched.json()["metadata"]["resourceVersion"].clone();
        let got = on_b.get(&format!("{LLAMAS}/yzma"), &[]).await;
        assert_eq!(got.status, 200, "{}", String::from_utf8_lossy(&got.body));
        assert_eq!(
            got.json()["metadata"]["resourceVersion"],
            rv,
            "write {weight}"
        );
        let list = on_b.get(LLAMAS, &[]).await.json();
        assert_eq!(list["items"][0]["spec"]["weight"], f64::from(weight));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let foreign_writes = writer.await.unwrap();
    assert!(foreign_writes > 0);
    // 120 requests: far from the 5 s a read may wait for the cache.
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
}

/// kube-apiserver's aggregator sends each request to any replica, so the pages of one list
/// land on different ones: a continue token from A works on B, at A's snapshot (a Llama deleted
/// meanwhile is still on its page), and so does an Exact list B never served; once etcd has
/// compacted that revision, the token is 410 Expired.
#[tokio::test]
async fn a_continue_token_from_one_replica_pages_on_another_at_the_same_revision() {
    let Some(etcd) = Etcd::start().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    let a = start(&certs, &etcd);
    let b = start(&certs, &etcd);
    let (on_a, on_b) = (client(&a, &certs), client(&b, &certs));
    eventually(&on_a, LLAMAS, |r| r.status == 200).await;
    eventually(&on_b, LLAMAS, |r| r.status == 200).await;
    for name in ["l1", "l2", "l3", "l4", "l5"] {
        let created = send(&on_a, "POST", LLAMAS, &fixtures::llama(name).json()).await;
        assert_eq!(created.status, 201);
    }
    let names = |page: &serde_json::Value| -> Vec<String> {
        page["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["metadata"]["name"].as_str().unwrap().to_owned())
            .collect()
    };
    let first = on_a.get(&format!("{LLAMAS}?limit=2"), &[]).await.json();
    assert_eq!(names(&first), ["l1", "l2"]);
    let rv = first["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_owned();
    let token = first["metadata"]["continue"].as_str().unwrap().to_owned();
    // Changed after the first page: the rest of the list does not show it.
    let deleted = send(&on_a, "DELETE", &format!("{LLAMAS}/l3"), "").await;
    assert_eq!(deleted.status, 200);

    let second = on_b
        .get(&format!("{LLAMAS}?limit=2&continue={token}"), &[])
        .await;
    assert_eq!(
        second.status,
        200,
        "{}",
        String::from_utf8_lossy(&second.body)
    );
    let second = second.json();
    assert_eq!(names(&second), ["l3", "l4"]);
    assert_eq!(second["metadata"]["resourceVersion"], rv.as_str());
    assert_eq!(second["metadata"]["remainingItemCount"], 1);
    let token = second["metadata"]["continue"].as_str().unwrap().to_owned();
    let third = on_a
        .get(&format!("{LLAMAS}?limit=2&continue={token}"), &[])
        .await
        .json();
    assert_eq!(names(&third), ["l5"]);
    assert!(third["metadata"].get("continue").is_none());

    // An Exact list at that revision, on a third replica that never served it.
    let c = start(&certs, &etcd);
    let on_c = client(&c, &certs);
    eventually(&on_c, LLAMAS, |r| r.status == 200).await;
    let exact = on_c
        .get(
            &format!("{LLAMAS}?resourceVersion={rv}&resourceVersionMatch=Exact"),
            &[],
        )
        .await;
    assert_eq!(
        exact.status,
        200,
        "{}",
        String::from_utf8_lossy(&exact.body)
    );
    assert_eq!(names(&exact.json()), ["l1", "l2", "l3", "l4", "l5"]);

    // etcd compacts past it: a replica without that snapshot answers 410.
    let now = etcd.client().revision(b"/").await.unwrap();
    etcd.client().compact(now).await.unwrap();
    let c_token = on_c
        .get(
            &format!(
                "{LLAMAS}?limit=2&continue={}",
                first["metadata"]["continue"].as_str().unwrap()
            ),
            &[],
        )
        .await;
    // c remembered rv's snapshot for the Exact list; a fresh replica has nothing.
    assert_eq!(c_token.status, 200);
    drop(c);
    let d = start(&certs, &etcd);
    let on_d = client(&d, &certs);
    eventually(&on_d, LLAMAS, |r| r.status == 200).await;
    let expired = on_d
        .get(
            &format!(
                "{LLAMAS}?limit=2&continue={}",
                first["metadata"]["continue"].as_str().unwrap()
            ),
            &[],
        )
        .await;
    assert_eq!(
        expired.status,
        410,
        "{}",
        String::from_utf8_lossy(&expired.body)
    );
    assert!(
        expired.json()["message"]
            .as_str()
            .unwrap()
            .starts_with("The provided continue parameter is too old")
    );
}

/// Writes start from the cache's copy (no etcd read), which may be behind a write just made
/// through another replica: the compare-and-swap catches that and the write is retried from
/// etcd, so a client that sends B what A just answered is never refused for B's lag, and no
/// write is lost.
#[tokio::test]
async fn writes_on_one_replica_right_after_writes_on_another_are_not_refused_for_its_lag() {
    let Some(etcd) = Etcd::start().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    let a = start(&certs, &etcd);
    let b = start(&certs, &etcd);
    let (on_a, on_b) = (client(&a, &certs), client(&b, &certs));
    eventually(&on_a, LLAMAS, |r| r.status == 200).await;
    eventually(&on_b, LLAMAS, |r| r.status == 200).await;
    let created = send(&on_a, "POST", LLAMAS, &fixtures::llama("kronk").json()).await;
    assert_eq!(created.status, 201);
    let path = format!("{LLAMAS}/kronk");
    for i in 1..=30 {
        let patched = on_a
            .send(
                "PATCH",
                &path,
                &[("content-type", "application/merge-patch+json")],
                Some(format!(r#"{{"spec":{{"weight":{i}}}}}"#).into_bytes()),
            )
            .await;
        assert_eq!(
            patched.status,
            200,
            "{}",
            String::from_utf8_lossy(&patched.body)
        );
        // What A answered, sent at once to B: its resourceVersion is current in etcd.
        let mut object = patched.json();
        object["spec"]["height"] = serde_json::json!(f64::from(i) / 10.0);
        let put = send(&on_b, "PUT", &path, &object.to_string()).await;
        assert_eq!(
            put.status,
            200,
            "write {i}: {}",
            String::from_utf8_lossy(&put.body)
        );
        let put = put.json();
        assert_eq!(put["spec"]["weight"], f64::from(i));
        // And a merge patch on B right after a PUT on A.
        let mut again = put.clone();
        again["spec"]["weight"] = serde_json::json!(f64::from(i) + 0.5);
        let on_a_put = send(&on_a, "PUT", &path, &again.to_string()).await;
        assert_eq!(on_a_put.status, 200);
        let patched_b = on_b
            .send(
                "PATCH",
                &path,
                &[("content-type", "application/merge-patch+json")],
                Some(br#"{"metadata":{"labels":{"seen":"b"}}}"#.to_vec()),
            )
            .await;
        assert_eq!(patched_b.status, 200);
        assert_eq!(
            patched_b.json()["spec"]["weight"],
            f64::from(i) + 0.5,
            "B's patch kept A's write"
        );
    }
}

mod failures;
mod races;
