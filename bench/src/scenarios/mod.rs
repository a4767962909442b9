//! The scenarios, one function each (`scenario_N`, numbered as PERFORMANCE.md and
//! `--only` number them), grouped by what they measure, and [`run`], which takes them in
//! order: first those that share one server and one ceiling, then those that start their own.

pub(crate) mod endurance;
pub(crate) mod requests;
pub(crate) mod watches;
pub(crate) mod writes;

pub(crate) use crate::*;

/// What every scenario may use: the run's flags, the report it adds to, the fake
/// kube-apiserver and the certificates.
pub(crate) struct Bench {
    pub(crate) args: RunArgs,
    pub(crate) report: Report,
    pub(crate) fake: std::sync::Arc<fake::Fake>,
    pub(crate) pki: Pki,
}

/// The server (10,000 synthetic Pods behind its FarmPods) and the ceiling that the first
/// scenarios share, started once (scenario 7 reports the server's start-up).
pub(crate) struct Shared {
    pub(crate) server: Proc,
    pub(crate) server_t: Target,
    pub(crate) ceiling: Proc,
    pub(crate) ceiling_t: Target,
}

/// Runs the scenarios `--only` names (all by default).
pub(crate) async fn run(b: &mut Bench) -> Result<()> {
    let ceiling = start_ceiling(&b.args, &b.pki)?;
    let ceiling_t = target(&b.pki, ceiling.addr)?;
    let (server, startup) = start_server(&b.args, &b.pki, &["--synthetic-pods", "10000"]).await?;
    let server_t = target(&b.pki, server.addr)?;
    let shared = Shared {
        server,
        server_t,
        ceiling,
        ceiling_t,
    };
    let sh = &shared;
    if wants(&b.args, 1) {
        requests::scenario_1(b, sh).await?;
    }
    if wants(&b.args, 2) {
        requests::scenario_2(b, sh).await?;
    }
    if wants(&b.args, 3) {
        requests::scenario_3(b, sh).await?;
    }
    if wants(&b.args, 4) {
        watches::scenario_4(b, sh).await?;
    }
    if wants(&b.args, 18) {
        requests::scenario_18(b).await?;
    }
    if wants(&b.args, 17) {
        watches::scenario_17(b, sh).await?;
    }
    if wants(&b.args, 16) {
        watches::scenario_16(b, sh).await?;
    }
    if wants(&b.args, 6) {
        requests::scenario_6(b, sh).await?;
    }
    if wants(&b.args, 15) {
        requests::scenario_15(b, sh).await?;
    }
    // The rest start servers of their own.
    drop(shared);
    if wants(&b.args, 5) {
        requests::scenario_5(b).await?;
    }
    if wants(&b.args, 7) {
        endurance::scenario_7(b, startup).await?;
    }
    if wants(&b.args, 8) {
        endurance::scenario_8(b).await?;
    }
    if wants(&b.args, 9) {
        endurance::scenario_9(b).await?;
    }
    if wants(&b.args, 10) {
        endurance::scenario_10(b).await?;
    }
    if wants(&b.args, 11) {
        writes::scenario_11(b).await?;
    }
    if wants(&b.args, 12) {
        writes::scenario_12(b).await?;
    }
    if wants(&b.args, 14) {
        writes::scenario_14(b).await?;
    }
    if wants(&b.args, 13) {
        writes::scenario_13(b).await?;
    }
    Ok(())
}
