//! The nftables half of the analysis: what decides a host port's fate in native nf_tables
//! rulesets of any owner (kube-proxy's nftables mode, netavark, firewalld, Docker 29,
//! portmap's nftables backend, natledger's own tables), and the checks doctor runs over
//! them. Pure: a [`Ruleset`] and host facts given as plain values ([`HostFacts`]) in,
//! findings out; no I/O, and it never imports `kernel`, `backend` or `state` (doctor
//! gathers, and maps each [`NftFinding`] to its own `Finding`; this module never imports
//! `analysis::doctor`). Its answers are [`crate::analysis::verdict::Tri`], as the
//! [`crate::analysis::iptables`] half's are.
//!
//! - [`fate`]: one concrete packet ([`Probe`]) walked as the kernel walks it: every table's
//!   base chains of a hook in ascending priority (equal priorities in both orders), nat
//!   chains only while the connection's nat decision of that direction is not made, jumps,
//!   gotos, sets, maps and verdict maps, `numgen` as every branch, and anything not modelled
//!   as "may match" (both ways followed). The answer is every way the packet may end.
//! - [`check`]: the findings (shadowed, dead-target, hijacked-listener, rejected-listener,
//!   forward-dropped, split-backends), each naming its table, chain, rule handle or set
//!   element, the owner ([`Owner`]) and the fix in nft's own syntax; within a budget of rule
//!   evaluations, a ruleset cut short said so ([`Checked::cut`]).
//! - [`forwards_of`]: other owners' native forwards of a host port, for create's check.

mod checks;
mod fate;
mod forwards;
mod index;
mod owner;
#[cfg(test)]
mod tests;
mod value;
mod words;

pub use checks::{BUDGET, Checked, Cut, check, check_within};
pub use fate::{End, Fate, Outcome, Path, Probe, Redirected, fate};
pub use forwards::{NftForward, NftSource, forwards_of};
pub use index::Indexed;
pub use owner::{Owner, is_xtables};

use std::net::IpAddr;

use crate::model::listener::Listener;
use crate::model::portspec::Protocol;
use crate::model::ruleset::{Ruleset, TableFamily, Value};

/// What a finding is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum NftKind {
    /// A forward of a host port that never sees a packet: an earlier rule or element takes
    /// every packet it would have taken.
    Shadowed,
    /// A DNAT to an address nothing live holds.
    DeadTarget,
    /// A local listener whose packets a DNAT or redirect sends elsewhere.
    HijackedListener,
    /// A local listener whose new connections a drop or reject takes.
    RejectedListener,
    /// A forwarded (DNATed) connection dropped in a forward hook chain.
    ForwardDropped,
    /// A host port forwarded both in native tables and in iptables'.
    SplitBackends,
}

impl NftKind {
    pub fn word(self) -> &'static str {
        match self {
            Self::Shadowed => "shadowed",
            Self::DeadTarget => "dead-target",
            Self::HijackedListener => "hijacked-listener",
            Self::RejectedListener => "rejected-listener",
            Self::ForwardDropped => "forward-dropped",
            Self::SplitBackends => "split-backends",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Severity {
    Error,
    Warning,
    Info,
}

/// Where in a ruleset: a rule (by handle) or an element of a set or map.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Place {
    pub family: TableFamily,
    pub table: String,
    pub chain: String,
    /// The rule's handle, when the ruleset carries handles.
    pub handle: Option<u64>,
    /// The rule's position in its chain (0-based), for a ruleset without handles.
    pub position: usize,
    /// The element of a named set or map the rule looked up, when it decided.
    pub element: Option<ElementRef>,
}

/// An element of a named set or map, by its key.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ElementRef {
    pub set: String,
    pub key: Value,
}

/// One finding over native tables.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NftFinding {
    pub kind: NftKind,
    pub severity: Severity,
    pub protocol: Protocol,
    pub port: u16,
    /// The rule or element at fault (the shadowed forward, the dead DNAT, the one taking a
    /// listener's packets, the drop).
    pub place: Place,
    /// The other side: what shadows it, the forward whose packets are dropped.
    pub other: Option<Place>,
    /// Whose `place` is.
    pub owner: Owner,
    /// One line.
    pub summary: String,
    /// Why, in a few sentences.
    pub explanation: String,
    /// Commands that remove the cause, in nft's own syntax.
    pub fix: Vec<String>,
    /// For an owner that writes its rules back: what to change so it stays fixed.
    pub lasting_fix: Option<String>,
}

/// Another backend's forward of a host port (iptables'), for split-backends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ForeignForward {
    pub protocol: Protocol,
    pub port: u16,
    /// Where, in words (`iptables-nft nat DOCKER rule 3`).
    pub place: String,
}

/// The host's facts the checks weigh, as plain values.
#[derive(Clone, Debug, Default)]
pub struct HostFacts {
    /// Listening sockets.
    pub listeners: Vec<Listener>,
    /// This host's addresses (loopback is always local).
    pub locals: Vec<IpAddr>,
    /// Addresses something live holds (containers, pods, this host): `None` when not known,
    /// and then no DNAT is called dead.
    pub live: Option<Vec<IpAddr>>,
    /// The iptables side's forwards.
    pub iptables_forwards: Vec<ForeignForward>,
}

/// Whether `addr` is one of this host's (`locals`, or loopback).
pub(crate) fn is_local(locals: &[IpAddr], addr: IpAddr) -> bool {
    addr.is_loopback() || locals.contains(&addr)
}

/// Every table of `rs` a packet of this IP version meets.
pub(crate) fn tables_for(
    rs: &Ruleset,
    v4: bool,
) -> impl Iterator<Item = &crate::model::ruleset::NftTable> {
    rs.tables.iter().filter(move |t| match t.family {
        TableFamily::Ip => v4,
        TableFamily::Ip6 => !v4,
        TableFamily::Inet => true,
        _ => false,
    })
}

/// Where `p` is, in words (`rule handle 4 in inet netavark chain PREROUTING`).
pub fn place_text(p: &Place) -> String {
    words::place(p)
}
