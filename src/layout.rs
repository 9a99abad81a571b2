//! natledger's footprint in the nat table: its chains, the shared jumps into them, the
//! comment that tags every rule, and the rules one mapping needs.
//!
//! ```text
//! PREROUTING  ─ -m addrtype --dst-type LOCAL ─▶ NATLEDGER-HOSTPORTS   DNAT per mapping,
//! OUTPUT      ─ -m addrtype --dst-type LOCAL ─▶ NATLEDGER-HOSTPORTS   newest first
//! POSTROUTING ──────────────────────────────────▶ NATLEDGER-MASQ      MASQUERADE for the
//!                                                                     localhost and hairpin paths
//! ```
//! The jumps are inserted at the top of the built-in chains and shared by every container;
//! they and the chains are created once and stay (only `sweep --all` removes them). Each
//! container rule carries the comment `natledger:<container-id>`; the jumps carry
//! `natledger`. natledger never writes into a chain it does not own.

use std::net::IpAddr;

use crate::family::Family;
use crate::oci::ContainerId;
use crate::portspec::PortMapping;
use crate::rule::{DnatTo, IpNet, Rule, Target};

pub const DNAT_CHAIN: &str = "NATLEDGER-HOSTPORTS";
pub const MASQ_CHAIN: &str = "NATLEDGER-MASQ";
pub const OWNED_CHAINS: [&str; 2] = [DNAT_CHAIN, MASQ_CHAIN];
pub const SHARED_COMMENT: &str = "natledger";

/// A rule and the chain it lives in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placed {
    pub chain: &'static str,
    pub rule: Rule,
}

/// Whether rules of `chain` are inserted at its top (DNAT: the newest container wins) rather
/// than appended (masquerade, where order does not matter).
pub fn goes_first(chain: &str) -> bool {
    chain == DNAT_CHAIN
}

/// The comment on every rule written for `id`.
pub fn tag(id: &ContainerId) -> String {
    format!("natledger:{id}")
}

/// Every chain natledger creates, in any version, is named `NATLEDGER-…`.
pub const CHAIN_PREFIX: &str = "NATLEDGER-";

/// Whether a chain name is natledger's (this version's chains, or another version's).
pub fn is_owned_chain(name: &str) -> bool {
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
pub fn comment_and_target(args: &[String]) -> (Option<&str>, Option<&str>) {
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
            Some(c) => match c.strip_prefix("natledger:") {
                Some(id) => Owner::Container(id),
                None => Owner::Foreign,
            },
            None => Owner::Foreign,
        };
    }
    let built_in = jumps().iter().any(|(from, _)| *from == chain);
    match (comment, target) {
        (Some(SHARED_COMMENT), Some(to)) if built_in && is_owned_chain(to) => Owner::Jump { to },
        _ => Owner::Foreign,
    }
}

/// The shared jumps from built-in chains into natledger's chains.
pub fn jumps() -> [(&'static str, Rule); 3] {
    let jump = |to: &str, dst_local: bool| Rule {
        source: None,
        destination: None,
        protocol: None,
        dports: None,
        dst_local,
        comment: Some(SHARED_COMMENT.to_string()),
        target: Target::Jump(to.to_string()),
    };
    [
        ("PREROUTING", jump(DNAT_CHAIN, true)),
        ("OUTPUT", jump(DNAT_CHAIN, true)),
        ("POSTROUTING", jump(MASQ_CHAIN, false)),
    ]
}

/// The rules that forward `mapping` to `container` (one family):
/// - DNAT from the host port (range), restricted to the mapping's host address if it has one;
/// - masquerade for hairpin traffic (the container reaching itself through the node);
/// - IPv4 only, when the mapping is reachable on 127.0.0.1: masquerade for loopback sources.
pub fn mapping_rules(id: &ContainerId, mapping: &PortMapping, container: IpAddr) -> Vec<Placed> {
    let family = Family::of(container);
    let comment = Some(tag(id));
    let container_net = IpNet::host(container);
    let base = (!mapping.host_ports.is_single()).then_some(mapping.host_ports.start);
    let dnat = Rule {
        source: None,
        destination: mapping.host_destination().map(IpNet::host),
        protocol: Some(mapping.protocol),
        dports: Some(mapping.host_ports),
        dst_local: false,
        comment: comment.clone(),
        target: Target::Dnat(DnatTo {
            addr: container,
            ports: mapping.container_ports,
            base,
        }),
    };
    let masquerade_from = |source: IpNet| Placed {
        chain: MASQ_CHAIN,
        rule: Rule {
            source: Some(source),
            destination: Some(container_net),
            protocol: Some(mapping.protocol),
            dports: Some(mapping.container_ports),
            dst_local: false,
            comment: comment.clone(),
            target: Target::Masquerade,
        },
    };
    let mut rules = vec![
        Placed {
            chain: DNAT_CHAIN,
            rule: dnat,
        },
        masquerade_from(container_net),
    ];
    if family == Family::Ipv4 && mapping.reachable_from_loopback() {
        let loopback = IpNet {
            addr: IpAddr::from([127, 0, 0, 0]),
            prefix: 8,
        };
        rules.push(masquerade_from(loopback));
    }
    rules
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::portspec::parse_entry;

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
    fn ipv4_mapping_gets_dnat_hairpin_and_localhost_masquerade() {
        let id: ContainerId = "c1".parse().unwrap();
        let rules = mapping_rules(
            &id,
            &parse_entry("8080:80").unwrap(),
            "10.77.0.2".parse().unwrap(),
        );
        let text: Vec<String> = rules.iter().map(args).collect();
        assert_eq!(
            text,
            [
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
    fn ranges_use_the_base_port_and_host_ips_restrict() {
        let id: ContainerId = "c1".parse().unwrap();
        let m = parse_entry("[fd78::1]:9000-9002:80-82/udp").unwrap();
        let rules = mapping_rules(&id, &m, "fd77::2".parse().unwrap());
        assert_eq!(rules.len(), 2, "no loopback masquerade for IPv6");
        assert_eq!(
            args(&rules[0]),
            "NATLEDGER-HOSTPORTS -d fd78::1/128 -p udp -m udp --dport 9000:9002 -m comment \
             --comment natledger:c1 -j DNAT --to-destination [fd77::2]:80-82/9000"
        );
        let m = parse_entry("10.78.0.1:8080:80").unwrap();
        let rules = mapping_rules(&id, &m, "10.77.0.2".parse().unwrap());
        assert_eq!(rules.len(), 2, "not reachable on 127.0.0.1");
    }
}
