//! What a run reports: each comparison with the ceiling, each figure against its target, and
//! how the figures were taken (written as JSON by `farm-bench run`).

use super::*;

#[derive(Debug, Clone, Serialize)]
pub(crate) struct Comparison {
    pub(crate) scenario: String,
    pub(crate) variant: String,
    pub(crate) server: Stats,
    pub(crate) ceiling: Stats,
    pub(crate) rps_ratio: f64,
    pub(crate) cpu_ratio: f64,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct Metric {
    pub(crate) scenario: String,
    pub(crate) name: String,
    pub(crate) value: f64,
    pub(crate) unit: String,
    pub(crate) target: String,
    pub(crate) met: Option<bool>,
}

/// How the figures were taken.
#[derive(Default, Serialize)]
pub(crate) struct Setup {
    pub(crate) cpus: usize,
    /// Empty: not pinned (shared with the load generator).
    pub(crate) server_cpus: Vec<usize>,
    pub(crate) load_cpus: Vec<usize>,
    pub(crate) load_generator: String,
    pub(crate) rounds: usize,
    pub(crate) seconds: f64,
}

#[derive(Default, Serialize)]
pub(crate) struct Report {
    pub(crate) setup: Setup,
    pub(crate) comparisons: Vec<Comparison>,
    pub(crate) metrics: Vec<Metric>,
    /// Scenario 8: the aggregated Llama vs a CRD's, through kube-apiserver.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) through_kube_apiserver: Option<cluster::Summary>,
    /// Scenario 9: the soak.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) soak: Option<soak::Soak>,
    /// Scenario 10: the abusive connections, and how they fared.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) abuse: Option<abuse::Abusers>,
    /// Scenario 16: watchers that stop reading.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) slow_watch: Option<slow_watch::SlowWatch>,
    /// Scenarios not run, and why.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) skipped: Vec<String>,
}

impl Report {
    pub(crate) fn metric(
        &mut self,
        scenario: &str,
        name: &str,
        value: f64,
        unit: &str,
        target: &str,
        met: Option<bool>,
    ) {
        let verdict = match met {
            Some(true) => ", met",
            Some(false) => ", MISSED",
            None => "",
        };
        if target.is_empty() {
            println!("  {name}: {value:.3} {unit}");
        } else {
            println!("  {name}: {value:.3} {unit}  (target {target}{verdict})");
        }
        self.metrics.push(Metric {
            scenario: scenario.into(),
            name: name.into(),
            value,
            unit: unit.into(),
            target: target.into(),
            met,
        });
    }
}
