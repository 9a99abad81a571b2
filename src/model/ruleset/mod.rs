//! A native nf_tables ruleset of any owner (kube-proxy's nftables mode, netavark, firewalld,
//! Docker 29, portmap's nftables backend, natledger's own tables), as the analysis sees it:
//! tables, base chains with their hook and priority, rules as statements, named sets, maps and
//! verdict maps with their elements. Pure values: the readers fill it (over netlink,
//! `kernel::nftables::ruleset`; from `nft list ruleset` text or `nft -j list ruleset` JSON,
//! `dump`), the analysis evaluates it (`analysis::nftables`).
//!
//! The model is deliberately coarse where the kernel's semantics do not decide a host port's
//! fate: anything a reader does not model becomes [`Stmt::Other`] or [`Key::Other`], which the
//! analysis treats as "may match" (a statement it cannot decide never makes its result
//! narrower than the kernel's). Names (tables, chains, sets) are kept as the kernel has them:
//! they are the edge, printed back in fixes (`nft delete rule inet netavark CHAIN handle N`).

use std::net::IpAddr;

/// Every table of a ruleset, in the kernel's order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ruleset {
    pub tables: Vec<NftTable>,
}

/// An nf_tables table family (`nft list tables` words).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TableFamily {
    Ip,
    Ip6,
    Inet,
    Arp,
    Bridge,
    Netdev,
}

impl TableFamily {
    /// nft's word: `ip`, `ip6`, `inet`, `arp`, `bridge`, `netdev`.
    pub fn word(self) -> &'static str {
        match self {
            Self::Ip => "ip",
            Self::Ip6 => "ip6",
            Self::Inet => "inet",
            Self::Arp => "arp",
            Self::Bridge => "bridge",
            Self::Netdev => "netdev",
        }
    }

    pub fn from_word(word: &str) -> Option<Self> {
        Some(match word {
            "ip" => Self::Ip,
            "ip6" => Self::Ip6,
            "inet" => Self::Inet,
            "arp" => Self::Arp,
            "bridge" => Self::Bridge,
            "netdev" => Self::Netdev,
            _ => return None,
        })
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NftTable {
    pub family: TableFamily,
    pub name: String,
    pub handle: Option<u64>,
    pub comment: Option<String>,
    pub chains: Vec<Chain>,
    /// Sets, maps and verdict maps.
    pub sets: Vec<Set>,
}

impl NftTable {
    pub fn chain(&self, name: &str) -> Option<&Chain> {
        self.chains.iter().find(|c| c.name == name)
    }

    pub fn set(&self, name: &str) -> Option<&Set> {
        self.sets.iter().find(|s| s.name == name)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chain {
    pub name: String,
    pub handle: Option<u64>,
    /// Present for a base chain (attached to a hook).
    pub base: Option<Base>,
    pub rules: Vec<Rule>,
}

/// What attaches a base chain to a hook. The kernel runs every table's base chains of one
/// hook in ascending priority; a verdict of accept ends only that chain, drop ends the packet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Base {
    pub kind: ChainKind,
    pub hook: Hook,
    pub priority: i32,
    pub policy: Policy,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ChainKind {
    Filter,
    Nat,
    Route,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Hook {
    Ingress,
    Prerouting,
    Input,
    Forward,
    Output,
    Postrouting,
    Egress,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Policy {
    Accept,
    Drop,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    pub handle: Option<u64>,
    pub comment: Option<String>,
    /// In order: a packet that fails a [`Stmt::Match`] leaves the rule; a verdict ends it.
    pub stmts: Vec<Stmt>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stmt {
    /// `KEY OP RIGHT`: a packet continues with the rule's next statement when it holds.
    Match(Match),
    Verdict(Verdict),
    /// `KEY vmap @name` or `KEY vmap { ... }`: the verdict of the element the key finds; no
    /// element, no verdict (the rule goes on).
    Vmap {
        key: Vec<Key>,
        map: SetRef,
    },
    /// dnat, snat, masquerade, redirect.
    Nat(Nat),
    /// `reject` in any form: ends the packet, answered with an error.
    Reject,
    /// Statements that neither match nor decide: counter, log, mangle of a mark, notrack...
    Effect(String),
    /// A statement the reader does not model: it may match or not, and may decide anything
    /// the analysis cannot tell (`limit`, `quota`, `meter`, `queue`...).
    Other(String),
}

/// `key OP right`, `key` one or more fields concatenated (`ip daddr . meta l4proto . th
/// dport`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Match {
    pub key: Vec<Key>,
    pub op: Op,
    pub right: Operand,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// `==` (or `in`, or implicit): the key equals a value, is in the prefix/range, or, for a
    /// flag-like key (`ct state new,established`), any of the values.
    Eq,
    Ne,
    Lt,
    Gt,
    Le,
    Ge,
}

/// A field of the packet or its metadata the analysis reasons about.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Key {
    /// `ip saddr` (v4 true) / `ip6 saddr`.
    Saddr {
        v4: bool,
    },
    Daddr {
        v4: bool,
    },
    /// `meta l4proto`, `ip protocol`, `ip6 nexthdr`.
    L4Proto,
    /// `th dport` (None) or `tcp dport`/`udp dport`/`sctp dport` (which implies its protocol).
    Dport(Option<u8>),
    Sport(Option<u8>),
    Iifname,
    Oifname,
    Iif,
    Oif,
    /// `meta nfproto` (ipv4/ipv6) in an inet table.
    NfProto,
    /// `fib daddr type` (local, unicast, ...); other fib lookups are [`Key::Other`].
    FibDaddrType,
    CtState,
    CtStatus,
    Mark,
    /// `numgen random mod N` / `numgen inc mod N` (offset folded into the values).
    Numgen {
        modulus: u32,
    },
    /// Anything else, in nft's words (`ct mark`, `meta skuid`, a bitwise-masked field...):
    /// may match.
    Other(String),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Operand {
    /// A literal or an anonymous set: the key matches any of them.
    Values(Vec<Value>),
    /// `@name`: a named set of the same table.
    Set(String),
}

/// A value as a set element, a match's right side or a map's data.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Value {
    Int(u64),
    IntRange(u64, u64),
    Addr(IpAddr),
    Prefix(IpAddr, u8),
    AddrRange(IpAddr, IpAddr),
    /// An IP protocol number (`tcp` is 6).
    Proto(u8),
    /// A symbol in nft's words: a fib type (`local`), a ct state (`new`), an interface name
    /// (`eth*` a wildcard), a verdict-less word.
    Word(String),
    /// One element of a concatenated key, field by field.
    Concat(Vec<Value>),
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Verdict {
    Accept,
    Drop,
    Continue,
    Return,
    Jump(String),
    Goto(String),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SetRef {
    Named(String),
    Inline(Vec<Element>),
}

/// A named set, map or verdict map.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Set {
    pub name: String,
    pub handle: Option<u64>,
    /// The key's types, in nft's words (`ipv4_addr`, `inet_proto`, `inet_service`); more
    /// than one for a concatenation.
    pub key: Vec<String>,
    /// None for a set; `Some(Verdict)` for a verdict map; the data types of a map.
    pub data: Option<SetData>,
    /// `flags interval`: elements may be prefixes and ranges.
    pub interval: bool,
    pub comment: Option<String>,
    pub elements: Vec<Element>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SetData {
    Verdict,
    Typed(Vec<String>),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Element {
    /// The key: a [`Value::Concat`] for a concatenated key.
    pub key: Value,
    pub data: Option<ElementData>,
    pub comment: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ElementData {
    Verdict(Verdict),
    Value(Value),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Nat {
    pub kind: NatKind,
    /// `dnat ip to ...` in an inet table: the family the statement applies to.
    pub v4: Option<bool>,
    pub addr: Option<NatAddr>,
    pub port: Option<NatPort>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NatKind {
    Dnat,
    Snat,
    Masquerade,
    Redirect,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NatAddr {
    /// An address or a range.
    Fixed(Value),
    /// `dnat to KEY map @name` / `map { ... }`: the element's data, address (and port for a
    /// concatenated data type).
    Map { key: Vec<Key>, map: SetRef },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NatPort {
    Fixed(u16),
    Range(u16, u16),
    /// From the map's data (`dnat to ip daddr . tcp dport map { ... : 10.0.0.2 . 80 }`).
    FromMap,
}

mod dump;
pub mod json;
pub mod render;
mod symbols;
pub mod text;

pub use dump::{DumpError, parse_dump};
pub use json::parse_json;
pub use text::parse_text;
