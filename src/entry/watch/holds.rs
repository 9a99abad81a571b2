//! Back-off per container: a repair that puts back a container's rules counts in that
//! container's [`Backoff`] only, so a deleter of one container's rules holds that container's
//! repairs and no other's (they come back at once). The shared rules (the jumps, the guard)
//! have a [`Backoff`] of their own in the loop, which holds every repair, since no container's
//! forward works without them. Pure (time is given).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::backoff::Backoff;
use crate::model::oci::ContainerId;

#[derive(Debug, Default)]
pub struct Holds {
    each: HashMap<ContainerId, Backoff>,
}

/// A container whose repairs now wait.
#[derive(Debug, PartialEq, Eq)]
pub struct NewHold {
    pub container: ContainerId,
    /// Repairs of its rules in a row.
    pub streak: u32,
    pub hold: Duration,
}

impl Holds {
    /// After a repair at `now` that put back rules of `containers` (each named once): the
    /// holds that begin. Containers quiet for `backoff::WINDOW` and not held are forgotten.
    pub fn after(&mut self, containers: &[ContainerId], now: Instant) -> Vec<NewHold> {
        let mut begun = Vec::new();
        for id in containers {
            let backoff = self.each.entry(id.clone()).or_default();
            if let Some(hold) = backoff.after(1, now) {
                begun.push(NewHold {
                    container: id.clone(),
                    streak: backoff.streak(),
                    hold,
                });
            }
        }
        self.each
            .retain(|id, b| containers.contains(id) || b.held(now).is_some() || b.recent(now));
        begun
    }

    /// The containers whose repairs wait at `now`.
    pub fn held(&self, now: Instant) -> Vec<ContainerId> {
        let mut held: Vec<ContainerId> = self
            .each
            .iter()
            .filter(|(_, b)| b.held(now).is_some())
            .map(|(id, _)| id.clone())
            .collect();
        held.sort();
        held
    }

    /// When the first hold at `now` ends: a reconcile is due then, to put that container's
    /// rules back.
    pub fn next_end(&self, now: Instant) -> Option<Instant> {
        self.each.values().filter_map(|b| b.held(now)).min()
    }

    /// A repair asked for at once (SIGHUP): every hold ends, the streaks stay.
    pub fn release(&mut self) {
        self.each.values_mut().for_each(Backoff::release);
    }
}

#[cfg(test)]
mod tests {
    use super::super::backoff::WINDOW;
    use super::*;
    use crate::entry::watch::backoff::{FIRST, FREE};

    fn id(s: &str) -> ContainerId {
        s.parse().unwrap()
    }

    #[test]
    fn a_deleter_of_one_containers_rules_holds_that_container_only() {
        let mut holds = Holds::default();
        let t0 = Instant::now();
        let (a, b) = (id("a"), id("b"));
        let mut now = t0;
        // a's rules put back again and again; b's once, in the middle of a's streak.
        for i in 0..FREE {
            now = t0 + Duration::from_millis(100 * u64::from(i));
            let begun = holds.after(std::slice::from_ref(&a), now);
            if i + 1 < FREE {
                assert!(begun.is_empty(), "{i}");
            } else {
                assert_eq!(
                    begun,
                    vec![NewHold {
                        container: a.clone(),
                        streak: FREE,
                        hold: FIRST
                    }]
                );
            }
        }
        assert_eq!(holds.held(now), vec![a.clone()]);
        assert!(holds.after(std::slice::from_ref(&b), now).is_empty());
        assert_eq!(holds.held(now), vec![a.clone()], "b is repaired at once");
        assert_eq!(holds.next_end(now), Some(now + FIRST));
        // Once the hold is over, a is due again; SIGHUP ends it sooner.
        assert!(holds.held(now + FIRST).is_empty());
        holds.release();
        assert!(holds.held(now).is_empty());
    }

    #[test]
    fn a_container_quiet_for_the_window_is_forgotten() {
        let mut holds = Holds::default();
        let t0 = Instant::now();
        let a = id("a");
        for i in 0..FREE {
            holds.after(
                std::slice::from_ref(&a),
                t0 + Duration::from_millis(u64::from(i)),
            );
        }
        let later = t0 + WINDOW + MAX_AND_ONE;
        holds.after(&[], later);
        assert!(holds.each.is_empty());
    }

    const MAX_AND_ONE: Duration = Duration::from_secs(31);
}
