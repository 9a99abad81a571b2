//! The host's routes and its own addresses.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::Roots;

const RTF_UP: u32 = 0x0001;
const RTF_GATEWAY: u32 = 0x0002;
const RTF_REJECT: u32 = 0x0200;
const RTF_ANYCAST: u32 = 0x0010_0000;
const RTF_LOCAL: u32 = 0x8000_0000;

/// A route of the host's tables.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    pub dest: IpAddr,
    pub prefix_len: u8,
    pub interface: String,
    /// The next hop, for routes through a gateway.
    pub gateway: Option<IpAddr>,
}

/// The longest non-default route covering `addr` (see [`routes`]): the address is on a
/// network this host reaches directly or by a specific route (a bridge, a veth, a tunnel).
pub fn route_to(roots: &Roots, addr: IpAddr) -> Option<Route> {
    routes(roots)
        .into_iter()
        .filter(|r| covers(r, addr))
        .max_by_key(|r| r.prefix_len)
}

/// Whether a non-default route covers `addr` ([`route_to`]).
pub fn has_route(roots: &Roots, addr: IpAddr) -> bool {
    route_to(roots, addr).is_some()
}

/// The routes that are up, not default (`/0`), not unreachable/prohibit, and not the host's
/// own addresses: IPv4 from `{net}/route` (the main table), IPv6 from `{net}/ipv6_route` (all
/// tables; local and anycast entries and anything on `lo` skipped).
pub fn routes(roots: &Roots) -> Vec<Route> {
    let mut all = all_routes(roots);
    all.retain(|r| r.prefix_len > 0);
    all
}

/// The interface of the default route of `v6`'s family, if there is one: where packets
/// from other hosts usually come in.
pub fn default_interface(roots: &Roots, v6: bool) -> Option<String> {
    all_routes(roots)
        .into_iter()
        .find(|r| r.prefix_len == 0 && r.dest.is_ipv6() == v6)
        .map(|r| r.interface)
}

/// [`routes`] with the default routes.
fn all_routes(roots: &Roots) -> Vec<Route> {
    let read = |f| std::fs::read_to_string(roots.net.join(f)).unwrap_or_default();
    let mut all = parse_routes(&read("route"), false);
    all.extend(parse_routes(&read("ipv6_route"), true));
    all
}

/// `route`: `Iface Destination Gateway Flags RefCnt Use Metric Mask …` under a header, IPv4
/// addresses in host-order hex. `ipv6_route`: `dest plen src plen nexthop metric refcnt use
/// flags iface`, addresses as 32 hex digits in network order.
fn parse_routes(text: &str, ipv6: bool) -> Vec<Route> {
    let parse = |line: &str| {
        let f: Vec<&str> = line.split_whitespace().collect();
        let hex = |i: usize| u32::from_str_radix(f.get(i)?, 16).ok();
        let addr = |i: usize| match ipv6 {
            true => parse_v6_hex(f.get(i)?).map(IpAddr::V6),
            false => Some(IpAddr::V4(Ipv4Addr::from(hex(i)?.to_ne_bytes()))),
        };
        let (iface, dest, gateway, flags, prefix_len) = if ipv6 {
            let plen = u8::try_from(hex(1)?).ok()?;
            (*f.get(9)?, addr(0)?, addr(4)?, hex(8)?, plen)
        } else {
            let mask = u32::from_be_bytes(hex(7)?.to_ne_bytes());
            (mask.count_ones() == mask.leading_ones()).then_some(())?;
            (f[0], addr(1)?, addr(2)?, hex(3)?, mask.leading_ones() as u8)
        };
        let usable = flags & RTF_UP != 0
            && flags & (RTF_REJECT | RTF_LOCAL | RTF_ANYCAST) == 0
            && !matches!(iface, "lo" | "*");
        usable.then(|| Route {
            dest,
            prefix_len,
            interface: iface.to_string(),
            gateway: (flags & RTF_GATEWAY != 0).then_some(gateway),
        })
    };
    text.lines().filter_map(parse).collect()
}

/// 32 hex digits in network order (`ipv6_route`, `if_inet6`).
fn parse_v6_hex(hex: &str) -> Option<Ipv6Addr> {
    (hex.len() == 32).then_some(())?;
    Some(Ipv6Addr::from(u128::from_str_radix(hex, 16).ok()?))
}

fn covers(route: &Route, addr: IpAddr) -> bool {
    let len = u32::from(route.prefix_len);
    match (route.dest, addr) {
        (IpAddr::V4(net), IpAddr::V4(a)) if len <= 32 => {
            let mask = u32::MAX.checked_shl(32 - len).unwrap_or(0);
            u32::from(net) & mask == u32::from(a) & mask
        }
        (IpAddr::V6(net), IpAddr::V6(a)) if len <= 128 => {
            let mask = u128::MAX.checked_shl(128 - len).unwrap_or(0);
            u128::from(net) & mask == u128::from(a) & mask
        }
        _ => false,
    }
}

/// The host's own addresses, loopback left out: [`Roots::local_addresses`] when given, else
/// the interfaces' (`getifaddrs` in the calling thread's namespace for IPv4,
/// `{net}/if_inet6` for IPv6), as [`is_local_address`] reads them.
pub fn local_addresses(roots: &Roots) -> Vec<IpAddr> {
    if let Some(list) = &roots.local_addresses {
        return list.iter().copied().filter(|a| !a.is_loopback()).collect();
    }
    let mut out: Vec<IpAddr> = nix::ifaddrs::getifaddrs()
        .map(|all| {
            all.filter_map(|ifa| Some(IpAddr::V4(ifa.address?.as_sockaddr_in()?.ip())))
                .collect()
        })
        .unwrap_or_default();
    out.extend(
        std::fs::read_to_string(roots.net.join("if_inet6"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| parse_v6_hex(l.split_whitespace().next()?))
            .map(IpAddr::V6),
    );
    out.retain(|a| !a.is_loopback());
    out.sort();
    out.dedup();
    out
}

/// Whether `addr` is one of the host's own addresses: loopback (`127.0.0.0/8`, `::1`), or in
/// [`Roots::local_addresses`] when given, else an interface address (`getifaddrs` in the
/// calling thread's namespace for IPv4, `{net}/if_inet6` for IPv6).
pub fn is_local_address(roots: &Roots, addr: IpAddr) -> bool {
    if addr.is_loopback() {
        return true;
    }
    if let Some(list) = &roots.local_addresses {
        return list.contains(&addr);
    }
    match addr {
        IpAddr::V4(_) => nix::ifaddrs::getifaddrs().is_ok_and(|mut all| {
            all.any(|ifa| {
                ifa.address
                    .as_ref()
                    .and_then(|a| a.as_sockaddr_in())
                    .is_some_and(|s| IpAddr::V4(s.ip()) == addr)
            })
        }),
        IpAddr::V6(v6) => std::fs::read_to_string(roots.net.join("if_inet6"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| parse_v6_hex(l.split_whitespace().next()?))
            .any(|a| a == v6),
    }
}
