//! The DNAT destination natledger's rules carry (their networks, `-s` and `-d`, are
//! [`crate::model::family::IpNet`]s).

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use crate::model::portspec::PortRange;

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
