//! The `io.natledger.ports` annotation: Docker's `-p` syntax parsed into typed mappings.
//!
//! Grammar, one entry per comma:
//! `[hostIP:]hostPort[-end]:containerPort[-end][/tcp|/udp|/sctp]`, where `hostIP` is an IPv4
//! address or a bracketed IPv6 address. Only digits, `-`, `:`, `.`, `[`, `]`, `/`, hex letters and
//! the protocol names ever reach a rule, so nothing that looks like iptables or shell syntax can.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::model::echo::{Echo, MESSAGE, limit};
use crate::model::family::Family;

pub(crate) mod bounds;

/// A port-mapping entry that could not be parsed, with the reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid port mapping {entry}: {reason}")]
pub struct SpecError {
    pub entry: Echo,
    /// Cut to a readable length too: reasons quote pieces of the entry.
    pub reason: String,
}

fn bad(entry: &str, reason: impl Into<String>) -> SpecError {
    SpecError {
        entry: Echo::from(entry),
        reason: limit(&reason.into(), MESSAGE),
    }
}

/// Transport protocol of a mapping.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        }
    }

    /// The IP protocol number.
    pub fn number(self) -> u8 {
        match self {
            Protocol::Tcp => 6,
            Protocol::Udp => 17,
            Protocol::Sctp => 132,
        }
    }

    pub(crate) fn from_number(n: u8) -> Option<Protocol> {
        [Protocol::Tcp, Protocol::Udp, Protocol::Sctp]
            .into_iter()
            .find(|p| p.number() == n)
    }
}

impl FromStr for Protocol {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "tcp" => Ok(Protocol::Tcp),
            "udp" => Ok(Protocol::Udp),
            "sctp" => Ok(Protocol::Sctp),
            other => Err(format!("unknown protocol {other:?} (tcp, udp or sctp)")),
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An inclusive, non-empty range of ports in 1..=65535.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PortRange {
    pub start: u16,
    pub end: u16,
}

impl PortRange {
    pub fn single(port: u16) -> Self {
        PortRange {
            start: port,
            end: port,
        }
    }

    /// Number of ports in the range (never zero).
    pub fn count(&self) -> u32 {
        u32::from(self.end) - u32::from(self.start) + 1
    }

    pub fn is_single(&self) -> bool {
        self.start == self.end
    }

    pub(crate) fn overlaps(&self, other: &PortRange) -> bool {
        self.start <= other.end && other.start <= self.end
    }

    /// Parse `N` or `N-M` (the port-spec form) or `N:M` (the iptables form), per `sep`.
    pub(crate) fn parse_with(text: &str, sep: char) -> Result<Self, String> {
        let (a, b) = match text.split_once(sep) {
            Some((a, b)) => (a, b),
            None => (text, text),
        };
        let start = parse_port(a)?;
        let end = parse_port(b)?;
        if start > end {
            return Err(format!("reversed port range {text:?}"));
        }
        Ok(PortRange { start, end })
    }
}

impl fmt::Display for PortRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_single() {
            write!(f, "{}", self.start)
        } else {
            write!(f, "{}-{}", self.start, self.end)
        }
    }
}

fn parse_port(text: &str) -> Result<u16, String> {
    if text.is_empty() || text.len() > 5 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("{text:?} is not a port number"));
    }
    match text.parse::<u32>() {
        Ok(p @ 1..=65535) => Ok(p as u16),
        _ => Err(format!("port {text} is outside 1-65535")),
    }
}

/// One host-port to container-port mapping.
///
/// `host_ip`: `None` means every local address of every family the container has; an
/// unspecified address (`0.0.0.0`, `::`) means every local address of that family only.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortMapping {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_ip: Option<IpAddr>,
    pub host_ports: PortRange,
    pub container_ports: PortRange,
    pub protocol: Protocol,
}

impl PortMapping {
    /// The single family this mapping is restricted to by its host address, if any.
    pub fn family(&self) -> Option<Family> {
        self.host_ip.map(Family::of)
    }

    /// The destination address a rule must match, or `None` for any local address.
    pub(crate) fn host_destination(&self) -> Option<IpAddr> {
        self.host_ip.filter(|ip| !ip.is_unspecified())
    }

    /// Whether the node reaches this mapping through the IPv4 loopback (needs route_localnet).
    pub(crate) fn reachable_from_loopback(&self) -> bool {
        match self.host_ip {
            None => true,
            Some(ip) => ip.is_unspecified() || ip.is_loopback(),
        }
    }

    /// Two mappings claim the same host address, port and protocol somewhere.
    pub(crate) fn conflicts_with(&self, other: &PortMapping) -> bool {
        let addresses_overlap = match (self.host_ip, other.host_ip) {
            (None, _) | (_, None) => true,
            (Some(a), Some(b)) => {
                Family::of(a) == Family::of(b)
                    && (a == b || a.is_unspecified() || b.is_unspecified())
            }
        };
        self.protocol == other.protocol
            && addresses_overlap
            && self.host_ports.overlaps(&other.host_ports)
    }
}

impl fmt::Display for PortMapping {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.host_ip {
            Some(IpAddr::V6(ip)) => write!(f, "[{ip}]:")?,
            Some(IpAddr::V4(ip)) => write!(f, "{ip}:")?,
            None => {}
        }
        write!(
            f,
            "{}:{}/{}",
            self.host_ports, self.container_ports, self.protocol
        )
    }
}

/// Parse the whole annotation value.
pub fn parse_mappings(value: &str) -> Result<Vec<PortMapping>, SpecError> {
    let mappings = parse_entries(value)?;
    check_conflicts(value, &mappings)?;
    Ok(mappings)
}

/// Parse every entry of the annotation value, without [`check_conflicts`].
pub(crate) fn parse_entries(value: &str) -> Result<Vec<PortMapping>, SpecError> {
    value
        .split(',')
        .map(|entry| parse_entry(entry.trim()))
        .collect()
}

/// Refuse mappings of one annotation that claim a host port twice. Judged on the merged
/// runs (`bounds::coalesce`: the same host ports, none of a run overlapping another of it),
/// so the pairs compared are as few as the ranges, not the ports: callers facing input bound
/// their number first (`bounds::check_count`).
pub(crate) fn check_conflicts(value: &str, mappings: &[PortMapping]) -> Result<(), SpecError> {
    let runs = bounds::coalesce(mappings, true);
    for (i, a) in runs.iter().enumerate() {
        if let Some(b) = runs[..i].iter().find(|b| a.conflicts_with(b)) {
            return Err(bad(
                value,
                format!("{a} and {b} claim the same host port twice"),
            ));
        }
    }
    Ok(())
}

/// Parse one entry.
pub fn parse_entry(entry: &str) -> Result<PortMapping, SpecError> {
    if entry.is_empty() {
        return Err(bad(entry, "empty entry"));
    }
    let (ports, protocol) = match entry.rsplit_once('/') {
        Some((ports, proto)) => (ports, proto.parse().map_err(|e| bad(entry, e))?),
        None => (entry, Protocol::Tcp),
    };
    let (host_ip, ports) = split_host_ip(entry, ports)?;
    let (host, container) = ports
        .split_once(':')
        .ok_or_else(|| bad(entry, "expected hostPort:containerPort"))?;
    let host_ports = PortRange::parse_with(host, '-').map_err(|e| bad(entry, e))?;
    let container_ports = PortRange::parse_with(container, '-').map_err(|e| bad(entry, e))?;
    if host_ports.count() != container_ports.count() {
        return Err(bad(
            entry,
            "host and container port ranges differ in length",
        ));
    }
    Ok(PortMapping {
        host_ip,
        host_ports,
        container_ports,
        protocol,
    })
}

/// Split off `hostIP:` (IPv4) or `[hostIP]:` (IPv6) from `ports`.
fn split_host_ip<'a>(entry: &str, ports: &'a str) -> Result<(Option<IpAddr>, &'a str), SpecError> {
    if let Some(rest) = ports.strip_prefix('[') {
        let (ip, rest) = rest
            .split_once("]:")
            .ok_or_else(|| bad(entry, "expected [IPv6]:hostPort:containerPort"))?;
        let ip: std::net::Ipv6Addr = ip
            .parse()
            .map_err(|_| bad(entry, format!("{ip:?} is not an IPv6 address")))?;
        if ip.is_loopback() {
            return Err(bad(
                entry,
                "the kernel cannot forward IPv6 loopback ([::1]) to a container",
            ));
        }
        return Ok((Some(IpAddr::V6(ip)), rest));
    }
    match ports.matches(':').count() {
        1 => Ok((None, ports)),
        2 => {
            let (ip, rest) = ports.split_once(':').expect("two colons");
            let ip: std::net::Ipv4Addr = ip.parse().map_err(|_| {
                bad(
                    entry,
                    format!("{ip:?} is not an IPv4 address (bracket IPv6 addresses)"),
                )
            })?;
            Ok((Some(IpAddr::V4(ip)), rest))
        }
        _ => Err(bad(entry, "expected [hostIP:]hostPort:containerPort")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(s: &str) -> PortMapping {
        parse_entry(s).unwrap()
    }

    #[test]
    fn parses_the_docker_forms() {
        let m = one("8080:80");
        assert_eq!(m.host_ip, None);
        assert_eq!(m.host_ports, PortRange::single(8080));
        assert_eq!(m.container_ports, PortRange::single(80));
        assert_eq!(m.protocol, Protocol::Tcp);

        let m = one("127.0.0.1:9000-9002:80-82/udp");
        assert_eq!(m.host_ip, Some("127.0.0.1".parse().unwrap()));
        assert_eq!(
            m.host_ports,
            PortRange {
                start: 9000,
                end: 9002
            }
        );
        assert_eq!(m.container_ports, PortRange { start: 80, end: 82 });
        assert_eq!(m.protocol, Protocol::Udp);

        let m = one("[fd00::1]:53:53/sctp");
        assert_eq!(m.host_ip, Some("fd00::1".parse().unwrap()));
        assert_eq!(m.protocol, Protocol::Sctp);
        assert_eq!(m.to_string(), "[fd00::1]:53:53/sctp");

        let all = parse_mappings("80:8080, 443:8443/tcp,53:53/udp").unwrap();
        assert_eq!(all.len(), 3);
    }

    #[test]
    fn rejects_bad_input_with_a_reason() {
        for (input, reason) in [
            ("0:80", "outside"),
            ("65536:80", "outside"),
            ("80:0", "outside"),
            ("90-80:80-90", "reversed"),
            ("80-90:80-85", "differ in length"),
            ("80-90:80", "differ in length"),
            ("80:80x", "not a port"),
            ("80:80/icmp", "unknown protocol"),
            ("80:80/tcp/udp", "not a port"),
            ("80", "expected"),
            ("1.2.3.4.5:80:80", "not an IPv4"),
            ("fd00::1:80:80", "expected"),
            ("[fd00::zz]:80:80", "not an IPv6"),
            ("[fd00::1]80:80", "expected"),
            ("[::1]:80:80", "IPv6 loopback"),
            ("80:80 -j ACCEPT", "not a port"),
            ("80:80;reboot", "not a port"),
            ("$(id):80", "not a port"),
            ("+80:80", "not a port"),
            ("", "empty"),
        ] {
            let err = parse_mappings(input).expect_err(input);
            assert!(err.to_string().contains(reason), "{input}: {err}");
        }
        let err = parse_mappings("8080:80,8080:81").unwrap_err();
        assert!(err.to_string().contains("same host port"), "{err}");
        // Different protocols or families do not conflict.
        parse_mappings("8080:80,8080:80/udp,[fd00::1]:90:90,127.0.0.1:90:90").unwrap();
    }

    #[test]
    fn conflicts_follow_address_port_and_protocol() {
        let any = one("8080:80");
        assert!(any.conflicts_with(&one("10.0.0.1:8080:81")));
        assert!(one("0.0.0.0:8080:80").conflicts_with(&one("10.0.0.1:8080:81")));
        assert!(!one("0.0.0.0:8080:80").conflicts_with(&one("[::]:8080:80")));
        assert!(!one("10.0.0.2:8080:80").conflicts_with(&one("10.0.0.1:8080:80")));
        assert!(one("8000-8010:8000-8010").conflicts_with(&one("8010:80")));
        assert!(!any.conflicts_with(&one("8080:80/udp")));
    }

    #[test]
    fn mapping_json_is_stable() {
        let m = one("[fd00::1]:8080-8081:80-81/udp");
        let json = serde_json::to_string(&m).unwrap();
        assert_eq!(
            json,
            r#"{"host_ip":"fd00::1","host_ports":{"start":8080,"end":8081},"container_ports":{"start":80,"end":81},"protocol":"udp"}"#
        );
        assert_eq!(serde_json::from_str::<PortMapping>(&json).unwrap(), m);
    }
}
