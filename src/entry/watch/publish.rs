//! What watch tells the outside after a reconcile or a doctor run: its metrics (the
//! `--metrics-file`, the snapshot `--metrics-address` serves) and doctor's changes in the log.

use crate::analysis::doctor::Severity;
use crate::chain::Chain;
use crate::entry::metrics;

use super::counters::Counters;
use super::findings::{Change, Findings};
use super::{Options, http};

/// The counters, and doctor's series when it runs, to `--metrics-file` and to what
/// `--metrics-address` serves.
pub(super) fn publish(
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
        log::warn!("{}", Chain(&e));
    }
}

/// What changed in doctor's findings, said once.
pub(super) fn log_change(change: &Change) {
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
