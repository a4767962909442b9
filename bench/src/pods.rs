//! Pods as kubelets and controllers leave them (a Deployment's Pod: two containers, their
//! statuses, five conditions, an owner reference, managedFields), served by the fake
//! kube-apiserver's `/api/v1/pods` in pages as kube-apiserver serves a paginated list.

use std::{
    sync::{
        Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Instant,
};

use axum::{
    body::Body,
    extract::{RawQuery, State},
    response::{IntoResponse, Response},
};
use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use serde_json::json;

/// The Pods the fake lists (each pre-rendered), and when a list last finished.
#[derive(Default)]
pub struct PodSet {
    pods: Mutex<std::sync::Arc<Vec<Bytes>>>,
    /// When the last page of a list was handed out (the upstream list has arrived).
    pub last_page: Mutex<Option<Instant>>,
    /// Watches from below this resourceVersion get 410 Expired; it is also the lists' version
    /// once set (0: the Pods' own).
    compacted: AtomicU64,
    /// Ends every open watch.
    cut: tokio::sync::Notify,
}

impl PodSet {
    /// Lists `pods` from now on.
    pub fn set(&self, pods: Vec<Bytes>) {
        if let Ok(mut held) = self.pods.lock() {
            *held = std::sync::Arc::new(pods);
        }
    }

    /// As a kube-apiserver restart over a compacted etcd: Pod `i` becomes `pod`, every open
    /// watch ends, and a watch resuming from before now gets 410 Expired, so the client relists.
    pub fn compact_with(&self, i: usize, pod: Bytes) {
        if let Ok(mut held) = self.pods.lock() {
            let mut pods = held.as_ref().clone();
            if let Some(slot) = pods.get_mut(i) {
                *slot = pod;
            }
            *held = std::sync::Arc::new(pods);
            let rv = self.version(held.len()) + 1_000_000;
            self.compacted.store(rv, Ordering::SeqCst);
        }
        self.cut.notify_waiters();
    }

    fn version(&self, count: usize) -> u64 {
        match self.compacted.load(Ordering::SeqCst) {
            0 => 1000 + count as u64,
            rv => rv,
        }
    }
}

/// Pod `i` with the label `relisted: "yes"` and a newer resourceVersion: what a relist finds
/// changed.
pub fn relabelled(i: usize) -> Bytes {
    let mut pod: serde_json::Value = serde_json::from_slice(&pod(i)).unwrap_or_default();
    pod["metadata"]["labels"]["relisted"] = json!("yes");
    pod["metadata"]["resourceVersion"] = json!("999999999");
    Bytes::from(serde_json::to_vec(&pod).unwrap_or_default())
}

/// Pod `i` of `count`, as kube-apiserver returns it: about 6 KB of JSON.
pub fn pod(i: usize) -> Bytes {
    let ns = format!("team-{}", i % 50);
    let app = format!("app-{}", i % 100);
    let hash = format!("{:010x}", (i / 10) * 2_654_435_761 % 0xff_ffff_ffff);
    let name = format!("{app}-{hash}-{:05x}", i % 0xfffff);
    let node = format!("node-{}", i % 5000);
    let ip = format!("10.{}.{}.{}", (i >> 16) & 255, (i >> 8) & 255, i & 255);
    let uid = format!(
        "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
        i,
        i % 0xffff,
        i % 0xfff,
        (i * 7) % 0xfff,
        i * 2_654_435_761
    );
    let started = "2026-11-20T08:15:30Z";
    let container = |c: usize| {
        json!({
            "name": format!("c{c}"),
            "image": format!("registry.example.com/{app}/c{c}:v1.{}", i % 10),
            "ports": [{"containerPort": 8080 + c, "protocol": "TCP", "name": "http"}],
            "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}},
                    {"name": "LOG_LEVEL", "value": "info"}],
            "resources": {"limits": {"cpu": "500m", "memory": "256Mi"}, "requests": {"cpu": "100m", "memory": "128Mi"}},
            "volumeMounts": [{"name": "kube-api-access", "readOnly": true, "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}],
            "livenessProbe": {"httpGet": {"path": "/healthz", "port": 8080 + c, "scheme": "HTTP"}, "timeoutSeconds": 1, "periodSeconds": 10, "successThreshold": 1, "failureThreshold": 3},
            "terminationMessagePath": "/dev/termination-log",
            "terminationMessagePolicy": "File",
            "imagePullPolicy": "IfNotPresent"
        })
    };
    let status = |c: usize| {
        json!({
            "name": format!("c{c}"),
            "state": {"running": {"startedAt": started}},
            "lastState": {},
            "ready": true,
            "restartCount": i % 3,
            "image": format!("registry.example.com/{app}/c{c}:v1.{}", i % 10),
            "imageID": format!("registry.example.com/{app}/c{c}@sha256:{:064x}", i * 31 + c),
            "containerID": format!("containerd://{:064x}", i * 97 + c),
            "started": true,
            "volumeMounts": [{"name": "kube-api-access", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": true, "recursiveReadOnly": "Disabled"}]
        })
    };
    let condition = |t: &str| json!({"type": t, "status": "True", "lastProbeTime": null, "lastTransitionTime": started});
    let pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "generateName": format!("{app}-{hash}-"),
            "namespace": ns,
            "uid": uid,
            "resourceVersion": (1000 + i).to_string(),
            "creationTimestamp": started,
            "labels": {"app": app, "pod-template-hash": hash},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": format!("{app}-{hash}"),
                "uid": format!("rs-{uid}"), "controller": true, "blockOwnerDeletion": true}],
            "managedFields": [
                {"manager": "kube-controller-manager", "operation": "Update", "apiVersion": "v1", "time": started,
                 "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {"f:generateName": {}, "f:labels": {".": {}, "f:app": {}, "f:pod-template-hash": {}},
                    "f:ownerReferences": {".": {}, format!("k:{{\"uid\":\"rs-{uid}\"}}"): {}}},
                    "f:spec": {"f:containers": {"k:{\"name\":\"c0\"}": {".": {}, "f:image": {}, "f:name": {}}, "k:{\"name\":\"c1\"}": {".": {}, "f:image": {}, "f:name": {}}},
                        "f:dnsPolicy": {}, "f:enableServiceLinks": {}, "f:restartPolicy": {}, "f:schedulerName": {}, "f:securityContext": {}, "f:terminationGracePeriodSeconds": {}}}},
                {"manager": "kubelet", "operation": "Update", "apiVersion": "v1", "time": started, "fieldsType": "FieldsV1", "subresource": "status",
                 "fieldsV1": {"f:status": {"f:conditions": {"k:{\"type\":\"ContainersReady\"}": {".": {}, "f:lastProbeTime": {}, "f:lastTransitionTime": {}, "f:status": {}, "f:type": {}},
                    "k:{\"type\":\"Initialized\"}": {".": {}, "f:lastProbeTime": {}, "f:lastTransitionTime": {}, "f:status": {}, "f:type": {}},
                    "k:{\"type\":\"Ready\"}": {".": {}, "f:lastProbeTime": {}, "f:lastTransitionTime": {}, "f:status": {}, "f:type": {}}},
                    "f:containerStatuses": {}, "f:hostIP": {}, "f:hostIPs": {}, "f:phase": {}, "f:podIP": {}, "f:podIPs": {".": {}, format!("k:{{\"ip\":\"{ip}\"}}"): {".": {}, "f:ip": {}}}, "f:startTime": {}}}}
            ]
        },
        "spec": {
            "volumes": [{"name": "kube-api-access", "projected": {"sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}],
                "defaultMode": 420}}],
            "containers": [container(0), container(1)],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default",
            "serviceAccount": "default",
            "nodeName": node,
            "securityContext": {},
            "schedulerName": "default-scheduler",
            "tolerations": [
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}],
            "priority": 0,
            "enableServiceLinks": true,
            "preemptionPolicy": "PreemptLowerPriority"
        },
        "status": {
            "phase": "Running",
            "conditions": [condition("PodReadyToStartContainers"), condition("Initialized"), condition("Ready"),
                condition("ContainersReady"), condition("PodScheduled")],
            "hostIP": format!("192.168.{}.{}", (i / 250) % 250, i % 250),
            "hostIPs": [{"ip": format!("192.168.{}.{}", (i / 250) % 250, i % 250)}],
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "startTime": started,
            "containerStatuses": [status(0), status(1)],
            "qosClass": "Burstable"
        }
    });
    Bytes::from(serde_json::to_vec(&pod).unwrap_or_default())
}

fn query_value<'a>(query: &'a str, name: &str) -> Option<&'a str> {
    query
        .split('&')
        .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
}

/// `/api/v1/pods`: a page of the list (`limit`, `continue` as an offset), or a watch that
/// stays open with nothing to say.
pub async fn list_or_watch(
    State(pods): State<std::sync::Arc<PodSet>>,
    RawQuery(query): RawQuery,
) -> Response {
    let query = query.unwrap_or_default();
    if query.contains("watch=true") || query.contains("watch=1") {
        let since: u64 = query_value(&query, "resourceVersion")
            .and_then(|rv| rv.parse().ok())
            .unwrap_or(0);
        let compacted = pods.compacted.load(Ordering::SeqCst);
        if since < compacted {
            let expired = json!({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1",
                "metadata": {}, "status": "Failure", "reason": "Expired", "code": 410,
                "message": format!("too old resource version: {since} ({compacted})")}});
            return (
                [("content-type", "application/json")],
                format!("{expired}\n"),
            )
                .into_response();
        }
        // Open until the Pods are compacted; nothing changes meanwhile.
        let cut = async move { pods.cut.notified().await };
        let ends = futures::stream::once(cut)
            .filter_map(|()| async { None::<Result<Bytes, std::io::Error>> });
        return (
            [("content-type", "application/json")],
            Body::from_stream(ends),
        )
            .into_response();
    }
    let set = pods;
    let pods = set.pods.lock().map(|p| p.clone()).unwrap_or_default();
    let start: usize = query_value(&query, "continue")
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
        .min(pods.len());
    let limit = query_value(&query, "limit")
        .and_then(|l| l.parse().ok())
        .filter(|l| *l > 0)
        .unwrap_or(usize::MAX);
    let end = start.saturating_add(limit).min(pods.len());
    let rv = set.version(pods.len());
    let more = end < pods.len();
    let metadata = if more {
        json!({"resourceVersion": rv.to_string(), "continue": end.to_string(),
            "remainingItemCount": pods.len() - end})
    } else {
        json!({"resourceVersion": rv.to_string()})
    };
    let mut body =
        BytesMut::with_capacity(256 + pods[start..end].iter().map(Bytes::len).sum::<usize>());
    body.extend_from_slice(b"{\"apiVersion\":\"v1\",\"kind\":\"PodList\",\"metadata\":");
    body.extend_from_slice(metadata.to_string().as_bytes());
    body.extend_from_slice(b",\"items\":[");
    for (n, pod) in pods[start..end].iter().enumerate() {
        if n > 0 {
            body.extend_from_slice(b",");
        }
        body.extend_from_slice(pod);
    }
    body.extend_from_slice(b"]}");
    if !more && let Ok(mut last) = set.last_page.lock() {
        *last = Some(Instant::now());
    }
    (
        [("content-type", "application/json")],
        Body::from(body.freeze()),
    )
        .into_response()
}
