//! Match sets: does rule A take every packet rule B would?
//!
//! Over rules as [`crate::model::anyrule`] parses them (a `Match`, a conjunction of `Cond`s, and
//! a target): `Match::covers` and `Match::is_empty` (in `imply`) are *sound, not complete*:
//! they answer `true` only when certain, so doctor never claims a shadow it cannot prove.
//! Whatever the parser does not model is an opaque `Cond::Other`, which only an identical
//! condition implies.
//!
//! Semantics kept in mind:
//! - Port matches (`tcp`, `udp`, `sctp`, `dccp`, `multiport`) never match non-first fragments,
//!   negated or not, so a port condition is never vacuous (`--dport 0:65535` still needs one).
//! - `-m addrtype` differs by family: IPv4 tests the one route type of the address, IPv6 tests
//!   UNICAST/MULTICAST/UNSPEC as extra requirements and LOCAL/ANYCAST/UNREACHABLE by a route
//!   lookup. Implications are claimed only where they hold in both.
//! - An unknown module's options, or an `addrtype` with an option not modelled
//!   (`--limit-iface-in`), stay together as one `Cond::Other`: options can qualify each
//!   other (`--limit-burst`), so splitting them would not be sound. The options of `tcp`,
//!   `udp`, `sctp`, `dccp` and `multiport` are independent and become one condition each.
//! - Both rules are assumed to come from the same table and family.

mod imply;
#[cfg(test)]
mod tests;

pub(crate) use imply::{net_contains, net_disjoint, proto_number};
