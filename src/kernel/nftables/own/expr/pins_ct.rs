//! Pins of the hairpin masquerade's conntrack match (`expr/ct.rs`) against what `nft
//! --debug=netlink -f FILE` and `--debug=mnl` (nftables 1.0.6) printed for the nft syntax
//! next to each, captured in a scratch network namespace; and the kernel's dump of it.

use super::{EncodeError, Expr, decode, encode, exprs, normal, put};
use crate::kernel::netlink;
use crate::model::rule::{Rule, Target};

use super::pins::{V4, V6, encoded, pin, rule};
use crate::kernel::nftables::wire::NFTA_EXPR_DATA;
use crate::model::layout;
use crate::model::oci::ContainerId;
use crate::model::portspec::parse_entry;

/// The hairpin masquerade of a known subnet (`layout::mapping_rules`): its conntrack match
/// as `ct` loads with their directions; the status test's `&` carries no op (`nft
/// --debug=mnl`: sreg, dreg, len, mask, xor), each directed load key, dreg, direction (1 byte).
#[test]
fn the_hairpin_masquerade_encodes_as_nft_does() {
    let id: ContainerId = "abc".parse().unwrap();
    let container = crate::model::family::IfAddr {
        addr: "10.77.0.2".parse().unwrap(),
        prefix: Some(24),
    };
    let m = parse_entry("10.78.0.1:8080:80").unwrap();
    let rules = layout::mapping_rules(
        crate::model::backend_name::Backend::OwnNftables,
        &id,
        &m,
        container,
    );
    assert_eq!(rules.len(), 2, "DNAT and the hairpin masquerade");
    pin(
        V4,
        &rules[1].rule,
        "ip saddr 10.77.0.0/24 ip daddr 10.77.0.2 meta l4proto tcp tcp dport 80 ct status dnat \
         ct original protocol tcp ct original ip daddr 10.78.0.1 ct reply ip saddr 10.77.0.2 \
         ct original proto-dst 8080 ct reply proto-src 80 masquerade",
        "[ payload load 3b @ network header + 12 => reg 1 ]
         [ cmp eq reg 1 0x00004d0a ]
         [ payload load 4b @ network header + 16 => reg 1 ]
         [ cmp eq reg 1 0x02004d0a ]
         [ meta load l4proto => reg 1 ]
         [ cmp eq reg 1 0x00000006 ]
         [ payload load 2b @ transport header + 2 => reg 1 ]
         [ cmp eq reg 1 0x00005000 ]
         [ ct load status => reg 1 ]
         [ bitwise reg 1 = ( reg 1 & 0x00000020 ) ^ 0x00000000 ]
         [ cmp neq reg 1 0x00000000 ]
         [ ct load protocol => reg 1 , dir original ]
         [ cmp eq reg 1 0x00000006 ]
         [ ct load dst_ip => reg 1 , dir original ]
         [ cmp eq reg 1 0x01004e0a ]
         [ ct load src_ip => reg 1 , dir reply ]
         [ cmp eq reg 1 0x02004d0a ]
         [ ct load proto_dst => reg 1 , dir original ]
         [ cmp eq reg 1 0x0000901f ]
         [ ct load proto_src => reg 1 , dir reply ]
         [ cmp eq reg 1 0x00005000 ]
         [ masq ]",
    );
    pin(
        V4,
        &rule(
            "-s 10.77.0.0/24 -d 10.77.0.2/32 -p udp -m udp --dport 80:82 -m conntrack \
             --ctstate DNAT --ctproto 17 --ctreplsrc 10.77.0.2 --ctorigdstport 9000:9002 \
             --ctreplsrcport 80:82 -j MASQUERADE",
        ),
        "ip saddr 10.77.0.0/24 ip daddr 10.77.0.2 meta l4proto udp udp dport 80-82 ct status dnat \
         ct original protocol udp ct reply ip saddr 10.77.0.2 ct original proto-dst 9000-9002 \
         ct reply proto-src 80-82 masquerade",
        "[ payload load 3b @ network header + 12 => reg 1 ]
         [ cmp eq reg 1 0x00004d0a ]
         [ payload load 4b @ network header + 16 => reg 1 ]
         [ cmp eq reg 1 0x02004d0a ]
         [ meta load l4proto => reg 1 ]
         [ cmp eq reg 1 0x00000011 ]
         [ payload load 2b @ transport header + 2 => reg 1 ]
         [ cmp gte reg 1 0x00005000 ]
         [ cmp lte reg 1 0x00005200 ]
         [ ct load status => reg 1 ]
         [ bitwise reg 1 = ( reg 1 & 0x00000020 ) ^ 0x00000000 ]
         [ cmp neq reg 1 0x00000000 ]
         [ ct load protocol => reg 1 , dir original ]
         [ cmp eq reg 1 0x00000011 ]
         [ ct load src_ip => reg 1 , dir reply ]
         [ cmp eq reg 1 0x02004d0a ]
         [ ct load proto_dst => reg 1 , dir original ]
         [ cmp gte reg 1 0x00002823 ]
         [ cmp lte reg 1 0x00002a23 ]
         [ ct load proto_src => reg 1 , dir reply ]
         [ cmp gte reg 1 0x00005000 ]
         [ cmp lte reg 1 0x00005200 ]
         [ masq ]",
    );
    pin(
        V6,
        &rule(
            "-s fd77::/64 -d fd77::2/128 -p tcp -m tcp --dport 80 -m conntrack --ctstate DNAT \
             --ctproto 6 --ctorigdst fd78::1 --ctreplsrc fd77::2 --ctorigdstport 8080 \
             --ctreplsrcport 80 -j MASQUERADE",
        ),
        "ip6 saddr fd77::/64 ip6 daddr fd77::2 meta l4proto tcp tcp dport 80 ct status dnat \
         ct original protocol tcp ct original ip6 daddr fd78::1 ct reply ip6 saddr fd77::2 \
         ct original proto-dst 8080 ct reply proto-src 80 masquerade",
        "[ payload load 8b @ network header + 8 => reg 1 ]
         [ cmp eq reg 1 0x000077fd 0x00000000 ]
         [ payload load 16b @ network header + 24 => reg 1 ]
         [ cmp eq reg 1 0x000077fd 0x00000000 0x00000000 0x02000000 ]
         [ meta load l4proto => reg 1 ]
         [ cmp eq reg 1 0x00000006 ]
         [ payload load 2b @ transport header + 2 => reg 1 ]
         [ cmp eq reg 1 0x00005000 ]
         [ ct load status => reg 1 ]
         [ bitwise reg 1 = ( reg 1 & 0x00000020 ) ^ 0x00000000 ]
         [ cmp neq reg 1 0x00000000 ]
         [ ct load protocol => reg 1 , dir original ]
         [ cmp eq reg 1 0x00000006 ]
         [ ct load dst_ip6 => reg 1 , dir original ]
         [ cmp eq reg 1 0x000078fd 0x00000000 0x00000000 0x01000000 ]
         [ ct load src_ip6 => reg 1 , dir reply ]
         [ cmp eq reg 1 0x000077fd 0x00000000 0x00000000 0x02000000 ]
         [ ct load proto_dst => reg 1 , dir original ]
         [ cmp eq reg 1 0x0000901f ]
         [ ct load proto_src => reg 1 , dir reply ]
         [ cmp eq reg 1 0x00005000 ]
         [ masq ]",
    );
    // The bytes, attribute for attribute.
    let list = encoded(V4, &rules[1].rule);
    let elems: Vec<&[u8]> = netlink::attrs(&list).map(|(_, e)| e).collect();
    let data = |i: usize| netlink::attr(elems[i], NFTA_EXPR_DATA).unwrap();
    let kinds = |i: usize| netlink::attrs(data(i)).map(|(k, _)| k).collect::<Vec<_>>();
    assert_eq!(kinds(8), [2, 1], "ct status: key, dreg");
    assert_eq!(kinds(9), [1, 2, 3, 4, 5], "bitwise without an op");
    assert_eq!(kinds(11), [2, 1, 3], "ct protocol: key, dreg, direction");
    assert_eq!(netlink::attr(data(11), 3), Some(&[0u8][..]));
    assert_eq!(netlink::attr(data(15), 3), Some(&[1u8][..]));
    // The kernel dumps `ct protocol` without its direction: read all the same.
    let mut dumped = Vec::new();
    for e in exprs(V4, &rules[1].rule).unwrap().into_iter().map(normal) {
        put(&mut dumped, &e);
    }
    assert_ne!(dumped, list);
    let mut bare = rules[1].rule.clone();
    bare.comment = None;
    assert_eq!(decode(V4, &dumped), Some(bare));
    // The accept stays unwritten here; a half conntrack match does not decode.
    assert_eq!(
        encode(
            &mut Vec::new(),
            V4,
            &Rule {
                target: Target::Accept,
                ..rules[1].rule.clone()
            }
        ),
        Err(EncodeError::Dnatted)
    );
    let mut half = list.clone();
    let cut: usize = elems[..elems.len() - 3].iter().map(|e| e.len() + 4).sum();
    half.truncate(cut);
    let mut masq = Vec::new();
    put(&mut masq, &Expr::Masq);
    half.extend(masq);
    assert_eq!(decode(V4, &half), None);
}
