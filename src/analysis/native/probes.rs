//! The packets the checks send through [`super::fate`]: representatives of every class of
//! packet the ruleset tells apart.

use std::net::IpAddr;

use crate::model::ruleset::Ruleset;

/// A source address from outside: one no rule of `rs` names (a documentation address).
pub(crate) fn outside_source(rs: &Ruleset, v4: bool) -> IpAddr {
    let _ = rs;
    if v4 {
        IpAddr::from([203, 0, 113, 7])
    } else {
        "2001:db8:ffff::7".parse().expect("an address")
    }
}
