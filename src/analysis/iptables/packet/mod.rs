//! What one packet meets: any owner's rule conditions ([`super::matchset`]) tested against a
//! packet whose facts are partly known, with three answers
//! ([`crate::analysis::verdict::Tri`]: yes, no, maybe), and a chain evaluated the way the
//! kernel does it, down to a verdict.
//!
//! [`super::matchset`] answers "does rule A take every packet rule B would?" about two rules;
//! this module answers "does this packet match?" about one rule. Doctor asks it of the filter
//! FORWARD path of a DNAT's forwarded packets ([`fate`]), and create-runtime asks it of other
//! owners' nat rules for the host port it is about to forward.
//!
//! Sound in the same way: `Yes` and `No` only when the packet's known facts decide the
//! condition; anything not modelled (marks, sets, string matches, an unknown interface) is
//! `Maybe`, and a verdict reached through a `Maybe` is not claimed.

use std::net::IpAddr;

use crate::analysis::iptables::matchset;
use crate::analysis::verdict::Tri;
use crate::model::anyrule::{Cond, Match, PortSet};
use crate::model::family::Family;
use crate::model::portspec::PortRange;
use crate::model::rule::IpNet;

mod fate;

pub use fate::{Fate, fate};

/// Where a packet is addressed to, as far as it is known.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Addresses {
    /// Exactly this address.
    Exactly(IpAddr),
    /// Some address in one of these networks, not known which (for a host port: any address
    /// of the node, loopback's whole 127.0.0.0/8 included).
    AnyOf(Vec<IpNet>),
    /// Some address other than this one (a reply to an outside client goes back to the
    /// client, not to the server that sends it).
    Except(IpAddr),
    /// Some address in none of these networks (a neighbour's own source: not loopback).
    Outside(Vec<IpNet>),
    Unknown,
}

impl Addresses {
    /// Whether the address is in `net`.
    pub fn within(&self, net: &IpNet) -> Tri {
        let host = |a: &IpAddr| IpNet::host(*a);
        match self {
            Addresses::Exactly(a) => Tri::from_bool(matchset::net_contains(net, &host(a))),
            Addresses::AnyOf(list) => {
                if list.iter().all(|n| matchset::net_contains(net, n)) {
                    Tri::Yes
                } else if list.iter().all(|n| matchset::net_disjoint(net, n)) {
                    Tri::No
                } else {
                    Tri::Maybe
                }
            }
            Addresses::Except(a) if *net == host(a) => Tri::No,
            Addresses::Outside(list) if list.iter().any(|n| matchset::net_contains(n, net)) => {
                Tri::No
            }
            Addresses::Except(_) | Addresses::Outside(_) | Addresses::Unknown => Tri::Maybe,
        }
    }
}

/// Conntrack's view of the packet's connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conntrack {
    /// The states it certainly has (`NEW`, `ESTABLISHED`, `RELATED`, `INVALID`, `UNTRACKED`,
    /// `DNAT`, `SNAT`); any other state it certainly lacks, except those in `unsure`.
    pub states: Vec<&'static str>,
    /// States that cannot be told (SNAT of a new connection before POSTROUTING, say).
    pub unsure: Vec<&'static str>,
    /// The original direction's destination, and port(s).
    pub orig_dst: Addresses,
    pub orig_dst_ports: Option<PortRange>,
    /// The reply direction's source (where a DNAT sent the connection), and port(s).
    pub repl_src: Option<IpAddr>,
    pub repl_src_ports: Option<PortRange>,
    /// Whether the packet goes in the original direction.
    pub original: bool,
}

/// The facts of one packet. `None` is unknown.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Packet {
    pub family: Family,
    pub protocol: Option<u8>,
    pub src: Addresses,
    pub dst: Addresses,
    pub sport: Option<u16>,
    /// The destination port is one of these.
    pub dports: Option<PortRange>,
    /// Whether the destination is an address of this host (`--dst-type LOCAL`).
    pub dst_local: Option<bool>,
    pub in_iface: Option<String>,
    pub out_iface: Option<String>,
    pub conntrack: Option<Conntrack>,
}

impl Packet {
    /// A packet of `family` of which nothing else is known.
    pub fn unknown(family: Family) -> Packet {
        Packet {
            family,
            protocol: None,
            src: Addresses::Unknown,
            dst: Addresses::Unknown,
            sport: None,
            dports: None,
            dst_local: None,
            in_iface: None,
            out_iface: None,
            conntrack: None,
        }
    }

    /// Whether the packet matches every condition of `m`.
    pub fn test(&self, m: &Match) -> Tri {
        m.conds
            .iter()
            .fold(Tri::Yes, |acc, c| acc.and(self.cond(c)))
    }

    fn cond(&self, c: &Cond) -> Tri {
        match c {
            Cond::Protocol { negated, proto } => {
                match (self.protocol, matchset::proto_number(proto)) {
                    (Some(p), Some(q)) => Tri::from_bool(p == q),
                    _ => Tri::Maybe,
                }
                .negate(*negated)
            }
            Cond::Src { negated, net } => self.src.within(net).negate(*negated),
            Cond::Dst { negated, net } => self.dst.within(net).negate(*negated),
            Cond::InIface { negated, name } => iface(self.in_iface.as_deref(), name, *negated),
            Cond::OutIface { negated, name } => iface(self.out_iface.as_deref(), name, *negated),
            Cond::DPorts { negated, ports } => ports_test(self.dports, ports, *negated),
            Cond::SPorts { negated, ports } => {
                ports_test(self.sport.map(PortRange::single), ports, *negated)
            }
            Cond::DstType { negated, types } => self.dst_type(types).negate(*negated),
            Cond::SrcType { .. } => Tri::Maybe,
            Cond::Other(text) => self.other(text),
        }
    }

    /// `--dst-type`: in IPv4 an address has one type, so a local one matches exactly the sets
    /// naming LOCAL; IPv6 is claimed only for a set of LOCAL alone.
    fn dst_type(&self, types: &[String]) -> Tri {
        let local = types.iter().any(|t| t == "LOCAL");
        match (self.dst_local, self.family) {
            (Some(true), Family::Ipv4) => Tri::from_bool(local),
            (Some(true), Family::Ipv6) if types == ["LOCAL"] => Tri::Yes,
            (Some(false), _) if types == ["LOCAL"] => Tri::No,
            _ => Tri::Maybe,
        }
    }

    /// The opaque conditions this module understands anyway: `-m conntrack` (and the older
    /// `-m state`) with the options natledger, Docker and kube-proxy use.
    fn other(&self, text: &str) -> Tri {
        let Ok(tokens) = crate::model::save::tokenize(text) else {
            return Tri::Maybe;
        };
        let Some(ct) = &self.conntrack else {
            return Tri::Maybe;
        };
        let rest = match tokens.get(..2) {
            Some([m, name]) if m == "-m" && (name == "conntrack" || name == "state") => {
                &tokens[2..]
            }
            _ => return Tri::Maybe,
        };
        let mut answer = Tri::Yes;
        let mut i = 0;
        while i < rest.len() {
            let negated = rest[i] == "!";
            i += usize::from(negated);
            let (Some(option), Some(value)) = (rest.get(i), rest.get(i + 1)) else {
                return Tri::Maybe;
            };
            i += 2;
            let one = match option.as_str() {
                "--ctstate" | "--state" => states_test(ct, value),
                "--ctproto" => match (self.protocol, matchset::proto_number(value)) {
                    (Some(p), Some(q)) => Tri::from_bool(p == q),
                    _ => Tri::Maybe,
                },
                "--ctorigdstport" => range_test(ct.orig_dst_ports, value),
                "--ctreplsrcport" => range_test(ct.repl_src_ports, value),
                "--ctorigdst" => net_test(&ct.orig_dst, value),
                "--ctreplsrc" => net_test(
                    &ct.repl_src.map_or(Addresses::Unknown, Addresses::Exactly),
                    value,
                ),
                "--ctdir" => match value.as_str() {
                    "ORIGINAL" => Tri::from_bool(ct.original),
                    "REPLY" => Tri::from_bool(!ct.original),
                    _ => Tri::Maybe,
                },
                _ => Tri::Maybe,
            };
            answer = answer.and(one.negate(negated));
        }
        answer
    }
}

fn iface(known: Option<&str>, pattern: &str, negated: bool) -> Tri {
    known
        .map_or(Tri::Maybe, |name| {
            Tri::from_bool(match pattern.strip_suffix('+') {
                Some(prefix) => name.starts_with(prefix),
                None => name == pattern,
            })
        })
        .negate(negated)
}

fn ports_test(known: Option<PortRange>, ports: &PortSet, negated: bool) -> Tri {
    let Some(r) = known else {
        return Tri::Maybe;
    };
    let mine = PortSet::new(vec![(r.start, r.end)]);
    let common = mine.intersection(ports);
    let yes = if common.is_empty() {
        Tri::No
    } else if mine.is_subset(ports) {
        Tri::Yes
    } else {
        Tri::Maybe
    };
    yes.negate(negated)
}

fn range_test(known: Option<PortRange>, value: &str) -> Tri {
    match PortRange::parse_with(value, ':') {
        Ok(r) => ports_test(known, &PortSet::new(vec![(r.start, r.end)]), false),
        Err(_) => Tri::Maybe,
    }
}

fn net_test(known: &Addresses, value: &str) -> Tri {
    value
        .parse::<IpNet>()
        .map_or(Tri::Maybe, |net| known.within(&net))
}

fn states_test(ct: &Conntrack, list: &str) -> Tri {
    let listed: Vec<&str> = list.split(',').collect();
    if listed.iter().any(|s| ct.states.contains(s)) {
        Tri::Yes
    } else if listed.iter().any(|s| ct.unsure.contains(s)) {
        Tri::Maybe
    } else {
        Tri::No
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::save::{Dump, parse_dump};

    fn table(text: &str) -> Dump {
        parse_dump(text).unwrap().remove(0)
    }

    /// The first packet of a connection DNATed from host port 8080 to 10.77.0.2:80, arriving
    /// on eth0 and routed out of br0.
    fn dnatted() -> Packet {
        Packet {
            family: Family::Ipv4,
            protocol: Some(6),
            src: Addresses::Unknown,
            dst: Addresses::Exactly("10.77.0.2".parse().unwrap()),
            sport: None,
            dports: Some(PortRange::single(80)),
            dst_local: Some(false),
            in_iface: Some("eth0".into()),
            out_iface: Some("br0".into()),
            conntrack: Some(Conntrack {
                states: vec!["NEW", "DNAT"],
                unsure: vec!["SNAT"],
                orig_dst: Addresses::Unknown,
                orig_dst_ports: Some(PortRange::single(8080)),
                repl_src: Some("10.77.0.2".parse().unwrap()),
                repl_src_ports: Some(PortRange::single(80)),
                original: true,
            }),
        }
    }

    const DOCKER: &str = "*filter\n:FORWARD DROP [0:0]\n:DOCKER - [0:0]\n:DOCKER-USER - [0:0]\n\
        :DOCKER-ISOLATION-STAGE-1 - [0:0]\n:DOCKER-ISOLATION-STAGE-2 - [0:0]\n\
        -A FORWARD -j DOCKER-USER\n-A FORWARD -j DOCKER-ISOLATION-STAGE-1\n\
        -A FORWARD -o docker0 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT\n\
        -A FORWARD -o docker0 -j DOCKER\n-A FORWARD -i docker0 ! -o docker0 -j ACCEPT\n\
        -A FORWARD -i docker0 -o docker0 -j ACCEPT\n\
        -A DOCKER -d 172.17.0.2/32 ! -i docker0 -o docker0 -p tcp -m tcp --dport 80 -j ACCEPT\n\
        -A DOCKER-ISOLATION-STAGE-1 -i docker0 ! -o docker0 -j DOCKER-ISOLATION-STAGE-2\n\
        -A DOCKER-ISOLATION-STAGE-1 -j RETURN\n\
        -A DOCKER-ISOLATION-STAGE-2 -o docker0 -j DROP\n\
        -A DOCKER-ISOLATION-STAGE-2 -j RETURN\n-A DOCKER-USER -j RETURN\n";

    fn fate_of(text: &str, packet: &Packet) -> String {
        let t = table(text);
        let parsed: Vec<_> = t
            .rules
            .iter()
            .map(|r| crate::model::anyrule::parse_rule(&r.args))
            .collect();
        match fate(&t, &parsed, "FORWARD", packet) {
            Fate::Accepted(r) => format!("accepted {}", r.map_or("policy", |r| &r.chain)),
            Fate::Dropped(r) => format!("dropped {}", r.map_or("policy", |r| &r.chain)),
            Fate::Unknown(r) => format!("unknown {} {}", r.chain, r.args.join(" ")),
        }
    }

    #[test]
    fn dockers_forward_drops_what_natledger_does_not_accept() {
        let docker = format!("{DOCKER}COMMIT\n");
        assert_eq!(fate_of(&docker, &dnatted()), "dropped policy");
        let ours = format!(
            "{DOCKER}:NATLEDGER-FORWARD - [0:0]\n\
             -I FORWARD 3 -m comment --comment natledger -j NATLEDGER-FORWARD\n\
             -A NATLEDGER-FORWARD -m conntrack --ctstate DNAT --ctproto 6 --ctreplsrc 10.77.0.2 \
             --ctorigdstport 8080 --ctreplsrcport 80 -m comment --comment natledger:c1 \
             -j ACCEPT\nCOMMIT\n"
        )
        .replace("-I FORWARD 3", "-A FORWARD");
        assert_eq!(fate_of(&ours, &dnatted()), "accepted NATLEDGER-FORWARD");
        // Another container's accept, or another host port's, is not this packet's.
        let other = ours.replace("--ctorigdstport 8080", "--ctorigdstport 8081");
        assert_eq!(fate_of(&other, &dnatted()), "dropped policy");
        // Docker's own published container is accepted through the DOCKER chain.
        let mut to_docker = dnatted();
        to_docker.dst = Addresses::Exactly("172.17.0.2".parse().unwrap());
        to_docker.out_iface = Some("docker0".into());
        assert_eq!(fate_of(&docker, &to_docker), "accepted DOCKER");
    }

    #[test]
    fn what_cannot_be_decided_is_not_claimed() {
        // An accept on an interface the packet may have come in on.
        let text = "*filter\n:FORWARD DROP [0:0]\n-A FORWARD -i ens+ -j ACCEPT\nCOMMIT\n";
        let mut p = dnatted();
        p.in_iface = None;
        assert!(fate_of(text, &p).starts_with("unknown FORWARD -i ens+"));
        p.in_iface = Some("ens3".into());
        assert_eq!(fate_of(text, &p), "accepted FORWARD");
        // A drop that may apply, then an accept: unknown; then the DROP policy: dropped.
        let text = "*filter\n:FORWARD ACCEPT [0:0]\n-A FORWARD -s 192.0.2.0/24 -j DROP\nCOMMIT\n";
        assert!(fate_of(text, &dnatted()).starts_with("unknown"));
        let text = text.replace(":FORWARD ACCEPT", ":FORWARD DROP");
        assert_eq!(fate_of(&text, &dnatted()), "dropped FORWARD");
        // kube-proxy's INVALID drop and a mark match.
        let text = "*filter\n:FORWARD DROP [0:0]\n:KUBE-FORWARD - [0:0]\n\
                    -A FORWARD -j KUBE-FORWARD\n\
                    -A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP\n\
                    -A KUBE-FORWARD -m mark --mark 0x4000/0x4000 -j ACCEPT\nCOMMIT\n";
        assert!(fate_of(text, &dnatted()).starts_with("unknown KUBE-FORWARD -m mark"));
        // A certain drop in a chain jumped to.
        let text = "*filter\n:FORWARD ACCEPT [0:0]\n:X - [0:0]\n-A FORWARD -j X\n\
                    -A X -p tcp -m tcp --dport 80 -j REJECT\nCOMMIT\n";
        assert_eq!(fate_of(text, &dnatted()), "dropped X");
    }

    #[test]
    fn a_branching_ladder_is_evaluated_once_per_chain() {
        // FORWARD → L0, each chain jumping 4 ways (each may apply) to the next, the last
        // deciding nothing for the packet: 4^11 ways through, each ending at the policy.
        let mut text = String::from("*filter\n:FORWARD DROP [0:0]\n");
        for i in 0..12 {
            text += &format!(":L{i} - [0:0]\n");
        }
        text += "-A FORWARD -j L0\n";
        for i in 0..11 {
            for k in 1..=4 {
                text += &format!("-A L{i} -m mark --mark {k:#x}/{k:#x} -j L{}\n", i + 1);
            }
        }
        text += "-A L11 -p udp -j DROP\nCOMMIT\n";
        let started = std::time::Instant::now();
        assert_eq!(fate_of(&text, &dnatted()), "dropped policy");
        // Once per chain is well under a millisecond; once per path, tens of seconds.
        let took = started.elapsed();
        assert!(took < std::time::Duration::from_secs(1), "{took:?}");
    }

    #[test]
    fn conditions_against_a_host_port() {
        let locals: Vec<IpNet> = ["10.78.0.1/32", "127.0.0.0/8"]
            .iter()
            .map(|a| a.parse().unwrap())
            .collect();
        let p = Packet {
            protocol: Some(6),
            dst: Addresses::AnyOf(locals),
            dports: Some(PortRange::single(8080)),
            dst_local: Some(true),
            conntrack: None,
            ..Packet::unknown(Family::Ipv4)
        };
        let test = |args: &str| {
            let args: Vec<String> = args.split_whitespace().map(String::from).collect();
            p.test(&crate::model::anyrule::parse_rule(&args).0)
        };
        assert_eq!(test("-m addrtype --dst-type LOCAL -j DOCKER"), Tri::Yes);
        assert_eq!(
            test("! -i docker0 -p tcp -m tcp --dport 8080 -j DNAT"),
            Tri::Maybe
        );
        assert_eq!(test("-p tcp -m tcp --dport 8081 -j DNAT"), Tri::No);
        assert_eq!(test("-p udp -m udp --dport 8080 -j DNAT"), Tri::No);
        assert_eq!(
            test("-p tcp -m multiport --dports 80,8000:9000 -j X"),
            Tri::Yes
        );
        assert_eq!(
            test("-p tcp -m multiport ! --dports 80,8000:9000 -j X"),
            Tri::No
        );
        // kube-proxy's ClusterIP: not a local address.
        assert_eq!(
            test("-d 10.96.0.10/32 -p tcp -m tcp --dport 8080 -j X"),
            Tri::No
        );
        assert_eq!(test("-d 10.78.0.1/32 -p tcp -j X"), Tri::Maybe);
        assert_eq!(test("-d 10.0.0.0/8 -j X"), Tri::Maybe);
        assert_eq!(test("! -d 127.0.0.0/8 -j X"), Tri::Maybe);
        // Loopback is all of 127.0.0.0/8, not only 127.0.0.1.
        assert_eq!(test("-d 127.0.0.53/32 -p tcp -j X"), Tri::Maybe);
        assert_eq!(test("-m mark --mark 0x1 -j X"), Tri::Maybe);
    }
}
