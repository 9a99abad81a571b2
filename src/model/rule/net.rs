//! Addresses as natledger's rules carry them: a network (`-s`, `-d`) and a DNAT destination.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use crate::family::Family;
use crate::portspec::PortRange;

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
