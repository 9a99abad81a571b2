//! route_localnet towards a container whose mapping answers on 127.0.0.1, once its create
//! wrote the localhost guard.

use std::net::IpAddr;

use crate::causes::Causes;
use crate::model::family::Family;
use crate::model::table::Table;
use crate::state::ledger::{Manifest, RuleRecord};

use super::Context;

/// Turn on route_localnet towards the container when a mapping answers on 127.0.0.1, and
/// only when this create wrote the IPv4 filter table: the localhost guard is then in place
/// (created or checked with the shared rules), so the switch opens the node's 127.0.0.0/8
/// to nothing but the node's own connections. A failure only costs the localhost path, so
/// it is a warning. On the nftables backend every IPv4 create writes or checks the guard in
/// the same transaction as its rules.
pub(super) fn allow_loopback_sources(ctx: &Context, manifest: &Manifest) {
    let wanted = manifest
        .mappings
        .iter()
        .any(|m| m.reachable_from_loopback() && m.family() != Some(Family::Ipv6));
    let own: Vec<&RuleRecord> = manifest
        .rules
        .iter()
        .filter(|r| r.family == Family::Ipv4)
        .collect();
    // None: the rules are shared with a holder, whose create did this.
    let guarded = own.iter().any(|r| r.is_in(Table::Filter))
        || (ctx.driver.capabilities().one_transaction && !own.is_empty());
    if wanted && !own.is_empty() && !guarded {
        log::warn!(
            "127.0.0.1 will not reach this container: the ipv4 filter \
             table was not written, so the localhost guard is not known to be in place and \
             route_localnet stays as it is"
        );
        return;
    }
    let v4 = manifest.addresses.iter().find_map(|a| match a {
        IpAddr::V4(v4) => Some(*v4),
        IpAddr::V6(_) => None,
    });
    if let (true, Some(v4)) = (wanted && guarded, v4) {
        match ctx.host.enable_route_localnet(v4) {
            Ok(Some(iface)) => log::info!("set route_localnet=1 on {iface}"),
            Ok(None) => {}
            Err(e) => log::warn!("127.0.0.1 will not reach {v4}: {}", Causes(&e)),
        }
    }
}
