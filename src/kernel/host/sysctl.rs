//! Where `route_localnet` is on: the interfaces on which the kernel routes packets addressed
//! to 127.0.0.0/8 that come from outside (CVE-2020-8558).

use super::{Roots, entries};

/// `net.ipv4.conf.*.route_localnet` as the kernel applies it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RouteLocalnet {
    /// `all` is 1: the kernel ORs it with each interface's own value, so every interface is
    /// open.
    pub all: bool,
    /// Every interface (not `lo`) on which it is in force, by name, sorted: with `all` on,
    /// every interface the conf directory lists.
    pub interfaces: Vec<String>,
}

/// Read `{sysctl_net}/ipv4/conf/*/route_localnet`. `default` (the value new interfaces get)
/// and `lo` (where loopback addresses belong) are not interfaces a neighbour sends on.
pub fn route_localnet(roots: &Roots) -> RouteLocalnet {
    let conf = roots.sysctl_net.join("ipv4/conf");
    let on = |name: &str| {
        std::fs::read_to_string(conf.join(name).join("route_localnet"))
            .is_ok_and(|v| v.trim() == "1")
    };
    let all = on("all");
    let mut interfaces: Vec<String> = entries(&conf)
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| !matches!(n.as_str(), "all" | "default" | "lo"))
        .filter(|n| all || on(n))
        .collect();
    interfaces.sort();
    RouteLocalnet { all, interfaces }
}
