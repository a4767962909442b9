//! How operators watch the server: `health` (`/healthz`, `/livez`, `/readyz`), `metrics`
//! (Prometheus, in kube-apiserver's names), [`telemetry`] (traces) and [`recovery`] (panics
//! logged, counted and answered as kube-apiserver answers them).

pub(crate) mod health;
pub(crate) mod metrics;
pub mod recovery;
pub mod telemetry;
