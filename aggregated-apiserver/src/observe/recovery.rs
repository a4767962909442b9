//! Panics, as k8s.io/apiserver's `WithPanicRecovery` treats them: a request that panics is
//! answered with a 500 Status, counted and logged once, and the process serves on. The log is
//! rate-limited (one line a second; the lines left out are counted in the next), and a
//! backtrace is captured only when `RUST_BACKTRACE` asks for one, and only for the first panic:
//! resolving one loads the binary's debug information, tens of MB kept for the process's life.

use std::{
    future::Future,
    panic::AssertUnwindSafe,
    sync::atomic::{AtomicBool, AtomicU64, Ordering},
    time::{SystemTime, UNIX_EPOCH},
};

use axum::response::{IntoResponse, Response};
use futures::FutureExt;

use crate::error::Error;

/// kube-apiserver's answer to a request that panicked.
pub const MESSAGE: &str = "This request caused apiserver to panic. Look in the logs for details.";

/// The response to a request whose handler panicked.
pub fn response() -> Response {
    Error::Internal(MESSAGE.to_owned()).into_response()
}

/// Runs `handler`; None when it panicked (the hook has logged it). A combinator, not an
/// `async fn`, so that `handler` is held once, not again in a state of its own.
pub fn catch<F: Future<Output = Response>>(handler: F) -> impl Future<Output = Option<Response>> {
    AssertUnwindSafe(handler).catch_unwind().map(Result::ok)
}

/// Runs `handler` now; None when it panicked.
pub fn catch_sync<T>(handler: impl FnOnce() -> T) -> Option<T> {
    std::panic::catch_unwind(AssertUnwindSafe(handler)).ok()
}

static LAST_LOGGED_SECOND: AtomicU64 = AtomicU64::new(0);
static LEFT_OUT: AtomicU64 = AtomicU64::new(0);
static BACKTRACE_TAKEN: AtomicBool = AtomicBool::new(false);

/// Replaces the default panic hook (several lines on stderr, a backtrace each time when
/// `RUST_BACKTRACE` is set) with one rate-limited `error` log line per panic.
pub fn install_hook() {
    std::panic::set_hook(Box::new(|info| {
        let second = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        if LAST_LOGGED_SECOND.swap(second, Ordering::Relaxed) == second {
            LEFT_OUT.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let message = info
            .payload()
            .downcast_ref::<&str>()
            .copied()
            .or_else(|| info.payload().downcast_ref::<String>().map(String::as_str))
            .unwrap_or("(not a string)");
        let location = info
            .location()
            .map(|l| format!("{}:{}", l.file(), l.line()))
            .unwrap_or_default();
        let left_out = LEFT_OUT.swap(0, Ordering::Relaxed);
        let backtrace = if !BACKTRACE_TAKEN.swap(true, Ordering::Relaxed) {
            let backtrace = std::backtrace::Backtrace::capture();
            match backtrace.status() {
                std::backtrace::BacktraceStatus::Captured => backtrace.to_string(),
                _ => String::new(),
            }
        } else {
            String::new()
        };
        tracing::error!(
            target: "aggregated_apiserver::panic",
            message,
            location,
            earlier_panics_not_logged = left_out,
            backtrace,
            "panic"
        );
    }));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panicking_handler_is_caught_and_a_calm_one_passes() {
        let caught = catch(async {
            if std::hint::black_box(true) {
                panic!("boom");
            }
            response()
        })
        .await;
        assert!(caught.is_none());
        let fine = catch(async { axum::http::StatusCode::OK.into_response() })
            .await
            .unwrap();
        assert_eq!(fine.status(), 200);
        assert!(catch_sync(|| -> u8 { panic!("now") }).is_none());
        assert_eq!(catch_sync(|| 7), Some(7));
        assert_eq!(response().status(), 500);
    }
}
