//! What implies what: [`Match::covers`], [`Match::is_empty`] and the conjunction of two
//! matches, condition by condition. Sound, not complete (see the module above).

use std::net::IpAddr;

use crate::model::anyrule::{Cond, Match, PortSet, listed};
use crate::model::rule::IpNet;

/// Types IPv6 looks up in the routing table (a set of them is a union there too).
const LOOKUP_TYPES: &str = "LOCAL ANYCAST UNREACHABLE";
/// Types ip6tables refuses: a rule naming one is IPv4, where a set is a plain union.
const V4_ONLY_TYPES: &str = "BROADCAST BLACKHOLE PROHIBIT THROW NAT XRESOLVE";

/// A condition taken apart: (field, negated, value). Conditions on the same field compare.
pub(super) enum Val<'a> {
    Proto(&'a str),
    Net(&'a IpNet),
    Iface(&'a str),
    Ports(&'a PortSet),
    Types(&'a [String]),
    Other(&'a str),
}

pub(super) fn parts(c: &Cond) -> (u8, bool, Val<'_>) {
    match c {
        Cond::Protocol { negated, proto } => (0, *negated, Val::Proto(proto)),
        Cond::Src { negated, net } => (1, *negated, Val::Net(net)),
        Cond::Dst { negated, net } => (2, *negated, Val::Net(net)),
        Cond::InIface { negated, name } => (3, *negated, Val::Iface(name)),
        Cond::OutIface { negated, name } => (4, *negated, Val::Iface(name)),
        Cond::DPorts { negated, ports } => (5, *negated, Val::Ports(ports)),
        Cond::SPorts { negated, ports } => (6, *negated, Val::Ports(ports)),
        Cond::DstType { negated, types } => (7, *negated, Val::Types(types)),
        Cond::SrcType { negated, types } => (8, *negated, Val::Types(types)),
        Cond::Other(x) => (9, false, Val::Other(x)),
    }
}

/// Whether every packet satisfying `b` satisfies `a`.
fn implies(b: &Cond, a: &Cond) -> bool {
    let ((ak, an, a), (bk, bn, b)) = (parts(a), parts(b));
    ak == bk && implies_parts((bn, b), (an, a))
}

/// [`implies`] on parts of the same field (negation flags given separately).
fn implies_parts((bn, b): (bool, Val), (an, a): (bool, Val)) -> bool {
    // From set relations: non-negated b ⊆ a; both negated a ⊆ b; negated a: b disjoint from a.
    fn by_sets<T: ?Sized>(
        an: bool,
        a: &T,
        bn: bool,
        b: &T,
        subset: fn(&T, &T) -> bool,
        disjoint: fn(&T, &T) -> bool,
    ) -> bool {
        match (an, bn) {
            (false, false) => subset(b, a),
            (true, true) => subset(a, b),
            (true, false) => disjoint(a, b),
            (false, true) => false,
        }
    }
    match (a, b) {
        (Val::Proto(a), Val::Proto(b)) => by_sets(
            an,
            a,
            bn,
            b,
            |x, y| x == y || proto_number(x).is_some_and(|n| proto_number(y) == Some(n)),
            |x, y| matches!((proto_number(x), proto_number(y)), (Some(m), Some(n)) if m != n),
        ),
        (Val::Net(a), Val::Net(b)) => {
            by_sets(an, a, bn, b, |x, y| net_contains(y, x), net_disjoint)
        }
        (Val::Iface(a), Val::Iface(b)) => by_sets(an, a, bn, b, iface_subset, iface_disjoint),
        (Val::Ports(a), Val::Ports(b)) => effective(bn, b).is_subset(&effective(an, a)),
        (Val::Types(a), Val::Types(b)) => by_sets(an, a, bn, b, types_imply, types_disjoint),
        (Val::Other(a), Val::Other(b)) => a == b && !stateful(a),
        _ => false,
    }
}

/// Modules whose verdict is a fresh draw or a per-rule counter (random sampling, every nth
/// packet, token buckets, quotas, recent lists): two rules with the same such condition do
/// not match the same packets, so an identical condition implies nothing.
const STATEFUL_MODULES: &[&str] = &[
    "statistic",
    "limit",
    "hashlimit",
    "connlimit",
    "quota",
    "quota2",
    "recent",
    "nth",
    "random",
];

fn stateful(other: &str) -> bool {
    let mut tokens = other.split_whitespace();
    while let Some(t) = tokens.next() {
        if (t == "-m" || t == "--match")
            && tokens.next().is_some_and(|m| STATEFUL_MODULES.contains(&m))
        {
            return true;
        }
    }
    false
}

/// Whether every packet satisfies the condition (`-s 0.0.0.0/0`, `-i +`; never ports, see
/// the module comment), with its negation flag replaced by `negated`.
fn vacuous(c: &Cond, negated: bool) -> bool {
    match parts(c) {
        (_, _, Val::Net(net)) => !negated && net.prefix == 0,
        (_, _, Val::Iface(name)) => !negated && name == "+",
        _ => false,
    }
}

pub(super) fn effective(negated: bool, ports: &PortSet) -> PortSet {
    if negated {
        ports.complement()
    } else {
        PortSet::new(ports.0.clone())
    }
}

/// (bits, width) of an address.
fn addr_bits(addr: IpAddr) -> (u128, u8) {
    match addr {
        IpAddr::V4(a) => (u128::from(u32::from(a)), 32),
        IpAddr::V6(a) => (u128::from(a), 128),
    }
}

/// Whether every address of `inner` is in `outer` (never across families).
pub(crate) fn net_contains(outer: &IpNet, inner: &IpNet) -> bool {
    let ((o, ow), (n, nw)) = (addr_bits(outer.addr), addr_bits(inner.addr));
    let (op, ip) = (outer.prefix.min(ow), inner.prefix.min(nw));
    let key = |bits: u128| if op == 0 { 0 } else { bits >> (ow - op) };
    ow == nw && op <= ip && key(o) == key(n)
}

/// Whether no address is in both (within one family prefixes nest or are disjoint).
pub(crate) fn net_disjoint(a: &IpNet, b: &IpNet) -> bool {
    addr_bits(a.addr).1 == addr_bits(b.addr).1 && !net_contains(a, b) && !net_contains(b, a)
}

/// An interface name as a pattern: (literal part, is a `+` prefix).
fn iface(name: &str) -> (&str, bool) {
    name.strip_suffix('+')
        .map_or((name, false), |prefix| (prefix, true))
}

pub(super) fn iface_subset(inner: &str, outer: &str) -> bool {
    match (iface(inner), iface(outer)) {
        ((i, _), (o, true)) => i.starts_with(o),
        _ => inner == outer,
    }
}

fn iface_disjoint(a: &str, b: &str) -> bool {
    match (iface(a), iface(b)) {
        ((x, false), (y, false)) => x != y,
        ((x, false), (p, true)) | ((p, true), (x, false)) => !x.starts_with(p),
        ((p, true), (q, true)) => !p.starts_with(q) && !q.starts_with(p),
    }
}

/// Whether `--X-type T` implies `--X-type S`, in IPv4 (T ⊆ S) and in IPv6 alike.
fn types_imply(t: &[String], s: &[String]) -> bool {
    let extra: Vec<&String> = s.iter().filter(|x| !t.contains(x)).collect();
    t.iter().all(|x| s.contains(x))
        && (extra.is_empty()
            || s.iter().any(|x| listed(V4_ONLY_TYPES, x))
            || (extra.iter().all(|x| listed(LOOKUP_TYPES, x))
                && t.iter().any(|x| listed(LOOKUP_TYPES, x))))
}

/// Whether no address has both types: claimed only for certainly-IPv4 rules.
fn types_disjoint(a: &[String], b: &[String]) -> bool {
    a.iter().chain(b).any(|x| listed(V4_ONLY_TYPES, x)) && !a.iter().any(|x| b.contains(x))
}

/// The protocol number of a number or of a name iptables prints.
pub(crate) fn proto_number(p: &str) -> Option<u8> {
    let names = "icmp:1 tcp:6 udp:17 dccp:33 gre:47 esp:50 ah:51 icmpv6:58 ipv6-icmp:58 sctp:132 \
        mh:135 ipv6-mh:135 udplite:136";
    let named = names
        .split_whitespace()
        .filter_map(|e| e.split_once(':'))
        .find(|(n, _)| *n == p);
    p.parse()
        .ok()
        .or_else(|| named.and_then(|(_, v)| v.parse().ok()))
}

impl Match {
    /// Every packet `other` matches, `self` matches too. Sound, not complete: false when
    /// unsure. Each condition of `self` must be vacuous or implied by one condition of
    /// `other`; a match that is certainly empty is covered by anything.
    pub fn covers(&self, other: &Match) -> bool {
        let implied =
            |a: &Cond| vacuous(a, parts(a).1) || other.conds.iter().any(|b| implies(b, a));
        self.conds.iter().all(implied) || other.is_empty()
    }

    /// The conjunction of both (the conditions of a jump and of a rule in the chain it jumps
    /// to); conditions already present are not repeated.
    pub fn and(&self, other: &Match) -> Match {
        let mut conds = self.conds.clone();
        for c in &other.conds {
            if !conds.contains(c) {
                conds.push(c.clone());
            }
        }
        Match { conds }
    }

    /// Whether no packet can match (`-p tcp` and `-p udp`; disjoint port sets; two different
    /// host addresses). Sound: true only when certain.
    pub fn is_empty(&self) -> bool {
        // a contradicts b when a implies not-b.
        let contradicts = |a: &Cond, b: &Cond| {
            let ((ak, an, av), (bk, bn, bv)) = (parts(a), parts(b));
            ak == bk && ak != 9 && implies_parts((an, av), (!bn, bv))
        };
        let ports_empty = |field: u8| {
            let sets = self.conds.iter().filter_map(|c| match parts(c) {
                (k, negated, Val::Ports(p)) if k == field => Some(effective(negated, p)),
                _ => None,
            });
            sets.reduce(|x, y| x.intersection(&y))
                .is_some_and(|s| s.is_empty())
        };
        let conds = &self.conds;
        ports_empty(5)
            || ports_empty(6)
            || conds
                .iter()
                .any(|c| parts(c).0 != 9 && vacuous(c, !parts(c).1))
            || conds.iter().enumerate().any(|(i, a)| {
                conds[i + 1..]
                    .iter()
                    .any(|b| contradicts(a, b) || contradicts(b, a))
            })
    }
}
