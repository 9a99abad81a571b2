//! What watch tells the outside after a reconcile or a doctor run ([`Outside`]): its metrics
//! (the `--metrics-file`, the snapshot `--metrics-address` serves, and the loop's ticks that
//! `/healthz` judges) and doctor's changes in the log.

use std::sync::Arc;

use crate::analysis::doctor::Severity;
use crate::causes::Causes;
use crate::entry::metrics;

use super::counters::Counters;
use super::doctor::Run;
use super::findings::{Change, Findings};
use super::{Options, WatchError, health_bound, http};

/// Where watch's metrics go, and doctor's series when it runs.
pub struct Outside<'o> {
    opts: &'o Options,
    served: Option<Arc<http::Served>>,
    findings: Option<Findings>,
}

impl<'o> Outside<'o> {
    /// With `--metrics-address`, serving starts now (while the state directory is awaited
    /// too: a liveness probe sees the loop alive), showing `counters`.
    pub fn serve(opts: &'o Options, counters: &Counters) -> Result<Outside<'o>, WatchError> {
        let served = match opts.metrics_address {
            Some(address) => {
                let served = Arc::new(http::Served::new(health_bound(
                    opts.period,
                    opts.legacy_every,
                )));
                served.tick();
                served.show(counters.exposition().render());
                http::spawn(address, served.clone())
                    .map_err(|source| WatchError::Listen { address, source })?;
                Some(served)
            }
            None => None,
        };
        Ok(Outside {
            opts,
            served,
            findings: opts.doctor_period.map(Findings::new),
        })
    }

    pub fn served(&self) -> Option<&http::Served> {
        self.served.as_deref()
    }

    /// The loop is alive (`/healthz`).
    pub fn tick(&self) {
        if let Some(served) = &self.served {
            served.tick();
        }
    }

    /// The counters, and doctor's series when it runs, to `--metrics-file` and to what
    /// `--metrics-address` serves.
    pub fn publish(&self, counters: &Counters) {
        publish(counters, self.findings.as_ref(), self.opts, self.served());
    }

    /// A doctor run ended: what changed is said, the series published.
    pub fn doctored(&mut self, run: Run, counters: &Counters) {
        if let Some(f) = &mut self.findings {
            for change in f.add(run) {
                log_change(&change);
            }
            publish(counters, Some(f), self.opts, self.served.as_deref());
        }
    }
}

/// The counters, and doctor's series when it runs, to `--metrics-file` and to what
/// `--metrics-address` serves.
fn publish(
    counters: &Counters,
    findings: Option<&Findings>,
    opts: &Options,
    served: Option<&http::Served>,
) {
    let mut exposition = counters.exposition();
    if let Some(f) = findings {
        f.add_to(&mut exposition);
    }
    if let Some(served) = served {
        served.show(exposition.render());
    }
    if let Err(e) = metrics::write_option(opts.metrics_file.as_deref(), &exposition) {
        log::warn!("{}", Causes(&e));
    }
}

/// What changed in doctor's findings, said once.
fn log_change(change: &Change) {
    match change {
        Change::Found {
            severity: Severity::Info,
            line,
        } => log::info!("doctor: found: {line}"),
        Change::Found { line, .. } => log::warn!("doctor: found: {line}"),
        Change::Gone { line } => log::info!("doctor: no longer found: {line}"),
        Change::Failed(why) => log::warn!("doctor failed: {why}"),
        Change::Recovered => log::info!("doctor runs again"),
    }
}
