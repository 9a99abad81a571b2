//! ctnetlink messages: the dump request, the deletion, and the entries a dump answers (see
//! "Messages" in the module comment).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::Entry;
use super::filter::{Dump, FILTER_F_UNDEFINED};
use crate::kernel::netlink::{self, NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST};
use crate::model::family::Family;

pub(super) const NFNL_SUBSYS_CTNETLINK: u16 = 1;
pub(super) const IPCTNL_MSG_CT_NEW: u16 = 0;
pub(super) const IPCTNL_MSG_CT_GET: u16 = 1;
pub(super) const IPCTNL_MSG_CT_DELETE: u16 = 2;
pub(super) const CTA_TUPLE_ORIG: u16 = 1;
pub(super) const CTA_TUPLE_REPLY: u16 = 2;
pub(super) const CTA_ID: u16 = 12;
pub(super) const CTA_ZONE: u16 = 18;
pub(super) const CTA_FILTER: u16 = 25;
pub(super) const CTA_TUPLE_IP: u16 = 1;
pub(super) const CTA_TUPLE_PROTO: u16 = 2;
pub(super) const CTA_TUPLE_ZONE: u16 = 3;
pub(super) const CTA_IP_V4_SRC: u16 = 1;
pub(super) const CTA_IP_V4_DST: u16 = 2;
pub(super) const CTA_IP_V6_SRC: u16 = 3;
pub(super) const CTA_IP_V6_DST: u16 = 4;
pub(super) const CTA_PROTO_NUM: u16 = 1;
pub(super) const CTA_PROTO_SRC_PORT: u16 = 2;
pub(super) const CTA_PROTO_DST_PORT: u16 = 3;
pub(super) const CTA_FILTER_ORIG_FLAGS: u16 = 1;

pub(super) fn subsys(message: u16) -> u16 {
    (NFNL_SUBSYS_CTNETLINK << 8) | message
}

/// `struct nfgenmsg`: family, version 0 (`NFNETLINK_V0`), resource id 0.
pub(super) fn genmsg(buf: &mut Vec<u8>, family: u8) {
    buf.extend([family, 0, 0, 0]);
}

/// GET dump: of every entry of both families, or of one family as `filter` narrows it
/// (a `CTA_FILTER` nest naming the fields of a `CTA_TUPLE_ORIG` that entries must have;
/// none when only the family is). `refusable` adds a flag the kernel refuses.
pub(super) fn dump_request(seq: u32, dump: Dump, refusable: bool) -> Vec<u8> {
    let mut m = Vec::with_capacity(netlink::HEADER + 64);
    let start = netlink::begin(
        &mut m,
        subsys(IPCTNL_MSG_CT_GET),
        NLM_F_REQUEST | NLM_F_DUMP,
        seq,
    );
    let Dump::Only(filter) = dump else {
        genmsg(&mut m, libc::AF_UNSPEC as u8);
        netlink::finish(&mut m, start);
        return m;
    };
    genmsg(&mut m, filter.family.af());
    let flags = filter.flags() | if refusable { FILTER_F_UNDEFINED } else { 0 };
    if flags != 0 {
        let tuple = netlink::begin_nest(&mut m, CTA_TUPLE_ORIG);
        if let Some(dst) = filter.dst {
            let ip = netlink::begin_nest(&mut m, CTA_TUPLE_IP);
            put_ip(&mut m, End::Dst, dst);
            netlink::end_nest(&mut m, ip);
        }
        if let Some(protocol) = filter.protocol {
            let proto = netlink::begin_nest(&mut m, CTA_TUPLE_PROTO);
            netlink::put_attr(&mut m, CTA_PROTO_NUM, &[protocol]);
            if let Some(port) = filter.dst_port {
                netlink::put_attr(&mut m, CTA_PROTO_DST_PORT, &port.to_be_bytes());
            }
            netlink::end_nest(&mut m, proto);
        }
        netlink::end_nest(&mut m, tuple);
        let nest = netlink::begin_nest(&mut m, CTA_FILTER);
        netlink::put_attr(&mut m, CTA_FILTER_ORIG_FLAGS, &flags.to_ne_bytes());
        netlink::end_nest(&mut m, nest);
    }
    netlink::finish(&mut m, start);
    m
}

/// Which address of a tuple.
#[derive(Clone, Copy)]
pub(super) enum End {
    Src,
    Dst,
}

/// Append `ip` as the `CTA_IP_*` attribute of its family for `end`.
pub(super) fn put_ip(m: &mut Vec<u8>, end: End, ip: IpAddr) {
    let (v4, v6) = match end {
        End::Src => (CTA_IP_V4_SRC, CTA_IP_V6_SRC),
        End::Dst => (CTA_IP_V4_DST, CTA_IP_V6_DST),
    };
    match ip {
        IpAddr::V4(a) => netlink::put_attr(m, v4, &a.octets()),
        IpAddr::V6(a) => netlink::put_attr(m, v6, &a.octets()),
    }
}

/// Append a DELETE of exactly `entry`: its original tuple (never absent: a delete without a
/// tuple flushes the table), zone and id as dumped, acknowledged.
pub(super) fn delete_message(m: &mut Vec<u8>, seq: u32, entry: &Entry) {
    let start = netlink::begin(
        m,
        subsys(IPCTNL_MSG_CT_DELETE),
        NLM_F_REQUEST | NLM_F_ACK,
        seq,
    );
    genmsg(m, Family::of(entry.dst).af());
    let tuple = netlink::begin_nest(m, CTA_TUPLE_ORIG);
    let ip = netlink::begin_nest(m, CTA_TUPLE_IP);
    // Both of one family: a parsed entry's are.
    put_ip(m, End::Src, entry.src);
    put_ip(m, End::Dst, entry.dst);
    netlink::end_nest(m, ip);
    let proto = netlink::begin_nest(m, CTA_TUPLE_PROTO);
    netlink::put_attr(m, CTA_PROTO_NUM, &[entry.protocol]);
    netlink::put_attr(m, CTA_PROTO_SRC_PORT, &entry.src_port.to_be_bytes());
    netlink::put_attr(m, CTA_PROTO_DST_PORT, &entry.dst_port.to_be_bytes());
    netlink::end_nest(m, proto);
    if let Some(zone) = entry.tuple_zone {
        netlink::put_attr(m, CTA_TUPLE_ZONE, &zone.to_be_bytes());
    }
    netlink::end_nest(m, tuple);
    if let Some(zone) = entry.zone {
        netlink::put_attr(m, CTA_ZONE, &zone.to_be_bytes());
    }
    if let Some(id) = entry.id {
        netlink::put_attr(m, CTA_ID, &id.to_be_bytes());
    }
    netlink::finish(m, start);
}

/// A dumped entry (the payload after `nlmsghdr`): `None` unless it is IPv4 or IPv6 with
/// both addresses and both ports in its original tuple (ICMP, GRE and the like have none,
/// and natledger never forgets them).
pub fn parse_entry(payload: &[u8]) -> Option<Entry> {
    let family = *payload.first()?;
    let body = payload.get(4..)?;
    let tuple = netlink::attr(body, CTA_TUPLE_ORIG)?;
    let ip = netlink::attr(tuple, CTA_TUPLE_IP)?;
    let reply_ip =
        netlink::attr(body, CTA_TUPLE_REPLY).and_then(|t| netlink::attr(t, CTA_TUPLE_IP));
    let (src, dst, reply_src) = if family == libc::AF_INET as u8 {
        let addr = |ip, kind| -> Option<IpAddr> {
            let octets: [u8; 4] = netlink::attr(ip, kind)?.try_into().ok()?;
            Some(Ipv4Addr::from(octets).into())
        };
        let reply_src = reply_ip.and_then(|r| addr(r, CTA_IP_V4_SRC));
        (
            addr(ip, CTA_IP_V4_SRC)?,
            addr(ip, CTA_IP_V4_DST)?,
            reply_src,
        )
    } else if family == libc::AF_INET6 as u8 {
        let addr = |ip, kind| -> Option<IpAddr> {
            let octets: [u8; 16] = netlink::attr(ip, kind)?.try_into().ok()?;
            Some(Ipv6Addr::from(octets).into())
        };
        let reply_src = reply_ip.and_then(|r| addr(r, CTA_IP_V6_SRC));
        (
            addr(ip, CTA_IP_V6_SRC)?,
            addr(ip, CTA_IP_V6_DST)?,
            reply_src,
        )
    } else {
        return None;
    };
    let proto = netlink::attr(tuple, CTA_TUPLE_PROTO)?;
    let be16 = |data: &[u8]| Some(u16::from_be_bytes(data.try_into().ok()?));
    let protocol = *netlink::attr(proto, CTA_PROTO_NUM)?.first()?;
    let src_port = netlink::attr(proto, CTA_PROTO_SRC_PORT).and_then(be16)?;
    let dst_port = netlink::attr(proto, CTA_PROTO_DST_PORT).and_then(be16)?;
    Some(Entry {
        protocol,
        src,
        dst,
        src_port,
        dst_port,
        reply_src,
        zone: netlink::attr(body, CTA_ZONE).and_then(be16),
        tuple_zone: netlink::attr(tuple, CTA_TUPLE_ZONE).and_then(be16),
        id: netlink::attr(body, CTA_ID).and_then(|d| Some(u32::from_be_bytes(d.try_into().ok()?))),
    })
}
