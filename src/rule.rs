//! The rule model: the rules natledger writes (nat DNAT, MASQUERADE and jumps, filter
//! ACCEPT of the forwarded connections it DNATed) as typed values.
//!
//! [`Rule::to_args`] renders a rule to the argument vector that follows `-A CHAIN` in
//! iptables-restore input. Both backends (legacy and nft) speak the same iptables syntax, and
//! the argument order is the canonical one `*-save` prints (`-s -d -p -m proto --dport
//! -m addrtype -m conntrack -m comment -j`), so a rule read back from a dump compares equal to
//! the rule written. [`Rule::parse_args`] is the inverse; it accepts the options natledger writes and
//! reports anything else as [`RuleParseError::Unsupported`], which callers treat as "not ours".

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use crate::family::Family;
use crate::portspec::{PortRange, Protocol};

/// An address with a prefix length, printed as `*-save` prints it (`10.0.0.1/32`).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct IpNet {
    pub addr: IpAddr,
    pub prefix: u8,
}

impl IpNet {
    pub fn host(addr: IpAddr) -> Self {
        IpNet {
            addr,
            prefix: Family::of(addr).host_prefix(),
        }
    }
}

impl fmt::Display for IpNet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

impl FromStr for IpNet {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: IpAddr = addr.parse().map_err(|_| format!("bad address {s:?}"))?;
        let max = Family::of(addr).host_prefix();
        let prefix = match prefix {
            None => max,
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(|| format!("bad prefix in {s:?}"))?,
        };
        Ok(IpNet { addr, prefix })
    }
}

/// DNAT destination: `addr:ports[/base]` (IPv6 in brackets). With a port range, `base` is the
/// first host port, so host port `base + k` maps to container port `ports.start + k`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DnatTo {
    pub addr: IpAddr,
    pub ports: PortRange,
    pub base: Option<u16>,
}

impl fmt::Display for DnatTo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.addr {
            IpAddr::V4(a) => write!(f, "{a}:")?,
            IpAddr::V6(a) => write!(f, "[{a}]:")?,
        }
        write!(f, "{}", self.ports)?;
        if let Some(base) = self.base {
            write!(f, "/{base}")?;
        }
        Ok(())
    }
}

impl FromStr for DnatTo {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let err = || format!("unsupported DNAT destination {s:?}");
        let (addr, rest) = if let Some(rest) = s.strip_prefix('[') {
            let (a, rest) = rest.split_once("]:").ok_or_else(err)?;
            (a, rest)
        } else {
            s.split_once(':').ok_or_else(err)?
        };
        let addr: IpAddr = addr.parse().map_err(|_| err())?;
        let (ports, base) = match rest.split_once('/') {
            Some((p, b)) => (p, Some(b.parse::<u16>().map_err(|_| err())?)),
            None => (rest, None),
        };
        let ports = PortRange::parse_with(ports, '-').map_err(|_| err())?;
        Ok(DnatTo { addr, ports, base })
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Target {
    /// `-j CHAIN`
    Jump(String),
    Dnat(DnatTo),
    Masquerade,
    Accept,
}

/// `-m conntrack --ctstate DNAT --ctproto P [--ctorigdst HOST] --ctreplsrc ADDR
/// --ctorigdstport PORTS --ctreplsrcport PORTS`: the packets, both directions, of `protocol`
/// connections whose original destination was host port(s) `orig_dst_ports` (on `orig_dst`,
/// when given) and which were DNATed to `repl_src`:`repl_src_ports`, and the ICMP errors
/// about them (conntrack gives those the connection they are about, so path-MTU discovery
/// works; a packet-level `-p P` would miss them). What natledger's filter rule accepts:
/// traffic to the container that no DNAT from that host port made does not match.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Dnatted {
    pub protocol: Protocol,
    pub orig_dst: Option<IpAddr>,
    pub repl_src: IpAddr,
    pub orig_dst_ports: PortRange,
    pub repl_src_ports: PortRange,
}

/// A rule as natledger writes it. Fields are in rendering order.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Rule {
    pub source: Option<IpNet>,
    pub destination: Option<IpNet>,
    pub protocol: Option<Protocol>,
    /// Destination ports; requires `protocol`.
    pub dports: Option<PortRange>,
    /// `-m addrtype --dst-type LOCAL`
    pub dst_local: bool,
    /// `-m conntrack …`.
    pub dnatted: Option<Dnatted>,
    pub comment: Option<String>,
    pub target: Target,
}

/// A port range as iptables prints it in a match (`80`, `80:82`).
fn match_ports(ports: PortRange) -> String {
    if ports.is_single() {
        ports.start.to_string()
    } else {
        format!("{}:{}", ports.start, ports.end)
    }
}

/// Why a rule's arguments are not a natledger-shaped rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuleParseError {
    #[error("unsupported option {0:?}")]
    Unsupported(String),
    #[error("option {0} needs a value")]
    MissingValue(String),
    #[error("bad value {value:?} for {option}: {reason}")]
    BadValue {
        option: String,
        value: String,
        reason: String,
    },
    #[error("rule has no target")]
    NoTarget,
}

impl Rule {
    /// The iptables arguments after `-A CHAIN`, in `*-save` order.
    pub fn to_args(&self) -> Vec<String> {
        let mut args: Vec<String> = Vec::with_capacity(16);
        let mut push = |a: &str, b: String| {
            args.push(a.to_string());
            args.push(b);
        };
        if let Some(s) = self.source {
            push("-s", s.to_string());
        }
        if let Some(d) = self.destination {
            push("-d", d.to_string());
        }
        if let Some(p) = self.protocol {
            push("-p", p.to_string());
            if let Some(ports) = self.dports {
                push("-m", p.to_string());
                push("--dport", match_ports(ports));
            }
        }
        if self.dst_local {
            push("-m", "addrtype".into());
            push("--dst-type", "LOCAL".into());
        }
        if let Some(ct) = self.dnatted {
            // Host addresses print without their prefix length in this match.
            push("-m", "conntrack".into());
            push("--ctstate", "DNAT".into());
            push("--ctproto", ct.protocol.number().to_string());
            if let Some(host) = ct.orig_dst {
                push("--ctorigdst", host.to_string());
            }
            push("--ctreplsrc", ct.repl_src.to_string());
            push("--ctorigdstport", match_ports(ct.orig_dst_ports));
            push("--ctreplsrcport", match_ports(ct.repl_src_ports));
        }
        if let Some(c) = &self.comment {
            push("-m", "comment".into());
            push("--comment", c.clone());
        }
        match &self.target {
            Target::Jump(chain) => push("-j", chain.clone()),
            Target::Dnat(to) => {
                push("-j", "DNAT".into());
                push("--to-destination", to.to_string());
            }
            Target::Masquerade => push("-j", "MASQUERADE".into()),
            Target::Accept => push("-j", "ACCEPT".into()),
        }
        args
    }

    /// Parse the arguments after `-A CHAIN`. Options may come in any order; any option
    /// natledger never writes (negations, interfaces, other matches) is `Unsupported`.
    pub fn parse_args<S: AsRef<str>>(args: &[S]) -> Result<Rule, RuleParseError> {
        let mut rule = Rule {
            source: None,
            destination: None,
            protocol: None,
            dports: None,
            dst_local: false,
            dnatted: None,
            comment: None,
            target: Target::Masquerade,
        };
        let mut jump: Option<String> = None;
        let mut to_destination: Option<DnatTo> = None;
        let mut ct = Conntrack::default();
        let mut it = args.iter().map(AsRef::as_ref);
        while let Some(opt) = it.next() {
            let mut value = || {
                it.next()
                    .ok_or_else(|| RuleParseError::MissingValue(opt.to_string()))
            };
            let bad = |v: &str, reason: String| RuleParseError::BadValue {
                option: opt.to_string(),
                value: v.to_string(),
                reason,
            };
            match opt {
                "-s" | "--source" => {
                    let v = value()?;
                    rule.source = Some(v.parse().map_err(|e| bad(v, e))?);
                }
                "-d" | "--destination" => {
                    let v = value()?;
                    rule.destination = Some(v.parse().map_err(|e| bad(v, e))?);
                }
                "-p" | "--protocol" => {
                    let v = value()?;
                    rule.protocol = Some(v.parse().map_err(|e| bad(v, e))?);
                }
                "-m" | "--match" => {
                    let v = value()?;
                    let known = rule.protocol.map(Protocol::as_str) == Some(v)
                        || v == "addrtype"
                        || v == "conntrack"
                        || v == "comment";
                    if !known {
                        return Err(RuleParseError::Unsupported(format!("-m {v}")));
                    }
                }
                "--dport" | "--destination-port" => {
                    let v = value()?;
                    rule.dports = Some(PortRange::parse_with(v, ':').map_err(|e| bad(v, e))?);
                }
                "--dst-type" => {
                    let v = value()?;
                    if v != "LOCAL" {
                        return Err(RuleParseError::Unsupported(format!("--dst-type {v}")));
                    }
                    rule.dst_local = true;
                }
                "--ctstate" => {
                    let v = value()?;
                    if v != "DNAT" {
                        return Err(RuleParseError::Unsupported(format!("--ctstate {v}")));
                    }
                    ct.state = true;
                }
                "--ctproto" => {
                    let v = value()?;
                    let p = v
                        .parse::<u8>()
                        .ok()
                        .and_then(Protocol::from_number)
                        .or_else(|| v.parse().ok())
                        .ok_or_else(|| bad(v, "not tcp, udp or sctp".into()))?;
                    ct.protocol = Some(p);
                }
                "--ctorigdst" | "--ctreplsrc" => {
                    let v = value()?;
                    let net: IpNet = v.parse().map_err(|e| bad(v, e))?;
                    if net.prefix != Family::of(net.addr).host_prefix() {
                        return Err(RuleParseError::Unsupported(format!("{opt} {v}")));
                    }
                    *if opt == "--ctorigdst" {
                        &mut ct.orig_dst
                    } else {
                        &mut ct.repl_src
                    } = Some(net.addr);
                }
                "--ctorigdstport" | "--ctreplsrcport" => {
                    let v = value()?;
                    let ports = PortRange::parse_with(v, ':').map_err(|e| bad(v, e))?;
                    *if opt == "--ctorigdstport" {
                        &mut ct.orig_dst_ports
                    } else {
                        &mut ct.repl_src_ports
                    } = Some(ports);
                }
                "--comment" => rule.comment = Some(value()?.to_string()),
                "-j" | "--jump" => jump = Some(value()?.to_string()),
                "--to-destination" => {
                    let v = value()?;
                    to_destination = Some(v.parse().map_err(|e| bad(v, e))?);
                }
                other => return Err(RuleParseError::Unsupported(other.to_string())),
            }
        }
        if rule.dports.is_some() && rule.protocol.is_none() {
            return Err(RuleParseError::Unsupported("--dport without -p".into()));
        }
        rule.dnatted = ct.finish()?;
        if rule.dnatted.is_some() && rule.protocol.is_some() {
            // natledger's accept names its protocol in the conntrack match only.
            return Err(RuleParseError::Unsupported("-p with -m conntrack".into()));
        }
        rule.target = match (jump.as_deref(), to_destination) {
            (Some("MASQUERADE"), None) => Target::Masquerade,
            (Some("ACCEPT"), None) => Target::Accept,
            (Some("DNAT"), Some(to)) => Target::Dnat(to),
            (Some("DNAT"), None) => {
                return Err(RuleParseError::MissingValue("--to-destination".into()));
            }
            (Some(chain), None) if is_user_chain_name(chain) => Target::Jump(chain.to_string()),
            (Some(other), _) => return Err(RuleParseError::Unsupported(format!("-j {other}"))),
            (None, _) => return Err(RuleParseError::NoTarget),
        };
        Ok(rule)
    }
}

/// The conntrack options of a rule being parsed: all of natledger's or none.
#[derive(Default)]
struct Conntrack {
    state: bool,
    protocol: Option<Protocol>,
    orig_dst: Option<IpAddr>,
    repl_src: Option<IpAddr>,
    orig_dst_ports: Option<PortRange>,
    repl_src_ports: Option<PortRange>,
}

impl Conntrack {
    fn finish(self) -> Result<Option<Dnatted>, RuleParseError> {
        match self {
            Conntrack {
                state: false,
                protocol: None,
                orig_dst: None,
                repl_src: None,
                orig_dst_ports: None,
                repl_src_ports: None,
            } => Ok(None),
            Conntrack {
                state: true,
                protocol: Some(protocol),
                orig_dst,
                repl_src: Some(repl_src),
                orig_dst_ports: Some(orig_dst_ports),
                repl_src_ports: Some(repl_src_ports),
            } => Ok(Some(Dnatted {
                protocol,
                orig_dst,
                repl_src,
                orig_dst_ports,
                repl_src_ports,
            })),
            _ => Err(RuleParseError::Unsupported(
                "a conntrack match natledger does not write".into(),
            )),
        }
    }
}

/// A user-defined chain name as iptables accepts it (at most 28 characters, no
/// whitespace, not an option).
pub fn is_user_chain_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 28
        && !name.starts_with('-')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        && !matches!(
            name,
            "ACCEPT" | "DROP" | "RETURN" | "QUEUE" | "DNAT" | "SNAT" | "MASQUERADE" | "REDIRECT"
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dnat_rule() -> Rule {
        Rule {
            source: None,
            destination: Some("10.9.0.1".parse().unwrap()),
            protocol: Some(Protocol::Tcp),
            dports: Some(PortRange {
                start: 8000,
                end: 8010,
            }),
            dst_local: false,
            dnatted: None,
            comment: Some("natledger:abc".into()),
            target: Target::Dnat(DnatTo {
                addr: "10.1.0.2".parse().unwrap(),
                ports: PortRange { start: 80, end: 90 },
                base: Some(8000),
            }),
        }
    }

    #[test]
    fn renders_in_save_order() {
        assert_eq!(
            dnat_rule().to_args().join(" "),
            "-d 10.9.0.1/32 -p tcp -m tcp --dport 8000:8010 -m comment --comment natledger:abc \
             -j DNAT --to-destination 10.1.0.2:80-90/8000"
        );
        let v6 = Rule {
            source: Some("fd00::2".parse().unwrap()),
            destination: Some("fd00::2/128".parse().unwrap()),
            protocol: Some(Protocol::Udp),
            dports: Some(PortRange::single(53)),
            dst_local: true,
            dnatted: None,
            comment: None,
            target: Target::Masquerade,
        };
        assert_eq!(
            v6.to_args().join(" "),
            "-s fd00::2/128 -d fd00::2/128 -p udp -m udp --dport 53 -m addrtype --dst-type LOCAL \
             -j MASQUERADE"
        );
    }

    #[test]
    fn parse_is_the_inverse_of_render() {
        let jump = Rule {
            source: None,
            destination: None,
            protocol: None,
            dports: None,
            dst_local: true,
            dnatted: None,
            comment: Some("natledger".into()),
            target: Target::Jump("NATLEDGER-HOSTPORTS".into()),
        };
        let v6 = Rule {
            target: Target::Dnat(DnatTo {
                addr: "fd00::2".parse().unwrap(),
                ports: PortRange::single(80),
                base: None,
            }),
            protocol: Some(Protocol::Sctp),
            ..dnat_rule()
        };
        for rule in [dnat_rule(), jump, v6, accept_rule()] {
            assert_eq!(Rule::parse_args(&rule.to_args()).unwrap(), rule);
        }
    }

    fn accept_rule() -> Rule {
        Rule {
            source: None,
            destination: None,
            protocol: None,
            dports: None,
            dst_local: false,
            dnatted: Some(Dnatted {
                protocol: Protocol::Udp,
                orig_dst: Some("10.78.0.1".parse().unwrap()),
                repl_src: "10.77.0.2".parse().unwrap(),
                orig_dst_ports: PortRange {
                    start: 9000,
                    end: 9002,
                },
                repl_src_ports: PortRange { start: 80, end: 82 },
            }),
            comment: Some("natledger:abc".into()),
            target: Target::Accept,
        }
    }

    #[test]
    fn the_filter_rule_renders_as_both_backends_print_it() {
        // Verbatim from iptables-legacy-save and iptables-nft-save 1.8.9.
        assert_eq!(
            accept_rule().to_args().join(" "),
            "-m conntrack --ctstate DNAT --ctproto 17 --ctorigdst 10.78.0.1 --ctreplsrc 10.77.0.2 \
             --ctorigdstport 9000:9002 --ctreplsrcport 80:82 -m comment --comment natledger:abc \
             -j ACCEPT"
        );
        // Half a conntrack match, another state, or a network is not natledger's.
        for args in [
            "-m conntrack --ctstate DNAT --ctproto 17 --ctorigdstport 53 -j ACCEPT",
            "-m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
            "-m conntrack --ctstate DNAT --ctproto 17 --ctreplsrc 10.77.0.0/24 \
             --ctorigdstport 53 --ctreplsrcport 53 -j ACCEPT",
            "-m conntrack --ctstate DNAT --ctreplsrc 10.77.0.2 --ctorigdstport 53 \
             --ctreplsrcport 53 -j ACCEPT",
            "-m conntrack --ctstate DNAT --ctproto 1 --ctreplsrc 10.77.0.2 --ctorigdstport 53 \
             --ctreplsrcport 53 -j ACCEPT",
        ] {
            let tokens: Vec<&str> = args.split_whitespace().collect();
            assert!(Rule::parse_args(&tokens).is_err(), "{args}");
        }
    }

    #[test]
    fn parses_save_lines_written_by_both_backends() {
        // Verbatim from iptables-legacy-save and iptables-nft-save 1.8.9 (tokenized).
        let line = [
            "-d",
            "fd00::1/128",
            "-p",
            "tcp",
            "-m",
            "tcp",
            "--dport",
            "8000:8002",
            "-m",
            "comment",
            "--comment",
            "natledger abc",
            "-j",
            "DNAT",
            "--to-destination",
            "[fd00::2]:80-82/8000",
        ];
        let rule = Rule::parse_args(&line).unwrap();
        assert_eq!(rule.to_args(), line);
    }

    #[test]
    fn foreign_options_are_unsupported_not_misread() {
        for args in [
            &["!", "-s", "10.0.0.0/8", "-j", "MASQUERADE"][..],
            &["-i", "eth0", "-j", "MASQUERADE"],
            &[
                "-p",
                "tcp",
                "-m",
                "multiport",
                "--dports",
                "80,443",
                "-j",
                "DNAT",
            ],
            &["-m", "mark", "--mark", "0x2000", "-j", "MASQUERADE"],
            &["-j", "REDIRECT", "--to-ports", "80"],
            &[
                "-m",
                "addrtype",
                "--dst-type",
                "LOCAL",
                "-j",
                "DOCKER",
                "--foo",
            ],
            &["-m", "addrtype", "!", "--dst-type", "LOCAL", "-j", "DOCKER"],
        ] {
            assert!(
                matches!(Rule::parse_args(args), Err(RuleParseError::Unsupported(_))),
                "{args:?}"
            );
        }
        assert_eq!(
            Rule::parse_args(&["-s", "10.0.0.0/8"]),
            Err(RuleParseError::NoTarget)
        );
    }

    #[test]
    fn chain_names() {
        assert!(is_user_chain_name("NATLEDGER-HOSTPORTS"));
        assert!(!is_user_chain_name("ACCEPT"));
        assert!(!is_user_chain_name("A-VERY-LONG-CHAIN-NAME-OVER-28"));
        assert!(!is_user_chain_name("-X"));
    }
}
