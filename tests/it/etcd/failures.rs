//! An unreachable etcd, a killed server, compaction, a lost member, TLS, and the store's own
//! tasks and checks.

use super::*;

#[tokio::test]
async fn an_unreachable_etcd_is_503_and_not_ready_then_the_server_recovers() {
    let Some(mut etcd) = Etcd::start().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    let server = start(&certs, &etcd);
    let api = client(&server, &certs);
    eventually(&api, LLAMAS, |r| r.status == 200).await;
    let created = send(&api, "POST", LLAMAS, &fixtures::llama("kept").json()).await;
    assert_eq!(created.status, 201);

    etcd.kill();
    let down = eventually(&api, LLAMAS, |r| r.status == 503).await;
    assert_eq!(down.json()["reason"], "ServiceUnavailable");
    let said = down.json()["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert_eq!(said.matches("etcd is unavailable").count(), 1, "{said}");
    let write = send(&api, "POST", LLAMAS, &fixtures::llama("lost").json()).await;
    assert_eq!(
        write.status,
        503,
        "{}",
        String::from_utf8_lossy(&write.body)
    );
    // The cause, and a write that never reached etcd is not one that "may have been applied".
    let said = write.json()["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(said.to_lowercase().contains("refused"), "{said}");
    assert!(!said.contains("may or may not"), "{said}");
    let readyz = api.get("/readyz?verbose", &[]).await;
    assert_ne!(readyz.status, 200);
    assert!(
        String::from_utf8_lossy(&readyz.body).contains("etcd"),
        "{}",
        String::from_utf8_lossy(&readyz.body)
    );

    etcd.restart().await;
    let back = eventually(&api, &format!("{LLAMAS}/kept"), |r| r.status == 200).await;
    assert_eq!(back.json()["metadata"]["name"], "kept");
    assert_eq!(
        api.get(&format!("{LLAMAS}/lost"), &[]).await.status,
        404,
        "a refused write left nothing"
    );
    eventually(&api, "/readyz", |r| r.status == 200).await;
}

#[tokio::test]
async fn a_server_killed_during_writes_loses_no_acknowledged_llama() {
    let Some(etcd) = Etcd::start().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    let mut server = start(&certs, &etcd);
    let api = client(&server, &certs);
    eventually(&api, LLAMAS, |r| r.status == 200).await;
    let mut acknowledged = Vec::new();
    for i in 0..20 {
        let name = format!("before-{i}");
        let reply = send(&api, "POST", LLAMAS, &fixtures::llama(&name).json()).await;
        assert_eq!(reply.status, 201);
        acknowledged.push(name);
    }
    // Writes in flight when the process dies (SIGKILL: no shutdown of any kind).
    let in_flight: Vec<_> = (0..20)
        .map(|i| {
            let api = client(&server, &certs);
            tokio::spawn(async move {
                let name = format!("during-{i}");
                let reply = send(&api, "POST", LLAMAS, &fixtures::llama(&name).json()).await;
                (reply.status == 201).then_some(name)
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(5)).await;
    server.child.kill().expect("SIGKILL");
    for write in in_flight {
        // A write that lost its connection panicked its task: not acknowledged.
        if let Ok(Some(name)) = write.await {
            acknowledged.push(name);
        }
    }
    drop(server);

    let server = start(&certs, &etcd);
    let api = client(&server, &certs);
    let list = eventually(&api, LLAMAS, |r| r.status == 200).await.json();
    let stored: Vec<&str> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap())
        .collect();
    for name in &acknowledged {
        assert!(
            stored.contains(&name.as_str()),
            "{name} was acknowledged and is gone"
        );
    }
}

#[tokio::test]
async fn compacted_history_is_410_and_the_cache_relists_past_a_compaction() {
    let Some(mut etcd) = Etcd::start().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    let server = start(&certs, &etcd);
    let api = client(&server, &certs);
    eventually(&api, LLAMAS, |r| r.status == 200).await;
    let first = send(&api, "POST", LLAMAS, &fixtures::llama("old").json())
        .await
        .json();
    let old_rv = first["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_owned();
    for weight in [2.0, 3.0, 4.0] {
        let current = api.get(&format!("{LLAMAS}/old"), &[]).await.json();
        let mut next = current.clone();
        next["spec"]["weight"] = serde_json::json!(weight);
        assert_eq!(
            send(&api, "PUT", &format!("{LLAMAS}/old"), &next.to_string())
                .await
                .status,
            200
        );
    }

    // The watch is lost (etcd down); while it is, history is written and compacted away.
    etcd.kill();
    eventually(&api, LLAMAS, |r| r.status == 503).await;
    etcd.restart().await;
    let writer = etcd.client();
    let key = b"/farm.example.com/llamas/default/fresh";
    let value = fixtures::llama("fresh").namespace("default").json();
    let put = writer
        .txn(
            key,
            aggregated_apiserver::store::etcd::client::Compare::Absent,
            Some(value.as_bytes()),
        )
        .await
        .expect("put");
    writer.compact(put.revision).await.expect("compact");
    // The cache cannot resume from where it was: it lists again, and serves what etcd holds.
    eventually(&api, &format!("{LLAMAS}/fresh"), |r| r.status == 200).await;
    let old = api.get(&format!("{LLAMAS}/old"), &[]).await.json();
    assert_eq!(old["spec"]["weight"], 4.0);

    // A restarted server remembers nothing before its start: a watch or an exact list from
    // the old version is 410 Expired, and the client relists.
    drop(server);
    let server = start(&certs, &etcd);
    let api = client(&server, &certs);
    eventually(&api, LLAMAS, |r| r.status == 200).await;
    let watch = api
        .get(
            &format!("{LLAMAS}?watch=true&resourceVersion={old_rv}&timeoutSeconds=2"),
            &[],
        )
        .await;
    let text = String::from_utf8_lossy(&watch.body);
    assert!(text.contains("\"ERROR\"") && text.contains("410"), "{text}");
    let exact = api
        .get(
            &format!("{LLAMAS}?resourceVersion={old_rv}&resourceVersionMatch=Exact"),
            &[],
        )
        .await;
    assert_eq!(
        exact.status,
        410,
        "{}",
        String::from_utf8_lossy(&exact.body)
    );
}

#[tokio::test]
async fn a_three_member_etcd_losing_a_member_during_writes_loses_nothing_acknowledged() {
    let Some(mut cluster) = crate::common::etcd::EtcdCluster::start(3).await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    let server = start_on(&certs, &cluster.endpoints().join(","));
    let api = client(&server, &certs);
    eventually(&api, LLAMAS, |r| r.status == 200).await;
    let mut acknowledged = Vec::new();
    let mut refused = 0;
    for i in 0..60 {
        if i == 20 {
            // The member the server talks to first goes away mid-stream.
            cluster.members[0].kill();
        }
        let name = format!("llama-{i}");
        // As a client does: retry a 503 (etcd electing a leader, the server failing over).
        for _ in 0..50 {
            let reply = send(&api, "POST", LLAMAS, &fixtures::llama(&name).json()).await;
            match reply.status {
                201 => {
                    acknowledged.push(name.clone());
                    break;
                }
                // Written before the answer was lost, then retried: it is there.
                409 => {
                    acknowledged.push(name.clone());
                    break;
                }
                503 => {
                    refused += 1;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                other => panic!(
                    "create {name}: {other} {}",
                    String::from_utf8_lossy(&reply.body)
                ),
            }
        }
    }
    assert_eq!(
        acknowledged.len(),
        60,
        "every write went through in the end ({refused} retries)"
    );
    let list = eventually(&api, LLAMAS, |r| r.status == 200).await.json();
    let stored: Vec<&str> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap())
        .collect();
    for name in &acknowledged {
        assert!(
            stored.contains(&name.as_str()),
            "{name} was acknowledged and is gone"
        );
    }
    eventually(&api, "/readyz", |r| r.status == 200).await;
}

#[tokio::test]
async fn etcd_over_tls_with_a_client_certificate() {
    let Some(etcd) = Etcd::start_tls().await else {
        return;
    };
    let files = etcd.tls_files();
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    let flag = |name: &str, path: &Path| format!("--etcd-{name}={}", path.display());
    let with_cert = Running::start([
        "--cert-dir".to_owned(),
        certs.display().to_string(),
        "--standalone".into(),
        "--storage=etcd".into(),
        format!("--etcd-servers={}", etcd.endpoint()),
        flag("cafile", &files.ca),
        flag("certfile", &files.cert),
        flag("keyfile", &files.key),
    ]);
    let api = client(&with_cert, &certs);
    eventually(&api, LLAMAS, |r| r.status == 200).await;
    let created = send(&api, "POST", LLAMAS, &fixtures::llama("secure").json()).await;
    assert_eq!(
        created.status,
        201,
        "{}",
        String::from_utf8_lossy(&created.body)
    );
    assert_eq!(api.get(&format!("{LLAMAS}/secure"), &[]).await.status, 200);

    // Without a client certificate etcd refuses the server: not ready, 503.
    let without = Running::start([
        "--cert-dir".to_owned(),
        certs.display().to_string(),
        "--standalone".into(),
        "--storage=etcd".into(),
        format!("--etcd-servers={}", etcd.endpoint()),
        flag("cafile", &files.ca),
    ]);
    let refused = client(&without, &certs);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(refused.get(LLAMAS, &[]).await.status, 503);
    assert_ne!(refused.get("/readyz", &[]).await.status, 200);
}

/// etcd's count of open watchers (its `etcd_debugging_mvcc_watcher_total` gauge).
pub(super) async fn etcd_watchers(etcd: &Etcd) -> f64 {
    let text = reqwest_free_get(&format!("{}/metrics", etcd.endpoint())).await;
    text.lines()
        .find(|l| l.starts_with("etcd_debugging_mvcc_watcher_total "))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0.0)
}

/// A plain HTTP GET of `url` on loopback (etcd's metrics), its body.
pub(super) async fn reqwest_free_get(url: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url.trim_start_matches("http://");
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    let mut stream = tokio::net::TcpStream::connect(host).await.unwrap();
    stream
        .write_all(format!("GET /{path} HTTP/1.0\r\nHost: {host}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut body = String::new();
    stream.read_to_string(&mut body).await.unwrap();
    body
}

/// A store's tasks end with it: once the last handle on an etcd store is dropped, its feed
/// closes its etcd watch (seen in etcd's own gauge of watchers) within seconds.
#[tokio::test]
async fn dropping_an_etcd_store_ends_its_tasks() {
    let Some(etcd) = Etcd::start().await else {
        return;
    };
    let before = etcd_watchers(&etcd).await;
    let store =
        aggregated_apiserver::store::etcd::EtcdStore::<farm_apiserver::resources::Llama>::start(
            etcd.client(),
            "/farm.example.com/",
        );
    use aggregated_apiserver::store::Store;
    let deadline = Instant::now() + Duration::from_secs(10);
    while store.check_ready().is_err() || etcd_watchers(&etcd).await <= before {
        assert!(Instant::now() < deadline, "the store never watched");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(store);
    let deadline = Instant::now() + Duration::from_secs(5);
    while etcd_watchers(&etcd).await > before {
        assert!(
            Instant::now() < deadline,
            "the store's watch is still open 5 s after the store was dropped"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Consistent reads share etcd checks, and a check wakes only the reads it answers: with etcd
/// paused, one read's check is out; reads arriving meanwhile cannot use it (it started before
/// them) and all share the next one. Two etcd reads in all for 41 consistent reads, and each
/// waiting read is polled twice (when it asks, when its own check is answered), not woken
/// again by the check before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consistent_reads_share_checks_and_wake_only_when_answered() {
    use aggregated_apiserver::{resource::ObjectKey, store::Store};
    use std::sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    };
    let Some(etcd) = Etcd::start().await else {
        return;
    };
    let store =
        aggregated_apiserver::store::etcd::EtcdStore::<farm_apiserver::resources::Llama>::start(
            etcd.client(),
            "/farm.example.com/",
        );
    let deadline = Instant::now() + Duration::from_secs(10);
    while store.check_ready().is_err() {
        assert!(Instant::now() < deadline, "the store never synced");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A read that polls its future and counts the polls.
    let read = |polls: Arc<AtomicUsize>| {
        let store = store.clone();
        tokio::spawn(async move {
            let key = ObjectKey::new("default", "nobody");
            let mut get = store.get(&key);
            std::future::poll_fn(|cx| {
                polls.fetch_add(1, Ordering::SeqCst);
                get.as_mut().poll(cx)
            })
            .await
        })
    };
    let ranges_before = etcd_ranges(&etcd).await;
    etcd.pause();
    let first = read(Arc::new(AtomicUsize::new(0)));
    // Time for the task to take the first read's round and send its check (not observable).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let polls: Vec<_> = (0..40).map(|_| Arc::new(AtomicUsize::new(0))).collect();
    let waiting: Vec<_> = polls.iter().map(|p| read(p.clone())).collect();
    // A read joins its round at its first poll.
    let deadline = Instant::now() + Duration::from_secs(10);
    while polls.iter().any(|p| p.load(Ordering::SeqCst) == 0) {
        assert!(Instant::now() < deadline, "the reads were never polled");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    etcd.resume();
    let found = first.await.unwrap();
    assert!(
        matches!(found, Err(aggregated_apiserver::error::Error::NotFound(_))),
        "{found:?}"
    );
    for read in waiting {
        let found = read.await.unwrap();
        assert!(
            matches!(found, Err(aggregated_apiserver::error::Error::NotFound(_))),
            "{found:?}"
        );
    }
    let polled: Vec<usize> = polls.iter().map(|p| p.load(Ordering::SeqCst)).collect();
    // Woken by the first check, every read would be polled three times. One read in forty
    // is, now and then, polled once more by the runtime itself (seen at 26a279e too, about
    // one run in eight, more under a loaded machine): a few such reads are no regression.
    let extra = polled.iter().filter(|&&n| n != 2).count();
    assert!(
        polled.iter().all(|&n| n == 2 || n == 3) && extra <= 2,
        "each read waiting for the second check should be polled twice: {polled:?}"
    );
    assert_eq!(
        etcd_ranges(&etcd).await - ranges_before,
        2.0,
        "41 consistent reads should take two etcd checks"
    );
}

/// etcd's count of the KV/Range calls it has started.
pub(super) async fn etcd_ranges(etcd: &Etcd) -> f64 {
    let text = reqwest_free_get(&format!("{}/metrics", etcd.endpoint())).await;
    text.lines()
        .find(|l| l.starts_with("grpc_server_started_total") && l.contains("grpc_method=\"Range\""))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0.0)
}
