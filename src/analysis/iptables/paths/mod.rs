//! The order in which the kernel evaluates a table's rules for one hook, and which rules
//! can never match because an earlier one takes all their packets.
//!
//! [`Walk::new`] follows a built-in chain and every jump in order (depth first, as the kernel
//! does), giving each rule reached the conjunction of the conditions on its path, then finds,
//! for each rule of interest, the first earlier rule that takes every packet it would match
//! and ends evaluation (a terminal target), or returns from a chain on its path. The walk is
//! bounded in time and memory whatever the ruleset (how: `walker/mod.rs`); where a bound
//! stops it, it says where ([`Cut`]) and claims nothing about the rules not followed.
//!
//! A [`Walk`] owns its steps and its shadows, and hands out only references into them
//! ([`Shadow`], [`Walk::reached`]): a shadow found on one hook's walk can never be read
//! against another hook's steps (a chain reached from PREROUTING and OUTPUT, as kube-proxy's
//! KUBE-SERVICES is, has a different position on each walk).

use std::cell::Cell;
use std::collections::HashMap;
use std::net::IpAddr;
use std::rc::Rc;

use serde::Serialize;

use crate::model::anyrule::{Cond, Match, Target, parse_rule};
use crate::model::save::{Dump, SavedRule};

mod walker;

/// Chains deeper than this are not followed (iptables itself refuses loops).
pub(crate) const MAX_DEPTH: usize = 32;

/// How much one doctor run may walk.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Different path conditions a chain is walked with exactly; past them, each further one
    /// is merged with the others (the conditions common to all).
    pub exact_entries: usize,
    /// Walks of one chain at most, exact and merged; a jump past them is not followed.
    pub walks_per_chain: usize,
    /// Steps plus the conditions they carry, over every walk sharing a [`Budget`] (each
    /// costs some 100 bytes), plus one per [`CELL_BYTES`] of text a step holds of its own
    /// (a long opaque match is shared by every path through its rule, not copied).
    pub cells: usize,
    /// Comparisons of one rule's path conditions with another's (in the search for shadows,
    /// and for chains entered again), a comparison of many conditions counting as several.
    pub comparisons: usize,
}

/// Doctor's limits: kube-proxy's 10,000 services walk in well under them; what does not
/// stays under a few hundred MiB and a few seconds.
pub const LIMITS: Limits = Limits {
    exact_entries: 16,
    walks_per_chain: 1024,
    cells: 4_000_000,
    comparisons: 20_000_000,
};

/// The bytes one cell stands for.
pub(crate) const CELL_BYTES: usize = 100;

/// Pairs of conditions a comparison pays for (a rule of a few conditions against another).
const PAIRS_PER_COMPARISON: usize = 16;

/// What walks sharing it may still spend.
#[derive(Debug)]
pub struct Budget {
    limits: Limits,
    cells: Cell<usize>,
    comparisons: Cell<usize>,
}

impl Budget {
    pub fn new(limits: Limits) -> Budget {
        Budget {
            limits,
            cells: Cell::new(limits.cells),
            comparisons: Cell::new(limits.comparisons),
        }
    }

    /// Pay for a step with path conditions `cond` and `target`: a cell, one per condition,
    /// and one per [`CELL_BYTES`] of the text they own.
    fn step(&self, cond: &Match, target: &Target) -> bool {
        let text = |s: &str| s.len();
        let owned: usize = cond
            .conds
            .iter()
            .map(|c| match c {
                Cond::Protocol { proto: s, .. }
                | Cond::InIface { name: s, .. }
                | Cond::OutIface { name: s, .. } => text(s),
                Cond::DPorts { ports, .. } | Cond::SPorts { ports, .. } => 4 * ports.0.len(),
                Cond::DstType { types, .. } | Cond::SrcType { types, .. } => {
                    types.iter().map(|t| 24 + text(t)).sum()
                }
                // Shared with the parsed rule, or held inline.
                Cond::Other(_) | Cond::Src { .. } | Cond::Dst { .. } => 0,
            })
            .sum();
        let owned = owned
            + match target {
                Target::Jump(s)
                | Target::Goto(s)
                | Target::Other(s)
                | Target::Dnat { to: s }
                | Target::Snat { to: s }
                | Target::Redirect { to_ports: Some(s) } => text(s),
                _ => 0,
            };
        take(&self.cells, 1 + cond.conds.len() + owned / CELL_BYTES)
    }

    /// Pay for comparing conditions `a` with `b` (they cost by the pairs of their conditions).
    fn compare(&self, a: &Match, b: &Match) -> bool {
        take(
            &self.comparisons,
            1 + a.conds.len() * b.conds.len() / PAIRS_PER_COMPARISON,
        )
    }
}

fn take(left: &Cell<usize>, n: usize) -> bool {
    match left.get().checked_sub(n) {
        Some(rest) => {
            left.set(rest);
            true
        }
        None => false,
    }
}

/// Why a walk stopped following a jump, or stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum CutReason {
    /// The chain jumped to is nested deeper than [`MAX_DEPTH`].
    TooDeep,
    /// The chain jumped to was walked [`Limits::walks_per_chain`] times already.
    TooManyPaths,
    /// The budget of steps ([`Limits::cells`]) ran out here: nothing after was walked.
    TooManySteps,
    /// The search for shadows ran out of comparisons ([`Limits::comparisons`]) here: no rule
    /// from here on is claimed never to match.
    TooManyComparisons,
}

impl std::fmt::Display for CutReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CutReason::TooDeep => "chains nested too deep",
            CutReason::TooManyPaths => "the chain it jumps to is reached too many ways",
            CutReason::TooManySteps => "too many rules on all paths",
            CutReason::TooManyComparisons => "too many rules to compare",
        })
    }
}

/// Where a walk stopped: the rule whose jump was not followed, or where it stopped.
#[derive(Clone, Copy, Debug)]
pub struct Cut<'t> {
    pub rule: &'t SavedRule,
    /// 1-based position in its chain.
    pub position: usize,
    pub reason: CutReason,
}

/// One rule as reached from a built-in chain.
#[derive(Clone, Debug)]
pub struct Step<'t> {
    pub rule: &'t SavedRule,
    /// 1-based position in its chain.
    pub position: usize,
    /// The rule's conditions and those of every jump that led to it.
    pub cond: Match,
    pub target: Target,
    /// The chain invocations it runs in, outermost first (a RETURN ends the innermost).
    pub frames: Rc<[u32]>,
    /// The innermost of them walked with merged conditions, if any: `cond` overstates the
    /// packets that reach the step, so it takes packets only from steps in that invocation.
    region: Option<u32>,
}

impl Step<'_> {
    /// Whether `cond` is exactly the conditions of the step's path: false in an invocation
    /// walked with merged conditions, where `cond` is wider than the packets that reach it
    /// (claim nothing from it about which packets it takes).
    pub fn exact(&self) -> bool {
        self.region.is_none()
    }
}

/// Every rule of a table parsed once, in table order (walks of several hooks share it).
pub(crate) fn parse_table(table: &Dump) -> Vec<(Match, Target)> {
    table.rules.iter().map(|r| parse_rule(&r.args)).collect()
}

/// One built-in chain of one table, walked: its steps in evaluation order, and for each the
/// earlier step that takes all its packets, if one does. Indices never leave it.
#[derive(Debug)]
pub struct Walk<'t> {
    hook: &'static str,
    steps: Vec<Step<'t>>,
    /// Per step, the index of the step shadowing it (same walk).
    shadowed_by: Vec<Option<usize>>,
    cuts: Vec<Cut<'t>>,
}

/// A rule that never matches on a walk, and the earlier rule that takes its packets: both
/// borrowed from the one walk they were found on.
#[derive(Clone, Copy, Debug)]
pub struct Shadow<'w, 't> {
    pub shadowed: &'w Step<'t>,
    pub by: &'w Step<'t>,
}

impl<'t> Walk<'t> {
    /// Walk `hook` of `table` (`parsed` is [`parse_table`] of it) and find the shadows of the
    /// steps `interesting` selects, within [`LIMITS`].
    pub fn new(
        table: &'t Dump,
        parsed: &[(Match, Target)],
        hook: &'static str,
        interesting: impl Fn(&Step) -> bool,
    ) -> Walk<'t> {
        Walk::within(table, parsed, hook, interesting, &Budget::new(LIMITS))
    }

    /// [`Walk::new`], spending from `budget` (shared by the walks of one run).
    pub fn within(
        table: &'t Dump,
        parsed: &[(Match, Target)],
        hook: &'static str,
        interesting: impl Fn(&Step) -> bool,
        budget: &Budget,
    ) -> Walk<'t> {
        let walker::Walked {
            steps,
            mut cuts,
            unfollowed,
        } = walker::walk(table, parsed, hook, budget);
        let mut shadowed_by = vec![None; steps.len()];
        let (found, stopped) = shadows(&steps, interesting, budget);
        for s in found {
            // Some paths to a rule of a chain not followed completely were never seen.
            if !unfollowed.contains(steps[s.shadowed].rule.chain.as_str()) {
                shadowed_by[s.shadowed] = Some(s.by);
            }
        }
        if let Some(at) = stopped {
            cuts.push(Cut {
                rule: steps[at].rule,
                position: steps[at].position,
                reason: CutReason::TooManyComparisons,
            });
        }
        Walk {
            hook,
            steps,
            shadowed_by,
            cuts,
        }
    }

    /// The built-in chain walked.
    pub fn hook(&self) -> &'static str {
        self.hook
    }

    /// False when a bound cut the walk short ([`Walk::cuts`]).
    pub fn complete(&self) -> bool {
        self.cuts.is_empty()
    }

    /// Where the walk stopped following jumps, or stopped, and why.
    pub fn cuts(&self) -> &[Cut<'t>] {
        &self.cuts
    }

    pub fn steps(&self) -> &[Step<'t>] {
        &self.steps
    }

    /// Every step in evaluation order, with the earlier step that takes all its packets.
    pub fn reached(&self) -> impl Iterator<Item = (&Step<'t>, Option<&Step<'t>>)> {
        self.steps
            .iter()
            .zip(&self.shadowed_by)
            .map(|(step, by)| (step, by.map(|b| &self.steps[b])))
    }

    /// The shadows found, in evaluation order of the rule that never matches.
    pub fn shadows(&self) -> impl Iterator<Item = Shadow<'_, 't>> {
        self.reached()
            .filter_map(|(shadowed, by)| by.map(|by| Shadow { shadowed, by }))
    }
}

/// A rule that never matches, and the earlier rule that takes its packets, as indices into
/// one walk's steps (private: [`Walk`] turns them into references).
#[derive(Clone, Copy, Debug)]
struct Found {
    shadowed: usize,
    by: usize,
}

/// For every step `interesting` selects, the first earlier step that ends evaluation for all
/// its packets: a terminal target whose path conditions cover its own, or a RETURN that
/// covers it in a chain it runs in. Earlier enders are indexed by destination port and by
/// destination address, so this stays near-linear on kube-proxy-sized tables (where
/// thousands of DNATs share a port but each has its own service address). Each comparison
/// is paid from `budget`; when it runs out, the search stops and the step it stopped at is
/// returned too (no step from there on is claimed).
fn shadows(
    steps: &[Step],
    interesting: impl Fn(&Step) -> bool,
    budget: &Budget,
) -> (Vec<Found>, Option<usize>) {
    const INDEXED_PORTS: u32 = 1024;
    let mut by_port: HashMap<u16, Bucket> = HashMap::new();
    let mut any_port = Bucket::default();
    // RETURNs and gotos, by the chain invocation they leave before its end.
    let mut leaves: HashMap<u32, Vec<usize>> = HashMap::new();
    let leave = |leaves: &mut HashMap<u32, Vec<usize>>, i: usize, step: &Step| {
        if let Some(f) = step.frames.last() {
            leaves.entry(*f).or_default().push(i);
        }
    };
    let mut found = Vec::new();
    for (i, step) in steps.iter().enumerate() {
        if matches!(step.target, Target::Goto(_)) {
            leave(&mut leaves, i, step);
        }
        let ends = step.target.is_terminal() || step.target == Target::Return;
        let wanted = interesting(step);
        if !ends && !wanted {
            continue;
        }
        // An ender that names ports or a host address can cover this step only if this step
        // names them too: look only where it could be.
        let dst = host_destination(&step.cond);
        let mut candidates = any_port.candidates(dst);
        if let Some(bucket) = exact_ports(&step.cond).and_then(|p| by_port.get(&p)) {
            candidates.extend(bucket.candidates(dst));
        }
        // A RETURN ends only its own invocation: those of the invocations this step runs in.
        for list in step.frames.iter().filter_map(|f| leaves.get(f)) {
            candidates.extend(list.iter().filter(|&&r| steps[r].target == Target::Return));
        }
        candidates.sort_unstable();
        candidates.dedup();
        let mut by = None;
        for a in candidates {
            if !budget.compare(&steps[a].cond, &step.cond) {
                return (found, Some(i));
            }
            if ends_for(&steps[a], step) && !detoured(steps, &leaves, a, step, budget) {
                by = Some(a);
                break;
            }
        }
        if let Some(by) = by {
            if wanted {
                found.push(Found { shadowed: i, by });
            }
            // A rule that is never reached takes nothing from later rules.
            continue;
        }
        if !ends {
            continue;
        }
        if step.target == Target::Return {
            leave(&mut leaves, i, step);
            continue;
        }
        match port_set(&step.cond) {
            Some(ranges) if span(&ranges) <= INDEXED_PORTS => {
                for (lo, hi) in ranges {
                    for port in lo..=hi {
                        by_port.entry(port).or_default().file(i, dst);
                    }
                }
            }
            _ => any_port.file(i, dst),
        }
    }
    (found, None)
}

/// Whether some of `b`'s packets go around the earlier step `a` without being stopped: a
/// RETURN (or a goto, whose chain may end and go back past it) before `a` leaves a chain
/// invocation that `a` runs in but `b` does not, and may match some of `b`'s packets
/// (Docker's `-i docker0 -j RETURN` at the top of DOCKER). Then `a`'s conditions overstate
/// what reaches it, and it cannot be said to shadow `b`. Past the comparison budget, it may.
fn detoured(
    steps: &[Step],
    leaves: &HashMap<u32, Vec<usize>>,
    a: usize,
    b: &Step,
    budget: &Budget,
) -> bool {
    steps[a]
        .frames
        .iter()
        .filter(|f| !b.frames.contains(f))
        .filter_map(|f| leaves.get(f))
        .flat_map(|list| list.iter().take_while(|&&r| r < a))
        .any(|&r| {
            !budget.compare(&steps[r].cond, &b.cond) || !steps[r].cond.and(&b.cond).is_empty()
        })
}

/// Enders filed by the host address they require (`-d A/32`), if any.
#[derive(Default)]
struct Bucket {
    by_host: HashMap<IpAddr, Vec<usize>>,
    rest: Vec<usize>,
}

impl Bucket {
    fn file(&mut self, index: usize, dst: Option<IpAddr>) {
        match dst {
            Some(addr) => self.by_host.entry(addr).or_default().push(index),
            None => self.rest.push(index),
        }
    }

    /// Enders that might cover a step requiring `dst` (a host-address ender covers only a
    /// step requiring the same host).
    fn candidates(&self, dst: Option<IpAddr>) -> Vec<usize> {
        let mut out = self.rest.clone();
        if let Some(same) = dst.and_then(|d| self.by_host.get(&d)) {
            out.extend(same);
        }
        out
    }
}

/// The single host a step's packets must be addressed to (a positive `-d` of a full prefix).
fn host_destination(cond: &Match) -> Option<IpAddr> {
    cond.conds.iter().find_map(|c| match c {
        Cond::Dst {
            negated: false,
            net,
        } if net.prefix == crate::model::family::Family::of(net.addr).host_prefix() => {
            Some(net.addr)
        }
        _ => None,
    })
}

/// Whether the earlier step `a` keeps every packet of `b` from reaching it.
fn ends_for(a: &Step, b: &Step) -> bool {
    // A step of a merged invocation takes packets only from steps of that invocation.
    if a.region.is_some_and(|r| !b.frames.contains(&r)) {
        return false;
    }
    let ends = match a.target {
        // A RETURN ends its own chain invocation: b must run inside it.
        Target::Return => a.frames.last().is_some_and(|f| b.frames.contains(f)),
        _ => a.target.is_terminal(),
    };
    ends && a.cond.covers(&b.cond)
}

/// The destination ports a step requires: the intersection of its positive port conditions
/// (a multiport jump and a `--dport` in the chain it jumps to), as ranges.
pub(crate) fn port_set(cond: &Match) -> Option<Vec<(u16, u16)>> {
    cond.conds
        .iter()
        .filter_map(|c| match c {
            Cond::DPorts {
                negated: false,
                ports,
            } => Some(ports.clone()),
            _ => None,
        })
        .reduce(|a, b| a.intersection(&b))
        .map(|p| p.0)
}

/// The lowest port a step requires: any earlier rule that covers it must match this port
/// too, so it is filed under it (or under no port).
fn exact_ports(cond: &Match) -> Option<u16> {
    port_set(cond).and_then(|r| r.first().map(|(lo, _)| *lo))
}

fn span(ranges: &[(u16, u16)]) -> u32 {
    ranges
        .iter()
        .map(|(lo, hi)| u32::from(*hi) - u32::from(*lo) + 1)
        .sum()
}

#[cfg(test)]
mod tests;
