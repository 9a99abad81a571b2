//! The conntrack side of a change of natledger's DNAT rules: after create-runtime installs a
//! forward, and after poststop, sweep or a dead holder's removal takes one away, the
//! conntrack entries that would keep a UDP or SCTP flow on the old path are deleted
//! ([`crate::kernel::conntrack`]): a client that keeps sending otherwise never reaches the new
//! container, or the host process that listens once the container is gone. TCP is left
//! alone (a connection to a dead container ends; a new one takes the new path).
//!
//! The flows come from the DNAT rules themselves, as recorded or as found in a dump, never
//! from configuration: protocol, host port range, and the host address when the rule has
//! one. A DNAT added takes every flow of its host port ([`of_added`]: the newest holder
//! wins); a DNAT removed only those whose replies come from its target ([`of_rules`],
//! [`of_saved`]), so a stacked holder's flows to the same host port stay where they are
//! (`ops::create::held`).

use crate::kernel::conntrack::Flows;
use crate::model::family::Family;
use crate::model::portspec::Protocol;
use crate::model::rule::{Rule, Target};

use super::Context;

/// The UDP and SCTP flows the removed DNAT rules among `rules` (as read from a dump:
/// arguments after `-A CHAIN`) forwarded, without duplicates; what does not parse as
/// natledger's has none.
pub fn of_saved<'a>(rules: impl IntoIterator<Item = (Family, &'a [String])>) -> Vec<Flows> {
    let parsed: Vec<(Family, Rule)> = rules
        .into_iter()
        .filter_map(|(family, args)| Some((family, Rule::parse_args(args).ok()?)))
        .collect();
    of_rules(parsed.iter().map(|(family, rule)| (*family, rule)))
}

/// The UDP and SCTP flows of the DNAT rules among `rules` just added: every flow to their
/// host ports, wherever it went before, without duplicates.
pub fn of_added<'a>(rules: impl IntoIterator<Item = (Family, &'a Rule)>) -> Vec<Flows> {
    let mut flows: Vec<Flows> = Vec::new();
    for flow in of_rules(rules) {
        let flow = Flows { to: None, ..flow };
        if !flows.contains(&flow) {
            flows.push(flow);
        }
    }
    flows
}

/// The UDP and SCTP flows the removed DNAT rules among `rules` forwarded: those to their
/// host ports whose replies come from their targets, without duplicates. Anything else
/// (masquerade, accept, TCP) has none.
pub fn of_rules<'a>(rules: impl IntoIterator<Item = (Family, &'a Rule)>) -> Vec<Flows> {
    let mut flows: Vec<Flows> = Vec::new();
    for (family, rule) in rules {
        let (Target::Dnat(to), Some(protocol), Some(ports)) =
            (&rule.target, rule.protocol, rule.dports)
        else {
            continue;
        };
        if protocol == Protocol::Tcp {
            continue;
        }
        let flow = Flows {
            family,
            protocol,
            ports,
            host: rule.destination.map(|net| net.addr),
            to: Some(to.addr),
        };
        if !flows.contains(&flow) {
            flows.push(flow);
        }
    }
    flows
}

/// Delete the conntrack entries of `flows`. A failure is a warning naming the flows that may
/// still go to the old path: the rules themselves are right, and the entries expire once
/// their clients pause.
pub fn forget(ctx: &Context, flows: &[Flows]) {
    if let Err(e) = ctx.netfilter.forget_flows(flows) {
        let names: Vec<String> = flows
            .iter()
            .map(|f| {
                let host = f.host.map_or(String::new(), |h| format!("{h} "));
                format!("{}{} port {} ({})", host, f.protocol, f.ports, f.family)
            })
            .collect();
        log::warn!(
            "{}; clients that keep sending to {} may still reach the \
             old destination until they pause",
            crate::causes::Causes(&e),
            names.join(", ")
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::portspec::PortRange;

    fn args(line: &str) -> Vec<String> {
        line.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn udp_and_sctp_dnats_give_flows_tcp_and_the_rest_none() {
        let rules = [
            args(
                "-p udp -m udp --dport 53 -m comment --comment natledger:c1 -j DNAT --to-destination 10.77.0.2:53",
            ),
            args(
                "-d 10.78.0.1/32 -p sctp -m sctp --dport 9000:9002 -m comment --comment natledger:c1 -j DNAT --to-destination 10.77.0.2:80-82/9000",
            ),
            args(
                "-p tcp -m tcp --dport 8080 -m comment --comment natledger:c1 -j DNAT --to-destination 10.77.0.2:80",
            ),
            args(
                "-s 10.77.0.2/32 -d 10.77.0.2/32 -p udp -m udp --dport 53 -m comment --comment natledger:c1 -j MASQUERADE",
            ),
            args(
                "-m conntrack --ctstate DNAT --ctproto 17 --ctreplsrc 10.77.0.2 --ctorigdstport 53 --ctreplsrcport 53 -m comment --comment natledger:c1 -j ACCEPT",
            ),
            args(
                "-p udp -m udp --dport 53 -m comment --comment natledger:c1 -j DNAT --to-destination 10.77.0.2:53",
            ),
        ];
        let flows = of_saved(rules.iter().map(|a| (Family::Ipv4, a.as_slice())));
        assert_eq!(
            flows,
            [
                Flows {
                    family: Family::Ipv4,
                    protocol: Protocol::Udp,
                    ports: PortRange::single(53),
                    host: None,
                    to: Some("10.77.0.2".parse().unwrap()),
                },
                Flows {
                    family: Family::Ipv4,
                    protocol: Protocol::Sctp,
                    ports: PortRange {
                        start: 9000,
                        end: 9002
                    },
                    host: Some("10.78.0.1".parse().unwrap()),
                    to: Some("10.77.0.2".parse().unwrap()),
                },
            ]
        );
    }

    #[test]
    fn an_added_dnat_takes_every_flow_of_its_port_a_removed_one_only_its_own() {
        let rule = |to: &str| {
            Rule::parse_args(&args(&format!(
                "-p udp -m udp --dport 53 -m comment --comment natledger:c1 -j DNAT --to-destination {to}:53"
            )))
            .unwrap()
        };
        let (a, b) = (rule("10.77.0.2"), rule("10.77.0.3"));
        let both = [(Family::Ipv4, &a), (Family::Ipv4, &b)];
        let added = of_added(both);
        assert_eq!(added.len(), 1);
        assert_eq!(added[0].to, None);
        let removed = of_rules(both);
        let to: Vec<_> = removed.iter().map(|f| f.to.unwrap().to_string()).collect();
        assert_eq!(to, ["10.77.0.2", "10.77.0.3"]);
    }
}
