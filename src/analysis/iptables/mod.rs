//! The iptables half of the analysis: rules as `iptables-save` prints them
//! ([`crate::model::anyrule`] over [`crate::model::save`]), of any owner, in either iptables
//! backend. Pure: rules and packets as values in, answers out; it never imports `kernel`,
//! `backend` or `state` (doctor and `forwards` read the host and combine it with the
//! [`crate::analysis::nftables`] half).
//!
//! - [`matchset`]: does rule A take every packet rule B would (sound, not complete).
//! - [`packet`]: does this packet match one rule ([`crate::analysis::verdict::Tri`]), and
//!   the fate of a packet in a built-in chain.
//! - [`paths`]: one hook's evaluation order with path conditions, and the rules an earlier
//!   one shadows, bounded whatever the ruleset.
//! - [`nat_walk`]: a nat table followed with one packet to every other owner's DNAT or
//!   REDIRECT it may meet (create's check of other owners' forwards).

pub mod matchset;
pub mod nat_walk;
pub mod packet;
pub mod paths;
