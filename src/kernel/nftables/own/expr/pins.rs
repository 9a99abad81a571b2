//! Pins: every shape against the text `nft --debug=netlink -f FILE` (nftables 1.0.6, kernel
//! 6.x) printed for the equivalent nft syntax, captured in a scratch network namespace; the
//! syntax is next to each pin. Then round trips and what decode refuses.

use super::{EncodeError, decode, encode};
use crate::kernel::netlink;
use crate::kernel::nftables::wire::NFTA_RULE_EXPRESSIONS;
use crate::model::family::Family;
use crate::model::rule::Rule;

use super::super::debug::debug_text;
use crate::kernel::nftables::wire::NFTA_DATA_VALUE;
use crate::kernel::nftables::wire::NFTA_EXPR_DATA;
use crate::model::layout::{self, FILTER, NAT};
use crate::model::oci::ContainerId;
use crate::model::portspec::parse_entry;

pub(super) const V4: Family = Family::Ipv4;
pub(super) const V6: Family = Family::Ipv6;

/// A rule from the iptables arguments natledger renders (one parser, no new syntax).
pub(super) fn rule(args: &str) -> Rule {
    let args: Vec<&str> = args.split_whitespace().collect();
    Rule::parse_args(&args).unwrap()
}

/// The contents of the NFTA_RULE_EXPRESSIONS attribute `encode` appends.
pub(super) fn encoded(family: Family, rule: &Rule) -> Vec<u8> {
    let mut buf = Vec::new();
    encode(&mut buf, family, rule).unwrap();
    let list = netlink::attr(&buf, NFTA_RULE_EXPRESSIONS).unwrap();
    assert_eq!(netlink::attrs(&buf).count(), 1, "one attribute");
    list.to_vec()
}

/// A captured block: one expression a line, indentation dropped.
fn lines(captured: &str) -> String {
    captured
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(|l| format!("{l}\n"))
        .collect()
}

/// `rule` encodes to `captured` and decodes back (comment aside).
pub(super) fn pin(family: Family, rule: &Rule, nft: &str, captured: &str) {
    let list = encoded(family, rule);
    assert_eq!(debug_text(family, &list), lines(captured), "{nft}");
    let mut bare = rule.clone();
    bare.comment = None;
    assert_eq!(decode(family, &list), Some(bare), "{nft}");
}

#[test]
fn every_shape_encodes_as_nft_does() {
    let pins: &[(Family, &str, &str, &str)] = &[
        (
            V4,
            "-d 10.0.0.1/32 -p tcp -m tcp --dport 8080 -j DNAT --to-destination 10.1.0.2:80",
            "ip daddr 10.0.0.1 meta l4proto tcp tcp dport 8080 dnat to 10.1.0.2:80",
            "[ payload load 4b @ network header + 16 => reg 1 ]
             [ cmp eq reg 1 0x0100000a ]
             [ meta load l4proto => reg 1 ]
             [ cmp eq reg 1 0x00000006 ]
             [ payload load 2b @ transport header + 2 => reg 1 ]
             [ cmp eq reg 1 0x0000901f ]
             [ immediate reg 1 0x0200010a ]
             [ immediate reg 2 0x00005000 ]
             [ nat dnat ip addr_min reg 1 proto_min reg 2 flags 0x2 ]",
        ),
        (
            V4,
            "-s 10.1.0.0/23 -j DROP",
            "ip saddr 10.1.0.0/23 drop",
            "[ payload load 4b @ network header + 12 => reg 1 ]
             [ bitwise reg 1 = ( reg 1 & 0x00feffff ) ^ 0x00000000 ]
             [ cmp eq reg 1 0x0000010a ]
             [ immediate reg 0 drop ]",
        ),
        (
            V4,
            "-s 10.1.0.0/24 -j ACCEPT",
            "ip saddr 10.1.0.0/24 accept",
            "[ payload load 3b @ network header + 12 => reg 1 ]
             [ cmp eq reg 1 0x0000010a ]
             [ immediate reg 0 accept ]",
        ),
        (
            V4,
            "-s 0.0.0.0/0 -j DROP",
            "ip saddr 0.0.0.0/0 drop",
            "[ payload load 4b @ network header + 12 => reg 1 ]
             [ bitwise reg 1 = ( reg 1 & 0x00000000 ) ^ 0x00000000 ]
             [ cmp eq reg 1 0x00000000 ]
             [ immediate reg 0 drop ]",
        ),
        (
            V4,
            "-s 10.1.0.128/25 -d 10.2.0.0/16 -j ACCEPT",
            "ip saddr 10.1.0.128/25 ip daddr 10.2.0.0/16 accept",
            "[ payload load 4b @ network header + 12 => reg 1 ]
             [ bitwise reg 1 = ( reg 1 & 0x80ffffff ) ^ 0x00000000 ]
             [ cmp eq reg 1 0x8000010a ]
             [ payload load 2b @ network header + 16 => reg 1 ]
             [ cmp eq reg 1 0x0000020a ]
             [ immediate reg 0 accept ]",
        ),
        (
            V4,
            "-s 10.1.0.2/32 -j ACCEPT",
            "ip saddr 10.1.0.2 accept",
            "[ payload load 4b @ network header + 12 => reg 1 ]
             [ cmp eq reg 1 0x0200010a ]
             [ immediate reg 0 accept ]",
        ),
        (
            V4,
            "-p udp -j ACCEPT",
            "meta l4proto udp accept",
            "[ meta load l4proto => reg 1 ]
             [ cmp eq reg 1 0x00000011 ]
             [ immediate reg 0 accept ]",
        ),
        (
            V6,
            "-p tcp -m tcp --dport 8080 -j DNAT --to-destination [fd00::2]:80",
            "meta l4proto tcp tcp dport 8080 dnat to [fd00::2]:80",
            "[ meta load l4proto => reg 1 ]
             [ cmp eq reg 1 0x00000006 ]
             [ payload load 2b @ transport header + 2 => reg 1 ]
             [ cmp eq reg 1 0x0000901f ]
             [ immediate reg 1 0x000000fd 0x00000000 0x00000000 0x02000000 ]
             [ immediate reg 2 0x00005000 ]
             [ nat dnat ip6 addr_min reg 1 proto_min reg 2 flags 0x2 ]",
        ),
        (
            V6,
            "-s fd00::/64 -j DROP",
            "ip6 saddr fd00::/64 drop",
            "[ payload load 8b @ network header + 8 => reg 1 ]
             [ cmp eq reg 1 0x000000fd 0x00000000 ]
             [ immediate reg 0 drop ]",
        ),
        (
            V6,
            "-s fd00::/60 -j DROP",
            "ip6 saddr fd00::/60 drop",
            "[ payload load 16b @ network header + 8 => reg 1 ]
             [ bitwise reg 1 = ( reg 1 & 0xffffffff 0xf0ffffff 0x00000000 0x00000000 ) ^ 0x00000000 0x00000000 0x00000000 0x00000000 ]
             [ cmp eq reg 1 0x000000fd 0x00000000 0x00000000 0x00000000 ]
             [ immediate reg 0 drop ]",
        ),
        (
            V6,
            "-s ::/0 -j ACCEPT",
            "ip6 saddr ::/0 accept",
            "[ payload load 16b @ network header + 8 => reg 1 ]
             [ bitwise reg 1 = ( reg 1 & 0x00000000 0x00000000 0x00000000 0x00000000 ) ^ 0x00000000 0x00000000 0x00000000 0x00000000 ]
             [ cmp eq reg 1 0x00000000 0x00000000 0x00000000 0x00000000 ]
             [ immediate reg 0 accept ]",
        ),
        (
            V6,
            "-s fd00::/127 -d fd00:1::/48 -j DROP",
            "ip6 saddr fd00::/127 ip6 daddr fd00:1::/48 drop",
            "[ payload load 16b @ network header + 8 => reg 1 ]
             [ bitwise reg 1 = ( reg 1 & 0xffffffff 0xffffffff 0xffffffff 0xfeffffff ) ^ 0x00000000 0x00000000 0x00000000 0x00000000 ]
             [ cmp eq reg 1 0x000000fd 0x00000000 0x00000000 0x00000000 ]
             [ payload load 6b @ network header + 24 => reg 1 ]
             [ cmp eq reg 1 0x010000fd 0x00000000 ]
             [ immediate reg 0 drop ]",
        ),
    ];
    for (family, args, nft, captured) in pins {
        pin(*family, &rule(args), nft, captured);
    }
}

#[test]
fn the_mapping_rules_encode_as_nft_does() {
    let id: ContainerId = "abc".parse().unwrap();
    let placed = |entry: &str, container: &str| {
        layout::mapping_rules(
            crate::model::backend_name::Backend::IptablesLegacy,
            &id,
            &parse_entry(entry).unwrap(),
            container.parse::<std::net::IpAddr>().unwrap(),
        )
    };
    // One port, IPv4: the forward accept, DNAT, hairpin and loopback masquerades.
    let rules = placed("8080:80", "10.77.0.2");
    assert_eq!(rules[0].table, FILTER);
    let mut buf = Vec::new();
    assert_eq!(
        encode(&mut buf, V4, &rules[0].rule),
        Err(EncodeError::Dnatted)
    );
    assert!(buf.is_empty(), "nothing appended on error");
    pin(
        V4,
        &rules[1].rule,
        "meta l4proto tcp tcp dport 8080 dnat to 10.77.0.2:80",
        "[ meta load l4proto => reg 1 ]
         [ cmp eq reg 1 0x00000006 ]
         [ payload load 2b @ transport header + 2 => reg 1 ]
         [ cmp eq reg 1 0x0000901f ]
         [ immediate reg 1 0x02004d0a ]
         [ immediate reg 2 0x00005000 ]
         [ nat dnat ip addr_min reg 1 proto_min reg 2 flags 0x2 ]",
    );
    pin(
        V4,
        &rules[2].rule,
        "ip saddr 10.77.0.2 ip daddr 10.77.0.2 meta l4proto tcp tcp dport 80 masquerade",
        "[ payload load 4b @ network header + 12 => reg 1 ]
         [ cmp eq reg 1 0x02004d0a ]
         [ payload load 4b @ network header + 16 => reg 1 ]
         [ cmp eq reg 1 0x02004d0a ]
         [ meta load l4proto => reg 1 ]
         [ cmp eq reg 1 0x00000006 ]
         [ payload load 2b @ transport header + 2 => reg 1 ]
         [ cmp eq reg 1 0x00005000 ]
         [ masq ]",
    );
    pin(
        V4,
        &rules[3].rule,
        "ip saddr 127.0.0.0/8 ip daddr 10.77.0.2 meta l4proto tcp tcp dport 80 masquerade",
        "[ payload load 1b @ network header + 12 => reg 1 ]
         [ cmp eq reg 1 0x0000007f ]
         [ payload load 4b @ network header + 16 => reg 1 ]
         [ cmp eq reg 1 0x02004d0a ]
         [ meta load l4proto => reg 1 ]
         [ cmp eq reg 1 0x00000006 ]
         [ payload load 2b @ transport header + 2 => reg 1 ]
         [ cmp eq reg 1 0x00005000 ]
         [ masq ]",
    );

    // A range to the same ports: no port in the nat, nf_nat keeps it.
    let rules = placed("8000-8010:8000-8010/udp", "10.77.0.2");
    pin(
        V4,
        &rules[1].rule,
        "meta l4proto udp udp dport 8000-8010 dnat to 10.77.0.2",
        "[ meta load l4proto => reg 1 ]
         [ cmp eq reg 1 0x00000011 ]
         [ payload load 2b @ transport header + 2 => reg 1 ]
         [ cmp gte reg 1 0x0000401f ]
         [ cmp lte reg 1 0x00004a1f ]
         [ immediate reg 1 0x02004d0a ]
         [ nat dnat ip addr_min reg 1 ]",
    );
    pin(
        V4,
        &rules[2].rule,
        "ip saddr 10.77.0.2 ip daddr 10.77.0.2 meta l4proto udp udp dport 8000-8010 masquerade",
        "[ payload load 4b @ network header + 12 => reg 1 ]
         [ cmp eq reg 1 0x02004d0a ]
         [ payload load 4b @ network header + 16 => reg 1 ]
         [ cmp eq reg 1 0x02004d0a ]
         [ meta load l4proto => reg 1 ]
         [ cmp eq reg 1 0x00000011 ]
         [ payload load 2b @ transport header + 2 => reg 1 ]
         [ cmp gte reg 1 0x0000401f ]
         [ cmp lte reg 1 0x00004a1f ]
         [ masq ]",
    );
    pin(
        V4,
        &rules[3].rule,
        "ip saddr 127.0.0.0/8 ip daddr 10.77.0.2 meta l4proto udp udp dport 8000-8010 masquerade",
        "[ payload load 1b @ network header + 12 => reg 1 ]
         [ cmp eq reg 1 0x0000007f ]
         [ payload load 4b @ network header + 16 => reg 1 ]
         [ cmp eq reg 1 0x02004d0a ]
         [ meta load l4proto => reg 1 ]
         [ cmp eq reg 1 0x00000011 ]
         [ payload load 2b @ transport header + 2 => reg 1 ]
         [ cmp gte reg 1 0x0000401f ]
         [ cmp lte reg 1 0x00004a1f ]
         [ masq ]",
    );

    // SCTP on a host address, the same port on both sides: an explicit port still.
    let rules = placed("10.78.0.1:9000:9000/sctp", "10.77.0.2");
    pin(
        V4,
        &rules[1].rule,
        "ip daddr 10.78.0.1 meta l4proto sctp sctp dport 9000 dnat to 10.77.0.2:9000",
        "[ payload load 4b @ network header + 16 => reg 1 ]
         [ cmp eq reg 1 0x01004e0a ]
         [ meta load l4proto => reg 1 ]
         [ cmp eq reg 1 0x00000084 ]
         [ payload load 2b @ transport header + 2 => reg 1 ]
         [ cmp eq reg 1 0x00002823 ]
         [ immediate reg 1 0x02004d0a ]
         [ immediate reg 2 0x00002823 ]
         [ nat dnat ip addr_min reg 1 proto_min reg 2 flags 0x2 ]",
    );

    // IPv6, a host address and a range.
    let rules = placed("[fd78::1]:9000-9002:9000-9002/udp", "fd77::2");
    assert_eq!(rules.len(), 3);
    pin(
        V6,
        &rules[1].rule,
        "ip6 daddr fd78::1 meta l4proto udp udp dport 9000-9002 dnat to fd77::2",
        "[ payload load 16b @ network header + 24 => reg 1 ]
         [ cmp eq reg 1 0x000078fd 0x00000000 0x00000000 0x01000000 ]
         [ meta load l4proto => reg 1 ]
         [ cmp eq reg 1 0x00000011 ]
         [ payload load 2b @ transport header + 2 => reg 1 ]
         [ cmp gte reg 1 0x00002823 ]
         [ cmp lte reg 1 0x00002a23 ]
         [ immediate reg 1 0x000077fd 0x00000000 0x00000000 0x02000000 ]
         [ nat dnat ip6 addr_min reg 1 ]",
    );
    pin(
        V6,
        &rules[2].rule,
        "ip6 saddr fd77::2 ip6 daddr fd77::2 meta l4proto udp udp dport 9000-9002 masquerade",
        "[ payload load 16b @ network header + 8 => reg 1 ]
         [ cmp eq reg 1 0x000077fd 0x00000000 0x00000000 0x02000000 ]
         [ payload load 16b @ network header + 24 => reg 1 ]
         [ cmp eq reg 1 0x000077fd 0x00000000 0x00000000 0x02000000 ]
         [ meta load l4proto => reg 1 ]
         [ cmp eq reg 1 0x00000011 ]
         [ payload load 2b @ transport header + 2 => reg 1 ]
         [ cmp gte reg 1 0x00002823 ]
         [ cmp lte reg 1 0x00002a23 ]
         [ masq ]",
    );
    let rules = placed("80:80/sctp", "fd77::2");
    pin(
        V6,
        &rules[2].rule,
        "ip6 saddr fd77::2 ip6 daddr fd77::2 meta l4proto sctp sctp dport 80 masquerade",
        "[ payload load 16b @ network header + 8 => reg 1 ]
         [ cmp eq reg 1 0x000077fd 0x00000000 0x00000000 0x02000000 ]
         [ payload load 16b @ network header + 24 => reg 1 ]
         [ cmp eq reg 1 0x000077fd 0x00000000 0x00000000 0x02000000 ]
         [ meta load l4proto => reg 1 ]
         [ cmp eq reg 1 0x00000084 ]
         [ payload load 2b @ transport header + 2 => reg 1 ]
         [ cmp eq reg 1 0x00005000 ]
         [ masq ]",
    );
}

#[test]
fn the_shared_jumps_and_the_guard_encode_as_nft_does() {
    for family in Family::ALL {
        let nat = layout::shared_rules(
            crate::model::backend_name::Backend::IptablesLegacy,
            NAT,
            family,
        );
        // PREROUTING and OUTPUT: `fib daddr type local jump NATLEDGER-HOSTPORTS`.
        for (_, jump) in &nat[..2] {
            pin(
                family,
                jump,
                "fib daddr type local jump NATLEDGER-HOSTPORTS",
                "[ fib daddr type => reg 1 ]
                 [ cmp eq reg 1 0x00000002 ]
                 [ immediate reg 0 jump -> NATLEDGER-HOSTPORTS ]",
            );
        }
        pin(
            family,
            &nat[2].1,
            "jump NATLEDGER-MASQ",
            "[ immediate reg 0 jump -> NATLEDGER-MASQ ]",
        );
        let filter = layout::shared_rules(
            crate::model::backend_name::Backend::IptablesLegacy,
            FILTER,
            family,
        );
        pin(
            family,
            &filter[0].1,
            "jump NATLEDGER-FORWARD",
            "[ immediate reg 0 jump -> NATLEDGER-FORWARD ]",
        );
    }
    let filter = layout::shared_rules(
        crate::model::backend_name::Backend::IptablesLegacy,
        FILTER,
        V4,
    );
    pin(
        V4,
        &filter[1].1,
        "jump NATLEDGER-INPUT",
        "[ immediate reg 0 jump -> NATLEDGER-INPUT ]",
    );
    assert_eq!(filter[2].1, layout::guard(V4.routable_loopback().unwrap()));
    pin(
        V4,
        &filter[2].1,
        "ip daddr 127.0.0.0/8 iifname != \"lo\" ct status & dnat == 0 drop",
        "[ payload load 1b @ network header + 16 => reg 1 ]
         [ cmp eq reg 1 0x0000007f ]
         [ meta load iifname => reg 1 ]
         [ cmp neq reg 1 0x00006f6c 0x00000000 0x00000000 0x00000000 ]
         [ ct load status => reg 1 ]
         [ bitwise reg 1 = ( reg 1 & 0x00000020 ) ^ 0x00000000 ]
         [ cmp eq reg 1 0x00000000 ]
         [ immediate reg 0 drop ]",
    );
}

/// The nftables backend's second guard rule, from `nft --debug=netlink -f` (and
/// `--debug=mnl`: this `bitwise` carries no op attribute, unlike `ct status`'s).
#[test]
fn the_untracked_guard_encodes_as_nft_does() {
    let nftables = layout::shared_rules(
        crate::model::backend_name::Backend::OwnNftables,
        "filter",
        V4,
    );
    let untracked = layout::guard_untracked(V4.routable_loopback().unwrap());
    assert!(
        nftables
            .iter()
            .any(|(c, r)| *c == "NATLEDGER-INPUT" && *r == untracked)
    );
    assert!(
        !layout::shared_rules(
            crate::model::backend_name::Backend::IptablesNft,
            "filter",
            V4
        )
        .iter()
        .any(|(_, r)| *r == untracked),
        "the iptables guard needs no second rule"
    );
    pin(
        V4,
        &untracked,
        "ip daddr 127.0.0.0/8 iifname != \"lo\" ct state invalid,untracked drop",
        "[ payload load 1b @ network header + 16 => reg 1 ]
         [ cmp eq reg 1 0x0000007f ]
         [ meta load iifname => reg 1 ]
         [ cmp neq reg 1 0x00006f6c 0x00000000 0x00000000 0x00000000 ]
         [ ct load state => reg 1 ]
         [ bitwise reg 1 = ( reg 1 & 0x00000041 ) ^ 0x00000000 ]
         [ cmp neq reg 1 0x00000000 ]
         [ immediate reg 0 drop ]",
    );
    let list = encoded(V4, &untracked);
    let elems: Vec<&[u8]> = netlink::attrs(&list).map(|(_, e)| e).collect();
    let data = |i: usize| netlink::attr(elems[i], NFTA_EXPR_DATA).unwrap();
    let kinds = |i: usize| netlink::attrs(data(i)).map(|(k, _)| k).collect::<Vec<_>>();
    assert_eq!(kinds(4), [2, 1], "ct: key, dreg");
    assert_eq!(kinds(5), [1, 2, 3, 4, 5], "bitwise without an op");
}

#[test]
fn the_bytes_are_nfts_attribute_for_attribute() {
    // From `nft --debug=mnl`: the meta key before its register, fib flags, result,
    // register; the written `&` of `ct status` carries op 0, a prefix's mask none; 1- and
    // 2-byte values keep their length; `masq` has an empty data attribute.
    let guard = layout::guard(V4.routable_loopback().unwrap());
    let list = encoded(V4, &guard);
    let elems: Vec<&[u8]> = netlink::attrs(&list).map(|(_, e)| e).collect();
    let data = |i: usize| netlink::attr(elems[i], NFTA_EXPR_DATA).unwrap();
    let kinds = |i: usize| netlink::attrs(data(i)).map(|(k, _)| k).collect::<Vec<_>>();
    assert_eq!(kinds(2), [2, 1], "meta: key, dreg");
    assert_eq!(kinds(5), [1, 2, 6, 3, 4, 5], "bitwise with its op");
    let jump =
        &layout::shared_rules(crate::model::backend_name::Backend::IptablesLegacy, NAT, V4)[0].1;
    let list = encoded(V4, jump);
    let fib = netlink::attrs(&list).next().unwrap().1;
    let fib = netlink::attr(fib, NFTA_EXPR_DATA).unwrap();
    assert_eq!(
        netlink::attrs(fib).map(|(k, _)| k).collect::<Vec<_>>(),
        [3, 2, 1]
    );
    let prefix = encoded(V4, &rule("-s 10.0.0.0/9 -j ACCEPT"));
    let bitwise = netlink::attrs(&prefix).nth(1).unwrap().1;
    let bitwise = netlink::attr(bitwise, NFTA_EXPR_DATA).unwrap();
    assert_eq!(
        netlink::attrs(bitwise).map(|(k, _)| k).collect::<Vec<_>>(),
        [1, 2, 3, 4, 5]
    );
    let masq = encoded(V4, &rule("-j MASQUERADE"));
    // LIST_ELEM { NAME "masq", DATA {} }: 4 + 12 + 4 bytes.
    assert_eq!(masq.len(), 20);
    assert_eq!(&masq[4..16], b"\x09\x00\x01\x00masq\0\0\0\0");
    assert_eq!(&masq[16..20], &[4, 0, 2, 0x80]);
    let dnat = encoded(
        V4,
        &rule("-p tcp -m tcp --dport 80 -j DNAT --to-destination 10.0.0.2:80"),
    );
    let port = netlink::attrs(&dnat).nth(5).unwrap().1;
    let port = netlink::attr(netlink::attr(port, NFTA_EXPR_DATA).unwrap(), 2).unwrap();
    assert_eq!(netlink::attr(port, NFTA_DATA_VALUE), Some(&[0, 80][..]));
}
