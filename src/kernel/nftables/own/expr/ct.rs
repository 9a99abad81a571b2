//! The conntrack DNAT match (`rule::Dnatted`) as nf_tables `ct` expressions, as `nft` 1.0.6
//! writes `ct status dnat ct original protocol P [ct original ip daddr H] ct reply ip saddr
//! A ct original proto-dst PORTS ct reply proto-src PORTS` (iptables' option order), and
//! read back.

use std::iter::Peekable;
use std::net::IpAddr;
use std::slice::Iter;

use super::{
    CT_STATUS, EQ, EncodeError, Expr, IPS_DST_NAT, NEQ, REG_1, cmp, ct_bits, ip_of, next_cmp,
    next_ports, octets, port_cmp,
};
use crate::model::family::Family;
use crate::model::portspec::{PortRange, Protocol};
use crate::model::rule::Dnatted;

/// `ct` keys with a direction (`nft_ct_keys`), and the directions. The kernel dumps
/// `protocol` without its direction (`normal` takes it off what nft sends too).
pub(super) const PROTOCOL: u32 = 10;
const CT_PROTO_SRC: u32 = 11;
const CT_PROTO_DST: u32 = 12;
const CT_ORIGINAL: u8 = 0;
const CT_REPLY: u8 = 1;

/// The kernel dumps `ct protocol` without the direction nft sends (the same either way:
/// `nft_ct_get_dump`): taken off.
pub(super) fn normal(expr: Expr) -> Expr {
    match expr {
        Expr::Ct {
            key: PROTOCOL,
            dreg,
            dir: Some(_),
        } => Expr::Ct {
            key: PROTOCOL,
            dreg,
            dir: None,
        },
        other => other,
    }
}

/// The `ct` keys of the original destination and the reply source address in `family`
/// (`dst_ip`/`src_ip`, `dst_ip6`/`src_ip6`).
fn addresses(family: Family) -> (u32, u32) {
    match family {
        Family::Ipv4 => (20, 19),
        Family::Ipv6 => (22, 21),
    }
}

/// The connections a DNAT made, each `ct` load with its direction and a `cmp` (a port
/// range: `cmp gte`, `cmp lte`).
pub(super) fn dnatted(
    out: &mut Vec<Expr>,
    family: Family,
    ct: &Dnatted,
) -> Result<(), EncodeError> {
    let load = |key, dir| Expr::Ct {
        key,
        dreg: REG_1,
        dir: Some(dir),
    };
    let (orig_dst, repl_src) = addresses(family);
    // `ct status dnat`: this `&` without an op attribute (not written out as `ct status &`).
    ct_bits(out, CT_STATUS, IPS_DST_NAT, None, NEQ);
    out.push(load(PROTOCOL, CT_ORIGINAL));
    out.push(cmp(EQ, vec![ct.protocol.number()]));
    if let Some(host) = ct.orig_dst {
        out.push(load(orig_dst, CT_ORIGINAL));
        out.push(cmp(
            EQ,
            octets(family, "conntrack original destination", host)?,
        ));
    }
    out.push(load(repl_src, CT_REPLY));
    out.push(cmp(
        EQ,
        octets(family, "conntrack reply source", ct.repl_src)?,
    ));
    out.push(load(CT_PROTO_DST, CT_ORIGINAL));
    port_cmp(out, ct.orig_dst_ports);
    out.push(load(CT_PROTO_SRC, CT_REPLY));
    port_cmp(out, ct.repl_src_ports);
    Ok(())
}

/// The parts of a conntrack DNAT match read so far (`decode` checks the whole by encoding
/// it again).
#[derive(Default)]
pub(super) struct Parts {
    /// `ct status dnat` seen.
    pub(super) state: bool,
    protocol: Option<Protocol>,
    orig_dst: Option<IpAddr>,
    repl_src: Option<IpAddr>,
    orig_dst_ports: Option<PortRange>,
    repl_src_ports: Option<PortRange>,
}

impl Parts {
    /// One `ct` load of a tuple's part and the compare(s) after it (the protocol's
    /// direction normalised away); `None` for a key natledger never writes.
    pub(super) fn read(
        &mut self,
        family: Family,
        key: u32,
        dir: Option<u8>,
        it: &mut Peekable<Iter<'_, Expr>>,
    ) -> Option<()> {
        let (orig_dst, repl_src) = addresses(family);
        let Some(dir) = dir else {
            if key != PROTOCOL {
                return None;
            }
            self.protocol = Some(Protocol::from_number(*next_cmp(it)?.first()?)?);
            return Some(());
        };
        match (key, dir) {
            (k, CT_ORIGINAL) if k == orig_dst => self.orig_dst = Some(ip_of(&next_cmp(it)?)?),
            (k, CT_REPLY) if k == repl_src => self.repl_src = Some(ip_of(&next_cmp(it)?)?),
            (CT_PROTO_DST, CT_ORIGINAL) => self.orig_dst_ports = Some(next_ports(it)?),
            (CT_PROTO_SRC, CT_REPLY) => self.repl_src_ports = Some(next_ports(it)?),
            _ => return None,
        }
        Some(())
    }

    /// The match: none without `ct status dnat`; `None` when a part is missing.
    pub(super) fn finish(self) -> Option<Option<Dnatted>> {
        if !self.state {
            return Some(None);
        }
        Some(Some(Dnatted {
            protocol: self.protocol?,
            orig_dst: self.orig_dst,
            repl_src: self.repl_src?,
            orig_dst_ports: self.orig_dst_ports?,
            repl_src_ports: self.repl_src_ports?,
        }))
    }
}
