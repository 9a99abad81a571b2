//! The readers leave a rule undecoded, looking for what a packet to this host meets, only
//! when its destination is provably elsewhere: realistic rulesets of other owners (those of
//! `readers`) loaded with `iptables-legacy-restore` and `iptables-nft-restore` in a private
//! namespace, every rule skipped checked against its `*-save` line.

use crate::common::{Backend, Topology, in_netns, load_rules};
use crate::readers::{V4_NAT, V6_NAT, read_native, test_family};
use natledger::kernel::iptc::{self, render};
use natledger::kernel::netlink::Socket;
use natledger::kernel::nftables::Session;
use natledger::model::family::{Family, IpNet};

/// Whether two networks of one family share an address: equal in the bits both fix.
fn overlap(a: &IpNet, b: &IpNet) -> bool {
    let bits = |n: &IpNet| match n.addr {
        std::net::IpAddr::V4(v) => (u128::from(u32::from(v)) << 96, n.prefix),
        std::net::IpAddr::V6(v) => (u128::from(v), n.prefix),
    };
    let ((x, p), (y, q)) = (bits(a), bits(b));
    let fixed = u128::MAX
        .checked_shl(128 - u32::from(p.min(q)))
        .unwrap_or(0);
    x & fixed == y & fixed
}

/// Both readers skip a rule undecoded, looking for what a packet to this host meets, only
/// when its destination provably is elsewhere: every rule skipped has, as `*-save` prints it
/// (which the native reading equals, above), a `-d` that is not negated and shares no
/// address with the host's; prefixes, negations and rules without `-d` are read.
#[test]
fn only_rules_for_other_destinations_are_skipped_undecoded() {
    for backend in [Backend::IptablesLegacy, Backend::IptablesNft] {
        let topo = Topology::new();
        let ns = topo.node().to_string();
        let mut skipped = 0;
        for family in Family::ALL {
            let (text, host) = match family {
                Family::Ipv4 => (
                    V4_NAT,
                    &["127.0.0.0/8", "10.1.2.200/32", "172.17.0.1/32"][..],
                ),
                Family::Ipv6 => (V6_NAT, &["::1/128", "2001:db8:2:3::1/128"][..]),
            };
            load_rules(&ns, backend, test_family(family), text);
            let host: Vec<IpNet> = host.iter().map(|n| n.parse().unwrap()).collect();
            let all = read_native(&ns, backend, family, "nat");
            let kept: Vec<(String, usize)> = in_netns(&ns, || {
                let mut kept = Vec::new();
                match backend {
                    Backend::IptablesLegacy => {
                        let blob = iptc::read(family, "nat").unwrap();
                        for (chain, _) in render::chains(&blob) {
                            let span = blob.chain(&chain).unwrap();
                            for (i, (_, e)) in blob.rules(span).enumerate() {
                                if render::may_be_for(&blob, e, &host) {
                                    kept.push((chain.clone(), i + 1));
                                }
                            }
                        }
                    }
                    Backend::OwnNftables => unreachable!("iptables backends only"),
                    Backend::IptablesNft => {
                        let mut sock = Socket::netfilter().unwrap();
                        let mut session = Session::new(&mut sock);
                        for chain in session.chains(family, "nat").unwrap() {
                            let name = chain.name;
                            session
                                .each_rule(family, "nat", &name, Some(&host), |at, _, _| {
                                    kept.push((name.clone(), at))
                                })
                                .unwrap();
                        }
                    }
                }
                kept
            });
            let mut position = (String::new(), 0);
            for (chain, args) in &all.rules {
                position = match position.0 == *chain {
                    true => (position.0, position.1 + 1),
                    false => (chain.clone(), 1),
                };
                if kept.contains(&position) {
                    continue;
                }
                skipped += 1;
                let line = format!("{} {family}: -A {chain} {}", backend.name(), args.join(" "));
                let at = args.iter().position(|a| a == "-d").expect(&line);
                assert!(at == 0 || args[at - 1] != "!", "{line}");
                let net: IpNet = args[at + 1].parse().unwrap();
                assert!(!host.iter().any(|h| overlap(&net, h)), "{line}");
            }
        }
        assert!(skipped >= 4, "{}: {skipped} skipped", backend.name());
    }
}
