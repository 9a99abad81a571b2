//! Looking into network namespaces without starting processes: the container's addresses
//! (from a thread that joins the container's namespace) and route_localnet on the host side.

use std::fs::File;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};

use nix::sched::{CloneFlags, setns};

use crate::kernel::host;
use crate::model::family::IfAddr;

#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    #[error("cannot open {} (is the container running?)", path.display())]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot enter the network namespace {}", path.display())]
    Enter { path: PathBuf, source: nix::Error },
    #[error("cannot list addresses in the network namespace of pid {pid}")]
    List { pid: i32, source: nix::Error },
    #[error("cannot set {path}")]
    Sysctl {
        path: String,
        source: std::io::Error,
    },
}

/// The global unicast addresses (IPv4 and IPv6, loopback and link-local excluded) inside the
/// network namespace of `pid`, in interface order, each with its interface's prefix length
/// (from its netmask). `setns` changes only the calling thread, so a short-lived thread does
/// the looking and the process never leaves the host namespace.
pub fn container_addresses(pid: i32) -> Result<Vec<IfAddr>, NetnsError> {
    let path = PathBuf::from(format!("/proc/{pid}/ns/net"));
    in_namespace(&path, || {
        let mut found: Vec<IfAddr> = Vec::new();
        let all = nix::ifaddrs::getifaddrs().map_err(|source| NetnsError::List { pid, source })?;
        for ifa in all {
            let Some(addr) = ifa.address.as_ref().and_then(ip_of) else {
                continue;
            };
            let prefix = ifa.netmask.as_ref().and_then(ip_of).and_then(prefix_of);
            if is_global_unicast(addr) && !found.iter().any(|f| f.addr == addr) {
                found.push(IfAddr { addr, prefix });
            }
        }
        Ok(found)
    })?
}

fn ip_of(a: &nix::sys::socket::SockaddrStorage) -> Option<IpAddr> {
    a.as_sockaddr_in()
        .map(|s| IpAddr::V4(s.ip()))
        .or_else(|| a.as_sockaddr_in6().map(|s| IpAddr::V6(s.ip())))
}

/// The prefix length of a contiguous netmask; `None` for any other.
fn prefix_of(mask: IpAddr) -> Option<u8> {
    let (ones, leading) = match mask {
        IpAddr::V4(m) => (u32::from(m).count_ones(), u32::from(m).leading_ones()),
        IpAddr::V6(m) => (u128::from(m).count_ones(), u128::from(m).leading_ones()),
    };
    (ones == leading).then_some(ones as u8)
}

/// Every address of every interface of the calling thread's network namespace, IPv4 and
/// IPv6, once each, in interface order.
pub fn interface_addresses() -> nix::Result<Vec<IpAddr>> {
    let mut found: Vec<IpAddr> = Vec::new();
    for ifa in nix::ifaddrs::getifaddrs()? {
        let ip = ifa.address.as_ref().and_then(ip_of);
        if let Some(ip) = ip.filter(|ip| !found.contains(ip)) {
            found.push(ip);
        }
    }
    Ok(found)
}

/// Run `f` on a thread of its own inside the network namespace at `path` (a
/// `/proc/PID/ns/net` or `/run/netns/NAME` file). Processes `f` starts are in that namespace
/// too; the rest of the process never leaves its own.
pub fn in_namespace<T: Send>(path: &Path, f: impl FnOnce() -> T + Send) -> Result<T, NetnsError> {
    let file = File::open(path).map_err(|source| NetnsError::Open {
        path: path.to_path_buf(),
        source,
    })?;
    std::thread::scope(|s| {
        s.spawn(|| {
            setns(&file, CloneFlags::CLONE_NEWNET).map_err(|source| NetnsError::Enter {
                path: path.to_path_buf(),
                source,
            })?;
            Ok(f())
        })
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

pub fn is_global_unicast(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(a) => {
            !(a.is_loopback()
                || a.is_link_local()
                || a.is_unspecified()
                || a.is_multicast()
                || a.is_broadcast())
        }
        IpAddr::V6(a) => {
            let link_local = (a.segments()[0] & 0xffc0) == 0xfe80;
            !(a.is_loopback() || a.is_unspecified() || a.is_multicast() || link_local)
        }
    }
}

/// Make the node's own connections to 127.0.0.1:hostPort routable to `dest`: after DNAT the
/// packet still has a loopback source, which the kernel drops as martian unless
/// `route_localnet` is on for the outgoing interface. Sets it on that interface only (the
/// longest-prefix route of the main table, [`host::route_to`], which never picks the default
/// route: a container reached through it is not behind this host's bridge, and
/// route_localnet on the uplink would expose 127.0.0.1 to the neighbours there), never
/// globally. Returns the interface when it was changed. Not reverted: other containers
/// behind the same bridge may rely on it. Called only once the localhost guard is in place
/// (`layout::guard`), which drops what the switch would otherwise let neighbours send to
/// the node's 127.0.0.0/8.
pub fn enable_route_localnet(dest: Ipv4Addr) -> Result<Option<String>, NetnsError> {
    let Some(route) = host::route_to(&host::Roots::default(), IpAddr::V4(dest)) else {
        return Ok(None);
    };
    let iface = route.interface;
    let path = format!("/proc/sys/net/ipv4/conf/{iface}/route_localnet");
    let current = std::fs::read_to_string(&path).unwrap_or_default();
    if current.trim() == "1" {
        return Ok(None);
    }
    std::fs::write(&path, "1").map_err(|source| NetnsError::Sysctl { path, source })?;
    Ok(Some(iface))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_the_longest_prefix() {
        // Little-endian hex as the kernel prints it on x86.
        let table = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
                     eth0\t00000000\t0100000A\t0003\t0\t0\t0\t00000000\t0\t0\t0\n\
                     br0\t00004D0A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n";
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("route"), table).unwrap();
        let roots = host::Roots {
            net: dir.path().into(),
            ..host::Roots::default()
        };
        let route_interface =
            |dest: Ipv4Addr| host::route_to(&roots, IpAddr::V4(dest)).map(|r| r.interface);
        if cfg!(target_endian = "little") {
            assert_eq!(
                route_interface(Ipv4Addr::new(10, 77, 0, 2)).as_deref(),
                Some("br0")
            );
            assert_eq!(
                route_interface(Ipv4Addr::new(8, 8, 8, 8)),
                None,
                "never the default route's interface"
            );
        }
    }

    #[test]
    fn netmasks_are_prefixes_only_when_contiguous() {
        let prefix = |m: &str| prefix_of(m.parse().unwrap());
        assert_eq!(prefix("255.255.255.0"), Some(24));
        assert_eq!(prefix("255.255.255.255"), Some(32));
        assert_eq!(prefix("ffff:ffff:ffff:ffff::"), Some(64));
        assert_eq!(prefix("0.0.0.0"), Some(0));
        assert_eq!(prefix("255.0.255.0"), None);
    }

    #[test]
    fn global_unicast() {
        for ip in ["10.0.0.1", "fd00::1", "2001:db8::1"] {
            assert!(is_global_unicast(ip.parse().unwrap()), "{ip}");
        }
        for ip in [
            "127.0.0.1",
            "169.254.1.1",
            "fe80::1",
            "::1",
            "0.0.0.0",
            "ff02::1",
        ] {
            assert!(!is_global_unicast(ip.parse().unwrap()), "{ip}");
        }
    }
}
