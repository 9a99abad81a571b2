//! A nat table followed with one packet as the kernel would, from PREROUTING and OUTPUT
//! through the jumps of the rules that may match it ([`crate::analysis::iptables::packet`]),
//! to every other owner's DNAT or REDIRECT ([`walk`]), the chains read through [`Chains`]
//! (`chains.rs`: a parsed dump, or any reader `analysis::forwards` gives, each chain read
//! once for several packets by [`Memo`]). natledger's own chains and jumps are passed over.
//! Pure: the readers of the live tables live in `analysis::forwards`.

use std::collections::HashMap;
use std::rc::Rc;

use serde::{Deserialize, Serialize};

use crate::analysis::iptables::packet::{Addresses, Conntrack, Packet};
use crate::analysis::verdict::Tri;
use crate::model::anyrule::{Target, parse_rule};
use crate::model::family::Family;
use crate::model::layout::{Owner, is_owned_chain, owner};
use crate::model::portspec::PortMapping;
use crate::model::rule::IpNet;

mod chains;

pub use chains::{Chains, Kept, Memo, Saved};

/// The built-in nat chains a packet to a host port goes through.
pub const HOOKS: [&str; 2] = ["PREROUTING", "OUTPUT"];

/// A rule on the way to a forward: its chain, 1-based position, and arguments.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Step {
    pub chain: String,
    pub position: usize,
    pub args: Vec<String>,
}

/// A DNAT or REDIRECT of another owner, and the jumps that lead to it (the last step is the
/// rule itself).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Candidate {
    pub path: Vec<Step>,
}

impl Candidate {
    /// The DNAT or REDIRECT rule.
    pub fn rule(&self) -> &Step {
        self.path.last().expect("a candidate has its rule")
    }

    /// Whether `packet` may be taken by it: every rule on its path may match.
    pub fn takes(&self, packet: &Packet) -> bool {
        self.path
            .iter()
            .all(|s| packet.test(&parse_rule(&s.args).0) != Tri::No)
    }
}

/// The packet that opens a connection to a host port: `mapping`'s protocol and host ports,
/// to its host address or to any address in `locals` (this host's), conntrack NEW (nat sees
/// only those). `mapping: None` is a packet to any port of any protocol of this host.
pub fn probe(mapping: Option<&PortMapping>, family: Family, locals: &[IpNet]) -> Packet {
    let host = mapping.and_then(PortMapping::host_destination);
    let dst = match host {
        Some(addr) => Addresses::Exactly(addr),
        None => Addresses::AnyOf(
            locals
                .iter()
                .copied()
                .filter(|n| Family::of(n.addr) == family)
                .collect(),
        ),
    };
    Packet {
        protocol: mapping.map(|m| m.protocol.number()),
        dst: dst.clone(),
        dports: mapping.map(|m| m.host_ports),
        dst_local: Some(true),
        conntrack: Some(Conntrack {
            states: vec!["NEW"],
            unsure: Vec::new(),
            orig_dst: dst,
            orig_dst_ports: mapping.map(|m| m.host_ports),
            repl_src: None,
            repl_src_ports: None,
            original: true,
        }),
        ..Packet::unknown(family)
    }
}

/// The candidates of a walk with each of `packets`, a list per packet, each chain read from
/// `chains` once for all of them ([`Memo`]).
pub(crate) fn walk_each<C: Chains>(
    chains: &mut C,
    packets: &[Packet],
) -> Result<Vec<Vec<Candidate>>, WalkError<C::Error>> {
    let mut memo = Memo::new(chains, packets);
    packets.iter().map(|p| walk(&mut memo, p)).collect()
}

/// The candidates of a walk to any port that `packet` may meet: those whose every rule may
/// match it, up to the first that certainly takes it in each hook (nothing after it in that
/// hook sees the packet). Never fewer than a walk with `packet` finds; possibly more, when a
/// rule that is not a candidate (an ACCEPT, a RETURN) certainly ends the hook for it.
pub fn taken(all: &[Candidate], packet: &Packet) -> Vec<Candidate> {
    let mut ended: Vec<&str> = Vec::new();
    let mut out = Vec::new();
    for c in all {
        let hook = c.path[0].chain.as_str();
        if ended.contains(&hook) {
            continue;
        }
        let tests: Vec<Tri> = c
            .path
            .iter()
            .map(|s| packet.test(&parse_rule(&s.args).0))
            .collect();
        if tests.contains(&Tri::No) {
            continue;
        }
        if tests.iter().all(|t| *t == Tri::Yes) {
            ended.push(hook);
        }
        out.push(c.clone());
    }
    out
}

/// Chains deeper than this are not followed (iptables itself refuses loops).
const MAX_DEPTH: usize = 32;
/// The most rules one walk looks at. Each chain is read once, but a chain jumped to from
/// many places is walked from each (its rules may match under one path and not another), so
/// chains that branch into one another without a loop could multiply the walk without end.
/// A walk with a packet to any port through kube-proxy's whole default NodePort range (2,768
/// ports) of 10 endpoints each visits about 244,000 (tested; 1.2 s); one to a single port, 92.
pub(crate) const MAX_VISITS: usize = 1_000_000;
/// Every forward of another owner `packet` may meet in one nat table, with its path: the
/// rules of PREROUTING and OUTPUT that may match it, through their jumps (each chain read
/// once), to every DNAT or REDIRECT. A rule certain to end nat for the packet (DNAT, REDIRECT,
/// ACCEPT) stops that hook; a certain RETURN ends its chain.
/// A walk cut short: never a partial answer, since the forward not found may be the one
/// that takes the port.
pub fn walk<C: Chains>(
    chains: &mut C,
    packet: &Packet,
) -> Result<Vec<Candidate>, WalkError<C::Error>> {
    walk_counted(chains, packet, usize::MAX).map(|(found, _)| found)
}

/// [`walk`], stopping at more than `max_found` candidates ([`WalkError::TooMany`]), and the
/// rules it looked at.
pub(crate) fn walk_counted<C: Chains>(
    chains: &mut C,
    packet: &Packet,
    max_found: usize,
) -> Result<(Vec<Candidate>, usize), WalkError<C::Error>> {
    let mut walker = Walker {
        packet,
        read: HashMap::new(),
        found: Vec::new(),
        visits: 0,
        max_found,
    };
    for hook in HOOKS {
        let mut path = Vec::new();
        walker.chain(chains, hook, &mut path)?;
    }
    Ok((walker.found, walker.visits))
}

/// Why a walk has no answer.
#[derive(Debug, thiserror::Error)]
pub enum WalkError<E> {
    #[error("{0}")]
    Read(E),
    #[error("the nat chains branch into more than {MAX_VISITS} rule visits; not followed")]
    TooBranched,
    #[error("more forwards than the walk was to keep")]
    TooMany,
    #[error("the nat chains jump more than {MAX_DEPTH} deep; not followed")]
    TooDeep,
}

struct Walker<'p> {
    packet: &'p Packet,
    /// The rules kept of every chain read so far, judged once.
    read: HashMap<String, Option<Rc<[Judged]>>>,
    found: Vec<Candidate>,
    /// Rules looked at so far, against [`MAX_VISITS`].
    visits: usize,
    max_found: usize,
}

/// A rule kept from a chain, with what the walk needs of it.
struct Judged {
    position: usize,
    args: Vec<String>,
    target: Target,
    /// Certain to match the packet (else it may).
    sure: bool,
    /// Another owner's rule (natledger's own are passed over).
    foreign: bool,
}

/// How a chain ended for the walk.
enum End {
    /// Its rules ran out, or a RETURN: back to the caller.
    Back,
    /// A rule certain to end nat for the packet.
    Stop,
}

impl Walker<'_> {
    fn chain<C: Chains>(
        &mut self,
        chains: &mut C,
        name: &str,
        path: &mut Vec<Step>,
    ) -> Result<End, WalkError<C::Error>> {
        if path.iter().any(|s| s.chain == name) {
            return Ok(End::Back); // a loop: the kernel refuses those
        }
        if path.len() >= MAX_DEPTH {
            return Err(WalkError::TooDeep);
        }
        if !self.read.contains_key(name) {
            let judged = self.read_chain(chains, name)?;
            self.read.insert(name.to_string(), judged);
        }
        let Some(rules) = self.read.get(name).cloned().flatten() else {
            return Ok(End::Back);
        };
        for rule in rules.iter() {
            self.visits += 1;
            if self.visits > MAX_VISITS {
                return Err(WalkError::TooBranched);
            }
            if !rule.foreign {
                continue;
            }
            let sure = rule.sure;
            let target = &rule.target;
            let step = || Step {
                chain: name.to_string(),
                position: rule.position,
                args: rule.args.clone(),
            };
            // NETMAP in PREROUTING or OUTPUT rewrites the destination as a DNAT does.
            let forwards = matches!(target, Target::Dnat { .. } | Target::Redirect { .. })
                || matches!(target, Target::Other(n) if n == "NETMAP");
            match target {
                _ if forwards => {
                    if self.found.len() >= self.max_found {
                        return Err(WalkError::TooMany);
                    }
                    let mut full = path.clone();
                    full.push(step());
                    self.found.push(Candidate { path: full });
                    if sure {
                        return Ok(End::Stop);
                    }
                }
                Target::Accept if sure => return Ok(End::Stop),
                Target::Return if sure => return Ok(End::Back),
                Target::Jump(to) | Target::Goto(to) if !is_owned_chain(to) => {
                    let goto = matches!(target, Target::Goto(_));
                    path.push(step());
                    let end = self.chain(chains, to, path)?;
                    path.pop();
                    match end {
                        End::Stop if sure => return Ok(End::Stop),
                        End::Back if sure && goto => return Ok(End::Back),
                        _ => {}
                    }
                }
                _ => {}
            }
        }
        Ok(End::Back)
    }

    /// The rules of `name` that may match the packet, each parsed and judged once.
    fn read_chain<C: Chains>(
        &self,
        chains: &mut C,
        name: &str,
    ) -> Result<Option<Rc<[Judged]>>, WalkError<C::Error>> {
        let packet = self.packet;
        let mut keep = |args: &[String]| may_take(args, packet);
        let Some(kept) = chains.rules(name, &mut keep).map_err(WalkError::Read)? else {
            return Ok(None);
        };
        let owned = is_owned_chain(name);
        let judged = kept
            .into_iter()
            .map(|(position, args)| {
                let (m, target) = parse_rule(&args);
                Judged {
                    position,
                    sure: packet.test(&m) == Tri::Yes,
                    foreign: !owned && matches!(owner(name, &args), Owner::Foreign),
                    target,
                    args,
                }
            })
            .collect();
        Ok(Some(judged))
    }
}

/// Whether a rule's conditions may match `packet`.
pub(crate) fn may_take(args: &[String], packet: &Packet) -> bool {
    !elsewhere(args, packet) && packet.test(&parse_rule(args).0) != Tri::No
}

/// Whether a rule's first `-d` (not negated) holds none of the packet's possible
/// destinations: the quick answer, before the rule is parsed whole, for the thousands of
/// rules for other addresses (kube-proxy's services).
fn elsewhere(args: &[String], packet: &Packet) -> bool {
    let Some(i) = args.iter().position(|a| a == "-d") else {
        return false;
    };
    if i > 0 && args[i - 1] == "!" {
        return false;
    }
    let Some(net) = args
        .get(i + 1)
        .and_then(|v| v.parse::<crate::model::rule::IpNet>().ok())
    else {
        return false;
    };
    packet.dst.within(&net) == Tri::No
}
