use super::*;
use crate::kernel::netlink::{self, NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST};

const TCP: u8 = 6;
const UDP: u8 = 17;
const SCTP: u8 = 132;

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
        reply_src: Some(ip(dst)),
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
        to: None,
    }
}

/// A dump answer as the kernel writes it: nested flags set, the reply tuple and other
/// attributes around the ones read, counters and status in network byte order.
fn kernel_entry(e: &Entry, icmp: bool) -> Vec<u8> {
    let mut p = Vec::new();
    genmsg(&mut p, Family::of(e.dst).af());
    for (kind, (src, dst, sport, dport)) in [
        (CTA_TUPLE_ORIG, (e.src, e.dst, e.src_port, e.dst_port)),
        (
            2,
            (e.reply_src.unwrap_or(e.dst), e.src, e.dst_port, e.src_port),
        ), // CTA_TUPLE_REPLY
    ] {
        let tuple = netlink::begin_nest(&mut p, kind);
        let nest = netlink::begin_nest(&mut p, CTA_TUPLE_IP);
        put_ip(&mut p, End::Src, src);
        put_ip(&mut p, End::Dst, dst);
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
    let mut v4 = entry(UDP, "10.78.0.2", "10.78.0.1", 5353);
    v4.src_port = 0xa1b2;
    v4.id = Some(0xdead_beef);
    assert_eq!(parse_entry(&kernel_entry(&v4, false)), Some(v4));

    let mut v6 = entry(SCTP, "fd78::2", "fd78::1", 0x1234);
    v6.zone = Some(0x0102);
    assert_eq!(parse_entry(&kernel_entry(&v6, false)), Some(v6));

    let mut directional = entry(TCP, "10.0.0.1", "10.0.0.2", 80);
    directional.tuple_zone = Some(9);
    directional.id = None;
    assert_eq!(
        parse_entry(&kernel_entry(&directional, false)),
        Some(directional)
    );
}

/// A DNATed flow's reply comes from the target: a removed DNAT's flows are those alone, so a
/// stacked holder's flows to the same host port stay (`Flows::to`).
#[test]
fn a_removed_dnats_flows_are_those_whose_replies_come_from_its_target() {
    let mut to_old = entry(UDP, "10.78.0.2", "10.78.0.1", 5353);
    to_old.reply_src = Some(ip("10.77.0.2"));
    assert_eq!(parse_entry(&kernel_entry(&to_old, false)), Some(to_old));
    let mut to_new = to_old;
    to_new.reply_src = Some(ip("10.77.0.3"));
    let locals = LocalAddrs::default();
    let removed = Flows {
        to: Some(ip("10.77.0.2")),
        ..flows(Family::Ipv4, Protocol::Udp, (5353, 5353), Some("10.78.0.1"))
    };
    assert!(matches(&to_old, &[removed], &locals));
    assert!(!matches(&to_new, &[removed], &locals));
    // Added: every flow of the port; a reply not read: judged by the original tuple.
    let added = Flows {
        to: None,
        ..removed
    };
    assert!(matches(&to_new, &[added], &locals));
    to_new.reply_src = None;
    assert!(matches(&to_new, &[removed], &locals));
}

#[test]
fn entries_without_ports_or_of_other_families_are_not_read() {
    let icmp = entry(1, "10.0.0.1", "10.0.0.2", 0);
    assert_eq!(parse_entry(&kernel_entry(&icmp, true)), None);
    let mut other = kernel_entry(&entry(UDP, "10.0.0.1", "10.0.0.2", 53), false);
    other[0] = libc::AF_BRIDGE as u8;
    assert_eq!(parse_entry(&other), None);
    // IPv4 addresses in a message that claims IPv6.
    let mut mixed = kernel_entry(&entry(UDP, "10.0.0.1", "10.0.0.2", 53), false);
    mixed[0] = libc::AF_INET6 as u8;
    assert_eq!(parse_entry(&mixed), None);
    assert_eq!(parse_entry(&[]), None);
    assert_eq!(parse_entry(&[2, 0, 0, 0]), None);
}

#[test]
fn a_dump_asks_for_every_entry_of_both_families() {
    let m = dump_request(5, Dump::All, false);
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
    let mut zoned = entry(UDP, "fd78::2", "fd78::1", 5353);
    zoned.zone = Some(3);
    let mut directional = entry(UDP, "10.78.0.2", "10.78.0.1", 5353);
    directional.tuple_zone = Some(4);
    directional.id = None;
    let plain = entry(SCTP, "10.78.0.2", "127.0.0.1", 7000);
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
        // The reply tuple is not sent: the original one names the entry.
        let sent = Entry {
            reply_src: None,
            ..e
        };
        assert_eq!(parse_entry(message.payload), Some(sent), "{e:?}");
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
        assert!(m(entry(UDP, "10.78.0.2", dst, 5353), &udp53), "{dst}");
    }
    // Forwarded through the node: not local, never natledger's.
    assert!(!m(entry(UDP, "10.78.0.2", "8.8.8.8", 5353), &udp53));
    assert!(!m(entry(UDP, "10.78.0.2", "10.77.0.2", 5353), &udp53));
    // Other port, protocol, family.
    assert!(!m(entry(UDP, "10.78.0.2", "10.78.0.1", 5354), &udp53));
    assert!(!m(entry(TCP, "10.78.0.2", "10.78.0.1", 5353), &udp53));
    assert!(!m(entry(SCTP, "10.78.0.2", "10.78.0.1", 5353), &udp53));
    assert!(!m(entry(UDP, "fd78::2", "fd78::1", 5353), &udp53));
    assert!(!m(entry(UDP, "fd78::2", "::1", 5353), &udp53));

    // A range, bounds included, IPv6.
    let range = [flows(Family::Ipv6, Protocol::Sctp, (7000, 7002), None)];
    for (port, hit) in [(6999, false), (7000, true), (7002, true), (7003, false)] {
        let e = entry(SCTP, "fd78::2", "fd78::1", port);
        assert_eq!(m(e, &range), hit, "{port}");
    }
    assert!(m(entry(SCTP, "fd78::2", "::1", 7001), &range));
    assert!(!m(entry(SCTP, "fd78::2", "fd78::9", 7001), &range));

    // An explicit host address: only it, local or not.
    let bound = [flows(
        Family::Ipv4,
        Protocol::Udp,
        (53, 53),
        Some("10.77.0.1"),
    )];
    assert!(m(entry(UDP, "10.78.0.2", "10.77.0.1", 53), &bound));
    assert!(!m(entry(UDP, "10.78.0.2", "10.78.0.1", 53), &bound));
    assert!(!m(entry(UDP, "10.78.0.2", "127.0.0.1", 53), &bound));
    // An unspecified host address means every local address of its family.
    let any = [flows(
        Family::Ipv4,
        Protocol::Udp,
        (53, 53),
        Some("0.0.0.0"),
    )];
    assert!(m(entry(UDP, "10.78.0.2", "10.78.0.1", 53), &any));
    assert!(!m(entry(UDP, "10.78.0.2", "0.0.0.0", 53), &any));
    assert!(!m(entry(UDP, "10.78.0.2", "8.8.8.8", 53), &any));

    // TCP only when a flow asks for TCP; several flows: any one.
    let both = [udp53[0], flows(Family::Ipv4, Protocol::Tcp, (80, 80), None)];
    assert!(m(entry(TCP, "10.78.0.2", "10.78.0.1", 80), &both));
    assert!(m(entry(UDP, "10.78.0.2", "10.78.0.1", 5353), &both));
    assert!(!m(entry(TCP, "10.78.0.2", "10.78.0.1", 5353), &both));
    assert!(!m(entry(UDP, "10.78.0.2", "10.78.0.1", 80), &both));
    assert!(!m(entry(UDP, "10.78.0.2", "10.78.0.1", 5353), &[]));
}

/// What the kernel would parse out of a dump request.
#[derive(Debug, PartialEq, Eq)]
struct Asked {
    family: u8,
    /// `CTA_FILTER_ORIG_FLAGS`, if there is a `CTA_FILTER`.
    flags: Option<u32>,
    /// The original tuple's destination address, protocol and destination port.
    dst: Option<Vec<u8>>,
    protocol: Option<u8>,
    port: Option<u16>,
}

fn asked(request: &[u8]) -> Asked {
    let message = netlink::messages(request).next().unwrap().unwrap();
    assert_eq!(message.kind, 0x0101);
    let body = &message.payload[4..];
    let tuple = netlink::attr(body, CTA_TUPLE_ORIG);
    let ip = tuple.and_then(|t| netlink::attr(t, CTA_TUPLE_IP));
    let proto = tuple.and_then(|t| netlink::attr(t, CTA_TUPLE_PROTO));
    Asked {
        family: message.payload[0],
        flags: netlink::attr(body, CTA_FILTER)
            .and_then(|f| netlink::attr(f, CTA_FILTER_ORIG_FLAGS))
            .map(|d| u32::from_ne_bytes(d.try_into().unwrap())),
        dst: ip
            .and_then(|ip| {
                netlink::attr(ip, CTA_IP_V4_DST).or_else(|| netlink::attr(ip, CTA_IP_V6_DST))
            })
            .map(<[u8]>::to_vec),
        protocol: proto
            .and_then(|p| netlink::attr(p, CTA_PROTO_NUM))
            .map(|d| d[0]),
        port: proto
            .and_then(|p| netlink::attr(p, CTA_PROTO_DST_PORT))
            .map(|d| u16::from_be_bytes(d.try_into().unwrap())),
    }
}

fn only(dump: &Dump) -> Filter {
    match dump {
        Dump::Only(filter) => *filter,
        Dump::All => panic!("an unfiltered dump"),
    }
}

/// The narrowest filter every flow of a family passes: a protocol they all share, a port
/// they all are (then only), an IPv4 host address they all name; never an IPv6 address.
#[test]
fn a_filter_names_what_all_flows_of_its_family_share() {
    let v4 = Family::Ipv4;
    let udp53 = flows(v4, Protocol::Udp, (53, 53), None);
    let filter = |f: &[Flows], family| Filter::of(family, f);
    assert_eq!(
        filter(&[udp53], v4),
        Filter {
            family: v4,
            protocol: Some(UDP),
            dst_port: Some(53),
            dst: None,
        }
    );
    // A range, or two ports: the protocol alone.
    let range = flows(v4, Protocol::Udp, (53, 54), None);
    assert_eq!(filter(&[range], v4).dst_port, None);
    let udp80 = flows(v4, Protocol::Udp, (80, 80), None);
    assert_eq!(filter(&[udp53, udp80], v4).dst_port, None);
    assert_eq!(filter(&[udp53, udp80], v4).protocol, Some(UDP));
    // Two protocols: the family alone, so no port either, even one they share.
    let sctp53 = flows(v4, Protocol::Sctp, (53, 53), None);
    let family_only = filter(&[udp53, sctp53], v4);
    assert_eq!((family_only.protocol, family_only.dst_port), (None, None));
    assert_eq!(family_only.flags(), 0);
    // One IPv4 host address for all: it; two, or one flow without: none.
    let bound = flows(v4, Protocol::Udp, (53, 53), Some("10.77.0.1"));
    let other = flows(v4, Protocol::Udp, (80, 80), Some("10.77.0.2"));
    let any = flows(v4, Protocol::Udp, (80, 80), Some("0.0.0.0"));
    assert_eq!(filter(&[bound], v4).dst, Some(ip("10.77.0.1")));
    assert_eq!(filter(&[bound, other], v4).dst, None);
    assert_eq!(filter(&[bound, udp53], v4).dst, None);
    assert_eq!(filter(&[bound, any], v4).dst, None);
    assert_eq!(
        filter(&[bound], v4).flags(),
        FILTER_F_PROTO_NUM | FILTER_F_PROTO_DST_PORT | FILTER_F_IP_DST
    );
    // IPv6: never an address (the kernel's comparison is inverted).
    let v6 = flows(Family::Ipv6, Protocol::Udp, (53, 53), Some("fd78::1"));
    let f6 = filter(&[v6], Family::Ipv6);
    assert_eq!(
        (f6.protocol, f6.dst_port, f6.dst),
        (Some(UDP), Some(53), None)
    );
    // Only the family's own flows count.
    assert_eq!(filter(&[v6, udp53], v4), filter(&[udp53], v4));
}

/// The choice: one family, always filtered (the count is not even read); both, filtered
/// from the threshold on, else (and when the count is unknown) one dump of everything.
/// Forced choices override it.
#[test]
fn the_dumps_are_chosen_by_families_and_entry_count() {
    let udp4 = flows(Family::Ipv4, Protocol::Udp, (53, 53), None);
    let sctp4 = flows(Family::Ipv4, Protocol::Sctp, (9000, 9002), None);
    let udp6 = flows(Family::Ipv6, Protocol::Udp, (53, 53), None);
    let unread = || -> Option<u64> { panic!("the count is read only for both families") };
    let one = plan(&[udp4, sctp4], Choice::Adaptive, unread);
    assert_eq!(one, [Dump::Only(Filter::of(Family::Ipv4, &[udp4, sctp4]))]);
    assert_eq!(
        plan(&[udp6], Choice::Adaptive, unread),
        [Dump::Only(Filter::of(Family::Ipv6, &[udp6]))]
    );

    let both = [udp6, udp4];
    let at = |n: Option<u64>| plan(&both, Choice::Adaptive, || n);
    assert_eq!(at(Some(0)), [Dump::All]);
    assert_eq!(at(Some(FILTER_BOTH_FAMILIES_FROM - 1)), [Dump::All]);
    assert_eq!(at(None), [Dump::All]);
    let filtered = at(Some(FILTER_BOTH_FAMILIES_FROM));
    assert_eq!(filtered.len(), 2);
    assert_eq!(only(&filtered[0]).family, Family::Ipv4);
    assert_eq!(only(&filtered[1]).family, Family::Ipv6);
    assert_eq!(only(&filtered[1]).dst_port, Some(53));
    assert_eq!(at(Some(1_000_000)), filtered);

    assert_eq!(plan(&both, Choice::Filtered, unread), filtered);
    assert_eq!(plan(&both, Choice::Refused, unread), filtered);
    assert_eq!(plan(&[udp4], Choice::Unfiltered, unread), [Dump::All]);
    assert!(plan(&[], Choice::Adaptive, unread).is_empty());
}

/// A filtered dump carries its family and, when it narrows more, the tuple fields and
/// their flags; a family alone needs no `CTA_FILTER`. The refusable request adds the
/// undefined flag, even to a family alone.
#[test]
fn a_filtered_dump_request_names_family_tuple_and_flags() {
    let bound = Filter::of(
        Family::Ipv4,
        &[flows(
            Family::Ipv4,
            Protocol::Udp,
            (5353, 5353),
            Some("10.77.0.1"),
        )],
    );
    assert_eq!(
        asked(&dump_request(3, Dump::Only(bound), false)),
        Asked {
            family: libc::AF_INET as u8,
            flags: Some(0b10_1010),
            dst: Some(vec![10, 77, 0, 1]),
            protocol: Some(UDP),
            port: Some(5353),
        }
    );

    let sctp6 = Filter::of(
        Family::Ipv6,
        &[flows(
            Family::Ipv6,
            Protocol::Sctp,
            (7000, 7002),
            Some("fd78::1"),
        )],
    );
    assert_eq!(
        asked(&dump_request(3, Dump::Only(sctp6), false)),
        Asked {
            family: libc::AF_INET6 as u8,
            flags: Some(FILTER_F_PROTO_NUM),
            dst: None,
            protocol: Some(SCTP),
            port: None,
        }
    );

    let family_only = Filter {
        family: Family::Ipv4,
        protocol: None,
        dst_port: None,
        dst: None,
    };
    let m = dump_request(3, Dump::Only(family_only), false);
    assert_eq!(m.len(), netlink::HEADER + 4);
    assert_eq!(asked(&m).family, libc::AF_INET as u8);
    let refusable = |filter| asked(&dump_request(3, Dump::Only(filter), true)).flags;
    assert_eq!(refusable(family_only), Some(FILTER_F_UNDEFINED));
    assert_eq!(refusable(bound), Some(0b10_1010 | FILTER_F_UNDEFINED));
    // The unfiltered dump stays as it was, refusable or not.
    assert_eq!(
        dump_request(3, Dump::All, true),
        dump_request(3, Dump::All, false)
    );
}

#[test]
fn only_a_refused_filter_falls_back() {
    let refusal = |errno| refused(&io::Error::from_raw_os_error(errno));
    assert!(refusal(libc::EOPNOTSUPP));
    assert!(refusal(libc::EINVAL));
    for errno in [libc::ENOBUFS, libc::EPERM, libc::ENOENT, libc::EBUSY] {
        assert!(!refusal(errno), "{errno}");
    }
    assert!(!refused(&io::Error::other("truncated netlink message")));
}

#[test]
fn no_flows_need_no_socket_work() {
    // forget with nothing to forget returns before touching the socket: a socket of
    // any protocol will do, and nothing is sent on it.
    let mut sock = Socket::open(nix::sys::socket::SockProtocol::NetlinkRoute).unwrap();
    assert_eq!(forget(&mut sock, &[], Choice::Adaptive).unwrap(), 0);
    assert_eq!(sock.next_seq(), 1);
}
