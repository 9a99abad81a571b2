//! Forgetting the conntrack entries that keep a UDP or SCTP flow on an old NAT path, over
//! ctnetlink, in-process.
//!
//! # Why
//! NAT is decided once per conntrack entry, on the flow's first packet; every later packet
//! of the flow follows the entry, not the rules. UDP has no end, so an entry lives as long as
//! the client keeps sending (30 s after its last packet, 120 s once replied to): a client
//! sending every 100 ms stays pinned to a dead container's address forever after natledger
//! moved the host port to a new container. So after natledger's rules are in place (or after
//! it removed them), it deletes exactly the entries whose ORIGINAL tuple (the addresses as
//! the client sent them, before DNAT) has the mapping's protocol, a destination port in its
//! host-port range, and as destination the mapping's host address, or, without one, an
//! address local to the network namespace: the DNAT rules match `--dst-type LOCAL` only, so
//! a flow forwarded through the node (to 8.8.8.8:53, say) was never natledger's and is never
//! touched. Nothing else is deleted: no other port, host address, protocol (TCP only when a
//! [`Flows`] asks for TCP), and no other network namespace (the netlink socket sees only
//! its own).
//!
//! # Messages
//! ctnetlink is nfnetlink subsystem 1 (`NFNL_SUBSYS_CTNETLINK`); message type
//! `(1 << 8) | cmd`, after the `nlmsghdr` a 4-byte `nfgenmsg` (family, version 0, resource
//! id 0), then attributes (`include/uapi/linux/netfilter/nfnetlink_conntrack.h`):
//!
//! ```text
//! IPCTNL_MSG_CT_GET, NLM_F_DUMP, family AF_UNSPEC        one dump: every entry of both families
//!   answers: IPCTNL_MSG_CT_NEW, family of the entry
//!     CTA_TUPLE_ORIG (nested)
//!       CTA_TUPLE_IP (nested)    CTA_IP_V4_SRC/DST (4 bytes) or CTA_IP_V6_SRC/DST (16)
//!       CTA_TUPLE_PROTO (nested) CTA_PROTO_NUM (u8), CTA_PROTO_SRC_PORT/DST_PORT (be16)
//!       CTA_TUPLE_ZONE (be16)    only for a zone of the original direction alone
//!     CTA_TUPLE_REPLY, CTA_STATUS, CTA_TIMEOUT, ...      (not read)
//!     CTA_ZONE (be16)            only for a non-default zone of both directions
//!     CTA_ID (be32)              the entry's id
//! IPCTNL_MSG_CT_DELETE, NLM_F_ACK, family of the entry    one per entry to forget
//!     CTA_TUPLE_ORIG as dumped (IP, proto, tuple zone), CTA_ZONE as dumped, CTA_ID
//! ```
//!
//! Numbers are network byte order inside attributes; nested attributes carry
//! `NLA_F_NESTED`. The kernel finds the entry to delete by the tuple in the zone, then
//! refuses it with `ENOENT` unless its id is the dumped one: a new flow that reused the
//! tuple after the dumped entry expired is not the entry that was judged, and is left alone.
//! A delete request WITHOUT a tuple flushes the whole table of the namespace, so
//! `delete_message` always writes one, and a unit test pins that.
//!
//! # Cost
//! One dump per [`forget`], whatever the number of flows and families, and one
//! `getifaddrs` only when some flow has no host address. The dump walks every bucket of the
//! kernel's conntrack hash table, which is one table for all network namespaces (262,144
//! buckets here, sized by memory): measured in a test namespace (2 cores, kernel 6.18,
//! release build, `cost_of_forget` in `tests/conntrack.rs`), 13.5 ms with no entry at all,
//! 17 ms with 1,000 entries, 33 ms with 10,000. The kernel's own filter (`CTA_FILTER`)
//! would not shorten it: it needs a family, so two walks. [`table_is_empty`] (the
//! namespace's `nf_conntrack_count`, 40 us) lets a caller skip everything, the socket
//! included, when nothing can need forgetting. Deleting costs 3-6 us per entry: many
//! deletions per datagram, [`DELETE_CHUNK`] at a time, each chunk's acknowledgements read
//! before the next is sent so that they never overflow the socket's receive buffer.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::family::Family;
use crate::netlink::{self, NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, Socket};
use crate::portspec::{PortRange, Protocol};

const NFNL_SUBSYS_CTNETLINK: u16 = 1;
const IPCTNL_MSG_CT_NEW: u16 = 0;
const IPCTNL_MSG_CT_GET: u16 = 1;
const IPCTNL_MSG_CT_DELETE: u16 = 2;
const CTA_TUPLE_ORIG: u16 = 1;
const CTA_ID: u16 = 12;
const CTA_ZONE: u16 = 18;
const CTA_TUPLE_IP: u16 = 1;
const CTA_TUPLE_PROTO: u16 = 2;
const CTA_TUPLE_ZONE: u16 = 3;
const CTA_IP_V4_SRC: u16 = 1;
const CTA_IP_V4_DST: u16 = 2;
const CTA_IP_V6_SRC: u16 = 3;
const CTA_IP_V6_DST: u16 = 4;
const CTA_PROTO_NUM: u16 = 1;
const CTA_PROTO_SRC_PORT: u16 = 2;
const CTA_PROTO_DST_PORT: u16 = 3;
const IPPROTO_TCP: u8 = 6;
const IPPROTO_UDP: u8 = 17;
const IPPROTO_SCTP: u8 = 132;

/// Deletions sent per datagram. The kernel handles every message of a datagram and queues
/// an acknowledgement for each before `send` returns, dropping them (the socket then reads
/// `ENOBUFS`) once they overflow the receive buffer, 212,992 bytes by default. Measured on
/// 6.18: an `ENOENT` answer to an IPv6 delete (it echoes the request) takes 832 bytes of
/// that buffer, so 256 fill it exactly and 260 overflow; 128 use half.
pub const DELETE_CHUNK: usize = 128;

/// The calling thread's network namespace's number of conntrack entries.
const COUNT_FILE: &str = "/proc/sys/net/netfilter/nf_conntrack_count";

/// The flows of one mapping and family: conntrack entries whose original tuple has this
/// protocol and family, a destination port in `ports`, and as destination `host`, or, when
/// `host` is `None` (or an unspecified address), any address local to the network namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Flows {
    pub family: Family,
    pub protocol: Protocol,
    pub ports: PortRange,
    pub host: Option<IpAddr>,
}

impl Flows {
    /// The host address the flows must be sent to, if it is one address.
    fn exact_host(&self) -> Option<IpAddr> {
        self.host.filter(|h| !h.is_unspecified())
    }

    /// Whether `entry`'s original tuple is one of these flows.
    fn covers(&self, entry: &Entry, locals: &LocalAddrs) -> bool {
        entry.protocol == protocol_number(self.protocol)
            && Family::of(entry.dst) == self.family
            && (self.ports.start..=self.ports.end).contains(&entry.dst_port)
            && match self.exact_host() {
                Some(host) => entry.dst == host,
                None => locals.contains(entry.dst),
            }
    }
}

fn protocol_number(protocol: Protocol) -> u8 {
    match protocol {
        Protocol::Tcp => IPPROTO_TCP,
        Protocol::Udp => IPPROTO_UDP,
        Protocol::Sctp => IPPROTO_SCTP,
    }
}

/// One conntrack entry as a dump shows it: its original tuple, and what deleting exactly
/// this entry needs (zone, id). Only entries of protocols with ports are read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    /// IP protocol number (`CTA_PROTO_NUM`).
    pub protocol: u8,
    pub src: IpAddr,
    pub dst: IpAddr,
    pub src_port: u16,
    pub dst_port: u16,
    /// `CTA_ZONE`: a non-default zone of both directions.
    pub zone: Option<u16>,
    /// `CTA_TUPLE_ZONE` of the original tuple: a zone of the original direction alone.
    pub tuple_zone: Option<u16>,
    /// `CTA_ID`: the kernel refuses a delete naming another id.
    pub id: Option<u32>,
}

/// The addresses `--dst-type LOCAL` matches in a network namespace, as far as natledger
/// needs them: the interface addresses, and the whole loopback nets 127.0.0.0/8 and ::1.
/// (A `local` route of a whole prefix, "AnyIP", is not an interface address: flows to such
/// a prefix are forgotten only through a [`Flows`] naming the host address.)
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LocalAddrs {
    addrs: Vec<IpAddr>,
}

impl LocalAddrs {
    pub fn new(addrs: Vec<IpAddr>) -> Self {
        LocalAddrs { addrs }
    }

    /// The addresses of the calling thread's network namespace (`getifaddrs` asks over a
    /// route netlink socket, which is in the thread's namespace).
    pub fn of_this_netns() -> io::Result<Self> {
        let all = nix::ifaddrs::getifaddrs().map_err(io::Error::from)?;
        let mut addrs = Vec::new();
        for ifa in all {
            let ip = ifa.address.as_ref().and_then(|a| {
                a.as_sockaddr_in()
                    .map(|s| IpAddr::V4(s.ip()))
                    .or_else(|| a.as_sockaddr_in6().map(|s| IpAddr::V6(s.ip())))
            });
            if let Some(ip) = ip.filter(|ip| !addrs.contains(ip)) {
                addrs.push(ip);
            }
        }
        Ok(LocalAddrs { addrs })
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        ip.is_loopback() || self.addrs.contains(&ip)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConntrackError {
    #[error("reading the network namespace's local addresses: {0}")]
    LocalAddrs(#[source] io::Error),
    #[error("listing the conntrack table over netlink: {0}")]
    Dump(#[source] io::Error),
    #[error(
        "deleting {count} conntrack entries over netlink ({deleted} deleted, {refused} refused): {source}"
    )]
    Delete {
        count: usize,
        deleted: usize,
        refused: usize,
        source: io::Error,
    },
}

/// Whether the calling thread's network namespace has no conntrack entry at all (its
/// `nf_conntrack_count` is 0, or conntrack is not there): then nothing can need forgetting
/// and a caller skips [`forget`] and the socket. `/proc/sys/net` is that of the network
/// namespace of the thread that opens the file. A count that cannot be read otherwise counts
/// as entries.
pub fn table_is_empty() -> bool {
    match std::fs::read_to_string(COUNT_FILE) {
        Ok(count) => count.trim() == "0",
        Err(e) => e.kind() == io::ErrorKind::NotFound,
    }
}

/// Delete the conntrack entries of `flows` in the network namespace of `sock`, a
/// [`Socket::netfilter`] that the caller may share with nf_tables requests and releases
/// itself (nothing here opens or closes one). The calling thread must be in that same
/// namespace: local addresses are read there. One dump, then the deletions; returns how
/// many entries were deleted. An entry that expired in between, or whose tuple a new flow
/// took meanwhile (another id), is neither counted nor an error. A refused deletion does
/// not stop the others: the error names how many went.
pub fn forget(sock: &mut Socket, flows: &[Flows]) -> Result<usize, ConntrackError> {
    if flows.is_empty() {
        return Ok(0);
    }
    let locals = if flows.iter().any(|f| f.exact_host().is_none()) {
        LocalAddrs::of_this_netns().map_err(ConntrackError::LocalAddrs)?
    } else {
        LocalAddrs::default()
    };
    let victims = matching(sock, flows, &locals).map_err(ConntrackError::Dump)?;
    delete(sock, &victims)
}

/// The entries of one dump that [`matches`] keeps.
fn matching(sock: &mut Socket, flows: &[Flows], locals: &LocalAddrs) -> io::Result<Vec<Entry>> {
    let seq = sock.next_seq();
    let mut found = Vec::new();
    sock.dump(seq, &dump_request(seq), |message| {
        if message.kind == subsys(IPCTNL_MSG_CT_NEW)
            && let Some(entry) = parse_entry(message.payload)
            && matches(&entry, flows, locals)
        {
            found.push(entry);
        }
        Ok(())
    })?;
    Ok(found)
}

/// Whether `entry`'s original tuple belongs to any of `flows`.
pub fn matches(entry: &Entry, flows: &[Flows], locals: &LocalAddrs) -> bool {
    flows.iter().any(|f| f.covers(entry, locals))
}

/// Delete `victims`, [`DELETE_CHUNK`] per datagram.
fn delete(sock: &mut Socket, victims: &[Entry]) -> Result<usize, ConntrackError> {
    let (mut deleted, mut refused) = (0, 0);
    let mut first_refusal = None;
    for chunk in victims.chunks(DELETE_CHUNK) {
        let first = sock.reserve(chunk.len() as u32);
        let mut m = Vec::with_capacity(112 * chunk.len());
        for (seq, entry) in (first..).zip(chunk) {
            delete_message(&mut m, seq, entry);
        }
        let answers = sock.send(&m).and_then(|()| {
            let ours = first..=first + chunk.len() as u32 - 1;
            sock.acks(ours, chunk.len(), |_, code| {
                match code {
                    0 => deleted += 1,
                    libc::ENOENT => {}
                    errno => {
                        refused += 1;
                        first_refusal.get_or_insert(errno);
                    }
                }
                Ok(())
            })
        });
        if let Err(source) = answers {
            return Err(ConntrackError::Delete {
                count: victims.len(),
                deleted,
                refused,
                source,
            });
        }
    }
    match first_refusal {
        None => Ok(deleted),
        Some(errno) => Err(ConntrackError::Delete {
            count: victims.len(),
            deleted,
            refused,
            source: io::Error::from_raw_os_error(errno),
        }),
    }
}

fn subsys(message: u16) -> u16 {
    (NFNL_SUBSYS_CTNETLINK << 8) | message
}

/// `struct nfgenmsg`: family, version 0 (`NFNETLINK_V0`), resource id 0.
fn genmsg(buf: &mut Vec<u8>, family: u8) {
    buf.extend([family, 0, 0, 0]);
}

fn af(ip: IpAddr) -> u8 {
    match ip {
        IpAddr::V4(_) => libc::AF_INET as u8,
        IpAddr::V6(_) => libc::AF_INET6 as u8,
    }
}

/// GET dump of every entry of both families.
fn dump_request(seq: u32) -> Vec<u8> {
    let mut m = Vec::with_capacity(netlink::HEADER + 4);
    let start = netlink::begin(
        &mut m,
        subsys(IPCTNL_MSG_CT_GET),
        NLM_F_REQUEST | NLM_F_DUMP,
        seq,
    );
    genmsg(&mut m, libc::AF_UNSPEC as u8);
    netlink::finish(&mut m, start);
    m
}

/// Append a DELETE of exactly `entry`: its original tuple (never absent: a delete without a
/// tuple flushes the table), zone and id as dumped, acknowledged.
fn delete_message(m: &mut Vec<u8>, seq: u32, entry: &Entry) {
    let start = netlink::begin(
        m,
        subsys(IPCTNL_MSG_CT_DELETE),
        NLM_F_REQUEST | NLM_F_ACK,
        seq,
    );
    genmsg(m, af(entry.dst));
    let tuple = netlink::begin_nest(m, CTA_TUPLE_ORIG);
    let ip = netlink::begin_nest(m, CTA_TUPLE_IP);
    match (entry.src, entry.dst) {
        (IpAddr::V4(src), IpAddr::V4(dst)) => {
            netlink::put_attr(m, CTA_IP_V4_SRC, &src.octets());
            netlink::put_attr(m, CTA_IP_V4_DST, &dst.octets());
        }
        (src, dst) => {
            netlink::put_attr(m, CTA_IP_V6_SRC, &v6(src).octets());
            netlink::put_attr(m, CTA_IP_V6_DST, &v6(dst).octets());
        }
    }
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

/// Both addresses of a parsed entry are of one family; this is only ever given IPv6 ones.
fn v6(ip: IpAddr) -> Ipv6Addr {
    match ip {
        IpAddr::V6(a) => a,
        IpAddr::V4(a) => a.to_ipv6_mapped(),
    }
}

/// A dumped entry (the payload after `nlmsghdr`): `None` unless it is IPv4 or IPv6 with
/// both addresses and both ports in its original tuple (ICMP, GRE and the like have none,
/// and natledger never forgets them).
pub fn parse_entry(payload: &[u8]) -> Option<Entry> {
    let family = *payload.first()?;
    let body = payload.get(4..)?;
    let tuple = netlink::attr(body, CTA_TUPLE_ORIG)?;
    let ip = netlink::attr(tuple, CTA_TUPLE_IP)?;
    let (src, dst) = if family == libc::AF_INET as u8 {
        let addr = |kind| -> Option<IpAddr> {
            let octets: [u8; 4] = netlink::attr(ip, kind)?.try_into().ok()?;
            Some(Ipv4Addr::from(octets).into())
        };
        (addr(CTA_IP_V4_SRC)?, addr(CTA_IP_V4_DST)?)
    } else if family == libc::AF_INET6 as u8 {
        let addr = |kind| -> Option<IpAddr> {
            let octets: [u8; 16] = netlink::attr(ip, kind)?.try_into().ok()?;
            Some(Ipv6Addr::from(octets).into())
        };
        (addr(CTA_IP_V6_SRC)?, addr(CTA_IP_V6_DST)?)
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
        zone: netlink::attr(body, CTA_ZONE).and_then(be16),
        tuple_zone: netlink::attr(tuple, CTA_TUPLE_ZONE).and_then(be16),
        id: netlink::attr(body, CTA_ID).and_then(|d| Some(u32::from_be_bytes(d.try_into().ok()?))),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn entry(protocol: u8, src: &str, dst: &str, dst_port: u16) -> Entry {
        Entry {
            protocol,
            src: ip(src),
            dst: ip(dst),
            src_port: 40000,
            dst_port,
            zone: None,
            tuple_zone: None,
            id: Some(7),
        }
    }

    fn flows(family: Family, protocol: Protocol, ports: (u16, u16), host: Option<&str>) -> Flows {
        Flows {
            family,
            protocol,
            ports: PortRange {
                start: ports.0,
                end: ports.1,
            },
            host: host.map(ip),
        }
    }

    /// A dump answer as the kernel writes it: nested flags set, the reply tuple and other
    /// attributes around the ones read, counters and status in network byte order.
    fn kernel_entry(e: &Entry, icmp: bool) -> Vec<u8> {
        let mut p = Vec::new();
        genmsg(&mut p, af(e.dst));
        for (kind, (src, dst, sport, dport)) in [
            (CTA_TUPLE_ORIG, (e.src, e.dst, e.src_port, e.dst_port)),
            (2, (e.dst, e.src, e.dst_port, e.src_port)), // CTA_TUPLE_REPLY
        ] {
            let tuple = netlink::begin_nest(&mut p, kind);
            let nest = netlink::begin_nest(&mut p, CTA_TUPLE_IP);
            match (src, dst) {
                (IpAddr::V4(s), IpAddr::V4(d)) => {
                    netlink::put_attr(&mut p, CTA_IP_V4_SRC, &s.octets());
                    netlink::put_attr(&mut p, CTA_IP_V4_DST, &d.octets());
                }
                (s, d) => {
                    netlink::put_attr(&mut p, CTA_IP_V6_SRC, &v6(s).octets());
                    netlink::put_attr(&mut p, CTA_IP_V6_DST, &v6(d).octets());
                }
            }
            netlink::end_nest(&mut p, nest);
            let nest = netlink::begin_nest(&mut p, CTA_TUPLE_PROTO);
            netlink::put_attr(&mut p, CTA_PROTO_NUM, &[e.protocol]);
            if icmp {
                netlink::put_attr(&mut p, 4, &1u16.to_be_bytes()); // CTA_PROTO_ICMP_ID
                netlink::put_attr(&mut p, 5, &[8]); // CTA_PROTO_ICMP_TYPE
            } else {
                netlink::put_attr(&mut p, CTA_PROTO_SRC_PORT, &sport.to_be_bytes());
                netlink::put_attr(&mut p, CTA_PROTO_DST_PORT, &dport.to_be_bytes());
            }
            netlink::end_nest(&mut p, nest);
            if kind == CTA_TUPLE_ORIG
                && let Some(zone) = e.tuple_zone
            {
                netlink::put_attr(&mut p, CTA_TUPLE_ZONE, &zone.to_be_bytes());
            }
            netlink::end_nest(&mut p, tuple);
        }
        if let Some(zone) = e.zone {
            netlink::put_attr(&mut p, CTA_ZONE, &zone.to_be_bytes());
        }
        netlink::put_attr(&mut p, 3, &0x18eu32.to_be_bytes()); // CTA_STATUS
        netlink::put_attr(&mut p, 7, &117u32.to_be_bytes()); // CTA_TIMEOUT
        if let Some(id) = e.id {
            netlink::put_attr(&mut p, CTA_ID, &id.to_be_bytes());
        }
        netlink::put_attr(&mut p, 11, &1u32.to_be_bytes()); // CTA_USE
        p
    }

    #[test]
    fn parses_the_original_tuple_zone_and_id_of_either_family() {
        let mut v4 = entry(IPPROTO_UDP, "10.78.0.2", "10.78.0.1", 5353);
        v4.src_port = 0xa1b2;
        v4.id = Some(0xdead_beef);
        assert_eq!(parse_entry(&kernel_entry(&v4, false)), Some(v4));

        let mut v6 = entry(IPPROTO_SCTP, "fd78::2", "fd78::1", 0x1234);
        v6.zone = Some(0x0102);
        assert_eq!(parse_entry(&kernel_entry(&v6, false)), Some(v6));

        let mut directional = entry(IPPROTO_TCP, "10.0.0.1", "10.0.0.2", 80);
        directional.tuple_zone = Some(9);
        directional.id = None;
        assert_eq!(
            parse_entry(&kernel_entry(&directional, false)),
            Some(directional)
        );
    }

    #[test]
    fn entries_without_ports_or_of_other_families_are_not_read() {
        let icmp = entry(1, "10.0.0.1", "10.0.0.2", 0);
        assert_eq!(parse_entry(&kernel_entry(&icmp, true)), None);
        let mut other = kernel_entry(&entry(IPPROTO_UDP, "10.0.0.1", "10.0.0.2", 53), false);
        other[0] = libc::AF_BRIDGE as u8;
        assert_eq!(parse_entry(&other), None);
        // IPv4 addresses in a message that claims IPv6.
        let mut mixed = kernel_entry(&entry(IPPROTO_UDP, "10.0.0.1", "10.0.0.2", 53), false);
        mixed[0] = libc::AF_INET6 as u8;
        assert_eq!(parse_entry(&mixed), None);
        assert_eq!(parse_entry(&[]), None);
        assert_eq!(parse_entry(&[2, 0, 0, 0]), None);
    }

    #[test]
    fn a_dump_asks_for_every_entry_of_both_families() {
        let m = dump_request(5);
        let message = netlink::messages(&m).next().unwrap().unwrap();
        assert_eq!(message.kind, 0x0101);
        assert_eq!(message.seq, 5);
        assert_eq!(message.payload, [libc::AF_UNSPEC as u8, 0, 0, 0]);
        assert_eq!(u16::from_ne_bytes([m[6], m[7]]), NLM_F_REQUEST | NLM_F_DUMP);
    }

    /// A delete names exactly the dumped entry: what the kernel would parse back out of it
    /// is the entry itself. And it always carries a tuple (without one it is a flush).
    #[test]
    fn a_delete_names_the_dumped_tuple_zone_and_id() {
        let mut zoned = entry(IPPROTO_UDP, "fd78::2", "fd78::1", 5353);
        zoned.zone = Some(3);
        let mut directional = entry(IPPROTO_UDP, "10.78.0.2", "10.78.0.1", 5353);
        directional.tuple_zone = Some(4);
        directional.id = None;
        let plain = entry(IPPROTO_SCTP, "10.78.0.2", "127.0.0.1", 7000);
        let mut m = Vec::new();
        for (seq, e) in (20..).zip([&zoned, &directional, &plain]) {
            delete_message(&mut m, seq, e);
        }
        let messages: Vec<_> = netlink::messages(&m).map(Result::unwrap).collect();
        assert_eq!(messages.len(), 3);
        for (message, (seq, e)) in messages.iter().zip((20..).zip([zoned, directional, plain])) {
            assert_eq!(message.kind, 0x0102);
            assert_eq!(message.seq, seq);
            assert!(netlink::attr(&message.payload[4..], CTA_TUPLE_ORIG).is_some());
            assert_eq!(parse_entry(message.payload), Some(e), "{e:?}");
        }
        let flags = u16::from_ne_bytes([m[6], m[7]]);
        assert_eq!(flags, NLM_F_REQUEST | NLM_F_ACK);
        assert_eq!(messages[0].payload[0], libc::AF_INET6 as u8);
        assert_eq!(messages[1].payload[0], libc::AF_INET as u8);
        // Nested attributes are marked so (the tuple's type field on the wire).
        let tuple_type = u16::from_ne_bytes([messages[2].payload[6], messages[2].payload[7]]);
        assert_eq!(tuple_type, CTA_TUPLE_ORIG | netlink::NLA_F_NESTED);
        // The zone goes beside the tuple only when it was dumped there.
        assert!(netlink::attr(&messages[0].payload[4..], CTA_ZONE).is_some());
        assert!(netlink::attr(&messages[1].payload[4..], CTA_ZONE).is_none());
    }

    #[test]
    fn a_flow_matches_its_protocol_family_ports_and_address() {
        let locals = LocalAddrs::new(vec![ip("10.78.0.1"), ip("10.77.0.1"), ip("fd78::1")]);
        let udp53 = [flows(Family::Ipv4, Protocol::Udp, (5353, 5353), None)];
        let m = |e: Entry, f: &[Flows]| matches(&e, f, &locals);
        // Any local destination, loopback net included.
        for dst in ["10.78.0.1", "10.77.0.1", "127.0.0.1", "127.3.2.1"] {
            assert!(
                m(entry(IPPROTO_UDP, "10.78.0.2", dst, 5353), &udp53),
                "{dst}"
            );
        }
        // Forwarded through the node: not local, never natledger's.
        assert!(!m(entry(IPPROTO_UDP, "10.78.0.2", "8.8.8.8", 5353), &udp53));
        assert!(!m(
            entry(IPPROTO_UDP, "10.78.0.2", "10.77.0.2", 5353),
            &udp53
        ));
        // Other port, protocol, family.
        assert!(!m(
            entry(IPPROTO_UDP, "10.78.0.2", "10.78.0.1", 5354),
            &udp53
        ));
        assert!(!m(
            entry(IPPROTO_TCP, "10.78.0.2", "10.78.0.1", 5353),
            &udp53
        ));
        assert!(!m(
            entry(IPPROTO_SCTP, "10.78.0.2", "10.78.0.1", 5353),
            &udp53
        ));
        assert!(!m(entry(IPPROTO_UDP, "fd78::2", "fd78::1", 5353), &udp53));
        assert!(!m(entry(IPPROTO_UDP, "fd78::2", "::1", 5353), &udp53));

        // A range, bounds included, IPv6.
        let range = [flows(Family::Ipv6, Protocol::Sctp, (7000, 7002), None)];
        for (port, hit) in [(6999, false), (7000, true), (7002, true), (7003, false)] {
            let e = entry(IPPROTO_SCTP, "fd78::2", "fd78::1", port);
            assert_eq!(m(e, &range), hit, "{port}");
        }
        assert!(m(entry(IPPROTO_SCTP, "fd78::2", "::1", 7001), &range));
        assert!(!m(entry(IPPROTO_SCTP, "fd78::2", "fd78::9", 7001), &range));

        // An explicit host address: only it, local or not.
        let bound = [flows(
            Family::Ipv4,
            Protocol::Udp,
            (53, 53),
            Some("10.77.0.1"),
        )];
        assert!(m(entry(IPPROTO_UDP, "10.78.0.2", "10.77.0.1", 53), &bound));
        assert!(!m(entry(IPPROTO_UDP, "10.78.0.2", "10.78.0.1", 53), &bound));
        assert!(!m(entry(IPPROTO_UDP, "10.78.0.2", "127.0.0.1", 53), &bound));
        // An unspecified host address means every local address of its family.
        let any = [flows(
            Family::Ipv4,
            Protocol::Udp,
            (53, 53),
            Some("0.0.0.0"),
        )];
        assert!(m(entry(IPPROTO_UDP, "10.78.0.2", "10.78.0.1", 53), &any));
        assert!(!m(entry(IPPROTO_UDP, "10.78.0.2", "0.0.0.0", 53), &any));
        assert!(!m(entry(IPPROTO_UDP, "10.78.0.2", "8.8.8.8", 53), &any));

        // TCP only when a flow asks for TCP; several flows: any one.
        let both = [udp53[0], flows(Family::Ipv4, Protocol::Tcp, (80, 80), None)];
        assert!(m(entry(IPPROTO_TCP, "10.78.0.2", "10.78.0.1", 80), &both));
        assert!(m(entry(IPPROTO_UDP, "10.78.0.2", "10.78.0.1", 5353), &both));
        assert!(!m(
            entry(IPPROTO_TCP, "10.78.0.2", "10.78.0.1", 5353),
            &both
        ));
        assert!(!m(entry(IPPROTO_UDP, "10.78.0.2", "10.78.0.1", 80), &both));
        assert!(!m(entry(IPPROTO_UDP, "10.78.0.2", "10.78.0.1", 5353), &[]));
    }

    #[test]
    fn no_flows_need_no_socket_work() {
        // forget with nothing to forget returns before touching the socket: a socket of
        // any protocol will do, and nothing is sent on it.
        let mut sock = Socket::open(nix::sys::socket::SockProtocol::NetlinkRoute).unwrap();
        assert_eq!(forget(&mut sock, &[]).unwrap(), 0);
        assert_eq!(sock.next_seq(), 1);
    }
}
