//! Other owners' native forwards of a host port, for create's check ([`forwards_of`]), and
//! where create reads the native ruleset from ([`NftSource`]).

use std::net::IpAddr;

use super::{Indexed, Owner, Path, Place, Probe, is_xtables};
use crate::model::portspec::Protocol;
use crate::model::ruleset::Ruleset;

/// A DNAT or redirect of another owner that a packet to the host port may meet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NftForward {
    pub protocol: Protocol,
    pub port: u16,
    pub place: Place,
    pub owner: Owner,
    pub to: IpAddr,
    pub to_port: u16,
    /// Whether every such packet meets it (else only some: a source, an interface...).
    pub certain: bool,
}

/// The native ruleset of this host as create's check reads it: the live reader
/// (`kernel::nftables::ruleset`) implements it; the generation keys its cache.
pub trait NftSource {
    type Error;
    /// The nf_tables generation now (cheap).
    fn generation(&mut self) -> Result<u32, Self::Error>;
    /// Every table, and the generation it was read at.
    fn read(&mut self) -> Result<(Ruleset, u32), Self::Error>;
}

/// Every forward of `protocol`/`port` in `rs` outside natledger's own tables and
/// iptables-nft's that a new
/// connection to one of `locals` (from outside or from this host) may meet.
pub fn forwards_of(
    rs: &Ruleset,
    protocol: Protocol,
    port: u16,
    locals: &[IpAddr],
) -> Vec<NftForward> {
    let ix = Indexed::new(rs);
    let mut out: Vec<NftForward> = Vec::new();
    let mut dsts: Vec<IpAddr> = locals.to_vec();
    for lo in [
        IpAddr::from([127, 0, 0, 1]),
        IpAddr::from(std::net::Ipv6Addr::LOCALHOST),
    ] {
        if !dsts.contains(&lo) {
            dsts.push(lo);
        }
    }
    let shared: std::sync::Arc<[IpAddr]> = locals.into();
    for daddr in dsts {
        for path in [Path::Outside, Path::Local] {
            if path == Path::Outside && daddr.is_loopback() {
                continue;
            }
            let probe = Probe::to(daddr, path, protocol.number(), port, shared.clone());
            let f = ix.fate(&probe);
            for o in &f.outcomes {
                let Some(d) = &o.dnat else { continue };
                let table = rs
                    .tables
                    .iter()
                    .find(|t| t.family == d.place.family && t.name == d.place.table);
                let owner = table.map_or(Owner::Unknown, Owner::of);
                // natledger's own, and iptables-nft's (the iptables walk reads those).
                if owner == Owner::Natledger || table.is_some_and(is_xtables) {
                    continue;
                }
                let certain = f.all(|x| x.dnat.as_ref().is_some_and(|x| x.place == d.place))
                    == crate::analysis::verdict::Tri::Yes;
                if let Some(known) = out.iter_mut().find(|k| k.place == d.place) {
                    known.certain |= certain;
                    continue;
                }
                out.push(NftForward {
                    protocol,
                    port,
                    place: d.place.clone(),
                    owner,
                    to: d.to,
                    to_port: d.port,
                    certain,
                });
            }
        }
    }
    out
}
