//! A built-in chain evaluated for a packet the way the kernel does it, down to a verdict
//! ([`fate`]), with only what [`Packet::test`] can decide.

use std::cell::RefCell;
use std::collections::HashMap;

use super::Packet;
use crate::analysis::verdict::Tri;
use crate::model::anyrule::{Match, Target};
use crate::model::save::{ChainIndex, Dump, SavedRule};

/// Chains deeper than this are not followed (iptables itself refuses loops).
const MAX_DEPTH: usize = 32;

/// Targets after which evaluation goes on with the next rule (logging, marking, accounting);
/// any other extension target decides the packet's fate in its own way.
const GOES_ON: &str = "AUDIT CHECKSUM CLASSIFY CONNMARK CONNSECMARK CT DSCP ECN HL HMARK \
    IDLETIMER LED LOG MARK NFLOG NOTRACK RATEEST SECMARK SET TCPMSS TCPOPTSTRIP TEE TOS TRACE \
    TTL ULOG";

fn goes_on(target: &str) -> bool {
    GOES_ON.split_whitespace().any(|t| t == target)
}

/// Where evaluating a built-in chain ends for a packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fate<'t> {
    /// Accepted by this rule (`None`: the chain's policy).
    Accepted(Option<&'t SavedRule>),
    /// Dropped or rejected by this rule (`None`: the chain's policy).
    Dropped(Option<&'t SavedRule>),
    /// Not decidable from what is known; the first rule that made it so.
    Unknown(&'t SavedRule),
}

/// How far one chain got.
#[derive(Clone, Copy)]
enum Flow<'t> {
    Verdict(Fate<'t>),
    /// The end of the chain, or a RETURN: back to the caller.
    Back,
}

/// The fate of `packet` in the built-in chain `builtin` of `table` (`parsed` is
/// [`crate::model::anyrule::parse_rule`] of each of its rules, in order): its rules in order,
/// through jumps and gotos, to the first verdict. A drop is claimed when every way the packet
/// can go ends dropped (a rule that may drop it and a later one that certainly does:
/// dropped); an accept that might not apply, or a RETURN or goto that might not, make the
/// fate unknown.
pub fn fate<'t>(
    table: &'t Dump,
    parsed: &[(Match, Target)],
    builtin: &str,
    packet: &Packet,
) -> Fate<'t> {
    let eval = Eval {
        table,
        index: table.index(),
        parsed,
        packet,
        memo: RefCell::default(),
    };
    match eval.chain(builtin, 0) {
        Flow::Verdict(fate) => fate,
        Flow::Back => match eval.policy(builtin) {
            Some("DROP") => Fate::Dropped(None),
            _ => Fate::Accepted(None),
        },
    }
}

struct Eval<'t, 'p> {
    table: &'t Dump,
    index: ChainIndex<'t>,
    parsed: &'p [(Match, Target)],
    packet: &'p Packet,
    /// How far each chain got at each depth: one packet goes the same way through a chain
    /// every time, so a chain reached many ways (30 chains each jumping 4 ways to the next)
    /// is evaluated once per depth, not once per path.
    memo: RefCell<HashMap<(usize, usize), Flow<'t>>>,
}

impl<'t> Eval<'t, '_> {
    /// The rules of chain `name` from its `from`th (0-based), with what they parsed to.
    fn rules(
        &self,
        name: &str,
        from: usize,
    ) -> impl Iterator<Item = (usize, &'t SavedRule, &Match, &Target)> {
        let indices = self.index.rules(name).unwrap_or_default();
        indices.iter().enumerate().skip(from).map(|(k, &i)| {
            (
                k,
                &self.table.rules[i],
                &self.parsed[i].0,
                &self.parsed[i].1,
            )
        })
    }

    fn chain(&self, name: &str, depth: usize) -> Flow<'t> {
        // A chain is known by its rule list (each chain has its own; an empty one is `Back`
        // whichever it is).
        let key = (
            self.index.rules(name).map_or(0, |r| r.as_ptr() as usize),
            depth,
        );
        if let Some(flow) = self.memo.borrow().get(&key) {
            return *flow;
        }
        let flow = self.evaluate(name, depth);
        self.memo.borrow_mut().insert(key, flow);
        flow
    }

    fn evaluate(&self, name: &str, depth: usize) -> Flow<'t> {
        for (k, rule, m, target) in self.rules(name, 0) {
            let tri = self.packet.test(m);
            if tri == Tri::No {
                continue;
            }
            let sure = tri == Tri::Yes;
            let unknown = Flow::Verdict(Fate::Unknown(rule));
            match target {
                Target::Accept if sure => return Flow::Verdict(Fate::Accepted(Some(rule))),
                Target::Accept => return unknown,
                // A rule that may drop: dropped there, or on to the rest, which must drop too
                // for a claim (an accept further on makes it unknown).
                Target::Drop | Target::Reject if sure => {
                    return Flow::Verdict(Fate::Dropped(Some(rule)));
                }
                Target::Drop | Target::Reject => {
                    return match self.rest_after(name, k) {
                        Flow::Verdict(Fate::Dropped(by)) => {
                            Flow::Verdict(Fate::Dropped(by.or(Some(rule))))
                        }
                        _ => unknown,
                    };
                }
                Target::Return if sure => return Flow::Back,
                Target::Return => return unknown,
                Target::Jump(to) | Target::Goto(to) if self.exists(to) => {
                    if depth >= MAX_DEPTH {
                        return unknown;
                    }
                    let goto = matches!(target, Target::Goto(_));
                    match (self.chain(to, depth + 1), sure) {
                        (Flow::Verdict(fate), true) => return Flow::Verdict(fate),
                        (Flow::Back, true) if goto => return Flow::Back,
                        (Flow::Back, true) => {}
                        // Maybe into a chain that decides nothing: on either way.
                        (Flow::Back, false) if !goto => {}
                        (Flow::Verdict(Fate::Dropped(by)), false) => {
                            return match self.rest_after(name, k) {
                                Flow::Verdict(Fate::Dropped(_)) => Flow::Verdict(Fate::Dropped(by)),
                                _ => unknown,
                            };
                        }
                        _ => return unknown,
                    }
                }
                // Targets that do not end evaluation (LOG, MARK, …).
                Target::Other(name) | Target::Jump(name) | Target::Goto(name) if !goes_on(name) => {
                    // Anything else decides in a way not modelled here (NFQUEUE hands the
                    // packet to a program; an extension target of another package, or a
                    // chain that does not exist): no claim past it.
                    return unknown;
                }
                _ => {}
            }
        }
        Flow::Back
    }

    /// Whether the rest of chain `name` after its rule `k` (0-based) certainly drops the packet:
    /// a later rule
    /// that certainly drops it, or a built-in chain's DROP policy, with nothing between that
    /// could accept it or send it elsewhere. Anything less is unknown: a claim of "dropped"
    /// after a rule that only may drop needs the other way to end dropped too.
    fn rest_after(&self, name: &str, k: usize) -> Flow<'t> {
        for (_, r, m, target) in self.rules(name, k + 1) {
            let tri = self.packet.test(m);
            if tri == Tri::No {
                continue;
            }
            match target {
                Target::Drop | Target::Reject if tri == Tri::Yes => {
                    return Flow::Verdict(Fate::Dropped(Some(r)));
                }
                Target::Drop | Target::Reject | Target::None => {}
                Target::Other(name) if goes_on(name) => {}
                _ => return Flow::Verdict(Fate::Unknown(r)),
            }
        }
        match self.policy(name) {
            Some("DROP") => Flow::Verdict(Fate::Dropped(None)),
            _ => Flow::Back,
        }
    }

    fn policy(&self, chain: &str) -> Option<&'t str> {
        self.index.policy(chain)
    }

    fn exists(&self, chain: &str) -> bool {
        self.index.rules(chain).is_some()
    }
}
