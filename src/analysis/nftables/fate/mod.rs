//! One concrete packet walked through a native ruleset as the kernel walks it ([`fate`]).
//!
//! Per hook, every table's base chains of that hook (families `ip`/`ip6`/`inet` matching the
//! packet), in ascending priority; chains of equal priority in different tables run in an
//! order the kernel does not promise, so each order is followed; nat chains run where the
//! kernel's nat core hooks in (-100 in prerouting and output, 100 in input and postrouting),
//! among themselves by their own priorities (`index::orders`). An accept ends one chain,
//! a drop or reject the packet. A nat chain runs only while the connection's nat decision of
//! its direction is not made (the first DNAT or redirect in prerouting/output, the first
//! SNAT or masquerade in input/postrouting, wins; after the hook the decision is made
//! whatever happened); the probe is the first packet of a connection (ct state new).
//! A DNAT changes the destination for the hooks that follow, which decides input or forward.
//!
//! Whatever is not decided by the packet's fields (a mark, a `numgen`, an unmodelled
//! statement) is followed both ways, so [`Fate::outcomes`] holds every way the packet may
//! end: a claim made of all of them is one the kernel cannot contradict.

use std::cell::Cell;
use std::collections::HashSet;
use std::net::IpAddr;
use std::sync::Arc;

mod nat;

use super::index::Indexed;
use super::value::{Field, Iface, Pkt, test};
use super::{ElementRef, Place, is_local};
use crate::analysis::verdict::Tri;
use crate::model::ruleset::{
    Chain, ChainKind, ElementData, Hook, NftTable, Policy, Ruleset, Stmt, Verdict,
};

/// The kernel's jump stack (`NFT_JUMP_STACK_SIZE`); deeper is not followed.
const MAX_DEPTH: usize = 16;
/// Rule evaluations one fate may cost before it gives up (every answer then "maybe").
const BUDGET: usize = 200_000;

/// How a packet reaches the host.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Path {
    /// From outside, on `iif`: prerouting, then input (to a local address) or forward and
    /// postrouting.
    Outside,
    /// Generated here: output, postrouting, and to a local address over loopback: prerouting
    /// (no nat there: the decision was made in output) and input.
    Local,
}

/// One concrete packet: the first of a connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Probe {
    pub v4: bool,
    /// `None`: any source (every match on it followed both ways).
    pub saddr: Option<IpAddr>,
    pub daddr: IpAddr,
    /// IP protocol number.
    pub proto: u8,
    pub sport: u16,
    pub dport: u16,
    /// The interface it arrives on (outside); `None`: not known.
    pub iif: Option<String>,
    /// The interface a forwarded (or locally sent, non-local) packet leaves by.
    pub oif: Option<String>,
    pub path: Path,
    /// This host's addresses (loopback is always local); shared by every probe of a check.
    pub locals: Arc<[IpAddr]>,
}

impl Probe {
    /// A connection to `daddr`'s `port` by `path`, as the checks and the forwards finder
    /// send it: from `daddr` itself when generated here, from anywhere from outside, any
    /// interface.
    pub fn to(daddr: IpAddr, path: Path, proto: u8, port: u16, locals: Arc<[IpAddr]>) -> Probe {
        Probe {
            v4: daddr.is_ipv4(),
            saddr: (path == Path::Local).then_some(daddr),
            daddr,
            proto,
            sport: 40000,
            dport: port,
            iif: None,
            oif: None,
            path,
            locals,
        }
    }
}

/// A DNAT or redirect the packet met.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Redirected {
    pub place: Place,
    /// Where to; a redirect's is this host.
    pub to: IpAddr,
    pub port: u16,
    pub redirect: bool,
}

/// How one way through ends.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum End {
    /// To a local socket (after input).
    Delivered,
    /// Out of the host (after postrouting).
    Forwarded,
    /// Dropped or rejected at `place` (a policy: `handle: None`, position past the last
    /// rule) in a chain of `hook`.
    Dropped {
        place: Place,
        hook: Hook,
        reject: bool,
        policy: bool,
    },
    /// Something not modelled decided (a statement like `queue`, jumps too deep, the budget).
    Unknown(Option<Place>),
}

/// One way the packet may go.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Outcome {
    pub end: End,
    pub dnat: Option<Redirected>,
    /// Whether the way needed no guess: every match on it was decided.
    pub sure: bool,
    /// The jumps, gotos and verdict map elements taken on the way, in order.
    pub via: Vec<Place>,
}

/// Every way a packet may go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fate {
    pub outcomes: Vec<Outcome>,
}

impl Fate {
    /// `Yes` when every way satisfies `f`, `No` when none does.
    pub fn all(&self, f: impl Fn(&Outcome) -> bool) -> Tri {
        let n = self.outcomes.iter().filter(|o| f(o)).count();
        Tri::of_ways(n, self.outcomes.len())
    }

    /// Whether some way through meets `place`'s DNAT.
    pub fn may_dnat_at(&self, place: &Place) -> bool {
        self.outcomes
            .iter()
            .any(|o| o.dnat.as_ref().is_some_and(|d| d.place == *place))
    }
}

/// Every way `probe` may go through `rs` (for many probes: [`Indexed::fate`]).
pub fn fate(rs: &Ruleset, probe: &Probe) -> Fate {
    Indexed::new(rs).fate(probe)
}

impl Indexed<'_> {
    /// Every way `probe` may go through the ruleset.
    pub fn fate(&self, probe: &Probe) -> Fate {
        fate_without(self, probe, None)
    }
}

/// Every way `probe` may go through `ix`'s ruleset were the rule or element at `skip` not
/// there.
pub(crate) fn fate_without(ix: &Indexed<'_>, probe: &Probe, skip: Option<&Place>) -> Fate {
    let walk = Walk {
        ix,
        probe,
        skip,
        budget: Cell::new(BUDGET),
    };
    let mut seen = HashSet::new();
    let outcomes = walk
        .path(start(probe))
        .into_iter()
        .filter(|o| seen.insert(o.clone()))
        .collect();
    ix.spend(BUDGET - walk.budget.get());
    Fate { outcomes }
}

/// The DNATs and redirects `probe` may meet: only its first hook is walked (prerouting from
/// outside, output from this host), where every destination NAT of a connection is decided.
pub(crate) fn dnats_met(ix: &Indexed<'_>, probe: &Probe) -> Vec<Place> {
    let walk = Walk {
        ix,
        probe,
        skip: None,
        budget: Cell::new(BUDGET),
    };
    let ways = match probe.path {
        Path::Outside => walk.hook(
            Hook::Prerouting,
            start(probe),
            Walk::iface(&probe.iif),
            Iface::Absent,
        ),
        Path::Local => {
            let oif = match is_local(&probe.locals, probe.daddr) {
                true => Iface::Name("lo".into()),
                false => Walk::iface(&probe.oif),
            };
            walk.hook(Hook::Output, start(probe), Iface::Absent, oif)
        }
    };
    ix.spend(BUDGET - walk.budget.get());
    ways.into_iter()
        .filter_map(|(st, _)| st.dnat.map(|d| d.place))
        .collect()
}

/// The walk's state before the first hook: `probe` as it is sent.
fn start(probe: &Probe) -> St {
    let local = is_local(&probe.locals, probe.daddr);
    St {
        pkt: Pkt {
            v4: probe.v4,
            saddr: probe.saddr,
            daddr: probe.daddr,
            proto: probe.proto,
            sport: probe.sport,
            dport: probe.dport,
            daddr_local: local,
            dnatted: false,
            iif: Iface::Absent,
            oif: Iface::Absent,
            hook: Hook::Prerouting,
        },
        dnat: None,
        dst_done: false,
        src_done: false,
        sure: true,
        via: Vec::new(),
    }
}

#[derive(Clone, Debug)]
struct St {
    pkt: Pkt,
    dnat: Option<Redirected>,
    dst_done: bool,
    src_done: bool,
    sure: bool,
    via: Vec<Place>,
}

impl St {
    fn guessed(mut self, t: Tri) -> St {
        if t == Tri::Maybe {
            self.sure = false;
        }
        self
    }
}

/// How a chain ended for one way.
enum Flow {
    Accept,
    Return,
    Drop(Place, bool),
    Unknown(Option<Place>),
}

/// How a rule ended for one way.
enum RuleFlow {
    Next,
    Verdict(Flow),
}

struct Walk<'r> {
    ix: &'r Indexed<'r>,
    probe: &'r Probe,
    skip: Option<&'r Place>,
    budget: Cell<usize>,
}

type Ways = Vec<(St, Option<End>)>;

impl Walk<'_> {
    fn iface(name: &Option<String>) -> Iface {
        name.clone().map_or(Iface::Unknown, Iface::Name)
    }

    fn path(&self, st: St) -> Vec<Outcome> {
        let p = self.probe;
        let mut out = Vec::new();
        let finish = |st: St, end: End, out: &mut Vec<Outcome>| {
            out.push(Outcome {
                end,
                dnat: st.dnat,
                sure: st.sure,
                via: st.via,
            })
        };
        let lo = || Iface::Name("lo".into());
        match p.path {
            Path::Outside => {
                for (st, end) in self.hook(Hook::Prerouting, st, Self::iface(&p.iif), Iface::Absent)
                {
                    if let Some(end) = end {
                        finish(st, end, &mut out);
                    } else if st.pkt.daddr_local {
                        for (st, end) in
                            self.hook(Hook::Input, st, Self::iface(&p.iif), Iface::Absent)
                        {
                            finish(st, end.unwrap_or(End::Delivered), &mut out);
                        }
                    } else {
                        for (st, end) in
                            self.hook(Hook::Forward, st, Self::iface(&p.iif), Self::iface(&p.oif))
                        {
                            if let Some(end) = end {
                                finish(st, end, &mut out);
                                continue;
                            }
                            for (st, end) in
                                self.hook(Hook::Postrouting, st, Iface::Absent, Self::iface(&p.oif))
                            {
                                finish(st, end.unwrap_or(End::Forwarded), &mut out);
                            }
                        }
                    }
                }
            }
            Path::Local => {
                let oif = |st: &St| {
                    if st.pkt.daddr_local {
                        lo()
                    } else {
                        Self::iface(&p.oif)
                    }
                };
                let first = oif(&st);
                for (st, end) in self.hook(Hook::Output, st, Iface::Absent, first) {
                    if let Some(end) = end {
                        finish(st, end, &mut out);
                        continue;
                    }
                    let o = oif(&st);
                    for (st, end) in self.hook(Hook::Postrouting, st, Iface::Absent, o) {
                        if let Some(end) = end {
                            finish(st, end, &mut out);
                        } else if !st.pkt.daddr_local {
                            finish(st, End::Forwarded, &mut out);
                        } else {
                            for (st, end) in self.hook(Hook::Prerouting, st, lo(), Iface::Absent) {
                                if let Some(end) = end {
                                    finish(st, end, &mut out);
                                    continue;
                                }
                                for (st, end) in self.hook(Hook::Input, st, lo(), Iface::Absent) {
                                    finish(st, end.unwrap_or(End::Delivered), &mut out);
                                }
                            }
                        }
                    }
                }
            }
        }
        out
    }

    fn hook(&self, hook: Hook, mut st: St, iif: Iface, oif: Iface) -> Ways {
        st.pkt.hook = hook;
        st.pkt.iif = iif;
        st.pkt.oif = oif;
        let mut out = Vec::new();
        for order in self.ix.orders(hook, st.pkt.v4).iter() {
            let mut live = vec![st.clone()];
            for &(table, chain) in order {
                let base = chain.base.as_ref().expect("base chains only");
                let mut next = Vec::new();
                for s in live {
                    let dst_hook = matches!(hook, Hook::Prerouting | Hook::Output);
                    let done = if dst_hook { s.dst_done } else { s.src_done };
                    if base.kind == ChainKind::Nat && done {
                        next.push(s);
                        continue;
                    }
                    for (s, flow) in self.chain(table, chain, s, 0) {
                        match flow {
                            Flow::Accept => next.push(s),
                            Flow::Return if base.policy == Policy::Accept => next.push(s),
                            Flow::Return => {
                                let place = place(table, chain, chain.rules.len(), None, None);
                                out.push((
                                    s,
                                    Some(End::Dropped {
                                        place,
                                        hook,
                                        reject: false,
                                        policy: true,
                                    }),
                                ));
                            }
                            Flow::Drop(place, reject) => out.push((
                                s,
                                Some(End::Dropped {
                                    place,
                                    hook,
                                    reject,
                                    policy: false,
                                }),
                            )),
                            Flow::Unknown(p) => out.push((s, Some(End::Unknown(p)))),
                        }
                    }
                }
                live = next;
            }
            for mut s in live {
                match hook {
                    Hook::Prerouting | Hook::Output => s.dst_done = true,
                    Hook::Input | Hook::Postrouting => s.src_done = true,
                    _ => {}
                }
                out.push((s, None));
            }
        }
        out
    }

    /// Every way through `chain` from its first rule.
    fn chain(&self, table: &NftTable, chain: &Chain, st: St, depth: usize) -> Vec<(St, Flow)> {
        let mut out = Vec::new();
        let mut work = vec![(st, 0usize)];
        while let Some((st, i)) = work.pop() {
            let Some(rule) = chain.rules.get(i) else {
                out.push((st, Flow::Return));
                continue;
            };
            let left = self.budget.get();
            if left == 0 {
                out.push((st, Flow::Unknown(None)));
                continue;
            }
            self.budget.set(left - 1);
            let at = |element: Option<ElementRef>| place(table, chain, i, rule.handle, element);
            if self
                .skip
                .is_some_and(|p| p.element.is_none() && *p == at(None))
            {
                work.push((st, i + 1));
                continue;
            }
            for (s, f) in self.stmts(table, &rule.stmts, st, depth, &at) {
                match f {
                    RuleFlow::Next => work.push((s, i + 1)),
                    RuleFlow::Verdict(f) => out.push((s, f)),
                }
            }
        }
        out
    }

    /// Every way through a rule's statements.
    fn stmts(
        &self,
        table: &NftTable,
        stmts: &[Stmt],
        st: St,
        depth: usize,
        at: &dyn Fn(Option<ElementRef>) -> Place,
    ) -> Vec<(St, RuleFlow)> {
        let Some((stmt, rest)) = stmts.split_first() else {
            return vec![(st, RuleFlow::Next)];
        };
        let go_on = |s: St| self.stmts(table, rest, s, depth, at);
        match stmt {
            Stmt::Match(m) => match test(&st.pkt, m, &|name: &str, fields: &[Field]| {
                self.ix.find(table, name, fields)
            }) {
                Tri::No => vec![(st, RuleFlow::Next)],
                Tri::Yes => go_on(st),
                Tri::Maybe => {
                    let mut out = vec![(st.clone().guessed(Tri::Maybe), RuleFlow::Next)];
                    out.extend(go_on(st.guessed(Tri::Maybe)));
                    out
                }
            },
            Stmt::Effect(_) => go_on(st),
            Stmt::Other(_) => {
                let place = at(None);
                let s = st.guessed(Tri::Maybe);
                let mut out = vec![
                    (s.clone(), RuleFlow::Next),
                    (s.clone(), RuleFlow::Verdict(Flow::Unknown(Some(place)))),
                ];
                out.extend(go_on(s));
                out
            }
            Stmt::Reject => vec![(st, RuleFlow::Verdict(Flow::Drop(at(None), true)))],
            Stmt::Verdict(v) => self.verdict(table, v, st, depth, at(None), &go_on),
            Stmt::Vmap { key, map } => {
                let Some((missing, hits)) = self.branches(&st, table, key, map) else {
                    return vec![(
                        st.guessed(Tri::Maybe),
                        RuleFlow::Verdict(Flow::Unknown(Some(at(None)))),
                    )];
                };
                let mut out: Vec<(St, RuleFlow)> =
                    missing.into_iter().map(|s| (s, RuleFlow::Next)).collect();
                for (s, e, element) in hits {
                    match &e.data {
                        Some(ElementData::Verdict(v)) => {
                            out.extend(self.verdict(table, v, s, depth, at(element), &go_on))
                        }
                        _ => out.push((s, RuleFlow::Verdict(Flow::Unknown(Some(at(element)))))),
                    }
                }
                out
            }
            Stmt::Nat(nat) => self.nat(table, nat, st, at),
        }
    }

    fn verdict(
        &self,
        table: &NftTable,
        v: &Verdict,
        st: St,
        depth: usize,
        place: Place,
        go_on: &dyn Fn(St) -> Vec<(St, RuleFlow)>,
    ) -> Vec<(St, RuleFlow)> {
        match v {
            Verdict::Accept => vec![(st, RuleFlow::Verdict(Flow::Accept))],
            Verdict::Drop => vec![(st, RuleFlow::Verdict(Flow::Drop(place, false)))],
            Verdict::Return => vec![(st, RuleFlow::Verdict(Flow::Return))],
            Verdict::Continue => go_on(st),
            Verdict::Jump(to) | Verdict::Goto(to) => {
                let goto = matches!(v, Verdict::Goto(_));
                let Some(chain) = self.ix.chain(table, to) else {
                    return vec![(st, RuleFlow::Verdict(Flow::Unknown(Some(place))))];
                };
                if depth >= MAX_DEPTH {
                    return vec![(st, RuleFlow::Verdict(Flow::Unknown(Some(place))))];
                }
                let mut st = st;
                st.via.push(place);
                self.chain(table, chain, st, depth + 1)
                    .into_iter()
                    .map(|(s, f)| match f {
                        Flow::Return if goto => (s, RuleFlow::Verdict(Flow::Return)),
                        Flow::Return => (s, RuleFlow::Next),
                        f => (s, RuleFlow::Verdict(f)),
                    })
                    .collect()
            }
        }
    }
}

pub(crate) fn place(
    table: &NftTable,
    chain: &Chain,
    position: usize,
    handle: Option<u64>,
    element: Option<ElementRef>,
) -> Place {
    Place {
        family: table.family,
        table: table.name.clone(),
        chain: chain.name.clone(),
        handle,
        position,
        element,
    }
}
