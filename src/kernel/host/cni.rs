//! Addresses CNI's host-local IPAM has handed out.

use std::net::IpAddr;

use super::{Roots, entries};

use crate::kernel::safefile::{self, Cap, Links};

/// One address reserved by CNI's host-local IPAM plugin.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reservation {
    /// The network's directory name (the CNI network name).
    pub network: String,
    pub addr: IpAddr,
    pub container_id: String,
    /// The container's interface, written by plugins since v0.8 (`eth0`).
    pub interface: Option<String>,
}

/// Whether `{cni_networks}` exists (so an address missing from [`cni_reservations`] means
/// something).
pub fn cni_networks_present(roots: &Roots) -> bool {
    roots.cni_networks.is_dir()
}

/// Every reservation in `{cni_networks}/<network>/<ip>` (content: the container id, then
/// optionally a line with the interface). `last_reserved_ip.*`, `lock` and other names that
/// are not addresses are skipped. Sorted by network and address.
pub fn cni_reservations(roots: &Roots) -> Vec<Reservation> {
    let mut found = Vec::new();
    for net in entries(&roots.cni_networks) {
        let Some(network) = net.file_name().to_str().map(str::to_string) else {
            continue;
        };
        for file in entries(&net.path()) {
            let Some(addr) = file.file_name().to_str().and_then(|n| n.parse().ok()) else {
                continue;
            };
            // Another program's file: a regular file only, never waiting on a FIFO, capped.
            let Ok(bytes) = safefile::read(&file.path(), Links::Follow, Cap::Config) else {
                continue;
            };
            let text = String::from_utf8_lossy(&bytes);
            let mut lines = text.lines().map(str::trim);
            let Some(container_id) = lines.next().filter(|id| !id.is_empty()) else {
                continue;
            };
            found.push(Reservation {
                network: network.clone(),
                addr,
                container_id: container_id.to_string(),
                interface: lines.next().filter(|i| !i.is_empty()).map(str::to_string),
            });
        }
    }
    found.sort_by(|a, b| (&a.network, a.addr).cmp(&(&b.network, b.addr)));
    found
}
