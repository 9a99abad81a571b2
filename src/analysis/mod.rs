//! Ruleset analysis: reading any owner's rules and judging what a packet meets. `doctor`
//! and its checks, the match sets and packet walk they rest on, and other owners' forwards
//! of a host port ([`forwards`]). Read-only: nothing here writes a rule.

pub mod doctor;
pub mod forwards;
pub mod matchset;
pub mod native;
pub mod packet;
