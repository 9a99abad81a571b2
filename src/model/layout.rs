//! natledger's footprint in the nat and filter tables: its chains, the shared jumps into
//! them, the comment that tags every rule, and the rules one mapping needs.
//!
//! ```text
//! nat    PREROUTING  ─ -m addrtype --dst-type LOCAL ─▶ NATLEDGER-HOSTPORTS  DNAT per mapping,
//! nat    OUTPUT      ─ -m addrtype --dst-type LOCAL ─▶ NATLEDGER-HOSTPORTS  newest first
//! nat    POSTROUTING ──────────────────────────────────▶ NATLEDGER-MASQ     MASQUERADE for the
//!                                                                          localhost and hairpin paths
//! filter FORWARD     ─ after the rules already there, ─▶ NATLEDGER-FORWARD  ACCEPT per mapping:
//!                      before a final catch-all drop                       the connections its
//!                                                                          DNAT made, both ways
//! filter INPUT (IPv4) ─ at the top ────────────────────▶ NATLEDGER-INPUT   the localhost guard:
//!                                                                          DROP to 127.0.0.0/8
//!                                                                          from outside the host
//! ```
//! The jumps are shared by every container; they, the chains and the guard are created once
//! and stay (only `sweep --all` removes them). Each container rule carries the comment
//! `natledger:<container-id>`; the jumps and the guard carry `natledger`. natledger never
//! writes into a chain it does not own.
//!
//! The filter rule exists because hosts with Docker (and hardened hosts) set the FORWARD
//! policy to DROP: without it a forwarded port answers from the node but not from outside. It
//! accepts exactly the packets of connections natledger's DNAT made (conntrack state DNAT,
//! original destination port = the host port, reply source = the container's address and
//! port), so nothing else reaches the container that would not have before. It sits after
//! the rules already in FORWARD (Docker's `DOCKER-USER` and isolation jumps, kube-proxy's, an
//! operator's own drops), so they keep deciding for natledger's ports as for anything else;
//! only a final catch-all DROP or REJECT stays below it.
//!
//! The localhost guard exists because the 127.0.0.1 path needs `route_localnet=1` on the
//! interface towards the container, which also lets every neighbour on that interface send
//! to the node's 127.0.0.0/8 (kube-proxy's CVE-2020-8558). It drops a packet to 127.0.0.0/8
//! that did not arrive on `lo` unless conntrack knows it as part of (or an ICMP error about)
//! an established flow or a DNATed one: the replies of the node's own 127.0.0.1 → container
//! connections, de-NATed back to 127.0.0.1, pass; what a neighbour starts does not. It
//! matches the input interface, not a `127.0.0.0/8` source as kube-proxy does: with
//! `route_localnet=1` a neighbour can send from a spoofed 127.x source, but not make the
//! kernel believe the packet came in on `lo`. Everything it drops, the kernel would drop
//! as a martian with `route_localnet=0` (see [`guard`]).

use std::net::IpAddr;

use crate::model::anyrule::{Target as MatchTarget, parse_rule};
use crate::model::capabilities::Capabilities;
use crate::model::family::{Family, IfAddr};
use crate::model::oci::ContainerId;
use crate::model::portspec::PortMapping;
use crate::model::rule::{DnatTo, Dnatted, IpNet, Rule, Target};
use crate::model::save::{Dump, Op};

pub const NAT: &str = "nat";
pub(crate) const FILTER: &str = "filter";
/// The tables natledger writes, in the order create-runtime writes them: the filter accept
/// goes in first, so a DNAT is never in force while its forwarded packets are dropped.
/// Removal goes in the reverse order.
pub const TABLES: [&str; 2] = [FILTER, NAT];

pub const DNAT_CHAIN: &str = "NATLEDGER-HOSTPORTS";
pub(crate) const MASQ_CHAIN: &str = "NATLEDGER-MASQ";
pub(crate) const FORWARD_CHAIN: &str = "NATLEDGER-FORWARD";
pub(crate) const INPUT_CHAIN: &str = "NATLEDGER-INPUT";
pub(crate) const SHARED_COMMENT: &str = "natledger";
/// The interface the node's own packets to its loopback addresses come in on.
pub(crate) const LOOPBACK_INTERFACE: &str = "lo";

/// natledger's chains in `table` of `family` (none in a table it does not write); the
/// localhost guard's only where [`Family::routable_loopback`] has a network; the forward
/// accept's only where the backend writes it ([`Capabilities::forward_accept`]).
pub fn owned_chains(
    caps: impl Into<Capabilities>,
    table: &str,
    family: Family,
) -> Vec<&'static str> {
    let caps = caps.into();
    let mut chains = match table {
        NAT => vec![DNAT_CHAIN, MASQ_CHAIN],
        FILTER => vec![FORWARD_CHAIN, INPUT_CHAIN],
        _ => Vec::new(),
    };
    chains.retain(|c| {
        (*c != FORWARD_CHAIN || caps.forward_accept)
            && (*c != INPUT_CHAIN || family.routable_loopback().is_some())
    });
    chains
}

/// A rule, its table and the chain it lives in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placed {
    pub table: crate::model::table::Table,
    pub chain: &'static str,
    pub rule: Rule,
}

/// Whether rules of `chain` are inserted at its top (DNAT: the newest container wins) rather
/// than appended (masquerade and accept, where order does not matter).
pub(crate) fn goes_first(chain: &str) -> bool {
    chain == DNAT_CHAIN
}

/// What the comment of a container's rule starts with, before the container's id.
const TAG_PREFIX: &str = "natledger:";

/// The comment on every rule written for `id`, `natledger:<id>`: a [`ContainerId`], or the
/// text of one as read back from a rule or a ledger.
pub fn tag(id: &(impl AsRef<str> + ?Sized)) -> String {
    format!("{TAG_PREFIX}{}", id.as_ref())
}

/// Every chain natledger creates, in any version, is named `NATLEDGER-…`.
pub(crate) const CHAIN_PREFIX: &str = "NATLEDGER-";

/// Whether a chain name is natledger's (this version's chains, or another version's).
pub(crate) fn is_owned_chain(name: &str) -> bool {
    name.starts_with(CHAIN_PREFIX)
}

/// Whose a rule in a dump is, as far as natledger can tell from its chain and its comment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Owner<'a> {
    /// In a natledger chain and tagged `natledger:<id>`: written for container `id` (the
    /// text after the colon, not necessarily a valid id).
    Container(&'a str),
    /// In a natledger chain and tagged `natledger`: natledger's, but no container's.
    Shared,
    /// In another chain, tagged `natledger`, jumping to the natledger chain `to`.
    Jump { to: &'a str },
    /// Anything else, including rules in natledger chains that natledger did not tag, and
    /// look-alikes elsewhere (our comment in a foreign chain, a jump without our comment).
    Foreign,
}

/// The comment (`--comment`) and the jump or goto target (`-j`, `-g`) of a saved rule.
pub(crate) fn comment_and_target(args: &[String]) -> (Option<&str>, Option<&str>) {
    let mut comment = None;
    let mut target = None;
    let mut tokens = args.iter();
    while let Some(token) = tokens.next() {
        match token.as_str() {
            "--comment" => comment = tokens.next().map(String::as_str),
            "-j" | "-g" => target = tokens.next().map(String::as_str),
            _ => {}
        }
    }
    (comment, target)
}

/// Classify a saved rule (`args` are the tokens after `-A chain`). Only the comment and the
/// jump target are read, so rules of other natledger versions are recognised too. Jumps are
/// natledger's only in the built-in chains it puts them in.
pub fn owner<'a>(chain: &str, args: &'a [String]) -> Owner<'a> {
    let (comment, target) = comment_and_target(args);
    if is_owned_chain(chain) {
        return match comment {
            Some(SHARED_COMMENT) => Owner::Shared,
            Some(c) => match c.strip_prefix(TAG_PREFIX) {
                Some(id) => Owner::Container(id),
                None => Owner::Foreign,
            },
            None => Owner::Foreign,
        };
    }
    match (comment, target) {
        (Some(SHARED_COMMENT), Some(to)) if JUMPS_FROM.contains(&chain) && is_owned_chain(to) => {
            Owner::Jump { to }
        }
        _ => Owner::Foreign,
    }
}

/// The built-in chains natledger jumps from, in any table and family ([`shared_rules`]).
const JUMPS_FROM: [&str; 5] = ["PREROUTING", "OUTPUT", "POSTROUTING", "FORWARD", "INPUT"];

/// The localhost guard (see the file comment): in `chain` [`INPUT_CHAIN`], which filter
/// INPUT jumps to first, `-d LOOPBACK ! -i lo -m conntrack ! --ctstate DNAT -j DROP`. What
/// it drops reaches INPUT with a loopback destination (after any DNAT) from another
/// interface than `lo`: exactly what the kernel drops as a martian destination with
/// `route_localnet=0`, less what conntrack knows as DNATed (the 127.0.0.1 path's replies).
/// So it never takes away what the host had before natledger. Not `! --ctstate
/// RELATED,ESTABLISHED,DNAT` as kube-proxy's: conntrack does not record the interface a
/// flow came in on, so a neighbour can forge a packet of the node's own loopback flows (a
/// datagram with their tuple, an ICMP error about them) and it would be ESTABLISHED or
/// RELATED.
pub fn guard(loopback: IpNet) -> Rule {
    Rule {
        destination: Some(loopback),
        not_in_interface: Some(LOOPBACK_INTERFACE.to_string()),
        not_dnatted: true,
        comment: Some(SHARED_COMMENT.to_string()),
        ..Rule::unconditional(Target::Drop)
    }
}

/// The nftables backend's second guard rule, after [`guard`] in its chain: `-d LOOPBACK ! -i
/// lo -m conntrack --ctstate INVALID,UNTRACKED -j DROP` (`ct state invalid,untracked drop`).
/// nf_tables' `ct status` has no value for a packet conntrack does not track, so [`guard`]'s
/// `ct status ! dnat` does not match it there, where iptables' `! --ctstate DNAT` does (such
/// a packet has no DNAT state): an invalid packet (an ICMP error about a flow conntrack has
/// forgotten, say) or one a `notrack` rule exempted. This rule drops exactly those, so the
/// two rules drop what the iptables guard drops.
pub fn guard_untracked(loopback: IpNet) -> Rule {
    Rule {
        not_dnatted: false,
        untracked: true,
        ..guard(loopback)
    }
}

/// The shared rules of `table` in `family`, each with its chain: the jumps from built-in
/// chains into natledger's chains, and the localhost guard in its own chain. Created with
/// the chains, checked on every create, removed only by `sweep --all`; a jump goes where
/// [`jump_op`] says, the guard at the top of its chain.
pub fn shared_rules(
    caps: impl Into<Capabilities>,
    table: &str,
    family: Family,
) -> Vec<(&'static str, Rule)> {
    let caps = caps.into();
    let jump = |to: &str, dst_local: bool| Rule {
        dst_local,
        comment: Some(SHARED_COMMENT.to_string()),
        ..Rule::unconditional(Target::Jump(to.to_string()))
    };
    match table {
        NAT => vec![
            ("PREROUTING", jump(DNAT_CHAIN, true)),
            ("OUTPUT", jump(DNAT_CHAIN, true)),
            ("POSTROUTING", jump(MASQ_CHAIN, false)),
        ],
        FILTER => {
            let mut rules = Vec::new();
            if caps.forward_accept {
                rules.push(("FORWARD", jump(FORWARD_CHAIN, false)));
            }
            if let Some(loopback) = family.routable_loopback() {
                rules.push(("INPUT", jump(INPUT_CHAIN, false)));
                // Each goes in at the top of the chain: the second rule first, so the chain
                // reads guard, then second rule.
                if caps.untracked_guard {
                    rules.push((INPUT_CHAIN, guard_untracked(loopback)));
                }
                rules.push((INPUT_CHAIN, guard(loopback)));
            }
            rules
        }
        _ => Vec::new(),
    }
}

/// Where a shared jump goes in its built-in chain, given the table as it is now: the op
/// that puts it there. The nat jumps go at the top (natledger's DNAT must come first). The
/// FORWARD jump goes after every rule already there that could decide the packet (Docker's
/// `DOCKER-USER` and isolation jumps, kube-proxy's, an operator's blocklist), so that they
/// keep deciding; only a trailing catch-all DROP or REJECT (RHEL's `-j REJECT`) stays after
/// it, since with that nothing below would ever be reached.
pub(crate) fn jump_op(table: &Dump, from: &str, args: Vec<String>) -> Op {
    if from != "FORWARD" {
        return Op::InsertFirst(from.to_string(), args);
    }
    let rules: Vec<_> = table.rules_in(from).collect();
    let catch_all = rules
        .iter()
        .rev()
        .take_while(|r| {
            let (m, target) = parse_rule(&r.args);
            m.conds.is_empty() && matches!(target, MatchTarget::Drop | MatchTarget::Reject)
        })
        .count();
    if catch_all == 0 {
        Op::Append(from.to_string(), args)
    } else {
        Op::InsertAt(from.to_string(), rules.len() - catch_all + 1, args)
    }
}

/// The rules that forward `mapping` to `container` (one family):
/// - DNAT from the host port (range), restricted to the mapping's host address if it has one;
/// - masquerade for hairpin traffic: when the container's subnet is known
///   ([`IfAddr::subnet`]), of the connections that DNAT made from anywhere in that subnet
///   (another container on its bridge, or itself, reaching the host port: without
///   br_netfilter the reply would go straight back over the bridge, never de-NATed); without
///   one, of the container reaching itself (its own address);
/// - where the family has a routable loopback (IPv4), when the mapping is reachable on
///   127.0.0.1: masquerade for loopback sources;
/// - in filter, the accept of the forwarded packets of the connections that DNAT made.
///
/// The same number of rules either way, so `portspec::bounds` holds for both.
pub fn mapping_rules(
    caps: impl Into<Capabilities>,
    id: &ContainerId,
    mapping: &PortMapping,
    container: impl Into<IfAddr>,
) -> Vec<Placed> {
    let caps = caps.into();
    let container = container.into();
    let subnet = container.subnet();
    let container = container.addr;
    let family = Family::of(container);
    let comment = Some(tag(id));
    let container_net = IpNet::host(container);
    let dnat = dnat_rule(mapping, container, comment.clone());
    let dnatted = dnatted_by(mapping, container);
    let masquerade_from = |source: IpNet, dnatted: Option<Dnatted>| Placed {
        table: crate::model::table::Table::Nat,
        chain: MASQ_CHAIN,
        rule: Rule {
            source: Some(source),
            destination: Some(container_net),
            protocol: Some(mapping.protocol),
            dports: Some(mapping.container_ports),
            dnatted,
            comment: comment.clone(),
            ..Rule::unconditional(Target::Masquerade)
        },
    };
    let accept = Rule {
        dnatted: Some(dnatted),
        comment: comment.clone(),
        ..Rule::unconditional(Target::Accept)
    };
    let mut rules = Vec::with_capacity(4);
    if caps.forward_accept {
        rules.push(Placed {
            table: crate::model::table::Table::Filter,
            chain: FORWARD_CHAIN,
            rule: accept,
        });
    }
    // Only DNATed connections from the subnet: with br_netfilter on, a neighbour's direct
    // connection to the container passes POSTROUTING too, and keeps its source.
    let hairpin = match subnet {
        Some(subnet) => masquerade_from(subnet, Some(dnatted)),
        None => masquerade_from(container_net, None),
    };
    rules.extend([
        Placed {
            table: crate::model::table::Table::Nat,
            chain: DNAT_CHAIN,
            rule: dnat,
        },
        hairpin,
    ]);
    if let (Some(loopback), true) = (
        family.routable_loopback(),
        mapping.reachable_from_loopback(),
    ) {
        rules.push(masquerade_from(loopback, None));
    }
    rules
}

/// The DNAT of `mapping` to `container`.
fn dnat_rule(mapping: &PortMapping, container: IpAddr, comment: Option<String>) -> Rule {
    let base = (!mapping.host_ports.is_single()).then_some(mapping.host_ports.start);
    Rule {
        destination: mapping.host_destination().map(IpNet::host),
        protocol: Some(mapping.protocol),
        dports: Some(mapping.host_ports),
        comment,
        ..Rule::unconditional(Target::Dnat(DnatTo {
            addr: container,
            ports: mapping.container_ports,
            base,
        }))
    }
}

/// The connections the DNAT of `mapping` to `container` made.
fn dnatted_by(mapping: &PortMapping, container: IpAddr) -> Dnatted {
    Dnatted {
        protocol: mapping.protocol,
        orig_dst: mapping.host_destination(),
        repl_src: container,
        orig_dst_ports: mapping.host_ports,
        repl_src_ports: mapping.container_ports,
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::*;
    use crate::model::backend_name::Backend;
    use crate::model::portspec::parse_entry;

    fn args(p: &Placed) -> String {
        format!("{} {}", p.chain, p.rule.to_args().join(" "))
    }

    fn owner_of(chain: &str, line: &str) -> Owner<'static> {
        let args: Vec<String> = line.split_whitespace().map(String::from).collect();
        let args: &'static [String] = Box::leak(args.into_boxed_slice());
        owner(chain, args)
    }

    #[test]
    fn ownership_comes_from_the_chain_and_the_comment() {
        let dnat = "-p tcp -m tcp --dport 80 -m comment --comment natledger:c1 -j DNAT \
                    --to-destination 10.77.0.2:80";
        assert_eq!(owner_of(DNAT_CHAIN, dnat), Owner::Container("c1"));
        assert_eq!(owner_of("NATLEDGER-OLD", dnat), Owner::Container("c1"));
        // Our comment outside our chains, or our chain name as a substring: not ours.
        assert_eq!(owner_of("DOCKER", dnat), Owner::Foreign);
        assert_eq!(owner_of("NATLEDGERISH", dnat), Owner::Foreign);
        let similar = "-p tcp -m comment --comment natledger-c1 -j DNAT --to-destination 1.2.3.4";
        assert_eq!(owner_of(DNAT_CHAIN, similar), Owner::Foreign);
        assert_eq!(owner_of(DNAT_CHAIN, "-p tcp -j ACCEPT"), Owner::Foreign);
        let jump =
            "-m addrtype --dst-type LOCAL -m comment --comment natledger -j NATLEDGER-HOSTPORTS";
        assert_eq!(owner_of("PREROUTING", jump), Owner::Jump { to: DNAT_CHAIN });
        assert_eq!(
            owner_of(MASQ_CHAIN, "-m comment --comment natledger -j RETURN"),
            Owner::Shared
        );
        // A jump into our chain without our comment is someone else's.
        assert_eq!(
            owner_of("PREROUTING", "-j NATLEDGER-HOSTPORTS"),
            Owner::Foreign
        );
        // A comment whose text is "-j" does not confuse the reader.
        assert_eq!(
            owner_of("PREROUTING", "-m comment --comment -j -j NATLEDGER-MASQ"),
            Owner::Foreign
        );
    }

    #[test]
    fn the_localhost_guard_is_shared_ipv4_only_and_recognised() {
        let text = |table: &str, family: Family| -> Vec<String> {
            shared_rules(Backend::IptablesNft, table, family)
                .iter()
                .map(|(chain, rule)| format!("{chain} {}", rule.to_args().join(" ")))
                .collect()
        };
        assert_eq!(
            text(FILTER, Family::Ipv4),
            [
                "FORWARD -m comment --comment natledger -j NATLEDGER-FORWARD",
                "INPUT -m comment --comment natledger -j NATLEDGER-INPUT",
                "NATLEDGER-INPUT -d 127.0.0.0/8 ! -i lo -m conntrack ! --ctstate \
                 DNAT -m comment --comment natledger -j DROP",
            ]
        );
        assert_eq!(
            text(FILTER, Family::Ipv6),
            ["FORWARD -m comment --comment natledger -j NATLEDGER-FORWARD"]
        );
        assert_eq!(
            owned_chains(Backend::IptablesNft, FILTER, Family::Ipv4),
            [FORWARD_CHAIN, INPUT_CHAIN]
        );
        assert_eq!(
            owned_chains(Backend::IptablesNft, FILTER, Family::Ipv6),
            [FORWARD_CHAIN]
        );
        assert_eq!(text(NAT, Family::Ipv4), text(NAT, Family::Ipv6));
        // Every shared rule is recognised as natledger's: a jump, or shared in its chain.
        for family in Family::ALL {
            for table in TABLES {
                for (chain, rule) in shared_rules(Backend::IptablesNft, table, family) {
                    let args = rule.to_args();
                    let owner = owner(chain, Box::leak(args.into_boxed_slice()));
                    match rule.target {
                        Target::Jump(_) => assert!(matches!(owner, Owner::Jump { .. }), "{chain}"),
                        _ => assert_eq!(owner, Owner::Shared, "{chain}"),
                    }
                }
            }
        }
        // Our comment on a look-alike in INPUT, or a guard-like rule without it: not ours.
        assert_eq!(
            owner_of("INPUT", "-m comment --comment natledger -j KUBE-FIREWALL"),
            Owner::Foreign
        );
        assert_eq!(
            owner_of(
                INPUT_CHAIN,
                "-d 127.0.0.0/8 ! -i lo -m conntrack ! --ctstate DNAT -j DROP"
            ),
            Owner::Foreign
        );
    }

    #[test]
    fn ipv4_mapping_gets_dnat_hairpin_and_localhost_masquerade() {
        let id: ContainerId = "c1".parse().unwrap();
        let rules = mapping_rules(
            Backend::IptablesNft,
            &id,
            &parse_entry("8080:80").unwrap(),
            "10.77.0.2".parse::<IpAddr>().unwrap(),
        );
        let text: Vec<String> = rules.iter().map(args).collect();
        assert_eq!(
            text,
            [
                "NATLEDGER-FORWARD -m conntrack --ctstate DNAT --ctproto 6 --ctreplsrc 10.77.0.2 \
                 --ctorigdstport 8080 --ctreplsrcport 80 -m comment --comment natledger:c1 \
                 -j ACCEPT",
                "NATLEDGER-HOSTPORTS -p tcp -m tcp --dport 8080 -m comment --comment natledger:c1 \
                 -j DNAT --to-destination 10.77.0.2:80",
                "NATLEDGER-MASQ -s 10.77.0.2/32 -d 10.77.0.2/32 -p tcp -m tcp --dport 80 -m comment \
                 --comment natledger:c1 -j MASQUERADE",
                "NATLEDGER-MASQ -s 127.0.0.0/8 -d 10.77.0.2/32 -p tcp -m tcp --dport 80 -m comment \
                 --comment natledger:c1 -j MASQUERADE",
            ]
        );
    }

    #[test]
    fn a_known_subnet_masquerades_its_dnatted_connections_instead() {
        let id: ContainerId = "c1".parse().unwrap();
        let at = |addr: &str, prefix: u8| IfAddr {
            addr: addr.parse().unwrap(),
            prefix: Some(prefix),
        };
        let rules = mapping_rules(
            Backend::IptablesNft,
            &id,
            &parse_entry("8080:80").unwrap(),
            at("10.77.0.2", 24),
        );
        // The hairpin rule in place of the bare address's, the same count.
        assert_eq!(rules.len(), 4);
        assert_eq!(
            args(&rules[2]),
            "NATLEDGER-MASQ -s 10.77.0.0/24 -d 10.77.0.2/32 -p tcp -m tcp --dport 80 \
             -m conntrack --ctstate DNAT --ctproto 6 --ctreplsrc 10.77.0.2 --ctorigdstport 8080 \
             --ctreplsrcport 80 -m comment --comment natledger:c1 -j MASQUERADE"
        );
        let m = parse_entry("[fd78::1]:9000-9002:80-82/udp").unwrap();
        let rules = mapping_rules(Backend::OwnNftables, &id, &m, at("fd77::2", 64));
        assert_eq!(rules.len(), 2);
        assert_eq!(
            args(&rules[1]),
            "NATLEDGER-MASQ -s fd77::/64 -d fd77::2/128 -p udp -m udp --dport 80:82 \
             -m conntrack --ctstate DNAT --ctproto 17 --ctorigdst fd78::1 --ctreplsrc fd77::2 \
             --ctorigdstport 9000:9002 --ctreplsrcport 80:82 -m comment --comment natledger:c1 \
             -j MASQUERADE"
        );
        // A /0 or link-local address has no subnet: the container's own address, as before.
        let m = parse_entry("8080:80").unwrap();
        for (addr, prefix) in [("10.77.0.2", 0), ("fe80::2", 64)] {
            let rules = mapping_rules(Backend::IptablesNft, &id, &m, at(addr, prefix));
            let bare = mapping_rules(
                Backend::IptablesNft,
                &id,
                &m,
                addr.parse::<IpAddr>().unwrap(),
            );
            assert_eq!(rules, bare, "{addr}/{prefix}");
        }
    }

    #[test]
    fn ranges_use_the_base_port_and_host_ips_restrict() {
        let id: ContainerId = "c1".parse().unwrap();
        let m = parse_entry("[fd78::1]:9000-9002:80-82/udp").unwrap();
        let rules = mapping_rules(
            Backend::IptablesNft,
            &id,
            &m,
            "fd77::2".parse::<IpAddr>().unwrap(),
        );
        assert_eq!(rules.len(), 3, "no loopback masquerade for IPv6");
        assert_eq!(
            args(&rules[0]),
            "NATLEDGER-FORWARD -m conntrack --ctstate DNAT --ctproto 17 --ctorigdst fd78::1 \
             --ctreplsrc fd77::2 --ctorigdstport 9000:9002 --ctreplsrcport 80:82 -m comment \
             --comment natledger:c1 -j ACCEPT"
        );
        assert_eq!(
            args(&rules[1]),
            "NATLEDGER-HOSTPORTS -d fd78::1/128 -p udp -m udp --dport 9000:9002 -m comment \
             --comment natledger:c1 -j DNAT --to-destination [fd77::2]:80-82/9000"
        );
        let m = parse_entry("10.78.0.1:8080:80").unwrap();
        let rules = mapping_rules(
            Backend::IptablesNft,
            &id,
            &m,
            "10.77.0.2".parse::<IpAddr>().unwrap(),
        );
        assert_eq!(rules.len(), 3, "not reachable on 127.0.0.1");
        assert_eq!(rules.iter().filter(|p| p.table == FILTER).count(), 1);
    }

    #[test]
    fn the_forward_jump_goes_after_the_rules_there_before_a_final_drop() {
        let table = |rules: &str| {
            let text = format!("*filter\n:FORWARD DROP [0:0]\n{rules}COMMIT\n");
            crate::model::save::parse_dump(&text).unwrap().remove(0)
        };
        let rendered = |t: &Dump, from: &str| {
            let mut batch = crate::model::save::Batch::new("filter");
            batch
                .ops
                .push(jump_op(t, from, vec!["-j".into(), "X".into()]));
            batch.render().lines().nth(1).unwrap().to_string()
        };
        assert_eq!(rendered(&table(""), "FORWARD"), "-A FORWARD -j X");
        // Docker 20.10's FORWARD: after all of it.
        let docker = "-A FORWARD -j DOCKER-USER\n-A FORWARD -j DOCKER-ISOLATION-STAGE-1\n\
                      -A FORWARD -o docker0 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT\n\
                      -A FORWARD -o docker0 -j DOCKER\n";
        assert_eq!(rendered(&table(docker), "FORWARD"), "-A FORWARD -j X");
        // An operator's blocklist stays above; RHEL's final REJECT below.
        let rhel = "-A FORWARD -s 192.0.2.0/24 -j DROP\n\
                    -A FORWARD -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT\n\
                    -A FORWARD -j REJECT --reject-with icmp-host-prohibited\n";
        assert_eq!(rendered(&table(rhel), "FORWARD"), "-I FORWARD 3 -j X");
        let two = format!("{rhel}-A FORWARD -m comment --comment last -j DROP\n");
        assert_eq!(rendered(&table(&two), "FORWARD"), "-I FORWARD 3 -j X");
        assert_eq!(
            rendered(&table(docker), "PREROUTING"),
            "-I PREROUTING 1 -j X"
        );
    }
}
