//! natledger's conntrack match, and the parsing of its options.

use std::net::IpAddr;

use crate::model::portspec::{PortRange, Protocol};

use super::RuleParseError;

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

/// The conntrack options of a rule being parsed: all of natledger's or none.
#[derive(Default)]
pub(super) struct Conntrack {
    pub(super) state: bool,
    pub(super) protocol: Option<Protocol>,
    pub(super) orig_dst: Option<IpAddr>,
    pub(super) repl_src: Option<IpAddr>,
    pub(super) orig_dst_ports: Option<PortRange>,
    pub(super) repl_src_ports: Option<PortRange>,
}

impl Conntrack {
    pub(super) fn finish(self) -> Result<Option<Dnatted>, RuleParseError> {
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
