//! Request bodies: read within kube-apiserver's size bound, nesting bounded as Go's decoder
//! bounds it, and the work on a large or deep body kept off the async workers.
//!
//! Contract: a JSON value nested deeper than [`SHALLOW`] exists only inside [`Work::run`],
//! which gives it a stack large enough for [`MAX_DEPTH`] levels of serde's recursion and drops
//! what it built there; nothing deeper than [`MAX_DEPTH`] is ever built (JSON patches are
//! checked after every operation). What leaves the work is a decoded object, whose only
//! free-form value (a managed fields entry's `fieldsV1`) is held to [`SHALLOW`].

use std::sync::Arc;

use axum::body::{Body, Bytes};
use serde_json::Value;
use tokio::sync::Semaphore;

use crate::error::{Error, Result};
pub(crate) use crate::json_patch::depth::{
    MAX_DEPTH, SHALLOW, text_depth, too_deep_bracket, too_deep_message, value_depth,
};

/// Bodies up to this size that are no deeper than [`SHALLOW`] are worked on in place: their
/// parsing takes microseconds.
const SMALL_BODY: usize = 64 * 1024;

/// The stack [`Work::run`] gives a deep body: [`MAX_DEPTH`] levels of serde's recursion,
/// which takes up to 4 KiB a level reading YAML in release builds (serde-saphyr), and up to
/// 30 KiB in debug builds. Pages are touched only as deep as a body goes.
const DEEP_STACK: usize = if cfg!(debug_assertions) {
    400 * 1024 * 1024
} else {
    96 * 1024 * 1024
};

/// kube-apiserver's `--max-request-body-bytes` default for JSON bodies (3 MiB).
pub const MAX_BODY_BYTES: usize = 3 * 1024 * 1024;

/// The whole body, up to [`MAX_BODY_BYTES`] (413 past it, as kube-apiserver).
pub(crate) async fn read(body: Body) -> Result<Bytes> {
    use http_body_util::BodyExt;
    match http_body_util::Limited::new(body, MAX_BODY_BYTES)
        .collect()
        .await
    {
        Ok(collected) => {
            let bytes = collected.to_bytes();
            crate::audit::request_body(&bytes);
            Ok(bytes)
        }
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(Error::RequestEntityTooLarge(
            format!("limit is {MAX_BODY_BYTES}"),
        )),
        Err(e) => Err(Error::BadRequest(format!(
            "failed to read the request body: {e}"
        ))),
    }
}

/// Drops `value` without recursion (serde_json's `Value` drops recursively).
pub fn drop_flat(value: Value) {
    let mut stack = vec![value];
    while let Some(value) = stack.pop() {
        match value {
            Value::Array(items) => stack.extend(items),
            Value::Object(map) => stack.extend(map.into_iter().map(|(_, v)| v)),
            _ => {}
        }
    }
}

/// A value that may be deep, dropped without recursion.
pub struct Deep(pub Value);

impl Drop for Deep {
    fn drop(&mut self) {
        drop_flat(std::mem::take(&mut self.0));
    }
}

/// Parses a JSON body into a value, refusing one nested deeper than [`MAX_DEPTH`] before
/// parsing it. Call inside [`Work::run`] unless the body is shallow.
pub fn parse_json(body: &[u8]) -> std::result::Result<Deep, String> {
    if text_depth(body, MAX_DEPTH) > MAX_DEPTH {
        return Err(too_deep_message());
    }
    let mut deserializer = serde_json::Deserializer::from_slice(body);
    deserializer.disable_recursion_limit();
    let value = serde::Deserialize::deserialize(&mut deserializer).map_err(|e| e.to_string())?;
    let value = Deep(value);
    deserializer.end().map_err(|e| e.to_string())?;
    Ok(value)
}

/// go-yaml's refusal of a document nested deeper than [`MAX_DEPTH`].
pub const YAML_TOO_DEEP: &str = "yaml: exceeded max depth of 10000";

/// Parses a YAML body into a value with serde-saphyr, under its budgets: at most
/// [`MAX_DEPTH`] levels (go-yaml's bound, refused before parsing for flow collections, as
/// go-yaml's `max_flow_level`), and at most `MAX_YAML_VALUES` values, or 4 per byte sent,
/// aliases expanded included (go-yaml's "excessive aliasing"). A key given twice keeps its
/// last value, as a JSON object decoded by Go does.
pub fn parse_yaml(body: &[u8]) -> std::result::Result<Deep, String> {
    if text_depth(body, MAX_DEPTH) > MAX_DEPTH {
        return Err(YAML_TOO_DEEP.to_owned());
    }
    let values = MAX_YAML_VALUES.min(body.len().saturating_mul(4) + 64);
    let mut aliases = serde_saphyr::options::AliasLimits::default();
    aliases.max_total_replayed_events = values;
    let options = serde_saphyr::options! {
        budget: serde_saphyr::budget! {
            max_depth: MAX_DEPTH,
            flow_nesting_limit: MAX_DEPTH,
            max_nodes: values,
            max_events: values.saturating_mul(2),
        },
        alias_limits: aliases,
        duplicate_keys: serde_saphyr::options::DuplicateKeyPolicy::LastWins,
    };
    serde_saphyr::from_slice_with_options::<Value>(body, options)
        .map(Deep)
        .map_err(|e| {
            let message = e.to_string();
            if message.contains("depth") {
                YAML_TOO_DEEP.to_owned()
            } else if message.contains("alias") || message.contains("budget") {
                "document contains excessive aliasing".to_owned()
            } else {
                message
            }
        })
}

/// At most this many values (scalars, lists, maps) in one YAML body.
pub(crate) const MAX_YAML_VALUES: usize = 1 << 20;

/// Where the work on request bodies runs: in place for small, shallow bodies; otherwise on
/// the blocking pool with a deep stack, a few at a time, so that parsing, patching or
/// applying a large body holds no async worker, and a request timeout answers 504 while it
/// runs.
#[derive(Clone)]
pub struct Work {
    slots: Arc<Semaphore>,
}

impl Default for Work {
    /// As many bodies at once as the machine has cores.
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(2, usize::from);
        Self {
            slots: Arc::new(Semaphore::new(cores)),
        }
    }
}

impl Work {
    /// Whether work on `body` leaves the async workers: any body larger than a small one, or
    /// nested deeper than [`SHALLOW`].
    pub fn is_heavy(body: &[u8]) -> bool {
        body.len() > SMALL_BODY || text_depth(body, SHALLOW) > SHALLOW
    }

    /// Runs `work` on `body`: in place when the body is small and shallow, else off the async
    /// workers on a stack deep enough for [`MAX_DEPTH`].
    pub async fn run<T, F>(&self, body: &Bytes, work: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(Bytes) -> Result<T> + Send + 'static,
    {
        let body = body.clone();
        self.run_if(Self::is_heavy(&body), move || work(body)).await
    }

    /// Runs `work` off the async workers on a deep stack when `heavy`, else in place.
    pub async fn run_if<T, F>(&self, heavy: bool, work: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce() -> Result<T> + Send + 'static,
    {
        if !heavy {
            return work();
        }
        let permit = self
            .slots
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| Error::Internal("the body workers are closed".into()))?;
        let task = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            stacker::grow(DEEP_STACK, work)
        });
        match task.await {
            Ok(result) => result,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => Err(Error::Internal(format!("body work did not finish: {e}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nested(depth: usize) -> String {
        format!("{}1{}", "[".repeat(depth), "]".repeat(depth))
    }

    #[test]
    fn text_depth_counts_brackets_outside_strings() {
        assert_eq!(text_depth(b"1", 10), 0);
        assert_eq!(text_depth(br#"{"a":[1,{"b":"[[[["}]}"#, 10), 3);
        assert_eq!(text_depth(br#"["\"[[["]"#, 10), 1);
        assert_eq!(text_depth(nested(50).as_bytes(), 10), 11);
    }

    #[test]
    fn a_value_at_the_bound_parses_and_one_past_it_is_refused() {
        let at = stacker::grow(DEEP_STACK, || {
            parse_json(nested(MAX_DEPTH).as_bytes()).map(|v| value_depth(&v.0, usize::MAX))
        });
        assert_eq!(at, Ok(MAX_DEPTH));
        assert_eq!(
            parse_json(nested(MAX_DEPTH + 1).as_bytes()).err(),
            Some(too_deep_message())
        );
    }

    #[test]
    fn deep_values_drop_without_recursion() {
        let mut value = Value::Null;
        for _ in 0..200_000 {
            value = Value::Array(vec![value]);
        }
        assert_eq!(value_depth(&value, usize::MAX), 200_000);
        drop(Deep(value));
    }
}
