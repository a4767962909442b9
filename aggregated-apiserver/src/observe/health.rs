//! `/healthz`, `/livez` and `/readyz` as k8s.io/apiserver answers them: `ok`, `?verbose` lists each
//! check as `[+]name ok`, `/readyz/<check>` asks one, and a failure is a 500 naming the check.
//! Readiness turns false first on shutdown, so load balancers drain before the listener closes.

use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};

use axum::{
    Router,
    extract::{Path, RawQuery, State},
    http::{HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
    routing::get,
};

use crate::error::Error;

type CheckFn = dyn Fn() -> Result<(), String> + Send + Sync;

/// A named readiness check: Ok, or why not.
#[derive(Clone)]
pub struct ReadinessCheck {
    /// As `?verbose` lists it and `/readyz/<name>` asks it.
    pub name: &'static str,
    run: Arc<CheckFn>,
    /// Reported (and failing on its own path) without failing the whole probe.
    informational: bool,
}

impl ReadinessCheck {
    /// A check that makes `/readyz` fail while it fails.
    pub fn new(
        name: &'static str,
        run: impl Fn() -> Result<(), String> + Send + Sync + 'static,
    ) -> Self {
        Self {
            name,
            run: Arc::new(run),
            informational: false,
        }
    }

    /// A check shown by `?verbose` and answerable at `/readyz/<name>`, that does not make the
    /// server unready: a degraded view's watch must not take the other kinds (and the APIService) down.
    pub fn informational(
        name: &'static str,
        run: impl Fn() -> Result<(), String> + Send + Sync + 'static,
    ) -> Self {
        Self {
            informational: true,
            ..Self::new(name, run)
        }
    }
}

struct Outcome {
    name: &'static str,
    result: Result<(), String>,
    informational: bool,
}

/// What the probes answer: `/healthz` and `/livez` only say the process serves; `/readyz` also
/// fails on shutdown and runs the readiness checks.
#[derive(Default)]
pub struct Health {
    shutting_down: AtomicBool,
    /// Checks that only readiness cares about (caches synced, ...).
    readiness: std::sync::RwLock<Vec<ReadinessCheck>>,
}

impl Health {
    /// Ready, with no checks yet.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// `/readyz` fails from now on (its `shutdown` check); liveness is unaffected.
    pub fn start_shutdown(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
    }

    /// Whether [`Health::start_shutdown`] was called.
    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::SeqCst)
    }

    /// Adds a check to `/readyz`, run on every readiness request. A check named as one already
    /// there joins it (two kinds in etcd: one `etcd` check that both must pass).
    pub fn add_readiness_check(&self, check: ReadinessCheck) {
        let Ok(mut checks) = self.readiness.write() else {
            return;
        };
        match checks.iter_mut().find(|c| c.name == check.name) {
            Some(existing) => {
                let (first, second) = (existing.run.clone(), check.run);
                existing.run = Arc::new(move || first().and_then(|()| second()));
            }
            None => checks.push(check),
        }
    }

    /// Whether `/readyz` would pass now.
    pub fn is_ready(&self) -> bool {
        self.checks(Probe::Readyz)
            .iter()
            .all(|c| c.result.is_ok() || c.informational)
    }

    fn checks(&self, probe: Probe) -> Vec<Outcome> {
        let outcome = |name, result| Outcome {
            name,
            result,
            informational: false,
        };
        let mut out = vec![outcome("ping", Ok(()))];
        if probe == Probe::Readyz {
            out.push(outcome(
                "shutdown",
                if self.is_shutting_down() {
                    Err("process is shutting down".into())
                } else {
                    Ok(())
                },
            ));
            if let Ok(checks) = self.readiness.read() {
                out.extend(checks.iter().map(|c| Outcome {
                    name: c.name,
                    result: (c.run)(),
                    informational: c.informational,
                }));
            }
        }
        out
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Probe {
    Healthz,
    Livez,
    Readyz,
}

impl Probe {
    fn name(self) -> &'static str {
        match self {
            Probe::Healthz => "healthz",
            Probe::Livez => "livez",
            Probe::Readyz => "readyz",
        }
    }
}

fn text(code: StatusCode, body: String) -> Response {
    let mut response = (code, body).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response.headers_mut().insert(
        "X-Content-Type-Options",
        HeaderValue::from_static("nosniff"),
    );
    response
}

fn report(health: &Health, probe: Probe, only: Option<&str>, verbose: bool) -> Response {
    let mut checks = health.checks(probe);
    if let Some(name) = only {
        checks.retain(|c| c.name == name);
        if checks.is_empty() {
            return Error::NoRoute.into_response();
        }
        // Asked by name, a check counts.
        for check in &mut checks {
            check.informational = false;
        }
    }
    let failed = checks.iter().any(|c| c.result.is_err() && !c.informational);
    let mut lines = String::new();
    for Outcome {
        name,
        result,
        informational,
    } in &checks
    {
        match result {
            Ok(()) => lines.push_str(&format!("[+]{name} ok\n")),
            Err(reason) if *informational => {
                lines.push_str(&format!("[!]{name} degraded: {reason}\n"));
            }
            // Like k8s.io/apiserver: details only in the server's log, at its V(2) (a probe
            // fails as a matter of course while the caches fill).
            Err(reason) => {
                tracing::debug!(check = name, %reason, "{} check failed", probe.name());
                lines.push_str(&format!("[-]{name} failed: reason withheld\n"));
            }
        }
    }
    if failed {
        text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("{lines}{} check failed\n", probe.name()),
        )
    } else if verbose {
        text(
            StatusCode::OK,
            format!("{lines}{} check passed\n", probe.name()),
        )
    } else {
        text(StatusCode::OK, "ok".into())
    }
}

fn verbose(query: Option<&str>) -> bool {
    query.is_some_and(|q| {
        q.split('&')
            .any(|kv| kv == "verbose" || kv.starts_with("verbose="))
    })
}

async fn all(probe: Probe, health: Arc<Health>, query: Option<String>) -> Response {
    report(&health, probe, None, verbose(query.as_deref()))
}

/// Whether [`router`] serves this path: `/<probe>` or `/<probe>/<check>`.
pub fn is_probe(path: &str) -> bool {
    let Some(rest) = path.strip_prefix('/') else {
        return false;
    };
    let is_name = |probe: &str| {
        [Probe::Healthz, Probe::Livez, Probe::Readyz]
            .iter()
            .any(|e| e.name() == probe)
    };
    match rest.split_once('/') {
        None => is_name(rest),
        Some((probe, check)) => is_name(probe) && !check.is_empty() && !check.contains('/'),
    }
}

/// `/healthz`, `/livez`, `/readyz` and `/<probe>/<check>`. Probes reach it without
/// authentication, metrics or a request log line (see [`crate::server::App`]).
pub fn router(health: Arc<Health>) -> Router {
    let mut router = Router::new();
    for probe in [Probe::Healthz, Probe::Livez, Probe::Readyz] {
        router = router
            .route(
                &format!("/{}", probe.name()),
                get(move |State(h): State<Arc<Health>>, RawQuery(q): RawQuery| all(probe, h, q)),
            )
            .route(
                &format!("/{}/{{check}}", probe.name()),
                get(
                    move |State(h): State<Arc<Health>>,
                          Path(check): Path<String>,
                          RawQuery(q): RawQuery| async move {
                        report(&h, probe, Some(&check), verbose(q.as_deref()))
                    },
                ),
            );
    }
    router.with_state(health)
}

#[cfg(test)]
mod tests {
    #[test]
    fn probes_are_exactly_the_paths_the_health_router_serves() {
        for path in [
            "/healthz",
            "/livez",
            "/readyz",
            "/readyz/informer-sync",
            "/livez/ping",
        ] {
            assert!(super::is_probe(path), "{path}");
        }
        for path in [
            "/healthz/",
            "/healthz/a/b",
            "/healthzz",
            "/",
            "",
            "healthz",
            "/apis",
        ] {
            assert!(!super::is_probe(path), "{path}");
        }
    }

    #[test]
    fn checks_of_one_name_are_one_check_that_all_must_pass() {
        use super::{Health, Probe, ReadinessCheck};
        let health = Health::new();
        health.add_readiness_check(ReadinessCheck::new("etcd", || Ok(())));
        health.add_readiness_check(ReadinessCheck::new("etcd", || {
            Err("barns not read yet".into())
        }));
        let outcomes = health.checks(Probe::Readyz);
        let names: Vec<_> = outcomes.iter().map(|o| o.name).collect();
        assert_eq!(names, ["ping", "shutdown", "etcd"]);
        assert_eq!(outcomes[2].result, Err("barns not read yet".to_owned()));
    }

    #[test]
    fn ready_is_what_readyz_answers() {
        use std::sync::{
            Arc,
            atomic::{AtomicBool, Ordering},
        };

        use super::{Health, ReadinessCheck};
        let health = Health::new();
        let synced = Arc::new(AtomicBool::new(false));
        let flag = synced.clone();
        health.add_readiness_check(ReadinessCheck::new("informer-sync", move || {
            if flag.load(Ordering::SeqCst) {
                Ok(())
            } else {
                Err("not listed yet".into())
            }
        }));
        health.add_readiness_check(ReadinessCheck::informational("stripes", || {
            Err("degraded".into())
        }));
        assert!(!health.is_ready());
        synced.store(true, Ordering::SeqCst);
        assert!(health.is_ready(), "an informational check does not count");
        health.start_shutdown();
        assert!(!health.is_ready());
    }
}
