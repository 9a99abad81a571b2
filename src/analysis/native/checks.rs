//! The checks over native tables.

use super::{HostFacts, NativeFinding};
use crate::model::ruleset::Ruleset;

/// Every finding of every check over `rs`, with the host's facts.
pub fn check(rs: &Ruleset, host: &HostFacts) -> Vec<NativeFinding> {
    let _ = (rs, host);
    Vec::new()
}
