//! The order a repair puts the live containers' DNATs back in: create's. Pure.
//!
//! Create inserts a container's DNATs at the top of their chain, so the chain holds the
//! containers newest first. What "newest" is, a repair reads from the ledger:
//!
//! 1. the stack (`ops::Held::Stack`): a manifest whose `stacked_on` names another goes in
//!    front of it, and in front of every one that one names, through any manifest of the
//!    ledger (a dead one in between included), so a stack keeps its order whatever happened
//!    to its files since;
//! 2. then the manifest file's modification time, newest first: a manifest is rewritten (a
//!    joiner's `shared_by`, a re-ADD), so its time is a guess, used only where no stack says;
//! 3. then the container id, for the same result every time.
//!
//! Stacks cannot form a cycle (a holder named by the one it stacks on is stored without that
//! name first, `held::store_turned`); should a ledger hold one anyway, the containers on it
//! go by time and id among themselves.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::time::SystemTime;

use crate::model::oci::ContainerId;
use crate::state::ledger::Manifest;

/// The live manifests in create's order, and which must stay in front of which.
#[derive(Debug, Default)]
pub struct Ranked<'m> {
    /// Newest first.
    pub manifests: Vec<&'m Manifest>,
    /// `(front, behind)`, indices into `manifests`: `front` is stacked on `behind`, directly
    /// or through others; always `front < behind`.
    ahead: HashSet<(usize, usize)>,
}

impl<'m> Ranked<'m> {
    /// Manifests already in order, none stacked on another.
    pub fn unstacked(manifests: Vec<&'m Manifest>) -> Ranked<'m> {
        Ranked {
            manifests,
            ahead: HashSet::new(),
        }
    }

    /// Whether the manifest at `front` is stacked (directly or through others) on the one at
    /// `behind`: its DNATs must stay in front of that one's.
    pub fn in_front(&self, front: usize, behind: usize) -> bool {
        self.ahead.contains(&(front, behind))
    }
}

/// Rank `live` (each manifest with its file's modification time) in create's order;
/// `stacked_on` holds every manifest's of the ledger (live or not), by container id: who must
/// stay in front of whom (`stacked_pairs`), then the order (`placed`).
pub fn rank<'m>(
    live: &[(SystemTime, &'m Manifest)],
    stacked_on: &HashMap<ContainerId, Vec<ContainerId>>,
) -> Ranked<'m> {
    let ahead = stacked_pairs(live, stacked_on);
    let placed = placed(live, &ahead);
    let mut at = vec![0usize; live.len()];
    for (new, &old) in placed.iter().enumerate() {
        at[old] = new;
    }
    Ranked {
        manifests: placed.iter().map(|&i| live[i].1).collect(),
        ahead: ahead.into_iter().map(|(f, b)| (at[f], at[b])).collect(),
    }
}

/// `(front, behind)`, indices into `live`: who each live manifest is stacked on,
/// transitively, among the live ones. A cycle (impossible by construction) is dropped: its
/// members are ordered by time and id only.
fn stacked_pairs(
    live: &[(SystemTime, &Manifest)],
    stacked_on: &HashMap<ContainerId, Vec<ContainerId>>,
) -> HashSet<(usize, usize)> {
    let index: HashMap<&ContainerId, usize> = live
        .iter()
        .enumerate()
        .map(|(i, (_, m))| (&m.container_id, i))
        .collect();
    let mut ahead: HashSet<(usize, usize)> = HashSet::new();
    for (i, (_, m)) in live.iter().enumerate() {
        let mut seen: HashSet<&ContainerId> = HashSet::from([&m.container_id]);
        let mut next: Vec<&ContainerId> = m.stacked_on.iter().collect();
        while let Some(id) = next.pop() {
            if !seen.insert(id) {
                continue;
            }
            if let Some(&j) = index.get(id) {
                ahead.insert((i, j));
            }
            let on = match index.get(id) {
                Some(&j) => &live[j].1.stacked_on,
                None => stacked_on.get(id).map_or(&[][..], Vec::as_slice),
            };
            next.extend(on);
        }
    }
    let cyclic: Vec<(usize, usize)> = ahead
        .iter()
        .copied()
        .filter(|&(i, j)| ahead.contains(&(j, i)))
        .collect();
    for pair in cyclic {
        ahead.remove(&pair);
    }
    ahead
}

/// The indices of `live` in create's order, by Kahn's walk over `ahead`: of the manifests
/// nothing still unplaced must precede, the newest (then the greatest id) goes next.
fn placed(live: &[(SystemTime, &Manifest)], ahead: &HashSet<(usize, usize)>) -> Vec<usize> {
    let mut waits_for = vec![0usize; live.len()];
    let mut behind: Vec<Vec<usize>> = vec![Vec::new(); live.len()];
    for &(front, back) in ahead {
        waits_for[back] += 1;
        behind[front].push(back);
    }
    let key = |i: usize| (live[i].0, &live[i].1.container_id, Reverse(i));
    let mut ready: BinaryHeap<_> = (0..live.len())
        .filter(|&i| waits_for[i] == 0)
        .map(key)
        .collect();
    let mut placed: Vec<usize> = Vec::with_capacity(live.len());
    while let Some((_, _, Reverse(i))) = ready.pop() {
        placed.push(i);
        for &b in &behind[i] {
            waits_for[b] -= 1;
            if waits_for[b] == 0 {
                ready.push(key(b));
            }
        }
    }
    // The relation is acyclic once mutual pairs are gone, so every manifest is placed.
    debug_assert_eq!(placed.len(), live.len());
    placed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::ledger::tests::sample;
    use std::time::Duration;

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    fn manifest(id: &str, on: &[&str]) -> Manifest {
        let mut m = sample();
        m.container_id = id.parse().unwrap();
        m.stacked_on = on.iter().map(|s| s.parse().unwrap()).collect();
        m
    }

    fn ids(r: &Ranked) -> Vec<String> {
        r.manifests
            .iter()
            .map(|m| m.container_id.to_string())
            .collect()
    }

    fn graph(all: &[&Manifest]) -> HashMap<ContainerId, Vec<ContainerId>> {
        all.iter()
            .map(|m| (m.container_id.clone(), m.stacked_on.clone()))
            .collect()
    }

    /// Three stacked (a oldest, c newest) with a dead one between b and c, the middle one's
    /// file rewritten last and an unrelated container written in between: the stack keeps its
    /// order, through the dead one, and the unrelated one goes by its time.
    #[test]
    fn a_stack_keeps_its_order_whatever_the_files_times() {
        let a = manifest("a", &[]);
        let b = manifest("b", &["a"]);
        let dead = manifest("dead", &["b"]);
        let c = manifest("c", &["dead"]);
        let x = manifest("x", &[]);
        let stacks = graph(&[&a, &b, &dead, &c, &x]);
        // By time alone: b, x, c, a.
        let live = [(at(10), &a), (at(40), &b), (at(30), &c), (at(35), &x)];
        let ranked = rank(&live, &stacks);
        assert_eq!(ids(&ranked), ["x", "c", "b", "a"]);
        // c is in front of b (through the dead one) and of a; b of a; x of no one.
        let pos = |id: &str| ids(&ranked).iter().position(|i| i == id).unwrap();
        assert!(ranked.in_front(pos("c"), pos("b")));
        assert!(ranked.in_front(pos("c"), pos("a")));
        assert!(ranked.in_front(pos("b"), pos("a")));
        assert!(!ranked.in_front(pos("x"), pos("a")));
        assert!(!ranked.in_front(pos("b"), pos("c")));
    }

    /// Without stacks: newest file first, then the greatest id.
    #[test]
    fn unstacked_manifests_go_by_time_then_id() {
        let (a, b, c) = (manifest("a", &[]), manifest("b", &[]), manifest("c", &[]));
        let live = [(at(5), &a), (at(9), &b), (at(5), &c)];
        let ranked = rank(&live, &HashMap::new());
        assert_eq!(ids(&ranked), ["b", "c", "a"]);
    }

    /// A cycle (a ledger edited by hand): every manifest is still placed, by time and id.
    #[test]
    fn a_cycle_is_ranked_by_time() {
        let a = manifest("a", &["b"]);
        let b = manifest("b", &["a"]);
        let c = manifest("c", &["a"]);
        let stacks = graph(&[&a, &b, &c]);
        let live = [(at(1), &a), (at(2), &b), (at(3), &c)];
        let ranked = rank(&live, &stacks);
        assert_eq!(ids(&ranked), ["c", "b", "a"]);
        assert!(!ranked.in_front(1, 2) && !ranked.in_front(2, 1));
        assert!(ranked.in_front(0, 1) && ranked.in_front(0, 2));
    }
}
