//! The walk itself: a built-in chain and every jump, in the kernel's order, bounded whatever
//! the ruleset.
//!
//! Followed naively, a chain is walked once per path that reaches it, and paths multiply:
//! 30 chains each jumping 4 ways to the next are 4^29 paths to the last one. Two things keep
//! the work polynomial in the rules:
//!
//! - **Once per condition.** A chain entered again with the same path condition (as a set)
//!   is not walked again when every packet that meets the second jump has already been
//!   through the first invocation and came back: then the second pass changes nothing (a
//!   terminal rule there would have taken the packet the first time). That holds unless a
//!   chain invocation open at the first jump and closed before the second could have let
//!   some of those packets out early (a RETURN, or a goto whose chain ends, whose conditions
//!   meet the path's) or is merged (below); then the chain is walked again.
//! - **Merged past a few conditions.** A chain entered with more than
//!   [`Limits::exact_entries`] different conditions is walked, for each further one, with
//!   the conditions common to them all (fewer conditions: more packets, never fewer). Such
//!   an invocation is marked: its rules' conditions overstate what reaches them, so a rule
//!   in it takes packets from later rules only inside that same invocation, where the
//!   unknown part of the entry condition is the same for both ([`Step::region`]). The common
//!   conditions only shrink, so a chain has few merged walks.
//!
//! What is still too much stops the walk where it is and says so ([`Cut`]): a chain nested
//! deeper than [`MAX_DEPTH`], a chain walked [`Limits::walks_per_chain`] times, or the
//! shared budget of steps and conditions ([`Limits::cells`]) spent. The chains not followed
//! completely are returned too: no rule in them is claimed never to match.

use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::rc::Rc;

use super::{Budget, Cut, CutReason, MAX_DEPTH, Step};
use crate::model::anyrule::{Match, Target};
use crate::model::save::{Dump, SavedRule};

/// What one walk found.
pub(super) struct Walked<'t> {
    pub steps: Vec<Step<'t>>,
    pub cuts: Vec<Cut<'t>>,
    /// Chains some of whose paths were not followed (nothing in them may be claimed).
    pub unfollowed: HashSet<&'t str>,
}

/// The rules of `table` in the order the kernel tries them for `builtin`. `parsed` is
/// [`super::parse_table`] of `table`.
pub(super) fn walk<'t>(
    table: &'t Dump,
    parsed: &[(Match, Target)],
    builtin: &str,
    budget: &Budget,
) -> Walked<'t> {
    let mut by_chain: HashMap<&str, Vec<Entry<'t, '_>>> = HashMap::new();
    for (rule, (own, target)) in table.rules.iter().zip(parsed) {
        let list = by_chain.entry(rule.chain.as_str()).or_default();
        list.push(Entry {
            position: list.len() + 1,
            rule,
            own,
            target,
        });
    }
    let mut walker = Walker {
        by_chain,
        steps: Vec::with_capacity(table.rules.len()),
        frames: Vec::new(),
        seen: HashMap::new(),
        cuts: Vec::new(),
        unfollowed: HashSet::new(),
        stopped: false,
        budget,
    };
    if let Some((name, _)) = walker.by_chain.get_key_value(builtin) {
        let name: &'t str = name;
        let mut stack = vec![name];
        walker.chain(
            name,
            &Match::default(),
            &mut Vec::new(),
            &mut stack,
            None,
            false,
        );
    }
    Walked {
        steps: walker.steps,
        cuts: walker.cuts,
        unfollowed: walker.unfollowed,
    }
}

#[derive(Clone, Copy)]
struct Entry<'t, 'p> {
    position: usize,
    rule: &'t SavedRule,
    own: &'p Match,
    target: &'p Target,
}

/// One chain invocation.
#[derive(Default)]
struct Frame {
    /// Walked with merged conditions.
    merged: bool,
    /// Its RETURNs and gotos (step indices): ways out before its end.
    leaves: Vec<usize>,
}

/// The condition a chain was walked with.
enum Entered {
    /// The jump's own: the step at this index.
    Jump(usize),
    Merged(Match),
}

/// A chain's walks so far.
#[derive(Default)]
struct Seen {
    /// The conditions it was walked with, and the frames of the jump that entered it.
    walks: Vec<Memo>,
    /// Different conditions it was walked with exactly.
    exact: usize,
    /// The conditions common to every entry since merging began.
    common: Option<Match>,
}

struct Memo {
    key: u64,
    /// The condition it was walked with: the jump's (a step index), or merged.
    cond: Entered,
    /// The frames of the jump, and its innermost merged invocation.
    at: Rc<[u32]>,
    region: Option<u32>,
}

struct Walker<'t, 'p, 'b> {
    by_chain: HashMap<&'t str, Vec<Entry<'t, 'p>>>,
    steps: Vec<Step<'t>>,
    frames: Vec<Frame>,
    seen: HashMap<&'t str, Seen>,
    cuts: Vec<Cut<'t>>,
    unfollowed: HashSet<&'t str>,
    /// The budget ran out: nothing more is walked.
    stopped: bool,
    budget: &'b Budget,
}

impl<'t> Walker<'t, '_, '_> {
    /// Walk chain `name` entered with `cond` from the invocations `frames` (outermost first),
    /// `stack` the chains they run (`name` last); `region` the innermost merged invocation.
    fn chain(
        &mut self,
        name: &'t str,
        cond: &Match,
        frames: &mut Vec<u32>,
        stack: &mut Vec<&'t str>,
        region: Option<u32>,
        merged: bool,
    ) {
        let Some(rules) = self.by_chain.get(name).cloned() else {
            return;
        };
        let id = u32::try_from(self.frames.len()).unwrap_or(u32::MAX);
        self.frames.push(Frame {
            merged,
            leaves: Vec::new(),
        });
        let region = if merged { Some(id) } else { region };
        frames.push(id);
        // Shared by every step of this invocation.
        let here: Rc<[u32]> = Rc::from(frames.as_slice());
        for entry in &rules {
            if self.stopped {
                break;
            }
            // Paid before the check that may skip it: the check costs too.
            let cond = cond.and(entry.own);
            if !self.budget.step(&cond, entry.target) {
                self.stop(entry, stack);
                break;
            }
            if cond.is_empty() {
                continue;
            }
            let Some(to) = self.record(entry, cond, id, &here, region) else {
                continue;
            };
            self.follow(entry, to, &here, (frames, stack), region);
        }
        frames.pop();
    }

    /// The step of `entry` reached with `cond` in invocation `id` (`here`: its frames),
    /// recorded; the chain it jumps or goes to, when there is one.
    fn record(
        &mut self,
        entry: &Entry<'t, '_>,
        cond: Match,
        id: u32,
        here: &Rc<[u32]>,
        region: Option<u32>,
    ) -> Option<&'t str> {
        let into = match entry.target {
            Target::Jump(to) | Target::Goto(to) => {
                self.by_chain.get_key_value(to.as_str()).map(|(k, _)| *k)
            }
            _ => None,
        };
        if matches!(entry.target, Target::Return | Target::Goto(_)) {
            self.frames[id as usize].leaves.push(self.steps.len());
        }
        self.steps.push(Step {
            rule: entry.rule,
            position: entry.position,
            cond,
            target: entry.target.clone(),
            frames: here.clone(),
            region,
        });
        into
    }

    /// The jump of the step just recorded (`entry`'s) into chain `to`, followed unless a
    /// loop, too deep, adding nothing, or past the walks a chain may have.
    fn follow(
        &mut self,
        entry: &Entry<'t, '_>,
        to: &'t str,
        here: &Rc<[u32]>,
        (frames, stack): (&mut Vec<u32>, &mut Vec<&'t str>),
        region: Option<u32>,
    ) {
        // A loop (iptables refuses them): not followed, as the kernel never would.
        if stack.contains(&to) {
            return;
        }
        if stack.len() >= MAX_DEPTH {
            self.cut(entry, to, CutReason::TooDeep);
            return;
        }
        let cond = self
            .steps
            .last()
            .map(|s| s.cond.clone())
            .unwrap_or_default();
        let Some((cond, merged)) = self.entry_condition(to, cond, here, region) else {
            return;
        };
        if self.seen.get(to).map_or(0, |s| s.walks.len()) >= self.budget.limits.walks_per_chain {
            self.cut(entry, to, CutReason::TooManyPaths);
            return;
        }
        let entered = match merged {
            true => Entered::Merged(cond.clone()),
            false => Entered::Jump(self.steps.len() - 1),
        };
        let seen = self.seen.entry(to).or_default();
        seen.walks.push(Memo {
            key: key(&cond),
            cond: entered,
            at: here.clone(),
            region,
        });
        if !merged {
            seen.exact += 1;
        }
        stack.push(to);
        self.chain(to, &cond, frames, stack, region, merged);
        stack.pop();
    }

    /// The condition to walk chain `to` with, entered with `cond` from the invocations
    /// `here` (the innermost merged one `region`), and whether it is merged; `None` when
    /// walking it again would add nothing.
    fn entry_condition(
        &mut self,
        to: &str,
        cond: Match,
        here: &[u32],
        region: Option<u32>,
    ) -> Option<(Match, bool)> {
        let limit = self.budget.limits.exact_entries;
        let seen = self.seen.get(to);
        let exact = seen.is_none_or(|s| s.exact < limit || self.find(s, &cond, region).is_some());
        let (cond, merged) = if exact {
            (cond, false)
        } else {
            let seen = self.seen.get_mut(to).expect("seen above");
            let before = match seen.common.take() {
                Some(c) => c,
                None => {
                    let steps = &self.steps;
                    let mut walks = seen.walks.iter().map(|m| m.cond(steps));
                    let first = walks.next().cloned().unwrap_or_default();
                    walks.fold(first, |c, m| common(&c, m))
                }
            };
            let common = common(&before, &cond);
            seen.common = Some(common.clone());
            (common, true)
        };
        let k = key(&cond);
        let again = self.seen.get(to).is_none_or(|seen| {
            seen.walks
                .iter()
                .filter(|m| m.key == k && m.region == region && same(m.cond(&self.steps), &cond))
                .all(|m| !self.passed_through(&m.at, here, &cond))
        });
        again.then_some((cond, merged))
    }

    /// A walk of `seen` with exactly `cond`, entered from the merged invocation `region`.
    fn find<'s>(&self, seen: &'s Seen, cond: &Match, region: Option<u32>) -> Option<&'s Memo> {
        let k = key(cond);
        seen.walks
            .iter()
            .find(|m| m.key == k && m.region == region && same(m.cond(&self.steps), cond))
    }

    /// Whether every packet of `cond` that meets a jump from the invocations `here` went
    /// through the earlier jump from `at` first: no invocation open there and closed since
    /// was merged or had a way out early that such a packet may take (past the comparison
    /// budget, one may).
    fn passed_through(&self, at: &[u32], here: &[u32], cond: &Match) -> bool {
        at.iter().filter(|f| !here.contains(f)).all(|&f| {
            let frame = &self.frames[f as usize];
            !frame.merged
                && frame.leaves.iter().all(|&i| {
                    let leave = &self.steps[i].cond;
                    self.budget.compare(leave, cond) && leave.and(cond).is_empty()
                })
        })
    }

    /// A jump into `to` not followed (each jump named once).
    fn cut(&mut self, entry: &Entry<'t, '_>, to: &'t str, reason: CutReason) {
        let named = |c: &Cut| std::ptr::eq(c.rule, entry.rule) && c.reason == reason;
        if self.cuts.iter().any(named) {
            return;
        }
        self.cuts.push(Cut {
            rule: entry.rule,
            position: entry.position,
            reason,
        });
        self.reachable(to);
    }

    /// The budget ran out at `entry`: the rest of every open invocation is not walked.
    fn stop(&mut self, entry: &Entry<'t, '_>, stack: &[&'t str]) {
        self.stopped = true;
        self.cuts.push(Cut {
            rule: entry.rule,
            position: entry.position,
            reason: CutReason::TooManySteps,
        });
        for &chain in stack {
            self.reachable(chain);
        }
    }

    /// Mark `chain` and every chain it reaches as not followed completely.
    fn reachable(&mut self, chain: &'t str) {
        let mut todo = vec![chain];
        while let Some(c) = todo.pop() {
            let Some((name, rules)) = self.by_chain.get_key_value(c) else {
                continue;
            };
            if !self.unfollowed.insert(name) {
                continue;
            }
            for e in rules {
                if let Target::Jump(to) | Target::Goto(to) = e.target {
                    todo.push(to);
                }
            }
        }
    }
}

impl Memo {
    fn cond<'s>(&'s self, steps: &'s [Step]) -> &'s Match {
        match &self.cond {
            Entered::Jump(i) => &steps[*i].cond,
            Entered::Merged(m) => m,
        }
    }
}

/// A hash of a condition that does not depend on the order of its conditions.
fn key(cond: &Match) -> u64 {
    cond.conds.iter().fold(cond.conds.len() as u64, |acc, c| {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        c.hash(&mut h);
        acc.wrapping_add(h.finish())
    })
}

/// The same conditions, in any order (`Match::and` never repeats one).
fn same(a: &Match, b: &Match) -> bool {
    a.conds.len() == b.conds.len() && a.conds.iter().all(|c| b.conds.contains(c))
}

/// The conditions of `a` that `b` has too: every packet of either matches it.
fn common(a: &Match, b: &Match) -> Match {
    Match {
        conds: a
            .conds
            .iter()
            .filter(|c| b.conds.contains(c))
            .cloned()
            .collect(),
    }
}

#[cfg(test)]
mod tests;
