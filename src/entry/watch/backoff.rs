//! Not fighting: when what a repair put back is removed again and again, the repairs slow
//! down. Pure (time is given), so the policy is tested without a clock.
//!
//! A repair that put something back within [`WINDOW`] of the previous such repair continues a
//! streak; from the [`FREE`]th repair of a streak on, the next repair waits [`FIRST`], then
//! twice as long each time, up to [`MAX`]. Reconciles that find nothing missing do not end a
//! streak (a deleter every 50 ms leaves room for them); a quiet [`WINDOW`] does.
//!
//! A reconcile that failed (a state directory refused, a table unreadable) is tried again
//! after [`FIRST`], then twice as long after each failure in a row, up to [`MAX`]; one that
//! succeeds ends the run.

use std::time::{Duration, Instant};

/// Repairs further apart than this are unrelated.
pub const WINDOW: Duration = Duration::from_secs(60);
/// Repairs in a row before the first hold: a firewall reload or two is not a fight.
pub const FREE: u32 = 3;
/// The first hold, doubled at each repair of the streak after it.
pub const FIRST: Duration = Duration::from_millis(500);
/// The longest hold: a rule deleted again waits at most this long to come back.
pub const MAX: Duration = Duration::from_secs(30);

#[derive(Debug, Default)]
pub struct Backoff {
    streak: u32,
    last_repair: Option<Instant>,
    hold_until: Option<Instant>,
    failures: u32,
}

impl Backoff {
    /// After a reconcile at `now` that put back `restored` rules: how long the next repair
    /// waits, when it must (a new hold).
    pub fn after(&mut self, restored: usize, now: Instant) -> Option<Duration> {
        self.failures = 0;
        if restored == 0 {
            return None;
        }
        let continues = self
            .last_repair
            .is_some_and(|last| now.saturating_duration_since(last) <= WINDOW);
        self.streak = if continues { self.streak + 1 } else { 1 };
        self.last_repair = Some(now);
        if self.streak < FREE {
            self.hold_until = None;
            return None;
        }
        let doublings = (self.streak - FREE).min(16);
        let hold = FIRST.saturating_mul(1 << doublings).min(MAX);
        self.hold_until = Some(now + hold);
        Some(hold)
    }

    /// After a reconcile at `now` that failed: how long until it is tried again (a new hold).
    pub fn failed(&mut self, now: Instant) -> Duration {
        let doublings = self.failures.min(16);
        self.failures += 1;
        let hold = FIRST.saturating_mul(1 << doublings).min(MAX);
        self.hold_until = Some(now + hold);
        hold
    }

    /// Until when repairs wait, if they do at `now`.
    pub fn held(&self, now: Instant) -> Option<Instant> {
        self.hold_until.filter(|until| *until > now)
    }

    /// Whether a repair at `now` would continue the streak (the last within [`WINDOW`]).
    pub fn recent(&self, now: Instant) -> bool {
        self.last_repair
            .is_some_and(|last| now.saturating_duration_since(last) <= WINDOW)
    }

    /// Repairs in a row so far.
    pub fn streak(&self) -> u32 {
        self.streak
    }

    /// A repair asked for at once (SIGHUP): the hold ends, the streak stays.
    pub fn release(&mut self) {
        self.hold_until = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rule_deleted_again_and_again_waits_longer_each_time_up_to_the_max() {
        let mut b = Backoff::default();
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        // Two repairs in a row are free; reconciles with nothing to put back change nothing.
        assert_eq!(b.after(3, t0), None);
        assert_eq!(b.after(0, t0 + ms(10)), None);
        assert_eq!(b.after(1, t0 + ms(60)), None);
        assert_eq!(b.held(t0 + ms(61)), None);
        let mut now = t0 + ms(120);
        let mut holds = Vec::new();
        for _ in 0..9 {
            let hold = b.after(1, now).unwrap();
            assert_eq!(b.held(now), Some(now + hold));
            holds.push(hold);
            now += hold;
            assert_eq!(b.held(now), None);
        }
        assert_eq!(
            holds,
            [500, 1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000].map(ms)
        );
        assert_eq!(b.streak(), 11);
        // A SIGHUP ends the hold, not the streak.
        b.after(1, now);
        b.release();
        assert_eq!(b.held(now), None);
        assert_eq!(b.after(1, now + ms(1)), Some(MAX));
    }

    #[test]
    fn failures_in_a_row_are_retried_later_each_time_and_a_success_ends_them() {
        let mut b = Backoff::default();
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let holds: Vec<_> = (0..8).map(|i| b.failed(t0 + ms(i))).collect();
        assert_eq!(
            holds,
            [500, 1000, 2000, 4000, 8000, 16000, 30000, 30000].map(ms)
        );
        assert_eq!(b.held(t0 + ms(8)), Some(t0 + ms(7) + MAX));
        assert_eq!(b.after(0, t0 + MAX), None);
        assert_eq!(b.failed(t0 + MAX), FIRST);
        assert_eq!(b.streak(), 0, "failures are no repairs");
    }

    #[test]
    fn repairs_a_window_apart_start_again() {
        let mut b = Backoff::default();
        let t0 = Instant::now();
        for i in 0..5 {
            // A firewall reload every two minutes is repaired at once every time.
            assert_eq!(b.after(4, t0 + 2 * i * WINDOW), None);
            assert_eq!(b.streak(), 1);
        }
    }
}
