//! What `natledger watch` has done since it started, and its `--metrics-file` (the
//! Prometheus text format, written as sweep writes its own: [`crate::entry::metrics`]).

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use crate::backend::Backend;
use crate::entry::metrics::Exposition;
use crate::entry::metrics::report::word;
use crate::model::family::Family;
use crate::ops::SweepReport;
use crate::ops::sweep::HeldBack;

#[derive(Debug, Default)]
pub struct Counters {
    /// Per backend, family and table: repairs (reconciles that put something back there)
    /// and rules put back.
    repairs: BTreeMap<(Backend, Family, &'static str), (u64, u64)>,
    removed: u64,
    reconciles: u64,
    failed: u64,
    seconds: f64,
    last_seconds: f64,
    last_at: Option<SystemTime>,
    pub backoffs: u64,
    /// Containers whose repairs wait now (a back-off hold of their own).
    pub held: usize,
    /// Rules tagged for containers no manifest knows that the last reconcile left (a ledger
    /// that records nothing: `sweep::held`).
    unclaimed: usize,
}

impl Counters {
    /// Count one reconcile: its report (none when it could not run at all) and duration.
    pub fn add(&mut self, report: Option<&SweepReport>, took: Duration, at: SystemTime) {
        self.reconciles += 1;
        self.seconds += took.as_secs_f64();
        self.last_seconds = took.as_secs_f64();
        self.last_at = Some(at);
        let Some(report) = report else {
            self.failed += 1;
            return;
        };
        if !report.ok() {
            self.failed += 1;
        }
        self.unclaimed = match &report.held_back {
            Some(HeldBack::Empty { rules, .. }) => *rules,
            _ => 0,
        };
        for t in &report.tables {
            self.removed += t.rules_removed.len() as u64;
            let n = t.rules_restored.len() as u64;
            let entry = self
                .repairs
                .entry((t.backend, t.family, t.table))
                .or_default();
            entry.0 += u64::from(n > 0);
            entry.1 += n;
        }
    }

    pub fn exposition(&self) -> Exposition {
        let mut e = Exposition::new();
        self.per_table(&mut e);
        self.reconciles(&mut e);
        self.back_off(&mut e);
        e
    }

    /// Repairs and rules put back, by backend, family and table.
    fn per_table(&self, e: &mut Exposition) {
        let repairs = e.counter(
            "natledger_watch_repairs_total",
            "Reconciles that put back rules a table lacked (a live container's, or the shared \
             chains' jumps and guard), by backend, family and table.",
        );
        for ((backend, family, table), (n, _)) in &self.repairs {
            repairs.sample(
                &[
                    ("backend", &word(backend)),
                    ("family", &word(family)),
                    ("table", table),
                ],
                *n as f64,
            );
        }
        let rules = e.counter(
            "natledger_watch_rules_restored_total",
            "Rules put back, by backend, family and table.",
        );
        for ((backend, family, table), (_, n)) in &self.repairs {
            rules.sample(
                &[
                    ("backend", &word(backend)),
                    ("family", &word(family)),
                    ("table", table),
                ],
                *n as f64,
            );
        }
    }

    /// Rules removed, reconciles, their errors and time.
    fn reconciles(&self, e: &mut Exposition) {
        e.counter(
            "natledger_watch_rules_removed_total",
            "Rules removed as sweep removes them (dead containers' and orphans).",
        )
        .sample(&[], self.removed as f64);
        e.counter(
            "natledger_watch_reconciles_total",
            "Reconciles run (on a change, a signal, or the backstop period).",
        )
        .sample(&[], self.reconciles as f64);
        e.counter(
            "natledger_watch_reconcile_errors_total",
            "Reconciles that could not do everything due (the log says what).",
        )
        .sample(&[], self.failed as f64);
        e.counter(
            "natledger_watch_reconcile_seconds_total",
            "Time spent reconciling.",
        )
        .sample(&[], self.seconds);
        e.gauge(
            "natledger_watch_last_reconcile_seconds",
            "How long the last reconcile took.",
        )
        .sample(&[], self.last_seconds);
        if let Some(at) = self.last_at {
            let unix = at
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap_or_default()
                .as_secs_f64();
            e.gauge(
                "natledger_watch_last_reconcile_timestamp_seconds",
                "Unix time the last reconcile finished.",
            )
            .sample(&[], unix);
        }
    }

    /// Back-off, containers held, rules left unclaimed.
    fn back_off(&self, e: &mut Exposition) {
        e.counter(
            "natledger_watch_backoffs_total",
            "Times watch held a repair back because what it put back was removed again and \
             again.",
        )
        .sample(&[], self.backoffs as f64);
        e.gauge(
            "natledger_watch_containers_held",
            "Containers whose repairs are held back now, because what was put back of theirs \
             kept being removed.",
        )
        .sample(&[], self.held as f64);
        e.gauge(
            "natledger_watch_unclaimed_rules",
            "Rules tagged for containers no manifest knows that the last reconcile left in \
             place, because the state directory holds no manifest (sweep --boot removes them).",
        )
        .sample(&[], self.unclaimed as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::SweepOptions;
    use crate::ops::sweep::{Restored, TableReport};

    #[test]
    fn repairs_and_rules_are_counted_per_table_across_reconciles() {
        let mut counters = Counters::default();
        let mut report = SweepReport::new(&SweepOptions {
            repair: true,
            ..SweepOptions::default()
        });
        let mut nat = TableReport::new(Backend::IptablesNft, Family::Ipv4, "nat");
        nat.rules_restored = vec![
            Restored {
                chain: "NATLEDGER-HOSTPORTS".into(),
                rule: vec!["-j".into(), "ACCEPT".into()],
                container: Some("c".parse().unwrap()),
            };
            3
        ];
        report.tables = vec![
            nat,
            TableReport::new(Backend::IptablesNft, Family::Ipv4, "filter"),
        ];
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(7);
        counters.add(Some(&report), Duration::from_millis(250), at);
        counters.add(Some(&report), Duration::from_millis(250), at);
        counters.add(None, Duration::from_millis(500), at);
        counters.backoffs = 1;
        counters.held = 2;
        let mut empty = SweepReport::new(&SweepOptions::default());
        empty.held_back = Some(HeldBack::Empty {
            dir: "/run/natledger".into(),
            rules: 4,
        });
        counters.add(Some(&empty), Duration::ZERO, at);
        let text = counters.exposition().render();
        for line in [
            "natledger_watch_repairs_total{backend=\"nft\",family=\"ipv4\",table=\"nat\"} 2",
            "natledger_watch_repairs_total{backend=\"nft\",family=\"ipv4\",table=\"filter\"} 0",
            "natledger_watch_rules_restored_total{backend=\"nft\",family=\"ipv4\",table=\"nat\"} 6",
            "natledger_watch_reconciles_total 4",
            "natledger_watch_reconcile_errors_total 1",
            "natledger_watch_reconcile_seconds_total 1",
            "natledger_watch_last_reconcile_seconds 0",
            "natledger_watch_last_reconcile_timestamp_seconds 7",
            "natledger_watch_backoffs_total 1",
            "natledger_watch_containers_held 2",
            "natledger_watch_unclaimed_rules 4",
            "# TYPE natledger_watch_repairs_total counter",
        ] {
            assert!(text.lines().any(|l| l == line), "{line}\n{text}");
        }
    }
}
