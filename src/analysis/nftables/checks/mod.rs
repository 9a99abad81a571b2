//! The checks over native tables: each sends concrete packets through [`fate`] and reads
//! every way they may go. What they share lives here: the host ports worth examining (every
//! port a rule or element names, and the listeners'), the packets to one port, where a
//! finding points, and the budget: every walk's rule evaluations counted together, the checks
//! stop at [`BUDGET`] and say which tables they left unexamined ([`Cut`]).

mod dests;
mod forwards;
mod listeners;
mod shadowed;

use std::cell::Cell;
use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::Arc;

use dests::Dests;

use super::fate::{Path, Probe};
use super::index::Indexed;
use super::{HostFacts, NftFinding, Owner, Place};
use crate::model::portspec::Protocol;
use crate::model::ruleset::{Key, NatAddr, NftTable, Operand, Ruleset, Stmt, Value};

/// Rule evaluations all the checks over one ruleset may cost together (a few seconds of one
/// core; each walk's own bound, `fate::BUDGET`, may overshoot it once).
pub const BUDGET: u64 = 20_000_000;

/// Every finding of every check over `rs`, with the host's facts, within [`BUDGET`].
pub fn check(rs: &Ruleset, host: &HostFacts) -> Checked {
    check_within(rs, host, BUDGET)
}

/// What the checks found, and what the budget left unexamined.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Checked {
    pub findings: Vec<NftFinding>,
    /// `Some` when the budget ran out before every port was examined.
    pub cut: Option<Cut>,
}

/// The checks stopped short: `examined` of `ports` (host port and protocol, per check)
/// examined fully; the tables naming a port left unexamined. A shadow is then never claimed
/// (that needs every packet), the other findings stand (each shown by a packet).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cut {
    pub examined: usize,
    pub ports: usize,
    /// `(family, name)` of each table naming a port not examined.
    pub tables: Vec<(crate::model::ruleset::TableFamily, String)>,
    /// Rule evaluations spent.
    pub evaluations: u64,
}

/// [`check`] with a budget of `evaluations` rule evaluations.
pub fn check_within(rs: &Ruleset, host: &HostFacts, evaluations: u64) -> Checked {
    let ctx = Ctx::new(rs, host, evaluations);
    let mut out = Vec::new();
    // The cheap checks first: the shadow check needs every port, so it is the one cut.
    out.extend(ctx.listeners());
    out.extend(ctx.forwards());
    out.extend(ctx.shadowed());
    // iptables-nft's tables decide fates too, but their rules are the iptables side's to report.
    out.retain(|f| !ctx.table(&f.place).is_some_and(super::is_xtables));
    out.sort_by_key(|a| (a.port, a.protocol, a.kind));
    let cut = ctx.cut();
    Checked { findings: out, cut }
}

pub(crate) struct Ctx<'a> {
    pub rs: &'a Ruleset,
    pub ix: Indexed<'a>,
    pub host: &'a HostFacts,
    /// Where a packet to a host port may be addressed: the host's addresses, or without
    /// them (a dump), every single address a rule compares a destination with.
    pub locals: Arc<[IpAddr]>,
    /// The same, grouped: the ones each port is probed with.
    dests: Dests,
    /// Rule evaluations the checks may spend.
    limit: u64,
    /// Ports (with protocol) each check set out to examine, and those it examined fully.
    ports: Cell<usize>,
    examined: Cell<usize>,
    /// Ports left unexamined.
    skipped: std::cell::RefCell<BTreeSet<u16>>,
}

impl<'a> Ctx<'a> {
    pub(crate) fn new(rs: &'a Ruleset, host: &'a HostFacts, limit: u64) -> Ctx<'a> {
        let locals: Vec<IpAddr> = host
            .locals
            .iter()
            .copied()
            .filter(|a| !a.is_loopback())
            .collect();
        let dests = if locals.is_empty() {
            Dests::of(rs)
        } else {
            Dests::each(&locals)
        };
        Ctx {
            rs,
            ix: Indexed::new(rs),
            host,
            locals: dests.all().into(),
            dests,
            limit,
            ports: Cell::new(0),
            examined: Cell::new(0),
            skipped: Default::default(),
        }
    }

    /// Whether the budget is spent.
    pub(crate) fn spent(&self) -> bool {
        self.ix.spent() >= self.limit
    }

    /// Count a port a check set out to examine; `false` (and the port left unexamined)
    /// once the budget is spent.
    pub(crate) fn start(&self, port: u16) -> bool {
        self.ports.set(self.ports.get() + 1);
        if self.spent() {
            self.skipped.borrow_mut().insert(port);
            return false;
        }
        true
    }

    /// A port started is examined fully, unless the budget ran out on the way.
    pub(crate) fn finish(&self, port: u16) -> bool {
        if self.spent() {
            self.skipped.borrow_mut().insert(port);
            return false;
        }
        self.examined.set(self.examined.get() + 1);
        true
    }

    fn cut(&self) -> Option<Cut> {
        let skipped = self.skipped.borrow();
        if skipped.is_empty() {
            return None;
        }
        let tables = self
            .rs
            .tables
            .iter()
            .filter(|t| {
                let mut found = BTreeSet::new();
                for c in &t.chains {
                    for r in &c.rules {
                        rule_ports(t, &r.stmts, &mut found);
                    }
                }
                found.iter().any(|(_, p)| skipped.contains(p))
            })
            .map(|t| (t.family, t.name.clone()))
            .collect();
        Some(Cut {
            examined: self.examined.get(),
            ports: self.ports.get(),
            tables,
            evaluations: self.ix.spent(),
        })
    }

    /// The first packets of connections to `port`: from outside to each of the host's
    /// addresses (from any source, on any interface), and from this host to each of them and
    /// to loopback.
    pub(crate) fn probes(&self, protocol: Protocol, port: u16, to: &[IpAddr]) -> Vec<Probe> {
        let mut out = Vec::new();
        for &daddr in to {
            for path in [Path::Outside, Path::Local] {
                if path == Path::Outside && daddr.is_loopback() {
                    continue;
                }
                let locals = Arc::clone(&self.locals);
                out.push(Probe::to(daddr, path, protocol.number(), port, locals));
            }
        }
        out
    }

    /// The addresses standing for every address a packet to `port` may be sent to.
    pub(crate) fn destinations(&self, protocol: Protocol, port: u16) -> Vec<IpAddr> {
        let mut to = self.dests.at(protocol.number(), port);
        to.push(IpAddr::from([127, 0, 0, 1]));
        to.push(IpAddr::from(std::net::Ipv6Addr::LOCALHOST));
        to
    }

    /// Every fate of a packet to `port`, with its probe, one at a time, until the budget is
    /// spent.
    pub(crate) fn fates(
        &self,
        protocol: Protocol,
        port: u16,
    ) -> impl Iterator<Item = (Probe, super::Fate)> + '_ {
        let probes = self.probes(protocol, port, &self.destinations(protocol, port));
        self.walk(probes)
    }

    /// [`Ctx::fates`] to the addresses `to`.
    pub(crate) fn fates_to(
        &self,
        protocol: Protocol,
        port: u16,
        to: &[IpAddr],
    ) -> impl Iterator<Item = (Probe, super::Fate)> + '_ {
        self.walk(self.probes(protocol, port, to))
    }

    fn walk(&self, probes: Vec<Probe>) -> impl Iterator<Item = (Probe, super::Fate)> + '_ {
        probes.into_iter().take_while(|_| !self.spent()).map(|p| {
            let f = self.ix.fate(&p);
            (p, f)
        })
    }

    pub(crate) fn owner(&self, p: &Place) -> Owner {
        self.table(p).map_or(Owner::Unknown, Owner::of)
    }

    pub(crate) fn table(&self, p: &Place) -> Option<&NftTable> {
        self.rs
            .tables
            .iter()
            .find(|t| t.family == p.family && t.name == p.table)
    }

    /// Whether the rule or element at `p` names `port` (a destination port match, or an
    /// element's key): what is about this port, not about every port.
    pub(crate) fn names_port(&self, p: &Place, port: u16) -> bool {
        if let Some(e) = &p.element {
            return value_has(&e.key, port);
        }
        let Some(rule) = self
            .table(p)
            .and_then(|t| t.chain(&p.chain))
            .and_then(|c| c.rules.get(p.position))
        else {
            return false;
        };
        let table = self.table(p).expect("found above");
        let mut found = BTreeSet::new();
        rule_port_ranges(table, &rule.stmts, &mut found);
        // Inside a range too: `tcp dport 8000-8100 drop` drops 8080.
        found.iter().any(|(_, a, b)| (*a..=*b).contains(&port))
    }
}

/// The host ports `rs` names: (protocol, port), the protocol `None` when not named with it.
pub(crate) fn ports(rs: &Ruleset) -> BTreeSet<(Option<u8>, u16)> {
    let mut out = BTreeSet::new();
    for t in &rs.tables {
        for c in &t.chains {
            for r in &c.rules {
                rule_ports(t, &r.stmts, &mut out);
            }
        }
    }
    out
}

/// [`ports`], and a port of every class of ports the ruleset cannot tell apart (each side
/// of every named port or range, and the ends): what a claim about every port must try.
pub(crate) fn every_class(rs: &Ruleset) -> BTreeSet<(Option<u8>, u16)> {
    let named = ports(rs);
    let mut out = named.clone();
    for &(_, p) in &named {
        for q in [p.checked_sub(1), p.checked_add(1)].into_iter().flatten() {
            if !named.iter().any(|(_, n)| *n == q) {
                out.insert((None, q));
            }
        }
    }
    for q in [1, u16::MAX] {
        if !named.iter().any(|(_, n)| *n == q) {
            out.insert((None, q));
        }
    }
    out
}

/// The protocols to examine `port` with.
pub(crate) fn protocols(proto: Option<u8>) -> Vec<Protocol> {
    match proto.and_then(Protocol::from_number) {
        Some(p) => vec![p],
        None if proto.is_some() => Vec::new(),
        None => vec![Protocol::Tcp, Protocol::Udp],
    }
}

fn rule_ports(t: &NftTable, stmts: &[Stmt], out: &mut BTreeSet<(Option<u8>, u16)>) {
    let mut ranges = BTreeSet::new();
    rule_port_ranges(t, stmts, &mut ranges);
    for (proto, a, b) in ranges {
        out.insert((proto, a));
        out.insert((proto, b));
    }
}

/// The destination ports (single ports as `n..=n`) a rule's statements name, with their
/// protocol when named with it.
fn rule_port_ranges(t: &NftTable, stmts: &[Stmt], out: &mut BTreeSet<(Option<u8>, u16, u16)>) {
    let mut from = |key: &[Key], values: &mut dyn Iterator<Item = &Value>| {
        let Some(at) = key.iter().position(|k| matches!(k, Key::Dport(_))) else {
            return;
        };
        let implied = match key[at] {
            Key::Dport(p) => p,
            _ => None,
        };
        let proto_at = key.iter().position(|k| *k == Key::L4Proto);
        for v in values {
            let part = |i: usize| match (key.len(), v) {
                (1, v) => Some(v),
                (_, Value::Concat(parts)) => parts.get(i),
                _ => None,
            };
            let proto = implied.or_else(|| proto_at.and_then(part).and_then(proto_of));
            match part(at) {
                Some(Value::Int(n)) => {
                    if let Ok(n) = u16::try_from(*n) {
                        out.insert((proto, n, n));
                    }
                }
                Some(Value::IntRange(a, b)) => {
                    if let (Ok(a), Ok(b)) = (u16::try_from(*a), u16::try_from(*b)) {
                        out.insert((proto, a, b));
                    }
                }
                _ => {}
            }
        }
    };
    let elements = |set: &str| t.set(set).map(|s| s.elements.as_slice()).unwrap_or(&[]);
    for s in stmts {
        match s {
            Stmt::Match(m) => match &m.right {
                Operand::Values(vs) => from(&m.key, &mut vs.iter()),
                Operand::Set(name) => from(&m.key, &mut elements(name).iter().map(|e| &e.key)),
            },
            Stmt::Vmap { key, map }
            | Stmt::Nat(crate::model::ruleset::Nat {
                addr: Some(NatAddr::Map { key, map }),
                ..
            }) => match map {
                crate::model::ruleset::SetRef::Inline(es) => {
                    from(key, &mut es.iter().map(|e| &e.key))
                }
                crate::model::ruleset::SetRef::Named(name) => {
                    from(key, &mut elements(name).iter().map(|e| &e.key))
                }
            },
            _ => {}
        }
    }
}

pub(crate) fn proto_of(v: &Value) -> Option<u8> {
    match v {
        Value::Proto(p) => Some(*p),
        Value::Int(n) => u8::try_from(*n).ok(),
        Value::Word(w) => match w.as_str() {
            "tcp" => Some(6),
            "udp" => Some(17),
            "sctp" => Some(132),
            _ => None,
        },
        _ => None,
    }
}

fn value_has(v: &Value, port: u16) -> bool {
    match v {
        Value::Int(n) => *n == u64::from(port),
        Value::IntRange(a, b) => (*a..=*b).contains(&u64::from(port)),
        Value::Concat(parts) => parts.iter().any(|p| value_has(p, port)),
        _ => false,
    }
}
