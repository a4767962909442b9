//! Scenario 9, soak: `clients` clients create, update, patch, get, list and delete Llamas of
//! their own for `seconds`, while `watchers` watch the namespace. Every acknowledged write must be
//! what a later read and every watcher show; the server's memory must stay flat after warm-up.

use std::{
    collections::BTreeMap,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::Result;
use bytes::Bytes;
use http_body_util::BodyExt;
use serde_json::{Value, json};

use crate::{
    client::{Conn, Proto, Target},
    procfs,
};

const LLAMAS: &str = "/apis/farm.example.com/v1alpha/namespaces/soak/llamas";
/// Live Llamas each client keeps at most.
const LIVE: usize = 40;

#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct Soak {
    pub requests: u64,
    /// Replies other than the one the operation calls for (or no reply).
    pub errors: u64,
    /// Acknowledged writes a later read did not show.
    pub lost_writes: u64,
    /// Objects whose last watch event, at some watcher, is not their final state.
    pub watcher_mismatches: u64,
    pub rss_start_mib: f64,
    pub rss_warm_mib: f64,
    pub rss_peak_mib: f64,
    pub rss_end_mib: f64,
}

/// A small xorshift: the operations' mix, reproducible per client.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// What a client knows it wrote: name → (resourceVersion, weight), None once deleted.
type Model = BTreeMap<String, Option<(String, f64)>>;

fn llama(name: &str, client: usize, weight: f64, rv: Option<&str>) -> Bytes {
    let mut metadata = json!({"name": name, "labels": {"client": format!("c{client}")}});
    if let Some(rv) = rv {
        metadata["resourceVersion"] = json!(rv);
    }
    Bytes::from(
        json!({"apiVersion": "farm.example.com/v1alpha", "kind": "Llama",
            "metadata": metadata, "spec": {"weight": weight, "height": 1.0}})
        .to_string(),
    )
}

fn rv_and_weight(body: &[u8]) -> Option<(String, f64)> {
    let v: Value = serde_json::from_slice(body).ok()?;
    Some((
        v["metadata"]["resourceVersion"].as_str()?.to_owned(),
        v["spec"]["weight"].as_f64()?,
    ))
}

struct Counts {
    requests: AtomicU64,
    errors: AtomicU64,
    lost: AtomicU64,
}

/// One client's loop until `end`; returns what it wrote.
async fn client(mut conn: Conn, id: usize, end: Instant, counts: Arc<Counts>) -> Model {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (id as u64 + 1));
    let mut model = Model::new();
    let mut next = 0usize;
    let json = [("content-type", "application/json")];
    while Instant::now() < end {
        let live: Vec<String> = model
            .iter()
            .filter(|(_, v)| v.is_some())
            .map(|(k, _)| k.clone())
            .collect();
        let pick = |rng: &mut Rng| live[rng.below(live.len())].clone();
        let weight = 1.0 + rng.below(10_000) as f64 / 7.0;
        let op = if live.is_empty() { 0 } else { rng.below(10) };
        counts.requests.fetch_add(1, Ordering::Relaxed);
        let ok = match op {
            // create
            0 | 1 if live.len() < LIVE => {
                let name = format!("c{id}-{next}");
                next += 1;
                match conn
                    .send("POST", LLAMAS, &json, llama(&name, id, weight, None))
                    .await
                {
                    Ok(r) if r.status == 201 => {
                        model.insert(name, rv_and_weight(&r.body));
                        true
                    }
                    _ => false,
                }
            }
            // update (PUT with the resourceVersion last seen)
            2 => {
                let name = pick(&mut rng);
                let rv = model[&name].as_ref().map(|(rv, _)| rv.clone());
                let uri = format!("{LLAMAS}/{name}");
                match conn
                    .send("PUT", &uri, &json, llama(&name, id, weight, rv.as_deref()))
                    .await
                {
                    Ok(r) if r.status == 200 => {
                        model.insert(name, rv_and_weight(&r.body));
                        true
                    }
                    _ => false,
                }
            }
            // merge patch
            3 | 4 => {
                let name = pick(&mut rng);
                let body = Bytes::from(json!({"spec": {"weight": weight}}).to_string());
                let uri = format!("{LLAMAS}/{name}");
                match conn
                    .send(
                        "PATCH",
                        &uri,
                        &[("content-type", "application/merge-patch+json")],
                        body,
                    )
                    .await
                {
                    Ok(r) if r.status == 200 => {
                        model.insert(name, rv_and_weight(&r.body));
                        true
                    }
                    _ => false,
                }
            }
            // delete
            5 => {
                let name = pick(&mut rng);
                match conn
                    .send("DELETE", &format!("{LLAMAS}/{name}"), &[], Bytes::new())
                    .await
                {
                    Ok(r) if r.status == 200 => {
                        model.insert(name, None);
                        true
                    }
                    _ => false,
                }
            }
            // list this client's Llamas: every acknowledged write is there
            6 => match conn
                .get(&format!("{LLAMAS}?labelSelector=client%3Dc{id}"), &[])
                .await
            {
                Ok(r) if r.status == 200 => {
                    let list: Value = serde_json::from_slice(&r.body).unwrap_or_default();
                    let seen: BTreeMap<String, f64> = list["items"]
                        .as_array()
                        .map(|items| {
                            items
                                .iter()
                                .filter_map(|i| {
                                    Some((
                                        i["metadata"]["name"].as_str()?.to_owned(),
                                        i["spec"]["weight"].as_f64()?,
                                    ))
                                })
                                .collect()
                        })
                        .unwrap_or_default();
                    let expected: BTreeMap<String, f64> = model
                        .iter()
                        .filter_map(|(k, v)| v.as_ref().map(|(_, w)| (k.clone(), *w)))
                        .collect();
                    if seen != expected {
                        counts.lost.fetch_add(1, Ordering::Relaxed);
                    }
                    true
                }
                _ => false,
            },
            // get one: the last acknowledged write
            _ => {
                let name = pick(&mut rng);
                match conn.get(&format!("{LLAMAS}/{name}"), &[]).await {
                    Ok(r) if r.status == 200 => {
                        let got = rv_and_weight(&r.body).map(|(_, w)| w);
                        if got != model[&name].as_ref().map(|(_, w)| *w) {
                            counts.lost.fetch_add(1, Ordering::Relaxed);
                        }
                        true
                    }
                    _ => false,
                }
            }
        };
        if !ok {
            counts.errors.fetch_add(1, Ordering::Relaxed);
        }
    }
    model
}

/// name → (last event type, weight) as one watcher saw them.
type Seen = BTreeMap<String, (String, f64)>;

async fn watcher(mut conn: Conn, from: String, stop: Arc<AtomicBool>) -> Result<Seen> {
    let response = conn
        .start(
            "GET",
            &format!("{LLAMAS}?watch=true&resourceVersion={from}&timeoutSeconds=3600"),
            &[],
            Bytes::new(),
        )
        .await?;
    anyhow::ensure!(response.status() == 200, "watch: {}", response.status());
    let mut body = response.into_body();
    let mut seen = Seen::new();
    let mut pending = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let frame = match tokio::time::timeout(Duration::from_millis(200), body.frame()).await {
            Err(_) => continue,
            Ok(None) => break,
            Ok(Some(frame)) => frame?,
        };
        let Some(data) = frame.data_ref() else {
            continue;
        };
        pending.extend_from_slice(data);
        while let Some(end) = pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = pending.drain(..=end).collect();
            let Ok(event) = serde_json::from_slice::<Value>(&line) else {
                continue;
            };
            let (Some(kind), Some(name)) = (
                event["type"].as_str(),
                event["object"]["metadata"]["name"].as_str(),
            ) else {
                continue;
            };
            let weight = event["object"]["spec"]["weight"]
                .as_f64()
                .unwrap_or(f64::NAN);
            seen.insert(name.to_owned(), (kind.to_owned(), weight));
        }
    }
    Ok(seen)
}

fn mib(pid: u32) -> f64 {
    procfs::rss_bytes(pid).map_or(f64::NAN, |b| b as f64 / (1024.0 * 1024.0))
}

pub async fn run(
    t: &Target,
    pid: u32,
    seconds: f64,
    clients: usize,
    watchers: usize,
) -> Result<Soak> {
    let mut result = Soak {
        rss_start_mib: mib(pid),
        ..Default::default()
    };
    let mut conn = t.connect(Proto::H2).await?;
    let list = conn.get(LLAMAS, &[]).await?;
    anyhow::ensure!(list.status == 200, "list: {}", list.status);
    let from = serde_json::from_slice::<Value>(&list.body)?["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or("0")
        .to_owned();
    let stop = Arc::new(AtomicBool::new(false));
    let mut watches = Vec::new();
    for _ in 0..watchers {
        let conn = t.connect(Proto::H1).await?;
        watches.push(tokio::spawn(watcher(conn, from.clone(), stop.clone())));
    }
    let counts = Arc::new(Counts {
        requests: AtomicU64::new(0),
        errors: AtomicU64::new(0),
        lost: AtomicU64::new(0),
    });
    let started = Instant::now();
    let end = started + Duration::from_secs_f64(seconds);
    let mut tasks = Vec::new();
    for id in 0..clients {
        let conn = t
            .connect(if id % 2 == 0 { Proto::H2 } else { Proto::H1 })
            .await?;
        tasks.push(tokio::spawn(client(conn, id, end, counts.clone())));
    }
    // RSS during the run: the peak, and where it stands after a quarter (warm-up).
    let warm_at = started + Duration::from_secs_f64(seconds / 4.0);
    let mut warm_taken = false;
    while Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = mib(pid);
        result.rss_peak_mib = result.rss_peak_mib.max(now);
        if !warm_taken && Instant::now() >= warm_at {
            result.rss_warm_mib = now;
            warm_taken = true;
        }
    }
    let mut models = Vec::new();
    for task in tasks {
        models.push(task.await?);
    }
    // Every acknowledged write, read back; then what every watcher saw.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut expected: BTreeMap<String, Option<f64>> = BTreeMap::new();
    for model in &models {
        for (name, state) in model {
            let reply = conn.get(&format!("{LLAMAS}/{name}"), &[]).await?;
            let shown = match reply.status {
                200 => rv_and_weight(&reply.body).map(|(_, w)| w),
                _ => None,
            };
            let wanted = state.as_ref().map(|(_, w)| *w);
            if shown != wanted || (wanted.is_none() && reply.status != 404) {
                result.lost_writes += 1;
            }
            expected.insert(name.clone(), wanted);
        }
    }
    stop.store(true, Ordering::Relaxed);
    for watch in watches {
        let seen = watch.await??;
        for (name, wanted) in &expected {
            let ok = match (seen.get(name), wanted) {
                (Some((kind, _)), None) => kind == "DELETED",
                (Some((kind, weight)), Some(w)) => kind != "DELETED" && weight == w,
                (None, _) => false,
            };
            if !ok {
                result.watcher_mismatches += 1;
            }
        }
    }
    result.requests = counts.requests.load(Ordering::Relaxed);
    result.errors = counts.errors.load(Ordering::Relaxed);
    result.lost_writes += counts.lost.load(Ordering::Relaxed);
    result.rss_end_mib = mib(pid);
    Ok(result)
}
