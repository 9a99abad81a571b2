//! The rule model: the rules natledger writes (nat DNAT, MASQUERADE and jumps, filter
//! ACCEPT of the forwarded connections it DNATed, and the localhost guard's DROP) as typed
//! values.
//!
//! [`Rule::to_args`] renders a rule to the argument vector that follows `-A CHAIN` in
//! iptables-restore input. Both backends (legacy and nft) speak the same iptables syntax, and
//! the argument order is the canonical one `*-save` prints (`-s -d ! -i -p -m proto --dport
//! -m addrtype -m conntrack -m comment -j`), so a rule read back from a dump compares equal to
//! the rule written. [`Rule::parse_args`] is the inverse; it accepts the options natledger writes and
//! reports anything else as [`RuleParseError::Unsupported`], which callers treat as "not ours".

use crate::model::family::Family;
use crate::model::portspec::{PortRange, Protocol};

mod conntrack;
mod net;

pub use crate::model::family::IpNet;
use conntrack::Conntrack;
pub use conntrack::Dnatted;
pub use net::DnatTo;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Target {
    /// `-j CHAIN`
    Jump(String),
    Dnat(DnatTo),
    Masquerade,
    Accept,
    Drop,
}

/// The conntrack state `-m conntrack ! --ctstate` names in the localhost guard: a packet of
/// a flow some DNAT rewrote, either way (a reply, an ICMP error about it included). Not
/// ESTABLISHED or RELATED: conntrack does not know the interface a flow came in on, so a
/// neighbour could forge a packet of the node's own loopback flows.
pub(crate) const DNATTED_STATE: &str = "DNAT";

/// The conntrack states `-m conntrack --ctstate` names in the nftables backend's second guard
/// rule: a packet conntrack does not track (invalid: no entry could be found or made;
/// untracked: a `notrack` rule). nf_tables' `ct status` has no value for such a packet, so
/// the first rule (`! --ctstate DNAT`, `ct status ! dnat`) does not match it there, where
/// iptables' conntrack match does (the layout's `guard_untracked`).
pub(crate) const UNTRACKED_STATE: &str = "INVALID,UNTRACKED";

/// A rule as natledger writes it. Fields are in rendering order.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Rule {
    pub source: Option<IpNet>,
    pub destination: Option<IpNet>,
    /// `! -i NAME`: received on another interface than NAME (iptables prints `-i` after
    /// `-d`).
    pub not_in_interface: Option<String>,
    pub protocol: Option<Protocol>,
    /// Destination ports; requires `protocol`.
    pub dports: Option<PortRange>,
    /// `-m addrtype --dst-type LOCAL`
    pub dst_local: bool,
    /// `-m conntrack --ctstate DNAT …`: the forward accept's only condition, and the hairpin
    /// masquerade's beside `-p` and `--dport`.
    pub dnatted: Option<Dnatted>,
    /// `-m conntrack ! --ctstate DNAT`: a packet of a flow no DNAT rewrote (any packet of it,
    /// an ICMP error about it, an invalid or untracked one). Never together with
    /// `dnatted`.
    pub not_dnatted: bool,
    /// `-m conntrack --ctstate INVALID,UNTRACKED` ([`UNTRACKED_STATE`]). Never together
    /// with `dnatted` or `not_dnatted`.
    pub untracked: bool,
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
    /// Every packet to `target`: no condition, no comment. The other fields are set with
    /// struct update syntax (`Rule { comment, ..Rule::unconditional(target) }`).
    pub(crate) fn unconditional(target: Target) -> Rule {
        Rule {
            source: None,
            destination: None,
            not_in_interface: None,
            protocol: None,
            dports: None,
            dst_local: false,
            dnatted: None,
            not_dnatted: false,
            untracked: false,
            comment: None,
            target,
        }
    }

    /// The iptables arguments after `-A CHAIN`, in `*-save` order.
    pub fn to_args(&self) -> Vec<String> {
        let mut args: Vec<String> = Vec::with_capacity(16);
        fn push(args: &mut Vec<String>, a: &str, b: String) {
            args.push(a.to_string());
            args.push(b);
        }
        if let Some(s) = self.source {
            push(&mut args, "-s", s.to_string());
        }
        if let Some(d) = self.destination {
            push(&mut args, "-d", d.to_string());
        }
        if let Some(iface) = &self.not_in_interface {
            args.push("!".into());
            push(&mut args, "-i", iface.clone());
        }
        if let Some(p) = self.protocol {
            push(&mut args, "-p", p.to_string());
            if let Some(ports) = self.dports {
                push(&mut args, "-m", p.to_string());
                push(&mut args, "--dport", match_ports(ports));
            }
        }
        if self.dst_local {
            push(&mut args, "-m", "addrtype".into());
            push(&mut args, "--dst-type", "LOCAL".into());
        }
        if let Some(ct) = self.dnatted {
            // Host addresses print without their prefix length in this match.
            push(&mut args, "-m", "conntrack".into());
            push(&mut args, "--ctstate", "DNAT".into());
            push(&mut args, "--ctproto", ct.protocol.number().to_string());
            if let Some(host) = ct.orig_dst {
                push(&mut args, "--ctorigdst", host.to_string());
            }
            push(&mut args, "--ctreplsrc", ct.repl_src.to_string());
            push(&mut args, "--ctorigdstport", match_ports(ct.orig_dst_ports));
            push(&mut args, "--ctreplsrcport", match_ports(ct.repl_src_ports));
        }
        if self.not_dnatted {
            push(&mut args, "-m", "conntrack".into());
            args.push("!".into());
            push(&mut args, "--ctstate", DNATTED_STATE.into());
        }
        if self.untracked {
            push(&mut args, "-m", "conntrack".into());
            push(&mut args, "--ctstate", UNTRACKED_STATE.into());
        }
        if let Some(c) = &self.comment {
            push(&mut args, "-m", "comment".into());
            push(&mut args, "--comment", c.clone());
        }
        match &self.target {
            Target::Jump(chain) => push(&mut args, "-j", chain.clone()),
            Target::Dnat(to) => {
                push(&mut args, "-j", "DNAT".into());
                push(&mut args, "--to-destination", to.to_string());
            }
            Target::Masquerade => push(&mut args, "-j", "MASQUERADE".into()),
            Target::Accept => push(&mut args, "-j", "ACCEPT".into()),
            Target::Drop => push(&mut args, "-j", "DROP".into()),
        }
        args
    }

    /// Parse the arguments after `-A CHAIN`. Options may come in any order; any option
    /// natledger never writes (negations, interfaces, other matches) is `Unsupported`.
    pub fn parse_args<S: AsRef<str>>(args: &[S]) -> Result<Rule, RuleParseError> {
        let mut parsed = Parsed::new();
        let mut it = args.iter().map(AsRef::as_ref);
        while let Some(opt) = it.next() {
            parsed.option(opt, &mut it)?;
        }
        parsed.finish()
    }
}

/// A rule as [`Rule::parse_args`] reads it, option by option: the target comes together
/// from `-j` and `--to-destination`, the DNAT conntrack match from its `--ct*` options.
struct Parsed {
    rule: Rule,
    jump: Option<String>,
    to_destination: Option<DnatTo>,
    ct: Conntrack,
}

/// The value after `opt`.
fn value_of<'a>(
    opt: &str,
    it: &mut impl Iterator<Item = &'a str>,
) -> Result<&'a str, RuleParseError> {
    it.next()
        .ok_or_else(|| RuleParseError::MissingValue(opt.to_string()))
}

/// `opt`'s value `v` is not one it takes.
fn bad(opt: &str, v: &str, reason: String) -> RuleParseError {
    RuleParseError::BadValue {
        option: opt.to_string(),
        value: v.to_string(),
        reason,
    }
}

impl Parsed {
    fn new() -> Parsed {
        Parsed {
            rule: Rule::unconditional(Target::Masquerade),
            jump: None,
            to_destination: None,
            ct: Conntrack::default(),
        }
    }

    /// Reads the option `opt` and its values from `it`.
    fn option<'a>(
        &mut self,
        opt: &'a str,
        it: &mut impl Iterator<Item = &'a str>,
    ) -> Result<(), RuleParseError> {
        let rule = &mut self.rule;
        match opt {
            "!" => return self.negated(it),
            "-s" | "--source" => {
                let v = value_of(opt, it)?;
                rule.source = Some(v.parse().map_err(|e| bad(opt, v, e))?);
            }
            "-d" | "--destination" => {
                let v = value_of(opt, it)?;
                rule.destination = Some(v.parse().map_err(|e| bad(opt, v, e))?);
            }
            "-p" | "--protocol" => {
                let v = value_of(opt, it)?;
                rule.protocol = Some(v.parse().map_err(|e| bad(opt, v, e))?);
            }
            "-m" | "--match" => {
                let v = value_of(opt, it)?;
                let known = rule.protocol.map(Protocol::as_str) == Some(v)
                    || v == "addrtype"
                    || v == "conntrack"
                    || v == "comment";
                if !known {
                    return Err(RuleParseError::Unsupported(format!("-m {v}")));
                }
            }
            "--dport" | "--destination-port" => {
                let v = value_of(opt, it)?;
                rule.dports = Some(PortRange::parse_with(v, ':').map_err(|e| bad(opt, v, e))?);
            }
            "--dst-type" => {
                let v = value_of(opt, it)?;
                if v != "LOCAL" {
                    return Err(RuleParseError::Unsupported(format!("--dst-type {v}")));
                }
                rule.dst_local = true;
            }
            "--comment" => rule.comment = Some(value_of(opt, it)?.to_string()),
            "-j" | "--jump" => self.jump = Some(value_of(opt, it)?.to_string()),
            "--to-destination" => {
                let v = value_of(opt, it)?;
                self.to_destination = Some(v.parse().map_err(|e| bad(opt, v, e))?);
            }
            "--ctstate" | "--ctproto" | "--ctorigdst" | "--ctreplsrc" | "--ctorigdstport"
            | "--ctreplsrcport" => return self.conntrack(opt, value_of(opt, it)?),
            other => return Err(RuleParseError::Unsupported(other.to_string())),
        }
        Ok(())
    }

    /// `! OPTION VALUE`: natledger negates only the guard's interface and conntrack states.
    fn negated<'a>(
        &mut self,
        it: &mut impl Iterator<Item = &'a str>,
    ) -> Result<(), RuleParseError> {
        let negated = value_of("!", it)?;
        let v = value_of(negated, it)?;
        let rule = &mut self.rule;
        match negated {
            "-i" | "--in-interface" if rule.not_in_interface.is_none() && is_interface_name(v) => {
                rule.not_in_interface = Some(v.to_string());
            }
            "--ctstate" if v == DNATTED_STATE && !rule.not_dnatted => {
                rule.not_dnatted = true;
            }
            _ => return Err(RuleParseError::Unsupported(format!("! {negated} {v}"))),
        }
        Ok(())
    }

    /// A `--ct…` option of the conntrack match and its value `v`.
    fn conntrack(&mut self, opt: &str, v: &str) -> Result<(), RuleParseError> {
        let ct = &mut self.ct;
        match opt {
            "--ctstate" => match v {
                DNATTED_STATE => ct.state = true,
                UNTRACKED_STATE if !self.rule.untracked => self.rule.untracked = true,
                _ => return Err(RuleParseError::Unsupported(format!("--ctstate {v}"))),
            },
            "--ctproto" => {
                let p = v
                    .parse::<u8>()
                    .ok()
                    .and_then(Protocol::from_number)
                    .or_else(|| v.parse().ok())
                    .ok_or_else(|| bad(opt, v, "not tcp, udp or sctp".into()))?;
                ct.protocol = Some(p);
            }
            "--ctorigdst" | "--ctreplsrc" => {
                let net: IpNet = v.parse().map_err(|e| bad(opt, v, e))?;
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
                let ports = PortRange::parse_with(v, ':').map_err(|e| bad(opt, v, e))?;
                *if opt == "--ctorigdstport" {
                    &mut ct.orig_dst_ports
                } else {
                    &mut ct.repl_src_ports
                } = Some(ports);
            }
            other => return Err(RuleParseError::Unsupported(other.to_string())),
        }
        Ok(())
    }

    /// The rule, once every option is read: the combinations natledger writes, else an error.
    fn finish(self) -> Result<Rule, RuleParseError> {
        let mut rule = self.rule;
        if rule.dports.is_some() && rule.protocol.is_none() {
            return Err(RuleParseError::Unsupported("--dport without -p".into()));
        }
        rule.dnatted = self.ct.finish()?;
        let conntrack_matches = usize::from(rule.not_dnatted)
            + usize::from(rule.dnatted.is_some())
            + usize::from(rule.untracked);
        if conntrack_matches > 1 {
            return Err(RuleParseError::Unsupported(
                "two conntrack matches natledger does not write together".into(),
            ));
        }
        rule.target = match (self.jump.as_deref(), self.to_destination) {
            (Some("MASQUERADE"), None) => Target::Masquerade,
            (Some("ACCEPT"), None) => Target::Accept,
            (Some("DROP"), None) => Target::Drop,
            (Some("DNAT"), Some(to)) => Target::Dnat(to),
            (Some("DNAT"), None) => {
                return Err(RuleParseError::MissingValue("--to-destination".into()));
            }
            (Some(chain), None) if is_user_chain_name(chain) => Target::Jump(chain.to_string()),
            (Some(other), _) => return Err(RuleParseError::Unsupported(format!("-j {other}"))),
            (None, _) => return Err(RuleParseError::NoTarget),
        };
        if rule.dnatted.is_some() && rule.protocol.is_some() && rule.target != Target::Masquerade {
            // natledger's accept names its protocol in the conntrack match only; the
            // hairpin masquerade has both (`layout::mapping_rules`).
            return Err(RuleParseError::Unsupported("-p with -m conntrack".into()));
        }
        Ok(rule)
    }
}

/// An interface name natledger writes in `-i`: as the kernel accepts one (at most 15
/// bytes, no `/`, `:` or whitespace), and without iptables' `+` wildcard.
pub(crate) fn is_interface_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() < 16
        && name
            .bytes()
            .all(|b| b.is_ascii_graphic() && !matches!(b, b'/' | b':' | b'+'))
}

/// A user-defined chain name as iptables accepts it (at most 28 characters, no
/// whitespace, not an option).
pub(crate) fn is_user_chain_name(name: &str) -> bool {
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
mod tests;
