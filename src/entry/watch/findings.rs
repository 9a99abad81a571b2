//! What watch makes of doctor's runs ([`super::doctor`]): the series it exports and the log
//! lines of what changed. Pure (runs and times are given).
//!
//! Series: `natledger_doctor_findings{kind,severity}` (every kind and severity, 0 when none:
//! an absent series means "no successful run yet"; written by the same function as
//! `natledger doctor --metrics-file`'s), the last successful run's time, whether the last run
//! failed, runs and how long the last took, and the period (so an alert can tell a stale
//! run without knowing the flag). A failed run keeps the findings of the last one that
//! succeeded: their time says how old they are.
//!
//! Log: a finding is said once when it appears (warning for errors and warnings, info for
//! information) and once when it is gone; a failure once until it changes or ends.

use std::collections::BTreeSet;
use std::time::{Duration, SystemTime};

use crate::analysis::doctor::{Finding, Severity};
use crate::entry::metrics::Exposition;
use crate::entry::metrics::report::{findings_by_kind, unix_seconds, word};

use super::doctor::Run;

/// A finding as compared between runs: its severity, kind, port and sentence.
type Key = (Severity, String, Option<u16>, String);

fn key(f: &Finding) -> Key {
    (f.severity, word(&f.kind), f.port, f.summary.clone())
}

/// What changed since the previous run, to be logged.
#[derive(Debug, PartialEq)]
pub enum Change {
    Found { severity: Severity, line: String },
    Gone { line: String },
    Failed(String),
    Recovered,
}

#[derive(Debug)]
pub struct Findings {
    period: Duration,
    runs: u64,
    /// The findings of the last successful run, and when it ended.
    last_ok: Option<(Vec<Finding>, SystemTime)>,
    seen: BTreeSet<Key>,
    failing: Option<String>,
    last_seconds: f64,
}

impl Findings {
    pub fn new(period: Duration) -> Self {
        Findings {
            period,
            runs: 0,
            last_ok: None,
            seen: BTreeSet::new(),
            failing: None,
            last_seconds: 0.0,
        }
    }

    /// Take a run in; what changed since the previous one.
    pub fn add(&mut self, run: Run) -> Vec<Change> {
        self.runs += 1;
        let mut changes = Vec::new();
        let report = match run.result {
            Ok(report) => report,
            Err(why) => {
                if self.failing.as_ref() != Some(&why) {
                    changes.push(Change::Failed(why.clone()));
                }
                self.failing = Some(why);
                return changes;
            }
        };
        if self.failing.take().is_some() {
            changes.push(Change::Recovered);
        }
        self.last_seconds = report.duration_seconds;
        let now: BTreeSet<Key> = report.findings.iter().map(key).collect();
        for f in &report.findings {
            if !self.seen.contains(&key(f)) {
                // One line: the fix's commands (one per line) joined.
                let fix = f.fix.as_ref().map(|fix| {
                    let commands: Vec<&str> = fix.lines().collect();
                    format!(" (fix: {})", commands.join("; "))
                });
                changes.push(Change::Found {
                    severity: f.severity,
                    line: line(&key(f)) + fix.as_deref().unwrap_or(""),
                });
            }
        }
        for gone in self.seen.difference(&now) {
            changes.push(Change::Gone { line: line(gone) });
        }
        self.seen = now;
        self.last_ok = Some((report.findings, run.finished));
        changes
    }

    /// Its series, after the watch counters.
    pub fn add_to(&self, e: &mut Exposition) {
        e.gauge(
            "natledger_doctor_period_seconds",
            "How often watch runs doctor (--doctor-period).",
        )
        .sample(&[], self.period.as_secs_f64());
        e.counter("natledger_doctor_runs_total", "Doctor runs watch made.")
            .sample(&[], self.runs as f64);
        e.gauge(
            "natledger_doctor_failed",
            "1 when watch's last doctor run failed (the log says why), else 0.",
        )
        .sample(&[], if self.failing.is_some() { 1.0 } else { 0.0 });
        let Some((findings, at)) = &self.last_ok else {
            return;
        };
        findings_by_kind(
            e.gauge(
                "natledger_doctor_findings",
                "Findings of watch's last successful doctor run, by kind and severity (the \
                 kinds of `natledger doctor --json`).",
            ),
            findings,
        );
        e.gauge(
            "natledger_doctor_last_success_timestamp_seconds",
            "Unix time watch's last successful doctor run ended.",
        )
        .sample(&[], unix_seconds(*at));
        e.gauge(
            "natledger_doctor_last_success_duration_seconds",
            "How long watch's last successful doctor run took.",
        )
        .sample(&[], self.last_seconds);
    }
}

fn line((severity, kind, port, summary): &Key) -> String {
    let port = port.map(|p| format!(" port {p}")).unwrap_or_default();
    format!("{} {kind}{port}: {summary}", word(severity))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::doctor::{Kind, Report};

    fn finding(kind: Kind, severity: Severity, port: u16) -> Finding {
        Finding {
            severity,
            kind,
            port: Some(port),
            protocol: Some("tcp".into()),
            summary: format!("something about {port}"),
            rules: Vec::new(),
            evidence: Vec::new(),
            fix: None,
        }
    }

    fn ok(findings: Vec<Finding>, secs: u64) -> Run {
        Run {
            result: Ok(Report {
                sources: Vec::new(),
                rules_read: 3,
                complete: true,
                findings,
                not_followed: Vec::new(),
                duration_seconds: 0.25,
            }),
            finished: SystemTime::UNIX_EPOCH + Duration::from_secs(secs),
        }
    }

    fn failed(why: &str) -> Run {
        Run {
            result: Err(why.into()),
            finished: SystemTime::UNIX_EPOCH,
        }
    }

    #[test]
    fn a_finding_is_said_once_when_found_and_once_when_gone_a_failure_once() {
        let shadow = || finding(Kind::Shadowed, Severity::Error, 8080);
        let dead = || Finding {
            fix: Some("natledger sweep".into()),
            ..finding(Kind::DeadTarget, Severity::Warning, 9090)
        };
        let mut f = Findings::new(Duration::from_secs(300));
        assert_eq!(
            f.add(ok(vec![shadow()], 1)),
            [Change::Found {
                severity: Severity::Error,
                line: "error shadowed port 8080: something about 8080".into()
            }]
        );
        assert_eq!(f.add(ok(vec![shadow()], 2)), []);
        assert_eq!(
            f.add(failed("reading: gone")),
            [Change::Failed("reading: gone".into())]
        );
        assert_eq!(f.add(failed("reading: gone")), []);
        let changes = f.add(ok(vec![dead()], 3));
        assert_eq!(changes.len(), 3, "{changes:?}");
        assert_eq!(changes[0], Change::Recovered);
        assert_eq!(
            changes[1],
            Change::Found {
                severity: Severity::Warning,
                line: "warning dead-target port 9090: something about 9090 (fix: natledger sweep)"
                    .into()
            }
        );
        assert_eq!(
            changes[2],
            Change::Gone {
                line: "error shadowed port 8080: something about 8080".into()
            }
        );
        assert_eq!(f.add(ok(Vec::new(), 4)).len(), 1);
    }

    #[test]
    fn every_kind_and_severity_is_a_series_once_doctor_ran_and_a_failure_keeps_the_last() {
        let mut f = Findings::new(Duration::from_secs(300));
        let text = |f: &Findings| {
            let mut e = Exposition::new();
            f.add_to(&mut e);
            e.render()
        };
        let before = text(&f);
        assert!(
            before.contains("natledger_doctor_period_seconds 300\n"),
            "{before}"
        );
        assert!(before.contains("natledger_doctor_failed 0\n"), "{before}");
        assert!(!before.contains("natledger_doctor_findings"), "{before}");
        f.add(ok(vec![finding(Kind::Shadowed, Severity::Error, 1)], 7));
        f.add(failed("no"));
        let after = text(&f);
        let samples = after
            .lines()
            .filter(|l| l.starts_with("natledger_doctor_findings{"))
            .count();
        assert_eq!(samples, Kind::ALL.len() * Severity::ALL.len(), "{after}");
        for line in [
            "natledger_doctor_findings{kind=\"shadowed\",severity=\"error\"} 1",
            "natledger_doctor_findings{kind=\"dead-target\",severity=\"error\"} 0",
            "natledger_doctor_last_success_timestamp_seconds 7",
            "natledger_doctor_last_success_duration_seconds 0.25",
            "natledger_doctor_failed 1",
            "natledger_doctor_runs_total 2",
            "# TYPE natledger_doctor_runs_total counter",
        ] {
            assert!(after.lines().any(|l| l == line), "{line}\n{after}");
        }
    }
}
