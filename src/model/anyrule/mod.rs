//! Any saved rule, natledger's or not, as what it matches and where it sends a packet.
//!
//! [`parse_rule`] turns the argument tokens of a saved rule (after `-A CHAIN`) into a
//! [`Match`] (a conjunction of [`Cond`]s) and a [`Target`]. Whatever the parser does not
//! model becomes an opaque [`Cond::Other`], which only an identical condition implies: an
//! unknown module's options, or an `addrtype` with an option not modelled
//! (`--limit-iface-in`), stay together as one [`Cond::Other`], since options can qualify each
//! other (`--limit-burst`); the options of `tcp`, `udp`, `sctp`, `dccp` and `multiport` are
//! independent and become one condition each. The writer reads these to place its FORWARD
//! jump (`layout::jump_op`); doctor's coverage (`analysis::iptables::matchset`) and packet walks
//! reason over them.

mod parse;

use std::rc::Rc;

use crate::model::rule::IpNet;

#[cfg(test)]
pub(crate) use parse::parse_ports;
pub use parse::parse_rule;

/// One condition of a rule.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Cond {
    /// `-p`: lower-case name or number as printed (`tcp`, `47`); `all`/`0` is no condition.
    Protocol { negated: bool, proto: String },
    /// `-s`
    Src { negated: bool, net: IpNet },
    /// `-d`
    Dst { negated: bool, net: IpNet },
    /// `-i`; a trailing `+` matches every name with that prefix.
    InIface { negated: bool, name: String },
    /// `-o`; a trailing `+` matches every name with that prefix.
    OutIface { negated: bool, name: String },
    /// `--dport`/`--dports`/`--destination-port(s)` of `tcp`, `udp`, `sctp`, `dccp`, `multiport`.
    DPorts { negated: bool, ports: PortSet },
    /// `--sport`/`--sports`/`--source-port(s)`.
    SPorts { negated: bool, ports: PortSet },
    /// `-m addrtype --dst-type LOCAL,UNICAST` (sorted, upper-case).
    DstType { negated: bool, types: Vec<String> },
    /// `-m addrtype --src-type ...` (sorted, upper-case).
    SrcType { negated: bool, types: Vec<String> },
    /// Anything not modelled (e.g. `-m mark --mark 0x1`, `-m conntrack --ctstate NEW`,
    /// `-m set --match-set x dst`, `-f`): the exact tokens of that option and its module,
    /// `--match` written `-m`, joined by single spaces (tokens with blanks or quotes quoted).
    /// Shared, not copied, by the conditions of every path through the rule (it can be long:
    /// `-m bpf --bytecode`, `-m string --hex-string`).
    Other(Rc<str>),
}

/// A set of ports as sorted, merged inclusive ranges.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PortSet(pub Vec<(u16, u16)>);

/// What a rule matches: the conjunction of its conditions (empty = every packet).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Match {
    pub conds: Vec<Cond>,
}

/// Where a matching packet goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// No `-j`/`-g`: a counting rule, evaluation continues.
    None,
    /// `-j NAME` for any name that is not a known target: a chain (the caller checks it exists).
    Jump(String),
    /// `-g CHAIN`
    Goto(String),
    Accept,
    Drop,
    Return,
    /// With or without `--reject-with`.
    Reject,
    /// The first `--to-destination` value (empty if none).
    Dnat {
        to: String,
    },
    /// `--to-ports`, if given.
    Redirect {
        to_ports: Option<String>,
    },
    Masquerade,
    /// The first `--to-source` value (empty if none).
    Snat {
        to: String,
    },
    /// Targets that do not end evaluation (MARK, LOG, CONNMARK, CT, NOTRACK, TRACE, ...), the
    /// other extension targets (NETMAP, NFQUEUE, TPROXY, ...) and `-j` without a name: name only.
    Other(String),
}

/// Whether `word` is one of the space-separated words of `list`.
pub(crate) fn listed(list: &str, word: &str) -> bool {
    list.split_whitespace().any(|w| w == word)
}

impl Target {
    /// Whether a packet this rule matches stops being evaluated in this table's hook here
    /// (ACCEPT, DROP, REJECT, DNAT, REDIRECT, MASQUERADE, SNAT). RETURN is not terminal (the
    /// caller handles it); neither are jumps, gotos and [`Target::Other`].
    pub fn is_terminal(&self) -> bool {
        use Target::*;
        matches!(
            self,
            Accept | Drop | Reject | Dnat { .. } | Redirect { .. } | Masquerade | Snat { .. }
        )
    }
}

impl PortSet {
    /// The union of inclusive ranges, sorted and merged; a range with `first > last` is empty
    /// (as the kernel treats it).
    pub fn new(ranges: Vec<(u16, u16)>) -> PortSet {
        let mut ranges: Vec<(u16, u16)> = ranges.into_iter().filter(|(a, b)| a <= b).collect();
        ranges.sort_unstable();
        let mut out: Vec<(u16, u16)> = Vec::with_capacity(ranges.len());
        for (a, b) in ranges {
            match out.last_mut() {
                Some(last) if u32::from(a) <= u32::from(last.1) + 1 => last.1 = last.1.max(b),
                _ => out.push((a, b)),
            }
        }
        PortSet(out)
    }

    /// Every port not in the set.
    pub(crate) fn complement(&self) -> PortSet {
        let (mut out, mut next) = (Vec::new(), 0u32);
        for (a, b) in PortSet::new(self.0.clone()).0 {
            if u32::from(a) > next {
                out.push((next as u16, a - 1));
            }
            next = u32::from(b) + 1;
        }
        if next <= u32::from(u16::MAX) {
            out.push((next as u16, u16::MAX));
        }
        PortSet(out)
    }

    /// The ports in both sets.
    pub(crate) fn intersection(&self, other: &PortSet) -> PortSet {
        let (x, y) = (
            PortSet::new(self.0.clone()).0,
            PortSet::new(other.0.clone()).0,
        );
        let (mut i, mut j, mut out) = (0, 0, Vec::new());
        while i < x.len() && j < y.len() {
            let (lo, hi) = (x[i].0.max(y[j].0), x[i].1.min(y[j].1));
            if lo <= hi {
                out.push((lo, hi));
            }
            if x[i].1 < y[j].1 { i += 1 } else { j += 1 }
        }
        PortSet(out)
    }

    /// Whether every port of `self` is in `other`.
    pub(crate) fn is_subset(&self, other: &PortSet) -> bool {
        self.intersection(other) == PortSet::new(self.0.clone())
    }

    pub fn is_empty(&self) -> bool {
        self.0.iter().all(|(a, b)| a > b)
    }
}
