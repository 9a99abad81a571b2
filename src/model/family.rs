//! Address families and networks. Everything that differs between IPv4 and IPv6 is a method
//! here, so no operation is ever written twice, once per family; [`IpNet`] is an address with
//! a prefix length, as rules carry them (`-s`, `-d`).

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    Ipv4,
    Ipv6,
}

impl Family {
    pub const ALL: [Family; 2] = [Family::Ipv4, Family::Ipv6];

    pub fn of(ip: IpAddr) -> Family {
        match ip {
            IpAddr::V4(_) => Family::Ipv4,
            IpAddr::V6(_) => Family::Ipv6,
        }
    }

    /// Prefix length of a single host address.
    pub(crate) fn host_prefix(self) -> u8 {
        match self {
            Family::Ipv4 => 32,
            Family::Ipv6 => 128,
        }
    }

    /// The loopback network that `route_localnet=1` lets the kernel route to and from
    /// another interface: IPv4's 127.0.0.0/8, what the node's own connections to
    /// 127.0.0.1:hostPort need and natledger's localhost guard closes to everyone else. IPv6
    /// has no such switch (the kernel drops `::1` from or to another interface, always), so
    /// neither the path nor the guard.
    pub(crate) fn routable_loopback(self) -> Option<IpNet> {
        match self {
            Family::Ipv4 => Some(IpNet {
                addr: IpAddr::from([127, 0, 0, 0]),
                prefix: 8,
            }),
            Family::Ipv6 => None,
        }
    }

    /// The offsets of the source and destination addresses in this family's IP header (what
    /// nf_tables' `payload` expression loads for `ip saddr`/`ip daddr`, `ip6 saddr`/`ip6 daddr`).
    pub(crate) fn header_addresses(self) -> (u32, u32) {
        match self {
            Family::Ipv4 => (12, 16),
            Family::Ipv6 => (8, 24),
        }
    }

    /// The address family number netlink messages carry (`AF_INET`, `AF_INET6`).
    pub fn af(self) -> u8 {
        match self {
            Family::Ipv4 => libc::AF_INET as u8,
            Family::Ipv6 => libc::AF_INET6 as u8,
        }
    }

    /// Tool-name stem: `iptables` or `ip6tables`.
    pub fn tool_stem(self) -> &'static str {
        match self {
            Family::Ipv4 => "iptables",
            Family::Ipv6 => "ip6tables",
        }
    }

    /// The procfs file listing this family's iptables-legacy tables in the calling thread's
    /// netns (`/proc/net` would follow the thread-group leader instead).
    pub fn legacy_tables_file(self) -> &'static str {
        match self {
            Family::Ipv4 => "/proc/thread-self/net/ip_tables_names",
            Family::Ipv6 => "/proc/thread-self/net/ip6_tables_names",
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Family::Ipv4 => "ipv4",
            Family::Ipv6 => "ipv6",
        })
    }
}

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

/// A container's address and, when known, the prefix length of the network its interface is
/// on (CNI `prevResult`'s `10.77.0.2/24`, the interface's netmask); `io.natledger.ip` names
/// bare addresses, so none.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct IfAddr {
    pub addr: IpAddr,
    pub prefix: Option<u8>,
}

impl From<IpAddr> for IfAddr {
    fn from(addr: IpAddr) -> Self {
        IfAddr { addr, prefix: None }
    }
}

impl IfAddr {
    pub fn family(&self) -> Family {
        Family::of(self.addr)
    }

    /// The network the container's interface is on (host bits cleared): what other
    /// containers on its bridge send from. None without a prefix, for a prefix past the
    /// family's or of 0 (never a rule for every source), and for a link-local address.
    pub fn subnet(&self) -> Option<IpNet> {
        let prefix = self.prefix?;
        let family = Family::of(self.addr);
        let link_local = match self.addr {
            IpAddr::V4(a) => a.is_link_local(),
            IpAddr::V6(a) => a.segments()[0] & 0xffc0 == 0xfe80,
        };
        if prefix == 0 || prefix > family.host_prefix() || link_local {
            return None;
        }
        let addr = match self.addr {
            IpAddr::V4(a) => {
                let mask = u32::MAX << (32 - u32::from(prefix));
                IpAddr::from((u32::from(a) & mask).to_be_bytes())
            }
            IpAddr::V6(a) => {
                let mask = u128::MAX << (128 - u32::from(prefix));
                IpAddr::from((u128::from(a) & mask).to_be_bytes())
            }
        };
        Some(IpNet { addr, prefix })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(addr: &str, prefix: Option<u8>) -> IfAddr {
        IfAddr {
            addr: addr.parse().unwrap(),
            prefix,
        }
    }

    #[test]
    fn the_subnet_is_the_interfaces_network_never_wider() {
        let subnet = |a: &str, p| at(a, p).subnet().map(|n| n.to_string());
        assert_eq!(
            subnet("10.77.0.2", Some(24)).as_deref(),
            Some("10.77.0.0/24")
        );
        assert_eq!(
            subnet("10.77.1.130", Some(25)).as_deref(),
            Some("10.77.1.128/25")
        );
        assert_eq!(
            subnet("10.77.0.2", Some(32)).as_deref(),
            Some("10.77.0.2/32")
        );
        assert_eq!(subnet("fd77::2", Some(64)).as_deref(), Some("fd77::/64"));
        assert_eq!(
            subnet("fd77::1:2", Some(112)).as_deref(),
            Some("fd77::1:0/112")
        );
        assert_eq!(subnet("fd77::2", Some(128)).as_deref(), Some("fd77::2/128"));
        // No prefix, every source, more bits than the family has, link-local: none.
        for (a, p) in [
            ("10.77.0.2", None),
            ("10.77.0.2", Some(0)),
            ("fd77::2", Some(0)),
            ("10.77.0.2", Some(33)),
            ("fe80::2", Some(64)),
            ("169.254.0.2", Some(16)),
        ] {
            assert_eq!(subnet(a, p), None, "{a} {p:?}");
        }
        assert_eq!(
            IfAddr::from(at("10.0.0.1", None).addr),
            at("10.0.0.1", None)
        );
    }
}
