//! Round trips, what decode refuses and reads (the kernel's dump form), and the errors.

use super::super::debug::debug_text;
use super::pins::{V4, V6, encoded, rule};
use super::*;
use crate::kernel::nftables::wire::{NFTA_EXPR_DATA, NFTA_EXPR_NAME, NFTA_LIST_ELEM};
use crate::model::layout;
use crate::model::oci::ContainerId;
use crate::model::portspec::parse_entry;

#[test]
fn comment_udata_is_nfts() {
    assert_eq!(comment_udata("natledger:abc"), b"\x00\x0enatledger:abc\x00");
    let long = "é".repeat(200);
    let udata = comment_udata(&long);
    assert_eq!(udata.len(), 2 + 254 + 1);
    assert_eq!(udata[1], 255);
}

#[test]
fn what_nf_tables_cannot_say_is_an_error_naming_it() {
    let id: ContainerId = "abc".parse().unwrap();
    let shifted = layout::mapping_rules(
        crate::model::backend_name::Backend::IptablesLegacy,
        &id,
        &parse_entry("8000-8010:9000-9010").unwrap(),
        "10.77.0.2".parse::<std::net::IpAddr>().unwrap(),
    );
    let err = encode(&mut Vec::new(), V4, &shifted[1].rule).unwrap_err();
    assert_eq!(
        err,
        EncodeError::PortShift {
            host: Some(PortRange {
                start: 8000,
                end: 8010
            }),
            container: PortRange {
                start: 9000,
                end: 9010
            },
        }
    );
    let text = err.to_string();
    for needle in ["8000-8010", "9000-9010", "single ports", "iptables backend"] {
        assert!(text.contains(needle), "{text}");
    }
    let cases: &[(Family, &str, EncodeError)] = &[
        (
            V6,
            "-d 10.0.0.1/32 -j ACCEPT",
            EncodeError::WrongFamily {
                what: "destination",
                addr: "10.0.0.1".parse().unwrap(),
                family: V6,
            },
        ),
        (
            V4,
            "-p tcp -m tcp --dport 80 -j DNAT --to-destination [fd00::1]:80",
            EncodeError::WrongFamily {
                what: "DNAT address",
                addr: "fd00::1".parse().unwrap(),
                family: V4,
            },
        ),
        (
            V4,
            "-s 10.1.0.5/24 -j ACCEPT",
            EncodeError::HostBits {
                what: "source",
                net: "10.1.0.5/24".parse().unwrap(),
            },
        ),
        (
            V4,
            "-p tcp -m tcp --dport 80:82 -j DNAT --to-destination 10.0.0.2:80-82",
            EncodeError::RangeWithoutBase(PortRange { start: 80, end: 82 }),
        ),
        (
            V4,
            "-p tcp -m tcp --dport 80:82 -j DNAT --to-destination 10.0.0.2:80-82/81",
            EncodeError::PortShift {
                host: Some(PortRange { start: 80, end: 82 }),
                container: PortRange { start: 80, end: 82 },
            },
        ),
        (
            V4,
            "-p tcp -j DNAT --to-destination 10.0.0.2:80-82/80",
            EncodeError::PortShift {
                host: None,
                container: PortRange { start: 80, end: 82 },
            },
        ),
        (
            V4,
            "-j DNAT --to-destination 10.0.0.2:80",
            EncodeError::PortsWithoutProtocol {
                what: "DNAT port",
                ports: PortRange::single(80),
            },
        ),
    ];
    for (family, args, want) in cases {
        assert_eq!(
            encode(&mut Vec::new(), *family, &rule(args)).as_ref(),
            Err(want),
            "{args}"
        );
    }
    let mut odd = rule("-j ACCEPT");
    odd.not_in_interface = Some("eth*".into());
    assert_eq!(exprs(V4, &odd), Err(EncodeError::Interface("eth*".into())));
    odd.not_in_interface = Some("a-very-long-name".into());
    assert!(matches!(exprs(V4, &odd), Err(EncodeError::Interface(_))));
    let mut ports = rule("-j ACCEPT");
    ports.dports = Some(PortRange::single(80));
    assert!(matches!(
        exprs(V4, &ports),
        Err(EncodeError::PortsWithoutProtocol { .. })
    ));
    let jump = Rule {
        target: Target::Jump("no spaces".into()),
        ..rule("-j ACCEPT")
    };
    assert_eq!(
        exprs(V4, &jump),
        Err(EncodeError::ChainName("no spaces".into()))
    );
}

/// The list of `exprs`, serialised.
fn list_of(exprs: &[Expr]) -> Vec<u8> {
    let mut buf = Vec::new();
    for e in exprs {
        put(&mut buf, e);
    }
    buf
}

#[test]
fn decode_refuses_anything_encode_would_not_write() {
    let dnat =
        rule("-d 10.0.0.1/32 -p tcp -m tcp --dport 8080 -j DNAT --to-destination 10.1.0.2:80");
    let good = exprs(V4, &dnat).unwrap();
    assert_eq!(decode(V4, &list_of(&good)), Some(dnat.clone()));
    let edit = |f: &dyn Fn(&mut Vec<Expr>)| {
        let mut e = good.clone();
        f(&mut e);
        decode(V4, &list_of(&e))
    };
    // An extra counter, anywhere.
    assert_eq!(
        edit(&|e| e.push(Expr::Counter {
            packets: 0,
            bytes: 0
        })),
        None
    );
    assert_eq!(
        edit(&|e| e.insert(
            0,
            Expr::Counter {
                packets: 0,
                bytes: 0
            }
        )),
        None
    );
    // neq where eq is written, another register, another protocol number.
    assert_eq!(edit(&|e| e[1] = cmp(NEQ, vec![10, 0, 0, 1])), None);
    assert_eq!(
        edit(&|e| e[0] = Expr::Payload {
            base: NETWORK,
            offset: 16,
            len: 4,
            dreg: 2
        }),
        None
    );
    assert_eq!(edit(&|e| e[3] = cmp(EQ, vec![1])), None);
    // A nat with a port range, SNAT, another family, other flags.
    let nat = |f: &dyn Fn(&mut Expr)| {
        edit(&|e| {
            let last = e.len() - 1;
            f(&mut e[last]);
        })
    };
    assert_eq!(
        nat(&|n| if let Expr::Nat { proto_max, .. } = n {
            *proto_max = Some(3)
        }),
        None
    );
    assert_eq!(
        nat(&|n| if let Expr::Nat { kind, .. } = n {
            *kind = 0
        }),
        None
    );
    assert_eq!(
        nat(&|n| if let Expr::Nat { family, .. } = n {
            *family = 10
        }),
        None
    );
    assert_eq!(
        nat(&|n| if let Expr::Nat { flags, .. } = n {
            *flags = Some(0x6)
        }),
        None
    );
    // The port dropped from a single-port DNAT (nft writes it explicitly).
    assert_eq!(
        edit(&|e| {
            e.remove(7);
            if let Some(Expr::Nat {
                proto_min, flags, ..
            }) = e.last_mut()
            {
                (*proto_min, *flags) = (None, None);
            }
        }),
        None
    );
    // A missing verdict, a verdict nft does not write here, an unknown expression.
    assert_eq!(edit(&|e| e.truncate(6)), None);
    assert_eq!(edit(&|e| *e = vec![verdict(-5, None)]), None);
    assert_eq!(edit(&|e| e.insert(2, Expr::Other("log".into()))), None);
    // Truncated bytes, or an attribute that is not a list element.
    let bytes = list_of(&good);
    for cut in [1, 4, 8, bytes.len() / 2, bytes.len() - 4] {
        assert_eq!(decode(V4, &bytes[..bytes.len() - cut]), None, "cut {cut}");
    }
    let mut stray = bytes.clone();
    netlink::put_attr(&mut stray, 2, &[0; 4]);
    assert_eq!(decode(V4, &stray), None);
    // An extra attribute inside an expression (a `meta set`'s sreg).
    let mut extra = Vec::new();
    let elem = netlink::begin_nest(&mut extra, NFTA_LIST_ELEM);
    netlink::put_str(&mut extra, NFTA_EXPR_NAME, "meta");
    let data = netlink::begin_nest(&mut extra, NFTA_EXPR_DATA);
    for (k, v) in [(2u16, META_L4PROTO), (1, 1), (3, 1)] {
        netlink::put_attr(&mut extra, k, &v.to_be_bytes());
    }
    netlink::end_nest(&mut extra, data);
    netlink::end_nest(&mut extra, elem);
    extra.extend(list_of(&good[3..]));
    assert_eq!(decode(V4, &extra), None);
    // The guard's `ct status & dnat` with another bit.
    let guard = layout::guard(V4.routable_loopback().unwrap());
    let mut g = exprs(V4, &guard).unwrap();
    if let Expr::Bitwise { mask, .. } = &mut g[5] {
        mask[0] = 0x10;
    }
    assert_eq!(decode(V4, &list_of(&g)), None);
    // The right rule for the wrong family.
    assert_eq!(decode(V6, &bytes), None);
}

#[test]
fn decode_reads_the_kernels_dump_too() {
    // What `nft --debug=netlink list ruleset` shows the kernel returned for
    // `ip daddr 10.0.0.1 meta l4proto tcp tcp dport 8080 dnat to 10.1.0.2:80`: the nat with
    // addr_max, proto_max and flags 0x3; and for a range to the same ports, flags 0x1.
    let dnat =
        rule("-d 10.0.0.1/32 -p tcp -m tcp --dport 8080 -j DNAT --to-destination 10.1.0.2:80");
    let mut kernel = exprs(V4, &dnat).unwrap();
    let last = kernel.len() - 1;
    kernel[last] = Expr::Nat {
        kind: NAT_DNAT,
        family: 2,
        addr_min: Some(1),
        addr_max: Some(1),
        proto_min: Some(2),
        proto_max: Some(2),
        flags: Some(3),
    };
    let bytes = list_of(&kernel);
    assert_eq!(
        debug_text(V4, &bytes).lines().last(),
        Some(
            "[ nat dnat ip addr_min reg 1 addr_max reg 1 proto_min reg 2 proto_max reg 2 flags 0x3 ]"
        )
    );
    assert_eq!(decode(V4, &bytes), Some(dnat));
    let range =
        rule("-p udp -m udp --dport 8000:8010 -j DNAT --to-destination 10.1.0.2:8000-8010/8000");
    let mut kernel = exprs(V4, &range).unwrap();
    if let Some(Expr::Nat {
        addr_max, flags, ..
    }) = kernel.last_mut()
    {
        (*addr_max, *flags) = (Some(1), Some(1));
    }
    assert_eq!(decode(V4, &list_of(&kernel)), Some(range));
    // A prefix's bitwise with op 0 (kernels dump it), attributes in the kernel's order.
    let prefix = rule("-s 10.0.0.0/9 -j ACCEPT");
    let mut kernel = exprs(V4, &prefix).unwrap();
    if let Expr::Bitwise { op, .. } = &mut kernel[1] {
        *op = Some(0);
    }
    let mut bytes = Vec::new();
    let elem = netlink::begin_nest(&mut bytes, NFTA_LIST_ELEM);
    netlink::put_str(&mut bytes, NFTA_EXPR_NAME, "payload");
    let data = netlink::begin_nest(&mut bytes, NFTA_EXPR_DATA);
    for (k, v) in [(4u16, 4u32), (3, 12), (2, NETWORK), (1, 1)] {
        netlink::put_attr(&mut bytes, k, &v.to_be_bytes());
    }
    netlink::end_nest(&mut bytes, data);
    netlink::end_nest(&mut bytes, elem);
    bytes.extend(list_of(&kernel[1..]));
    assert_eq!(decode(V4, &bytes), Some(prefix));
}

/// xorshift64*: a fixed seed, so a failure repeats.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn coin(&mut self) -> bool {
        self.below(2) == 0
    }
}

fn random_net(rng: &mut Rng, family: Family) -> IpNet {
    let full = usize::from(family.host_prefix());
    let prefix = if rng.coin() {
        full
    } else {
        rng.below(full as u64 + 1) as usize
    };
    let mut bytes: Vec<u8> = (0..full / 8).map(|_| rng.next() as u8).collect();
    for (b, m) in bytes.iter_mut().zip(prefix_mask(prefix, full / 8)) {
        *b &= m;
    }
    IpNet {
        addr: ip_of(&bytes).unwrap(),
        prefix: prefix as u8,
    }
}

fn random_rule(rng: &mut Rng, family: Family) -> Rule {
    let port = |rng: &mut Rng| 1 + rng.below(65535) as u16;
    let protocol = [
        None,
        Some(Protocol::Tcp),
        Some(Protocol::Udp),
        Some(Protocol::Sctp),
    ][rng.below(4) as usize];
    let dports = protocol.filter(|_| rng.coin()).map(|_| {
        let (a, b) = (port(rng), port(rng));
        if rng.coin() {
            PortRange::single(a)
        } else {
            PortRange {
                start: a.min(b),
                end: a.max(b),
            }
        }
    });
    let target = match rng.below(5) {
        0 => Target::Jump(format!("NATLEDGER-{}", rng.below(100))),
        1 => Target::Accept,
        2 => Target::Drop,
        3 => Target::Masquerade,
        _ if protocol.is_some() => {
            let addr = random_net(rng, family).addr;
            let to = match dports {
                Some(r) if !r.is_single() && rng.coin() => DnatTo {
                    addr,
                    ports: r,
                    base: Some(r.start),
                },
                _ => DnatTo {
                    addr,
                    ports: PortRange::single(port(rng)),
                    base: None,
                },
            };
            Target::Dnat(to)
        }
        _ => Target::Masquerade,
    };
    let ct = rng.below(3);
    Rule {
        source: rng.coin().then(|| random_net(rng, family)),
        destination: rng.coin().then(|| random_net(rng, family)),
        not_in_interface: rng
            .coin()
            .then(|| ["lo", "eth0", "veth1234567890a"][rng.below(3) as usize].into()),
        protocol,
        dports,
        dst_local: rng.coin(),
        dnatted: None,
        // At most one of the two conntrack matches, as natledger writes them.
        not_dnatted: ct == 1,
        untracked: ct == 2,
        comment: None,
        target,
    }
}

#[test]
fn random_natledger_shaped_rules_round_trip() {
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    for i in 0..5000 {
        let family = Family::ALL[i % 2];
        let rule = random_rule(&mut rng, family);
        let list = encoded(family, &rule);
        assert_eq!(decode(family, &list).as_ref(), Some(&rule), "{rule:?}");
        // The other family never reads it (addresses and nat family differ), unless the
        // rule names no address at all.
        let addressless = rule.source.is_none()
            && rule.destination.is_none()
            && !matches!(rule.target, Target::Dnat(_));
        let other = Family::ALL[(i + 1) % 2];
        assert_eq!(decode(other, &list).is_some(), addressless, "{rule:?}");
    }
}
