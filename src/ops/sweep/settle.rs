//! Step 3 of a sweep: the dead manifests settled once every table is done. One whose rules are
//! gone is removed; one whose rules may remain in a table the sweep could not clean is kept
//! (phase `removing`, naming those rules), and temp files a crash left go.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;

use crate::backend::Backend;
use crate::model::family::Family;
use crate::state::ledger::{Locked, Phase, RuleRecord, Summary};

use super::SweepOptions;
use super::judge::{Doomed, Judged};
use super::report::{Fate, SweepReport, TableReport, TableState};

/// Remove the manifests whose rules are gone; keep the others as `removing`, naming what may
/// remain. Temp files left by a crash go too (under the lock no write is in flight). A dry run
/// reports the same verdicts and changes nothing.
pub(super) fn settle(
    locked: &Locked,
    opts: &SweepOptions,
    judged: Judged,
    report: &mut SweepReport,
) {
    let any_failed = report.tables.iter().any(|t| t.state == TableState::Failed);
    let mut fates: HashMap<PathBuf, Fate> = HashMap::new();
    let mut gone: Vec<PathBuf> = Vec::new();
    for doomed in judged.doomed {
        let path = doomed.path.clone();
        let fate = match doomed.summary {
            Some(ref summary) => settle_summarized(&doomed, summary, report),
            None => settle_recorded(locked, opts, doomed, report),
        };
        if fate == Fate::Removed {
            gone.push(path.clone());
        }
        fates.insert(path, fate);
    }
    if opts.all && !any_failed {
        for path in judged.unreadable {
            fates.insert(path.clone(), Fate::Removed);
            gone.push(path);
        }
    }
    report.stale_temp_files = judged.temps.len();
    if opts.dry_run {
        for fate in fates.values_mut().filter(|f| **f == Fate::Removed) {
            *fate = Fate::WouldRemove;
        }
    } else {
        gone.extend(judged.temps);
        for e in locked.remove_files(&gone) {
            report.errors.push(crate::causes::text(&e));
        }
        for (path, fate) in &mut fates {
            if *fate == Fate::Removed && path.exists() {
                *fate = Fate::Kept;
            }
        }
    }
    report.set_fates(&fates);
}

/// A manifest too large to read whole: its rules went by their tag; the file stays, as it is,
/// while a table that may hold some could not be swept.
fn settle_summarized(doomed: &Doomed, summary: &Summary, report: &mut SweepReport) -> Fate {
    let unsettled = unsettled(&report.tables);
    let left: Vec<&(Backend, Family, String)> = summary
        .places
        .iter()
        .filter(|(b, f, t)| unsettled.contains(&(*b, *f, t.as_str())))
        .collect();
    if left.is_empty() {
        return Fate::Removed;
    }
    let places: Vec<String> = left
        .iter()
        .map(|(b, f, t)| format!("{b}/{f}/{t}"))
        .collect();
    report.errors.push(format!(
        "rules of container {} may remain in {}; its manifest {} is kept as it is",
        doomed.manifest.container_id,
        places.join(", "),
        doomed.path.display()
    ));
    Fate::KeptIncomplete
}

/// A manifest read whole: removed when none of its records may remain, else kept as
/// `removing` with the records that may (stored, unless a dry run).
fn settle_recorded(
    locked: &Locked,
    opts: &SweepOptions,
    doomed: Doomed,
    report: &mut SweepReport,
) -> Fate {
    let remaining = remaining(&doomed.manifest.rules, &report.tables);
    if remaining.is_empty() {
        return Fate::Removed;
    }
    report.errors.push(format!(
        "{} rule(s) of container {} may remain in {}; its manifest is kept",
        remaining.len(),
        doomed.manifest.container_id,
        where_(&remaining)
    ));
    if !opts.dry_run {
        let mut left = doomed.manifest;
        left.phase = Phase::Removing;
        left.rules = remaining;
        if let Err(e) = locked.store(&left) {
            report.errors.push(crate::causes::text(&e));
        }
    }
    Fate::KeptIncomplete
}

/// The records of `rules` that may still be in force: those in a table the sweep could not
/// clean (failed, or its backend not installed). A nat table swept clean settles the DNATs
/// even when the same backend's filter table failed, and the other way round.
fn remaining(rules: &[RuleRecord], tables: &[TableReport]) -> Vec<RuleRecord> {
    let unsettled = unsettled(tables);
    rules
        .iter()
        .filter(|r| unsettled.contains(&(r.backend, r.family, r.table_name())))
        .cloned()
        .collect()
}

/// The tables the sweep could not clean (failed, or its backend not installed).
fn unsettled(tables: &[TableReport]) -> HashSet<(Backend, Family, &'static str)> {
    tables
        .iter()
        .filter(|t| matches!(t.state, TableState::Failed | TableState::NotInstalled))
        .map(|t| (t.backend, t.family, t.table))
        .collect()
}

fn where_(records: &[RuleRecord]) -> String {
    let mut places: Vec<String> = records
        .iter()
        .map(|r| format!("{}/{}", r.backend, r.family))
        .collect();
    places.sort();
    places.dedup();
    places.join(", ")
}

#[cfg(test)]
#[path = "settle_tests.rs"]
mod tests;
