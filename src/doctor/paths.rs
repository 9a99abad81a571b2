//! The order in which the kernel evaluates a table's rules for one hook, and which rules
//! can never match because an earlier one takes all their packets.
//!
//! [`Walk::new`] follows a built-in chain and every jump in order (depth first, as the kernel
//! does), giving each rule reached the conjunction of the conditions on its path, then finds,
//! for each rule of interest, the first earlier rule that takes every packet it would match
//! and ends evaluation (a terminal target), or returns from a chain on its path.
//!
//! A [`Walk`] owns its steps and its shadows, and hands out only references into them
//! ([`Shadow`], [`Walk::reached`]): a shadow found on one hook's walk can never be read
//! against another hook's steps (a chain reached from PREROUTING and OUTPUT, as kube-proxy's
//! KUBE-SERVICES is, has a different position on each walk).

use std::collections::HashMap;
use std::net::IpAddr;
use std::rc::Rc;

use crate::matchset::{Cond, Match, Target, parse_rule};
use crate::save::{SavedRule, Table};

/// Chains deeper than this are not followed (iptables itself refuses loops).
const MAX_DEPTH: usize = 32;
/// Rules reached per hook at most; past it the walk stops and says so.
pub const MAX_STEPS: usize = 2_000_000;

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
}

/// Every rule of a table parsed once, in table order (walks of several hooks share it).
pub fn parse_table(table: &Table) -> Vec<(Match, Target)> {
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
    complete: bool,
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
    /// steps `interesting` selects.
    pub fn new(
        table: &'t Table,
        parsed: &[(Match, Target)],
        hook: &'static str,
        interesting: impl Fn(&Step) -> bool,
    ) -> Walk<'t> {
        let (steps, complete) = walk(table, parsed, hook);
        let mut shadowed_by = vec![None; steps.len()];
        for s in shadows(&steps, interesting) {
            shadowed_by[s.shadowed] = Some(s.by);
        }
        Walk {
            hook,
            steps,
            shadowed_by,
            complete,
        }
    }

    /// The built-in chain walked.
    pub fn hook(&self) -> &'static str {
        self.hook
    }

    /// False when [`MAX_STEPS`] cut the walk short.
    pub fn complete(&self) -> bool {
        self.complete
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

/// The rules of `table` in the order the kernel tries them for `builtin`; `complete` is false
/// when [`MAX_STEPS`] cut the walk short. `parsed` is [`parse_table`] of `table`.
fn walk<'t>(table: &'t Table, parsed: &[(Match, Target)], builtin: &str) -> (Vec<Step<'t>>, bool) {
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
        next_frame: 0,
        complete: true,
    };
    if let Some((name, _)) = walker.by_chain.get_key_value(builtin) {
        let name: &'t str = name;
        walker.chain(name, &Match::default(), &mut Vec::new(), &mut Vec::new());
    }
    (walker.steps, walker.complete)
}

#[derive(Clone, Copy)]
struct Entry<'t, 'p> {
    position: usize,
    rule: &'t SavedRule,
    own: &'p Match,
    target: &'p Target,
}

struct Walker<'t, 'p> {
    by_chain: HashMap<&'t str, Vec<Entry<'t, 'p>>>,
    steps: Vec<Step<'t>>,
    next_frame: u32,
    complete: bool,
}

impl<'t, 'p> Walker<'t, 'p> {
    fn chain(
        &mut self,
        name: &'t str,
        cond: &Match,
        frames: &mut Vec<u32>,
        stack: &mut Vec<&'t str>,
    ) {
        if stack.len() >= MAX_DEPTH || stack.contains(&name) {
            return;
        }
        let Some(rules) = self.by_chain.get(name).cloned() else {
            return;
        };
        frames.push(self.next_frame);
        self.next_frame += 1;
        // Shared by every step of this invocation.
        let here: Rc<[u32]> = Rc::from(frames.as_slice());
        stack.push(name);
        for Entry {
            position,
            rule,
            own,
            target,
        } in rules
        {
            if self.steps.len() >= MAX_STEPS {
                self.complete = false;
                break;
            }
            let cond = cond.and(own);
            if cond.is_empty() {
                continue;
            }
            let into = match target {
                Target::Jump(to) | Target::Goto(to) => {
                    self.by_chain.get_key_value(to.as_str()).map(|(k, _)| *k)
                }
                _ => None,
            };
            let step = Step {
                rule,
                position,
                cond,
                target: target.clone(),
                frames: here.clone(),
            };
            match into {
                Some(to) => {
                    let cond = step.cond.clone();
                    self.steps.push(step);
                    self.chain(to, &cond, frames, stack);
                }
                None => self.steps.push(step),
            }
        }
        stack.pop();
        frames.pop();
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
/// thousands of DNATs share a port but each has its own service address).
fn shadows(steps: &[Step], interesting: impl Fn(&Step) -> bool) -> Vec<Found> {
    const INDEXED_PORTS: u32 = 1024;
    let mut by_port: HashMap<u16, Bucket> = HashMap::new();
    let mut any_port = Bucket::default();
    let mut returns: Vec<usize> = Vec::new();
    let mut found = Vec::new();
    for (i, step) in steps.iter().enumerate() {
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
        candidates.sort_unstable();
        candidates.dedup();
        let by = candidates
            .into_iter()
            .find(|&a| ends_for(&steps[a], step) && !detoured(steps, &returns, a, step));
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
            returns.push(i);
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
    found
}

/// Whether some of `b`'s packets go around the earlier step `a` without being stopped: a
/// RETURN before `a` leaves a chain invocation that `a` runs in but `b` does not, and may
/// match some of `b`'s packets (Docker's `-i docker0 -j RETURN` at the top of DOCKER). Then
/// `a`'s conditions overstate what reaches it, and it cannot be said to shadow `b`.
fn detoured(steps: &[Step], returns: &[usize], a: usize, b: &Step) -> bool {
    let a_frames = &steps[a].frames;
    returns.iter().take_while(|&&r| r < a).any(|&r| {
        let ret = &steps[r];
        ret.frames
            .last()
            .is_some_and(|f| a_frames.contains(f) && !b.frames.contains(f))
            && !ret.cond.and(&b.cond).is_empty()
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
        } if net.prefix == crate::family::Family::of(net.addr).host_prefix() => Some(net.addr),
        _ => None,
    })
}

/// Whether the earlier step `a` keeps every packet of `b` from reaching it.
fn ends_for(a: &Step, b: &Step) -> bool {
    if !a.cond.covers(&b.cond) {
        return false;
    }
    if a.target == Target::Return {
        // A RETURN ends its own chain invocation: b must run inside it.
        let frame = a.frames.last();
        return frame.is_some_and(|f| b.frames.contains(f));
    }
    a.target.is_terminal()
}

/// The destination ports a step requires: the intersection of its positive port conditions
/// (a multiport jump and a `--dport` in the chain it jumps to), as ranges.
pub fn port_set(cond: &Match) -> Option<Vec<(u16, u16)>> {
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
mod tests {
    use super::*;
    use crate::save::parse_dump;

    fn table(lines: &str) -> Table {
        parse_dump(&format!("*nat\n{lines}\nCOMMIT\n"))
            .unwrap()
            .remove(0)
    }

    fn dnat(step: &Step) -> bool {
        matches!(step.target, Target::Dnat { .. })
    }

    #[test]
    fn walks_jumps_depth_first_with_path_conditions() {
        let t = table(
            ":PREROUTING ACCEPT [0:0]\n:SVC - [0:0]\n\
             -A PREROUTING -m addrtype --dst-type LOCAL -j SVC\n\
             -A PREROUTING -p tcp -m tcp --dport 80 -j DNAT --to-destination 10.0.0.9:80\n\
             -A SVC -p tcp -m tcp --dport 80 -j DNAT --to-destination 10.0.0.1:80",
        );
        let parsed = parse_table(&t);
        let (steps, complete) = walk(&t, &parsed, "PREROUTING");
        assert!(complete);
        let order: Vec<(&str, usize)> = steps
            .iter()
            .map(|s| (s.rule.chain.as_str(), s.position))
            .collect();
        assert_eq!(order, [("PREROUTING", 1), ("SVC", 1), ("PREROUTING", 2)]);
        // The DNAT in SVC carries the jump's LOCAL condition, so it does not cover the later
        // DNAT for every destination: no shadow.
        assert!(shadows(&steps, dnat).is_empty());
    }

    #[test]
    fn an_earlier_covering_dnat_shadows_and_a_narrower_one_does_not() {
        let t = table(
            ":PREROUTING ACCEPT [0:0]\n\
             -A PREROUTING -p tcp -m tcp --dport 6667 -j DNAT --to-destination 10.0.0.5:6667\n\
             -A PREROUTING -p tcp -m tcp --dport 6667 -j DNAT --to-destination 10.0.0.6:6667\n\
             -A PREROUTING -s 10.1.0.0/16 -p tcp -m tcp --dport 7000 -j DNAT --to-destination 10.0.0.7:7000\n\
             -A PREROUTING -p tcp -m tcp --dport 7000 -j DNAT --to-destination 10.0.0.8:7000",
        );
        let parsed = parse_table(&t);
        let (steps, _) = walk(&t, &parsed, "PREROUTING");
        let found = shadows(&steps, dnat);
        assert_eq!(found.len(), 1);
        assert_eq!((found[0].by, found[0].shadowed), (0, 1));
    }

    #[test]
    fn a_covering_return_shadows_the_rest_of_its_chain_only() {
        let t = table(
            ":PREROUTING ACCEPT [0:0]\n:A - [0:0]\n\
             -A PREROUTING -j A\n\
             -A PREROUTING -p tcp -m tcp --dport 80 -j DNAT --to-destination 10.0.0.2:80\n\
             -A A -p tcp -j RETURN\n\
             -A A -p tcp -m tcp --dport 80 -j DNAT --to-destination 10.0.0.1:80",
        );
        let parsed = parse_table(&t);
        let (steps, _) = walk(&t, &parsed, "PREROUTING");
        let found = shadows(&steps, dnat);
        assert_eq!(found.len(), 1);
        assert_eq!(steps[found[0].shadowed].rule.chain, "A");
        assert_eq!(steps[found[0].by].target, Target::Return);
    }

    #[test]
    fn a_return_that_lets_packets_around_the_earlier_rule_prevents_the_claim() {
        let t = table(
            ":PREROUTING ACCEPT [0:0]\n:DOCKER - [0:0]\n\
             -A PREROUTING -j DOCKER\n\
             -A PREROUTING -p tcp -m tcp --dport 80 -j DNAT --to-destination 172.17.0.7:80\n\
             -A DOCKER -i docker0 -j RETURN\n\
             -A DOCKER -p tcp -m tcp --dport 80 -j DNAT --to-destination 172.17.0.2:80",
        );
        let parsed = parse_table(&t);
        let (steps, _) = walk(&t, &parsed, "PREROUTING");
        assert!(shadows(&steps, dnat).is_empty());
    }

    #[test]
    fn a_multiport_jump_files_under_the_ports_it_leaves() {
        let t = table(
            ":PREROUTING ACCEPT [0:0]\n:PM - [0:0]\n\
             -A PREROUTING -p tcp -m tcp --dport 443 -j DNAT --to-destination 10.0.0.1:443\n\
             -A PREROUTING -p tcp -m multiport --dports 80,443 -j PM\n\
             -A PM -p tcp -m tcp --dport 443 -j DNAT --to-destination 10.0.0.2:443",
        );
        let parsed = parse_table(&t);
        let (steps, _) = walk(&t, &parsed, "PREROUTING");
        let found = shadows(&steps, dnat);
        assert_eq!(found.len(), 1);
        assert_eq!(steps[found[0].shadowed].rule.chain, "PM");
    }

    #[test]
    fn loops_and_missing_chains_end_the_walk() {
        let t = table(
            ":PREROUTING ACCEPT [0:0]\n:A - [0:0]\n:B - [0:0]\n\
             -A PREROUTING -j A\n-A A -j B\n-A B -j A\n-A B -j NOWHERE",
        );
        let parsed = parse_table(&t);
        let (steps, complete) = walk(&t, &parsed, "PREROUTING");
        assert!(complete);
        assert_eq!(steps.len(), 4);
    }
}
