//! The series of a sweep and of doctor, from their reports (the same values `--json` prints).
//!
//! Every file is one run's: all series are gauges named `natledger_<command>_last_…`. Label
//! values are the JSON report's words (`reason="dead-container"`, `backend="nft"`,
//! `family="ipv4"`, `kind="dead-target"`, `severity="error"`). Every combination of a label
//! set that can occur is written, with 0 when nothing happened, so that a missing series means
//! "not known", never "none".

use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

use crate::analysis::doctor::{self, Kind, Severity};
use crate::backend::Backend;
use crate::model::family::Family;
use crate::ops::SweepReport;
use crate::ops::sweep::{Fate, Liveness, Reason};

use super::Exposition;

/// The word a report's JSON uses for `value`.
pub(crate) fn word<T: Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(s)) => s,
        other => format!("{other:?}"),
    }
}

pub(crate) fn unix_seconds(at: SystemTime) -> f64 {
    at.duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// A sweep's series; `finished` is when it ended (the timestamp series).
pub fn sweep(report: &SweepReport, finished: SystemTime) -> Exposition {
    let mut e = Exposition::new();
    run(&mut e, report, finished);
    let places = places(report);
    removed(&mut e, report, &places);
    containers(&mut e, report);
    owned(&mut e, report, &places);
    if report.repair {
        restored(&mut e, report);
    }
    e
}

/// When the sweep ended, how long it took, its errors.
fn run(e: &mut Exposition, report: &SweepReport, finished: SystemTime) {
    e.gauge(
        "natledger_sweep_last_run_timestamp_seconds",
        "Unix time the last natledger sweep finished.",
    )
    .sample(&[], unix_seconds(finished));
    e.gauge(
        "natledger_sweep_last_duration_seconds",
        "How long the last natledger sweep took, --wait included.",
    )
    .sample(&[], report.duration_seconds);
    e.gauge(
        "natledger_sweep_last_errors",
        "Errors of the last sweep: what it could not do (rules that may remain, tables it \
         could not read or write, unreadable manifests). 0 means everything due was removed.",
    )
    .sample(&[], report.errors.len() as f64);
}

/// The backend/family pairs the sweep looked at, in its order.
fn places(report: &SweepReport) -> Vec<(Backend, Family)> {
    let mut places: Vec<(Backend, Family)> = Vec::new();
    for t in &report.tables {
        if !places.contains(&(t.backend, t.family)) {
            places.push((t.backend, t.family));
        }
    }
    places
}

/// Rules removed, by reason, backend and family.
fn removed(e: &mut Exposition, report: &SweepReport, places: &[(Backend, Family)]) {
    let removed = e.gauge(
        "natledger_sweep_last_rules_removed",
        "Rules the last sweep removed, by reason (dead-container: its container is dead; \
         orphan: tagged for a container no manifest knows; duplicate-jump; stale-chain: a \
         chain this version no longer uses; uninstall: sweep --all), backend and family \
         (nat and filter tables summed).",
    );
    for &(backend, family) in places {
        for reason in Reason::ALL {
            let n = report
                .tables
                .iter()
                .filter(|t| (t.backend, t.family) == (backend, family))
                .flat_map(|t| &t.rules_removed)
                .filter(|r| r.reason == reason)
                .count();
            removed.sample(
                &[
                    ("reason", &word(&reason)),
                    ("backend", &word(&backend)),
                    ("family", &word(&family)),
                ],
                n as f64,
            );
        }
    }
}

/// Manifests removed, and containers by what the sweep judged them.
fn containers(e: &mut Exposition, report: &SweepReport) {
    let manifests = report
        .containers
        .iter()
        .filter(|c| c.manifest == Fate::Removed)
        .count();
    e.gauge(
        "natledger_sweep_last_manifests_removed",
        "Manifests (one per container or CNI attachment) the last sweep removed.",
    )
    .sample(&[], manifests as f64);
    let containers = e.gauge(
        "natledger_sweep_last_containers",
        "Containers with a manifest as the last sweep judged them: alive, dead, or unreadable \
         (a manifest that cannot be read; its rules are kept).",
    );
    for state in [Liveness::Alive, Liveness::Dead, Liveness::Unreadable] {
        let n = report
            .containers
            .iter()
            .filter(|c| c.state == state)
            .count();
        containers.sample(&[("state", &word(&state))], n as f64);
    }
}

/// natledger's rules left, by backend and family.
fn owned(e: &mut Exposition, report: &SweepReport, places: &[(Backend, Family)]) {
    let owned = e.gauge(
        "natledger_sweep_last_rules_owned",
        "natledger's rules (containers', shared chains' and jumps) left after the last sweep, \
         by backend and family (nat and filter tables summed). Absent for a backend and family \
         whose tables could not be read.",
    );
    for &(backend, family) in places {
        let counts: Option<usize> = report
            .tables
            .iter()
            .filter(|t| (t.backend, t.family) == (backend, family))
            .map(|t| t.rules_owned_after)
            .sum();
        if let Some(n) = counts {
            owned.sample(
                &[("backend", &word(&backend)), ("family", &word(&family))],
                n as f64,
            );
        }
    }
}

/// `--repair`: rules put back, by backend, family and table.
fn restored(e: &mut Exposition, report: &SweepReport) {
    let restored = e.gauge(
        "natledger_sweep_last_rules_restored",
        "Rules of live containers (and the shared chains' jumps and guard) the last \
         sweep --repair put back because the table lacked them, by backend, family and \
         table.",
    );
    for t in &report.tables {
        let labels = [
            ("backend", word(&t.backend)),
            ("family", word(&t.family)),
            ("table", t.table.to_string()),
        ];
        let labels: Vec<(&'static str, &str)> =
            labels.iter().map(|(n, v)| (*n, v.as_str())).collect();
        restored.sample(&labels, t.rules_restored.len() as f64);
    }
}

/// One sample per kind and severity doctor knows, the number of `findings` of each (0 where
/// none, so that an absent series means "not known"): `natledger doctor --metrics-file`'s
/// `natledger_doctor_last_findings` and watch's `natledger_doctor_findings`.
pub(crate) fn findings_by_kind(family: &mut super::Family, findings: &[doctor::Finding]) {
    for kind in Kind::ALL {
        for severity in Severity::ALL {
            let n = findings
                .iter()
                .filter(|f| f.kind == kind && f.severity == severity)
                .count();
            family.sample(
                &[("kind", &word(&kind)), ("severity", &word(&severity))],
                n as f64,
            );
        }
    }
}

/// Doctor's series; `finished` is when it ended.
pub fn doctor(report: &doctor::Report, finished: SystemTime) -> Exposition {
    let mut e = Exposition::new();
    e.gauge(
        "natledger_doctor_last_run_timestamp_seconds",
        "Unix time the last natledger doctor finished.",
    )
    .sample(&[], unix_seconds(finished));
    e.gauge(
        "natledger_doctor_last_duration_seconds",
        "How long the last natledger doctor took.",
    )
    .sample(&[], report.duration_seconds);
    findings_by_kind(
        e.gauge(
            "natledger_doctor_last_findings",
            "Findings of the last doctor, by kind and severity (the kinds of `natledger doctor \
             --json`).",
        ),
        &report.findings,
    );
    e.gauge(
        "natledger_doctor_last_rules_read",
        "Rules the last doctor read, every owner's, every backend and family.",
    )
    .sample(&[], report.rules_read as f64);
    e.gauge(
        "natledger_doctor_last_complete",
        "1 when the last doctor finished every walk, 0 when one was cut short (findings may be \
         missing).",
    )
    .sample(&[], if report.complete { 1.0 } else { 0.0 });
    e
}
