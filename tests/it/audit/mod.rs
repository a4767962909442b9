//! The audit log (#31, and #28's audit annotations): a policy file's rules, `audit.k8s.io/v1`
//! events in a log file written by the server's real TLS listener path, the `Audit-ID` a
//! request brings kept (kube-apiserver's aggregator sends its own), admission's annotations,
//! and a full buffer that never holds a request.

use crate::common;

use std::{path::Path, sync::Arc, time::Duration};

use aggregated_apiserver::audit::{Auditor, Mode, Policy, log};
use common::{Alpn, Options, TestServer, fake_kube::FakeKube};
use serde_json::{Value, json};

const LLAMAS: &str = "/apis/farm.example.com/v1alpha/namespaces/default/llamas";

const POLICY: &str = r#"
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: []
rules:
- level: None
  nonResourceURLs: ["/version"]
- level: RequestResponse
  verbs: ["create"]
  omitManagedFields: true
- level: Request
  verbs: ["patch"]
- level: Metadata
"#;

/// An auditor of `policy` writing to `path`.
pub(crate) fn auditor(policy: &str, path: &Path) -> Arc<Auditor> {
    let sink = log::start(
        log::LogOptions {
            path: path.to_owned(),
            max_age_days: 0,
            max_backups: 0,
            max_size_mb: 0,
        },
        100,
    )
    .unwrap();
    Auditor::new(Policy::parse(policy).unwrap(), sink, Mode::Blocking)
}

/// The events written so far for `id` (waiting up to 5 s for `count` of them).
pub(crate) async fn events(path: &Path, id: &str, count: usize) -> Vec<Value> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        // Complete lines only (the writer may be in the middle of one).
        let complete = &text[..text.rfind('\n').map_or(0, |end| end + 1)];
        let found: Vec<Value> = complete
            .lines()
            .map(|line| serde_json::from_str::<Value>(line).expect("one JSON event per line"))
            .filter(|event| event["auditID"] == id)
            .collect();
        if found.len() >= count || tokio::time::Instant::now() > deadline {
            return found;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub(crate) fn stages(events: &[Value]) -> Vec<&str> {
    events
        .iter()
        .map(|e| e["stage"].as_str().unwrap())
        .collect()
}

mod backends;
mod log_events;
