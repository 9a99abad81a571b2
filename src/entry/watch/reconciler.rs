//! The sync half of watch, kept apart from its timing ([`super::wake`]): one `sweep --repair`
//! when a reconcile is due and its gate is open ([`Reconciler::reconcile`]), and what follows
//! from its report: the counters, the back-off of the shared rules ([`Backoff`]) and of each
//! container ([`Holds`]), and the warnings, each said once. The decisions are pure functions
//! of the report and the time given ([`gate`], [`wrote`], [`whose`]).

use std::time::{Instant, SystemTime};

use crate::causes::Causes;
use crate::entry::settings::Settings;
use crate::model::oci::ContainerId;
use crate::ops::sweep::HeldBack;
use crate::ops::{self, Context, SweepOptions, SweepReport};
use crate::state::ledger::Ledger;

use super::GAP;
use super::backoff::{self, Backoff};
use super::counters::Counters;
use super::holds::{Holds, NewHold};
use super::wake::Deadlines;

/// What made a reconcile due.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Why {
    Start,
    Nftables,
    Legacy,
    Hangup,
    Firewalld,
    Period,
    /// The last reconcile failed.
    Retry,
    /// A container's back-off hold ended: its rules go back now.
    HoldOver,
}

/// How a reconcile went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// A hook holds the ledger lock: still due, tried again after [`GAP`].
    Busy,
    /// It failed; nothing was written. Tried again after a back-off hold.
    Failed,
    /// It ran; whether it wrote (what it read is then gone).
    Ran { wrote: bool },
}

/// Holds, back-off, counters and what is due.
pub struct Reconciler<'s> {
    settings: &'s Settings,
    /// Failures and the shared rules (every repair waits for them).
    backoff: Backoff,
    /// Each container's repairs.
    holds: Holds,
    hold_end: Option<Instant>,
    due: Option<Why>,
    /// When the last reconcile started.
    last: Option<Instant>,
    /// What the last report held back (said once until it changes).
    held: Option<HeldBack>,
    pub counters: Counters,
}

impl<'s> Reconciler<'s> {
    pub fn new(settings: &'s Settings) -> Reconciler<'s> {
        Reconciler {
            settings,
            backoff: Backoff::default(),
            holds: Holds::default(),
            hold_end: None,
            due: Some(Why::Start),
            last: None,
            held: None,
            counters: Counters::default(),
        }
    }

    /// A reconcile becomes due for `why`, unless one already is.
    pub fn due(&mut self, why: Why) {
        self.due = self.due.or(Some(why));
    }

    /// Why a reconcile is due and may start at `now`, if one is and may.
    pub fn ready(&self, now: Instant) -> Option<Why> {
        self.due
            .filter(|_| gate(&self.backoff, self.last, now).is_none())
    }

    /// SIGHUP: every hold ends (the streaks stay), a reconcile is due at once.
    pub fn hangup(&mut self) {
        self.backoff.release();
        self.holds.release();
        self.hold_end = None;
        self.due = Some(Why::Hangup);
    }

    /// Before the loop sleeps at `now`: a container's hold that ended makes a reconcile due;
    /// what bounds the sleep.
    pub fn deadlines(&mut self, now: Instant) -> Deadlines {
        if self.hold_end.is_some_and(|end| end <= now) {
            self.hold_end = None;
            self.counters.held = self.holds.held(now).len();
            self.due(Why::HoldOver);
        }
        Deadlines {
            hold_end: self.hold_end,
            gate: self.due.and(gate(&self.backoff, self.last, now)),
        }
    }

    /// One reconcile started at `now`, as due for `why`.
    pub fn reconcile(&mut self, why: Why, now: Instant) -> Outcome {
        self.last = Some(now);
        log::debug!("reconciling ({why:?})");
        let report = sweep(self.settings, &mut self.held, self.holds.held(now));
        if let Err(ops::Error::Busy { .. }) = report {
            // Tried again after the gap, the signals read meanwhile.
            log::debug!(
                "the ledger lock is taken: reconciling in {} ms",
                GAP.as_millis()
            );
            return Outcome::Busy;
        }
        self.counters
            .add(report.as_ref().ok(), now.elapsed(), SystemTime::now());
        match report {
            Ok(report) => {
                let wrote = wrote(&report);
                self.repaired(&report, Instant::now());
                self.due = None;
                Outcome::Ran { wrote }
            }
            // Nothing written: tried again after a hold that doubles while it keeps failing.
            Err(e) => {
                let hold = self.backoff.failed(Instant::now());
                log::warn!(
                    "reconcile failed: {}; trying again in {} ms",
                    Causes(&e),
                    hold.as_millis()
                );
                self.due = Some(Why::Retry);
                Outcome::Failed
            }
        }
    }

    /// After a reconcile at `now`: whose rules came back again too soon is held back.
    fn repaired(&mut self, report: &SweepReport, now: Instant) {
        let (back, shared) = whose(report);
        for begun in self.holds.after(&back, now) {
            self.counters.backoffs += 1;
            say_held(&begun);
        }
        self.hold_end = self.holds.next_end(now);
        self.counters.held = self.holds.held(now).len();
        if let Some(hold) = self.backoff.after(shared, now) {
            self.counters.backoffs += 1;
            log::warn!(
                "the shared rules (jumps, guard) that were put back were removed again: {} \
                 repairs in a row, each within {} s of the last; backing off: the next \
                 repair waits {} ms (something keeps deleting natledger's rules)",
                self.backoff.streak(),
                backoff::WINDOW.as_secs(),
                hold.as_millis()
            );
        }
    }
}

fn say_held(begun: &NewHold) {
    log::warn!(
        "the rules of container {} that were put back were removed again: {} \
         repairs in a row, each within {} s of the last; backing off: its next \
         repair waits {} ms, other containers' are not held (something keeps \
         deleting natledger's rules; to make a container's forward go, stop the \
         container)",
        begun.container,
        begun.streak,
        backoff::WINDOW.as_secs(),
        begun.hold.as_millis()
    );
}

/// Until when a due reconcile waits at `now`: a back-off hold, or the [`GAP`] after the last
/// one (started at `last`).
pub fn gate(backoff: &Backoff, last: Option<Instant>, now: Instant) -> Option<Instant> {
    let gap = last.map(|l| l + GAP).filter(|g| *g > now);
    backoff.held(now).max(gap)
}

/// Whether the reconcile wrote: what it read of the tables is then gone, and the next check
/// reconciles once more (a deleter quicker than the check restores the same size).
pub fn wrote(report: &SweepReport) -> bool {
    report.restored() > 0 || report.tables.iter().any(|t| !t.rules_removed.is_empty())
}

/// Whose rules came back: each container once, in order, and how many shared rules (each
/// container counts for itself, the shared rules for all).
pub fn whose(report: &SweepReport) -> (Vec<ContainerId>, usize) {
    let mut back: Vec<ContainerId> = Vec::new();
    let mut shared = 0;
    for r in report.tables.iter().flat_map(|t| &t.rules_restored) {
        match &r.container {
            Some(id) if !back.contains(id) => back.push(id.clone()),
            Some(_) => {}
            None => shared += 1,
        }
    }
    (back, shared)
}

/// One `sweep --repair`, as `natledger sweep --repair` runs it; the errors of a report are
/// logged, and what it held back once until that changes (`held`: the last); a failure is
/// the caller's.
fn sweep(
    settings: &Settings,
    held: &mut Option<HeldBack>,
    hold: Vec<ContainerId>,
) -> Result<SweepReport, ops::Error> {
    let (runner, machine) = (settings.runner(), settings.machine());
    let ledger = Ledger::new(settings.state_dir.clone());
    let nf = settings.netfilter(&runner);
    let backend = settings.backend.resolve(settings.host());
    let ctx = Context::new(ledger, backend, nf, &machine);
    let opts = SweepOptions {
        repair: true,
        try_lock: true,
        hold,
        ..SweepOptions::default()
    };
    let report = ops::sweep(&ctx, &opts)?;
    let kind = |h: &Option<HeldBack>| h.as_ref().map(std::mem::discriminant);
    if kind(&report.held_back) != kind(held)
        && let Some(h) = &report.held_back
    {
        log::warn!("{h}");
    }
    held.clone_from(&report.held_back);
    for e in &report.errors {
        log::warn!("{e}");
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::backend::Backend;
    use crate::model::family::Family;
    use crate::ops::sweep::{Restored, TableReport};

    fn restored(container: Option<&str>) -> Restored {
        Restored {
            chain: "NATLEDGER-HOSTPORTS".into(),
            rule: vec!["-j".into(), "ACCEPT".into()],
            container: container.map(|c| c.parse().unwrap()),
        }
    }

    fn report(rules: Vec<Restored>) -> SweepReport {
        let mut report = SweepReport::new(&SweepOptions {
            repair: true,
            ..SweepOptions::default()
        });
        let mut nat = TableReport::new(Backend::IptablesNft, Family::Ipv4, "nat");
        nat.rules_restored = rules;
        report.tables = vec![nat];
        report
    }

    #[test]
    fn each_container_whose_rules_came_back_counts_once_the_shared_rules_each() {
        let r = report(vec![
            restored(Some("b")),
            restored(None),
            restored(Some("a")),
            restored(Some("b")),
            restored(None),
        ]);
        let (back, shared) = whose(&r);
        assert_eq!(back, ["b", "a"].map(|c| c.parse::<ContainerId>().unwrap()));
        assert_eq!(shared, 2);
        assert!(wrote(&r));
        assert!(!wrote(&report(Vec::new())));
    }

    #[test]
    fn a_restored_rules_container_is_written_as_the_string_it_was() {
        let json = |r: &Restored| serde_json::to_string(r).unwrap();
        assert_eq!(
            json(&restored(Some("c1"))),
            r#"{"chain":"NATLEDGER-HOSTPORTS","rule":["-j","ACCEPT"],"container":"c1"}"#
        );
        assert_eq!(
            json(&restored(None)),
            r#"{"chain":"NATLEDGER-HOSTPORTS","rule":["-j","ACCEPT"]}"#
        );
    }

    #[test]
    fn a_hold_that_ends_makes_a_reconcile_due_and_sighup_ends_every_hold() {
        let settings = Settings::lenient(&|_| None).0;
        let mut r = Reconciler::new(&settings);
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        assert_eq!(r.ready(t0), Some(Why::Start));
        (r.due, r.last) = (None, Some(t0));
        // Container a's rules put back again and again: its repairs wait, no other's.
        let back = report(vec![restored(Some("a"))]);
        for i in 0..backoff::FREE {
            r.repaired(&back, t0 + ms(u64::from(i)));
        }
        let now = t0 + ms(u64::from(backoff::FREE - 1));
        assert_eq!((r.counters.held, r.counters.backoffs), (1, 1));
        let end = now + backoff::FIRST;
        let hold = Deadlines {
            hold_end: Some(end),
            gate: None,
        };
        assert_eq!(r.deadlines(now), hold);
        assert_eq!(r.ready(now), None, "nothing due");
        r.due(Why::Nftables);
        assert_eq!(
            r.deadlines(now).gate,
            Some(t0 + GAP),
            "the gap after the last"
        );
        r.due = None;
        // The hold ends: a reconcile is due to put a's rules back.
        assert_eq!(r.deadlines(end), Deadlines::default());
        assert_eq!(r.ready(end), Some(Why::HoldOver));
        assert_eq!(r.counters.held, 0);
        // Held again; SIGHUP ends the hold at once, a reconcile is due.
        r.repaired(&back, end);
        assert_eq!(r.holds.held(end).len(), 1);
        r.hangup();
        assert!(r.holds.held(end).is_empty());
        assert_eq!(r.deadlines(end).hold_end, None);
        assert_eq!(r.ready(end), Some(Why::Hangup));
    }

    #[test]
    fn a_due_reconcile_waits_the_gap_after_the_last_and_any_back_off_hold() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut backoff = Backoff::default();
        assert_eq!(gate(&backoff, None, t0), None);
        assert_eq!(gate(&backoff, Some(t0), t0 + ms(50)), Some(t0 + GAP));
        assert_eq!(gate(&backoff, Some(t0), t0 + GAP), None);
        let hold = backoff.failed(t0);
        assert_eq!(gate(&backoff, Some(t0), t0 + ms(50)), Some(t0 + hold));
    }
}
