//! How doctor puts packets, addresses, interfaces, ports and targets in words. Each phrase
//! is built from parts that read on their own ("from an address in 10.0.0.0/8", "to port 80
//! of a local address", "that arrive on docker0") and joined by one rule, so no combination
//! of conditions can produce a doubled preposition or a dangling article.

use crate::model::anyrule::{Cond, Match, PortSet, Target};
use crate::model::family::Family;
use crate::model::rule::IpNet;

use crate::analysis::iptables::paths;

/// The packets a rule matches, in words: "tcp packets from an address in 10.0.0.0/8 to port
/// 6667 of a local address that arrive on any interface but docker0".
pub(crate) fn packets(cond: &Match) -> String {
    let mut noun = "packets".to_string();
    let (mut src, mut dst) = (Place::default(), Place::default());
    let mut not_ports = Vec::new();
    let (mut ins, mut outs) = (Vec::new(), Vec::new());
    for c in &cond.conds {
        match c {
            Cond::Protocol { negated, proto } => {
                noun = if *negated {
                    format!("non-{proto} packets")
                } else {
                    format!("{proto} packets")
                }
            }
            Cond::Src { negated, net } => src.net(*negated, net),
            Cond::Dst { negated, net } => dst.net(*negated, net),
            Cond::SrcType { negated, types } => src.types(*negated, types),
            Cond::DstType { negated, types } => dst.types(*negated, types),
            Cond::DPorts {
                negated: true,
                ports,
            } => not_ports.push(ports_text(ports)),
            Cond::InIface { negated, name } => ins.push(interface(*negated, name)),
            Cond::OutIface { negated, name } => outs.push(interface(*negated, name)),
            _ => {}
        }
    }
    // Every positive port condition on the path, as the one set they leave.
    let ports = paths::port_set(cond).map(|r| port_words(&PortSet(r)));
    let ports = match (ports, not_ports.is_empty()) {
        (Some(p), true) => Some(p),
        (Some(p), false) => Some(format!("{p} except {}", not_ports.join(", "))),
        (None, false) => Some(format!("any port but {}", not_ports.join(", "))),
        (None, true) => None,
    };
    let mut out = noun;
    if let Some(from) = src.phrase() {
        out.push_str(" from ");
        out.push_str(&from);
    }
    match (ports, dst.phrase()) {
        (Some(p), Some(a)) => out.push_str(&format!(" to {p} of {a}")),
        (Some(p), None) => out.push_str(&format!(" to {p}")),
        (None, Some(a)) => out.push_str(&format!(" to {a}")),
        (None, None) => {}
    }
    let mut verbs = Vec::new();
    if !ins.is_empty() {
        verbs.push(format!("arrive on {}", ins.join(" and on ")));
    }
    if !outs.is_empty() {
        verbs.push(format!("leave on {}", outs.join(" and on ")));
    }
    if !verbs.is_empty() {
        out.push_str(" that ");
        out.push_str(&verbs.join(" and "));
    }
    out
}

/// The conditions on one end of a packet (source or destination), gathered to be said once.
#[derive(Default)]
struct Place {
    /// An exact address (`-d 10.0.0.1/32`): nothing else needs saying.
    exact: Option<String>,
    /// Positive address types, as adjectives ("local").
    kinds: Vec<String>,
    /// Negated address types ("that is not local").
    not_kinds: Vec<String>,
    /// "in 10.0.0.0/8", "outside 127.0.0.0/8", "other than 10.0.0.1".
    nets: Vec<String>,
}

impl Place {
    fn net(&mut self, negated: bool, net: &IpNet) {
        let host = net.prefix == Family::of(net.addr).host_prefix();
        match (negated, host) {
            (false, true) => self.exact = Some(net.addr.to_string()),
            (false, false) => self.nets.push(format!("in {net}")),
            (true, true) => self.nets.push(format!("other than {}", net.addr)),
            (true, false) => self.nets.push(format!("outside {net}")),
        }
    }

    fn types(&mut self, negated: bool, types: &[String]) {
        let words = types.iter().map(|t| t.to_lowercase()).collect::<Vec<_>>();
        if negated {
            self.not_kinds.push(words.join(" or "));
        } else {
            self.kinds.push(words.join(" or "));
        }
    }

    /// A noun phrase: "10.0.0.1", "a local address", "an address outside 127.0.0.0/8 that is
    /// not local"; `None` when nothing is known.
    fn phrase(&self) -> Option<String> {
        if let Some(exact) = &self.exact {
            return Some(exact.clone());
        }
        if self.kinds.is_empty() && self.not_kinds.is_empty() && self.nets.is_empty() {
            return None;
        }
        let mut words: Vec<String> = self.kinds.clone();
        words.push("address".into());
        words.extend(self.nets.iter().cloned());
        if !self.not_kinds.is_empty() {
            words.push(format!("that is not {}", self.not_kinds.join(" or ")));
        }
        let text = words.join(" ");
        Some(format!("{} {text}", article(&text)))
    }
}

/// "a" or "an" before `word`, by its first letter.
pub(crate) fn article(word: &str) -> &'static str {
    match word.chars().next().map(|c| c.to_ascii_lowercase()) {
        Some('a' | 'e' | 'i' | 'o' | 'u') => "an",
        _ => "a",
    }
}

/// An interface name in words: "docker0", "any interface but docker0", "an interface whose
/// name starts with veth" (`veth+`).
pub(crate) fn interface(negated: bool, name: &str) -> String {
    match (negated, name.strip_suffix('+')) {
        (false, None) => name.to_string(),
        (true, None) => format!("any interface but {name}"),
        (false, Some("")) => "any interface".into(),
        (true, Some("")) => "no interface".into(),
        (false, Some(prefix)) => format!("an interface whose name starts with {prefix}"),
        (true, Some(prefix)) => {
            format!("an interface whose name does not start with {prefix}")
        }
    }
}

/// "port 80", "ports 80,443", "ports 1000-2000".
pub(crate) fn port_words(ports: &PortSet) -> String {
    let one = matches!(ports.0.as_slice(), [(lo, hi)] if lo == hi);
    format!(
        "{} {}",
        if one { "port" } else { "ports" },
        ports_text(ports)
    )
}

/// "80", "80,443", "1000-2000".
pub(crate) fn ports_text(ports: &PortSet) -> String {
    ports
        .0
        .iter()
        .map(|(lo, hi)| {
            if lo == hi {
                lo.to_string()
            } else {
                format!("{lo}-{hi}")
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// A rule's target as a short noun phrase, for parentheses: "DNAT to 10.0.0.2:80".
pub(crate) fn target_text(target: &Target) -> String {
    match target {
        Target::Dnat { to } if !to.is_empty() => format!("DNAT to {to}"),
        Target::Dnat { .. } => "DNAT".into(),
        Target::Redirect { to_ports: Some(p) } => format!("REDIRECT to port {p}"),
        Target::Redirect { to_ports: None } => "REDIRECT".into(),
        Target::Accept => "ACCEPT".into(),
        Target::Drop => "DROP".into(),
        Target::Reject => "REJECT".into(),
        Target::Return => "RETURN".into(),
        Target::Masquerade => "MASQUERADE".into(),
        Target::Snat { to } if !to.is_empty() => format!("SNAT to {to}"),
        Target::Snat { .. } => "SNAT".into(),
        Target::Jump(c) | Target::Goto(c) => format!("jump to {c}"),
        Target::Other(t) if !t.trim().is_empty() => t.clone(),
        Target::Other(_) | Target::None => "no target".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::anyrule::parse_rule;

    fn said(rule: &str) -> String {
        let args: Vec<String> = rule.split_whitespace().map(String::from).collect();
        packets(&parse_rule(&args).0)
    }

    #[test]
    fn interfaces_read_as_english() {
        assert_eq!(said("-i docker0"), "packets that arrive on docker0");
        assert_eq!(
            said("! -i docker0 -p tcp -m tcp --dport 8080"),
            "tcp packets to port 8080 that arrive on any interface but docker0"
        );
        assert_eq!(
            said("-o br-+ ! -i lo"),
            "packets that arrive on any interface but lo and leave on an interface whose name \
             starts with br-"
        );
        assert_eq!(
            interface(true, "veth+"),
            "an interface whose name does not start with veth"
        );
        assert_eq!(interface(false, "+"), "any interface");
    }

    #[test]
    fn addresses_and_ports() {
        assert_eq!(
            said("-p tcp -m addrtype --dst-type LOCAL -m tcp --dport 6667"),
            "tcp packets to port 6667 of a local address"
        );
        assert_eq!(
            said("-p tcp -m addrtype ! --dst-type LOCAL -m tcp --dport 80"),
            "tcp packets to port 80 of an address that is not local"
        );
        assert_eq!(
            said("! -d 127.0.0.0/8 -m addrtype --dst-type LOCAL"),
            "packets to a local address outside 127.0.0.0/8"
        );
        assert_eq!(
            said("-d 10.0.0.1/32 -p udp -m multiport --dports 53,5353"),
            "udp packets to ports 53,5353 of 10.0.0.1"
        );
        assert_eq!(
            said("-s 10.244.0.0/16 -p tcp -m tcp ! --dport 22"),
            "tcp packets from an address in 10.244.0.0/16 to any port but 22"
        );
        assert_eq!(
            said("! -s 10.0.0.1/32 ! -p udp"),
            "non-udp packets from an address other than 10.0.0.1"
        );
        assert_eq!(
            said("-p tcp -m tcp --dport 1000:2000"),
            "tcp packets to ports 1000-2000"
        );
        assert_eq!(said(""), "packets");
        assert_eq!(said("-d fd00::1/128 -p tcp"), "tcp packets to fd00::1");
    }

    #[test]
    fn articles() {
        assert_eq!(article("address"), "an");
        assert_eq!(article("local address"), "a");
        assert_eq!(article("unicast address"), "an");
    }

    #[test]
    fn targets_never_leave_empty_words() {
        assert_eq!(target_text(&Target::Dnat { to: String::new() }), "DNAT");
        assert_eq!(target_text(&Target::Other(String::new())), "no target");
        assert_eq!(
            target_text(&Target::Dnat {
                to: "10.0.0.2:80".into()
            }),
            "DNAT to 10.0.0.2:80"
        );
    }
}
