//! natledger's conntrack match as the legacy table holds it: `struct xt_conntrack_mtinfo3`
//! (revision 3), encoded and decoded.

use std::net::IpAddr;

use crate::model::family::Family;
use crate::model::portspec::{PortRange, Protocol};
use crate::model::rule::Dnatted;

use super::{ip_octets, u16_at};

/// `struct xt_conntrack_mtinfo3`: eight `nf_inet_addr`s (orig src, mask, orig dst, mask,
/// reply src, mask, reply dst, mask), expires min/max, l4proto, four ports, match_flags,
/// invert_flags, state_mask, status_mask, four high ports; 164 bytes. Revision 3 keeps ports
/// in host byte order, and iptables writes a host address's mask as all 16 bytes set, IPv4
/// included.
const CT_INFO_LEN: usize = 164;
const CT_ORIGDST_ADDR: usize = 32;
const CT_L4PROTO: usize = 136;
const CT_REPLSRC_ADDR: usize = 64;
const CT_ORIGDST_PORT: usize = 140;
const CT_REPLSRC_PORT: usize = 142;
const CT_MATCH_FLAGS: usize = 146;
const CT_INVERT_FLAGS: usize = 148;
const CT_STATE_MASK: usize = 150;
const CT_ORIGDST_PORT_HIGH: usize = 156;
const CT_REPLSRC_PORT_HIGH: usize = 158;
/// `XT_CONNTRACK_{STATE,PROTO,ORIGDST,REPLSRC,ORIGDST_PORT,REPLSRC_PORT}`
const CT_STATE: u16 = 1 << 0;
const CT_PROTO: u16 = 1 << 1;
const CT_ORIGDST: u16 = 1 << 3;
const CT_REPLSRC: u16 = 1 << 4;
const CT_ORIGDST_PORT_FLAG: u16 = 1 << 9;
const CT_REPLSRC_PORT_FLAG: u16 = 1 << 10;
/// `XT_CONNTRACK_STATE_DNAT`: `1 << (IP_CT_NUMBER + 2)`
const CT_STATE_DNAT: u16 = 1 << 7;

/// `struct xt_conntrack_mtinfo3` for the guard's `! --ctstate DNAT`
/// (the same in both families: no address).
pub(super) fn not_dnatted_info() -> Vec<u8> {
    let mut d = vec![0u8; CT_INFO_LEN];
    let mut put = |at: usize, v: u16| d[at..at + 2].copy_from_slice(&v.to_ne_bytes());
    put(CT_MATCH_FLAGS, CT_STATE);
    put(CT_INVERT_FLAGS, CT_STATE);
    put(CT_STATE_MASK, CT_STATE_DNAT);
    d
}

/// `struct xt_conntrack_mtinfo3` for natledger's conntrack match.
pub(super) fn conntrack_info(ct: &Dnatted, family: Family) -> Option<Vec<u8>> {
    let mut d = vec![0u8; CT_INFO_LEN];
    let mut flags = CT_STATE | CT_PROTO | CT_REPLSRC | CT_ORIGDST_PORT_FLAG | CT_REPLSRC_PORT_FLAG;
    let mut put_host = |at: usize, addr: IpAddr| -> Option<()> {
        if Family::of(addr) != family {
            return None;
        }
        let octets = ip_octets(addr);
        d[at..at + octets.len()].copy_from_slice(&octets);
        d[at + 16..at + 32].fill(0xff);
        Some(())
    };
    if let Some(host) = ct.orig_dst {
        put_host(CT_ORIGDST_ADDR, host)?;
        flags |= CT_ORIGDST;
    }
    put_host(CT_REPLSRC_ADDR, ct.repl_src)?;
    let mut put = |at: usize, bytes: [u8; 2]| d[at..at + 2].copy_from_slice(&bytes);
    put(CT_L4PROTO, u16::from(ct.protocol.number()).to_ne_bytes());
    put(CT_ORIGDST_PORT, ct.orig_dst_ports.start.to_ne_bytes());
    put(CT_ORIGDST_PORT_HIGH, ct.orig_dst_ports.end.to_ne_bytes());
    put(CT_REPLSRC_PORT, ct.repl_src_ports.start.to_ne_bytes());
    put(CT_REPLSRC_PORT_HIGH, ct.repl_src_ports.end.to_ne_bytes());
    put(CT_MATCH_FLAGS, flags.to_ne_bytes());
    put(CT_STATE_MASK, CT_STATE_DNAT.to_ne_bytes());
    Some(d)
}

/// natledger's conntrack match from `struct xt_conntrack_mtinfo3`, or `None` if it is any
/// other (the encoding of what it decodes must give back the same bytes).
pub(super) fn conntrack_of(data: &[u8], family: Family) -> Option<Dnatted> {
    let d = data.get(..CT_INFO_LEN)?;
    let flags = u16_at(d, CT_MATCH_FLAGS);
    let port = |at: usize| u16_at(d, at);
    // Any other mask gives other bytes when encoded again, and is refused below.
    let host = |at: usize| -> Option<IpAddr> {
        let n = family.host_prefix() as usize / 8;
        Some(match family {
            Family::Ipv4 => <[u8; 4]>::try_from(&d[at..at + n]).ok()?.into(),
            Family::Ipv6 => <[u8; 16]>::try_from(&d[at..at + n]).ok()?.into(),
        })
    };
    let ct = Dnatted {
        protocol: Protocol::from_number(u8::try_from(u16_at(d, CT_L4PROTO)).ok()?)?,
        orig_dst: if flags & CT_ORIGDST != 0 {
            Some(host(CT_ORIGDST_ADDR)?)
        } else {
            None
        },
        repl_src: host(CT_REPLSRC_ADDR)?,
        orig_dst_ports: PortRange {
            start: port(CT_ORIGDST_PORT),
            end: port(CT_ORIGDST_PORT_HIGH),
        },
        repl_src_ports: PortRange {
            start: port(CT_REPLSRC_PORT),
            end: port(CT_REPLSRC_PORT_HIGH),
        },
    };
    (conntrack_info(&ct, family)?.as_slice() == d).then_some(ct)
}
